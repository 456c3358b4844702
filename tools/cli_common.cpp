// Atomic multi-file output for the subcommands.
#include "cli_common.hpp"

#include "skvq/error.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

namespace skvq::tools {

namespace fs = std::filesystem;

void write_all_or_nothing(const fs::path& dir, const std::map<std::string, std::string>& files,
                          const std::vector<std::string>& remove_stale, const std::string& flag) {
  std::error_code ec;
  bool created = false;
  if (!fs::exists(dir, ec)) {
    created = fs::create_directories(dir, ec);
    if (ec) throw UsageError(flag + " " + dir.string() + ": cannot create directory: " + ec.message());
  } else if (!fs::is_directory(dir, ec)) {
    throw UsageError(flag + " " + dir.string() + ": exists and is not a directory");
  }
  std::vector<fs::path> temps;
  auto cleanup = [&] {
    std::error_code ignore;
    for (const auto& t : temps) fs::remove(t, ignore);
    if (created) fs::remove_all(dir, ignore);
  };
  try {
    for (const auto& [name, bytes] : files) {
      const fs::path tmp = dir / ("." + name + ".partial");
      temps.push_back(tmp);
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      f.flush();
      if (!f) throw UsageError(flag + " " + dir.string() + ": cannot write " + name);
    }
    for (const auto& [name, bytes] : files) {
      fs::rename(dir / ("." + name + ".partial"), dir / name, ec);
      if (ec) throw UsageError(flag + " " + dir.string() + ": cannot rename into " + name + ": " + ec.message());
    }
  } catch (...) {
    cleanup();
    throw;
  }
  for (const auto& name : remove_stale) {
    if (!files.count(name)) fs::remove(dir / name, ec);
  }
}

void check_output_file(const std::string& flag, const std::string& path, bool may_create_dirs) {
  std::error_code ec;
  const fs::path p(path);
  if (path.empty()) throw UsageError(flag + " must name a file");
  if (fs::is_directory(p, ec)) throw UsageError(flag + " " + path + ": is a directory");
  fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (may_create_dirs) {
    while (!fs::exists(dir, ec) && dir.has_parent_path() && dir.parent_path() != dir) dir = dir.parent_path();
  }
  if (!fs::exists(dir, ec)) throw UsageError(flag + " " + path + ": directory " + dir.string() + " does not exist");
  if (!fs::is_directory(dir, ec)) throw UsageError(flag + " " + path + ": " + dir.string() + " is not a directory");
  // A probe file created and removed there: access() would answer from the permission bits alone,
  // which /proc and /sys pass for root though they refuse to create a file.
  std::string probe = (dir / ".skvq-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    throw UsageError(flag + " " + path + ": directory " + dir.string() + " is not writable (" + std::strerror(errno) + ")");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void apply_sets(Config& cfg, const std::vector<std::string>& sets, const std::string& flag) {
  for (const auto& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError(flag + " " + s + ": expected FIELD=VALUE");
    try {
      cfg.set(s.substr(0, eq), s.substr(eq + 1));
    } catch (const Error& e) {
      throw UsageError(flag + " " + s + ": " + std::string(e.what()).substr(6));
    }
  }
  try {
    cfg.validate();
  } catch (const Error& e) {
    // (eval's flag, "--config NAME:FIELD=VALUE,...:", ends in its own colon)
    throw UsageError(flag + (flag.ends_with(':') ? " " : ": ") + std::string(e.what()).substr(6));
  }
}

Config runner_cache_config(int model_head_dim, const std::vector<std::string>& sets, const std::string& flag) {
  Config cfg;
  cfg.head_dim = model_head_dim;
  cfg.dense_view = false;  // (the runner's caches keep none: only an explicit dense_view=true is refused)
  apply_sets(cfg, sets, flag);
  const std::string where = flag + (flag.ends_with(':') ? " " : ": ");  // (as apply_sets names it)
  if (cfg.dense_view) {
    throw UsageError(where + "dense_view=true, but the model runner's caches keep no dense view (their attention reads the packed store)");
  }
  if (cfg.head_dim != model_head_dim) {
    throw UsageError(where + "head_dim=" + std::to_string(cfg.head_dim) + ", but the model's heads have " + std::to_string(model_head_dim) +
                     " channels (the cache takes its head dim from the model)");
  }
  return cfg;
}

long long peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<long long>(ru.ru_maxrss) * 1024;
}

}  // namespace skvq::tools
