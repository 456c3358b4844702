// The reference test cases of spec section 8 (cases 1-18; case 19, the
// quantizer, is in test_quantizer.cpp).
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace skvq::test {
namespace {

constexpr Shape4 shape_s(std::int64_t S) { return {1, 2, S, 64}; }

TEST(SpecCases, Case01_ShortInputReturnedBitExact) {
  SkvqCache c(spec_config());
  Tensor k = randn(shape_s(10), 1), v = randn(shape_s(10), 2);
  auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
  EXPECT_TRUE(bits_equal(ko, k.view()));
  EXPECT_TRUE(bits_equal(vo, v.view()));
  const Accounting a = c.accounting();
  EXPECT_EQ(a.quantized_tokens, 0);
  EXPECT_EQ(a.compressed_key_bytes, 0);
  EXPECT_EQ(a.compressed_value_bytes, 0);
}

template <typename T>
concept HasBits = requires(T t) { t.bits; };
template <typename T>
concept HasBitsFn = requires(T t) { t.bits(); };

TEST(SpecCases, Case02_FreshCacheAdvertisesNoBits) {
  SkvqCache c(spec_config());
  EXPECT_EQ(c.accounting().assigned_avg_bits, 16.0);
  static_assert(!HasBits<SkvqCache> && !HasBitsFn<SkvqCache>, "no integer bits attribute");
  static_assert(!HasBits<LayerCache> && !HasBitsFn<LayerCache>, "no integer bits attribute");
}

TEST(SpecCases, Case03_TailRowsExact) {
  SkvqCache c(spec_config());
  Tensor k = randn(shape_s(53), 3), v = randn(shape_s(53), 4);
  auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
  EXPECT_EQ(c.accounting().quantized_tokens, 48);
  EXPECT_TRUE(bits_equal(ko, k.view(), 48, 53));
  EXPECT_TRUE(bits_equal(vo, v.view(), 48, 53));
  EXPECT_FALSE(bits_equal(ko, k.view(), 4, 48));
}

TEST(SpecCases, Case04_SinkRowsExact) {
  SkvqCache c(spec_config());
  Tensor k = randn(shape_s(40), 5), v = randn(shape_s(40), 6);
  auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
  EXPECT_EQ(c.accounting().quantized_tokens, 32);
  EXPECT_TRUE(bits_equal(ko, k.view(), 0, 4));
  EXPECT_TRUE(bits_equal(vo, v.view(), 0, 4));
}

TEST(SpecCases, Case05_QuantizedRowsDiffer) {
  SkvqCache c(spec_config());
  Tensor k = randn(shape_s(32), 7), v = randn(shape_s(32), 8);
  auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t t = 4; t < 32; ++t) {
      EXPECT_FALSE(row_bits_equal(ko, k.view(), 0, h, t, t)) << "key row " << t;
      EXPECT_FALSE(row_bits_equal(vo, v.view(), 0, h, t, t)) << "value row " << t;
    }
}

TEST(SpecCases, Case06_OneCallEqualsTokenByToken) {
  Tensor k = randn(shape_s(53), 9, DType::f16, true), v = randn(shape_s(53), 10, DType::f16, true);
  SkvqCache a(spec_config()), b(spec_config());
  auto [ka, va] = a.update_and_fetch(k.view(), v.view());
  std::pair<TensorView, TensorView> last;
  for (std::int64_t t = 0; t < 53; ++t) last = b.update_and_fetch(k.view().slice_tokens(t, 1), v.view().slice_tokens(t, 1));
  EXPECT_TRUE(bits_equal(ka, last.first));
  EXPECT_TRUE(bits_equal(va, last.second));
  EXPECT_TRUE(a.same_state(b));
}

TEST(SpecCases, Case07_FlushedRowsFrozen) {
  SkvqCache c(spec_config());
  Tensor k = randn(shape_s(48), 11), v = randn(shape_s(48), 12);
  auto [k0, v0] = c.update_and_fetch(k.view().slice_tokens(0, 16), v.view().slice_tokens(0, 16));
  const Tensor kf = Tensor::copy_of(k0), vf = Tensor::copy_of(v0);
  for (std::int64_t t = 16; t < 48; ++t) {
    auto [kt, vt] = c.update_and_fetch(k.view().slice_tokens(t, 1), v.view().slice_tokens(t, 1));
    ASSERT_TRUE(bits_equal(kt, kf.view(), 0, 16)) << "after token " << t;
    ASSERT_TRUE(bits_equal(vt, vf.view(), 0, 16)) << "after token " << t;
  }
}

TEST(SpecCases, Case08_PermutationsFrozenAtFirstFlush) {
  SkvqCache c(spec_config());
  Tensor k = randn(shape_s(48), 13, DType::f16, true), v = randn(shape_s(48), 14, DType::f16, true);
  c.update_and_fetch(k.view().slice_tokens(0, 15), v.view().slice_tokens(0, 15));
  EXPECT_FALSE(c.key_perms().has_value());
  EXPECT_FALSE(c.value_perms().has_value());
  c.update_and_fetch(k.view().slice_tokens(15, 1), v.view().slice_tokens(15, 1));
  const auto kp = c.key_perms(), vp = c.value_perms();
  ASSERT_TRUE(kp && vp);
  ASSERT_EQ(kp->size(), 2u * 64u);
  for (const auto* p : {&*kp, &*vp})
    for (int h = 0; h < 2; ++h) {
      std::vector<std::int32_t> row(p->begin() + h * 64, p->begin() + (h + 1) * 64);
      std::sort(row.begin(), row.end());
      for (int j = 0; j < 64; ++j) EXPECT_EQ(row[j], j);
    }
  c.update_and_fetch(k.view().slice_tokens(16, 32), v.view().slice_tokens(16, 32));
  EXPECT_EQ(*c.key_perms(), *kp);
  EXPECT_EQ(*c.value_perms(), *vp);
}

TEST(SpecCases, Case09_ReorderOffHasNoPerms) {
  Config cfg = spec_config();
  cfg.reorder = false;
  SkvqCache c(cfg);
  Tensor k = randn(shape_s(40), 15), v = randn(shape_s(40), 16);
  c.update_and_fetch(k.view(), v.view());
  EXPECT_FALSE(c.key_perms().has_value());
  EXPECT_FALSE(c.value_perms().has_value());
  EXPECT_EQ(c.accounting().perm_bytes, 0);
}

TEST(SpecCases, Case10_ReorderLowersKeyErrorOnHeterogeneousChannels) {
  Tensor k = randn({1, 2, 64, 64}, 17, DType::f16, true), v = randn({1, 2, 64, 64}, 18, DType::f16, true);
  Config on = spec_config(), off = spec_config();
  on.n_sink = off.n_sink = 0;
  off.reorder = false;
  SkvqCache a(on), b(off);
  const double mse_on = mse(a.update_and_fetch(k.view(), v.view()).first, k.view());
  const double mse_off = mse(b.update_and_fetch(k.view(), v.view()).first, k.view());
  EXPECT_LT(mse_on, mse_off);
}

TEST(SpecCases, Case11_FixedClipAlpha) {
  Config cfg = spec_config();
  cfg.clip_search = false;
  cfg.clip_alpha = 0.9f;
  SkvqCache c(cfg);
  Tensor k = randn(shape_s(32), 19), v = randn(shape_s(32), 20);
  auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
  EXPECT_EQ(c.accounting().quantized_tokens, 32);
  EXPECT_EQ(ko.shape, k.shape());
  EXPECT_EQ(vo.shape, v.shape());
}

TEST(SpecCases, Case12_WorkedExample) {
  SkvqCache c(spec_config());
  Tensor k = randn(shape_s(35), 21), v = randn(shape_s(35), 22);
  c.update_and_fetch(k.view(), v.view());
  const Accounting a = c.accounting();
  EXPECT_EQ(a.compressed_key_bytes, 1792);
  EXPECT_EQ(a.compressed_value_bytes, 1792);
  EXPECT_EQ(a.fp16_key_bytes, 8960);
  EXPECT_EQ(a.residual_fp16_bytes, 3584);
  EXPECT_EQ(a.perm_bytes, 1024);
  EXPECT_EQ(a.assigned_avg_bits, 4.0);
  EXPECT_EQ(a.quantized_tokens, 32);
  EXPECT_EQ(a.tokens_seen, 35);
}

TEST(SpecCases, Case13_EndToEndRatio) {
  Config cfg = spec_config();
  cfg.window = 32;
  SkvqCache c(cfg);
  Tensor k = randn(shape_s(1024), 23), v = randn(shape_s(1024), 24);
  c.update_and_fetch(k.view(), v.view());
  const double r = c.accounting().end_to_end_ratio();
  EXPECT_LT(r, 0.35);
  EXPECT_NEAR(r, 0.255, 0.01);
}

TEST(SpecCases, Case14_Deterministic) {
  Tensor k = randn(shape_s(80), 25, DType::f16, true), v = randn(shape_s(80), 26, DType::f16, true);
  SkvqCache a(spec_config()), b(spec_config());
  auto [ka, va] = a.update_and_fetch(k.view(), v.view());
  auto [kb, vb] = b.update_and_fetch(k.view(), v.view());
  EXPECT_TRUE(bits_equal(ka, kb));
  EXPECT_TRUE(bits_equal(va, vb));
  EXPECT_TRUE(a.same_state(b));
}

TEST(SpecCases, Case15_MaxCtxRefusedStateUnchanged) {
  Config cfg = spec_config();
  cfg.max_ctx = 32;
  SkvqCache c(cfg);
  Tensor k = randn(shape_s(33), 27), v = randn(shape_s(33), 28);
  c.update_and_fetch(k.view().slice_tokens(0, 20), v.view().slice_tokens(0, 20));
  const SkvqCache before = c;
  try {
    c.update_and_fetch(k.view().slice_tokens(0, 13), v.view().slice_tokens(0, 13));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "skvq: context 33 exceeds max_ctx=32");
  }
  EXPECT_TRUE(c.same_state(before));
  SkvqCache fresh(cfg);
  EXPECT_THROW(fresh.update_and_fetch(k.view(), v.view()), Error);
  EXPECT_EQ(fresh.offset(), 0);
  // offset + S == max_ctx is allowed
  c.update_and_fetch(k.view().slice_tokens(0, 12), v.view().slice_tokens(0, 12));
  EXPECT_EQ(c.offset(), 32);
}

TEST(SpecCases, Case16_InvalidConfigNamesTheField) {
  struct Bad {
    const char* field;
    void (*set)(Config&);
  };
  const Bad bad[] = {
      {"bits_key", [](Config& c) { c.bits_key = 0; }},
      {"bits_value", [](Config& c) { c.bits_value = 9; }},
      {"group_size", [](Config& c) { c.group_size = 0; }},
      {"window", [](Config& c) { c.window = 1; }},
      {"n_sink", [](Config& c) { c.n_sink = 16; }},
      {"clip_alpha", [](Config& c) { c.clip_alpha = 0.0f; }},
      {"clip_alpha", [](Config& c) { c.clip_alpha = 1.5f; }},
      {"clip_alpha", [](Config& c) { c.clip_alpha = NAN; }},
      {"head_dim", [](Config& c) { c.head_dim = 0; }},
      {"max_ctx", [](Config& c) { c.max_ctx = 0; }},
      {"n_sink", [](Config& c) { c.n_sink = -1; }},
  };
  for (const auto& b : bad) {
    Config cfg = spec_config();
    b.set(cfg);
    try {
      SkvqCache c(cfg);
      ADD_FAILURE() << b.field << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(b.field) + "="), std::string::npos) << e.what();
    }
  }
  Config cfg = spec_config();
  cfg.bits_key = 0;
  try {
    SkvqCache c(cfg);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "skvq: bits_key=0 must be in [1, 8]");
  }
  cfg = spec_config();
  cfg.clip_search = true;
  cfg.clip_alpha = 1.5f;  // checked even when the search is on
  EXPECT_THROW(SkvqCache{cfg}, Error);
}

TEST(SpecCases, Case17_NotTrimmable) {
  SkvqCache c(spec_config());
  Tensor k = randn(shape_s(35), 29), v = randn(shape_s(35), 30);
  c.update_and_fetch(k.view(), v.view());
  const SkvqCache before = c;
  EXPECT_FALSE(c.is_trimmable());
  try {
    c.trim(3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not trimmable"), std::string::npos);
  }
  EXPECT_TRUE(c.same_state(before));
  EXPECT_THROW(merge({&c, &before}), Error);
  EXPECT_TRUE(c.same_state(before));
}

TEST(SpecCases, Case18_OutputDtypeFollowsInput) {
  for (DType dt : {DType::bf16, DType::f32}) {
    SkvqCache c(spec_config());
    Tensor k = randn(shape_s(35), 31, dt), v = randn(shape_s(35), 32, dt);
    auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
    EXPECT_EQ(ko.dtype, dt);
    EXPECT_EQ(vo.dtype, dt);
    EXPECT_TRUE(bits_equal(ko, k.view(), 32, 35));
    EXPECT_TRUE(bits_equal(ko, k.view(), 0, 4));
  }
}

}  // namespace
}  // namespace skvq::test
