// The GPU backend against the CPU reference: flush codes, metadata and
// permutations identical; attention within float32 tolerance. Skipped where
// there is no GPU (CI); the CUDA code still compiles there.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef SKVQ_TEST_CUDA_RUNTIME
#include <cuda_runtime.h>
#endif

#include "cuda/clip_proxy.hpp"
#include "cuda/fast_div.hpp"
#include "cuda/split_rule.hpp"
#include "cuda/selfcheck.hpp"
#include "cuda/tc_codes.hpp"
#include "cuda/widen.hpp"
#include "model/model.hpp"
#include "model/runner.hpp"
#include "ref/attention.hpp"
#include "ref/meta.hpp"
#include "ref/pack.hpp"
#include "skvq/cache_file.hpp"
#include "skvq/cuda.hpp"
#include "test_util.hpp"

namespace skvq::test {
namespace {

#define REQUIRE_GPU() \
  if (!cuda::available()) GTEST_SKIP() << cuda::device_description()

// Relative L2 bound against the float32 CPU reference: float32 kernels land
// near 1e-6; the opt-in tensor-core kernel (SKVQ_CUDA_MMA=1) rounds q and p
// to fp16 (unit roundoff 2^-11, as FlashAttention does), which moves outputs
// by about 1e-3 of their size on these random inputs.
double attention_tolerance() {
  const char* e = std::getenv("SKVQ_CUDA_MMA");
  return (e != nullptr && std::string(e) == "1") ? 5e-3 : 1e-5;
}

Config gpu_config(int window, int n_sink, int group, int bk, int bv, MetaType meta, bool reorder = true) {
  Config c;
  c.head_dim = 128;
  c.window = window;
  c.n_sink = n_sink;
  c.group_size = group;
  c.bits_key = bk;
  c.bits_value = bv;
  c.metadata = meta;
  c.reorder = reorder;
  c.dense_view = false;
  return c;
}

struct Case {
  Config cfg;
  std::int64_t B, H, S;
  std::vector<std::int64_t> calls;  // token counts per append
};

Config no_search(Config c, float alpha) {  // one clip factor: the flush kernel's single-factor path
  c.clip_search = false;
  c.clip_alpha = alpha;
  return c;
}

std::vector<Case> cases() {
  return {
      {no_search(gpu_config(128, 5, 128, 2, 2, MetaType::fp16), 0.92f), 1, 2, 300, {300}},
      {no_search(gpu_config(64, 3, 32, 4, 2, MetaType::fp8_e4m3), 1.0f), 2, 1, 150, {70, 80}},
      // more of the single-factor flush: windows not a multiple of 64 rows, many sinks, 8-bit codes
      // with fp32 metadata, groups of 16 and 64, 1-bit codes
      {no_search(gpu_config(80, 11, 16, 8, 4, MetaType::fp32), 0.85f), 2, 3, 250, {250}},
      {no_search(gpu_config(16, 2, 64, 4, 2, MetaType::fp16), 1.0f), 1, 2, 90, {5, 85}},
      {no_search(gpu_config(32, 4, 16, 1, 1, MetaType::fp8_e4m3), 0.97f), 1, 2, 100, {100}},
      {gpu_config(128, 5, 128, 2, 2, MetaType::fp16), 1, 4, 700, {700}},
      {gpu_config(128, 5, 32, 4, 4, MetaType::fp16), 2, 2, 300, {1, 130, 2, 167}},
      {gpu_config(16, 4, 32, 2, 2, MetaType::fp8_e4m3), 1, 3, 100, {10, 6, 16, 68}},
      {gpu_config(32, 0, 64, 8, 8, MetaType::fp32), 2, 1, 97, {97}},
      {gpu_config(64, 63, 128, 4, 2, MetaType::fp16, false), 1, 2, 200, {64, 136}},
      {gpu_config(16, 2, 16, 1, 1, MetaType::fp16), 1, 2, 50, {3, 47}},
      {gpu_config(128, 100, 32, 8, 4, MetaType::fp8_e4m3), 2, 2, 600, {300, 1, 299}},
      {gpu_config(64, 5, 16, 1, 1, MetaType::fp32), 1, 3, 333, {333}},
      // the integer tensor-core kernel's other group size and byte-wide codes (G 4, Sq 3 take it)
      {gpu_config(64, 2, 64, 4, 4, MetaType::fp32), 1, 2, 260, {260}},
      {gpu_config(128, 0, 128, 8, 8, MetaType::fp16), 1, 1, 300, {300}},
      // one metadata group a row (the one-token-per-lane dp4a kernel) with each metadata type and 1-bit codes
      {gpu_config(128, 5, 128, 2, 2, MetaType::fp8_e4m3), 1, 2, 400, {400}},
      {gpu_config(64, 3, 128, 4, 4, MetaType::fp32), 2, 1, 300, {150, 150}},
      {gpu_config(64, 2, 128, 1, 1, MetaType::fp16), 1, 1, 200, {200}},
      // a long exact tail (the combine kernel's exact tokens: hundreds a row) and group 64 for the dp4a kernels
      {gpu_config(512, 7, 128, 2, 2, MetaType::fp16), 1, 2, 1400, {1000, 400}},
      {gpu_config(128, 3, 64, 2, 2, MetaType::fp8_e4m3), 1, 2, 500, {500}},
      // four fp32 metadata groups a row (the token-major kernel's 16-byte metadata loads)
      {gpu_config(128, 5, 32, 4, 2, MetaType::fp32), 2, 2, 450, {300, 150}},
      // 3, 5, 6 and 7 bits (codes across 16-bit words; attention by the general kernel at its run-time
      // width): with the search at groups of 16, 32 and 128, beside a 2-bit side, and without it
      {gpu_config(128, 5, 32, 3, 3, MetaType::fp16), 1, 2, 400, {150, 250}},
      {gpu_config(64, 4, 128, 5, 3, MetaType::fp8_e4m3), 2, 1, 300, {300}},
      {gpu_config(32, 3, 16, 7, 6, MetaType::fp16), 1, 1, 150, {150}},
      {gpu_config(128, 5, 128, 3, 2, MetaType::fp32), 1, 2, 300, {299, 1}},
      {no_search(gpu_config(64, 2, 64, 6, 7, MetaType::fp32), 0.9f), 1, 2, 200, {1, 199}},
  };
}

// The flush kernels' block indices and the token-major kernel's tile slots
// (a claimed tile's index over the tiles a window) come from FastDiv
// (multiply-high, add, shift); checked on the host against the division for
// divisors 1 to 4096, the powers of two and random ones, at dividends near
// multiples and at the ends of the range (below 2^31). Needs no GPU.
TEST(Cuda, FastDivMatchesDivision) {
  std::mt19937 rng(5);
  std::vector<std::uint32_t> divisors;
  for (std::uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int s = 12; s < 31; ++s) divisors.push_back(std::uint32_t{1} << s);
  for (int i = 0; i < 2000; ++i) divisors.push_back(1 + rng() % 0x7FFFFFFFu);
  std::size_t bad = 0;
  for (std::uint32_t d : divisors) {
    const cuda::FastDiv f(d);
    std::vector<std::uint32_t> ns = {0, 1, d - 1, d, d + 1, 0x7FFFFFFFu, 0x7FFFFFFFu - d};
    for (std::uint32_t k : {2u, 3u, 1000u, 65535u})
      if (static_cast<std::uint64_t>(d) * k < 0x80000000u) ns.insert(ns.end(), {d * k - 1, d * k, d * k + 1});
    for (int i = 0; i < 64; ++i) ns.push_back(rng() & 0x7FFFFFFFu);
    for (std::uint32_t n : ns) {
      if (n >= 0x80000000u) continue;
      if (f.div(n) != n / d && bad++ < 5) ADD_FAILURE() << n << " / " << d << ": " << f.div(n) << " instead of " << n / d;
    }
  }
  EXPECT_EQ(bad, 0u);
}

// The attention kernels' split count (cuda/split_rule.hpp), on the host: the
// count is one a launch really makes (ceil(tiles / s) tiles a split give s
// splits), within [1, min(256, tiles)], and no count in that range, taken as
// launched, costs less under the model; more resident blocks never make the
// chosen cost higher. And against session 21's sweep (B=32 Hkv=8, 5 blocks an
// SM on 132 SMs): at 32k the sweep's best were 4-6 splits, at 128k fewer,
// longer blocks measured slower. Needs no GPU.
TEST(Cuda, SplitRuleMinimisesItsCostAsLaunched) {
  std::mt19937 rng(23);
  for (int i = 0; i < 3000; ++i) {
    const std::int64_t heads = 1 + rng() % 1024, tiles = 1 + rng() % (i % 3 == 0 ? 40 : 5000), slots = 1 + rng() % 1200;
    const cuda::SplitChoice c = cuda::choose_split_count(heads, tiles, slots);
    const std::string what = "heads " + std::to_string(heads) + " tiles " + std::to_string(tiles) + " slots " + std::to_string(slots);
    ASSERT_GE(c.splits, 1) << what;
    ASSERT_LE(c.splits, std::min<std::int64_t>(256, tiles)) << what;
    const std::int64_t per = (tiles + c.splits - 1) / c.splits;
    ASSERT_EQ(per, c.tiles_per_split) << what;
    ASSERT_EQ((tiles + per - 1) / per, c.splits) << what << ": launched as another count";
    ASSERT_EQ(c.waves, (heads * c.splits + slots - 1) / slots) << what;
    for (std::int64_t s = 1; s <= std::min<std::int64_t>(256, tiles); ++s) {
      const std::int64_t ps = (tiles + s - 1) / s, launched = (tiles + ps - 1) / ps;
      const double cost = static_cast<double>((heads * launched + slots - 1) / slots) * (2.0 + static_cast<double>(ps));
      ASSERT_GE(cost, c.cost) << what << ": " << s << " splits cost less";
    }
    EXPECT_LE(cuda::choose_split_count(heads, tiles, slots + 1 + rng() % 500).cost, c.cost) << what;
  }
  const cuda::SplitChoice at32k = cuda::choose_split_count(256, 255, 660), at128k = cuda::choose_split_count(256, 1023, 660);
  EXPECT_GE(at32k.splits, 4);
  EXPECT_LE(at32k.splits, 6);
  EXPECT_GT(at128k.splits, 6);
}

// The split count's per-thread table (cuda/split_rule.hpp) answers as the loop does, whatever was
// asked before: questions drawn from a small pool (repeats, entries evicted and asked again, two
// keys of one slot in turn), on two threads at once (each has its own table). Needs no GPU.
TEST(Cuda, CachedSplitCountIsTheLoops) {
  const auto ask = [](unsigned seed, int* mismatches) {
    std::mt19937 rng(seed);
    std::vector<std::array<std::int64_t, 3>> pool;
    const auto draw = [&](std::int64_t n) { return 1 + static_cast<std::int64_t>(rng() % static_cast<unsigned>(n)); };
    for (int i = 0; i < 40; ++i) pool.push_back({draw(512), draw(5000), draw(1200)});
    pool.push_back({8, 256, 660});  // B=1 Hkv=8 32k and its neighbours one tile apart
    pool.push_back({8, 257, 660});
    pool.push_back({8, 255, 660});
    for (int i = 0; i < 4000; ++i) {
      const auto& q = pool[rng() % pool.size()];
      if (cuda::cached_split_count(q[0], q[1], q[2]) != cuda::choose_split_count(q[0], q[1], q[2]).splits) ++*mismatches;
    }
  };
  int m0 = 0, m1 = 0;
  std::thread other(ask, 31u, &m1);
  ask(30u, &m0);
  other.join();
  EXPECT_EQ(m0, 0);
  EXPECT_EQ(m1, 0);
}

// The rule before session 23 (SKVQ_CUDA_SPLIT_RULE=fill, for benchmarks): no count up to
// min(256, whole tiles) scores higher (last wave's fill less 0.002 a split), and it makes session
// 23's documented choices (18 splits at B=32 Hkv=8 32k, 10 at B=8 Hkv=8 512k; 660 slots).
TEST(Cuda, FillSplitRuleMaximisesItsScore) {
  std::mt19937 rng(24);
  for (int i = 0; i < 2000; ++i) {
    const std::int64_t heads = 1 + rng() % 1024, tiles = rng() % 5000, slots = 1 + rng() % 1200;
    const int s = cuda::fill_split_count(heads, tiles, slots);
    const std::string what = "heads " + std::to_string(heads) + " tiles " + std::to_string(tiles) + " slots " + std::to_string(slots);
    const std::int64_t top = std::max<std::int64_t>(1, std::min<std::int64_t>(256, tiles));
    ASSERT_GE(s, 1) << what;
    ASSERT_LE(s, top) << what;
    const auto score = [&](std::int64_t n) {
      const double blocks = static_cast<double>(heads * n), waves = std::ceil(blocks / static_cast<double>(slots));
      return blocks / (waves * static_cast<double>(slots)) - 0.002 * static_cast<double>(n);
    };
    for (std::int64_t n = 1; n <= top; ++n) {
      if (n < s) {
        ASSERT_LT(score(n), score(s)) << what << ": " << n << " splits score as high";
      } else if (n > s) {
        ASSERT_LE(score(n), score(s)) << what << ": " << n << " splits score higher";
      }
    }
  }
  EXPECT_EQ(cuda::fill_split_count(256, 255, 660), 18);
  EXPECT_EQ(cuda::fill_split_count(64, 4095, 660), 10);
}

// The flush's certified clip choice (cuda/clip_proxy.hpp) on the host: for
// every group it certifies, its factor must be the spec's (errors summed in
// slot order, every operation rounded, ties to the earlier factor); and on
// ordinary data it must certify nearly every group, or the flush falls back
// to the exact sums and is no faster. Groups: normal and heterogeneous
// values, an offset far above the range, few distinct values (ties between
// factors), constant groups, huge and tiny magnitudes; at 1, 2, 4 and 8 bits,
// groups of 32, 64, 128 and 48 slots, fp16, fp32 and e4m3 metadata. Needs no GPU.
struct ClipCase {
  float lo[5], scale[5], inv[5], err[5];
  float gmin, gmax;
  int spec;  // the spec's choice
};

ClipCase clip_case(const std::vector<float>& x, int bits, MetaType meta) {
  static constexpr float kGrid[5] = {1.0f, 0.97f, 0.94f, 0.90f, 0.85f};
  ClipCase c{};
  const int g = static_cast<int>(x.size());
  const float levels = static_cast<float>((1 << bits) - 1), inv_g = 1.0f / static_cast<float>(g);
  c.gmin = c.gmax = x[0];
  for (float v : x) c.gmin = std::min(c.gmin, v), c.gmax = std::max(c.gmax, v);
  const float mid = (c.gmax + c.gmin) * 0.5f, rng = c.gmax - c.gmin;
  c.spec = 0;
  for (int a = 0; a < 5; ++a) {
    const float t = kGrid[a] * rng;
    c.lo[a] = ref::meta_round_lo(mid - t * 0.5f, meta);
    c.scale[a] = ref::meta_round_scale(std::max(t / levels, ref::kMinScaleF32), meta);
    c.inv[a] = 1.0f / c.scale[a];
    float err = 0.0f;
    for (float v : x) {
      const float code = std::min(std::max(std::nearbyint((v - c.lo[a]) / c.scale[a]), 0.0f), levels);
      const float d = code * c.scale[a] + c.lo[a] - v;
      err += d * d;
    }
    c.err[a] = err * inv_g;
    if (c.err[a] < c.err[c.spec]) c.spec = a;
  }
  return c;
}

// The proxy's choice as the flush forms it: slots in pairs (even, odd), then
// choose; at 8 bits the clamp left out where in_range says it cannot matter,
// and where it is left out the sums must be those with the clamp, bit for bit.
template <int BITS>
bool clip_proxy_choice_bits(const std::vector<float>& x, const ClipCase& c, int& best, bool* shared) {
  using Proxy = cuda::clip::ClipProxy<5, BITS>;
  Proxy px(c.lo, c.inv), clamped = px;
  const int g = static_cast<int>(x.size());
  const bool in_range = px.in_range(c.gmin, c.gmax);
  if (Proxy::kFold) {
    EXPECT_TRUE(in_range) << "bits " << BITS;
  }
  for (int i = 0; i + 1 < g; i += 2) {
    clamped.template add2<true>(x[i], x[i + 1]);
    if (in_range) px.template add2<false>(x[i], x[i + 1]);
  }
  if (g % 2) {
    clamped.template add1<true>(x[g - 1]);
    if (in_range) px.template add1<false>(x[g - 1]);
  }
  if (!in_range) return clamped.choose(c.lo, c.scale, c.gmin, c.gmax, g, best, shared);
  for (int a = 0; a < 5; ++a) {
    EXPECT_EQ(px.even[a], clamped.even[a]) << "bits " << BITS << " factor " << a;
    EXPECT_EQ(px.odd[a], clamped.odd[a]) << "bits " << BITS << " factor " << a;
  }
  return px.choose(c.lo, c.scale, c.gmin, c.gmax, g, best, shared);
}

bool clip_proxy_choice(const std::vector<float>& x, const ClipCase& c, int bits, int& best, bool* shared = nullptr) {
  switch (bits) {
    case 1: return clip_proxy_choice_bits<1>(x, c, best, shared);
    case 2: return clip_proxy_choice_bits<2>(x, c, best, shared);
    case 3: return clip_proxy_choice_bits<3>(x, c, best, shared);
    case 4: return clip_proxy_choice_bits<4>(x, c, best, shared);
    case 5: return clip_proxy_choice_bits<5>(x, c, best, shared);
    case 6: return clip_proxy_choice_bits<6>(x, c, best, shared);
    case 7: return clip_proxy_choice_bits<7>(x, c, best, shared);
    case 8: return clip_proxy_choice_bits<8>(x, c, best, shared);
    default: ADD_FAILURE() << "no proxy at " << bits << " bits"; return false;
  }
}

TEST(Cuda, CertifiedClipChoiceIsTheSpecs) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto f16 = [](float v) { return f16_to_f32(f32_to_f16(v)); };
  enum Kind { kNormal, kHetero, kOffset, kFewValues, kConstant, kHuge, kTiny, kKinds };
  struct Tally {
    long groups = 0, certified = 0, shared = 0;  // shared: by the one radius for every factor
  };
  Tally ordinary;  // normal and heterogeneous groups at fp16 metadata
  long checked = 0, wrong = 0;
  for (int bits = 1; bits <= 8; ++bits) {
    for (int g : {32, 48, 64, 128}) {
      for (MetaType meta : {MetaType::fp16, MetaType::fp32, MetaType::fp8_e4m3}) {
        for (int kind = 0; kind < kKinds; ++kind) {
          const int n = kind == kNormal || kind == kHetero || kind == kOffset || kind == kFewValues ? 400 : 60;
          for (int it = 0; it < n; ++it) {
            std::vector<float> x(static_cast<std::size_t>(g));
            const float scale = std::exp2(static_cast<float>(static_cast<int>(rng() % 9) - 4));
            for (int i = 0; i < g; ++i) {
              float v = normal(rng);
              switch (kind) {
                case kHetero: v *= (i % 7 == 0 ? 8.0f : 1.0f) * scale; break;
                case kOffset: v = 100.0f + 0.25f * v; break;
                case kFewValues: v = static_cast<float>(static_cast<int>(rng() % 4)) * 0.5f; break;
                case kConstant: v = 1.5f; break;
                case kHuge: v *= 9000.0f; break;
                case kTiny: v *= 1e-5f; break;
                default: v *= scale; break;
              }
              x[static_cast<std::size_t>(i)] = f16(v);
            }
            const ClipCase c = clip_case(x, bits, meta);
            int best = -1;
            bool shared = false;
            const bool ok = clip_proxy_choice(x, c, bits, best, &shared);
            if ((kind == kNormal || kind == kHetero) && meta == MetaType::fp16) {
              ordinary.groups++, ordinary.certified += ok, ordinary.shared += ok && shared;
            }
            if (!ok) continue;
            ++checked;
            if (best != c.spec && wrong++ < 5) {
              ADD_FAILURE() << "bits " << bits << " g " << g << " kind " << kind << ": certified factor " << best << ", spec " << c.spec
                            << " (errors " << c.err[0] << " " << c.err[1] << " " << c.err[2] << " " << c.err[3] << " " << c.err[4] << ")";
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(checked, 10000);
  // the flush is only faster if the exact sums are rare: nearly every ordinary group certified
  EXPECT_GE(static_cast<double>(ordinary.certified), 0.99 * static_cast<double>(ordinary.groups))
      << ordinary.certified << " of " << ordinary.groups;
  // and nearly all of them by the one radius (the per-factor radii cost the flush ~4 x 80 operations a group)
  EXPECT_GE(static_cast<double>(ordinary.shared), 0.97 * static_cast<double>(ordinary.groups))
      << ordinary.shared << " of " << ordinary.groups;
  std::printf("certified %ld of %ld ordinary groups, %ld by the one radius\n", ordinary.certified, ordinary.groups, ordinary.shared);
}

// The folds (1 to 4 bits) give each slot's distance to the nearest code,
// clipped ends included: one slot's term of the estimate against the
// distance from the exact quotient (x - lo) / scale to the nearest of 0 ..
// levels, in long double, within a few ulps of the quotient's size.
template <int BITS>
void check_fold_distances() {
  std::mt19937 rng(29 + BITS);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const float levels = static_cast<float>((1 << BITS) - 1);
  for (int it = 0; it < 20000; ++it) {
    const float scale = f16_to_f32(f32_to_f16(std::ldexp(1.0f + 0.5f * (unit(rng) + 1.0f), static_cast<int>(rng() % 12) - 8)));
    const float lo = f16_to_f32(f32_to_f16(scale * (8.0f * unit(rng)) + (it % 3 == 0 ? 50.0f * scale : 0.0f)));
    // x from well below lo to well past the last code (clipped ends), and exact ties between codes
    float x = lo + scale * (levels * 0.5f + (levels * 0.5f + 3.0f) * unit(rng));
    if (it % 5 == 0) x = lo + scale * (static_cast<float>(rng() % (1 << BITS)) + 0.5f);
    x = f16_to_f32(f32_to_f16(x));
    const float lo1[1] = {lo}, inv1[1] = {1.0f / scale};
    cuda::clip::ClipProxy<1, BITS> px(lo1, inv1);
    px.add1(x);
    const long double q = (static_cast<long double>(x) - lo) / scale;
    const long double nearest = std::min<long double>(std::max<long double>(std::nearbyint(q), 0.0L), levels);
    const long double D = std::fabs(q - nearest);
    const long double d = std::sqrt(static_cast<long double>(px.even[0]));
    const long double tol = 64.0L * 0x1p-24L * (std::fabs(q) + levels + std::fabs(static_cast<long double>(lo) / scale) + 1.0L);
    ASSERT_NEAR(static_cast<double>(d), static_cast<double>(D), static_cast<double>(tol))
        << "bits " << BITS << " x " << x << " lo " << lo << " scale " << scale;
  }
}

TEST(Cuda, ClipProxyFoldsGiveTheDistanceToTheNearestCode) {
  check_fold_distances<1>();
  check_fold_distances<2>();
  check_fold_distances<3>();
  check_fold_distances<4>();
}

// Factors whose errors differ by less than the bound can separate (here two
// factors that give the same lo and scale: equal errors) are never
// certified; the caller sums exactly and the tie goes to the earlier factor.
TEST(Cuda, CertifiedClipChoiceRefusesTies) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(128);
  for (float& v : x) v = f16_to_f32(f32_to_f16(normal(rng)));
  ClipCase c = clip_case(x, 2, MetaType::fp16);
  int best = -1;
  ASSERT_TRUE(clip_proxy_choice(x, c, 2, best));
  ASSERT_EQ(best, c.spec);
  // make every factor the spec's choice: identical lo and scale, identical errors
  for (int a = 0; a < 5; ++a) c.lo[a] = c.lo[c.spec], c.scale[a] = c.scale[c.spec], c.inv[a] = c.inv[c.spec];
  EXPECT_FALSE(clip_proxy_choice(x, c, 2, best));
  // a constant group: every factor reconstructs it exactly (errors 0)
  std::vector<float> k(64, 0.75f);
  const ClipCase z = clip_case(k, 4, MetaType::fp16);
  EXPECT_FALSE(clip_proxy_choice(k, z, 4, best));
}

// The general tensor-core kernel's code unpacking (cuda/tc_codes.hpp) on the host, from rows packed
// as the store packs them (ref::pack_codes), at every width the kernel takes (tc_any_widths_ok: keys
// 1 to 8 bits, values 1 to 8; a pair of them has a kernel of its own (tc_widths_ok) or, at head dim
// 128, the kernel whose widths are read at run time, whose cases are these same steps). Keys:
// for every width and every warp's share of a row (32 to 128 channels), each lane's B registers of
// each k-step must hold fp16 1 + c / 2^KB of the channels key_channel gives its q slots (b0's
// halves slots 0 and 1, b1's 2 and 3), and the four lanes of a quad must take each of a k-step's 16
// channels once. Values: for every width and group (lane chunks of 4 bits to 14 bytes, whole
// bytes or not), lane g's register of n-tile i must hold bf16 1 + c / 2^VB of channel g GS / 8 + i
// of the group, the first token's in its low half and the second's in its high half, from the chunk
// as the kernel loads it (tc_value_chunk); at 8 bits, c = 16 h + l, the register 1 + h / 16 and the
// low plane's 2^-4 (1 + l / 16). Random codes and the extremes (all 0, all 2^b - 1).
// Needs no GPU.
namespace tcc = cuda::tc;

std::vector<std::uint8_t> tc_codes_for(std::mt19937& rng, int n, int bits, int trial) {
  const int top = (1 << bits) - 1;
  std::uniform_int_distribution<int> code(0, top);
  std::vector<std::uint8_t> c(static_cast<std::size_t>(n));
  for (auto& x : c) x = static_cast<std::uint8_t>(trial == 0 ? 0 : trial == 1 ? top : code(rng));
  return c;
}

template <int BYTES>
tcc::Raw<BYTES> tc_raw(const std::vector<std::uint8_t>& packed, int first) {
  tcc::Raw<BYTES> r{};  // as Raw::load: little-endian words, zero above a trailing part word's bytes
  for (int e = 0; e < BYTES; ++e) r.w[e / 4] |= static_cast<unsigned>(packed[static_cast<std::size_t>(first + e)]) << (8 * (e % 4));
  return r;
}

template <int KB, int DW>
void check_tc_keys(std::mt19937& rng) {
  constexpr int kBytes = DW * KB / 8, KS = DW / 16;
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; j < 4; ++j) {
      const int c = tcc::key_channel<KB>(t, j);
      ASSERT_TRUE(c >= 0 && c < 16) << "KB " << KB << " t " << t << " j " << j << ": channel " << c;
    }
  }
  for (int c = 0; c < 16; ++c) {
    int takers = 0;
    for (int t = 0; t < 4; ++t) {
      for (int j = 0; j < 4; ++j) takers += tcc::key_channel<KB>(t, j) == c;
    }
    EXPECT_EQ(takers, 1) << "KB " << KB << ": channel " << c << " of a k-step";
  }
  for (int trial = 0; trial < 6; ++trial) {
    const std::vector<std::uint8_t> codes = tc_codes_for(rng, DW, KB, trial);
    std::vector<std::uint8_t> packed(static_cast<std::size_t>(ref::packed_bytes(DW, KB)), 0);
    ref::pack_codes(codes.data(), DW, KB, packed.data());
    const tcc::Raw<kBytes> raw = tc_raw<kBytes>(packed, 0);
    for (int t = 0; t < 4; ++t) {
      int next = 0;
      tcc::key_steps<KB, KS>(raw.w, tcc::KeyLane<KB>(t), 0x3C003C00u, [&](int ks, unsigned b0, unsigned b1) {
        EXPECT_EQ(ks, next++);
        const unsigned half[4] = {b0 & 0xFFFFu, b0 >> 16, b1 & 0xFFFFu, b1 >> 16};
        for (int j = 0; j < 4; ++j) {
          const int c = 16 * ks + tcc::key_channel<KB>(t, j);
          EXPECT_EQ(half[j], 0x3C00u | (static_cast<unsigned>(codes[static_cast<std::size_t>(c)]) << (10 - KB)))
              << "KB " << KB << " channels " << DW << " trial " << trial << " lane " << t << " k-step " << ks << " slot " << j;
        }
      });
      EXPECT_EQ(next, KS) << "KB " << KB << " channels " << DW;
    }
  }
}

// Lane g's value chunk of a group's packed segment as the kernel loads it (TileRaw::load): by
// words (ValueChunk::from_words; the words past those the lane needs, which the kernel does not
// read, given as all ones here), or as Raw<kBytes> from its byte.
template <int VB, int GS>
tcc::Raw<tcc::ValueChunk<VB, GS>::kBytes> tc_value_chunk(const std::vector<std::uint8_t>& segment, int g) {
  using VC = tcc::ValueChunk<VB, GS>;
  if constexpr (VC::kByWords) {
    const int bytes = static_cast<int>(segment.size());
    EXPECT_EQ(bytes % 4, 0) << "VB " << VB << " group " << GS << ": the segment whole words";
    EXPECT_LE(4 * (VC::first_word(g) + VC::words(g)), bytes) << "VB " << VB << " group " << GS << " lane " << g << ": past the segment";
    EXPECT_LE(VC::shift(g) + VC::kBits, 32 * VC::words(g)) << "VB " << VB << " group " << GS << " lane " << g << ": too few words";
    unsigned w[VC::kWords];
    for (int i = 0; i < VC::kWords; ++i) {
      w[i] = 0xFFFFFFFFu;
      if (i < VC::words(g)) {
        w[i] = 0;
        for (int e = 0; e < 4; ++e) w[i] |= static_cast<unsigned>(segment[static_cast<std::size_t>(4 * (VC::first_word(g) + i) + e)]) << (8 * e);
      }
    }
    return VC::from_words(w, VC::shift(g));
  } else {
    EXPECT_EQ(VC::kBits % 8, 0);
    return tc_raw<VC::kBytes>(segment, g * VC::kBytes);
  }
}

template <int VB, int GS>
void check_tc_values(std::mt19937& rng) {
  static_assert(tcc::tc_chunk_ok(GS, VB), "a group the kernel takes at every width (nothing skipped)");
  constexpr int kCV = tcc::ValueChunk<VB, GS>::kBytes, kNTG = GS / 8;
  for (int trial = 0; trial < 6; ++trial) {
    const std::vector<std::uint8_t> c0 = tc_codes_for(rng, GS, VB, trial), c1 = tc_codes_for(rng, GS, VB, trial < 2 ? 1 - trial : trial);
    std::vector<std::uint8_t> p0(static_cast<std::size_t>(ref::packed_bytes(GS, VB)), 0), p1 = p0;
    ref::pack_codes(c0.data(), GS, VB, p0.data());
    ref::pack_codes(c1.data(), GS, VB, p1.data());
    for (int g = 0; g < 8; ++g) {
      const tcc::ValuePair<VB, kCV> vp(tc_value_chunk<VB, GS>(p0, g), tc_value_chunk<VB, GS>(p1, g));
      [&]<int... I>(std::integer_sequence<int, I...>) {
        const unsigned reg[] = {vp.template reg<I>(0x3F803F80u)...};
        [[maybe_unused]] std::array<unsigned, kNTG> low{};  // 8 bits: the low plane
        if constexpr (VB == 8) low = {vp.template reg_low<I>(tcc::kLowPlaneOne)...};
        for (int i = 0; i < kNTG; ++i) {
          const std::size_t c = static_cast<std::size_t>(g * kNTG + i);
          for (int tok = 0; tok < 2; ++tok) {
            const unsigned code = (tok == 0 ? c0 : c1)[c], half = (reg[i] >> (16 * tok)) & 0xFFFFu;
            const std::string at = "VB " + std::to_string(VB) + " group " + std::to_string(GS) + " trial " + std::to_string(trial) +
                                   " lane " + std::to_string(g) + " n-tile " + std::to_string(i) + " token " + std::to_string(tok);
            if constexpr (VB == 8) {  // high plane 1 + h / 16, low plane 2^-4 (1 + l / 16), their sum 1 + 2^-4 + c / 2^8
              const unsigned lh = (low[static_cast<std::size_t>(i)] >> (16 * tok)) & 0xFFFFu;
              EXPECT_EQ(half, 0x3F80u | ((code >> 4) << 3)) << at << " (high plane)";
              EXPECT_EQ(lh, 0x3D80u | ((code & 0xFu) << 3)) << at << " (low plane)";
              const auto bf16 = [](unsigned b) { return std::bit_cast<float>(b << 16); };
              EXPECT_EQ(bf16(half) + bf16(lh), 1.0f + 0.0625f + static_cast<float>(code) / 256.0f) << at << " (the planes' sum)";
            } else {
              EXPECT_EQ(half, 0x3F80u | (code << (7 - VB))) << at;
            }
          }
        }
      }(std::make_integer_sequence<int, kNTG>{});
    }
  }
}

template <int B>
void check_tc_width(std::mt19937& rng) {
  static_assert(tcc::tc_widths_ok(B, B), "a width the kernel takes");
  check_tc_keys<B, 32>(rng), check_tc_keys<B, 64>(rng), check_tc_keys<B, 96>(rng), check_tc_keys<B, 128>(rng);
  check_tc_values<B, 32>(rng), check_tc_values<B, 64>(rng), check_tc_values<B, 96>(rng), check_tc_values<B, 128>(rng);
}

TEST(CudaTcCodes, RegistersHoldEachLanesCodesAtEveryWidth) {
  std::mt19937 rng(61);
  check_tc_width<1>(rng), check_tc_width<2>(rng), check_tc_width<3>(rng), check_tc_width<4>(rng);
  check_tc_width<5>(rng), check_tc_width<6>(rng), check_tc_width<7>(rng);
  // 8-bit keys and values (the run-time widths' kernel takes them: session 63 keys, 64 values as two
  // planes), at the groups that kernel has (32, 64, 128) and 96
  check_tc_keys<8, 32>(rng), check_tc_keys<8, 64>(rng), check_tc_keys<8, 96>(rng), check_tc_keys<8, 128>(rng);
  check_tc_values<8, 32>(rng), check_tc_values<8, 64>(rng), check_tc_values<8, 96>(rng), check_tc_values<8, 128>(rng);
  EXPECT_FALSE(tcc::tc_widths_ok(8, 8));  // no kernel of their own (8-bit values only in the run-time widths' one)
  EXPECT_FALSE(tcc::tc_widths_ok(3, 2));  // mixed pairs other than 2 and 4: no kernel of their own
  for (int kb = 1; kb <= 8; ++kb) {
    for (int vb = 1; vb <= 8; ++vb) EXPECT_TRUE(tcc::tc_any_widths_ok(kb, vb)) << "K" << kb << "V" << vb;
    EXPECT_FALSE(tcc::tc_any_widths_ok(kb, 0));
    EXPECT_FALSE(tcc::tc_any_widths_ok(kb, 9));
  }
  EXPECT_FALSE(tcc::tc_any_widths_ok(0, 2));
  EXPECT_FALSE(tcc::tc_any_widths_ok(9, 2));
  // every width at every group the kernel's shapes have (32, 64, 96, 128): a group's segment whole
  // words; not so at 16 channels of an odd width
  for (int b = 1; b <= 8; ++b) {
    for (int gs : {32, 64, 96, 128}) EXPECT_TRUE(tcc::tc_chunk_ok(gs, b)) << "VB " << b << " group " << gs;
  }
  EXPECT_FALSE(tcc::tc_chunk_ok(16, 3));
}

// The token-major kernel's 3- and 1-bit codes widened to 4- and 2-bit ones a tile at a time
// (cuda/widen.hpp, attn_tmma_kernel's SRC): every value of a word's codes (2^24 for eight 3-bit codes,
// 2^16 for sixteen 1-bit ones), with the ignored upper bits set to anything, and rows of 128 codes
// packed by the CPU's packer, widened chunk by chunk into exactly the row that packer makes of the same
// codes at the wider width (what the 4- and 2-bit kernels read from caches of those widths).
template <int FROM>
void check_widened_rows(std::uint32_t seed) {
  using W = skvq::cuda::widen::Widen<FROM>;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, (1 << FROM) - 1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::uint8_t> codes(128);
    for (auto& c : codes) c = static_cast<std::uint8_t>(trial == 0 ? (1 << FROM) - 1 : trial == 1 ? 0 : code(rng));
    std::vector<std::uint8_t> packed(static_cast<std::size_t>(ref::packed_bytes(128, FROM)), 0);
    ASSERT_EQ(packed.size(), 4u * 4 * W::kIn);
    ref::pack_codes(codes.data(), 128, FROM, packed.data());
    // the row as the 4-bit (2-bit) kernel reads a cache of that width: the same codes packed at kTo bits
    std::vector<std::uint8_t> wide(static_cast<std::size_t>(ref::packed_bytes(128, W::kTo)), 0), widened(wide.size(), 0);
    ASSERT_EQ(wide.size(), 4u * 4 * W::kOut);
    ref::pack_codes(codes.data(), 128, W::kTo, wide.data());
    for (int part = 0; part < 4; ++part) {
      unsigned in[W::kIn], out[W::kOut];
      std::memcpy(in, packed.data() + part * 4 * W::kIn, sizeof in);
      W::chunk(in, out);
      std::memcpy(widened.data() + part * 4 * W::kOut, out, sizeof out);
    }
    ASSERT_EQ(widened, wide) << FROM << "-bit trial " << trial;
  }
}

TEST(CudaWiden, ThreeAndOneBitCodesBecomeFourAndTwoBitOnes) {
  namespace w = skvq::cuda::widen;
  static_assert(w::Widen<3>::kTo == 4 && w::Widen<1>::kTo == 2);
  EXPECT_TRUE(w::widens(3) && w::widens(1));
  for (int b : {2, 4, 5, 6, 7, 8}) EXPECT_FALSE(w::widens(b)) << b;
  std::uint32_t wrong = 0, first_bad = 0;
  for (std::uint32_t x = 0; x < (1u << 24); ++x) {
    const unsigned out = w::word3(x | ((x * 2654435761u) & 0xFF000000u));
    std::uint32_t want = 0;
    for (int j = 0; j < 8; ++j) want |= ((x >> (3 * j)) & 7u) << (4 * j);
    if (out != want && wrong++ == 0) first_bad = x;
  }
  EXPECT_EQ(wrong, 0u) << "3 bits: first at x = " << first_bad;
  for (std::uint32_t x = 0; x < (1u << 16); ++x) {
    const unsigned out = w::word1(x | ((x * 2654435761u) & 0xFFFF0000u));
    std::uint32_t want = 0;
    for (int j = 0; j < 16; ++j) want |= ((x >> j) & 1u) << (2 * j);
    if (out != want && wrong++ == 0) first_bad = x;
  }
  EXPECT_EQ(wrong, 0u) << "1 bit: first at x = " << first_bad;
  check_widened_rows<3>(65);
  check_widened_rows<1>(66);
}

// The flush kernel's division-free quotient (two Newton corrections with FMA
// residuals) against the host's IEEE division, bit for bit, where it matters
// most: quotients within a few ulps of half-integers (the only place a code
// could change), for fp16, e4m3 and arbitrary float32 scales, quotients up
// to 2^24, plus differences of fp16 values as the kernel forms them.
TEST(Cuda, FlushQuotientIsCorrectlyRounded) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-24, 10), code(-3, 300), nudge(-4, 4), kind(0, 4), big(0, (1 << 24) - 1);
  const auto fp16 = [](float x) { return f16_to_f32(f32_to_f16(x)); };
  std::vector<float> num, scale;
  while (num.size() < (std::size_t{1} << 22)) {
    float s = std::ldexp(unit(rng), expo(rng));
    const int kd = kind(rng);
    if (kd == 0) s = fp16(s);                                                     // fp16 metadata
    if (kd == 1) s = std::ldexp(std::round(std::ldexp(unit(rng), 3)), expo(rng) / 4 - 3);  // e4m3-like: 4 significant bits
    float n;
    if (kd == 3) {  // x - lo of fp16 values
      n = fp16(std::ldexp(unit(rng), expo(rng) / 3)) - fp16(std::ldexp(unit(rng), expo(rng) / 3));
    } else {  // kind 4: large quotients (e4m3 metadata saturated against fp16 values reaches ~5e6)
      n = static_cast<float>(((kd == 4 ? big(rng) : code(rng)) + 0.5) * s);
      for (int k = nudge(rng); k != 0; k += k > 0 ? -1 : 1) n = std::nextafter(n, k > 0 ? INFINITY : -INFINITY);
    }
    if (!std::isfinite(n) || !std::isnormal(s)) continue;
    num.push_back(n);
    scale.push_back(s);
  }
  std::vector<float> got(num.size());
  cuda::flush_quotients(num.data(), scale.data(), got.data(), static_cast<std::int64_t>(num.size()));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < num.size(); ++i) {
    const float want = num[i] / scale[i];
    if (std::memcmp(&want, &got[i], sizeof(float)) != 0 && bad++ < 5) {
      ADD_FAILURE() << num[i] << " / " << scale[i] << ": " << got[i] << " instead of " << want;
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Cuda, FlushMatchesCpuBitForBit) {
  REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (const Case& c : cases()) {
    Tensor k = randn({c.B, c.H, c.S, 128}, seed++, DType::f16, true), v = randn({c.B, c.H, c.S, 128}, seed++, DType::f16, true);
    SkvqCache cpu(c.cfg);
    cuda::DeviceCache gpu(c.cfg, c.B, c.H, 128, c.S + 8);
    std::int64_t t = 0;
    for (std::int64_t n : c.calls) {
      cpu.append(k.view().slice_tokens(t, n), v.view().slice_tokens(t, n));
      gpu.append(k.view().slice_tokens(t, n), v.view().slice_tokens(t, n));
      t += n;
      ASSERT_TRUE(gpu.to_host().same_state(cpu)) << "window " << c.cfg.window << " after " << t << " tokens";
    }
    EXPECT_EQ(gpu.offset(), c.S);
    EXPECT_EQ(gpu.q_end(), cpu.q_end());
  }
}

// Inputs on coarse grids (a few distinct values per group, constant groups,
// two-valued groups): clip factors whose errors tie exactly or nearly, where
// the choice must follow the spec's (ties to the earlier factor) bit for bit.
// With the search off (every other case) the same inputs put quotients
// exactly on half-integers, where rounding to even decides the code.
TEST(Cuda, FlushMatchesCpuOnTiesBetweenClipFactors) {
  REQUIRE_GPU();
  const float steps[] = {0.5f, 0.25f, 1.0f / 3.0f, 2.0f, 0.0f};
  std::uint32_t seed = 100;
  int n = 0;
  for (int bits = 1; bits <= 8; ++bits) {
    for (int group : {16, 32, 48, 64, 128, 200}) {  // 48: a padded last group; 200: one group past D
      for (MetaType meta : {MetaType::fp16, MetaType::fp32, MetaType::fp8_e4m3}) {
        // windows of 32 rows (whole warps), 36 (a warp of 4 lanes: fewer than the factors, so no
        // lane-per-factor sharing of the exact sums) and 3
        const int window = n % 3 == 0 ? 32 : n % 3 == 1 ? 36 : 3;
        const bool search = (n++ % 2) == 0;
        Config cfg = gpu_config(window, 2, group, bits, bits, meta);
        if (!search) cfg = no_search(cfg, 0.9f);
        Tensor k = randn({1, 2, 96, 128}, seed++, DType::f16, true), v = randn({1, 2, 96, 128}, seed++, DType::f16, true);
        for (Tensor* t : {&k, &v})
          for (std::int64_t h = 0; h < 2; ++h)
            for (std::int64_t s = 0; s < 96; ++s)
              for (std::int64_t d = 0; d < 128; ++d) {
                const float step = steps[(h * 96 + s + d / 16) % 5];
                const float x = t->view().at(0, h, s, d);
                t->view().set(0, h, s, d, step == 0.0f ? 0.75f : std::round(x / step) * step + 0.0f);  // no -0
              }
        SkvqCache cpu(cfg);
        cuda::DeviceCache gpu(cfg, 1, 2, 128, 96);
        cpu.append(k.view(), v.view());
        gpu.append(k.view(), v.view());
        ASSERT_TRUE(gpu.to_host().same_state(cpu))
            << "bits " << bits << " group " << group << " meta " << static_cast<int>(meta) << " search " << search << " window " << window;
      }
    }
  }
}

// Values on and next to the codes' boundaries: each group (reorder off, so a
// group is a channel range) spans a random [gmin, gmax], and its other values
// sit within 3 fp16 steps of lo + (k - 0.5) * scale, where the code changes
// (the flush finds those boundaries as fp16 thresholds at 1 and 2 bits and
// codes by comparison; at 4 and 8 bits it rounds an approximate quotient and
// forms the exact one where that is too close to a half-integer to be
// certain; at 3, 5, 6 and 7 bits the exact quotient, codes across words). Groups far from zero (|lo / scale| up to ~10^5) widen the
// certainty bound. Also groups of one value and of two.
TEST(Cuda, FlushMatchesCpuNextToCodeBoundaries) {
  REQUIRE_GPU();
  const auto step = [](float x, int n) {  // n fp16 steps up (down for n < 0); x an fp16 value
    std::uint16_t h = f32_to_f16(x);
    for (; n != 0; n += n > 0 ? -1 : 1) {
      const bool up = n > 0;
      if (h == 0x8000) h = 0;  // -0 -> +0 (the same value)
      if (h == 0) h = up ? 0x0001 : 0x8001;
      else if ((h & 0x8000) == 0) h = static_cast<std::uint16_t>(up ? h + 1 : h - 1);
      else h = static_cast<std::uint16_t>(up ? h - 1 : h + 1);
    }
    return f16_to_f32(h);
  };
  const auto fp16 = [](float x) { return f16_to_f32(f32_to_f16(x)); };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mag(-6.0f, 4.0f), unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> nudge(-3, 3);
  int n = 0;
  for (int bits = 1; bits <= 8; ++bits) {
    for (int group : {16, 32, 128}) {
      for (MetaType meta : {MetaType::fp16, MetaType::fp32, MetaType::fp8_e4m3}) {
        const bool search = (n++ % 3) == 0;
        Config cfg = gpu_config(32, 1, group, bits, bits, meta, false);
        if (!search) cfg = no_search(cfg, (n % 2) ? 1.0f : 0.93f);
        const float levels = static_cast<float>((1 << bits) - 1), alpha = search ? 1.0f : cfg.clip_alpha;
        const std::int64_t S = 96;
        Tensor k = randn({1, 2, S, 128}, 500 + n, DType::f16, true), v = randn({1, 2, S, 128}, 900 + n, DType::f16, true);
        for (Tensor* t : {&k, &v})
          for (std::int64_t h = 0; h < 2; ++h)
            for (std::int64_t s = 0; s < S; ++s)
              for (std::int64_t j0 = 0; j0 < 128; j0 += group) {
                const float a = std::ldexp(unit(rng) * 2.0f - 1.0f, static_cast<int>(mag(rng)));
                const float b = a + std::ldexp(0.5f + unit(rng), static_cast<int>(mag(rng)));
                const float gmin = fp16(a), gmax = fp16(b);
                const float mid = (gmin + gmax) * 0.5f, tt = alpha * (gmax - gmin);
                const float lo = mid - tt * 0.5f, sc = tt / levels;
                const int kind = static_cast<int>((s + j0) % 8);
                for (std::int64_t j = j0; j < j0 + group; ++j) {
                  float x = fp16(lo + (static_cast<float>(rng() % (1u << bits)) + 0.5f) * sc);
                  x = step(x, nudge(rng));
                  if (j == j0) x = gmin;
                  if (j == j0 + 1) x = gmax;
                  if (kind == 0) x = gmin;                                      // a group of one value
                  if (kind == 1 && j > j0 + 1) x = (j % 2) ? gmin : gmax;      // two values
                  t->view().set(0, h, s, j, x);
                }
              }
        SkvqCache cpu(cfg);
        cuda::DeviceCache gpu(cfg, 1, 2, 128, S);
        cpu.append(k.view(), v.view());
        gpu.append(k.view(), v.view());
        ASSERT_TRUE(gpu.to_host().same_state(cpu))
            << "bits " << bits << " group " << group << " meta " << static_cast<int>(meta) << " search " << search;
      }
    }
  }
}

// Groups of signed zeros alone (found by fuzz_cache_ops on the CPU's SIMD
// quantizer): the reference's min and max keep the first slot's zero, so lo
// is -0 exactly when the group's first slot is; a min or max instruction may
// pick either sign. Rows of +0 and -0, a few rows with nonzero slots.
TEST(Cuda, FlushMatchesCpuOnSignedZeroGroups) {
  REQUIRE_GPU();
  for (MetaType meta : {MetaType::fp16, MetaType::fp32, MetaType::fp8_e4m3}) {
    for (bool search : {true, false}) {
      for (int group : {32, 128}) {
        Config cfg = gpu_config(64, 3, group, 2, 4, meta, group == 32);
        cfg.clip_search = search;
        const std::int64_t S = 200;
        Tensor k = randn({1, 2, S, 128}, 41, DType::f16, true), v = randn({1, 2, S, 128}, 42, DType::f16, true);
        std::mt19937 rng(43);
        for (Tensor* t : {&k, &v})
          for (std::int64_t h = 0; h < 2; ++h)
            for (std::int64_t s = 0; s < S; ++s) {
              if (s % 7 == 0) continue;  // keep some rows as they are
              for (std::int64_t d = 0; d < 128; ++d) t->view().set(0, h, s, d, rng() % 2 ? -0.0f : 0.0f);
            }
        SkvqCache cpu(cfg);
        cpu.append(k.view(), v.view());
        cuda::DeviceCache gpu(cfg, 1, 2, 128, S);
        gpu.append(k.view(), v.view());
        EXPECT_TRUE(gpu.to_host().same_state(cpu)) << "meta " << static_cast<int>(meta) << " search " << search << " group " << group;
      }
    }
  }
}

// append_device from pointers that are not 16-byte aligned (one fp16 element
// into a buffer): the flush stages rows element by element then; same state.
TEST(Cuda, FlushFromUnalignedDevicePointers) {
  REQUIRE_GPU();
  for (bool search : {true, false}) {
    Config cfg = gpu_config(64, 3, 32, 2, 2, MetaType::fp16);
    cfg.clip_search = search;
    const std::int64_t S = 300;
    Tensor k = randn({1, 2, S, 128}, 31, DType::f16, true), v = randn({1, 2, S, 128}, 32, DType::f16, true);
    SkvqCache cpu(cfg);
    cpu.append(k.view(), v.view());
    auto* dk = static_cast<std::uint16_t*>(cuda::device_alloc(k.nbytes() + 2));
    auto* dv = static_cast<std::uint16_t*>(cuda::device_alloc(v.nbytes() + 2));
    cuda::copy_to_device(dk + 1, k.data(), k.nbytes());
    cuda::copy_to_device(dv + 1, v.data(), v.nbytes());
    cuda::DeviceCache gpu(cfg, 1, 2, 128, S);
    gpu.append_device(dk + 1, dv + 1, S);
    cuda::synchronize();
    cuda::device_free(dk);
    cuda::device_free(dv);
    EXPECT_TRUE(gpu.to_host().same_state(cpu)) << "search " << search;
  }
}

double rel_l2(const TensorView& a, const TensorView& b) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < a.shape[0]; ++i)
    for (std::int64_t h = 0; h < a.shape[1]; ++h)
      for (std::int64_t s = 0; s < a.shape[2]; ++s)
        for (std::int64_t d = 0; d < a.shape[3]; ++d) {
          const double x = a.at(i, h, s, d), y = b.at(i, h, s, d);
          if (!std::isfinite(x)) return INFINITY;
          num += (x - y) * (x - y);
          den += y * y;
        }
  return std::sqrt(num / den);
}

// GPU attention against the CPU reference, per element, with the bound of
// tests/test_attend.cpp (fused terms ak/av, 16-bit q in the dp4a key path qk,
// 16-bit value weights vq; docs/numerics.md) plus ex2.approx (relative error 2^-22 per weight). S and
// the value magnitude come from the inputs over the rows each query sees.
// The opt-in tensor-core kernel rounds q and p to fp16: relative L2 5e-3.
void expect_close(const SkvqCache& cpu, const TensorView& q, const TensorView& k, const TensorView& v, float scale,
                  const TensorView& got, const TensorView& want, const std::string& what) {
  if (attention_tolerance() > 1e-5) {
    EXPECT_LT(rel_l2(got, want), attention_tolerance()) << what;
    return;
  }
  constexpr double u = 0x1p-24;
  const std::int64_t G = q.shape[1] / k.shape[1], T = k.shape[2], D = k.shape[3];
  RowBounds bounds(cpu, q, k, v, scale, G);
  for (std::int64_t b = 0; b < q.shape[0]; ++b)
    for (std::int64_t hq = 0; hq < q.shape[1]; ++hq)
      for (std::int64_t i = 0; i < q.shape[2]; ++i) {
        const RowScale rs = bounds.row_scale(b, hq, i);
        const PackedBound pb = bounds.packed_bound(b, hq, i);
        const double vb = std::max(rs.vmax, pb.av);
        const double ds = static_cast<double>(D + 16) * u * (2 * rs.s_abs + pb.ak) + pb.qk;
        // + the 16-bit value weights of the pipelined kernels: blocks of at most 64 tokens (32, but 64
        // in the token-major kernel with 2-bit values, which takes two tiles at once) rounded to 65535
        // steps, against 128 tokens and 64000 steps in pb.vq (pb.vq / 2)
        const double tol = ((std::exp(2 * ds) - 1) + 2 * static_cast<double>(T + 16) * u + 8 * u + 4 * 0x1p-22) * vb + pb.vq / 2;
        for (std::int64_t d = 0; d < got.shape[3]; ++d) {
          ASSERT_NEAR(got.at(b, hq, i, d), want.at(b, hq, i, d), tol) << what << " at [" << b << "," << hq << "," << i << "," << d << "]";
        }
      }
}

TEST(Cuda, AttentionMatchesCpuReference) {
  REQUIRE_GPU();
  std::uint32_t seed = 100;
  for (const Case& c : cases()) {
    for (std::int64_t G : {1, 4}) {
      for (std::int64_t Sq : {1, 2, 3}) {
        Tensor k = randn({c.B, c.H, c.S, 128}, seed++, DType::f16, true), v = randn({c.B, c.H, c.S, 128}, seed++, DType::f16);
        SkvqCache cpu(c.cfg);
        cuda::DeviceCache gpu(c.cfg, c.B, c.H, 128, c.S);
        cpu.append(k.view(), v.view());
        gpu.append(k.view(), v.view());
        Tensor q = randn({c.B, c.H * G, Sq, 128}, seed++, DType::f32);
        const float scale = 1.0f / std::sqrt(128.0f);
        const Tensor want = attend(cpu, q.view(), scale, AttendOptions{Kernel::reference, 1});
        const Tensor got = gpu.attend(q.view(), scale);
        expect_close(cpu, q.view(), k.view(), v.view(), scale, got.view(), want.view(),
                     "window " + std::to_string(c.cfg.window) + " G " + std::to_string(G) + " Sq " + std::to_string(Sq));
      }
    }
  }
}

// Attention of Hq query heads (Sq rows each) over the first len tokens, with each forced split count
// through the device entry point, against the CPU reference.
void expect_splits_match(const SkvqCache& cpu, cuda::DeviceCache& gpu, const Tensor& k, const Tensor& v, std::int64_t len,
                         std::int64_t Hq, std::int64_t Sq, std::initializer_list<int> split_counts, const std::string& what) {
  Tensor q = randn({1, Hq, Sq, k.shape()[3]}, static_cast<std::uint32_t>(len * 7 + Hq), DType::f32);
  const Tensor want = attend(cpu, q.view(), 0.1f, AttendOptions{Kernel::reference, 1});
  float* dq = static_cast<float*>(cuda::device_alloc(q.nbytes()));
  float* dout = static_cast<float*>(cuda::device_alloc(want.nbytes()));
  cuda::copy_to_device(dq, q.data(), q.nbytes());
  for (int splits : split_counts) {
    gpu.attend_device(dq, static_cast<int>(Hq), static_cast<int>(Sq), 0.1f, dout, splits);
    Tensor got(DType::f32, want.shape());
    cuda::copy_to_host(got.data(), dout, got.nbytes());
    expect_close(cpu, q.view(), k.view().slice_tokens(0, len), v.view().slice_tokens(0, len), 0.1f, got.view(), want.view(),
                 what + " len " + std::to_string(len) + " Hq " + std::to_string(Hq) + " Sq " + std::to_string(Sq) + " splits " +
                     std::to_string(splits));
  }
  cuda::device_free(dq);
  cuda::device_free(dout);
}

TEST(Cuda, AttentionAtAwkwardLengthsAndSplits) {
  REQUIRE_GPU();
  const Config cfg = gpu_config(64, 5, 128, 2, 2, MetaType::fp16);
  Tensor k = randn({1, 2, 1100, 128}, 7, DType::f16, true), v = randn({1, 2, 1100, 128}, 8, DType::f16);
  SkvqCache cpu(cfg);
  cuda::DeviceCache gpu(cfg, 1, 2, 128, 1100);
  std::int64_t fed = 0;
  for (std::int64_t len : {1, 4, 5, 6, 63, 64, 65, 128, 129, 1000, 1100}) {
    cpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
    gpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
    fed = len;
    // grouped-query (8 rows a KV head: query-major kernel; 4 rows: token-major kernel) and multi-head (1 row)
    for (std::int64_t Hq : {16, 8, 2}) expect_splits_match(cpu, gpu, k, v, len, Hq, 1, {0, 1, 3, 17}, "window 64");
  }
}

// Chunked prefill: chunks of new tokens appended after a packed history, then the causal attention
// of all their query rows (Sq = the chunk) at once. From 40 rows a KV head (2-bit keys; 32 with
// wider ones) the packed body goes through the chunk kernel (attend_chunk.cu: 64 rows a block, the
// tile unpacked once a block); fewer rows through the integer tensor-core kernel (scripts/gpu.sh also runs every attention test
// through the chunk kernel: SKVQ_CUDA_BODY=chunk). Chunks longer than the window put some of
// their own tokens into the packed body, where each row's causal limit cuts its tiles; windows not
// a multiple of 128 give tiles that span two windows; a ragged last block of rows, every metadata
// mode, each value width, groups of 32, 64 and 128, reorder on and off, sinks and none. The last two
// cases scale each token's values by 10^-3 to 10^3, rising then falling (`ramp`): the chunk kernel
// rounds its value weights to fp16 against the largest value scale seen so far, so rising scales
// rescale its sums and falling ones leave small weights far below that scale.
TEST(Cuda, ChunkedPrefillMatchesCpuReference) {
  REQUIRE_GPU();
  struct ChunkCase {
    Config cfg;
    std::int64_t B, H, history;
    std::vector<std::int64_t> chunks;
    bool ramp = false;
  };
  const std::vector<ChunkCase> chunk_cases = {
      {gpu_config(128, 4, 128, 2, 2, MetaType::fp16), 1, 2, 700, {40, 300}},
      {gpu_config(64, 0, 32, 4, 4, MetaType::fp32), 2, 1, 400, {33, 130}},
      {gpu_config(192, 5, 64, 8, 4, MetaType::fp8_e4m3), 1, 2, 500, {9, 250}},
      {gpu_config(128, 3, 32, 4, 2, MetaType::fp16, false), 1, 1, 640, {129}},
      {gpu_config(64, 2, 128, 8, 8, MetaType::fp16), 1, 2, 300, {70}},
      {gpu_config(128, 4, 64, 2, 2, MetaType::fp32), 1, 1, 260, {200}},
      {gpu_config(128, 4, 128, 2, 2, MetaType::fp16), 1, 2, 1200, {100}, true},
      {gpu_config(64, 2, 32, 4, 4, MetaType::fp32), 1, 1, 900, {70}, true},
  };
  std::uint32_t seed = 900;
  for (const ChunkCase& c : chunk_cases) {
    std::int64_t total = c.history;
    for (std::int64_t n : c.chunks) total += n;
    Tensor k = randn({c.B, c.H, total, 128}, seed++, DType::f16, true), v = randn({c.B, c.H, total, 128}, seed++, DType::f16);
    if (c.ramp) {  // 10^(-3 + 6 x) at x = t / (total / 2), then back down
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t t = 0; t < total; ++t) {
            const double x = 1.0 - std::fabs(1.0 - 2.0 * static_cast<double>(t) / static_cast<double>(total));
            const float f = static_cast<float>(std::pow(10.0, -3.0 + 6.0 * x));
            for (std::int64_t d = 0; d < 128; ++d) v.view().set(b, h, t, d, v.view().at(b, h, t, d) * f);
          }
    }
    SkvqCache cpu(c.cfg);
    cuda::DeviceCache gpu(c.cfg, c.B, c.H, 128, total);
    cpu.append(k.view().slice_tokens(0, c.history), v.view().slice_tokens(0, c.history));
    gpu.append(k.view().slice_tokens(0, c.history), v.view().slice_tokens(0, c.history));
    std::int64_t len = c.history;
    for (std::int64_t n : c.chunks) {
      cpu.append(k.view().slice_tokens(len, n), v.view().slice_tokens(len, n));
      gpu.append(k.view().slice_tokens(len, n), v.view().slice_tokens(len, n));
      len += n;
      for (std::int64_t G : {1, 4}) {
        Tensor q = randn({c.B, c.H * G, n, 128}, seed++, DType::f32);
        const float scale = 1.0f / std::sqrt(128.0f);
        const Tensor want = attend(cpu, q.view(), scale, AttendOptions{Kernel::reference, 1});
        const Tensor got = gpu.attend(q.view(), scale);
        expect_close(cpu, q.view(), k.view().slice_tokens(0, len), v.view().slice_tokens(0, len), scale, got.view(), want.view(),
                     std::string(c.ramp ? "ramp " : "") + "window " + std::to_string(c.cfg.window) + " K" + std::to_string(c.cfg.bits_key) + "V" +
                         std::to_string(c.cfg.bits_value) + " g" + std::to_string(c.cfg.group_size) + " chunk " +
                         std::to_string(n) + " after " + std::to_string(len - n) + " G " + std::to_string(G));
      }
    }
  }
}

// Head dims other than 128 (keys and values each their own) and pairs of code widths outside the
// tuned kernels' six go through the general-shape path (attend_general.cu); the flush is the same
// kernel at every head dim. After every append each cache is the CPU cache bit for bit (codes,
// metadata, permutations, sinks, tail), and its attention (grouped-query, decode and prefill rows)
// is within expect_close's bound of the CPU reference. The cases cover one group a row (groups
// wider than the row: padded), ragged last groups, every metadata mode, reorder off, sinks and
// none, one clip factor, and each width of the general kernel's lanes (16 to 256 channels).
struct ShapeCase {
  Config cfg;
  std::int64_t Dv, B, H;
  std::vector<std::int64_t> calls;  // token counts per append
};

TEST(Cuda, OtherHeadDimsMatchTheCpuCache) {
  REQUIRE_GPU();
  auto cfg = [](int D, int window, int n_sink, int group, int bk, int bv, MetaType meta, bool reorder = true) {
    Config c = gpu_config(window, n_sink, group, bk, bv, meta, reorder);
    c.head_dim = D;
    return c;
  };
  const std::vector<ShapeCase> shape_cases = {
      {cfg(16, 16, 2, 32, 2, 2, MetaType::fp16), 16, 1, 2, {5, 95}},  // babyllama's head dim, a padded group
      {cfg(16, 32, 4, 16, 4, 4, MetaType::fp8_e4m3), 48, 2, 1, {90}},
      {cfg(32, 64, 3, 16, 1, 1, MetaType::fp32), 32, 1, 3, {64, 136}},
      {cfg(48, 16, 0, 16, 8, 8, MetaType::fp16, false), 48, 1, 2, {1, 69}},
      {cfg(64, 128, 5, 32, 2, 2, MetaType::fp16), 64, 2, 2, {300, 1, 99}},
      {cfg(64, 64, 5, 64, 4, 2, MetaType::fp16), 128, 1, 2, {200}},
      {cfg(96, 80, 7, 64, 2, 4, MetaType::fp8_e4m3), 96, 1, 2, {250}},  // 96 = 64 + a ragged 32
      {no_search(cfg(80, 32, 2, 16, 4, 4, MetaType::fp16), 0.9f), 80, 1, 2, {100}},
      {cfg(128, 64, 5, 32, 2, 8, MetaType::fp16), 128, 1, 2, {300}},  // head dim 128, widths (2, 8)
      {cfg(128, 16, 2, 128, 1, 4, MetaType::fp32), 128, 1, 1, {60}},
      {cfg(256, 64, 5, 128, 2, 2, MetaType::fp16), 256, 1, 2, {200, 100}},
      {cfg(256, 32, 1, 256, 4, 4, MetaType::fp32), 160, 1, 1, {100}},
      // 3, 5 and 7 bits (the general kernel's run-time width)
      {cfg(16, 16, 2, 16, 3, 5, MetaType::fp16), 16, 1, 2, {5, 95}},
      {cfg(64, 64, 5, 32, 7, 3, MetaType::fp32), 96, 1, 2, {200}},
  };
  std::uint32_t seed = 900;
  for (const ShapeCase& c : shape_cases) {
    const std::int64_t D = c.cfg.head_dim, S = std::accumulate(c.calls.begin(), c.calls.end(), std::int64_t{0});
    const std::string what = "D " + std::to_string(D) + " Dv " + std::to_string(c.Dv) + " window " + std::to_string(c.cfg.window);
    Tensor k = randn({c.B, c.H, S, D}, seed++, DType::f16, true), v = randn({c.B, c.H, S, c.Dv}, seed++, DType::f16, true);
    SkvqCache cpu(c.cfg);
    cuda::DeviceCache gpu(c.cfg, c.B, c.H, c.Dv, S);
    std::int64_t t = 0;
    for (std::int64_t n : c.calls) {
      cpu.append(k.view().slice_tokens(t, n), v.view().slice_tokens(t, n));
      gpu.append(k.view().slice_tokens(t, n), v.view().slice_tokens(t, n));
      t += n;
      ASSERT_TRUE(gpu.to_host().same_state(cpu)) << what << " after " << t << " tokens";
      for (std::int64_t G : {1, 3}) {
        for (std::int64_t Sq : {1, 2, 5}) {
          if (Sq > t) continue;
          Tensor q = randn({c.B, c.H * G, Sq, D}, seed++, DType::f32);
          const float scale = 1.0f / std::sqrt(static_cast<float>(D));
          const Tensor want = attend(cpu, q.view(), scale, AttendOptions{Kernel::reference, 1});
          const Tensor got = gpu.attend(q.view(), scale);
          ASSERT_EQ(got.shape()[3], c.Dv);
          expect_close(cpu, q.view(), k.view().slice_tokens(0, t), v.view().slice_tokens(0, t), scale, got.view(), want.view(),
                       what + " after " + std::to_string(t) + " G " + std::to_string(G) + " Sq " + std::to_string(Sq));
        }
      }
    }
  }
}

// The general path's tensor-core kernel (attend_tc.cu) takes the packed body at head dims 32, 64, 96,
// 128 and 256 (keys and values alike, 128 only for widths outside the tuned kernels' six; at 256 two
// warps share each tile, half the channels each, and exchange their scores' partial sums) with 2-
// and 4-bit codes, or 1, 3, 5, 6 or 7 bits both sides (codes across bytes, session 60), and metadata
// groups of 32, 64 or 128 that divide the row (or 96 at head dim 96, where a wider group is cut to
// the row); the float kernel takes the sinks and the tail as splits of their own. Each case: every
// metadata mode among them, reorder on and off, sinks and none, one group a row and several, a
// group wider than the row (padded to it); 1 to 12 query rows a KV head (12: two launches of 8
// rows), decode and prefill rows (causal limits inside a tile), the split count chosen and forced
// (1, 3 and 17 splits: splits of one tile a warp, empty warps), after appends that end inside and at
// the end of a window. scripts/gpu.sh runs it also under
// SKVQ_CUDA_GENERAL=float, where the float kernel takes every token.
TEST(Cuda, GeneralTensorCoreKernelMatchesTheCpuCache) {
  REQUIRE_GPU();
  struct Case {
    int D, window, n_sink, group, bk, bv;
    MetaType meta;
    bool reorder;
  };
  const std::vector<Case> cases = {
      {64, 128, 5, 32, 2, 2, MetaType::fp16, true},  // the default settings at head dim 64
      {64, 64, 5, 64, 4, 2, MetaType::fp8_e4m3, true},
      {64, 32, 0, 128, 2, 4, MetaType::fp32, false},  // a group wider than the row
      {32, 16, 3, 32, 4, 4, MetaType::fp16, true},
      {96, 48, 5, 32, 2, 2, MetaType::fp16, true},
      {96, 32, 5, 128, 2, 2, MetaType::fp16, true},  // one group of 96 a row (3-byte value chunks)
      {96, 64, 0, 96, 4, 4, MetaType::fp8_e4m3, false},
      {128, 128, 5, 32, 2, 4, MetaType::fp16, true},  // widths the tuned kernels do not take
      {128, 64, 2, 128, 2, 4, MetaType::fp8_e4m3, true},
      {128, 64, 5, 64, 4, 2, MetaType::fp32, true},
      {256, 64, 5, 32, 2, 2, MetaType::fp16, true},  // the default settings at head dim 256
      {256, 32, 0, 128, 4, 2, MetaType::fp8_e4m3, true},
      {256, 48, 3, 64, 2, 4, MetaType::fp32, false},
      {256, 16, 2, 128, 4, 4, MetaType::fp16, true},
      // codes across bytes (session 60), both sides the same width: value chunks of 3 to 14 bytes
      {128, 128, 5, 128, 3, 3, MetaType::fp16, true},
      {128, 64, 2, 64, 5, 5, MetaType::fp8_e4m3, true},
      {128, 32, 0, 128, 7, 7, MetaType::fp32, false},
      {128, 64, 5, 32, 6, 6, MetaType::fp16, true},
      {64, 64, 5, 64, 3, 3, MetaType::fp16, true},
      {32, 16, 3, 32, 6, 6, MetaType::fp8_e4m3, true},
      {96, 48, 5, 128, 6, 6, MetaType::fp16, true},  // one group of 96 (9-byte value chunks)
      {256, 32, 5, 64, 7, 7, MetaType::fp16, true},
      {256, 16, 2, 128, 5, 5, MetaType::fp32, true},
      {64, 32, 5, 64, 1, 1, MetaType::fp16, true},  // 1-bit codes (the tuned kernels take them at 128 only)
      // lane chunks that are not whole bytes, or odd bytes past one (session 62: loaded by words)
      {128, 64, 5, 32, 3, 3, MetaType::fp16, true},       // 12 bits
      {128, 32, 0, 32, 1, 1, MetaType::fp8_e4m3, true},   // 4 bits (here the tuned kernels unless SKVQ_CUDA_BODY=general)
      {128, 128, 2, 32, 5, 5, MetaType::fp32, false},     // 20 bits
      {64, 64, 5, 32, 7, 7, MetaType::fp16, true},        // 28 bits
      {96, 48, 5, 128, 3, 3, MetaType::fp16, true},       // one group of 96: 36 bits, across two words
      {96, 32, 3, 128, 7, 7, MetaType::fp8_e4m3, true},   // 84 bits
      {32, 16, 3, 32, 5, 5, MetaType::fp8_e4m3, true},
      {256, 32, 5, 32, 3, 3, MetaType::fp16, true},       // two warps a tile
      // the other pairs at head dim 128 (session 63): the kernel that reads the widths at run time,
      // every key width 1-8 and value width 1-8 among them, at groups of 32, 64 and 128
      {128, 128, 5, 128, 3, 2, MetaType::fp16, true},
      {128, 64, 2, 32, 2, 3, MetaType::fp8_e4m3, true},
      {128, 64, 5, 64, 8, 2, MetaType::fp32, true},
      {128, 128, 5, 32, 1, 4, MetaType::fp16, true},
      {128, 32, 0, 128, 5, 7, MetaType::fp16, false},
      {128, 64, 3, 64, 6, 1, MetaType::fp8_e4m3, true},
      {128, 128, 5, 128, 8, 7, MetaType::fp32, true},
      {128, 48, 5, 32, 7, 5, MetaType::fp16, true},
      {128, 64, 5, 128, 4, 6, MetaType::fp16, true},
      {128, 16, 3, 64, 1, 2, MetaType::fp16, true},
      {128, 64, 5, 32, 3, 2, MetaType::fp32, true},  // (fp32 metadata at groups of 32: the float kernel)
      // 8-bit values beside other key widths (session 64: two 4-bit planes)
      {128, 128, 5, 128, 4, 8, MetaType::fp16, true},
      {128, 64, 2, 32, 2, 8, MetaType::fp8_e4m3, true},
      {128, 64, 5, 64, 7, 8, MetaType::fp32, true},
      {128, 32, 0, 128, 1, 8, MetaType::fp16, false},
      {128, 64, 3, 32, 8, 8, MetaType::fp16, true},  // (the tuned kernels' unless SKVQ_CUDA_BODY=general)
  };
  std::uint32_t seed = 4300;
  for (const Case& c : cases) {
    Config cfg = gpu_config(c.window, c.n_sink, c.group, c.bk, c.bv, c.meta, c.reorder);
    cfg.head_dim = c.D;
    const std::int64_t S = 3 * c.window + 37;
    Tensor k = randn({1, 2, S, c.D}, seed++, DType::f16, true), v = randn({1, 2, S, c.D}, seed++, DType::f16, true);
    SkvqCache cpu(cfg);
    cuda::DeviceCache gpu(cfg, 1, 2, c.D, S);
    std::int64_t fed = 0;
    for (std::int64_t len : {static_cast<std::int64_t>(c.window) + 7, 3 * static_cast<std::int64_t>(c.window), S}) {
      cpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
      gpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
      fed = len;
      const std::string what = "D " + std::to_string(c.D) + " window " + std::to_string(c.window) + " group " +
                               std::to_string(c.group) + " K" + std::to_string(c.bk) + "V" + std::to_string(c.bv);
      expect_splits_match(cpu, gpu, k, v, len, 8, 1, {0, 1, 3, 17}, what);  // 4 rows a KV head
      expect_splits_match(cpu, gpu, k, v, len, 2, 1, {0, 3}, what);         // 1 row
      expect_splits_match(cpu, gpu, k, v, len, 16, 1, {0}, what);           // 8 rows
      expect_splits_match(cpu, gpu, k, v, len, 6, 4, {0, 3}, what);         // 12 rows, causal
    }
  }
}

// 1-bit keys and values at head dim 128 and groups of 128 go through the general path's tensor-core
// kernel for 8 query rows a KV head, and for 3 to 7 once B x Hkv x the packed tokens reaches 2^18
// (attend.cu, one_bit_to_tc); through the tuned kernels otherwise: both sides of that line. (Groups
// of 32 and 64 go there from 2^20: the tensor-core kernel at those groups is checked in
// Cuda.GeneralTensorCoreKernelMatchesTheCpuCache, under SKVQ_CUDA_BODY=general at head dim 128.)
TEST(Cuda, OneBitDecodeOnEitherKernelMatchesTheCpuCache) {
  REQUIRE_GPU();
  const Config cfg = gpu_config(128, 5, 128, 1, 1, MetaType::fp16);
  const std::int64_t S = 33024 + 40;  // 32896 packed tokens: 2 x 4 x 32896 > 2^18
  Tensor k = randn({2, 4, S, 128}, 61, DType::f16, true), v = randn({2, 4, S, 128}, 62, DType::f16, true);
  SkvqCache cpu(cfg);
  cuda::DeviceCache gpu(cfg, 2, 4, 128, S);
  std::int64_t fed = 0;
  for (std::int64_t len : {std::int64_t{4096}, S}) {  // 2 x 4 x ~4k packed tokens: 2^15; x 32k: 2^18
    cpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
    gpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
    fed = len;
    for (std::int64_t Hq : {4, 12, 16, 32}) {  // 1, 3, 4 and 8 rows a KV head
      Tensor q = randn({2, Hq, 1, 128}, static_cast<std::uint32_t>(len + Hq), DType::f32);
      const float scale = 1.0f / std::sqrt(128.0f);
      const Tensor want = attend(cpu, q.view(), scale, AttendOptions{Kernel::reference, 1});
      const Tensor got = gpu.attend(q.view(), scale);
      expect_close(cpu, q.view(), k.view().slice_tokens(0, len), v.view().slice_tokens(0, len), scale, got.view(), want.view(),
                   "K1V1 g128 len " + std::to_string(len) + " Hq " + std::to_string(Hq));
    }
  }
}

// The token-major kernel (3-4 query rows a KV head, and one in its one-row form) with 2-bit keys and
// values and groups of 64 or 128 takes its tiles two at a time in blocks of 16 tiles or more: blocks
// of even and odd tile counts and of fewer than 16 (forced splits), sinks and causal limits inside a
// pair, windows that are and are not a multiple of the tile; groups of 32 (one tile at a time)
// beside them. One row a KV head takes the one-row form at groups of 32 and 128 by default and at
// every group under SKVQ_CUDA_BODY=tmma (scripts/gpu.sh runs the tests both ways, and again with
// SKVQ_CUDA_TMMA_PAIR=1: pairs in blocks of any length).
TEST(Cuda, TokenMajorKernelOverPairsOfTiles) {
  REQUIRE_GPU();
  for (const auto& [window, group] : {std::pair{128, 128}, std::pair{128, 32}, std::pair{256, 64}, std::pair{64, 128}}) {
    const Config cfg = gpu_config(window, 5, group, 2, 2, MetaType::fp16);
    constexpr std::int64_t kMax = 5000;
    Tensor k = randn({1, 2, kMax, 128}, 11, DType::f16, true), v = randn({1, 2, kMax, 128}, 12, DType::f16);
    SkvqCache cpu(cfg);
    cuda::DeviceCache gpu(cfg, 1, 2, 128, kMax);
    std::int64_t fed = 0;
    for (std::int64_t len : {300, 2100, 2177, 4095, 4096, 5000}) {
      cpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
      gpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
      fed = len;
      const std::string what = "window " + std::to_string(window) + " group " + std::to_string(group);
      expect_splits_match(cpu, gpu, k, v, len, 8, 1, {0, 1, 2, 3}, what);  // 4 rows a KV head
      expect_splits_match(cpu, gpu, k, v, len, 4, 2, {1, 2}, what);        // 2 heads x 2 tokens (causal)
      expect_splits_match(cpu, gpu, k, v, len, 2, 1, {0, 1, 2, 3}, what);  // 1 row a KV head (the one-row form)
    }
  }
}

// 3-bit (1-bit) keys and values with 3 or 4 query rows a KV head, and 3-bit ones with one (the
// one-row form), decode through the token-major kernel on codes widened to 4 (2) bits a tile
// (tmma_widens; the other row counts through the general path's tensor-core kernel or the tuned 1-bit
// kernels): groups of 32, 64 and 128, each metadata
// type, reorder on and off, windows that are and are not a multiple of the tile, partial tiles,
// sinks, forced splits, causal rows (Sq = 2). scripts/gpu.sh runs it again with SKVQ_CUDA_BODY=tmma
// (every row count through the kernel) and with SKVQ_CUDA_WIDEN=0 (the other kernels throughout).
TEST(Cuda, WidenedCodesOnTheTokenMajorKernel) {
  REQUIRE_GPU();
  struct W {
    int bits, window, group;
    MetaType meta;
    bool reorder;
  };
  for (const W& c : {W{3, 128, 128, MetaType::fp16, true}, W{3, 256, 64, MetaType::fp32, true}, W{3, 64, 32, MetaType::fp8_e4m3, true},
                     W{3, 128, 32, MetaType::fp16, false}, W{1, 128, 128, MetaType::fp16, true}, W{1, 64, 64, MetaType::fp8_e4m3, false},
                     W{1, 256, 32, MetaType::fp32, true}}) {
    const Config cfg = gpu_config(c.window, 5, c.group, c.bits, c.bits, c.meta, c.reorder);
    constexpr std::int64_t kMax = 5000;
    Tensor k = randn({1, 2, kMax, 128}, 31, DType::f16, true), v = randn({1, 2, kMax, 128}, 32, DType::f16, true);
    SkvqCache cpu(cfg);
    cuda::DeviceCache gpu(cfg, 1, 2, 128, kMax);
    std::int64_t fed = 0;
    for (std::int64_t len : {200, 2177, 5000}) {
      cpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
      gpu.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
      fed = len;
      std::string what = "K";  // (built by appends: GCC 12 warns falsely of "literal" + std::string&&)
      what += std::to_string(c.bits) + "V" + std::to_string(c.bits) + " window " + std::to_string(c.window) + " group " +
              std::to_string(c.group);
      expect_splits_match(cpu, gpu, k, v, len, 8, 1, {0, 1, 3}, what);  // 4 rows a KV head
      expect_splits_match(cpu, gpu, k, v, len, 6, 1, {0, 2}, what);     // 3 rows
      expect_splits_match(cpu, gpu, k, v, len, 4, 2, {0, 2}, what);     // 2 heads x 2 tokens (causal): 4 rows
      expect_splits_match(cpu, gpu, k, v, len, 2, 1, {0}, what);        // 1 row (3 bits: the one-row form)
    }
  }
}

// The token-major kernel with fp16 metadata and 2 or 4 key groups a row takes each token's lo term
// (sum over groups of the key minimum times q's group sum) from an fp16 MMA, q's sums split into two
// fp16 parts after a power-of-two scale set by each row's max |q| (docs/numerics.md): q from 1e-6
// to 1e6 of a standard normal must neither lose the term to fp16 subnormals nor overflow it (past
// 65504 the parts would be infinite). At 1e6 the bound allows almost anything, but not a NaN or an
// infinity. (The opt-in fp16 kernel, SKVQ_CUDA_MMA=1, rounds q itself to fp16: not at 1e6.)
TEST(Cuda, TokenMajorLoTermAtExtremeQueryScales) {
  REQUIRE_GPU();
  for (const auto& [group, kbits] : {std::pair{32, 2}, std::pair{64, 2}, std::pair{32, 4}}) {
    const Config cfg = gpu_config(128, 5, group, kbits, 2, MetaType::fp16);
    Tensor k = randn({1, 2, 900, 128}, 21, DType::f16, true), v = randn({1, 2, 900, 128}, 22, DType::f16);
    SkvqCache cpu(cfg);
    cuda::DeviceCache gpu(cfg, 1, 2, 128, 900);
    cpu.append(k.view(), v.view());
    gpu.append(k.view(), v.view());
    for (const float factor : {1e-6f, 1.0f, 1e6f}) {
      if (factor > 65504.0f / 8 && attention_tolerance() > 1e-5) continue;
      Tensor q = randn({1, 8, 1, 128}, 23, DType::f32);  // 4 rows a KV head
      const auto qv = q.view();
      for (std::int64_t h = 0; h < 8; ++h)
        for (std::int64_t d = 0; d < 128; ++d) qv.set(0, h, 0, d, qv.at(0, h, 0, d) * factor);
      const float scale = 1.0f / std::sqrt(128.0f);
      const Tensor want = attend(cpu, q.view(), scale, AttendOptions{Kernel::reference, 1});
      const Tensor got = gpu.attend(q.view(), scale);
      expect_close(cpu, q.view(), k.view(), v.view(), scale, got.view(), want.view(),
                   "group " + std::to_string(group) + " K" + std::to_string(kbits) + " q x " + std::to_string(factor));
    }
  }
}

// Balanced claiming (the token-major kernel, blocks of 8 tiles or more: grouped-query decode and one
// query row a KV head at K2V2 g32 and g128 and K4V4 g128): the blocks of several KV heads
// and batch rows share each head's tiles out through counters that the combine kernel zeroes, so a
// second call on the same stream must find them at zero again (a counter left over would end its
// blocks early: results off by whole chunks). Forced split counts give blocks of 8-20 tiles, chunks
// of 2 or 3 (SKVQ_CUDA_BALANCE=64 in scripts/gpu.sh: 2), a head's last chunk short, with chunks of
// 3 the head's last tiles in chunks of 2 (SKVQ_CUDA_TAIL; =0 in scripts/gpu.sh: none), 2- and 4-bit
// codes, groups of 32 and 128, and a window that is not a multiple of the tile.
// 12 query rows a KV head take two launches of the integer tensor-core kernel (8 rows, then 4),
// whose partials share the workspace.
TEST(Cuda, ClaimedTilesAcrossHeadsAndCalls) {
  REQUIRE_GPU();
  for (const auto& [window, group, bits] : {std::tuple{128, 128, 2}, std::tuple{128, 32, 2}, std::tuple{64, 128, 4}}) {
    const Config cfg = gpu_config(window, 5, group, bits, bits, MetaType::fp16);
    constexpr std::int64_t kLen = 5000, B = 2, H = 3;
    Tensor k = randn({B, H, kLen, 128}, 31, DType::f16, true), v = randn({B, H, kLen, 128}, 32, DType::f16);
    SkvqCache cpu(cfg);
    cuda::DeviceCache gpu(cfg, B, H, 128, kLen);
    cpu.append(k.view(), v.view());
    gpu.append(k.view(), v.view());
    // 4 query rows a KV head: the token-major kernel; 1 at K2V2 and K4V4 g128: its one-row form (both
    // claim: 38-39 tiles a head, 10-19 a split; at 4 bits through the ring of two stages, a lead of
    // one tile, unless SKVQ_CUDA_TMMA_SHORT=0)
    for (const std::int64_t G : {4, 1, 12}) {
      if (G == 1 && group != 128) continue;
      Tensor q = randn({B, G * H, 1, 128}, 33, DType::f32);
      const Tensor want = attend(cpu, q.view(), 0.1f, AttendOptions{Kernel::reference, 1});
      float* dq = static_cast<float*>(cuda::device_alloc(q.nbytes()));
      float* dout = static_cast<float*>(cuda::device_alloc(want.nbytes()));
      cuda::copy_to_device(dq, q.data(), q.nbytes());
      for (int splits : {2, 4, 3, 2}) {  // (2 twice: the counters of the calls between reset)
        for (int call = 0; call < 2; ++call) {
          gpu.attend_device(dq, G * H, 1, 0.1f, dout, splits);
          Tensor got(DType::f32, want.shape());
          cuda::copy_to_host(got.data(), dout, got.nbytes());
          expect_close(cpu, q.view(), k.view(), v.view(), 0.1f, got.view(), want.view(),
                       "window " + std::to_string(window) + " group " + std::to_string(group) + " bits " + std::to_string(bits) +
                           " rows a KV head " + std::to_string(G) + " splits " + std::to_string(splits) + " call " +
                           std::to_string(call));
        }
      }
      cuda::device_free(dq);
      cuda::device_free(dout);
    }
  }
}

// The project's fp16 kernel: head dim 128 (the tuned general kernel) and others (the general-shape path).
TEST(Cuda, DenseFp16KernelMatchesReference) {
  REQUIRE_GPU();
  for (const auto& [T, D, Dv] : {std::array<std::int64_t, 3>{1, 128, 128}, {77, 128, 128}, {3000, 128, 128}, {77, 64, 64},
                                 {3000, 16, 48}, {500, 256, 256}}) {
    Tensor k = randn({2, 4, T, D}, 11, DType::f16), v = randn({2, 4, T, Dv}, 12, DType::f16);
    Tensor q = randn({2, 8, 2 > T ? 1 : 2, D}, 13, DType::f32);
    Tensor want(DType::f32, {2, 8, q.shape()[2], Dv});
    ref::dense_attention(q.view(), k.view(), v.view(), 0.09f, want.view());
    void* dk = cuda::device_alloc(k.nbytes());
    void* dv = cuda::device_alloc(v.nbytes());
    float* dq = static_cast<float*>(cuda::device_alloc(q.nbytes()));
    float* dout = static_cast<float*>(cuda::device_alloc(want.nbytes()));
    cuda::copy_to_device(dk, k.data(), k.nbytes());
    cuda::copy_to_device(dv, v.data(), v.nbytes());
    cuda::copy_to_device(dq, q.data(), q.nbytes());
    cuda::attend_dense_fp16(dq, dk, dv, dout, 2, 8, 4, q.shape()[2], T, D, Dv, 0.09f);
    Tensor got(DType::f32, want.shape());
    cuda::copy_to_host(got.data(), dout, got.nbytes());
    EXPECT_LT(rel_l2(got.view(), want.view()), 1e-5) << T << " " << D << " " << Dv;
    for (void* p : {dk, dv, static_cast<void*>(dq), static_cast<void*>(dout)}) cuda::device_free(p);
  }
}


TEST(Cuda, UnsupportedShapesAreClearErrors) {
  if (cuda::available()) {
    // every code width of the spec (1 to 8 bits) is taken
    for (int bits = 1; bits <= 8; ++bits) {
      EXPECT_EQ(cuda::DeviceCache(gpu_config(128, 5, 128, bits, 9 - bits, MetaType::fp16), 1, 1, 128, 100).offset(), 0);
    }
    Config c = gpu_config(128, 5, 128, 2, 2, MetaType::fp16);
    c.head_dim = 72;  // head dims: multiples of 16 in [16, 256]
    expect_error([&] { cuda::DeviceCache(c, 1, 1, 64, 100); }, {"head_dim=72", "multiple of 16"});
    c.head_dim = 272;
    expect_error([&] { cuda::DeviceCache(c, 1, 1, 64, 100); }, {"head_dim=272", "[16, 256]"});
    c.head_dim = 64;
    expect_error([&] { cuda::DeviceCache(c, 1, 1, 8, 100); }, {"v_head_dim=8"});
    expect_error([&] { cuda::DeviceCache(gpu_config(128, 5, 128, 9, 2, MetaType::fp16), 1, 1, 128, 100); }, {"bits_key=9"});
    EXPECT_THROW(cuda::DeviceCache(gpu_config(128, 5, 24, 2, 2, MetaType::fp16), 1, 1, 128, 100), Error);
    c.group_size = 48;  // a multiple of 16: taken (the keys 48 + a ragged 16, the values 48 + 48 + 32)
    EXPECT_EQ(cuda::DeviceCache(c, 1, 1, 128, 100).offset(), 0);
    c.group_size = 72;  // not a multiple of 16, narrower than the values' rows
    expect_error([&] { cuda::DeviceCache(c, 1, 1, 128, 100); }, {"group_size=72"});
    cuda::DeviceCache d(gpu_config(16, 2, 128, 2, 2, MetaType::fp16), 1, 1, 128, 20);
    Tensor k = randn({1, 1, 21, 128}, 1);
    EXPECT_THROW(d.append(k.view(), k.view()), Error);  // beyond capacity
    EXPECT_EQ(d.offset(), 0);
    // values the CPU cache refuses (non-finite, beyond the metadata's or fp16's range): the same
    // errors, naming the position and value, and nothing appended
    Tensor k8 = randn({1, 1, 8, 128}, 2), v8 = randn({1, 1, 8, 128}, 3);
    d.append(k8.view(), v8.view());
    Tensor bad = randn({1, 1, 8, 128}, 4, DType::f32), good = randn({1, 1, 8, 128}, 6, DType::f32);
    bad.view().set(0, 0, 5, 7, std::nanf(""));
    expect_error([&] { d.append(good.view(), bad.view()); }, {"values[0, 0, 5, 7]", "nan", "not finite"});
    bad.view().set(0, 0, 5, 7, 1e6f);
    Config c32 = gpu_config(16, 2, 128, 2, 2, MetaType::fp32);
    cuda::DeviceCache d32(c32, 1, 1, 128, 20);
    expect_error([&] { d32.append(bad.view(), good.view()); }, {"keys[0, 0, 5, 7]", "1e+06", "fp16"});
    EXPECT_EQ(d32.offset(), 0);
    EXPECT_EQ(d.offset(), 8);
    Tensor d_then = d.attend(randn({1, 1, 1, 128}, 5, DType::f32).view(), 0.1f);
    EXPECT_EQ(d_then.shape()[3], 128);
  } else {
    EXPECT_THROW(cuda::DeviceCache(gpu_config(128, 5, 128, 2, 2, MetaType::fp16), 1, 1, 128, 100), Error);
  }
}

// A CPU cache uploaded into a device cache is the same cache: its state downloads unchanged, its
// attention matches the CPU reference, and both caches stay equal through further appends (the
// uploaded permutations reorder the windows flushed on the GPU). Across the cases: several windows
// and a partial tail, a tail alone, sinks and none, every metadata mode, reorder off.
TEST(Cuda, HostCacheUploadIsTheSameCache) {
  REQUIRE_GPU();
  std::uint32_t seed = 700;
  for (const Case& c : cases()) {
    const std::int64_t more = 2 * c.cfg.window + 3, total = c.S + more;
    Tensor k = randn({c.B, c.H, total, 128}, seed++, DType::f16, true), v = randn({c.B, c.H, total, 128}, seed++, DType::f16);
    for (std::int64_t upto : {std::min<std::int64_t>(c.cfg.window - 1, c.S), c.S}) {
      const std::string what = "window " + std::to_string(c.cfg.window) + " group " + std::to_string(c.cfg.group_size) +
                               " uploaded at " + std::to_string(upto);
      SkvqCache cpu(c.cfg);
      cpu.append(k.view().slice_tokens(0, upto), v.view().slice_tokens(0, upto));
      cuda::DeviceCache gpu(cpu, total);
      EXPECT_EQ(gpu.capacity(), total) << what;
      EXPECT_EQ(gpu.batch(), c.B) << what;
      EXPECT_EQ(gpu.num_kv_heads(), c.H) << what;
      EXPECT_TRUE(gpu.config() == c.cfg) << what;  // (the cases' configs are packed-only)
      EXPECT_EQ(gpu.offset(), cpu.offset()) << what;
      EXPECT_EQ(gpu.q_end(), cpu.q_end()) << what;
      ASSERT_TRUE(gpu.to_host().same_state(cpu)) << what;
      Tensor q = randn({c.B, c.H * 4, 1, 128}, seed++, DType::f32);
      const Tensor want = attend(cpu, q.view(), 0.1f, AttendOptions{Kernel::reference, 1});
      const Tensor got = gpu.attend(q.view(), 0.1f);
      expect_close(cpu, q.view(), k.view().slice_tokens(0, upto), v.view().slice_tokens(0, upto), 0.1f, got.view(), want.view(),
                   what);
      for (std::int64_t t = upto; t < total;) {  // a partial window, then whole ones
        const std::int64_t n = std::min<std::int64_t>(total - t, t == upto ? 5 : c.cfg.window);
        cpu.append(k.view().slice_tokens(t, n), v.view().slice_tokens(t, n));
        gpu.append(k.view().slice_tokens(t, n), v.view().slice_tokens(t, n));
        t += n;
        ASSERT_TRUE(gpu.to_host().same_state(cpu)) << what << ", then " << t << " tokens";
      }
    }
  }
}

// A cache whose exact rows are fp32 uploads them as fp16, as append() converts its input: from
// values fp16 holds exactly, the device cache equals one filled with the fp16 rows; its dense view
// is dropped; and what the upload refuses (an empty cache, a capacity below the offset, a
// configuration the GPU does not support, an exact value past fp16's range) is an error naming it.
TEST(Cuda, HostCacheUploadConvertsAndRefuses) {
  if (!cuda::available()) {
    SkvqCache cpu(gpu_config(16, 2, 128, 2, 2, MetaType::fp16));
    cpu.append(randn({1, 1, 4, 128}, 1).view(), randn({1, 1, 4, 128}, 2).view());
    EXPECT_THROW(cuda::DeviceCache(cpu, 16), Error);
    return;
  }
  const Config cfg = gpu_config(32, 3, 32, 2, 2, MetaType::fp32);
  const Tensor k16 = randn({2, 2, 77, 128}, 11, DType::f16, true), v16 = randn({2, 2, 77, 128}, 12, DType::f16);
  const Tensor k32 = Tensor::copy_of(k16.view(), DType::f32), v32 = Tensor::copy_of(v16.view(), DType::f32);
  SkvqCache from16(cfg), from32(cfg);
  Config dense_cfg = cfg;
  dense_cfg.dense_view = true;
  SkvqCache dense(dense_cfg);
  from16.append(k16.view(), v16.view());
  from32.append(k32.view(), v32.view());
  dense.append(k16.view(), v16.view());
  EXPECT_TRUE(cuda::DeviceCache(from32, 100).to_host().same_state(from16));
  EXPECT_TRUE(cuda::DeviceCache(dense, 100).to_host().same_state(from16));
  EXPECT_FALSE(cuda::DeviceCache(dense, 100).config().dense_view);
  Config capped = cfg;
  capped.max_ctx = 90;
  EXPECT_EQ(cuda::DeviceCache(capped, 1, 1, 128, 1000).capacity(), 90);
  // a layer of a saved and loaded prompt cache
  PromptCache saved = PromptCache::build(ModelDesc::uniform(2, 128), CacheKind::skvq, cfg);
  saved.layer(1).append(k16.view(), v16.view());
  const PromptCache loaded = load_prompt_cache_bytes(prompt_cache_bytes(saved));
  const auto& layer = dynamic_cast<const SkvqCache&>(loaded.layer(1));
  EXPECT_TRUE(cuda::DeviceCache(layer, 100).to_host().same_state(from16));

  expect_error([&] { cuda::DeviceCache d(SkvqCache(cfg), 100); }, {"empty", "offset=0"});
  expect_error([&] { cuda::DeviceCache d(from16, 76); }, {"capacity=76", "offset=77"});
  Config c72 = cfg;  // a head dim the GPU does not take (not a multiple of 16)
  c72.head_dim = 72;
  SkvqCache narrow(c72);
  narrow.append(randn({1, 1, 40, 72}, 13).view(), randn({1, 1, 40, 72}, 14).view());
  expect_error([&] { cuda::DeviceCache d(narrow, 100); }, {"head_dim=72"});
  Config c64 = cfg;  // one it takes: the upload is the same cache
  c64.head_dim = 64;
  SkvqCache small(c64);
  small.append(randn({1, 2, 200, 64}, 15, DType::f16).view(), randn({1, 2, 200, 32}, 16, DType::f16).view());
  EXPECT_TRUE(cuda::DeviceCache(small, 300).to_host().same_state(small));
  // fp32 metadata quantizes values past fp16's range; in the exact tail they cannot go to the GPU
  Tensor big = Tensor::copy_of(v32.view().slice_tokens(0, 70), DType::f32);
  big.view().set(1, 0, 66, 9, 1e6f);  // token 66: in the tail (q_end 64)
  SkvqCache wide(cfg);
  wide.append(k32.view().slice_tokens(0, 70), big.view());
  expect_error([&] { cuda::DeviceCache d(wide, 100); }, {"from a host cache: value tail[1, 0, 2, 9]", "1e+06", "fp16", "tail row 0 is token 64"});
  big.view().set(1, 0, 66, 9, 0.5f);
  big.view().set(1, 1, 40, 3, -2e5f);  // token 40: flushed (quantized with fp32 metadata), so it uploads
  SkvqCache flushed(cfg);
  flushed.append(k32.view().slice_tokens(0, 70), big.view());
  EXPECT_EQ(cuda::DeviceCache(flushed, 100).offset(), 70);
}

// Packed chunks move between host and device through two 16 MiB pinned buffers, a batch of window
// slots at a time (device_cache.cu): caches of many batches (2.6 of them a side, the last one
// partial) and of slots larger than a buffer (which make the buffers grow) move both ways intact,
// also from two threads at once, and a cache filled on the device equals the CPU cache.
TEST(Cuda, LargeCachesMoveThroughStaging) {
  REQUIRE_GPU();
  struct Big {
    Config cfg;
    std::int64_t B, H, T;
  };
  // 8-bit codes: a slot of 2 x 8 x 96 rows holds 203 KiB, so 16 MiB hold 82 slots and 20677 tokens
  // fill 215 (and a tail of 37); then slots of 8 x 32 x 512 rows, 17 MiB each.
  for (const Big& c : {Big{no_search(gpu_config(96, 5, 128, 8, 8, MetaType::fp16), 0.95f), 2, 8, 96 * 215 + 37},
                       Big{no_search(gpu_config(512, 3, 128, 8, 8, MetaType::fp16), 1.0f), 8, 32, 2 * 512 + 100}}) {
    const std::string what = "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " T=" + std::to_string(c.T);
    const Tensor k = randn({c.B, c.H, c.T, 128}, 31, DType::f16, true), v = randn({c.B, c.H, c.T, 128}, 32);
    SkvqCache cpu(c.cfg);
    cpu.append(k.view(), v.view());
    cuda::DeviceCache filled(c.cfg, c.B, c.H, 128, c.T);
    filled.append(k.view(), v.view());
    ASSERT_TRUE(filled.to_host().same_state(cpu)) << what;
    std::unique_ptr<cuda::DeviceCache> up[2];
    bool same[2] = {false, false};
    std::thread other([&] { same[1] = (up[1] = std::make_unique<cuda::DeviceCache>(cpu, c.T))->to_host().same_state(cpu); });
    same[0] = (up[0] = std::make_unique<cuda::DeviceCache>(cpu, c.T))->to_host().same_state(cpu);
    other.join();
    EXPECT_TRUE(same[0] && same[1]) << what;
    Tensor q = randn({c.B, c.H * 2, 1, 128}, 33, DType::f32);
    const Tensor want = attend(cpu, q.view(), 0.1f, AttendOptions{Kernel::reference, 1});
    expect_close(cpu, q.view(), k.view(), v.view(), 0.1f, up[0]->attend(q.view(), 0.1f).view(), want.view(), what);
  }
}

// A host tensor's bytes in device memory, `offset` bytes past an allocation's (256-byte-aligned)
// start; or `bytes` of room there.
struct DeviceBytes {
  void* base = nullptr;
  void* p = nullptr;
  DeviceBytes(std::size_t bytes, std::size_t offset) : base(cuda::device_alloc(bytes + 16)), p(static_cast<char*>(base) + offset) {}
  explicit DeviceBytes(const Tensor& t, std::size_t offset = 0) : DeviceBytes(t.nbytes(), offset) {
    cuda::copy_to_device(p, t.data(), t.nbytes());
  }
  ~DeviceBytes() { cuda::device_free(base); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

// The host-tensor calls move through pinned staging sets (device_cache.cu, CallStaging): an append of
// 8 MiB or more goes in pieces of whole windows (here windows of 100 rows, so a piece of 1000 tokens
// leaves none in the tail and the last piece does), from fp32 or bf16, contiguous or strided, and gives
// the state of a CPU cache fed the same rows rounded to fp16; a refused append (past the capacity, or
// a bad value in its last piece) leaves the cache as it was; an attention call whose query and output
// pass the sets' 8 MiB (a set grown for it and freed after) and the small calls after it give what
// the same calls through device tensors give, and the CPU reference's output; 16-bit queries give
// what their values as fp32 give; and calls from several threads at once, each on its own cache, give
// what one thread gives.
TEST(Cuda, HostCallsMoveThroughStagingInPieces) {
  REQUIRE_GPU();
  const Config cfg = gpu_config(100, 4, 32, 2, 2, MetaType::fp16);
  const std::int64_t B = 2, H = 8, T = 2530;  // 8 KiB of fp16 keys and values a token: 2513 tokens in pieces of 600 (a quarter, in whole windows)
  // keys contiguous, values a view with the token and channel axes' strides swapped; fp32 and bf16
  struct Input {
    Tensor k, vt;
    TensorView v;
    Tensor k16, v16;  // the same rounded to fp16, contiguous (what the CPU cache is fed)
  };
  const auto input = [&](DType t, std::uint32_t seed) {
    Input in;
    in.k = Tensor::copy_of(randn({B, H, T, 128}, seed, DType::f32, true).view(), t);
    const Tensor v = randn({B, H, T, 128}, seed + 1, DType::f32);
    in.vt = Tensor(t, {B, H, 128, T});
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < T; ++i)
          for (std::int64_t d = 0; d < 128; ++d) in.vt.view().set(b, h, d, i, v.view().at(b, h, i, d));
    in.v = in.vt.view();
    in.v.shape = {B, H, T, 128};
    in.v.strides = {H * 128 * T, 128 * T, 1, T};
    in.k16 = Tensor::copy_of(in.k.view(), DType::f16);
    in.v16 = Tensor::copy_of(in.v, DType::f16);
    return in;
  };
  const Input f32 = input(DType::f32, 41), bf16 = input(DType::bf16, 43);
  SkvqCache cpu(cfg), cpu_bf16(cfg);
  cpu_bf16.append(bf16.k16.view(), bf16.v16.view());
  cuda::DeviceCache gpu(cfg, B, H, 128, T);
  cpu.append(f32.k16.view().slice_tokens(0, 17), f32.v16.view().slice_tokens(0, 17));
  gpu.append(f32.k.view().slice_tokens(0, 17), f32.v.slice_tokens(0, 17));
  const SkvqCache before = gpu.to_host();
  // refused: past the capacity, then a non-finite value in the last piece (token 2500)
  const std::string context = "context " + std::to_string(T + 1) + " ", capacity = "capacity=" + std::to_string(T);
  expect_error([&] { gpu.append(f32.k.view().slice_tokens(16, T - 16), f32.v.slice_tokens(16, T - 16)); },
               {context.c_str(), capacity.c_str()});
  ASSERT_TRUE(gpu.to_host().same_state(before));
  Tensor bad = Tensor::copy_of(f32.k.view(), DType::f32);
  bad.view().set(1, 5, 2500, 7, NAN);
  expect_error([&] { gpu.append(bad.view().slice_tokens(17, T - 17), f32.v.slice_tokens(17, T - 17)); }, {"keys[1, 5, 2483, 7]"});
  ASSERT_TRUE(gpu.to_host().same_state(before));
  EXPECT_EQ(gpu.offset(), 17);
  cpu.append(f32.k16.view().slice_tokens(17, T - 17), f32.v16.view().slice_tokens(17, T - 17));
  gpu.append(f32.k.view().slice_tokens(17, T - 17), f32.v.slice_tokens(17, T - 17));
  ASSERT_TRUE(gpu.to_host().same_state(cpu));
  // A query of 300 rows of 32 heads (9.8 MB, its output as much: past the staging's 8 MiB), then one
  // row. The host call gives the same attention as device tensors do (to the last bits: summation
  // orders may differ, attend_device's note), and its last m rows are the CPU reference's for those
  // m rows alone (the last m rows of a call see what a call of m rows sees): checking all 300 rows
  // against the reference took minutes of CPU time.
  const Tensor kc = Tensor::copy_of(f32.k16.view(), DType::f32), vc = Tensor::copy_of(f32.v16.view(), DType::f32);
  for (std::int64_t sq : {std::int64_t{300}, std::int64_t{1}}) {
    const std::string what = "Sq=" + std::to_string(sq);
    const Tensor q = randn({B, 4 * H, sq, 128}, static_cast<std::uint32_t>(45 + sq), DType::f32);
    const Tensor got = gpu.attend(q.view(), 0.1f);
    const DeviceBytes dq(q), dout(got.nbytes(), 0);
    gpu.attend_device(static_cast<const float*>(dq.p), 4 * H, sq, 0.1f, static_cast<float*>(dout.p));
    Tensor on_device(DType::f32, got.shape());
    cuda::copy_to_host(on_device.data(), dout.p, on_device.nbytes());
    EXPECT_LT(rel_l2(got.view(), on_device.view()), 1e-6) << what;
    const std::int64_t m = std::min<std::int64_t>(sq, 3);
    const Tensor q_last = Tensor::copy_of(q.view().slice_tokens(sq - m, m), DType::f32);
    const Tensor want = attend(cpu, q_last.view(), 0.1f, AttendOptions{Kernel::reference, 0});
    expect_close(cpu, q_last.view(), kc.view(), vc.view(), 0.1f, Tensor::copy_of(got.view().slice_tokens(sq - m, m), DType::f32).view(),
                 want.view(), what);
    // 16-bit queries (uploaded as they are from 1 MiB of fp32, as fp32 below): the result of the
    // same values given as fp32
    for (DType t : {DType::f16, DType::bf16}) {
      const Tensor q16 = Tensor::copy_of(q.view(), t), q16f = Tensor::copy_of(q16.view(), DType::f32);
      EXPECT_LT(rel_l2(gpu.attend(q16.view(), 0.1f).view(), gpu.attend(q16f.view(), 0.1f).view()), 1e-6) << dtype_name(t) << " " << what;
    }
  }
  // four threads, each its own cache (fp32 or bf16 input, in pieces of their own), side by side
  const Tensor q1 = randn({B, 4 * H, 1, 128}, 47, DType::f32);
  const Tensor one = gpu.attend(q1.view(), 0.1f);
  std::vector<std::thread> threads;
  bool same[4] = {};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const Input& in = i % 2 == 0 ? f32 : bf16;
      cuda::DeviceCache c(cfg, B, H, 128, T);
      for (std::int64_t t = 0; t < T;) {
        const std::int64_t n = std::min<std::int64_t>(T - t, i == 0 ? T : 1 + 700 * i);
        c.append(in.k.view().slice_tokens(t, n), in.v.slice_tokens(t, n));
        t += n;
      }
      same[i] = c.to_host().same_state(i % 2 == 0 ? cpu : cpu_bf16) &&
                (i % 2 == 1 || rel_l2(c.attend(q1.view(), 0.1f).view(), one.view()) < 1e-6);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(same[0] && same[1] && same[2] && same[3]) << same[0] << same[1] << same[2] << same[3];
  cuda::DeviceCache small(cfg, B, H, 128, 10);
  expect_error([&] { small.append(f32.k.view().slice_tokens(0, 11), f32.v.slice_tokens(0, 11)); }, {"context 11", "capacity=10"});
  EXPECT_EQ(small.offset(), 0);
}

// Every element of got within rel * |want| + abs of want.
void expect_within(const Tensor& got, const Tensor& want, double rel, double abs, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Shape4 s = want.shape();
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t h = 0; h < s[1]; ++h)
      for (std::int64_t i = 0; i < s[2]; ++i)
        for (std::int64_t d = 0; d < s[3]; ++d) {
          const double w = want.view().at(b, h, i, d), g = got.view().at(b, h, i, d);
          ASSERT_LE(std::fabs(g - w), rel * std::fabs(w) + abs) << what << " at [" << b << "," << h << "," << i << "," << d << "]: " << g << " vs " << w;
        }
}

// The largest |x| of a tensor.
double max_abs(const Tensor& t) {
  double m = 0;
  const Shape4 s = t.shape();
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t h = 0; h < s[1]; ++h)
      for (std::int64_t i = 0; i < s[2]; ++i)
        for (std::int64_t d = 0; d < s[3]; ++d) m = std::max(m, std::fabs(static_cast<double>(t.view().at(b, h, i, d))));
  return m;
}

// The device entry points in the other element types: append_device from bf16 and fp32 rows (each
// rounded to fp16 on the device, into the tail or through the flush's scratch pieces, from 16-byte-
// aligned pointers and from merely element-aligned ones) gives, after every call, the state that the
// host append() of the same rows gives (which the other tests hold to the CPU cache); attend_device
// with fp16 or bf16 queries gives what fp32 queries holding the same values give, and fp16 or bf16
// output is the fp32 output rounded (within the summation-order slack of balanced claiming, 1e-6 of
// the output's size). Pointers not aligned to their element (or, for q, to 16 bytes) and appends
// past the capacity are refused, naming the argument, with the cache left as it was. Tuned kernels
// (D = 128, decode and prefill, grouped-query) and the general path (D = 64).
TEST(Cuda, DeviceCallsTakeFp16Bf16AndFp32) {
  REQUIRE_GPU();
  struct DtypeCase {
    Config cfg;
    std::int64_t Dv, B, H;
    std::vector<std::int64_t> calls;
  };
  Config small = gpu_config(32, 2, 32, 4, 4, MetaType::fp8_e4m3);
  small.head_dim = 64;
  Config eight = gpu_config(16, 0, 64, 8, 1, MetaType::fp32, false);  // no sinks, no reordering
  eight.head_dim = 64;
  // The first call of each but the first flushes whole windows straight from the input (the
  // permutations and sinks from the typed rows too); odd calls start off a 16-byte boundary.
  const std::vector<DtypeCase> cases = {
      {gpu_config(64, 3, 32, 2, 2, MetaType::fp16), 128, 2, 4, {5, 200, 1, 64, 130, 300}},
      {gpu_config(64, 3, 128, 2, 2, MetaType::fp16), 128, 2, 4, {300, 1, 64, 130}},
      {gpu_config(128, 5, 128, 4, 4, MetaType::fp16), 128, 1, 8, {640, 7, 129}},
      // windows of 200 rows: a flush block's 128 rows, then 72 (8-bit keys: the staging in 8-byte units)
      {gpu_config(200, 2, 64, 8, 2, MetaType::fp16), 128, 1, 3, {450, 3, 201}},
      {small, 32, 1, 3, {70, 3, 200}},
      {eight, 64, 2, 2, {48, 5, 33}},
  };
  std::uint32_t seed = 2000;
  for (const DtypeCase& c : cases) {
    const std::int64_t D = c.cfg.head_dim, T = std::accumulate(c.calls.begin(), c.calls.end(), std::int64_t{0});
    for (DType dt : {DType::bf16, DType::f32, DType::f16}) {
      const std::string what = std::string(dtype_name(dt)) + " D " + std::to_string(D) + " group " + std::to_string(c.cfg.group_size);
      const Tensor k = Tensor::copy_of(randn({c.B, c.H, T, D}, seed++, DType::f32, true).view(), dt);
      const Tensor v = Tensor::copy_of(randn({c.B, c.H, T, c.Dv}, seed++, DType::f32).view(), dt);
      cuda::DeviceCache via_host(c.cfg, c.B, c.H, c.Dv, T), on_device(c.cfg, c.B, c.H, c.Dv, T);
      std::int64_t t = 0;
      for (std::size_t j = 0; j < c.calls.size(); ++j) {
        const std::int64_t n = c.calls[j];
        const Tensor ks = Tensor::copy_of(k.view().slice_tokens(t, n)), vs = Tensor::copy_of(v.view().slice_tokens(t, n));
        via_host.append(ks.view(), vs.view());
        // odd calls: keys one element past a 16-byte boundary
        const DeviceBytes dk(ks, j % 2 == 1 ? dtype_size(dt) : 0), dv(vs);
        if (j == 1) {  // refusals first: nothing changes
          const SkvqCache before = on_device.to_host();
          const DeviceBytes odd(ks, 1);
          expect_error([&] { on_device.append_device(odd.p, dv.p, n, dt); }, {"keys", "aligned", dtype_name(dt).data()});
          expect_error([&] { on_device.append_device(dk.p, odd.p, n, dt); }, {"values", "aligned"});
          expect_error([&] { on_device.append_device(dk.p, dv.p, T, dt); }, {"context", "capacity="});
          ASSERT_TRUE(on_device.to_host().same_state(before)) << what;
        }
        on_device.append_device(dk.p, dv.p, n, dt);
        t += n;
        ASSERT_TRUE(on_device.to_host().same_state(via_host.to_host())) << what << " after call " << j;
      }
      // attention in every query and output type
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      const auto run = [&](const Tensor& q, DType out_type, std::size_t q_offset = 0) {
        const std::int64_t Hq = q.shape()[1], Sq = q.shape()[2];
        Tensor out(out_type, {c.B, Hq, Sq, c.Dv});
        const DeviceBytes dq(q, q_offset), dout(out.nbytes(), 0);
        on_device.attend_device(dq.p, q.dtype(), Hq, Sq, scale, dout.p, out_type);
        cuda::copy_to_host(out.data(), dout.p, out.nbytes());
        return Tensor::copy_of(out.view(), DType::f32);
      };
      for (std::int64_t G : {1, 4}) {
        for (std::int64_t Sq : {1, 3}) {
          const std::string at = what + " G " + std::to_string(G) + " Sq " + std::to_string(Sq);
          const Tensor q = randn({c.B, c.H * G, Sq, D}, seed++, DType::f32);
          const Tensor want = run(q, DType::f32);
          const double slack = 1e-6 * max_abs(want);
          for (DType qt : {DType::f16, DType::bf16}) {
            const Tensor qx = Tensor::copy_of(q.view(), qt);
            expect_within(run(qx, DType::f32), run(Tensor::copy_of(qx.view(), DType::f32), DType::f32), 0, slack,
                          at + " q " + std::string(dtype_name(qt)));
          }
          expect_within(run(q, DType::f16), want, 0x1p-11, slack + 0x1p-25, at + " out float16");
          expect_within(run(q, DType::bf16), want, 0x1p-8, slack, at + " out bfloat16");
        }
      }
      const Tensor q = randn({c.B, c.H, 1, D}, seed++, DType::f32);
      expect_error([&] { (void)run(q, DType::f32, 4); }, {"q", "aligned", "16"});
      expect_error([&] { (void)run(Tensor::copy_of(q.view(), DType::f16), DType::f32, 8); }, {"q", "aligned"});
      Tensor out(DType::f32, {c.B, c.H, 1, c.Dv});
      const DeviceBytes dq(q), dout(out.nbytes(), 2);
      expect_error([&] { on_device.attend_device(dq.p, DType::f32, c.H, 1, scale, dout.p, DType::f32); }, {"out", "aligned", "float32"});
    }
  }
}

// x [B, H, T, D] with each batch entry repeated `repeat` times (entry b of the result is entry
// b / repeat of x), then, along the tokens, y's rows (y has the result's batch).
Tensor repeat_then_append(const TensorView& x, std::int64_t repeat, const TensorView& y) {
  const std::int64_t B = x.shape[0] * repeat, H = x.shape[1], T = x.shape[2], S = y.shape[2], D = x.shape[3];
  Tensor out(x.dtype, {B, H, T + S, D});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T + S; ++t)
        for (std::int64_t d = 0; d < D; ++d) out.view().set(b, h, t, d, t < T ? x.at(b / repeat, h, t, d) : y.at(b, h, t - T, d));
  return out;
}

// The bytes of batch entry b of a [B][rest] array.
template <class Bytes>
std::vector<std::uint8_t> entry_bytes(const Bytes& a, std::int64_t B, std::int64_t b) {
  const std::size_t n = a.size() / static_cast<std::size_t>(B);
  std::vector<std::uint8_t> out(n);
  if (n > 0) std::memcpy(out.data(), a.data() + static_cast<std::size_t>(b) * n, n);
  return out;
}

// A device cache forked on the device (a shared prompt, then samples of it): the fork holds each
// source entry `repeat` times, byte for byte (codes, metadata, sinks, tail, permutations), with the
// source's counters; then each fork entry takes tokens of its own and both caches go on as CPU
// caches from their states would. Refusals name the argument.
TEST(Cuda, ForkedCachesRepeatTheirEntries) {
  REQUIRE_GPU();
  std::uint32_t seed = 1200;
  const Config configs[] = {gpu_config(32, 3, 32, 4, 2, MetaType::fp16), gpu_config(64, 0, 128, 2, 2, MetaType::fp8_e4m3, false),
                            gpu_config(16, 5, 64, 8, 4, MetaType::fp32)};
  for (const Config& cfg : configs) {
    for (const std::int64_t T : {std::int64_t{cfg.window - 1}, std::int64_t{3 * cfg.window + 7}}) {
      for (const std::int64_t repeat : {1, 3}) {
        const std::string what = "window " + std::to_string(cfg.window) + " T=" + std::to_string(T) + " repeat " +
                                 std::to_string(repeat);
        const std::int64_t B = 2, H = 2, more = cfg.window + 5;
        const Tensor k = randn({B, H, T, 128}, seed++, DType::f16, true), v = randn({B, H, T, 128}, seed++, DType::f16);
        cuda::DeviceCache source(cfg, B, H, 128, T + more);
        source.append(k.view(), v.view());
        cuda::DeviceCache fork(source, T + more, repeat);
        EXPECT_EQ(fork.batch(), B * repeat) << what;
        EXPECT_EQ(fork.offset(), T) << what;
        EXPECT_EQ(fork.q_end(), source.q_end()) << what;
        const SkvqCache s = source.to_host(), f = fork.to_host();
        const detail::SkvqState &ss = s.state(), &fs = f.state();
        EXPECT_EQ(fs.tokens_seen, ss.tokens_seen) << what;
        EXPECT_EQ(fs.fp16_key_bytes, ss.fp16_key_bytes * repeat) << what;
        EXPECT_EQ(fs.fp16_value_bytes, ss.fp16_value_bytes * repeat) << what;
        for (const auto side : {&detail::SkvqState::k, &detail::SkvqState::v}) {
          const detail::Side &a = ss.*side, &c = fs.*side;
          EXPECT_EQ(c.perm, a.perm) << what;
          ASSERT_EQ(c.chunks.size(), a.chunks.size()) << what;
          for (std::int64_t b = 0; b < B * repeat; ++b) {
            const std::string at = what + ", fork entry " + std::to_string(b);
            EXPECT_EQ(entry_bytes(c.tail, B * repeat, b), entry_bytes(a.tail, B, b / repeat)) << at;
            EXPECT_EQ(entry_bytes(c.sinks, B * repeat, b), entry_bytes(a.sinks, B, b / repeat)) << at;
            for (std::size_t ci = 0; ci < a.chunks.size(); ++ci) {
              EXPECT_EQ(entry_bytes(c.chunks[ci].codes, B * repeat, b), entry_bytes(a.chunks[ci].codes, B, b / repeat)) << at;
              EXPECT_EQ(entry_bytes(c.chunks[ci].lo, B * repeat, b), entry_bytes(a.chunks[ci].lo, B, b / repeat)) << at;
              EXPECT_EQ(entry_bytes(c.chunks[ci].scale, B * repeat, b), entry_bytes(a.chunks[ci].scale, B, b / repeat)) << at;
            }
          }
        }
        // each fork entry its own tokens (past a flush), the source others: each as its CPU copy goes on
        SkvqCache cpu_fork = f, cpu_source = s;
        const Tensor k2 = randn({B * repeat, H, more, 128}, seed++, DType::f16, true);
        const Tensor v2 = randn({B * repeat, H, more, 128}, seed++, DType::f16);
        const Tensor k3 = randn({B, H, more, 128}, seed++, DType::f16, true), v3 = randn({B, H, more, 128}, seed++, DType::f16);
        fork.append(k2.view(), v2.view());
        cpu_fork.append(k2.view(), v2.view());
        source.append(k3.view(), v3.view());
        cpu_source.append(k3.view(), v3.view());
        ASSERT_TRUE(fork.to_host().same_state(cpu_fork)) << what;
        ASSERT_TRUE(source.to_host().same_state(cpu_source)) << what;
        const Tensor q = randn({B * repeat, H * 4, 1, 128}, seed++, DType::f32);
        const Tensor want = attend(cpu_fork, q.view(), 0.1f, AttendOptions{Kernel::reference, 1});
        const Tensor ka = repeat_then_append(k.view(), repeat, k2.view()), va = repeat_then_append(v.view(), repeat, v2.view());
        expect_close(cpu_fork, q.view(), ka.view(), va.view(), 0.1f, fork.attend(q.view(), 0.1f).view(), want.view(), what);
      }
    }
  }
  const Config cfg = gpu_config(32, 3, 32, 2, 2, MetaType::fp16);
  cuda::DeviceCache source(cfg, 1, 2, 128, 100);
  source.append(randn({1, 2, 40, 128}, 1).view(), randn({1, 2, 40, 128}, 2).view());
  expect_error([&] { cuda::DeviceCache d(source, 100, 0); }, {"repeat=0"});
  expect_error([&] { cuda::DeviceCache d(source, 39, 2); }, {"capacity=39", "offset=40"});
  cuda::DeviceCache moved(std::move(source));
  expect_error([&] { cuda::DeviceCache d(source, 100); }, {"moved from"});
  EXPECT_EQ(cuda::DeviceCache(moved, 100, 4).batch(), 4);
}

// The GPU cache under a real model reading WikiText: a prompt in one piece (a prefill with flushes)
// and then tokens one at a time (decode steps, another flush). Each layer's new keys and values go
// to a CPU cache and to a GPU cache; the model runs on the CPU cache's attention (the reference
// kernel), and the GPU's attention of the same queries over the same rows must agree with it within
// expect_close's bound at every layer and step. At the end every layer's GPU cache holds the CPU
// cache's state bit for bit (permutations from real channel statistics, the clip search on real
// groups). Skipped where the shared data is absent.
void expect_model_matches(const std::string& name, Config cfg, std::int64_t prompt, std::int64_t tokens) {
  const std::filesystem::path data = test::shared_data();
  for (const std::filesystem::path& need : {data / name, data / "text/wikitext-test.raw.txt"}) {
    if (!std::filesystem::exists(need)) GTEST_SKIP() << "no " << need;
  }
  model::Tokenizer tok;
  const model::Model m = model::load_model((data / name).string(), "", &tok);
  std::ifstream f(data / "text/wikitext-test.raw.txt", std::ios::binary);
  std::string text(8192, '\0');
  f.read(text.data(), 8192);
  text.resize(static_cast<std::size_t>(f.gcount()));
  std::vector<int> toks = tok.encode(text.substr(3), true);  // (after the BOM)
  ASSERT_GE(toks.size(), static_cast<std::size_t>(tokens));
  toks.resize(static_cast<std::size_t>(tokens));
  const model::Runner r(m);
  const int L = m.cfg.n_layers, Hkv = m.cfg.n_kv_heads, D = m.cfg.head_dim();
  cfg.head_dim = D;
  cfg.dense_view = false;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<SkvqCache> cpu(static_cast<std::size_t>(L), SkvqCache(cfg));
  std::vector<cuda::DeviceCache> gpu;
  std::vector<Tensor> ks, vs;  // each layer's rows so far (expect_close's magnitudes)
  for (int l = 0; l < L; ++l) {
    gpu.emplace_back(cfg, 1, Hkv, D, tokens);
    ks.emplace_back(DType::f16, Shape4{1, Hkv, tokens, D});
    vs.emplace_back(DType::f16, Shape4{1, Hkv, tokens, D});
  }
  for (std::int64_t t = 0; t < tokens;) {
    const std::int64_t n = t == 0 ? prompt : 1;
    r.forward_with(std::span<const int>(toks).subspan(static_cast<std::size_t>(t), static_cast<std::size_t>(n)), t,
                   [&](int l, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
                     const auto li = static_cast<std::size_t>(l);
                     copy_into(k.view(), ks[li].view().slice_tokens(t, n));
                     copy_into(v.view(), vs[li].view().slice_tokens(t, n));
                     cpu[li].append(k.view(), v.view());
                     gpu[li].append(k.view(), v.view());
                     const Tensor want = attend(cpu[li], q.view(), scale, AttendOptions{Kernel::reference, 1});
                     const Tensor got = gpu[li].attend(q.view(), scale);
                     const std::string what = name + " layer " + std::to_string(l) + ", tokens [" + std::to_string(t) + ", " +
                                              std::to_string(t + n) + ")";
                     expect_close(cpu[li], q.view(), ks[li].view().slice_tokens(0, t + n), vs[li].view().slice_tokens(0, t + n),
                                  scale, got.view(), want.view(), what);
                     copy_into(want.view(), out.view());
                   });
    t += n;
    if (::testing::Test::HasFailure()) break;
  }
  for (int l = 0; l < L; ++l) {
    EXPECT_GT(cpu[static_cast<std::size_t>(l)].q_end(), prompt) << name << " layer " << l;  // a flush while decoding
    EXPECT_TRUE(gpu[static_cast<std::size_t>(l)].to_host().same_state(cpu[static_cast<std::size_t>(l)])) << name << " layer " << l;
  }
}

// lm128 (head dim 128, two query heads a KV head) with the default configuration (K2V2, groups of
// 32, window 128, 5 sinks, reordered, searched): 300 prompt tokens (two flushes), 200 decoded (one).
TEST(Cuda, RealModelAttentionMatchesTheCpuCache) {
  REQUIRE_GPU();
  expect_model_matches("lm128/model.bin", Config{}, 300, 500);
}

// babyllama (head dim 16, the general-shape path; two query heads a KV head): one group a row (the
// default groups of 32 exceed the row: padded), window 32, so that its 256-token context flushes
// three times in the 100-token prompt and four more while decoding.
TEST(Cuda, SmallHeadModelAttentionMatchesTheCpuCache) {
  REQUIRE_GPU();
  Config cfg;
  cfg.window = 32;
  cfg.n_sink = 4;
  expect_model_matches("babyllama/model5000.bin", cfg, 100, 250);
}

// Caches move (a model's layers in a vector): the moved-to cache is the same cache, growing the
// vector keeps every layer's state, and a moved-from one refuses calls with an error.
TEST(Cuda, MovedCachesKeepTheirState) {
  REQUIRE_GPU();
  const Config cfg = gpu_config(32, 3, 128, 2, 2, MetaType::fp16);
  std::vector<cuda::DeviceCache> layers;
  std::vector<SkvqCache> cpu;
  std::vector<Tensor> ks, vs;
  for (int l = 0; l < 5; ++l) {  // five pushes: the vector reallocates, moving the caches
    ks.push_back(randn({1, 2, 70 + l, 128}, 900 + 2 * l, DType::f16, true));
    vs.push_back(randn({1, 2, 70 + l, 128}, 901 + 2 * l));
    cpu.emplace_back(cfg);
    cpu.back().append(ks.back().view(), vs.back().view());
    cuda::DeviceCache d(cfg, 1, 2, 128, 100);
    d.append(ks.back().view(), vs.back().view());
    layers.push_back(std::move(d));
    expect_error([&] { (void)d.offset(); }, {"moved from"});
  }
  for (int l = 0; l < 5; ++l) {
    ASSERT_TRUE(layers[l].to_host().same_state(cpu[l])) << "layer " << l;
    Tensor q = randn({1, 8, 1, 128}, 950 + l, DType::f32);
    const Tensor want = attend(cpu[l], q.view(), 0.1f, AttendOptions{Kernel::reference, 1});
    expect_close(cpu[l], q.view(), ks[l].view(), vs[l].view(), 0.1f, layers[l].attend(q.view(), 0.1f).view(), want.view(),
                 "layer " + std::to_string(l));
  }
  layers[0] = std::move(layers[4]);  // frees layer 0's memory, takes layer 4's
  ASSERT_TRUE(layers[0].to_host().same_state(cpu[4]));
  expect_error([&] { layers[4].attend(randn({1, 8, 1, 128}, 1, DType::f32).view(), 0.1f); }, {"moved from"});
}

#ifdef SKVQ_TEST_CUDA_RUNTIME
// ---- streams and graphs (tests that call the CUDA runtime themselves) ----

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// Device buffers that free themselves.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) : p(cuda::device_alloc(bytes)) {}
  ~DeviceBuffer() { cuda::device_free(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

std::vector<float> download(const DeviceBuffer& b, std::size_t n) {
  std::vector<float> h(n);
  cuda::copy_to_host(h.data(), b.p, n * sizeof(float));
  return h;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A cache filled on a stream of its own (appends in several calls, some of
// them partial windows, so both the flush kernels and the tail copies run on
// it) holds the state of one filled on the legacy default stream, and its
// attention on that stream gives the same bits.
TEST(Cuda, StreamsGiveTheDefaultStreamsResults) {
  REQUIRE_GPU();
  for (const Config& cfg : {gpu_config(128, 5, 128, 2, 2, MetaType::fp16), gpu_config(64, 3, 32, 4, 4, MetaType::fp8_e4m3)}) {
    const std::int64_t B = 2, H = 2, S = 700;
    Tensor k = randn({B, H, S, 128}, 71, DType::f16, true), v = randn({B, H, S, 128}, 72, DType::f16);
    // per call, contiguous [B, H, n, D] pieces on the device
    std::vector<std::unique_ptr<DeviceBuffer>> pieces;
    std::vector<std::int64_t> counts = {300, 1, 63, 336};
    std::vector<std::pair<void*, void*>> ptrs;
    std::int64_t fed = 0;
    for (std::int64_t n : counts) {
      const Tensor kp = Tensor::copy_of(k.view().slice_tokens(fed, n), DType::f16);
      const Tensor vp = Tensor::copy_of(v.view().slice_tokens(fed, n), DType::f16);
      pieces.push_back(std::make_unique<DeviceBuffer>(kp.nbytes()));
      cuda::copy_to_device(pieces.back()->p, kp.data(), kp.nbytes());
      void* kd = pieces.back()->p;
      pieces.push_back(std::make_unique<DeviceBuffer>(vp.nbytes()));
      cuda::copy_to_device(pieces.back()->p, vp.data(), vp.nbytes());
      ptrs.emplace_back(kd, pieces.back()->p);
      fed += n;
    }
    cudaStream_t s = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cuda::DeviceCache on_default(cfg, B, H, 128, S), on_stream(cfg, B, H, 128, S);
    for (std::size_t i = 0; i < counts.size(); ++i) {
      on_default.append_device(ptrs[i].first, ptrs[i].second, counts[i]);
      on_stream.append_device(ptrs[i].first, ptrs[i].second, counts[i], s);
    }
    for (std::int64_t sq : {1, 3}) {
      const Tensor q = randn({B, 4 * H, sq, 128}, static_cast<std::uint32_t>(80 + sq), DType::f32);
      DeviceBuffer dq(q.nbytes()), out_a(q.nbytes()), out_b(q.nbytes());
      cuda::copy_to_device(dq.p, q.data(), q.nbytes());
      on_default.attend_device(dq.f(), 4 * H, sq, 0.09f, out_a.f());
      on_stream.attend_device(dq.f(), 4 * H, sq, 0.09f, out_b.f(), 0, s);
      CUDA_OK(cudaStreamSynchronize(s));
      cuda::synchronize();
      const std::size_t n = static_cast<std::size_t>(q.numel());
      EXPECT_TRUE(same_bits(download(out_a, n), download(out_b, n))) << "group " << cfg.group_size << " Sq " << sq;
    }
    EXPECT_TRUE(on_stream.to_host().same_state(on_default.to_host())) << "group " << cfg.group_size;
    cuda::release_workspace(s);
    CUDA_OK(cudaStreamDestroy(s));
  }
}

// Attention on two streams at once, each call's work overlapping the other
// stream's: every output is the one the call gives alone. Two calls sharing
// a split workspace would overwrite each other's partials.
TEST(Cuda, ConcurrentStreamsKeepTheirOwnWorkspaces) {
  REQUIRE_GPU();
  struct Job {
    std::int64_t B, H, S;
    std::unique_ptr<cuda::DeviceCache> cache;
    std::unique_ptr<DeviceBuffer> q;
    std::size_t n_out = 0;
    std::vector<float> want;
  };
  Job jobs[2] = {{1, 2, 3000, nullptr, nullptr, 0, {}}, {2, 4, 2000, nullptr, nullptr, 0, {}}};
  std::uint32_t seed = 90;
  for (Job& j : jobs) {
    const Config cfg = gpu_config(128, 5, 128, 2, 2, MetaType::fp16);
    j.cache = std::make_unique<cuda::DeviceCache>(cfg, j.B, j.H, 128, j.S);
    const Tensor k = randn({j.B, j.H, j.S, 128}, seed++, DType::f16, true), v = randn({j.B, j.H, j.S, 128}, seed++);
    j.cache->append(k.view(), v.view());
    const Tensor q = randn({j.B, 4 * j.H, 1, 128}, seed++, DType::f32);
    j.q = std::make_unique<DeviceBuffer>(q.nbytes());
    cuda::copy_to_device(j.q->p, q.data(), q.nbytes());
    j.n_out = static_cast<std::size_t>(q.numel());
    DeviceBuffer out(q.nbytes());
    j.cache->attend_device(j.q->f(), 4 * j.H, 1, 0.09f, out.f());
    cuda::synchronize();
    j.want = download(out, j.n_out);
  }
  cudaStream_t streams[2];
  for (cudaStream_t& s : streams) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr int kRounds = 16;
  std::vector<std::unique_ptr<DeviceBuffer>> outs[2];
  for (int r = 0; r < kRounds; ++r)
    for (int i = 0; i < 2; ++i) {
      outs[i].push_back(std::make_unique<DeviceBuffer>(jobs[i].n_out * sizeof(float)));
      jobs[i].cache->attend_device(jobs[i].q->f(), 4 * jobs[i].H, 1, 0.09f, outs[i].back()->f(), 0, streams[i]);
    }
  for (cudaStream_t s : streams) CUDA_OK(cudaStreamSynchronize(s));
  for (int i = 0; i < 2; ++i)
    for (int r = 0; r < kRounds; ++r) EXPECT_TRUE(same_bits(download(*outs[i][r], jobs[i].n_out), jobs[i].want)) << i << " " << r;
  for (cudaStream_t s : streams) {
    cuda::release_workspace(s);
    CUDA_OK(cudaStreamDestroy(s));
  }
}

// An attention call captured into a CUDA graph replays to the call's own
// bits; a capture on a stream whose workspace is too small is refused with
// an error that says what to do, and the stream works normally afterwards.
TEST(Cuda, AttentionCapturedInAGraphReplaysTheCall) {
  REQUIRE_GPU();
  const Config cfg = gpu_config(128, 5, 32, 2, 2, MetaType::fp16);
  const std::int64_t B = 1, H = 2, S = 1500;
  cuda::DeviceCache c(cfg, B, H, 128, S);
  c.append(randn({B, H, S, 128}, 95, DType::f16, true).view(), randn({B, H, S, 128}, 96).view());
  const Tensor q = randn({B, 4 * H, 1, 128}, 97, DType::f32);
  DeviceBuffer dq(q.nbytes()), want_d(q.nbytes()), got_d(q.nbytes());
  cuda::copy_to_device(dq.p, q.data(), q.nbytes());
  const std::size_t n = static_cast<std::size_t>(q.numel());
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  c.attend_device(dq.f(), 4 * H, 1, 0.09f, want_d.f(), 0, s);  // sizes the stream's workspace
  CUDA_OK(cudaStreamSynchronize(s));
  const std::vector<float> want = download(want_d, n);

  // One attention call on `st` captured into an executable graph (the graph itself is not needed after).
  const auto capture = [&](cudaStream_t st) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    c.attend_device(dq.f(), 4 * H, 1, 0.09f, got_d.f(), 0, st);
    EXPECT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    return exec;
  };
  // A replay into a NaN-poisoned output (every element must be written again) gives the call's bits.
  const auto replay_matches = [&](cudaGraphExec_t exec, cudaStream_t st) {
    EXPECT_EQ(cudaMemsetAsync(got_d.p, 0xFF, n * sizeof(float), st), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    return same_bits(download(got_d, n), want);
  };
  cudaGraphExec_t exec = capture(s);
  for (int rep = 0; rep < 3; ++rep) EXPECT_TRUE(replay_matches(exec, s)) << "replay " << rep;
  CUDA_OK(cudaGraphExecDestroy(exec));

  // a stream without a workspace (a new stream may reuse a destroyed one's handle: released first):
  // capturing its first call is refused before anything is enqueued
  cudaStream_t fresh = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking));
  cuda::release_workspace(fresh);
  CUDA_OK(cudaStreamBeginCapture(fresh, cudaStreamCaptureModeGlobal));
  expect_error([&] { c.attend_device(dq.f(), 4 * H, 1, 0.09f, got_d.f(), 0, fresh); }, {"workspace", "capture"});
  cudaGraph_t empty = nullptr;
  CUDA_OK(cudaStreamEndCapture(fresh, &empty));
  if (empty != nullptr) {
    std::size_t nodes = 1;
    CUDA_OK(cudaGraphGetNodes(empty, nullptr, &nodes));
    EXPECT_EQ(nodes, 0u);
    CUDA_OK(cudaGraphDestroy(empty));
  }
  c.attend_device(dq.f(), 4 * H, 1, 0.09f, got_d.f(), 0, fresh);
  CUDA_OK(cudaStreamSynchronize(fresh));
  EXPECT_TRUE(same_bits(download(got_d, n), want));
  // a captured buffer outlives its release (the graph may be replayed): replays after it still give the call's bits
  exec = capture(fresh);
  cuda::release_workspace(fresh);
  EXPECT_TRUE(replay_matches(exec, fresh)) << "replay after release";
  CUDA_OK(cudaGraphExecDestroy(exec));
  for (cudaStream_t x : {fresh, s}) {
    cuda::release_workspace(x);
    CUDA_OK(cudaStreamDestroy(x));
  }
}

// A cache lives on the device that was current when it was made (a fork: on its source's), and
// every call runs there whatever device is current, leaving the current device as it found it: with
// two GPUs, a cache on device 1 called with device 0 current, through host tensors (its own staging
// sets: device_cache.cu), through device tensors, into the chunk kernel (its shared memory raised on
// each device: common.cuh), forked, and downloaded, gives the CPU cache's state and the attention a
// cache on device 0 gives; then the cache on device 0 called with device 1 current. With one GPU the
// same calls run on device 0 (the second device's part is left out).
TEST(Cuda, CachesLiveOnTheirDevice) {
  REQUIRE_GPU();
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  const int other = n >= 2 ? 1 : 0;
  const auto current = [] {
    int dev = -1;
    EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
    return dev;
  };
  const Config cfg = gpu_config(64, 4, 32, 2, 2, MetaType::fp16);
  const std::int64_t B = 2, H = 4, T = 300, T0 = 100, cap = T + 64;
  // T tokens, then 40 more at the end
  const Tensor k_all = randn({B, H, T + 40, 128}, 71, DType::f16, true), v_all = randn({B, H, T + 40, 128}, 72, DType::f16);
  const Tensor k = Tensor::copy_of(k_all.view().slice_tokens(0, T), DType::f16);
  const Tensor v = Tensor::copy_of(v_all.view().slice_tokens(0, T), DType::f16);
  const Tensor k1 = Tensor::copy_of(k.view().slice_tokens(T0, T - T0), DType::f16);
  const Tensor v1 = Tensor::copy_of(v.view().slice_tokens(T0, T - T0), DType::f16);
  SkvqCache cpu(cfg);
  cpu.append(k.view(), v.view());
  CUDA_OK(cudaSetDevice(other));
  EXPECT_TRUE(cuda::available());  // (about the current device)
  const std::string named = "(device " + std::to_string(other) + " of " + std::to_string(n) + ")";
  EXPECT_NE(cuda::device_description().find(named), std::string::npos) << cuda::device_description();
  std::optional<cuda::DeviceCache> there(std::in_place, cfg, B, H, 128, cap);
  EXPECT_EQ(there->device(), other);
  {
    const DeviceBytes dk(k1), dv(v1);  // on `other`
    CUDA_OK(cudaSetDevice(0));
    there->append(k.view().slice_tokens(0, T0), v.view().slice_tokens(0, T0));
    EXPECT_EQ(current(), 0);
    there->append_device(dk.p, dv.p, T - T0);
    EXPECT_EQ(current(), 0);
    ASSERT_TRUE(there->to_host().same_state(cpu));
    EXPECT_EQ(current(), 0);
    CUDA_OK(cudaSetDevice(other));  // (dk, dv freed on their device)
  }
  CUDA_OK(cudaSetDevice(0));
  cuda::DeviceCache here(cfg, B, H, 128, cap);
  EXPECT_EQ(here.device(), 0);
  here.append(k.view(), v.view());
  for (std::int64_t sq : {std::int64_t{1}, std::int64_t{100}}) {  // (100 rows: the chunk kernel)
    const std::string what = "Sq=" + std::to_string(sq);
    const Tensor q = randn({B, 4 * H, sq, 128}, static_cast<std::uint32_t>(73 + sq), DType::f32);
    const Tensor want = here.attend(q.view(), 0.1f);
    const Tensor got = there->attend(q.view(), 0.1f);
    EXPECT_EQ(current(), 0) << what;
    EXPECT_LT(rel_l2(got.view(), want.view()), 1e-6) << what;
    Tensor on_device(DType::f32, got.shape());
    CUDA_OK(cudaSetDevice(other));
    {
      const DeviceBytes dq(q), dout(got.nbytes(), 0);
      CUDA_OK(cudaSetDevice(0));
      there->attend_device(static_cast<const float*>(dq.p), 4 * H, sq, 0.1f, static_cast<float*>(dout.p));
      EXPECT_EQ(current(), 0) << what;
      CUDA_OK(cudaSetDevice(other));
      cuda::copy_to_host(on_device.data(), dout.p, on_device.nbytes());
    }
    CUDA_OK(cudaSetDevice(0));
    EXPECT_LT(rel_l2(on_device.view(), want.view()), 1e-6) << what;
  }
  {
    const cuda::DeviceCache fork(*there, cap);  // made with device 0 current: on `there`'s device
    EXPECT_EQ(fork.device(), other);
    EXPECT_EQ(current(), 0);
    ASSERT_TRUE(fork.to_host().same_state(cpu));
    const Tensor q = randn({B, 4 * H, 1, 128}, 79, DType::f32);
    const Tensor got = fork.attend(q.view(), 0.1f);
    EXPECT_EQ(current(), 0);
    EXPECT_LT(rel_l2(got.view(), here.attend(q.view(), 0.1f).view()), 1e-6);
  }
  there.reset();  // freed on its device with device 0 current
  EXPECT_EQ(current(), 0);
  // the cache on device 0, called with the other device current
  CUDA_OK(cudaSetDevice(other));
  here.append(k_all.view().slice_tokens(T, 40), v_all.view().slice_tokens(T, 40));
  cpu.append(k_all.view().slice_tokens(T, 40), v_all.view().slice_tokens(T, 40));
  EXPECT_EQ(current(), other);
  ASSERT_TRUE(here.to_host().same_state(cpu));
  EXPECT_EQ(current(), other);
  const Tensor q = randn({B, 4 * H, 1, 128}, 83, DType::f32);
  const Tensor got = here.attend(q.view(), 0.1f);
  EXPECT_EQ(current(), other);
  const Tensor want = attend(cpu, q.view(), 0.1f, AttendOptions{Kernel::reference, 0});
  const Tensor kc = Tensor::copy_of(k_all.view(), DType::f32), vc = Tensor::copy_of(v_all.view(), DType::f32);
  expect_close(cpu, q.view(), kc.view(), vc.view(), 0.1f, got.view(), want.view(), "called with the other device current");
  CUDA_OK(cudaSetDevice(0));
  if (n < 2) std::printf("(one GPU: every cache of this test lived on device 0)\n");
}
#endif  // SKVQ_TEST_CUDA_RUNTIME

}  // namespace
}  // namespace skvq::test
