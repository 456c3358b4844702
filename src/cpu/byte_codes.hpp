// byte -> its 8 / bits codes as floats, lowest code first: the table both the
// attention kernels' float path and the dequantizer expand packed codes with.
#pragma once

namespace skvq::cpu {

// 256 * (8 / bits) floats for bits 1, 2 or 4 (entry b * (8 / bits) + k: code k of byte b);
// nullptr for other widths.
const float* byte_codes(int bits);

}  // namespace skvq::cpu
