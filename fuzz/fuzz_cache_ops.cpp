// libFuzzer target for the cache's own operations, differential: every
// config the spec allows at small sizes, and a sequence of appends (values
// of every scale the quantizer must survive: tiny, huge, constant groups,
// signed zeros; now and then an invalid call), fetches and attention, run
// on two caches, one with the SIMD kernels and one with the scalar
// reference. After every call:
// - both caches hold identical state (the spec: fast paths give the same
//   codes and metadata), and fetch the same bits;
// - a refused call (skvq::Error) left its cache exactly as it was;
// - a cache saved as a prompt-cache file loads back to the same state;
// - attention over both agrees to 2% of the largest value held (plus 1% of
//   the smallest stored scale's largest code, for values that are all 0),
//   and is finite. docs/numerics.md bounds the fused kernels' two roundings
//   (16-bit queries: about 0.4% of the largest value with scores of the size
//   used here; weights rounded to 16 bits a block: at most 0.4%), so 2% is
//   twice their sum, and a kernel that goes wrong is off by far more.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include "ref/meta.hpp"
#include "skvq/cache_file.hpp"
#include "skvq/skvq.hpp"

namespace {

using namespace skvq;

// SKVQ_FUZZ_VERBOSE set: a crash input's config and calls go to stderr.
const bool verbose = std::getenv("SKVQ_FUZZ_VERBOSE") != nullptr;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_cache_ops: %s\n", what);
  std::abort();
}

// S rows of [B, H, S, D] in `dt`, values of one of several kinds.
Tensor rows(FuzzedDataProvider& fdp, DType dt, Shape4 shape) {
  Tensor t(dt, shape);
  std::mt19937 rng(fdp.ConsumeIntegral<std::uint32_t>());
  const int kind = fdp.ConsumeIntegralInRange(0, 5);
  const float scale = std::array<float, 6>{1e-6f, 1e-3f, 1.0f, 30.0f, 3000.0f, 60000.0f}[fdp.ConsumeIntegralInRange(0, 5)];
  if (verbose) std::fprintf(stderr, "  rows kind %d scale %g dtype %d\n", kind, static_cast<double>(scale), static_cast<int>(dt));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float limit = dt == DType::f16 ? 65504.0f : 1e30f;
  TensorView v = t.view();
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t h = 0; h < shape[1]; ++h)
      for (std::int64_t s = 0; s < shape[2]; ++s)
        for (std::int64_t d = 0; d < shape[3]; ++d) {
          float x = 0;
          switch (kind) {
            case 0: x = scale * nd(rng); break;                                   // normal
            case 1: x = scale; break;                                             // constant
            case 2: x = (d % 3 == 0 ? 100.0f : 1.0f) * scale * nd(rng); break;    // outlier channels
            case 3: x = (rng() % 2 ? -0.0f : 0.0f); break;                        // signed zeros
            case 4: x = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 30) * (rng() % 2 ? 1 : -1); break;  // powers of two
            default: x = static_cast<float>(static_cast<int>(rng() % 5) - 2) * scale; break;  // few levels
          }
          v.set(b, h, s, d, std::clamp(x, -limit, limit));
        }
  return t;
}

template <typename F>
void each(const Tensor& t, F&& f) {
  const Shape4 sh = t.shape();
  for (std::int64_t b = 0; b < sh[0]; ++b)
    for (std::int64_t h = 0; h < sh[1]; ++h)
      for (std::int64_t s = 0; s < sh[2]; ++s)
        for (std::int64_t d = 0; d < sh[3]; ++d) f(b, h, s, d);
}

double largest(const Tensor& t) {
  double m = 0;
  each(t, [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
    m = std::max(m, std::fabs(static_cast<double>(t.view().at(b, h, s, d))));
  });
  return m;
}

void same(const SkvqCache& a, const SkvqCache& b, const char* what) {
  if (!a.same_state(b)) fail(what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  Config cfg;
  cfg.head_dim = fdp.ConsumeIntegralInRange(1, 72);
  cfg.bits_key = fdp.ConsumeIntegralInRange(1, 8);
  cfg.bits_value = fdp.ConsumeIntegralInRange(1, 8);
  cfg.group_size = fdp.ConsumeIntegralInRange(1, 80);
  cfg.window = fdp.ConsumeIntegralInRange(2, 24);
  cfg.n_sink = fdp.ConsumeIntegralInRange(0, cfg.window - 1);
  cfg.reorder = fdp.ConsumeBool();
  cfg.clip_search = fdp.ConsumeBool();
  cfg.clip_alpha = std::array<float, 4>{1.0f, 0.9f, 0.5f, 1e-4f}[fdp.ConsumeIntegralInRange(0, 3)];
  cfg.metadata = static_cast<MetaType>(fdp.ConsumeIntegralInRange(0, 2));
  cfg.dense_view = fdp.ConsumeBool();
  if (fdp.ConsumeBool()) cfg.max_ctx = fdp.ConsumeIntegralInRange(1, 160);
  // the first call that succeeds fixes B, H, the values' head dim and the dtype
  const std::int64_t B = fdp.ConsumeIntegralInRange(1, 2);
  std::int64_t H = fdp.ConsumeIntegralInRange(1, 3);
  const std::int64_t D = cfg.head_dim;
  std::int64_t Dv = fdp.ConsumeBool() ? D : fdp.ConsumeIntegralInRange(1, 72);
  DType dt = static_cast<DType>(fdp.ConsumeIntegralInRange(0, 2));
  if (verbose) {
    std::fprintf(stderr, "config D=%d bits %d/%d group %d window %d sinks %d reorder %d search %d alpha %g meta %d dense %d; B=%lld H=%lld Dv=%lld dtype %d\n",
                 cfg.head_dim, cfg.bits_key, cfg.bits_value, cfg.group_size, cfg.window, cfg.n_sink, cfg.reorder, cfg.clip_search,
                 static_cast<double>(cfg.clip_alpha), static_cast<int>(cfg.metadata), cfg.dense_view, static_cast<long long>(B),
                 static_cast<long long>(H), static_cast<long long>(Dv), static_cast<int>(dt));
  }
  SkvqCache a(cfg), r(cfg);
  r.set_kernel(Kernel::reference);
  a.set_num_threads(fdp.ConsumeIntegralInRange(1, 3));
  for (int op = 0; op < 8 && fdp.remaining_bytes() > 0; ++op) {
    switch (fdp.ConsumeIntegralInRange(0, 4)) {
      case 4: {  // through a prompt-cache file and back: the same state
        PromptCache pc;
        pc.push_back(a.clone());
        const PromptCache back = load_prompt_cache_bytes(prompt_cache_bytes(pc));
        const auto* c = dynamic_cast<const SkvqCache*>(&back.layer(0));
        if (c == nullptr || back.size() != 1) fail("a saved cache came back as something else");
        same(*c, a, "a cache saved and loaded again differs");
        break;
      }
      case 0:
      case 1: {  // append S rows; now and then a call that must be refused
        const std::int64_t S = fdp.ConsumeIntegralInRange(1, 40);
        const int bad = fdp.ConsumeIntegralInRange(0, 7);  // 0..3: one kind of bad call each
        const DType cdt = bad == 0 ? static_cast<DType>((static_cast<int>(dt) + 1) % 3) : dt;
        Tensor k = rows(fdp, cdt, {B, bad == 1 ? H + 1 : H, S, D});
        Tensor v = rows(fdp, cdt, {B, bad == 1 ? H + 1 : H, S, bad == 2 ? Dv + 1 : Dv});
        if (bad == 3) k.view().set(B - 1, H - 1, S - 1, D - 1, std::numeric_limits<float>::quiet_NaN());
        if (verbose) std::fprintf(stderr, "append S=%lld bad=%d offset before %lld\n", static_cast<long long>(S), bad, static_cast<long long>(a.offset()));
        const SkvqCache before = a;
        bool threw_a = false, threw_r = false;
        try {
          a.append(k.view(), v.view());
        } catch (const Error&) {
          threw_a = true;
        }
        try {
          r.append(k.view(), v.view());
        } catch (const Error&) {
          threw_r = true;
        }
        if (threw_a != threw_r) fail("the SIMD and reference caches disagree on refusing a call");
        if (!threw_a && before.offset() == 0) {  // the first call: its shapes and dtype are the cache's now
          H = k.shape()[1];
          Dv = v.shape()[3];
          dt = cdt;
        }
        if (threw_a) same(a, before, "a refused append changed the cache");
        same(a, r, "SIMD and reference states differ after an append");
        break;
      }
      case 2: {  // fetch: the same bits from both
        if (a.offset() == 0) break;
        const std::int64_t T = a.offset();
        Tensor ka(dt, {B, H, T, D}), va(dt, {B, H, T, Dv}), kr(dt, {B, H, T, D}), vr(dt, {B, H, T, Dv});
        a.fetch_into(ka.view(), va.view());
        r.fetch_into(kr.view(), vr.view());
        if (std::memcmp(ka.data(), kr.data(), ka.nbytes()) != 0 ||
            std::memcmp(va.data(), vr.data(), va.nbytes()) != 0) {
          fail("SIMD and reference fetch_into differ");
        }
        break;
      }
      default: {  // attention: SIMD against the reference, scores of moderate size
        if (a.offset() == 0) break;
        const std::int64_t T = a.offset(), G = fdp.ConsumeIntegralInRange(1, 3);
        const std::int64_t Sq = fdp.ConsumeIntegralInRange<std::int64_t>(1, std::min<std::int64_t>(3, T));
        Tensor keys(DType::f32, {B, H, T, D}), vals(DType::f32, {B, H, T, Dv});
        a.fetch_into(keys.view(), vals.view());
        const double kmax = largest(keys), vmax = largest(vals);
        // q ~ N(0, 1) / kmax: |scores| about sqrt(D) at most, so the fused
        // path's 16-bit queries move the weights by about 1e-3 (a near tie
        // of huge scores could otherwise swap which value wins)
        Tensor q(DType::f32, {B, H * G, Sq, D});
        std::mt19937 rng(fdp.ConsumeIntegral<std::uint32_t>());
        std::normal_distribution<float> nd(0.0f, 1.0f);
        const float qs = kmax > 0 ? static_cast<float>(1.0 / kmax) : 1.0f;
        each(q, [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) { q.view().set(b, h, s, d, qs * nd(rng)); });
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        Tensor os, orf;
        try {
          os = attend(a, q.view(), scale);
          orf = attend(r, q.view(), scale, AttendOptions{Kernel::reference, 1});
        } catch (const Error&) {
          fail("attention refused a valid call");
        }
        // The fused kernels sum code * scale and lo apart, so their rounding
        // is relative to a group's scale times its largest code even where
        // every value reconstructs to 0 (docs/numerics.md, attention
        // tolerances): 1% of the smallest scale the metadata stores times
        // the largest code bounds that where vmax is 0.
        const double min_scale = cfg.metadata == MetaType::fp16     ? ref::kMinScaleF16
                                 : cfg.metadata == MetaType::fp8_e4m3 ? ref::kMinScaleE4M3
                                                                      : ref::kMinScaleF32;
        const double floor = 0.01 * min_scale * ((1 << cfg.bits_value) - 1);
        each(os, [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
          const double x = os.view().at(b, h, s, d), y = orf.view().at(b, h, s, d);
          if (!std::isfinite(x) || !std::isfinite(y)) fail("attention is not finite");
          if (std::fabs(x - y) > 0.02 * vmax + floor) {
            if (verbose) std::fprintf(stderr, "attention [%lld %lld %lld %lld]: simd %.9g ref %.9g vmax %g kmax %g T=%lld G=%lld Sq=%lld\n",
                                      static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(s), static_cast<long long>(d),
                                      x, y, vmax, kmax, static_cast<long long>(T), static_cast<long long>(G), static_cast<long long>(Sq));
            fail("SIMD and reference attention differ by more than 2% of the largest value");
          }
        });
        break;
      }
    }
  }
  return 0;
}
