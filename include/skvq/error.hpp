// Error type thrown at the public boundary of skvq. Messages name the
// operation, the argument and the value received: "skvq: bits_key=0 must be in [1, 8]".
#pragma once

#include <stdexcept>
#include <string>

namespace skvq {

// Every error skvq reports is an skvq::Error; a call that throws it leaves
// the object it was called on exactly as it was.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace skvq
