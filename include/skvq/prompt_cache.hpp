// A prompt cache: one layer cache per layer of a model, built by one call
// from a description of the model's layers (spec section 7).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "skvq/config.hpp"
#include "skvq/layer_cache.hpp"

namespace skvq {

struct LayerDesc {
  bool attention = true;  // false: a layer without attention gets a plain cache
  int head_dim = 128;     // this layer's key head dim
};

struct ModelDesc {
  std::vector<LayerDesc> layers;
  // n_layers identical attention layers of head dim head_dim.
  static ModelDesc uniform(int n_layers, int head_dim);
};

enum class CacheKind { plain, skvq };

class PromptCache {
 public:
  // kind == skvq: each attention layer gets an SkvqCache with `config` and
  // that layer's head_dim; other layers (and every layer for kind == plain)
  // get a PlainCache with config.max_ctx. Throws skvq::Error on a bad config.
  static PromptCache build(const ModelDesc& model, CacheKind kind, const Config& config = {});

  PromptCache() = default;
  PromptCache(const PromptCache& other);
  PromptCache& operator=(const PromptCache& other);
  PromptCache(PromptCache&&) noexcept = default;
  PromptCache& operator=(PromptCache&&) noexcept = default;

  std::size_t size() const { return layers_.size(); }
  LayerCache& layer(std::size_t i);
  const LayerCache& layer(std::size_t i) const;
  void push_back(std::unique_ptr<LayerCache> layer) { layers_.push_back(std::move(layer)); }

  Accounting accounting() const;    // summed over layers
  StoredBytes stored_bytes() const;  // summed over layers

 private:
  std::vector<std::unique_ptr<LayerCache>> layers_;
};

}  // namespace skvq
