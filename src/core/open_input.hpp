// Opening an input file for reading, with the reason when it cannot be read:
// a directory opens as a stream on Linux and fails only at the first read
// (with an "underflow" exception from the stream buffer), so it is refused
// here by name.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

namespace skvq {

// Opens `path` into `f` (binary); returns "" when it is open, else why not.
inline std::string open_input(std::ifstream& f, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "is a directory";
  f.open(path, std::ios::binary);
  return f ? "" : "cannot open";
}

}  // namespace skvq
