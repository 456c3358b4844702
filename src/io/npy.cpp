// .npy reader and writer.
#include "io/npy.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/open_input.hpp"
#include "skvq/error.hpp"

namespace skvq::io {

std::size_t NpyArray::item_size() const {
  return descr.size() >= 3 ? static_cast<std::size_t>(std::stoi(descr.substr(2))) : 0;
}

std::int64_t NpyArray::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("skvq: " + path + ": " + what);
}

// Value text of `key` in the header dict, up to the next top-level comma.
std::string dict_value(const std::string& hdr, const std::string& key, const std::string& path) {
  const auto k = hdr.find("'" + key + "'");
  if (k == std::string::npos) fail(path, "npy header has no '" + key + "' entry");
  auto p = hdr.find(':', k);
  if (p == std::string::npos) fail(path, "npy header entry '" + key + "' is malformed");
  ++p;
  while (p < hdr.size() && hdr[p] == ' ') ++p;
  if (p < hdr.size() && hdr[p] == '(') {
    const auto e = hdr.find(')', p);
    if (e == std::string::npos) fail(path, "npy header shape is not closed");
    return hdr.substr(p, e - p + 1);
  }
  auto e = hdr.find_first_of(",}", p);
  if (e == std::string::npos) e = hdr.size();
  return hdr.substr(p, e - p);
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream f;
  if (const std::string why = open_input(f, path); !why.empty()) fail(path, why == "cannot open" ? "cannot open file" : why);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_npy(bytes, path);
}

NpyArray parse_npy(std::string_view bytes, const std::string& path) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) fail(path, "not an .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t hlen = 0, hstart = 0;
  if (major == 1) {
    hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(path, "truncated npy header");
    for (int i = 0; i < 4; ++i) hlen |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    hstart = 12;
  } else {
    fail(path, "unsupported npy format version " + std::to_string(major));
  }
  if (hlen > bytes.size() - hstart) fail(path, "truncated npy header");
  const std::string hdr(bytes.substr(hstart, hlen));

  NpyArray a;
  std::string descr = dict_value(hdr, "descr", path);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"')) fail(path, "npy descr " + descr + " is malformed");
  descr = descr.substr(1, descr.size() - 2);
  if (descr.size() >= 1 && (descr[0] == '=' || descr[0] == '|')) descr[0] = '<';
  if (descr != "<f2" && descr != "<f4" && descr != "<i4" && descr != "<f8") {
    fail(path, "dtype " + descr + " is not supported (float16, float32, int32 or float64, little-endian)");
  }
  a.descr = descr;
  const std::string fortran = dict_value(hdr, "fortran_order", path);
  if (fortran.find("False") == std::string::npos) fail(path, "Fortran-order arrays are not supported (need C order)");
  const std::string shape = dict_value(hdr, "shape", path);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') fail(path, "npy shape " + shape + " is not a tuple");
  std::stringstream ss(shape.substr(1, shape.size() - 2));
  std::string item;
  std::int64_t numel = 1;  // as NpyArray::numel() multiplies, checked for overflow
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    const std::string num = item.substr(b, item.find_last_not_of(" \tL") - b + 1);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(num.c_str(), &end, 10);
    if (num.empty() || *end != '\0' || v < 0 || errno == ERANGE) fail(path, "npy shape " + shape + " is malformed");
    if (__builtin_mul_overflow(numel, static_cast<std::int64_t>(v), &numel)) fail(path, "npy shape " + shape + " is too large");
    a.shape.push_back(v);
  }
  std::size_t need = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(numel), a.item_size(), &need)) {
    fail(path, "npy shape " + shape + " is too large");
  }
  const std::size_t have = bytes.size() - hstart - hlen;
  if (have < need) {
    fail(path, "truncated data: shape " + shape + " needs " + std::to_string(need) + " bytes, file has " +
                   std::to_string(have));
  }
  if (have > need) fail(path, "has " + std::to_string(have - need) + " bytes after the array data");
  a.data.resize(need);
  if (need > 0) std::memcpy(a.data.data(), bytes.data() + hstart + hlen, need);  // an empty vector's data() may be null
  return a;
}

std::string npy_bytes(const std::string& descr, const std::vector<std::int64_t>& shape,
                      const void* data, std::size_t nbytes) {
  std::string sh = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) sh += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  // numpy writes "(1, 2, 3)" and "(5,)"; both parse the same.
  sh += ")";
  std::string hdr = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
  const std::size_t total = 10 + hdr.size() + 1;
  hdr.append((64 - total % 64) % 64, ' ');
  hdr += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(hdr.size() & 0xff);
  out += static_cast<char>((hdr.size() >> 8) & 0xff);
  out += hdr;
  out.append(static_cast<const char*>(data), nbytes);
  return out;
}

}  // namespace skvq::io
