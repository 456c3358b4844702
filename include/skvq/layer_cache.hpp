// One attention layer's key/value cache: the SKVQ cache of the spec and a
// plain uncompressed cache, behind one interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "skvq/config.hpp"
#include "skvq/tensor.hpp"

namespace skvq {

namespace detail {
struct SkvqState;        // src/core/skvq_state.hpp
struct CacheFileAccess;  // src/io/cache_file.cpp
}  // namespace detail

// Byte accounting of spec section 6.
struct Accounting {
  std::int64_t compressed_key_bytes = 0;
  std::int64_t compressed_value_bytes = 0;
  std::int64_t fp16_key_bytes = 0;
  std::int64_t fp16_value_bytes = 0;
  std::int64_t residual_fp16_bytes = 0;
  std::int64_t perm_bytes = 0;
  std::int64_t quantized_tokens = 0;
  std::int64_t tokens_seen = 0;
  double assigned_avg_bits = 16.0;

  // (compressed K + V + residual + perms) / (fp16 K + V); 1.0 when nothing was fed.
  double end_to_end_ratio() const;
  Accounting& operator+=(const Accounting& o);
};

// Bytes really allocated, part by part.
struct StoredBytes {
  std::int64_t codes = 0;       // bit-packed codes of flushed chunks
  std::int64_t metadata = 0;    // lo and scale of flushed chunks
  std::int64_t sinks = 0;       // exact sink rows
  std::int64_t tail = 0;        // exact tail (one window of rows, allocated once)
  std::int64_t perms = 0;       // permutations and their inverses
  std::int64_t dense_view = 0;  // dense reconstruction buffer (0 in packed-only mode)
  std::int64_t total() const { return codes + metadata + sinks + tail + perms + dense_view; }
  StoredBytes& operator+=(const StoredBytes& o);
};

class LayerCache {
 public:
  virtual ~LayerCache() = default;

  // Appends keys [B, H, S, D] and values [B, H, S, Dv] and returns the whole
  // history [B, H, offset, D] / [B, H, offset, Dv] in the input dtype. The
  // returned views point into the cache and stay valid until the next call
  // that changes it.
  virtual std::pair<TensorView, TensorView> update_and_fetch(const TensorView& keys,
                                                             const TensorView& values) = 0;
  // Appends without returning anything (works in packed-only mode too).
  virtual void append(const TensorView& keys, const TensorView& values) = 0;
  // Writes the whole history into caller buffers of shape [B, H, offset, D(v)]
  // (any dtype, any strides).
  virtual void fetch_into(const TensorView& keys_out, const TensorView& values_out) const = 0;

  virtual std::int64_t offset() const = 0;
  virtual bool is_trimmable() const = 0;
  // Drops the last n tokens; refused (skvq::Error, state unchanged) where not trimmable.
  virtual void trim(std::int64_t n) = 0;
  virtual Accounting accounting() const = 0;
  virtual StoredBytes stored_bytes() const = 0;
  virtual std::string kind() const = 0;  // "skvq" or "plain"
  virtual std::unique_ptr<LayerCache> clone() const = 0;
};

// Merging layer caches into one batch is refused: always throws skvq::Error.
[[noreturn]] void merge(const std::vector<const LayerCache*>& caches);

// Exact cache: holds every row as given (the fp16 baseline).
class PlainCache final : public LayerCache {
 public:
  explicit PlainCache(std::optional<std::int64_t> max_ctx = std::nullopt);
  std::pair<TensorView, TensorView> update_and_fetch(const TensorView& keys,
                                                     const TensorView& values) override;
  void append(const TensorView& keys, const TensorView& values) override;
  void fetch_into(const TensorView& keys_out, const TensorView& values_out) const override;
  std::int64_t offset() const override { return offset_; }
  bool is_trimmable() const override { return true; }
  void trim(std::int64_t n) override;
  Accounting accounting() const override;
  StoredBytes stored_bytes() const override;
  std::string kind() const override { return "plain"; }
  std::unique_ptr<LayerCache> clone() const override;

  TensorView keys() const;    // [B, H, offset, D]
  TensorView values() const;  // [B, H, offset, Dv]

 private:
  friend struct detail::CacheFileAccess;
  std::optional<std::int64_t> max_ctx_;
  bool initialized_ = false;
  DType dtype_ = DType::f16;
  std::int64_t batch_ = 0, heads_ = 0, dk_ = 0, dv_ = 0, offset_ = 0, cap_ = 0;
  std::int64_t tokens_seen_ = 0;
  std::vector<std::byte> k_, v_;  // [B, H, cap, D]
};

// Which quantizer a cache's flush runs: the Highway SIMD kernel (default) or
// the scalar reference. Both give identical codes and metadata.
enum class Kernel : std::uint8_t { simd, reference };

// The SKVQ cache of the spec, holding packed codes for real.
class SkvqCache final : public LayerCache {
 public:
  // Validates the config; throws skvq::Error naming the first bad field.
  explicit SkvqCache(const Config& config);
  SkvqCache(const SkvqCache& other);
  SkvqCache& operator=(const SkvqCache& other);
  SkvqCache(SkvqCache&&) noexcept;
  SkvqCache& operator=(SkvqCache&&) noexcept;
  ~SkvqCache() override;

  // In packed-only mode (dense_view = false) update_and_fetch is refused
  // before anything changes: use append + fetch_into.
  std::pair<TensorView, TensorView> update_and_fetch(const TensorView& keys,
                                                     const TensorView& values) override;
  void append(const TensorView& keys, const TensorView& values) override;
  void fetch_into(const TensorView& keys_out, const TensorView& values_out) const override;
  std::int64_t offset() const override;
  bool is_trimmable() const override { return false; }
  [[noreturn]] void trim(std::int64_t n) override;
  Accounting accounting() const override;
  StoredBytes stored_bytes() const override;
  std::string kind() const override { return "skvq"; }
  std::unique_ptr<LayerCache> clone() const override;

  const Config& config() const;
  std::int64_t q_end() const;  // flush frontier, a multiple of window
  // [H, D] int32 row-major; nullopt before the first flush or with reorder off.
  std::optional<std::vector<std::int32_t>> key_perms() const;
  std::optional<std::vector<std::int32_t>> value_perms() const;

  void set_kernel(Kernel k);

  // Threads for the cache's own work: the flush of each full window (split by
  // head and by blocks of rows), the input check and row copies of long
  // appends, fetch_into and the dense view's refresh.
  // 0 (the default) is every CPU the process may run on (its affinity mask),
  // as AttendOptions::num_threads; 1 runs it all on the calling thread. The
  // codes and metadata are the same for every count. Copies keep the setting.
  // Throws skvq::Error for n < 0 (the setting unchanged).
  void set_num_threads(int n);
  int num_threads() const;

  // Sizes the dense view for `tokens` tokens ahead of time (no effect in
  // packed-only mode or before the first call fixes B, H and the dtype: it
  // is then applied at the first call). Never shrinks.
  void reserve(std::int64_t tokens);

  // Every bit of state equal (codes, metadata, tail, sinks, perms, counters, config).
  bool same_state(const SkvqCache& other) const;

  // Internal state, for the library's own kernels and file formats.
  const detail::SkvqState& state() const { return *state_; }
  detail::SkvqState& mutable_state() { return *state_; }

 private:
  std::unique_ptr<detail::SkvqState> state_;
};

}  // namespace skvq
