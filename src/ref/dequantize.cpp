// Reference reconstruction of packed rows.
#include "ref/dequantize.hpp"

#include <vector>

#include "ref/meta.hpp"
#include "ref/pack.hpp"
#include "ref/quantize.hpp"

namespace skvq::ref {

void dequantize_row(const std::uint8_t* stream, std::int64_t stream_bytes, std::int64_t row, int D,
                    int bits, int g, MetaType meta, const std::uint8_t* lo_row,
                    const std::uint8_t* scale_row, const std::int32_t* perm, float* out) {
  std::uint8_t codes[256];
  const int m = meta_bytes(meta);
  for (int j0 = 0; j0 < D; j0 += 256) {
    const int n = D - j0 < 256 ? D - j0 : 256;
    unpack_codes(stream, stream_bytes, row * D + j0, n, bits, codes);
    for (int i = 0; i < n; ++i) {
      const int j = j0 + i;
      const int k = j / g;
      const float v = dequantize(codes[i], meta_load(lo_row + k * m, meta),
                                 meta_load(scale_row + k * m, meta));
      out[perm ? perm[j] : j] = v;
    }
  }
}

}  // namespace skvq::ref
