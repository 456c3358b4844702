// PromptCache: the per-layer caches of a model, and the accounting helpers.
#include "skvq/prompt_cache.hpp"

#include "skvq/error.hpp"

namespace skvq {

double Accounting::end_to_end_ratio() const {
  const double fp16 = static_cast<double>(fp16_key_bytes + fp16_value_bytes);
  if (fp16 == 0.0) return 1.0;
  return static_cast<double>(compressed_key_bytes + compressed_value_bytes + residual_fp16_bytes +
                             perm_bytes) /
         fp16;
}

Accounting& Accounting::operator+=(const Accounting& o) {
  // assigned_avg_bits is re-weighted by the key elements each side quantized.
  const double wa = assigned_avg_bits == 16.0 ? 0.0 : static_cast<double>(compressed_key_bytes) * 8.0 / assigned_avg_bits;
  const double wb = o.assigned_avg_bits == 16.0 ? 0.0 : static_cast<double>(o.compressed_key_bytes) * 8.0 / o.assigned_avg_bits;
  compressed_key_bytes += o.compressed_key_bytes;
  compressed_value_bytes += o.compressed_value_bytes;
  fp16_key_bytes += o.fp16_key_bytes;
  fp16_value_bytes += o.fp16_value_bytes;
  residual_fp16_bytes += o.residual_fp16_bytes;
  perm_bytes += o.perm_bytes;
  quantized_tokens += o.quantized_tokens;
  tokens_seen += o.tokens_seen;
  assigned_avg_bits = (wa + wb) == 0.0 ? 16.0 : 8.0 * static_cast<double>(compressed_key_bytes) / (wa + wb);
  return *this;
}

StoredBytes& StoredBytes::operator+=(const StoredBytes& o) {
  codes += o.codes;
  metadata += o.metadata;
  sinks += o.sinks;
  tail += o.tail;
  perms += o.perms;
  dense_view += o.dense_view;
  return *this;
}

void merge(const std::vector<const LayerCache*>& caches) {
  throw Error("skvq: merge of " + std::to_string(caches.size()) +
              " caches refused: layer caches cannot be merged into a batch");
}

ModelDesc ModelDesc::uniform(int n_layers, int head_dim) {
  ModelDesc m;
  m.layers.assign(static_cast<std::size_t>(n_layers), LayerDesc{true, head_dim});
  return m;
}

PromptCache PromptCache::build(const ModelDesc& model, CacheKind kind, const Config& config) {
  PromptCache pc;
  for (std::size_t i = 0; i < model.layers.size(); ++i) {
    const LayerDesc& l = model.layers[i];
    if (kind == CacheKind::skvq && l.attention) {
      Config c = config;
      c.head_dim = l.head_dim;
      pc.layers_.push_back(std::make_unique<SkvqCache>(c));
    } else {
      pc.layers_.push_back(std::make_unique<PlainCache>(config.max_ctx));
    }
  }
  return pc;
}

PromptCache::PromptCache(const PromptCache& other) {
  for (const auto& l : other.layers_) layers_.push_back(l->clone());
}

PromptCache& PromptCache::operator=(const PromptCache& other) {
  if (this != &other) {
    PromptCache copy(other);
    *this = std::move(copy);
  }
  return *this;
}

LayerCache& PromptCache::layer(std::size_t i) {
  if (i >= layers_.size()) {
    throw Error("skvq: layer index " + std::to_string(i) + " out of range (" +
                std::to_string(layers_.size()) + " layers)");
  }
  return *layers_[i];
}

const LayerCache& PromptCache::layer(std::size_t i) const {
  return const_cast<PromptCache*>(this)->layer(i);
}

Accounting PromptCache::accounting() const {
  Accounting a;
  for (const auto& l : layers_) a += l->accounting();
  return a;
}

StoredBytes PromptCache::stored_bytes() const {
  StoredBytes b;
  for (const auto& l : layers_) b += l->stored_bytes();
  return b;
}

}  // namespace skvq
