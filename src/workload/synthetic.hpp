// A deterministic workload that mimics an LLM's keys and values: a few
// outlier channels per head, RoPE-rotated keys, and large attention-sink
// rows. Used by `skvq demo`, the benchmarks and the tests.
#pragma once

#include <cstdint>
#include <random>

#include "skvq/tensor.hpp"

namespace skvq::workload {

struct SyntheticSpec {
  std::int64_t batch = 1;
  std::int64_t num_kv_heads = 8;
  std::int64_t kv_len = 4096;
  std::int64_t head_dim = 128;
  int outlier_channels = 4;  // per head, magnitude ~ 10x the rest
  int sink_rows = 4;         // first rows, magnitude ~ 4x
  std::uint32_t seed = 1234;
};

// Standard normal samples from a fixed generator (Box-Muller on mt19937, so
// the stream is the same with every standard library).
class Normal {
 public:
  explicit Normal(std::uint32_t seed);
  float operator()();
  std::uint32_t next();

 private:
  std::mt19937 gen_;
  bool has_ = false;
  float spare_ = 0.0f;
};

// keys and values [B, H, kv_len, D] in `dtype`.
void make_kv(const SyntheticSpec& spec, DType dtype, Tensor* keys, Tensor* values);

// Queries [B, num_q_heads, n, D] that attend mostly to a few positions (like
// a trained model's), drawn from the same generator.
Tensor make_queries(const SyntheticSpec& spec, std::int64_t num_q_heads, std::int64_t n, const Tensor& keys,
                    DType dtype);

// Fills `t` with standard normal values from a fixed generator.
void fill_normal(const TensorView& t, std::uint32_t seed, float scale = 1.0f);

}  // namespace skvq::workload
