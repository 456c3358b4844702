// Checks on tensors handed to a cache, shared by every cache kind. Each
// throws skvq::Error naming the tensor, what is wrong and the value received.
#pragma once

#include <string>

#include "skvq/config.hpp"
#include "skvq/tensor.hpp"

namespace skvq::detail {

// keys [B, H, S, D], values [B, H, S, Dv]: supported dtype, same dtype, data
// present, every extent >= 1, B, H and S equal.
void check_kv_pair(const TensorView& keys, const TensorView& values);

// Every element finite and |x| <= limit; the error names the first bad
// position. `why` explains the limit ("the range of fp16 metadata").
// threads > 1: a tensor of kParallelElements or more is read by up to that
// many of the pool's threads, in ranges of heads (the same error either way).
void check_values(const TensorView& t, const char* name, float limit, const std::string& why, int threads = 1);

// Elements from which the cache's copies and checks use the pool's threads:
// below it (a decode step's few rows) waking them costs more than it saves.
inline constexpr std::int64_t kParallelElements = std::int64_t{1} << 18;

// The largest magnitude a cache with this metadata mode quantizes (what the
// type can carry as lo without saturating; for fp32 the bound keeps max - min
// finite in float32), and why (for check_values' message).
float value_limit(MetaType m, std::string* why);

}  // namespace skvq::detail
