// attend() over the packed store: the SIMD kernel against the scalar
// reference, and both against dense attention over what update_and_fetch
// returns, with the tolerances derived in docs/numerics.md.
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <cstring>

#include "cpu/quantize_simd.hpp"
#include "ref/attention.hpp"
#include "test_util.hpp"

namespace skvq::test {
namespace {

constexpr double kU32 = 0x1p-24;

double unit_roundoff(DType t) { return t == DType::f16 ? 0x1p-11 : t == DType::bf16 ? 0x1p-8 : kU32; }

struct Case {
  std::int64_t B, H, G, Sq, kv_len, D, Dv;
  int window, n_sink, group, bk, bv;
  MetaType meta;
  DType dtype;
};

// const_values: every value 0.75, so every packed value group is constant
// (its scale the spec's floor 1e-8, 0 once rounded to fp16 or e4m3) and the
// value sums come from the metadata's lo.
void run_case(const Case& c, std::uint32_t seed, bool const_values = false) {
  Config cfg;
  cfg.head_dim = static_cast<int>(c.D);
  cfg.window = c.window;
  cfg.n_sink = c.n_sink;
  cfg.group_size = c.group;
  cfg.bits_key = c.bk;
  cfg.bits_value = c.bv;
  cfg.metadata = c.meta;
  SkvqCache cache(cfg);
  Tensor k = randn({c.B, c.H, c.kv_len, c.D}, seed, c.dtype, true);
  Tensor v = randn({c.B, c.H, c.kv_len, c.Dv}, seed + 1, c.dtype, true);
  if (const_values) {
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.H; ++h)
        for (std::int64_t t = 0; t < c.kv_len; ++t)
          for (std::int64_t d = 0; d < c.Dv; ++d) v.view().set(b, h, t, d, 0.75f);
  }
  Tensor q = randn({c.B, c.H * c.G, c.Sq, c.D}, seed + 2, DType::f32);
  // Feed in two calls: the history, then the Sq rows the queries belong to.
  if (c.kv_len > c.Sq) {
    cache.update_and_fetch(k.view().slice_tokens(0, c.kv_len - c.Sq), v.view().slice_tokens(0, c.kv_len - c.Sq));
  }
  auto [kd, vd] = cache.update_and_fetch(k.view().slice_tokens(c.kv_len - c.Sq, c.Sq), v.view().slice_tokens(c.kv_len - c.Sq, c.Sq));
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  Tensor dense(DType::f32, {c.B, c.H * c.G, c.Sq, c.Dv});
  ref::dense_attention(q.view(), kd, vd, scale, dense.view());
  const Tensor simd = attend(cache, q.view(), scale);
  const Tensor refo = attend(cache, q.view(), scale, AttendOptions{Kernel::reference, 1});
  const Tensor one_thread = attend(cache, q.view(), scale, AttendOptions{Kernel::simd, 1});
  const double u = unit_roundoff(c.dtype);
  RowBounds bounds(cache, q.view(), kd, vd, scale, c.G);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t hq = 0; hq < c.H * c.G; ++hq)
      for (std::int64_t i = 0; i < c.Sq; ++i) {
        const RowScale rs = bounds.row_scale(b, hq, i);
        // float32 kernels vs each other: dot and sum rounding, a few ulp of exp;
        // the fused path's terms are as large as ak / av, and its 16-bit q moves scores by qk.
        const PackedBound pb = bounds.packed_bound(b, hq, i);
        const double vb = std::max(rs.vmax, pb.av);
        // Scores: dot products of D terms (both kernels); weighted sums: T terms.
        const double ds = static_cast<double>(c.D + 16) * kU32 * (2 * rs.s_abs + pb.ak) + pb.qk;
        const double tol_impl =
            ((std::exp(2 * ds) - 1) + 2 * static_cast<double>(c.kv_len + 16) * kU32 + 8 * kU32) * vb + pb.vq;
        // attend reads float32 reconstructions; the dense tensors hold them rounded to the dtype.
        const double eps = u * rs.s_abs;
        const double tol_dense = ((std::exp(2 * eps) - 1) + u) * rs.vmax * 1.01 + tol_impl;
        for (std::int64_t d = 0; d < c.Dv; ++d) {
          const double r = refo.view().at(b, hq, i, d), s = simd.view().at(b, hq, i, d);
          ASSERT_NEAR(s, r, tol_impl) << "simd vs ref at [" << b << "," << hq << "," << i << "," << d << "]";
          ASSERT_NEAR(one_thread.view().at(b, hq, i, d), r, tol_impl);
          ASSERT_NEAR(r, dense.view().at(b, hq, i, d), tol_dense) << "ref vs dense at [" << b << "," << hq << "," << i << "," << d << "]";
        }
      }
}

TEST(Attend, MatchesDenseAttentionOverReturnedTensors) {
  const Case cases[] = {
      // B, H, G, Sq, kv_len, D, Dv, window, sinks, group, bk, bv, meta, dtype
      {1, 2, 1, 1, 1, 64, 64, 16, 4, 16, 2, 2, MetaType::fp16, DType::f16},       // one token
      {1, 2, 1, 1, 10, 64, 64, 16, 4, 16, 2, 2, MetaType::fp16, DType::f16},      // all in tail
      {1, 2, 4, 1, 16, 64, 64, 16, 15, 16, 2, 2, MetaType::fp16, DType::f16},     // sinks + 1 packed row
      {2, 2, 4, 1, 300, 128, 128, 32, 5, 32, 2, 2, MetaType::fp16, DType::f16},   // GQA 4
      {1, 1, 8, 3, 200, 64, 48, 16, 4, 16, 4, 4, MetaType::fp32, DType::f32},     // GQA 8, Sq 3, Dv != D
      {1, 3, 1, 7, 129, 96, 96, 32, 5, 32, 4, 2, MetaType::fp8_e4m3, DType::bf16},  // prefill, e4m3
      {2, 1, 2, 1, 97, 10, 10, 8, 2, 4, 3, 5, MetaType::fp16, DType::f16},        // ragged, generic bits
      {1, 2, 1, 16, 64, 64, 64, 16, 0, 64, 8, 1, MetaType::fp32, DType::f16},     // Sq == window, no sinks
      {1, 2, 2, 1, 2048, 128, 128, 128, 5, 128, 2, 2, MetaType::fp16, DType::f16},  // many splits
      {1, 1, 1, 5, 5, 32, 32, 8, 2, 8, 2, 2, MetaType::fp16, DType::f16},         // Sq == kv_len
  };
  std::uint32_t seed = 10;
  for (const auto& c : cases) {
    SCOPED_TRACE("kv_len " + std::to_string(c.kv_len) + " D " + std::to_string(c.D) + " G " + std::to_string(c.G));
    run_case(c, seed += 10);
  }
}

// Random shapes inside the fused paths' layouts (1/2/4/8 bits, D and groups
// of whole 32-bit words): VNNI keys and values, partial quads and blocks,
// grouped-query rows, causal prefill, every metadata mode and dtype.
void random_fused_layouts(std::uint32_t seed, int trials) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    Case c;
    c.B = 1 + rng() % 2;
    c.H = 1 + rng() % 2;
    c.G = std::vector<std::int64_t>{1, 2, 4}[rng() % 3];
    c.window = std::vector<int>{16, 32, 64, 128}[rng() % 4];
    c.kv_len = 1 + rng() % (3 * c.window + 70);
    c.Sq = 1 + rng() % std::min<std::int64_t>(c.kv_len, 4);
    c.D = std::vector<std::int64_t>{16, 32, 64, 128, 256}[rng() % 5];
    c.Dv = rng() % 4 ? c.D : 64;
    c.n_sink = static_cast<int>(rng() % c.window);
    c.group = std::vector<int>{16, 32, 64, 128}[rng() % 4];
    c.bk = std::vector<int>{1, 2, 4, 8}[rng() % 4];
    c.bv = std::vector<int>{1, 2, 4, 8}[rng() % 4];
    c.meta = static_cast<MetaType>(rng() % 3);
    c.dtype = static_cast<DType>(rng() % 3);
    SCOPED_TRACE("trial " + std::to_string(trial));
    run_case(c, seed + 5000 + static_cast<std::uint32_t>(trial) * 7);
  }
}

TEST(Attend, RandomFusedLayouts) { random_fused_layouts(1234, 100); }

// The packed store walked one KV head at a time (SKVQ_CPU_WALK=head, the
// benchmarks' comparison; by default a task walks a group of heads).
TEST(Attend, RandomFusedLayoutsHeadByHead) {
  struct Env {
    Env() { setenv("SKVQ_CPU_WALK", "head", 1); }
    ~Env() { unsetenv("SKVQ_CPU_WALK"); }
  } env;
  random_fused_layouts(4321, 30);
}

// Blocks of constant value groups (the smallest scales the metadata holds):
// the value sums come from p * lo alone.
TEST(Attend, ConstantValueGroups) {
  const Case cases[] = {
      // B, H, G, Sq, kv_len, D, Dv, window, sinks, group, bk, bv, meta, dtype
      {1, 2, 1, 1, 700, 128, 128, 128, 5, 32, 2, 2, MetaType::fp16, DType::f16},
      {1, 1, 4, 2, 300, 128, 128, 64, 3, 128, 4, 4, MetaType::fp32, DType::f32},
      {1, 1, 1, 1, 200, 64, 64, 32, 2, 16, 2, 1, MetaType::fp8_e4m3, DType::f16},
  };
  std::uint32_t seed = 400;
  for (const auto& c : cases) {
    SCOPED_TRACE("kv_len " + std::to_string(c.kv_len) + " group " + std::to_string(c.group));
    run_case(c, seed += 10, true);
  }
}

TEST(Attend, RandomShapes) {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 30; ++trial) {
    Case c;
    c.B = 1 + rng() % 2;
    c.H = 1 + rng() % 3;
    c.G = std::vector<std::int64_t>{1, 4, 8}[rng() % 3];
    c.window = 2 + static_cast<int>(rng() % 40);
    c.kv_len = 1 + rng() % (4 * c.window + 3);
    c.Sq = 1 + rng() % std::min<std::int64_t>(c.kv_len, 6);
    c.D = std::vector<std::int64_t>{8, 10, 64, 128}[rng() % 4];
    c.Dv = rng() % 3 ? c.D : 24;
    c.n_sink = static_cast<int>(rng() % c.window);
    c.group = std::vector<int>{4, 7, 16, 32, 128}[rng() % 5];
    c.bk = 1 + static_cast<int>(rng() % 8);
    c.bv = 1 + static_cast<int>(rng() % 8);
    c.meta = static_cast<MetaType>(rng() % 3);
    c.dtype = static_cast<DType>(rng() % 3);
    SCOPED_TRACE("trial " + std::to_string(trial));
    run_case(c, 1000 + static_cast<std::uint32_t>(trial) * 7);
  }
}

TEST(Attend, PlainCacheAndDenseEntryPoint) {
  PlainCache c;
  Tensor k = randn({1, 2, 50, 32}, 5), v = randn({1, 2, 50, 32}, 6), q = randn({1, 8, 2, 32}, 7, DType::f32);
  c.update_and_fetch(k.view(), v.view());
  const Tensor a = attend(c, q.view(), 0.2f);
  Tensor b(DType::f32, {1, 8, 2, 32}), r(DType::f32, {1, 8, 2, 32});
  attend_dense(q.view(), k.view(), v.view(), 0.2f, b.view());
  ref::dense_attention(q.view(), k.view(), v.view(), 0.2f, r.view());
  for (std::int64_t h = 0; h < 8; ++h)
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t d = 0; d < 32; ++d) {
        EXPECT_EQ(a.view().at(0, h, i, d), b.view().at(0, h, i, d));
        EXPECT_NEAR(b.view().at(0, h, i, d), r.view().at(0, h, i, d), 1e-4);
      }
}

// attend() writes any dtype and strides of `out`: every element is the float32
// result of the contiguous float32 output, rounded once to the dtype, and the
// elements between strided ones are left alone. Shapes with a permutation
// (values reorder), grouped-query rows, several splits, and a prefill (Sq 3).
TEST(Attend, OutputInAnyDtypeAndStridesIsTheFloatResultRounded) {
  for (const std::int64_t sq : {1, 3}) {
    Config cfg;
    cfg.head_dim = 64;
    cfg.window = 16;
    cfg.n_sink = 2;
    cfg.group_size = 16;
    SkvqCache c(cfg);
    Tensor k = randn({1, 2, 300, 64}, 21, DType::f16, true), v = randn({1, 2, 300, 64}, 22, DType::f16, true);
    c.update_and_fetch(k.view(), v.view());
    const Tensor q = randn({1, 8, sq, 64}, 23, DType::f32);
    const AttendOptions two_threads{Kernel::simd, 2};
    Tensor want(DType::f32, {1, 8, sq, 64});
    attend(c, q.view(), 0.125f, want.view(), two_threads);
    for (const DType dt : {DType::f16, DType::bf16}) {
      Tensor o(dt, {1, 8, sq, 64});
      attend(c, q.view(), 0.125f, o.view(), two_threads);
      const Tensor rounded = Tensor::copy_of(want.view(), dt);
      ASSERT_EQ(std::memcmp(o.data(), rounded.data(), o.nbytes()), 0) << dtype_name(dt) << " Sq=" << sq;
    }
    // float32 every other element of a wider buffer, filled with a marker
    Tensor wide(DType::f32, {1, 8, sq, 128});
    for (std::int64_t h = 0; h < 8; ++h)
      for (std::int64_t i = 0; i < sq; ++i)
        for (std::int64_t d = 0; d < 128; ++d) wide.view().set(0, h, i, d, -7.0f);
    TensorView strided = wide.view();
    strided.shape[3] = 64;
    strided.strides[3] = 2;
    attend(c, q.view(), 0.125f, strided, two_threads);
    for (std::int64_t h = 0; h < 8; ++h)
      for (std::int64_t i = 0; i < sq; ++i)
        for (std::int64_t d = 0; d < 64; ++d) {
          ASSERT_EQ(wide.view().at(0, h, i, 2 * d), want.view().at(0, h, i, d)) << h << "," << i << "," << d;
          ASSERT_EQ(wide.view().at(0, h, i, 2 * d + 1), -7.0f);
        }
  }
}

TEST(Attend, BadArgumentsNameTheProblem) {
  Config cfg = spec_config();
  SkvqCache c(cfg);
  Tensor q = randn({1, 4, 1, 64}, 8, DType::f32);
  EXPECT_THROW(attend(c, q.view(), 0.1f), Error);  // empty cache
  Tensor k = randn({1, 2, 20, 64}, 9), v = randn({1, 2, 20, 64}, 10);
  c.update_and_fetch(k.view(), v.view());
  const SkvqCache before = c;
  auto expect = [&](const TensorView& qq, const char* needle) {
    try {
      attend(c, qq, 0.1f);
      ADD_FAILURE() << "accepted, expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect(randn({1, 3, 1, 64}, 1, DType::f32).view(), "Hq=3");
  expect(randn({2, 4, 1, 64}, 1, DType::f32).view(), "B=2");
  expect(randn({1, 4, 1, 32}, 1, DType::f32).view(), "D=32");
  expect(randn({1, 4, 21, 64}, 1, DType::f32).view(), "Sq=21");
  Tensor out(DType::f32, {1, 4, 1, 63});
  EXPECT_THROW(attend(c, q.view(), 0.1f, out.view()), Error);
  EXPECT_THROW(attend(c, q.view(), NAN), Error);
  EXPECT_TRUE(c.same_state(before));
}

}  // namespace
}  // namespace skvq::test

namespace skvq::test {
namespace {

// The SIMD kernel on every target this CPU supports (decode paths differ by lane count).
class AttendTarget : public ::testing::TestWithParam<std::int64_t> {
 protected:
  void SetUp() override { cpu::force_target(GetParam()); }
  void TearDown() override { cpu::force_target(0); }
};

TEST_P(AttendTarget, MatchesReference) {
  const Case cases[] = {
      {1, 2, 4, 1, 300, 128, 128, 32, 5, 32, 2, 2, MetaType::fp16, DType::f16},
      {1, 2, 1, 3, 150, 64, 64, 16, 4, 16, 4, 8, MetaType::fp32, DType::bf16},
      {1, 1, 2, 1, 100, 128, 128, 32, 3, 128, 1, 4, MetaType::fp8_e4m3, DType::f32},
      {1, 1, 1, 2, 90, 10, 12, 8, 2, 4, 3, 2, MetaType::fp16, DType::f16},
      // fused-path layouts: many blocks and chunks; 8-bit g4 (G > lanes, a row spans vectors);
      // g128 at 8 and 1 bits (a group spans vectors); Dv 32 at 2 bits (several rows a vector); D 256
      {1, 2, 4, 1, 700, 128, 128, 128, 5, 32, 2, 2, MetaType::fp16, DType::f16},
      {1, 1, 2, 5, 600, 128, 128, 64, 0, 4, 8, 8, MetaType::fp32, DType::f32},
      {1, 2, 1, 1, 400, 128, 128, 128, 5, 128, 8, 1, MetaType::fp16, DType::f16},
      {1, 1, 4, 3, 333, 64, 32, 32, 7, 32, 4, 2, MetaType::fp8_e4m3, DType::bf16},
      {2, 1, 1, 1, 260, 256, 256, 64, 5, 64, 4, 4, MetaType::fp16, DType::f16},
  };
  std::uint32_t seed = 500;
  for (const auto& c : cases) run_case(c, seed += 3);
}

// The random fused layouts on every target too: each target has its own
// integer paths (AVX3_DL: VNNI; AVX2: vpmaddubsw / vpmaddwd) or float form,
// with its own partial batches, pairs and quads of rows.
TEST_P(AttendTarget, RandomFusedLayouts) { random_fused_layouts(4321 + static_cast<std::uint32_t>(GetParam() % 997), 30); }

// A query row's output does not depend on the other query rows of its KV
// head (grouped-query rows, Sq rows of a prefill), whatever the kernel does
// with them together: every output row equals, bit for bit, the same query
// row attended on its own (a query tensor of one head per KV head: the same
// splits, one row a head). G = 1-8, Sq 1-3, every code width the integer
// paths take, groups from one word to a whole row, every metadata mode.
TEST_P(AttendTarget, GroupedRowsScoreAsEachRowAlone) {
  std::mt19937 rng(99 + static_cast<std::uint32_t>(GetParam() % 991));
  for (int trial = 0; trial < 24; ++trial) {
    Config cfg;
    const std::int64_t D = std::vector<std::int64_t>{32, 64, 128, 256}[rng() % 4];
    cfg.head_dim = static_cast<int>(D);
    cfg.window = std::vector<int>{16, 32, 128}[rng() % 3];
    cfg.n_sink = static_cast<int>(rng() % 6);
    cfg.group_size = std::vector<int>{16, 32, 64, 128}[rng() % 4];
    cfg.bits_key = std::vector<int>{1, 2, 4, 8}[rng() % 4];
    cfg.bits_value = std::vector<int>{1, 2, 4, 8}[rng() % 4];
    cfg.metadata = static_cast<MetaType>(rng() % 3);
    if (cfg.group_size > D) cfg.group_size = static_cast<int>(D);
    const std::int64_t B = 1 + rng() % 2, H = 1 + rng() % 2, G = 1 + rng() % 8, Sq = 1 + rng() % 3;
    const std::int64_t T = Sq + rng() % (4 * cfg.window + 50);
    SCOPED_TRACE("trial " + std::to_string(trial) + " G " + std::to_string(G) + " Sq " + std::to_string(Sq) + " D " +
                 std::to_string(D) + " bits " + std::to_string(cfg.bits_key) + " group " + std::to_string(cfg.group_size));
    SkvqCache cache(cfg);
    const std::uint32_t seed = 7000 + static_cast<std::uint32_t>(trial) * 5;
    cache.append(randn({B, H, T, D}, seed, DType::f16).view(), randn({B, H, T, D}, seed + 1, DType::f16).view());
    const Tensor q = randn({B, H * G, Sq, D}, seed + 2, DType::f32);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const AttendOptions one_thread{Kernel::simd, 1};
    const Tensor all = attend(cache, q.view(), scale, one_thread);
    for (std::int64_t r = 0; r < G; ++r) {
      Tensor qr(DType::f32, {B, H, Sq, D});
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < Sq; ++i)
            for (std::int64_t d = 0; d < D; ++d) qr.view().set(b, h, i, d, q.view().at(b, h * G + r, i, d));
      const Tensor alone = attend(cache, qr.view(), scale, one_thread);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < Sq; ++i)
            for (std::int64_t d = 0; d < D; ++d) {
              const float x = all.view().at(b, h * G + r, i, d), y = alone.view().at(b, h, i, d);
              ASSERT_EQ(std::bit_cast<std::uint32_t>(x), std::bit_cast<std::uint32_t>(y))
                  << "row " << r << " of " << G << " at [" << b << "," << h << "," << i << "," << d << "]: " << x
                  << " vs " << y;
            }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, AttendTarget, ::testing::ValuesIn(cpu::available_targets()),
                         [](const ::testing::TestParamInfo<std::int64_t>& info) {
                           return cpu::target_name(info.param);
                         });

}  // namespace
}  // namespace skvq::test
