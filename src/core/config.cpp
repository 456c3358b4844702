// Config validation and parsing from text.
#include "skvq/config.hpp"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <sstream>

#include "skvq/error.hpp"

namespace skvq {

std::string_view meta_name(MetaType m) {
  switch (m) {
    case MetaType::fp16: return "fp16";
    case MetaType::fp32: return "fp32";
    case MetaType::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

MetaType parse_meta(std::string_view s) {
  if (s == "fp16") return MetaType::fp16;
  if (s == "fp32") return MetaType::fp32;
  if (s == "fp8_e4m3" || s == "e4m3") return MetaType::fp8_e4m3;
  throw Error("skvq: metadata=" + std::string(s) + " must be one of fp16, fp32, fp8_e4m3");
}

namespace {

std::string fmt_float(float v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void check_range(const char* field, long long v, long long lo, long long hi) {
  if (v < lo || v > hi) {
    throw Error("skvq: " + std::string(field) + "=" + std::to_string(v) + " must be in [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

void check_min(const char* field, long long v, long long lo) {
  if (v < lo) {
    throw Error("skvq: " + std::string(field) + "=" + std::to_string(v) + " must be >= " +
                std::to_string(lo));
  }
}

long long parse_int(std::string_view field, std::string_view value) {
  long long v = 0;
  const auto* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (ec == std::errc::result_out_of_range && p == end) {
    throw Error("skvq: " + std::string(field) + "=" + std::string(value) + " is out of int range");
  }
  if (ec != std::errc() || p != end || value.empty()) {
    throw Error("skvq: " + std::string(field) + "=" + std::string(value) + " is not an integer");
  }
  return v;
}

int parse_int32(std::string_view field, std::string_view value) {
  const long long v = parse_int(field, value);
  if (v < -2147483647LL || v > 2147483647LL) {
    throw Error("skvq: " + std::string(field) + "=" + std::string(value) + " is out of int range");
  }
  return static_cast<int>(v);
}

bool parse_bool(std::string_view field, std::string_view value) {
  if (value == "true" || value == "1" || value == "on" || value == "yes") return true;
  if (value == "false" || value == "0" || value == "off" || value == "no") return false;
  throw Error("skvq: " + std::string(field) + "=" + std::string(value) +
              " must be true or false");
}

}  // namespace

void Config::validate() const {
  check_min("head_dim", head_dim, 1);
  check_range("bits_key", bits_key, 1, 8);
  check_range("bits_value", bits_value, 1, 8);
  check_min("group_size", group_size, 1);
  check_min("window", window, 2);
  check_range("n_sink", n_sink, 0, static_cast<long long>(window) - 1);
  if (!(clip_alpha > 0.0f && clip_alpha <= 1.0f)) {  // NaN fails too
    throw Error("skvq: clip_alpha=" + fmt_float(clip_alpha) + " must be in (0, 1]");
  }
  if (max_ctx && *max_ctx < 1) {
    throw Error("skvq: max_ctx=" + std::to_string(*max_ctx) + " must be >= 1");
  }
  switch (metadata) {
    case MetaType::fp16:
    case MetaType::fp32:
    case MetaType::fp8_e4m3: break;
    default:
      throw Error("skvq: metadata=" + std::to_string(static_cast<int>(metadata)) +
                  " must be one of fp16, fp32, fp8_e4m3");
  }
}

const std::vector<std::string>& Config::field_names() {
  static const std::vector<std::string> names{
      "head_dim", "bits_key",   "bits_value", "group_size", "window",   "n_sink",
      "reorder",  "clip_search", "clip_alpha", "max_ctx",    "metadata", "dense_view"};
  return names;
}

void Config::set(std::string_view field, std::string_view value) {
  if (field == "head_dim") head_dim = parse_int32(field, value);
  else if (field == "bits_key") bits_key = parse_int32(field, value);
  else if (field == "bits_value") bits_value = parse_int32(field, value);
  else if (field == "group_size") group_size = parse_int32(field, value);
  else if (field == "window") window = parse_int32(field, value);
  else if (field == "n_sink") n_sink = parse_int32(field, value);
  else if (field == "reorder") reorder = parse_bool(field, value);
  else if (field == "clip_search") clip_search = parse_bool(field, value);
  else if (field == "dense_view") dense_view = parse_bool(field, value);
  else if (field == "metadata") metadata = parse_meta(value);
  else if (field == "max_ctx") {
    if (value == "none" || value == "None" || value == "null") max_ctx.reset();
    else max_ctx = parse_int(field, value);
  } else if (field == "clip_alpha") {
    const std::string s(value);
    char* end = nullptr;
    errno = 0;
    const float v = std::strtof(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size()) {
      throw Error("skvq: clip_alpha=" + s + " is not a number");
    }
    // (a value float32 cannot hold, 1e-50 or 1e50: named as written, not as the 0 or inf it became)
    if (errno == ERANGE && (v == 0.0f || std::isinf(v))) {
      throw Error("skvq: clip_alpha=" + s + " must be in (0, 1] (it is out of float32 range)");
    }
    clip_alpha = v;
  } else {
    std::string known;
    for (const auto& n : field_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error("skvq: unknown config field '" + std::string(field) + "' (known: " + known + ")");
  }
}

}  // namespace skvq
