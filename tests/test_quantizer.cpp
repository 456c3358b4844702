// The reference quantizer (spec case 19), metadata formats and bit packing.
#include <gtest/gtest.h>

#include "ref/meta.hpp"
#include "ref/pack.hpp"
#include "ref/quantize.hpp"
#include "test_util.hpp"

namespace skvq::test {
namespace {

struct GroupResult {
  std::vector<std::uint8_t> codes;
  float lo = 0, scale = 0;
  double err = 0;  // mean squared reconstruction error, double
};

GroupResult quantize(const std::vector<float>& x, int bits, const std::vector<float>& grid,
                     MetaType meta = MetaType::fp32) {
  GroupResult r;
  r.codes.resize(x.size());
  ref::quantize_group(x.data(), static_cast<int>(x.size()), bits, grid.data(), static_cast<int>(grid.size()),
                      meta, r.codes.data(), &r.lo, &r.scale);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(ref::dequantize(r.codes[i], r.lo, r.scale)) - x[i];
    r.err += d * d;
  }
  r.err /= static_cast<double>(x.size());
  return r;
}

TEST(Quantizer, AlphaOneIsPlainMinMax) {
  Normal rng(101);
  for (int bits : {1, 2, 3, 4, 8}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x(32);
      for (auto& v : x) v = rng();
      const auto r = quantize(x, bits, {1.0f});
      const float mn = *std::min_element(x.begin(), x.end()), mx = *std::max_element(x.begin(), x.end());
      const float levels = static_cast<float>((1 << bits) - 1);
      EXPECT_NEAR(r.lo, mn, 1e-6 * (mx - mn));
      EXPECT_NEAR(r.scale, (mx - mn) / levels, 1e-6 * (mx - mn));
      for (std::size_t i = 0; i < x.size(); ++i) {
        const float plain = std::min(std::max(std::nearbyint((x[i] - mn) / ((mx - mn) / levels)), 0.0f), levels);
        EXPECT_EQ(r.codes[i], static_cast<std::uint8_t>(plain));
      }
    }
  }
}

TEST(Quantizer, SearchNeverWorseAndBetterWithOutliers) {
  Normal rng(102);
  double sum_search = 0, sum_plain = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(32);
    for (auto& v : x) v = rng();
    x[static_cast<std::size_t>(trial % 32)] *= 8.0f;  // one outlier per group
    for (MetaType meta : {MetaType::fp32, MetaType::fp16, MetaType::fp8_e4m3}) {
      const auto s = quantize(x, 2, default_clip_grid(), meta);
      const auto p = quantize(x, 2, {1.0f}, meta);
      // The search scores in float32; allow float32 rounding of the sums.
      EXPECT_LE(s.err, p.err * (1 + 1e-5) + 1e-12);
      if (meta == MetaType::fp32) {
        sum_search += s.err;
        sum_plain += p.err;
      }
    }
  }
  EXPECT_LT(sum_search, 0.95 * sum_plain);
}

TEST(Quantizer, ErrorFallsWithBits) {
  Normal rng(103);
  double e2 = 0, e4 = 0, e8 = 0;
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<float> x(64);
    for (auto& v : x) v = rng();
    e2 += quantize(x, 2, default_clip_grid()).err;
    e4 += quantize(x, 4, default_clip_grid()).err;
    e8 += quantize(x, 8, default_clip_grid()).err;
  }
  EXPECT_GT(e2, e4);
  EXPECT_GT(e4, e8);
  EXPECT_GT(e2, 10 * e4);  // roughly 4x per extra bit
}

TEST(Quantizer, RaggedGroupRoundTripsThroughCache) {
  Config cfg;
  cfg.head_dim = 10;
  cfg.group_size = 4;
  cfg.bits_key = cfg.bits_value = 4;
  cfg.window = 8;
  cfg.n_sink = 0;
  cfg.metadata = MetaType::fp32;
  SkvqCache c(cfg);
  Tensor k = randn({1, 1, 8, 10}, 104, DType::f32), v = randn({1, 1, 8, 10}, 105, DType::f32);
  auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
  // 3 groups (padded width 12) of 4-bit codes: 10 codes + 3 * 2 fp32 per row.
  EXPECT_EQ(c.accounting().compressed_key_bytes, 8 * 10 * 4 / 8 + 8 * 3 * 2 * 4);
  const auto perm = *c.key_perms();
  for (std::int64_t t = 0; t < 8; ++t) {
    std::vector<float> xp(12);
    for (int j = 0; j < 10; ++j) xp[static_cast<std::size_t>(j)] = k.view().at(0, 0, t, perm[static_cast<std::size_t>(j)]);
    xp[10] = xp[11] = xp[9];  // padding repeats the last permuted value
    for (int grp = 0; grp < 3; ++grp) {
      std::vector<float> gx(xp.begin() + grp * 4, xp.begin() + grp * 4 + 4);
      const auto r = quantize(gx, 4, default_clip_grid());
      for (int s = 0; s < 4 && grp * 4 + s < 10; ++s) {
        const int ch = perm[static_cast<std::size_t>(grp * 4 + s)];
        EXPECT_EQ(ko.at(0, 0, t, ch), ref::dequantize(r.codes[static_cast<std::size_t>(s)], r.lo, r.scale));
        EXPECT_LE(std::fabs(ko.at(0, 0, t, ch) - k.view().at(0, 0, t, ch)), r.scale * 0.5f * 1.0001f);
      }
    }
  }
}

TEST(Quantizer, ConstantGroupIsExact) {
  for (MetaType meta : {MetaType::fp32, MetaType::fp16, MetaType::fp8_e4m3}) {
    for (float c : {0.0f, 1.5f, -3.25f, 0.125f}) {
      const auto r = quantize(std::vector<float>(16, c), 2, default_clip_grid(), meta);
      for (auto code : r.codes) EXPECT_EQ(ref::dequantize(code, r.lo, r.scale), c);
    }
  }
}

TEST(Meta, Fp16RoundingMatchesConversion) {
  Normal rng(106);
  for (int i = 0; i < 100000; ++i) {
    const float x = rng() * std::ldexp(1.0f, static_cast<int>(rng.next() % 40) - 25);
    const float want = std::min(std::fabs(f16_to_f32(f32_to_f16(x))), ref::kMaxF16);
    EXPECT_EQ(std::fabs(ref::meta_round_lo(x, MetaType::fp16)), want) << x;
  }
}

TEST(Meta, Fp16ConversionExhaustive) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h);
  }
  // ties to even: 1 + 2^-11 lies between 1 and 1 + 2^-10
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), f32_to_f16(1.0f));
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), f32_to_f16(1.0f + 0x1p-9f));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
}

TEST(Meta, Bf16ConversionRoundsToEven) {
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), f32_to_bf16(1.0f));
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), f32_to_bf16(1.0f + 0x1p-6f));
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_f32(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), b);
  }
}

TEST(Meta, E4m3EveryFiniteCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    const float f = ref::e4m3_decode(static_cast<std::uint8_t>(b));
    if (b == 0x80) continue;  // -0 encodes as -0
    EXPECT_EQ(ref::meta_round_lo(f, MetaType::fp8_e4m3), f);
    EXPECT_EQ(ref::e4m3_encode(f), b) << f;
  }
  EXPECT_EQ(ref::e4m3_decode(0x7e), 448.0f);
  EXPECT_EQ(ref::meta_round_lo(1e6f, MetaType::fp8_e4m3), 448.0f);
  EXPECT_EQ(ref::meta_round_scale(1e-12f, MetaType::fp8_e4m3), 0x1p-9f);
  EXPECT_EQ(ref::meta_round_lo(1.0f + 1.0f / 16, MetaType::fp8_e4m3), 1.0f);  // tie to even
  EXPECT_EQ(ref::meta_round_lo(1.0f + 3.0f / 16, MetaType::fp8_e4m3), 1.25f);
}

TEST(Meta, ReducedPrecisionNeverNonFinite) {
  // Extreme but accepted groups: the widest fp16 ranges at 1 bit, tiny ranges, constants.
  const std::vector<std::vector<float>> groups = {
      {-65504.0f, 65504.0f, 0.0f, 1.0f},
      {65504.0f, 65504.0f, 65504.0f, 65000.0f},
      {1e-7f, 1.00001e-7f, 1e-7f, 1e-7f},
      {0.0f, 1e-30f, -1e-30f, 0.0f},
      {-448.0f, 448.0f, 3.0f, -2.0f},
  };
  for (MetaType meta : {MetaType::fp16, MetaType::fp8_e4m3, MetaType::fp32}) {
    for (int bits : {1, 2, 8}) {
      for (const auto& g : groups) {
        const auto r = quantize(g, bits, default_clip_grid(), meta);
        ASSERT_TRUE(std::isfinite(r.lo) && std::isfinite(r.scale) && r.scale > 0);
        for (auto code : r.codes) ASSERT_TRUE(std::isfinite(ref::dequantize(code, r.lo, r.scale)));
      }
    }
  }
}

TEST(Pack, RoundTripAllWidthsWithGuardBytes) {
  Normal rng(107);
  for (int bits = 1; bits <= 8; ++bits) {
    for (std::int64_t n : {1, 3, 7, 8, 63, 67, 128}) {
      std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
      for (auto& c : codes) c = static_cast<std::uint8_t>(rng.next() & ((1u << bits) - 1));
      const std::int64_t nb = ref::packed_bytes(n, bits);
      std::vector<std::uint8_t> stream(static_cast<std::size_t>(nb) + 4, 0);
      for (int gidx = 0; gidx < 4; ++gidx) stream[static_cast<std::size_t>(nb + gidx)] = 0;
      ref::pack_codes(codes.data(), n, bits, stream.data());
      for (int gidx = 0; gidx < 4; ++gidx) EXPECT_EQ(stream[static_cast<std::size_t>(nb + gidx)], 0);
      std::vector<std::uint8_t> back(static_cast<std::size_t>(n));
      ref::unpack_codes(stream.data(), nb, 0, n, bits, back.data());
      EXPECT_EQ(back, codes) << "bits " << bits << " n " << n;
      if (n > 2) {  // a sub-range
        std::vector<std::uint8_t> part(static_cast<std::size_t>(n - 2));
        ref::unpack_codes(stream.data(), nb, 1, n - 2, bits, part.data());
        EXPECT_TRUE(std::equal(part.begin(), part.end(), codes.begin() + 1));
      }
    }
  }
}

TEST(Pack, DocumentedBitOrder) {
  const std::uint8_t c2[4] = {1, 2, 3, 0};
  std::uint8_t s2[1] = {0};
  ref::pack_codes(c2, 4, 2, s2);
  EXPECT_EQ(s2[0], 1 | 2 << 2 | 3 << 4);
  const std::uint8_t c3[3] = {5, 6, 7};
  std::uint8_t s3[2] = {0, 0};
  ref::pack_codes(c3, 3, 3, s3);
  EXPECT_EQ(s3[0], (5 | 6 << 3 | (7 & 3) << 6) & 0xff);
  EXPECT_EQ(s3[1], 7 >> 2);
}

}  // namespace
}  // namespace skvq::test
