// Configuration of one SKVQ layer cache (spec section 1, plus the metadata
// precision and the dense-view switch of section 9).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace skvq {

// Precision of the per-token, per-group lo and scale.
enum class MetaType : std::uint8_t {
  fp16,      // default; what the spec's byte accounting charges (2 bytes)
  fp32,      // bit-exact with the spec's reference semantics (4 bytes)
  fp8_e4m3,  // the paper's choice (1 byte): lo saturates at +-448, scale >= 2^-9
};

constexpr int meta_bytes(MetaType m) { return m == MetaType::fp32 ? 4 : (m == MetaType::fp16 ? 2 : 1); }
std::string_view meta_name(MetaType m);
// Parses "fp16", "fp32", "fp8_e4m3"; throws skvq::Error naming `metadata`.
MetaType parse_meta(std::string_view s);

// The default clip grid, searched in this order.
inline const std::vector<float>& default_clip_grid() {
  static const std::vector<float> grid{1.0f, 0.97f, 0.94f, 0.90f, 0.85f};
  return grid;
}

struct Config {
  int head_dim = 128;   // >= 1
  int bits_key = 2;     // 1..8
  int bits_value = 2;   // 1..8
  int group_size = 32;  // >= 1, need not divide head_dim
  int window = 128;     // >= 2: fp16 window == flush chunk size r
  int n_sink = 5;       // 0 <= n_sink < window
  bool reorder = true;
  bool clip_search = true;
  float clip_alpha = 1.0f;              // 0 < a <= 1, checked even when clip_search is on
  std::optional<std::int64_t> max_ctx;  // >= 1 when set
  MetaType metadata = MetaType::fp16;
  // true: keep a dense reconstruction of the history so update_and_fetch can
  // return it; false (packed-only): only the packed store is held and callers
  // materialize with fetch_into.
  bool dense_view = true;

  // Throws skvq::Error naming the first invalid field, its value and its range.
  void validate() const;

  // The grid of clip factors that the quantizer searches.
  std::vector<float> clip_grid() const {
    return clip_search ? default_clip_grid() : std::vector<float>{clip_alpha};
  }

  // Sets one field from text ("bits_key", "4"); used by the command line.
  // Throws skvq::Error naming the field and the value when either is bad.
  // Does not validate ranges: call validate() once all fields are set.
  void set(std::string_view field, std::string_view value);

  // Field names accepted by set(), in spec order.
  static const std::vector<std::string>& field_names();

  bool operator==(const Config&) const = default;
};

}  // namespace skvq
