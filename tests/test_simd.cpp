// The Highway SIMD quantizer against the scalar reference, on every SIMD
// target this CPU supports: codes, lo and scale must be identical; and the
// SIMD dequantizer (fetch_into, the dense view) bit for bit with the
// reference reconstruction.
#include <gtest/gtest.h>

#include <bit>
#include <random>

#include "cpu/convert_simd.hpp"
#include "cpu/quantize_simd.hpp"
#include "ref/dequantize.hpp"
#include "ref/pack.hpp"
#include "ref/quantize.hpp"
#include "test_util.hpp"

namespace skvq::test {
namespace {

// signed_zeros: rows of +0 and -0 (a group of zeros alone takes its first
// slot's sign in lo), every third row with a few nonzero slots.
enum class Data { normal, outliers, ties, constant_rows, tiny_range, signed_zeros };
constexpr int kDataKinds = 6;

std::vector<float> make_rows(std::int64_t n, int D, int P, Data kind, std::uint32_t seed) {
  Normal rng(seed);
  std::vector<float> x(static_cast<std::size_t>(n * P));
  for (std::int64_t r = 0; r < n; ++r) {
    float* row = x.data() + r * P;
    for (int j = 0; j < D; ++j) {
      float v = rng();
      switch (kind) {
        case Data::normal: break;
        case Data::outliers: v *= (rng.next() % 16 == 0) ? 20.0f : 1.0f; break;
        case Data::ties: v = static_cast<float>(rng.next() % 8) * 0.5f; break;  // many exact half-steps
        case Data::constant_rows: v = static_cast<float>(r % 5) - 2.0f; break;
        case Data::tiny_range: v = 1.0f + v * 1e-7f; break;
        case Data::signed_zeros: v = (r % 3 == 0 && rng.next() % 8 == 0) ? v : (rng.next() % 2 ? -0.0f : 0.0f); break;
      }
      row[j] = v;
    }
    for (int j = D; j < P; ++j) row[j] = row[D - 1];
  }
  return x;
}

struct Out {
  std::vector<std::uint8_t> codes;
  std::vector<float> lo, scale;
};

Out run(bool simd, const std::vector<float>& x, std::int64_t n, int P, int g, int bits, MetaType meta,
        const std::vector<float>& grid) {
  Out o;
  o.codes.assign(static_cast<std::size_t>(n * P), 0xAA);
  o.lo.assign(static_cast<std::size_t>(n * (P / g)), -1.0f);
  o.scale.assign(o.lo.size(), -1.0f);
  QuantParams p;
  p.x = x.data();
  p.n_rows = n;
  p.padded_dim = P;
  p.group_size = g;
  p.bits = bits;
  p.grid = grid.data();
  p.n_grid = static_cast<int>(grid.size());
  p.meta = meta;
  p.codes = o.codes.data();
  p.lo = o.lo.data();
  p.scale = o.scale.data();
  if (simd) cpu::quantize_rows(p);
  else ref::quantize_rows(p);
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class SimdTarget : public ::testing::TestWithParam<std::int64_t> {
 protected:
  void SetUp() override { cpu::force_target(GetParam()); }
  void TearDown() override { cpu::force_target(0); }
};

TEST_P(SimdTarget, MatchesReferenceOnAwkwardShapes) {
  std::uint32_t seed = 1;
  int cases = 0;
  for (int D : {8, 10, 64, 96, 128, 256}) {
    for (int g : {4, 7, 16, 32, 128, 256}) {
      const int G = (D + g - 1) / g, P = G * g;
      for (int bits = 1; bits <= 8; ++bits) {
        const MetaType meta = static_cast<MetaType>(bits % 3);
        const std::int64_t n = std::vector<std::int64_t>{1, 7, 15, 16, 17, 33}[static_cast<std::size_t>(bits % 6)];
        const Data kind = static_cast<Data>((seed++) % kDataKinds);
        const auto x = make_rows(n, D, P, kind, seed);
        const auto grid = bits % 2 ? default_clip_grid() : std::vector<float>{0.9f};
        const Out a = run(false, x, n, P, g, bits, meta, grid);
        const Out b = run(true, x, n, P, g, bits, meta, grid);
        ASSERT_EQ(a.codes, b.codes) << "D=" << D << " g=" << g << " bits=" << bits << " n=" << n;
        ASSERT_TRUE(same_bits(a.lo, b.lo)) << "D=" << D << " g=" << g << " bits=" << bits;
        ASSERT_TRUE(same_bits(a.scale, b.scale)) << "D=" << D << " g=" << g << " bits=" << bits;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 6 * 6 * 8);
}

// The flush's packing: every code width, code counts around the vector
// lengths, streams starting on and off whole bytes, bytes already holding
// earlier codes; each must leave the stream exactly as the reference does.
TEST_P(SimdTarget, PackCodesMatchesReference) {
  std::mt19937 rng(GetParam() % 1000 + 5);
  int cases = 0;
  for (int bits = 1; bits <= 8; ++bits)
    for (std::int64_t n : {1, 3, 15, 16, 31, 63, 64, 65, 127, 128, 129, 200, 256, 1000})
      for (std::int64_t first : {0, 1, 3, 8, 64, 128}) {
        std::vector<std::uint8_t> codes(static_cast<std::size_t>(n));
        for (auto& c : codes) c = static_cast<std::uint8_t>(rng() & ((1u << bits) - 1));
        const std::int64_t bytes = ref::packed_bytes(first + n, bits) + 8;
        // earlier codes in the bytes before `first` (the bytes it covers are zero, the contract)
        std::vector<std::uint8_t> a(static_cast<std::size_t>(bytes), 0), b;
        std::vector<std::uint8_t> before(static_cast<std::size_t>(first));
        for (auto& c : before) c = static_cast<std::uint8_t>(rng() & ((1u << bits) - 1));
        ref::pack_codes(before.data(), first, bits, a.data(), 0);
        b = a;
        ref::pack_codes(codes.data(), n, bits, a.data(), first);
        cpu::pack_codes(codes.data(), n, bits, b.data(), first);
        ASSERT_EQ(a, b) << "bits " << bits << " n " << n << " first " << first;
        ++cases;
      }
  EXPECT_EQ(cases, 8 * 14 * 6);
}

// Grids of other sizes than the spec's five and the single factor (the
// kernel scores five side by side and any other count one at a time),
// with repeated factors (exact ties: the earlier wins) and unsorted ones.
TEST_P(SimdTarget, AnyGridSizeMatchesReference) {
  std::uint32_t seed = 77;
  const std::vector<std::vector<float>> grids = {
      {1.0f, 0.8f}, {0.9f, 0.9f, 1.0f}, {0.85f, 1.0f, 0.94f, 0.97f, 0.90f, 0.85f, 0.7f}, {1.0f, 0.97f, 0.94f, 0.90f, 0.85f, 0.8f}};
  for (const auto& grid : grids)
    for (int D : {10, 64, 128})
      for (int g : {7, 16, 32}) {
        const int G = (D + g - 1) / g, P = G * g;
        for (int bits : {1, 2, 4, 8}) {
          const MetaType meta = static_cast<MetaType>(bits % 3);
          const Data kind = static_cast<Data>((seed++) % kDataKinds);
          const auto x = make_rows(17, D, P, kind, seed);
          const Out a = run(false, x, 17, P, g, bits, meta, grid);
          const Out b = run(true, x, 17, P, g, bits, meta, grid);
          ASSERT_EQ(a.codes, b.codes) << "grid " << grid.size() << " D=" << D << " g=" << g << " bits=" << bits;
          ASSERT_TRUE(same_bits(a.lo, b.lo)) << "grid " << grid.size() << " D=" << D << " g=" << g << " bits=" << bits;
          ASSERT_TRUE(same_bits(a.scale, b.scale)) << "grid " << grid.size() << " D=" << D << " g=" << g;
        }
      }
}

TEST_P(SimdTarget, EveryMetaAndDataKind) {
  for (MetaType meta : {MetaType::fp16, MetaType::fp32, MetaType::fp8_e4m3}) {
    for (int k = 0; k < kDataKinds; ++k) {
      for (int bits : {1, 2, 3, 4, 8}) {
        const auto x = make_rows(67, 128, 128, static_cast<Data>(k), 77u + static_cast<std::uint32_t>(k));
        const Out a = run(false, x, 67, 128, 32, bits, meta, default_clip_grid());
        const Out b = run(true, x, 67, 128, 32, bits, meta, default_clip_grid());
        ASSERT_EQ(a.codes, b.codes) << "meta " << static_cast<int>(meta) << " kind " << k << " bits " << bits;
        ASSERT_TRUE(same_bits(a.lo, b.lo));
        ASSERT_TRUE(same_bits(a.scale, b.scale));
      }
    }
  }
}

// Rows of random codes and metadata (magnitudes from 1e-3 to 1e3, so that a
// fused multiply-add would round differently from the spec's product-then-sum
// in many of them), with and without a permutation, at every code width,
// rows on and off byte boundaries, ragged groups, every metadata type.
TEST_P(SimdTarget, DequantizeRowsMatchesReferenceBitForBit) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> mag(-3.0f, 3.0f);
  int cases = 0;
  for (int D : {8, 10, 16, 64, 96, 128, 256})
    for (int bits : {1, 2, 3, 4, 5, 8})
      for (int g : {4, 7, 32, 128}) {
        if (g > D) continue;
        const MetaType meta = static_cast<MetaType>((bits + D + g) % 3);
        const int mb = meta_bytes(meta), G = (D + g - 1) / g;
        const std::int64_t row0 = rng() % 5, n = 1 + rng() % 40, rows = row0 + n, mrow = G * mb;
        const std::int64_t bytes = (rows * D * bits + 7) / 8;
        std::vector<std::uint8_t> stream(static_cast<std::size_t>(bytes)), lo(static_cast<std::size_t>(rows * mrow)),
            sc(lo.size());
        for (auto& b : stream) b = static_cast<std::uint8_t>(rng());
        for (std::int64_t e = 0; e < rows * G; ++e) {
          const float l = (rng() % 2 ? 1.0f : -1.0f) * std::pow(10.0f, mag(rng)), s = std::pow(10.0f, mag(rng)) / 7.0f;
          ref::meta_store(lo.data() + e * mb, meta, l);
          ref::meta_store(sc.data() + e * mb, meta, s);
        }
        std::vector<std::int32_t> perm(static_cast<std::size_t>(D));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        const std::int32_t* pp = cases % 2 ? perm.data() : nullptr;
        std::vector<float> want(static_cast<std::size_t>(n * D)), got(want.size(), -7.0f);
        for (std::int64_t i = 0; i < n; ++i) {
          ref::dequantize_row(stream.data(), bytes, row0 + i, D, bits, g, meta, lo.data() + (row0 + i) * mrow,
                              sc.data() + (row0 + i) * mrow, pp, want.data() + i * D);
        }
        cpu::dequantize_rows(stream.data(), bytes, row0, n, D, bits, g, meta, lo.data() + row0 * mrow,
                             sc.data() + row0 * mrow, mrow, pp, got.data());
        ASSERT_TRUE(same_bits(want, got)) << "D=" << D << " bits=" << bits << " g=" << g << " n=" << n;
        ++cases;
      }
  EXPECT_GT(cases, 100);
}

// The SIMD fp16 store byte for byte with the scalar one: ordinary values,
// ties, subnormals, values that round to zero or overflow to inf, inf, NaN.
TEST_P(SimdTarget, StoreRowMatchesScalar) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mag(-30.0f, 18.0f);
  std::vector<float> x(1037);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = std::exp2(mag(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    switch (i % 8) {
      case 0: x[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) & 0xFFFFE000u) + 0.0f; break;  // exact
      case 1: x[i] = std::bit_cast<float>((std::bit_cast<std::uint32_t>(v) & 0xFFFFE000u) | 0x1000u); break;  // tie
      case 2: x[i] = i % 16 == 2 ? INFINITY : -INFINITY; break;
      case 3: x[i] = i % 16 == 3 ? NAN : 70000.0f; break;
      default: x[i] = v;
    }
  }
  for (DType t : {DType::f16, DType::bf16, DType::f32}) {
    for (std::int64_t n : {1, 7, 8, 9, 16, 31, 1037}) {
      const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(t);
      std::vector<std::byte> a(bytes), b(bytes);
      skvq::store_row_f32(a.data(), t, n, x.data());
      cpu::store_row_f32(b.data(), t, n, x.data());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), bytes), 0) << "dtype " << static_cast<int>(t) << " n " << n;
    }
  }
}

// The streaming copy is a memcpy: every length and both alignments of source and destination
// (the unaligned head, whole vectors, the tail), and it writes nothing outside [dst, dst + bytes).
TEST_P(SimdTarget, StreamCopyCopiesExactlyTheBytes) {
  std::vector<std::byte> src(1200), dst(1400);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 37 + 11) & 0xff);
  for (std::size_t bytes : {0, 1, 15, 16, 63, 64, 65, 127, 128, 200, 1000})
    for (std::size_t so : {0, 1, 8})
      for (std::size_t d0 : {0, 1, 3, 32, 64}) {
        std::fill(dst.begin(), dst.end(), std::byte{0x5a});
        // a 64-byte aligned base inside dst, then the offset
        const auto base = (64 - reinterpret_cast<std::uintptr_t>(dst.data() + 64) % 64) % 64 + 64;
        std::byte* out = dst.data() + base + d0;
        cpu::stream_copy(out, src.data() + so, bytes);
        ASSERT_EQ(std::memcmp(out, src.data() + so, bytes), 0) << bytes << " " << so << " " << d0;
        for (std::byte* p = dst.data(); p < dst.data() + dst.size(); ++p) {
          if (p < out || p >= out + bytes) {
            ASSERT_EQ(*p, std::byte{0x5a}) << "byte " << (p - out) << " of " << bytes;
          }
        }
      }
}

std::vector<std::int64_t> targets() { return cpu::available_targets(); }

INSTANTIATE_TEST_SUITE_P(AllTargets, SimdTarget, ::testing::ValuesIn(targets()),
                         [](const ::testing::TestParamInfo<std::int64_t>& info) {
                           return cpu::target_name(info.param);
                         });

TEST(SimdCache, SimdAndReferenceFlushGiveIdenticalState) {
  for (MetaType meta : {MetaType::fp16, MetaType::fp32, MetaType::fp8_e4m3}) {
    Config cfg = spec_config();
    cfg.metadata = meta;
    cfg.group_size = 12;  // ragged: 64 = 5 * 12 + 4
    SkvqCache a(cfg), b(cfg);
    b.set_kernel(Kernel::reference);
    Tensor k = randn({2, 3, 70, 64}, 200, DType::f16, true), v = randn({2, 3, 70, 64}, 201, DType::f16, true);
    a.update_and_fetch(k.view(), v.view());
    b.update_and_fetch(k.view(), v.view());
    EXPECT_TRUE(a.same_state(b));
  }
}

}  // namespace
}  // namespace skvq::test
