#include "cpu/byte_codes.hpp"

namespace skvq::cpu {

namespace {

struct ByteCodes {
  float t1[256 * 8], t2[256 * 4], t4[256 * 2];
  ByteCodes() {
    for (int b = 0; b < 256; ++b) {
      for (int k = 0; k < 8; ++k) t1[b * 8 + k] = static_cast<float>((b >> k) & 1);
      for (int k = 0; k < 4; ++k) t2[b * 4 + k] = static_cast<float>((b >> (2 * k)) & 3);
      for (int k = 0; k < 2; ++k) t4[b * 2 + k] = static_cast<float>((b >> (4 * k)) & 15);
    }
  }
};

}  // namespace

const float* byte_codes(int bits) {
  static const ByteCodes tables;
  return bits == 1 ? tables.t1 : bits == 2 ? tables.t2 : bits == 4 ? tables.t4 : nullptr;
}

}  // namespace skvq::cpu
