// JSON forms of config, accounting and stored bytes.
#include "io/report_json.hpp"

namespace skvq::io {

nlohmann::json config_json(const Config& c) {
  nlohmann::json j;
  j["head_dim"] = c.head_dim;
  j["bits_key"] = c.bits_key;
  j["bits_value"] = c.bits_value;
  j["group_size"] = c.group_size;
  j["window"] = c.window;
  j["n_sink"] = c.n_sink;
  j["reorder"] = c.reorder;
  j["clip_search"] = c.clip_search;
  j["clip_alpha"] = c.clip_alpha;
  j["max_ctx"] = c.max_ctx ? nlohmann::json(*c.max_ctx) : nlohmann::json(nullptr);
  j["metadata"] = std::string(meta_name(c.metadata));
  j["dense_view"] = c.dense_view;
  return j;
}

nlohmann::json stored_bytes_json(const StoredBytes& b) {
  return {{"codes", b.codes},       {"metadata", b.metadata}, {"sinks", b.sinks}, {"tail", b.tail},
          {"perms", b.perms},       {"dense_view", b.dense_view}, {"total", b.total()}};
}

namespace {

nlohmann::json perms_json(const std::optional<std::vector<std::int32_t>>& p, std::int64_t heads) {
  if (!p) return nullptr;
  nlohmann::json rows = nlohmann::json::array();
  const std::size_t D = p->size() / static_cast<std::size_t>(heads);
  for (std::int64_t h = 0; h < heads; ++h) {
    rows.push_back(std::vector<std::int32_t>(p->begin() + static_cast<std::ptrdiff_t>(h * D),
                                             p->begin() + static_cast<std::ptrdiff_t>((h + 1) * D)));
  }
  return rows;
}

}  // namespace

nlohmann::json report_json(const SkvqCache& cache) {
  const Accounting a = cache.accounting();
  const StoredBytes s = cache.stored_bytes();
  const auto kp = cache.key_perms();
  const auto vp = cache.value_perms();
  const std::int64_t heads = kp ? static_cast<std::int64_t>(kp->size()) / cache.config().head_dim : 1;
  const std::int64_t vheads = heads;
  nlohmann::json j;
  j["compressed_key_bytes"] = a.compressed_key_bytes;
  j["compressed_value_bytes"] = a.compressed_value_bytes;
  j["fp16_key_bytes"] = a.fp16_key_bytes;
  j["fp16_value_bytes"] = a.fp16_value_bytes;
  j["residual_fp16_bytes"] = a.residual_fp16_bytes;
  j["perm_bytes"] = a.perm_bytes;
  j["quantized_tokens"] = a.quantized_tokens;
  j["tokens_seen"] = a.tokens_seen;
  j["key_perms"] = perms_json(kp, heads);
  j["value_perms"] = perms_json(vp, vheads);
  j["assigned_avg_bits"] = a.assigned_avg_bits;
  j["end_to_end_ratio"] = a.end_to_end_ratio();
  j["offset"] = cache.offset();
  j["stored_bytes"] = s.total();
  j["stored_bytes_parts"] = stored_bytes_json(s);
  j["config"] = config_json(cache.config());
  return j;
}

}  // namespace skvq::io
