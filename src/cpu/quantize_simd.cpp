// Highway SIMD version of the clipped min/max group quantizer (spec section
// 4). With the clip search, lanes hold different rows (a block transposed)
// and each lane does exactly the reference's float32 operations in the
// reference's order, so codes and metadata match ref::quantize_rows bit for
// bit (the error sum stays in slot order); the chosen factor's codes, and
// everything when there is one factor and groups are whole vectors, are
// computed along each row, with the same operations element by element.
#include "cpu/quantize_simd.hpp"

#include <algorithm>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/quantize_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "ref/meta.hpp"
#include "ref/pack.hpp"

HWY_BEFORE_NAMESPACE();
namespace skvq::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lane-wise twin of ref::round_to_format: quantum q = 2^(max(exponent, emin) - mant),
// r = min(rint(|v| / q) * q, maxv) with the sign of v. |v| / q is exact.
template <class D, class V>
V RoundToFormat(D d, V v, int mant, int emin, float maxv) {
  const hn::RebindToSigned<D> di;
  const V a = hn::Abs(v);
  auto e = hn::ShiftRight<23>(hn::BitCast(di, a));  // biased exponent (0 for zero and subnormals)
  e = hn::Max(e, hn::Set(di, emin + 127));
  const V q = hn::BitCast(d, hn::ShiftLeft<23>(hn::Sub(e, hn::Set(di, mant))));
  const V r = hn::Min(hn::Mul(hn::Round(hn::Div(a, q)), q), hn::Set(d, maxv));
  return hn::CopySign(r, v);
}

template <class D, class V>
void RoundMeta(D d, MetaType meta, V& lo, V& scale) {
  if (meta == MetaType::fp16) {
    lo = RoundToFormat(d, lo, 10, -14, ref::kMaxF16);
    scale = hn::Max(RoundToFormat(d, scale, 10, -14, ref::kMaxF16), hn::Set(d, ref::kMinScaleF16));
  } else if (meta == MetaType::fp8_e4m3) {
    lo = RoundToFormat(d, lo, 3, -6, ref::kMaxE4M3);
    scale = hn::Max(RoundToFormat(d, scale, 3, -6, ref::kMaxE4M3), hn::Set(d, ref::kMinScaleE4M3));
  }
}

// lo and scale of clip factor alpha for groups whose (max + min) / 2 and
// max - min are mid and rng: the spec's float32 operations, rounded as they
// will be stored (what is stored is what is scored).
template <class D, class V>
HWY_INLINE void FactorMeta(D d, MetaType meta, V alpha, V mid, V rng, V levels, V& lo, V& scale) {
  const V t = hn::Mul(alpha, rng);
  lo = hn::Sub(mid, hn::Mul(t, hn::Set(d, 0.5f)));
  scale = hn::Max(hn::Div(t, levels), hn::Set(d, ref::kMinScaleF32));
  RoundMeta(d, meta, lo, scale);
}

// Codes of g consecutive values of one row for one (lo, scale): the
// reference's operations, a vector at a time, then (g not a multiple of the
// lanes) one at a time with the same operations in scalar form.
template <class D>
void CodesAlongRow(D d, const float* x, int g, float lo, float scale, float levels_f, std::uint8_t* out) {
  const hn::Rebind<std::int32_t, D> di;
  const hn::Rebind<std::uint8_t, D> d8;
  using V = hn::Vec<D>;
  const int L = static_cast<int>(hn::Lanes(d));
  const V vlo = hn::Set(d, lo), vscale = hn::Set(d, scale), zero = hn::Zero(d), levels = hn::Set(d, levels_f);
  int s = 0;
  for (; s + L <= g; s += L) {
    const V code = hn::Min(hn::Max(hn::Round(hn::Div(hn::Sub(hn::LoadU(d, x + s), vlo), vscale)), zero), levels);
    // (DemoteTo, not TruncateTo: Highway 1.0.3's TruncateTo to bytes permutes 32-bit lanes by byte
    // indices on AVX3_DL, a wrong result; the codes are in [0, 255], so saturating is exact)
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, code)), d8, out + s);
  }
  for (; s < g; ++s) out[s] = static_cast<std::uint8_t>(std::min(std::max(std::nearbyint((x[s] - lo) / scale), 0.0f), levels_f));
}

// One clip factor (the search off) and groups of whole vectors: no error sum
// to keep in slot order, so a row is taken along its channels: a group's
// minimum and maximum are reduced across lanes (exact in any order; a group
// of signed zeros alone takes its first slot's zero, as the reference's
// std::min and std::max do), the row's lo and scale are formed for all its
// groups at once with the lane-wise rounding of the transposed form (one
// group a lane), and each vector of codes is written as bytes at once. The
// transposed form below spends most of this case writing codes a byte a lane.
void QuantizeRowsOneFactor(const QuantParams& p) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const int L = static_cast<int>(hn::Lanes(d));
  const int g = p.group_size, P = p.padded_dim, G = P / g, D = p.row_dim();
  const int Gp = (G + L - 1) / L * L;
  const float levels_f = static_cast<float>((1 << p.bits) - 1);
  const V levels = hn::Set(d, levels_f), half = hn::Set(d, 0.5f);
  const V alpha = hn::Set(d, p.grid[0]);
  auto xp = hwy::AllocateAligned<float>(static_cast<std::size_t>(P));
  // per group of the row: minimum, maximum, then lo and scale (lanes past G stay 0)
  auto meta = hwy::AllocateAligned<float>(4 * static_cast<std::size_t>(Gp));
  float *gmins = meta.get(), *gmaxs = gmins + Gp, *los = gmaxs + Gp, *scales = los + Gp;
  std::fill(meta.get(), meta.get() + 4 * Gp, 0.0f);
  for (std::int64_t r = 0; r < p.n_rows; ++r) {
    const float* row = p.x + r * D;
    const std::int32_t* perm = p.row_perm(r);
    if (perm) {
      for (int j = 0; j < D; ++j) xp[static_cast<std::size_t>(j)] = row[perm[j]];
    } else {
      std::copy(row, row + D, xp.get());
    }
    std::fill(xp.get() + D, xp.get() + P, xp[static_cast<std::size_t>(D - 1)]);
    for (int k = 0; k < G; ++k) {
      const float* grp = xp.get() + static_cast<std::ptrdiff_t>(k) * g;
      V vmin = hn::Load(d, grp), vmax = vmin;
      for (int s = L; s < g; s += L) {
        const V x = hn::Load(d, grp + s);
        vmin = hn::Min(vmin, x);
        vmax = hn::Max(vmax, x);
      }
      const float gmin = hn::GetLane(hn::MinOfLanes(d, vmin)), gmax = hn::GetLane(hn::MaxOfLanes(d, vmax));
      const bool zeros = gmin == 0.0f && gmax == 0.0f;
      gmins[k] = zeros ? grp[0] : gmin;
      gmaxs[k] = zeros ? grp[0] : gmax;
    }
    for (int k = 0; k < G; k += L) {  // the transposed form's operations, a group a lane
      const V gmin = hn::Load(d, gmins + k), gmax = hn::Load(d, gmaxs + k);
      V lo, scale;
      FactorMeta(d, p.meta, alpha, hn::Mul(hn::Add(gmax, gmin), half), hn::Sub(gmax, gmin), levels, lo, scale);
      hn::Store(lo, d, los + k);
      hn::Store(scale, d, scales + k);
    }
    std::copy(los, los + G, p.lo + r * G);
    std::copy(scales, scales + G, p.scale + r * G);
    for (int k = 0; k < G; ++k) {
      CodesAlongRow(d, xp.get() + static_cast<std::ptrdiff_t>(k) * g, g, los[k], scales[k], levels_f,
                    p.codes + r * P + static_cast<std::int64_t>(k) * g);
    }
  }
}

constexpr int kDefaultGrid = 5;  // the spec's grid; other sizes take the loop one factor at a time

// The clip search over one group of a block (lanes: rows; grp[s * L + lane]):
// every factor's lo and scale (rounded as stored), its error summed over the
// slots in slot order (the spec's float32 operations, each rounded), and the
// factor with the smallest error (ties: the earlier). NG > 0: the factors'
// sums side by side, each slot loaded once (NG independent addition chains,
// not one chain after another); NG = 0: any grid, one factor at a time. The
// operations of each (lane, factor) are the same either way.
template <int NG, class D, class V>
HWY_INLINE void ChooseFactor(D d, const QuantParams& p, const float* grp, int g, V mid, V rng, V& best_lo,
                             V& best_scale) {
  constexpr int kN = NG > 0 ? NG : 1;
  const std::size_t L = hn::Lanes(d);
  const V zero = hn::Zero(d);
  const V levels = hn::Set(d, static_cast<float>((1 << p.bits) - 1));
  const V inv_g = hn::Set(d, 1.0f / static_cast<float>(g));
  const int n = NG > 0 ? NG : p.n_grid;
  V best_err = zero;
  for (int a0 = 0; a0 < n; a0 += kN) {
    V lo[kN], scale[kN], err[kN];
    for (int a = 0; a < kN; ++a) {
      FactorMeta(d, p.meta, hn::Set(d, p.grid[a0 + a]), mid, rng, levels, lo[a], scale[a]);
      err[a] = zero;
    }
    for (int s = 0; s < g; ++s) {
      const V x = hn::Load(d, grp + static_cast<std::size_t>(s) * L);
      for (int a = 0; a < kN; ++a) {
        const V code = hn::Min(hn::Max(hn::Round(hn::Div(hn::Sub(x, lo[a]), scale[a])), zero), levels);
        const V diff = hn::Sub(hn::Add(hn::Mul(code, scale[a]), lo[a]), x);
        err[a] = hn::Add(err[a], hn::Mul(diff, diff));
      }
    }
    for (int a = 0; a < kN; ++a) {
      const V e = hn::Mul(err[a], inv_g);
      if (a0 + a == 0) {
        best_err = e;
        best_lo = lo[a];
        best_scale = scale[a];
      } else {  // strictly smaller wins; ties keep the earlier alpha
        const auto better = hn::Lt(e, best_err);
        best_err = hn::IfThenElse(better, e, best_err);
        best_lo = hn::IfThenElse(better, lo[a], best_lo);
        best_scale = hn::IfThenElse(better, scale[a], best_scale);
      }
    }
  }
}

void QuantizeRows(const QuantParams& p) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::size_t L = hn::Lanes(d);
  const int g = p.group_size;
  const int P = p.padded_dim;
  const int G = P / g;
  const float levels_f = static_cast<float>((1 << p.bits) - 1);
  const V levels = hn::Set(d, levels_f);
  const V zero = hn::Zero(d);
  const V half = hn::Set(d, 0.5f);

  if (p.n_grid == 1 && g % static_cast<int>(L) == 0) return QuantizeRowsOneFactor(p);
  auto xt = hwy::AllocateAligned<float>(static_cast<std::size_t>(P) * L);  // [P][L] transposed block
  auto lane_lo = hwy::AllocateAligned<float>(L);
  auto lane_scale = hwy::AllocateAligned<float>(L);
  // the block's rows also along their channels (permuted, padded): the chosen factor's codes are
  // computed from them a vector at a time, not a byte a lane from the transposed block
  auto xr = hwy::AllocateAligned<float>(static_cast<std::size_t>(P) * L);

  for (std::int64_t r0 = 0; r0 < p.n_rows; r0 += static_cast<std::int64_t>(L)) {
    const std::size_t nb = static_cast<std::size_t>(std::min<std::int64_t>(L, p.n_rows - r0));
    const int D = p.row_dim();
    for (std::size_t l = 0; l < L; ++l) {  // idle lanes repeat the last row; gather permuted and padded
      const std::int64_t r = r0 + static_cast<std::int64_t>(std::min(l, nb - 1));
      const float* row = p.x + r * D;
      const std::int32_t* perm = p.row_perm(r);
      float* xrow = xr.get() + l * static_cast<std::size_t>(P);
      if (perm) {
        for (int j = 0; j < D; ++j) xt[static_cast<std::size_t>(j) * L + l] = xrow[j] = row[perm[j]];
      } else {
        for (int j = 0; j < D; ++j) xt[static_cast<std::size_t>(j) * L + l] = xrow[j] = row[j];
      }
      const float last = xrow[D - 1];
      for (int j = D; j < P; ++j) xt[static_cast<std::size_t>(j) * L + l] = xrow[j] = last;
    }
    for (int k = 0; k < G; ++k) {
      const float* grp = xt.get() + static_cast<std::size_t>(k) * g * L;
      V gmin = hn::Load(d, grp), gmax = gmin;
      for (int s = 1; s < g; ++s) {
        const V x = hn::Load(d, grp + static_cast<std::size_t>(s) * L);
        gmin = hn::Min(gmin, x);
        gmax = hn::Max(gmax, x);
      }
      // A group of signed zeros alone: the reference (std::min and std::max
      // over the slots in order, ties keeping the earlier) makes both the
      // first slot's zero, so lo takes its sign; Min and Max may pick either.
      const auto zeros = hn::And(hn::Eq(gmin, zero), hn::Eq(gmax, zero));
      gmin = hn::IfThenElse(zeros, hn::Load(d, grp), gmin);
      gmax = hn::IfThenElse(zeros, gmin, gmax);
      const V mid = hn::Mul(hn::Add(gmax, gmin), half);
      const V rng = hn::Sub(gmax, gmin);

      V best_lo = zero, best_scale = zero;
      if (p.n_grid == 1) {  // a single clip factor is chosen whatever its error: no scoring
        FactorMeta(d, p.meta, hn::Set(d, p.grid[0]), mid, rng, levels, best_lo, best_scale);
      } else if (p.n_grid == kDefaultGrid) {
        ChooseFactor<kDefaultGrid>(d, p, grp, g, mid, rng, best_lo, best_scale);
      } else {
        ChooseFactor<0>(d, p, grp, g, mid, rng, best_lo, best_scale);
      }
      hn::Store(best_lo, d, lane_lo.get());
      hn::Store(best_scale, d, lane_scale.get());
      for (std::size_t l = 0; l < nb; ++l) {
        p.lo[(r0 + static_cast<std::int64_t>(l)) * G + k] = lane_lo[l];
        p.scale[(r0 + static_cast<std::int64_t>(l)) * G + k] = lane_scale[l];
      }
      for (std::size_t l = 0; l < nb; ++l) {
        CodesAlongRow(d, xr.get() + l * static_cast<std::size_t>(P) + static_cast<std::size_t>(k) * g, g, lane_lo[l],
                      lane_scale[l], levels_f, p.codes + (r0 + static_cast<std::int64_t>(l)) * P + k * g);
      }
    }
  }
}

// ref::pack_codes for 2- and 4-bit codes starting on a whole byte: a vector
// of codes at a time, each 32-bit (2 bits) or 16-bit (4 bits) lane folding
// its 4 or 2 codes into its low byte by shifts and ors, then narrowed to
// bytes (saturation is exact: every folded lane is at most 255). Returns how
// many codes it packed (a multiple of the vector's); the caller packs the rest.
std::int64_t PackCodesWhole(const std::uint8_t* codes, std::int64_t n, int bits, std::uint8_t* out) {
#if HWY_TARGET == HWY_SCALAR
  (void)codes, (void)n, (void)bits, (void)out;
  return 0;  // one byte a vector: nothing to fold
#else
  const hn::ScalableTag<std::uint8_t> d8;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d8));
  std::int64_t i = 0;
  if (bits == 2) {
    // (signed lanes: Highway 1.0.3 narrows only signed integers to bytes; every lane is non-negative)
    const hn::Repartition<std::int32_t, decltype(d8)> d32;
    const hn::Rebind<std::uint8_t, decltype(d32)> dn;  // one byte a 32-bit lane
    const auto mask = hn::Set(d32, 0x03030303), low = hn::Set(d32, 0xFF);
    for (; i + N <= n; i += N) {
      const auto x = hn::And(hn::BitCast(d32, hn::LoadU(d8, codes + i)), mask);
      const auto b = hn::And(hn::Or(hn::Or(x, hn::ShiftRight<6>(x)), hn::Or(hn::ShiftRight<12>(x), hn::ShiftRight<18>(x))), low);
      hn::StoreU(hn::DemoteTo(dn, b), dn, out + i / 4);
    }
  } else if (bits == 4) {
    const hn::Repartition<std::int16_t, decltype(d8)> d16;
    const hn::Rebind<std::uint8_t, decltype(d16)> dn;  // one byte a 16-bit lane
    const auto mask = hn::Set(d16, static_cast<std::int16_t>(0x0F0F)), low = hn::Set(d16, static_cast<std::int16_t>(0xFF));
    for (; i + N <= n; i += N) {
      const auto x = hn::And(hn::BitCast(d16, hn::LoadU(d8, codes + i)), mask);
      hn::StoreU(hn::DemoteTo(dn, hn::And(hn::Or(x, hn::ShiftRight<4>(x)), low)), dn, out + i / 2);
    }
  }
  return i;
#endif
}

}  // namespace skvq::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace skvq::cpu {

HWY_EXPORT(QuantizeRows);
HWY_EXPORT(PackCodesWhole);

void pack_codes(const std::uint8_t* codes, std::int64_t n, int bits, std::uint8_t* stream, std::int64_t first) {
  std::int64_t done = 0;
  if ((bits == 2 || bits == 4) && (first * bits) % 8 == 0) {
    done = HWY_DYNAMIC_DISPATCH(PackCodesWhole)(codes, n, bits, stream + first * bits / 8);
  }
  if (done < n) ref::pack_codes(codes + done, n - done, bits, stream, first + done);
}

void quantize_rows(const QuantParams& p) {
  if (p.n_rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(QuantizeRows)(p);
}

std::string target_name(std::int64_t target) { return hwy::TargetName(target); }

std::string active_target() {
  const auto targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

std::vector<std::int64_t> available_targets() { return hwy::SupportedAndGeneratedTargets(); }

void force_target(std::int64_t target) {
  hwy::SetSupportedTargetsForTest(target);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace skvq::cpu
#endif  // HWY_ONCE
