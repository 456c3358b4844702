// Reference attention over a cache's rows: per query row, per token, online
// softmax in float32. The oracle of the SIMD kernel.
#pragma once

#include "core/attend_params.hpp"

namespace skvq::ref {

// Row t (keys: side 0, values: side 1) of head (b, h) in original channel
// order, float32: exact sink/tail rows converted, packed rows reconstructed.
void kv_row(const AttendParams& p, int side, std::int64_t b, std::int64_t h, std::int64_t t, float* out);

void attend(const AttendParams& p);

}  // namespace skvq::ref
