// Layer cache behaviour beyond the spec's listed cases: path independence,
// bit-exactness with an independent oracle of the spec, packed-only mode,
// validation (every rejected call leaves the cache as it was), non-finite
// safety and the prompt cache.
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace skvq::test {
namespace {

// An independent, deliberately plain transcription of spec sections 3-4 for
// float32 metadata: whole stream in, dense float32 history out.
std::vector<float> oracle(const TensorView& x, const Config& cfg, int bits) {
  const std::int64_t B = x.shape[0], H = x.shape[1], S = x.shape[2], D = x.shape[3];
  const std::int64_t r = cfg.window, q_end = r * (S / r);
  const int g = cfg.group_size;
  const std::int64_t G = (D + g - 1) / g;
  std::vector<float> out(static_cast<std::size_t>(B * H * S * D));
  auto at = [&](std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) -> float& {
    return out[static_cast<std::size_t>(((b * H + h) * S + t) * D + d)];
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < S; ++t)
        for (std::int64_t d = 0; d < D; ++d) at(b, h, t, d) = x.at(b, h, t, d);
  if (q_end == 0) return out;
  std::vector<std::vector<int>> perm(static_cast<std::size_t>(H));
  for (std::int64_t h = 0; h < H; ++h) {
    std::vector<float> range(static_cast<std::size_t>(D));
    for (std::int64_t d = 0; d < D; ++d) {
      float mn = x.at(0, h, 0, d), mx = mn;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < r; ++t) {
          mn = std::min(mn, x.at(b, h, t, d));
          mx = std::max(mx, x.at(b, h, t, d));
        }
      range[static_cast<std::size_t>(d)] = mx - mn;
    }
    auto& p = perm[static_cast<std::size_t>(h)];
    p.resize(static_cast<std::size_t>(D));
    std::iota(p.begin(), p.end(), 0);
    if (cfg.reorder) std::stable_sort(p.begin(), p.end(), [&](int a, int c) { return range[a] < range[c]; });
  }
  const std::vector<float> grid = cfg.clip_grid();
  const float levels = static_cast<float>((1 << bits) - 1);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < q_end; ++t) {
        if (t < cfg.n_sink) continue;
        const auto& p = perm[static_cast<std::size_t>(h)];
        std::vector<float> xp(static_cast<std::size_t>(G * g));
        for (std::int64_t j = 0; j < G * g; ++j) xp[static_cast<std::size_t>(j)] = x.at(b, h, t, p[static_cast<std::size_t>(std::min(j, D - 1))]);
        for (std::int64_t k = 0; k < G; ++k) {
          const float* gx = xp.data() + k * g;
          const float gmin = *std::min_element(gx, gx + g), gmax = *std::max_element(gx, gx + g);
          const float mid = (gmax + gmin) * 0.5f, rng = gmax - gmin;
          float best = INFINITY, blo = 0, bsc = 0;
          for (float a : grid) {
            const float tt = a * rng;
            const float lo = mid - tt * 0.5f;
            const float sc = std::max(tt / levels, 1e-8f);
            float err = 0;
            for (int s = 0; s < g; ++s) {
              const float code = std::clamp(std::nearbyint((gx[s] - lo) / sc), 0.0f, levels);
              const float rec = code * sc + lo;
              err += (rec - gx[s]) * (rec - gx[s]);
            }
            err *= 1.0f / static_cast<float>(g);
            if (err < best) {
              best = err;
              blo = lo;
              bsc = sc;
            }
          }
          for (int s = 0; s < g && k * g + s < D; ++s) {
            const float code = std::clamp(std::nearbyint((gx[s] - blo) / bsc), 0.0f, levels);
            at(b, h, t, p[static_cast<std::size_t>(k * g + s)]) = code * bsc + blo;
          }
        }
      }
  return out;
}

bool matches_oracle(const TensorView& got, const std::vector<float>& want) {
  const auto& s = got.shape;
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t h = 0; h < s[1]; ++h)
      for (std::int64_t t = 0; t < s[2]; ++t)
        for (std::int64_t d = 0; d < s[3]; ++d) {
          std::byte buf[4];
          store_from_f32(buf, got.dtype, want[static_cast<std::size_t>(((b * s[1] + h) * s[2] + t) * s[3] + d)]);
          if (std::memcmp(buf, got.ptr(b, h, t, d), dtype_size(got.dtype)) != 0) {
            ADD_FAILURE() << "first mismatch at [" << b << ", " << h << ", " << t << ", " << d << "]: got "
                          << got.at(b, h, t, d) << " want " << load_as_f32(buf, got.dtype);
            return false;
          }
        }
  return true;
}

// A layout's config with float32 metadata, where the cache must match the oracle bit for bit.
Config oracle_config(std::int64_t head_dim, int window, int n_sink, int group, int bits_key, int bits_value) {
  Config cfg;
  cfg.head_dim = static_cast<int>(head_dim);
  cfg.window = window;
  cfg.n_sink = n_sink;
  cfg.group_size = group;
  cfg.bits_key = bits_key;
  cfg.bits_value = bits_value;
  cfg.metadata = MetaType::fp32;
  return cfg;
}

TEST(Cache, Fp32MetadataIsBitExactWithSpecOracle) {
  struct Case {
    Shape4 shape;
    int window, n_sink, group, bk, bv;
    bool reorder, search;
    DType dtype;
  };
  const Case cases[] = {
      {{1, 2, 53, 64}, 16, 4, 16, 2, 2, true, true, DType::f16},
      {{2, 3, 100, 10}, 8, 0, 4, 4, 3, true, true, DType::f32},
      {{1, 1, 64, 96}, 32, 5, 32, 1, 8, false, true, DType::bf16},
      {{3, 2, 47, 128}, 16, 15, 128, 3, 2, true, false, DType::f16},
      {{1, 4, 33, 64}, 2, 1, 7, 5, 6, true, true, DType::f32},
  };
  for (const auto& c : cases) {
    Config cfg = oracle_config(c.shape[3], c.window, c.n_sink, c.group, c.bk, c.bv);
    cfg.reorder = c.reorder;
    cfg.clip_search = c.search;
    cfg.clip_alpha = 0.93f;
    Tensor k = randn(c.shape, 300 + static_cast<std::uint32_t>(c.window), c.dtype, true);
    Tensor v = randn(c.shape, 400 + static_cast<std::uint32_t>(c.window), c.dtype, false);
    SkvqCache cache(cfg);
    auto [ko, vo] = cache.update_and_fetch(k.view(), v.view());
    EXPECT_TRUE(matches_oracle(ko, oracle(k.view(), cfg, c.bk))) << "keys, window " << c.window;
    EXPECT_TRUE(matches_oracle(vo, oracle(v.view(), cfg, c.bv))) << "values, window " << c.window;
  }
}

// The flush cuts each head's rows into blocks of whole bytes of its code
// stream (8 rows) and runs them on the pool's threads. Every thread count must
// give the spec oracle's history and the same store: rows whose codes do not
// end on a byte (D * bits not a multiple of 8), heads cut into several blocks
// (long windows, few heads), a last block shorter than the others, both
// quantizer kernels, and more threads than CPUs.
TEST(Cache, EveryThreadCountGivesTheSameStore) {
  struct Case {
    Shape4 shape;
    int window, n_sink, group, bk, bv;
  };
  const Case cases[] = {
      {{1, 1, 530, 10}, 200, 5, 4, 3, 5},  // one head, 195 rows in chunk 0: several blocks, 30-bit rows
      {{1, 3, 300, 7}, 97, 0, 3, 5, 1},    // 35- and 7-bit rows, a window of 97
      {{2, 2, 270, 64}, 64, 3, 16, 2, 4},
      {{1, 2, 40, 33}, 9, 1, 33, 7, 6},    // 8 rows in chunk 0, 9 after: blocks of one byte-aligned run
  };
  for (const auto& c : cases) {
    const Config cfg = oracle_config(c.shape[3], c.window, c.n_sink, c.group, c.bk, c.bv);
    Tensor k = randn(c.shape, 610 + static_cast<std::uint32_t>(c.window), DType::f32, true);
    Tensor v = randn(c.shape, 620 + static_cast<std::uint32_t>(c.window), DType::f32, false);
    for (Kernel kernel : {Kernel::simd, Kernel::reference}) {
      SkvqCache one(cfg);
      one.set_kernel(kernel);
      one.set_num_threads(1);
      auto [ko, vo] = one.update_and_fetch(k.view(), v.view());
      EXPECT_TRUE(matches_oracle(ko, oracle(k.view(), cfg, c.bk))) << "keys, window " << c.window;
      EXPECT_TRUE(matches_oracle(vo, oracle(v.view(), cfg, c.bv))) << "values, window " << c.window;
      for (int threads : {0, 2, 3, 64, 0, 2, 0, 2}) {  // repeated: a race shows only now and then
        SkvqCache many(cfg);
        many.set_kernel(kernel);
        many.set_num_threads(threads);
        EXPECT_EQ(many.num_threads(), threads);
        auto [km, vm] = many.update_and_fetch(k.view(), v.view());
        ASSERT_TRUE(many.same_state(one)) << "window " << c.window << ", " << threads << " threads";
        EXPECT_TRUE(bits_equal(km, ko)) << "window " << c.window << ", " << threads << " threads";
        EXPECT_TRUE(bits_equal(vm, vo)) << "window " << c.window << ", " << threads << " threads";
        Tensor kf(DType::f32, k.view().shape), vf(DType::f32, v.view().shape);
        many.fetch_into(kf.view(), vf.view());
        EXPECT_TRUE(bits_equal(kf.view(), ko)) << "fetch_into, " << threads << " threads";
      }
    }
  }
}

TEST(Cache, ThreadCountIsCheckedAndKeptByCopies) {
  SkvqCache c(spec_config());
  c.set_num_threads(3);
  expect_error([&] { c.set_num_threads(-1); }, {"set_num_threads(-1)", ">= 0"});
  EXPECT_EQ(c.num_threads(), 3);
  const SkvqCache copy(c);
  EXPECT_EQ(copy.num_threads(), 3);
  EXPECT_EQ(dynamic_cast<const SkvqCache&>(*c.clone()).num_threads(), 3);
  EXPECT_EQ(SkvqCache(spec_config()).num_threads(), 0);
}

TEST(Cache, PathIndependenceOverRandomSplits) {
  Config cfg = spec_config();
  cfg.group_size = 24;
  const Shape4 shape{2, 2, 150, 64};
  Tensor k = randn(shape, 500, DType::bf16, true), v = randn({2, 2, 150, 64}, 501, DType::bf16, true);
  SkvqCache whole(cfg);
  auto [kw, vw] = whole.update_and_fetch(k.view(), v.view());
  std::mt19937 rng(502);
  for (int trial = 0; trial < 25; ++trial) {
    SkvqCache c(cfg);
    std::pair<TensorView, TensorView> last;
    for (std::int64_t t = 0; t < 150;) {
      const std::int64_t n = std::min<std::int64_t>(150 - t, 1 + rng() % (trial % 2 ? 40 : 5));
      last = c.update_and_fetch(k.view().slice_tokens(t, n), v.view().slice_tokens(t, n));
      t += n;
    }
    ASSERT_TRUE(bits_equal(last.first, kw)) << "trial " << trial;
    ASSERT_TRUE(bits_equal(last.second, vw)) << "trial " << trial;
    ASSERT_TRUE(c.same_state(whole)) << "trial " << trial;
  }
}

TEST(Cache, PackedOnlyModeHoldsNoDenseCopy) {
  for (MetaType meta : {MetaType::fp16, MetaType::fp32, MetaType::fp8_e4m3}) {
    Config dense = spec_config(), packed = spec_config();
    dense.metadata = packed.metadata = meta;
    packed.dense_view = false;
    Tensor k = randn({1, 2, 77, 64}, 600), v = randn({1, 2, 77, 48}, 601);
    SkvqCache a(dense), b(packed);
    auto [ka, va] = a.update_and_fetch(k.view(), v.view());
    const SkvqCache before = b;
    EXPECT_THROW(b.update_and_fetch(k.view(), v.view()), Error);
    EXPECT_TRUE(b.same_state(before));
    b.append(k.view().slice_tokens(0, 30), v.view().slice_tokens(0, 30));
    b.append(k.view().slice_tokens(30, 47), v.view().slice_tokens(30, 47));
    Tensor kb(DType::f16, {1, 2, 77, 64}), vb(DType::f16, {1, 2, 77, 48});
    b.fetch_into(kb.view(), vb.view());
    EXPECT_TRUE(bits_equal(kb.view(), ka));
    EXPECT_TRUE(bits_equal(vb.view(), va));
    Tensor kf(DType::f32, {1, 2, 77, 64}), vf(DType::f32, {1, 2, 77, 48});
    b.fetch_into(kf.view(), vf.view());  // any output dtype
    // float32 output carries the reconstruction unrounded; rounding it gives the fp16 view
    EXPECT_EQ(f32_to_f16(kf.view().at(0, 1, 50, 3)), f32_to_f16(ka.at(0, 1, 50, 3)));
    EXPECT_TRUE(bits_equal(Tensor::copy_of(kf.view(), DType::f16).view(), ka));
    EXPECT_EQ(b.stored_bytes().dense_view, 0);
    EXPECT_GT(a.stored_bytes().dense_view, 0);
    // values use their own head dim in the accounting
    const Accounting acc = b.accounting();
    EXPECT_EQ(acc.fp16_value_bytes, 1 * 2 * 77 * 48 * 2);
    const StoredBytes s = b.stored_bytes();
    EXPECT_EQ(s.codes + s.metadata, acc.compressed_key_bytes + acc.compressed_value_bytes);
    Tensor bad(DType::f16, {1, 2, 76, 64});
    EXPECT_THROW(b.fetch_into(bad.view(), vb.view()), Error);
  }
}

TEST(Cache, StoredBytesEqualAccountedBytes) {
  for (int bits : {1, 2, 3, 5, 8}) {
    Config cfg = spec_config();
    cfg.bits_key = bits;
    cfg.bits_value = 9 - bits;
    cfg.head_dim = 10;
    cfg.group_size = 3;
    cfg.dense_view = false;
    SkvqCache c(cfg);
    Tensor k = randn({2, 3, 100, 10}, 700), v = randn({2, 3, 100, 10}, 701);
    c.append(k.view(), v.view());
    const Accounting a = c.accounting();
    const StoredBytes s = c.stored_bytes();
    EXPECT_EQ(s.codes + s.metadata, a.compressed_key_bytes + a.compressed_value_bytes);
    const std::int64_t nq0 = 16 - 4;
    const auto cbytes = [](std::int64_t n, std::int64_t d, int b, int g) {
      return (n * d * b + 7) / 8 + n * ((d + g - 1) / g) * 2 * 2;
    };
    EXPECT_EQ(a.compressed_key_bytes, (cbytes(nq0, 10, bits, 3) + 5 * cbytes(16, 10, bits, 3)) * 6);
    EXPECT_EQ(s.sinks, 2 * 2 * 3 * 4 * 10 * 2);
    EXPECT_EQ(s.tail, 2 * 2 * 3 * 16 * 10 * 2);
  }
}

TEST(Cache, NonContiguousInputEqualsContiguous) {
  // Keys stored [B, S, H, D] and viewed as [B, H, S, D].
  const std::int64_t B = 2, H = 3, S = 40, D = 64;
  Tensor bshd = randn({B, S, H, D}, 800);
  TensorView kv = bshd.view();
  kv.shape = {B, H, S, D};
  kv.strides = {S * H * D, D, H * D, 1};
  const Tensor kc = Tensor::copy_of(kv);
  Tensor v = randn({B, H, S, D}, 801);
  SkvqCache a(spec_config()), b(spec_config());
  auto [ka, va] = a.update_and_fetch(kv, v.view());
  auto [kb, vb] = b.update_and_fetch(kc.view(), v.view());
  EXPECT_TRUE(bits_equal(ka, kb));
  EXPECT_TRUE(a.same_state(b));
}

// Whole windows of one call are quantized straight from the caller's tensor (one job for all of
// them, skvq_cache.cpp flush_windows), other rows through the tail: inputs whose channels are not
// adjacent (stored [B, H, D, S]), in calls that mix whole windows with partial ones, give the state
// and history of the same rows fed contiguous one token a call, with the dense view and without,
// on one thread and on all.
TEST(Cache, WholeWindowsFromStridedInputAsTokenByToken) {
  const std::int64_t B = 2, H = 3, S = 5 * 16 + 7, D = 64;
  Tensor store = randn({B, H, D, S}, 810, DType::f32, true), vstore = randn({B, H, D, S}, 811, DType::f32);
  const auto transposed = [&](Tensor& t) {
    TensorView x = t.view();
    x.shape = {B, H, S, D};
    x.strides = {H * D * S, D * S, 1, S};
    return x;
  };
  const TensorView k = transposed(store), v = transposed(vstore);
  const Tensor kc = Tensor::copy_of(k), vc = Tensor::copy_of(v);
  for (bool dense : {true, false})
    for (int threads : {1, 0}) {
      Config cfg = spec_config();
      cfg.dense_view = dense;
      SkvqCache one_call(cfg), mixed(cfg), by_token(cfg);
      one_call.set_num_threads(threads);
      mixed.set_num_threads(threads);
      // (update_and_fetch with the dense view: its returned history is the dense view itself)
      const auto feed = [&](SkvqCache& c, const TensorView& x, const TensorView& y) {
        if (dense) return c.update_and_fetch(x, y);
        c.append(x, y);
        return std::pair<TensorView, TensorView>{};
      };
      const auto [k1, v1] = feed(one_call, k, v);
      std::pair<TensorView, TensorView> mixed_history, token_history;
      // 3 rows; then 13 to fill the window, 2 whole windows and 3 rows; then 13, 1 whole window and 7
      for (std::int64_t t = 0; t < S;) {
        const std::int64_t n = t == 0 ? 3 : (t == 3 ? 48 : S - t);
        mixed_history = feed(mixed, k.slice_tokens(t, n), v.slice_tokens(t, n));
        t += n;
      }
      for (std::int64_t t = 0; t < S; ++t) token_history = feed(by_token, kc.view().slice_tokens(t, 1), vc.view().slice_tokens(t, 1));
      const std::string what = std::string(dense ? "dense view" : "packed only") + ", threads " + std::to_string(threads);
      EXPECT_TRUE(one_call.same_state(by_token)) << what;
      EXPECT_TRUE(mixed.same_state(by_token)) << what;
      if (dense) {
        EXPECT_TRUE(bits_equal(k1, token_history.first) && bits_equal(v1, token_history.second)) << what;
        EXPECT_TRUE(bits_equal(mixed_history.first, token_history.first)) << what;
        EXPECT_TRUE(bits_equal(mixed_history.second, token_history.second)) << what;
      }
    }
}

void expect_rejected(SkvqCache& c, const TensorView& k, const TensorView& v, const std::string& needle) {
  const SkvqCache before = c;
  try {
    c.update_and_fetch(k, v);
    ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_TRUE(c.same_state(before)) << needle;
}

TEST(Cache, RejectedCallsLeaveStateUnchanged) {
  SkvqCache c(spec_config());
  Tensor k = randn({1, 2, 20, 64}, 900), v = randn({1, 2, 20, 64}, 901);
  c.update_and_fetch(k.view(), v.view());
  Tensor k32 = randn({1, 2, 3, 32}, 902), kB = randn({2, 2, 3, 64}, 903), kH = randn({1, 3, 3, 64}, 904);
  Tensor v3 = randn({1, 2, 3, 64}, 905), vD = randn({1, 2, 3, 48}, 906), vS = randn({1, 2, 4, 64}, 907);
  Tensor kf32 = randn({1, 2, 3, 64}, 908, DType::f32), vf32 = randn({1, 2, 3, 64}, 909, DType::f32);
  expect_rejected(c, k32.view(), v3.view(), "head_dim=64");
  expect_rejected(c, kB.view(), randn({2, 2, 3, 64}, 1).view(), "[B, H]");
  expect_rejected(c, kH.view(), randn({1, 3, 3, 64}, 2).view(), "[B, H]");
  expect_rejected(c, v3.view(), vD.view(), "Dv=48");
  expect_rejected(c, v3.view(), vS.view(), "does not match keys shape");
  expect_rejected(c, kf32.view(), vf32.view(), "dtype float32 differs");
  expect_rejected(c, v3.view(), vf32.view(), "differ");
  // Non-finite values anywhere, even late in the call, are named by position.
  Tensor bad = randn({1, 2, 30, 64}, 910);
  bad.view().set(0, 1, 17, 5, NAN);
  Tensor good = randn({1, 2, 30, 64}, 911);
  expect_rejected(c, bad.view(), good.view(), "keys[0, 1, 17, 5] = nan is not finite");
  bad.view().set(0, 1, 17, 5, 1.0f);
  Tensor inf = randn({1, 2, 30, 64}, 912);
  inf.view().set(0, 0, 29, 63, -INFINITY);
  expect_rejected(c, bad.view(), inf.view(), "values[0, 0, 29, 63] = -inf");
  TensorView null = good.view();
  null.data = nullptr;
  expect_rejected(c, null, good.view(), "null");
  TensorView empty = good.view();
  empty.shape[2] = 0;
  expect_rejected(c, empty, empty, "extent >= 1");
  // and the cache still works afterwards
  c.update_and_fetch(bad.view(), good.view());
  EXPECT_EQ(c.offset(), 50);
}

// Long appends are checked in ranges of heads on the pool's threads: the error
// must still name the first bad element in [b, h, t, d] order, whatever the
// thread count.
TEST(Cache, ParallelInputCheckNamesTheFirstBadValue) {
  Config cfg = spec_config();
  cfg.metadata = MetaType::fp8_e4m3;  // |x| <= 448
  const Shape4 shape{2, 3, 1100, 64};  // over detail::kParallelElements a tensor
  ASSERT_GE(shape[0] * shape[1] * shape[2] * shape[3], detail::kParallelElements);
  Tensor good = randn(shape, 930), bad = randn(shape, 931);
  bad.view().set(1, 2, 3, 4, NAN);      // late head, early row
  bad.view().set(1, 0, 1099, 63, 500);  // earlier head, its last element: the one to name
  bad.view().set(1, 1, 0, 0, -INFINITY);
  for (int threads : {1, 2, 0}) {
    SkvqCache c(cfg);
    c.set_num_threads(threads);
    c.update_and_fetch(good.view().slice_tokens(0, 20), good.view().slice_tokens(0, 20));
    expect_rejected(c, good.view(), bad.view(), "values[1, 0, 1099, 63] = 500 is outside the range of fp8_e4m3");
    expect_rejected(c, bad.view(), good.view(), "keys[1, 0, 1099, 63]");
    c.update_and_fetch(good.view(), good.view());  // and the cache still works afterwards
    EXPECT_EQ(c.offset(), 1120);
  }
  // One head: its rows are cut into several ranges where there are two threads or more
  // (ThreadPool::parallel_rows); a bad value late in the rows must not hide an earlier one.
  const Shape4 one{1, 1, 5000, 64};
  ASSERT_GE(one[2] * one[3], detail::kParallelElements);
  Tensor good1 = randn(one, 932), bad1 = randn(one, 933);
  bad1.view().set(0, 0, 4900, 1, NAN);
  bad1.view().set(0, 0, 1300, 2, -600);
  bad1.view().set(0, 0, 1300, 9, NAN);
  for (int threads : {1, 2, 0}) {
    SkvqCache c(cfg);
    c.set_num_threads(threads);
    expect_rejected(c, good1.view(), bad1.view(), "values[0, 0, 1300, 2] = -600 is outside the range of fp8_e4m3");
    c.update_and_fetch(good1.view(), good1.view());
    EXPECT_EQ(c.offset(), 5000);
  }
}

TEST(Cache, ValuesBeyondMetadataRangeAreRejected) {
  Config cfg = spec_config();
  SkvqCache c16(cfg);
  Tensor k = randn({1, 2, 20, 64}, 1000, DType::f32), v = randn({1, 2, 20, 64}, 1001, DType::f32);
  k.view().set(0, 0, 3, 9, 70000.0f);
  expect_rejected(c16, k.view(), v.view(), "keys[0, 0, 3, 9] = 70000 is outside the range of fp16 metadata");
  cfg.metadata = MetaType::fp8_e4m3;
  SkvqCache c8(cfg);
  k.view().set(0, 0, 3, 9, 500.0f);
  expect_rejected(c8, k.view(), v.view(), "fp8_e4m3");
  cfg.metadata = MetaType::fp32;
  SkvqCache c32(cfg);
  k.view().set(0, 0, 3, 9, 3e38f);
  expect_rejected(c32, k.view(), v.view(), "float32 range");
  k.view().set(0, 0, 3, 9, 1e30f);  // large but representable: accepted, finite output
  auto [ko, vo] = c32.update_and_fetch(k.view(), v.view());
  for (std::int64_t t = 0; t < 20; ++t)
    for (std::int64_t d = 0; d < 64; ++d) ASSERT_TRUE(std::isfinite(ko.at(0, 0, t, d)));
}

TEST(Cache, ReducedMetadataNeverReconstructsNonFinite) {
  for (MetaType meta : {MetaType::fp16, MetaType::fp8_e4m3}) {
    const float big = meta == MetaType::fp16 ? 65504.0f : 448.0f;
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      Config cfg = spec_config();
      cfg.metadata = meta;
      cfg.bits_key = 1;
      cfg.bits_value = 8;
      SkvqCache c(cfg);
      Tensor k(dt, {1, 2, 48, 64}), v(dt, {1, 2, 48, 64});
      Normal rng(1100);
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t t = 0; t < 48; ++t)
          for (std::int64_t d = 0; d < 64; ++d) {
            float x = 0;
            switch (t % 4) {
              case 0: x = (d % 2 ? big : -big); break;              // widest range
              case 1: x = 3.0f; break;                              // constant
              case 2: x = 1.0f + rng() * 1e-6f; break;              // tiny range
              case 3: x = rng() * 1e-30f; break;                    // subnormal-ish
            }
            if (dt == DType::bf16 && std::fabs(x) > 65000.0f) x = std::copysign(65280.0f, x);  // bf16 below fp16 max
            k.view().set(0, h, t, d, x);
            v.view().set(0, h, t, d, x);
          }
      auto [ko, vo] = c.update_and_fetch(k.view(), v.view());
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t t = 0; t < 48; ++t)
          for (std::int64_t d = 0; d < 64; ++d) {
            ASSERT_TRUE(std::isfinite(ko.at(0, h, t, d)) && std::isfinite(vo.at(0, h, t, d)));
            if (t % 4 == 1) {
              ASSERT_EQ(vo.at(0, h, t, d), 3.0f);  // constant groups are exact
            }
          }
    }
  }
}

TEST(Cache, FirstFlushNeverReadsStaleTail) {
  // n_sink rows count in the permutation statistics: a huge sink channel
  // moves that channel to the end of the order.
  Config cfg = spec_config();
  SkvqCache c(cfg);
  Tensor k = randn({1, 1, 16, 64}, 1200), v = randn({1, 1, 16, 64}, 1201);
  k.view().set(0, 0, 0, 7, 500.0f);
  c.update_and_fetch(k.view(), v.view());
  EXPECT_EQ(c.key_perms()->back(), 7);
}

TEST(PromptCacheTest, BuildsOneCachePerLayer) {
  ModelDesc m;
  m.layers = {{true, 64}, {false, 64}, {true, 16}};
  Config cfg = spec_config();
  PromptCache pc = PromptCache::build(m, CacheKind::skvq, cfg);
  ASSERT_EQ(pc.size(), 3u);
  EXPECT_EQ(pc.layer(0).kind(), "skvq");
  EXPECT_EQ(pc.layer(1).kind(), "plain");
  EXPECT_EQ(pc.layer(2).kind(), "skvq");
  EXPECT_EQ(dynamic_cast<SkvqCache&>(pc.layer(2)).config().head_dim, 16);
  Tensor k = randn({1, 2, 40, 16}, 1300), v = randn({1, 2, 40, 16}, 1301);
  pc.layer(2).update_and_fetch(k.view(), v.view());
  const PromptCache copy = pc;
  EXPECT_TRUE(dynamic_cast<const SkvqCache&>(copy.layer(2)).same_state(dynamic_cast<SkvqCache&>(pc.layer(2))));
  EXPECT_EQ(pc.accounting().tokens_seen, 40);
  EXPECT_THROW(pc.layer(3), Error);
  cfg.bits_key = 0;
  EXPECT_THROW(PromptCache::build(m, CacheKind::skvq, cfg), Error);
  PromptCache plain = PromptCache::build(m, CacheKind::plain, spec_config());
  EXPECT_EQ(plain.layer(0).kind(), "plain");
}

TEST(PlainCacheTest, ReturnsInputAndTrims) {
  PlainCache c(std::int64_t{100});
  Tensor k = randn({1, 2, 40, 16}, 1400), v = randn({1, 2, 40, 8}, 1401);
  c.update_and_fetch(k.view().slice_tokens(0, 25), v.view().slice_tokens(0, 25));
  auto [ko, vo] = c.update_and_fetch(k.view().slice_tokens(25, 15), v.view().slice_tokens(25, 15));
  EXPECT_TRUE(bits_equal(ko, k.view()));
  EXPECT_TRUE(bits_equal(vo, v.view()));
  EXPECT_TRUE(c.is_trimmable());
  c.trim(5);
  EXPECT_EQ(c.offset(), 35);
  EXPECT_THROW(c.trim(36), Error);
  EXPECT_THROW(c.update_and_fetch(randn({1, 2, 70, 16}, 1).view(), randn({1, 2, 70, 8}, 2).view()), Error);
  EXPECT_EQ(c.offset(), 35);
}

}  // namespace
}  // namespace skvq::test
