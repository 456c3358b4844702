// Helpers shared by the skvq subcommands: usage errors and atomic output.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "skvq/config.hpp"

namespace skvq::tools {

// For 64-bit integer options: CLI11 reads a number past the int64 range as
// the nearest bound (strtoll saturates), so that --kv-len
// 99999999999999999999 would run as 9223372036854775807; this refuses it,
// naming the value as written.
inline CLI::Validator int64_in_range() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::int64_t v = 0;
        const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
        if (std::from_chars(b, s.data() + s.size(), v).ec == std::errc::result_out_of_range) return s + " is out of the 64-bit integer range";
        return "";
      },
      "", "INT64");  // no description: --help keeps CLI11's own "INT" rather than "INT:INT64"
}

// For unsigned options (seeds): CLI11 reads "-1" into a uint64_t as 2^64 - 1 and a number past the
// range as its bound, so that two different seeds would quietly run as one; this takes only a plain
// decimal number within [0, max of T] (an optional leading '+'), naming the value as written.
template <typename T>
CLI::Validator unsigned_in_range() {
  static_assert(std::is_unsigned_v<T>, "unsigned options");
  return CLI::Validator(
      [](std::string& s) -> std::string {
        T v = 0;
        const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
        const char* e = s.data() + s.size();
        const auto r = std::from_chars(b, e, v);
        if (b == e || r.ec != std::errc() || r.ptr != e)
          return s + " must be a whole number in [0, " + std::to_string(std::numeric_limits<T>::max()) + "]";
        return "";
      },
      "", "UINT");
}

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
// Errors name `flag` (the option that gave the destination).
void write_all_or_nothing(const std::filesystem::path& dir, const std::map<std::string, std::string>& files,
                          const std::vector<std::string>& remove_stale = {}, const std::string& flag = "--out");

// Checks, before any long work, that `path` (given by `flag`) can be written
// as a file: it is not a directory, and its directory exists and is writable
// (with `may_create_dirs`, its nearest existing ancestor is a writable
// directory instead). Throws UsageError naming the flag and the path.
void check_output_file(const std::string& flag, const std::string& path, bool may_create_dirs);

// Applies FIELD=VALUE strings to cfg, then validates it. Errors name `flag`
// and the offending text.
void apply_sets(Config& cfg, const std::vector<std::string>& sets, const std::string& flag);

// The config of a model runner's skvq cache (generate's --set, eval's
// --config): the spec's defaults with the model's head_dim, then `sets`
// through apply_sets. The runner takes the head dim from the model and its
// attention reads the packed store, so a head_dim other than `model_head_dim`
// and dense_view=true are refused, not ignored. Errors name `flag`.
Config runner_cache_config(int model_head_dim, const std::vector<std::string>& sets, const std::string& flag);

// Peak resident set size of this process in bytes.
long long peak_rss_bytes();

}  // namespace skvq::tools
