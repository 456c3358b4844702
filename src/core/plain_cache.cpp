// PlainCache: the exact baseline cache (rows held as given).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/input_check.hpp"
#include "skvq/error.hpp"
#include "skvq/layer_cache.hpp"

namespace skvq {

PlainCache::PlainCache(std::optional<std::int64_t> max_ctx) : max_ctx_(max_ctx) {
  if (max_ctx && *max_ctx < 1) {
    throw Error("skvq: max_ctx=" + std::to_string(*max_ctx) + " must be >= 1");
  }
}

void PlainCache::append(const TensorView& keys, const TensorView& values) {
  detail::check_kv_pair(keys, values);
  if (initialized_ && (keys.shape[0] != batch_ || keys.shape[1] != heads_ || keys.shape[3] != dk_ ||
                       values.shape[3] != dv_ || keys.dtype != dtype_)) {
    throw Error("skvq: keys " + shape_string(keys.shape) + " " + std::string(dtype_name(keys.dtype)) +
                " / values D=" + std::to_string(values.shape[3]) + " do not match the cache's [" +
                std::to_string(batch_) + ", " + std::to_string(heads_) + ", *, " + std::to_string(dk_) +
                "] " + std::string(dtype_name(dtype_)) + " / Dv=" + std::to_string(dv_));
  }
  const std::int64_t S = keys.shape[2];
  if (max_ctx_ && offset_ + S > *max_ctx_) {
    throw Error("skvq: context " + std::to_string(offset_ + S) + " exceeds max_ctx=" +
                std::to_string(*max_ctx_));
  }
  const float inf = INFINITY;
  detail::check_values(keys, "keys", inf, "");
  detail::check_values(values, "values", inf, "");
  if (!initialized_) {
    initialized_ = true;
    dtype_ = keys.dtype;
    batch_ = keys.shape[0];
    heads_ = keys.shape[1];
    dk_ = keys.shape[3];
    dv_ = values.shape[3];
  }
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dtype_));
  if (offset_ + S > cap_) {
    std::int64_t cap = std::max({offset_ + S, 2 * cap_, std::int64_t{16}});
    if (max_ctx_) cap = std::min(cap, *max_ctx_);
    for (auto [buf, D] : {std::pair{&k_, dk_}, std::pair{&v_, dv_}}) {
      std::vector<std::byte> grown(static_cast<std::size_t>(batch_ * heads_ * cap * D * es));
      for (std::int64_t bh = 0; bh < batch_ * heads_ && offset_ > 0; ++bh) {
        std::memcpy(grown.data() + bh * cap * D * es, buf->data() + bh * cap_ * D * es,
                    static_cast<std::size_t>(offset_ * D * es));
      }
      *buf = std::move(grown);
    }
    cap_ = cap;
  }
  auto dst = [&](std::vector<std::byte>& buf, std::int64_t D) {
    TensorView v;
    v.data = buf.data();
    v.dtype = dtype_;
    v.shape = {batch_, heads_, S, D};
    v.strides = {heads_ * cap_ * D, cap_ * D, D, 1};
    v.data += offset_ * D * es;
    return v;
  };
  copy_into(keys, dst(k_, dk_));
  copy_into(values, dst(v_, dv_));
  offset_ += S;
  tokens_seen_ += S;
}

std::pair<TensorView, TensorView> PlainCache::update_and_fetch(const TensorView& keys,
                                                               const TensorView& values) {
  append(keys, values);
  return {this->keys(), this->values()};
}

TensorView PlainCache::keys() const {
  TensorView v;
  v.data = const_cast<std::byte*>(k_.data());
  v.dtype = dtype_;
  v.shape = {batch_, heads_, offset_, dk_};
  v.strides = {heads_ * cap_ * dk_, cap_ * dk_, dk_, 1};
  return v;
}

TensorView PlainCache::values() const {
  TensorView v = keys();
  v.data = const_cast<std::byte*>(v_.data());
  v.shape[3] = dv_;
  v.strides = {heads_ * cap_ * dv_, cap_ * dv_, dv_, 1};
  return v;
}

void PlainCache::fetch_into(const TensorView& keys_out, const TensorView& values_out) const {
  if (!initialized_) {
    if (keys_out.shape[2] != 0 || values_out.shape[2] != 0) {
      throw Error("skvq: fetch_into on an empty cache needs T=0 outputs, got keys " +
                  shape_string(keys_out.shape));
    }
    return;
  }
  copy_into(keys(), keys_out);
  copy_into(values(), values_out);
}

void PlainCache::trim(std::int64_t n) {
  if (n < 0 || n > offset_) {
    throw Error("skvq: trim(" + std::to_string(n) + ") must be in [0, " + std::to_string(offset_) + "]");
  }
  offset_ -= n;
}

Accounting PlainCache::accounting() const {
  Accounting a;
  a.fp16_key_bytes = batch_ * heads_ * tokens_seen_ * dk_ * 2;
  a.fp16_value_bytes = batch_ * heads_ * tokens_seen_ * dv_ * 2;
  a.residual_fp16_bytes = offset_ * (dk_ + dv_) * 2 * batch_ * heads_;
  a.tokens_seen = tokens_seen_;
  return a;
}

StoredBytes PlainCache::stored_bytes() const {
  StoredBytes b;
  b.dense_view = static_cast<std::int64_t>(k_.size() + v_.size());
  return b;
}

std::unique_ptr<LayerCache> PlainCache::clone() const { return std::make_unique<PlainCache>(*this); }

}  // namespace skvq
