// The reference transformer runner: fp32 compute, K/V handed to a prompt
// cache exactly as an inference engine would (per layer: new rows in, then
// attention over what the cache holds, read straight from its store).
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "model/model.hpp"
#include "skvq/attention.hpp"
#include "skvq/prompt_cache.hpp"

namespace skvq::model {

class Runner {
 public:
  explicit Runner(const Model& m, AttendOptions opts = {}) : m_(m), opts_(opts) {}

  // A prompt cache for this model: PlainCache (fp16) per layer, or SkvqCache
  // with `cfg` (head_dim set from the model; dense view off: only the
  // packed store is held).
  PromptCache make_cache(CacheKind kind, const Config& cfg = {}) const;

  // Runs tokens at positions [cache offset, + n). Returns logits [n, vocab]
  // (all_logits) or [1, vocab] for the last token. Calls into the cache are
  // split at flush boundaries so that every token sees exactly the cache
  // state it would see in one-token-at-a-time decoding.
  std::vector<float> forward(std::span<const int> tokens, PromptCache& cache, bool all_logits) const;

  // The same forward with each layer's attention left to `attention(layer, q, k, v, out)`: q
  // [1, n_heads, n, hd] fp32, the new rows k and v [1, n_kv_heads, n, hd] fp16 (RoPE applied) to
  // append to the caller's cache, out [1, n_heads, n, hd] fp32 to fill with the attention of q over
  // it. For caches outside a PromptCache (the GPU's); the caller splits the tokens as it needs.
  // Tokens at positions [pos0, pos0 + n); logits [n, vocab] (all_logits) or [1, vocab] for the last
  // token.
  using Attention = std::function<void(int layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out)>;
  std::vector<float> forward_with(std::span<const int> tokens, std::int64_t pos0, const Attention& attention,
                                  bool all_logits = true) const;

  const Model& model() const { return m_; }

 private:
  void forward_piece(std::span<const int> tokens, PromptCache& cache, float* logits, bool all_logits,
                     bool want_logits) const;
  const Model& m_;
  AttendOptions opts_;
};

// How many of n tokens a call into an skvq cache with `live` rows in its window of `window` rows
// takes so that it flushes no window except with its last token (Runner::forward's pieces: each
// token then sees the cache state that one-token-at-a-time decoding would give it).
std::size_t piece_before_flush(std::size_t n, std::int64_t window, std::int64_t live);

// Reference forward over a whole sequence without any cache: full causal
// attention over K/V rounded to fp16 (what the fp16 cache holds), in float64
// (ref::dense_attention) or with the SIMD kernel over dense tensors
// (attend_dense). Logits [n, vocab]. For tests.
enum class NoCacheAttention { float64, simd };
std::vector<float> forward_no_cache(const Model& m, std::span<const int> tokens,
                                    NoCacheAttention how = NoCacheAttention::float64);

}  // namespace skvq::model
