// skvq inspect: print what a prompt-cache file holds.
#include <cstdio>

#include "cli_common.hpp"
#include "commands.hpp"
#include "io/report_json.hpp"
#include "skvq/cache_file.hpp"
#include "skvq/skvq.hpp"

namespace skvq::tools {

namespace {

int run_inspect(const std::string& path, bool json_out) {
  CacheFileExtras extras;
  PromptCache pc;
  try {
    pc = load_prompt_cache(path, &extras);
  } catch (const Error& e) {
    throw UsageError(std::string(e.what()).substr(6));
  }
  if (json_out) {
    nlohmann::json j;
    j["file"] = path;
    j["layers"] = nlohmann::json::array();
    for (std::size_t l = 0; l < pc.size(); ++l) {
      const LayerCache& c = pc.layer(l);
      nlohmann::json lj;
      if (const auto* s = dynamic_cast<const SkvqCache*>(&c)) lj = io::report_json(*s);
      lj["kind"] = c.kind();
      lj["offset"] = c.offset();
      lj["stored_bytes"] = c.stored_bytes().total();
      j["layers"].push_back(lj);
    }
    j["strings"] = extras.strings;
    for (const auto& [k, v] : extras.int_arrays) j["int_arrays"][k] = v.size();
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const Accounting a = pc.accounting();
  const StoredBytes sb = pc.stored_bytes();
  std::printf("%s: skvq prompt cache, format version <= %d, %zu layers\n", path.c_str(), kCacheFileVersion, pc.size());
  std::printf("tokens seen %lld; stored %lld bytes (codes %lld, metadata %lld, sinks %lld, tail %lld, perms %lld, dense %lld); "
              "fp16 equivalent %lld bytes\n",
              static_cast<long long>(a.tokens_seen / static_cast<std::int64_t>(std::max<std::size_t>(pc.size(), 1))),
              static_cast<long long>(sb.total()), static_cast<long long>(sb.codes), static_cast<long long>(sb.metadata),
              static_cast<long long>(sb.sinks), static_cast<long long>(sb.tail), static_cast<long long>(sb.perms),
              static_cast<long long>(sb.dense_view), static_cast<long long>(a.fp16_key_bytes + a.fp16_value_bytes));
  std::printf("%-6s %-6s %8s %8s %-44s %12s %10s\n", "layer", "kind", "offset", "q_end", "config", "stored", "avg bits");
  for (std::size_t l = 0; l < pc.size(); ++l) {
    const LayerCache& c = pc.layer(l);
    if (const auto* s = dynamic_cast<const SkvqCache*>(&c)) {
      const Config& cf = s->config();
      char cfg[128];
      std::snprintf(cfg, sizeof cfg, "K%dV%d g%d w%d sinks %d %s%s meta %s", cf.bits_key, cf.bits_value, cf.group_size,
                    cf.window, cf.n_sink, cf.reorder ? "reorder " : "", cf.clip_search ? "clip" : "noclip",
                    std::string(meta_name(cf.metadata)).c_str());
      std::printf("%-6zu %-6s %8lld %8lld %-44s %12lld %10.3f\n", l, "skvq", static_cast<long long>(c.offset()),
                  static_cast<long long>(s->q_end()), cfg, static_cast<long long>(c.stored_bytes().total()),
                  c.accounting().assigned_avg_bits);
    } else {
      std::printf("%-6zu %-6s %8lld %8s %-44s %12lld %10s\n", l, c.kind().c_str(), static_cast<long long>(c.offset()), "-",
                  "exact", static_cast<long long>(c.stored_bytes().total()), "16");
    }
  }
  for (const auto& [k, v] : extras.strings) std::printf("string %s = %s\n", k.c_str(), v.c_str());
  for (const auto& [k, v] : extras.int_arrays) std::printf("array %s: %zu int32\n", k.c_str(), v.size());
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app, CommandList& commands) {
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("inspect", "Print what a prompt-cache file holds");
  sub->add_option("file", *path, "cache file (.safetensors) written by --save-cache")->required();
  sub->add_flag("--json", *json_out, "print JSON instead of a table");
  commands.emplace_back(sub, [path, json_out] { return run_inspect(*path, *json_out); });
}

}  // namespace skvq::tools
