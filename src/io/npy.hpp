// NumPy .npy files (format versions 1, 2 and 3), little-endian, C order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace skvq::io {

struct NpyArray {
  std::string descr;                // "<f2", "<f4", "<i4", ...
  std::vector<std::int64_t> shape;  // C order
  std::vector<std::byte> data;      // numel * item size bytes
  std::size_t item_size() const;
  std::int64_t numel() const;
};

// Throws skvq::Error naming the path and what is wrong (missing file, bad
// magic, unsupported dtype, Fortran order, truncated or oversized data).
NpyArray read_npy(const std::string& path);
// The same from the file's bytes (`path` names it in errors).
NpyArray parse_npy(std::string_view bytes, const std::string& path);

// Serialises an array (header padded to a multiple of 64 bytes, version 1.0).
std::string npy_bytes(const std::string& descr, const std::vector<std::int64_t>& shape,
                      const void* data, std::size_t nbytes);

}  // namespace skvq::io
