// Helpers shared by the skvq subcommands: usage errors and atomic output.
#pragma once

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "skvq/config.hpp"

namespace skvq::tools {

// A bad argument or input file: the program prints "skvq <cmd>: <message>"
// on one line and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

// Writes every file of `files` (name -> bytes) into `dir` or none of them:
// each goes to a temporary name first and all are renamed at the end; on
// failure the temporaries (and `dir`, if this call created it) are removed.
// Files named in `remove_stale` are deleted after a successful commit.
void write_all_or_nothing(const std::filesystem::path& dir, const std::map<std::string, std::string>& files,
                          const std::vector<std::string>& remove_stale = {});

// Applies FIELD=VALUE strings to cfg, then validates it. Errors name `flag`
// and the offending text.
void apply_sets(Config& cfg, const std::vector<std::string>& sets, const std::string& flag);

// Peak resident set size of this process in bytes.
long long peak_rss_bytes();

}  // namespace skvq::tools
