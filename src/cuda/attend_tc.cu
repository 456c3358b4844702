// The general path's tensor-core kernel (session 43): the packed body at head dims the tuned
// kernels of attend.cu do not take (32, 64, 96, 256 (session 44); 128 with code widths outside
// their six; since session 60 also 1, 3, 5, 6 and 7 bits, both sides the same width; since session
// 63, at head dim 128, every other pair of key widths 1-8 and value widths 1-8 through builds that
// read them at run time: kAnyWidth; 8-bit values, since session 64, a build of their own), where
// attend_general.cu's float kernel does 4 multiply-adds a channel and query row and repeats each
// token's softmax on every lane of its group (it ran at 0.66-0.82x the fp16 kernel's speed).
//
// A block (4 warps) owns one (batch, kv head, split of the packed body) and up to 8 query rows;
// each warp takes tiles of 16 tokens of the split in turn (up to head dim 64 the next tile's loads
// issued before the current one is used) and keeps its own online softmax; the warps merge at the
// end (store_merged). At head dim 256 two warps take each tile, 128 channels each (TileLayout).
// The splits make one wave of resident blocks (plan_tc). The exact sinks and tail go through the
// float kernel as splits of their own (launch_general with body_splits set), and the general
// combine merges them all. (docs/performance.md, "Other head dims": the steps and
// what bounds it.)
//
// Scores: one mma.sync m16n8k16 (fp16 in, fp32 sums) a k-step of 16 channels and 8 tokens. A rows
// 0-7 are the query rows, rows 8-15 the same rows' low parts: q (times the softmax scale, log2
// units) is scaled by a power of two so that max |q| of the row is below 1, then split into
// h = RN16(q) and RN16(q - h), which carry it to about 2^-22 of itself (docs/numerics.md), and the
// two rows' sums are added. B is the keys' codes as fp16 f = 1 + c / 2^KB (the code moved into the
// mantissa: exact; at widths whose codes cross bytes, from a row shifted once a tile: RowShifted;
// the unpacking is in tc_codes.hpp, shared with a host test), so a token's score is sum over its
// metadata groups of sct * sum(q f) + lot * sum(q) (attend.cu's affine form). A k-step's 16
// channels lie in one group; which 4 of them a lane holds is free (q is placed to match).
// Values: one mma.sync m16n8k16 (bf16 in, fp32 sums) a value metadata group, 16 tokens and 8
// channels. A is the weights p * sct of the row's tokens split into two bf16 parts (rows g and
// g + 8: p * sct to within 2^-18 of itself, with float32's exponent range: no scaling), B the
// values' codes as bf16 f = 1 + c / 2^VB (exact for VB <= 7); sum(p lot) goes alongside in float.
// 8-bit values (session 64, tc_kernel<kAnyWidth, 8, ...>) take two MMAs with the same A: B the
// codes' high nibbles as 1 + h / 16, then their low nibbles as 2^-4 (1 + l / 16) (ValuePair), whose
// sum is f + 2^-4; the token's offset takes the 2^-4 (lot - sct / 16).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include <cuda_bf16.h>

#include "cuda/common.cuh"
#include "cuda/device_state.cuh"
#include "cuda/kernels.cuh"
#include "cuda/partials.cuh"
#include "cuda/tc_codes.hpp"

namespace skvq::cuda {

namespace {

using namespace tc;  // the code unpacking (Raw, key_frag, RowShifted, ValuePair, ...)

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTok = 16;    // tokens a warp's tile
constexpr int kRows = 8;    // query rows a launch (A rows 0-7, their low parts 8-15)
constexpr int kMinTileSplit = 4 * kWarps * kTok;  // a split holds at least 4 tiles a warp

// The two bf16 parts of (x0, x1): hi = RN(x), lo = RN(x - hi) (the subtraction exact), as the A
// registers' pairs (x0 in the low half).
__device__ __forceinline__ void split_bf16(float x0, float x1, unsigned& hi, unsigned& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  hi = *reinterpret_cast<const unsigned*>(&h);
  // (the two halves back to float: a bf16 is a float's top 16 bits)
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xFFFF0000u));
  lo = *reinterpret_cast<const unsigned*>(&l);
}

// A constant the compiler cannot see, so that (x & mask) | c stays one LOP3 with the mask its one
// immediate (with both immediates it took an AND and an OR).
template <unsigned C>
__device__ __forceinline__ unsigned opaque() {
  unsigned r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "n"(C));
  return r;
}

// Past head dim 128 a tile is shared by two warps (a team), each taking half of every row's
// channels: its scores' partial sums are exchanged through shared memory, both keep the same
// softmax, and each accumulates its half of the values (the whole row's query fragments and value
// accumulators would not fit in a warp's registers).
constexpr int tc_warps_a_tile(int D) { return D > 128 ? 2 : 1; }

// The team's two warps meet (a named barrier of their 64 threads: ids 1 and 2, the block's
// __syncthreads being 0).
__device__ __forceinline__ void team_barrier(int team) {
  asm volatile("bar.sync %0, 64;" ::"r"(1 + team) : "memory");
}

// Code widths read at run time (KB or VB kAnyWidth): the kernel for the pairs of widths that have no
// kernel of their own, at head dim 128 only (kAnyWidthsD; session 63). Each width-dependent step of a
// tile (the loads of a side's codes, the scores, the value products) is a switch over the side's
// width (with_width: warp-uniform, once a tile and side), whose cases are the fixed-width kernels'
// code; the tile's codes are held in registers for the widest case (key_store_bits,
// value_store_bits), of which a case uses the first words. Values read at run time are 1 to 7 bits
// (kAnyValueBits); 8-bit values beside keys read at run time have a build of their own (VB 8, session
// 64: inside the run-time values' switch their two planes slowed 7-bit values at groups of 64 by 15%).
constexpr int kAnyWidth = 0;
constexpr int kAnyWidthsD = 128;
constexpr int kAnyValueBits = 7;
constexpr int key_store_bits(int KB) { return KB == kAnyWidth ? kMaxKeyBits : KB; }
constexpr int value_store_bits(int VB) { return VB == kAnyWidth ? kAnyValueBits : VB; }

// f(the side's width as an integral constant): W where it is fixed, else the run-time width w (1 to
// MAX; the host sends no other).
template <int W, int MAX, typename F>
__device__ __forceinline__ void with_width(int w, F&& f) {
  using std::integral_constant;
  if constexpr (W != kAnyWidth) {
    f(integral_constant<int, W>{});
  } else {
    static_assert(MAX == 7 || MAX == 8, "widths 1 to 7 or 8");
    switch (w) {
      case 1: f(integral_constant<int, 1>{}); break;
      case 2: f(integral_constant<int, 2>{}); break;
      case 3: f(integral_constant<int, 3>{}); break;
      case 4: f(integral_constant<int, 4>{}); break;
      case 5: f(integral_constant<int, 5>{}); break;
      case 6: f(integral_constant<int, 6>{}); break;
      case 7: f(integral_constant<int, 7>{}); break;
      default:
        if constexpr (MAX == 8) f(integral_constant<int, 8>{});
        break;
    }
  }
}

// The channel of a k-step that lane t's q slot j holds (key_channel) at the keys' width.
template <int KB>
__device__ __forceinline__ int key_channel_of(int kb, int t, int j) {
  if constexpr (KB != kAnyWidth) return key_channel<KB>(t, j);
  else return key_bytes_whole(kb) ? key_channel<2>(t, j) : key_channel<3>(t, j);  // (two placements: whole bytes or not)
}

// The first words of a register array as a Raw of fewer bytes (a fixed width's view of the any-width
// kernel's storage; the same array where the sizes agree), and the other way.
template <int TO, int FROM>
__device__ __forceinline__ Raw<TO> raw_prefix(const Raw<FROM>& r) {
  if constexpr (TO == FROM) {
    return r;
  } else {
    static_assert(TO < FROM, "a prefix");
    Raw<TO> x;
#pragma unroll
    for (int i = 0; i < Raw<TO>::kWords; ++i) x.w[i] = r.w[i];
    return x;
  }
}
template <int TO, int FROM>
__device__ __forceinline__ void store_prefix(Raw<TO>& dst, const Raw<FROM>& r) {
  if constexpr (TO == FROM) {
    dst = r;
  } else {
    static_assert(FROM < TO, "a prefix");
#pragma unroll
    for (int i = 0; i < Raw<FROM>::kWords; ++i) dst.w[i] = r.w[i];
  }
}

template <int KB, int VB, int META, int D, int GS>
struct TileLayout {
  static constexpr int kH = tc_warps_a_tile(D);  // warps a tile
  static constexpr int kDW = D / kH;             // channels a warp
  static constexpr int kMb = meta_bytes<META>();
  static constexpr int kKS = kDW / 16;           // key k-steps a warp
  static constexpr int kNG = kDW / GS;           // metadata groups a warp (both sides)
  static constexpr int kRowNG = D / GS;          // metadata groups a row
  static constexpr int kNTG = GS / 8;            // value n-tiles a group
  // the registers a tile's codes take (the widths' own sizes; with a width read at run time, the
  // widest case's): a warp's part of a key row (bytes), a lane's value chunk of a group (bytes, as
  // ValuePair takes them). A row is D * bits / 8 bytes.
  static constexpr int kKB = key_store_bits(KB), kVB = value_store_bits(VB);
  static constexpr int kKW = kDW * kKB / 8;
  static constexpr int kCV = ValueChunk<kVB, GS>::kBytes;
  // a lane's metadata of a token pair (2t, 2t + 1): one load of both tokens' groups (kMT = 1), or
  // with two warps a row one load a token of the warp's groups (kMT = 2), of kMW bytes each
  static constexpr int kMT = kH;
  static constexpr int kMW = (kH == 1 ? 2 : 1) * kNG * kMb;
  static_assert(D % (GS * kH) == 0 && GS % 16 == 0, "whole groups of whole k-steps");
  static_assert(tc_chunk_ok(GS, kVB), "a value group's packed segment whole words");
  static_assert((KB != kAnyWidth && VB != kAnyWidth) || D == kAnyWidthsD, "widths read at run time at kAnyWidthsD only");
};

// Where a lane's loads of every tile start within a window slot (row 0 of its (b, h)), as byte
// offsets into the side's arrays: the key rows of tokens g and 8 + g, the metadata of tokens
// (2t, 2t + 1) and (8 + 2t, 9 + 2t) (keys and values have the same groups: one offset for all four
// metadata arrays), the value chunks of those four tokens (chunks loaded by words: the first word
// that holds the chunk, with its shift and word count: ValueChunk); each at the warp's half of the
// row (half 1 of 2 past head dim 128, else 0). (32-bit: at most B Hkv window row bytes.)
template <int KB, int VB, int META, int D, int GS>
struct LaneBase {
  using L = TileLayout<KB, VB, META, D, GS>;
  unsigned k = 0, v = 0, m = 0;
  int vshift = 0, vwords = 0;
  __device__ __forceinline__ LaneBase(const AttnParams& p, std::int64_t bh, int g, int t, int half) {
    const std::int64_t r = bh * p.window;
    with_width<KB, kMaxKeyBits>(p.k.bits, [&](auto kb) {
      constexpr int KBc = decltype(kb)::value;
      k = static_cast<unsigned>((r + g) * (D * KBc / 8) + half * (L::kDW * KBc / 8));
    });
    with_width<VB, kAnyValueBits>(p.v.bits, [&](auto vb) {
      constexpr int VBc = decltype(vb)::value;
      using VC = ValueChunk<VBc, GS>;
      vshift = VC::shift(g), vwords = VC::words(g);
      const int chunk = VC::kByWords ? 4 * VC::first_word(g) : g * VC::kBytes;
      v = static_cast<unsigned>((r + 2 * t) * (D * VBc / 8) + chunk + half * (L::kDW * VBc / 8));
    });
    m = static_cast<unsigned>((r + 2 * t) * (L::kRowNG * L::kMb) + half * (L::kNG * L::kMb));
  }
};

// The next tile a warp loads: its window slot's byte offsets (key codes, value codes, metadata) and
// its row in the slot, moved on by a whole step at a time (the division by the window once).
struct TileCursor {
  std::int64_t ok, ov, om;
  int row;
  __device__ __forceinline__ TileCursor(const AttnParams& p, std::int64_t t0) {
    const std::int64_t slot = static_cast<std::int64_t>((static_cast<unsigned long long>(t0) * p.div_magic) >> p.div_shift);
    row = static_cast<int>(t0 - slot * p.window);
    ok = slot * p.k.slot_codes, ov = slot * p.v.slot_codes, om = slot * p.k.slot_meta;  // (the values' slot_meta is the same)
  }
  __device__ __forceinline__ void advance(const AttnParams& p, int tokens) {
    row += tokens;
    while (row >= p.window) row -= p.window, ok += p.k.slot_codes, ov += p.v.slot_codes, om += p.k.slot_meta;
  }
};

// What a lane loads of one tile (LaneBase, TileCursor).
template <int KB, int VB, int META, int D, int GS>
struct TileRaw {
  using L = TileLayout<KB, VB, META, D, GS>;
  using Base = LaneBase<KB, VB, META, D, GS>;
  Raw<L::kKW> k[2];
  Raw<L::kMW> klo[2][L::kMT], ksc[2][L::kMT], vlo[2][L::kMT], vsc[2][L::kMT];
  Raw<L::kCV> v[4][L::kNG];
  __device__ __forceinline__ void load(const AttnParams& p, const Base& lb, const TileCursor& c) {
    const std::int64_t mo = c.om + (lb.m + static_cast<unsigned>(c.row) * (L::kRowNG * L::kMb));
    with_width<KB, kMaxKeyBits>(p.k.bits, [&](auto kb) {  // (the metadata's loads in each case: the same order as with a fixed width)
      constexpr int KBc = decltype(kb)::value, kRow = D * KBc / 8;
      const unsigned char* kc = p.k.codes + c.ok + (lb.k + static_cast<unsigned>(c.row) * kRow);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        Raw<L::kDW * KBc / 8> row;
        row.load(kc + 8 * n * kRow);
        store_prefix(k[n], row);
#pragma unroll
        for (int x = 0; x < L::kMT; ++x) {
          const int pr = (8 * n + x) * (L::kRowNG * L::kMb);
          klo[n][x].load(p.k.lo + mo + pr), ksc[n][x].load(p.k.scale + mo + pr);
          vlo[n][x].load(p.v.lo + mo + pr), vsc[n][x].load(p.v.scale + mo + pr);
        }
      }
    });
    with_width<VB, kAnyValueBits>(p.v.bits, [&](auto vb) {
      constexpr int VBc = decltype(vb)::value, kRow = D * VBc / 8;
      using VC = ValueChunk<VBc, GS>;
      const unsigned char* vc = p.v.codes + c.ov + (lb.v + static_cast<unsigned>(c.row) * kRow);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int gr = 0; gr < L::kNG; ++gr) {
          const unsigned char* at = vc + (8 * (u / 2) + u % 2) * kRow + gr * (GS * VBc / 8);
          if constexpr (VC::kByWords) {
            unsigned w[VC::kWords];
#pragma unroll
            for (int i = 0; i < VC::kWords; ++i) w[i] = i == 0 || i < lb.vwords ? __ldg(reinterpret_cast<const unsigned*>(at) + i) : 0u;
            store_prefix(v[u][gr], VC::from_words(w, lb.vshift));
          } else {
            Raw<VC::kBytes> x;
            x.load(at);
            store_prefix(v[u][gr], x);
          }
        }
      }
    });
  }
};

// Metadata value e of a tile's pair as a float (fp16: the half of its word converted in place).
template <int META, int BYTES>
__device__ __forceinline__ float pair_meta(const Raw<BYTES>& r, int e) {
  if constexpr (META == 0) {
    const __half2 h = *reinterpret_cast<const __half2*>(&r.w[e / 2]);
    return e % 2 ? __high2float(h) : __low2float(h);
  } else if constexpr (META == 1) {
    return __uint_as_float(r.w[e]);
  } else {
    return e4m3_to_float(static_cast<unsigned char>(r.byte(e)));
  }
}
// Metadata group gr (of the warp's) of token 2t + i of a tile's pair (TileLayout's kMT loads).
template <int META, int NG, int BYTES, int MT>
__device__ __forceinline__ float tile_meta(const Raw<BYTES> (&r)[MT], int i, int gr) {
  if constexpr (MT == 1) return pair_meta<META>(r[0], i * NG + gr);
  else return pair_meta<META>(r[i], gr);
}

// Blocks an SM the register budget is set for, where that spills nothing: 4 (128 registers) up to head
// dim 64 with one metadata group a row, 2-bit keys and 16-bit metadata (125-128 registers, against
// 133 and 3 blocks without the bound); 3 (170) for the same at groups of 32 (162-168, against 176
// and 2 blocks); else 2 (the kernel takes what it needs, up to 255).
template <int KB, int META, int D, int GS>
constexpr int tc_min_blocks() {
  return D <= 64 && GS == D && KB == 2 && META != 1 ? 4 : D <= 64 && KB == 2 && META != 1 ? 3 : 2;
}

template <int KB, int VB, int META, int D, int GS>
__global__ void __launch_bounds__(kThreads, tc_min_blocks<KB, META, D, GS>()) tc_kernel(const AttnParams p, int row0) {
  using L = TileLayout<KB, VB, META, D, GS>;
  constexpr int KS = L::kKS, NG = L::kNG, NTG = L::kNTG, H = L::kH, kTeams = kWarps / H;
  // maxima [teams][8], sums [teams][8], accumulators [teams][8][D]; with two warps a tile, then the
  // scores' exchange [2][warps][32] (float4)
  extern __shared__ float sm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int team = warp / H, half = warp % H;
  // blockIdx.z: the batch entry, then the block's group of kRows query rows after row0 (one launch
  // takes many groups: launch_tc_rows)
  const int split = blockIdx.x, h = blockIdx.y, b = static_cast<int>(blockIdx.z % static_cast<unsigned>(p.B));
  row0 += static_cast<int>(blockIdx.z / static_cast<unsigned>(p.B)) * kRows;
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;

  // query row g of the launch's rows (row0 + g): q in the keys' permuted order, placed as the A
  // registers take it, times the softmax scale in log2 units
  const int n_rows = p.query_rows(), row = row0 + g;
  const bool valid = row < n_rows;
  const int gq = valid ? row / p.Sq : 0, qi = valid ? row % p.Sq : 0;
  const float* qrow = p.q + ((static_cast<std::int64_t>(b) * p.Hq + h * (p.Hq / p.Hkv) + gq) * p.Sq + qi) * D;
  const int* kperm = p.k.perm ? p.k.perm + h * D : nullptr;
  const float qsc = p.scale * 1.4426950408889634f;
  float qv[KS][4], qg[NG], amax = 0.0f;
#pragma unroll
  for (int gr = 0; gr < NG; ++gr) qg[gr] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = half * L::kDW + 16 * ks + key_channel_of<KB>(p.k.bits, t, j);
      qv[ks][j] = valid ? qrow[kperm ? kperm[c] : c] * qsc : 0.0f;
      amax = fmaxf(amax, fabsf(qv[ks][j]));
      qg[ks * 16 / GS] += qv[ks][j];
    }
  }
  // the row's max |q| and group sums over the quad's four lanes (each holds a quarter of the row)
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, x));
#pragma unroll
    for (int gr = 0; gr < NG; ++gr) qg[gr] += __shfl_xor_sync(0xffffffffu, qg[gr], x);
  }
  int ex = 0;
  if (amax > 0.0f && amax < INFINITY) frexpf(amax, &ex);  // amax 2^-ex in [0.5, 1)
  const float down = ldexpf(1.0f, -ex), up = ldexpf(1.0f, ex);
  unsigned qa[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {  // (a0, a1) and (a2, a3): high parts, then low parts
      const float x0 = qv[ks][2 * pr] * down, x1 = qv[ks][2 * pr + 1] * down;
      const __half2 hi = __floats2half2_rn(x0, x1);
      const float2 hf = __half22float2(hi);
      const __half2 lo = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
      qa[ks][2 * pr] = *reinterpret_cast<const unsigned*>(&hi);
      qa[ks][2 * pr + 1] = *reinterpret_cast<const unsigned*>(&lo);
    }
  }
  const KeyLane<L::kKB> klane(t);  // (fixed key widths; the run-time widths make theirs a tile)
  const unsigned kone = opaque<0x3C003C00u>(), vone = opaque<0x3F803F80u>();
  [[maybe_unused]] const unsigned vlow = VB == 8 ? opaque<kLowPlaneOne>() : 0u;  // (8-bit values' low plane)
  // row g sees token T when T < lim (causal); none when the row is past the launch's
  const std::int64_t lim = valid ? p.kv_len - (p.Sq - 1 - qi) : 0;

  float m = -INFINITY, l = 0.0f, lacc[NG], o[NG][NTG][4];
#pragma unroll
  for (int gr = 0; gr < NG; ++gr) {
    lacc[gr] = 0.0f;
#pragma unroll
    for (int i = 0; i < NTG; ++i) o[gr][i][0] = o[gr][i][1] = o[gr][i][2] = o[gr][i][3] = 0.0f;
  }

  const auto visible = [&](std::int64_t T) { return T >= p.sinks && T < lim; };  // token T for row g
  float4* xch = reinterpret_cast<float4*>(sm + kTeams * kRows * (2 + D));
  int parity = 0;  // which of the exchange's two buffers this tile writes (two warps a tile)

  // one tile: its scores for row g, the online softmax, the values. MASKED: some token of the tile
  // is a sink or past a row's causal limit (its metadata may be anything: the chunk-0 rows below
  // n_sink are never written); else every token counts for every row.
  const auto tile = [&](const TileRaw<KB, VB, META, D, GS>& raw, std::int64_t t0, auto masked) {
    constexpr bool MASKED = decltype(masked)::value;
    float s[2][2];
    with_width<KB, kMaxKeyBits>(p.k.bits, [&](auto kb) {
      constexpr int KBc = decltype(kb)::value, kW = L::kDW * KBc / 8;
      const KeyLane<KBc> kl = [&] {
        if constexpr (KB == kAnyWidth) return KeyLane<KBc>(t);
        else return klane;
      }();
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float acc[NG][4];
#pragma unroll
        for (int gr = 0; gr < NG; ++gr) acc[gr][0] = acc[gr][1] = acc[gr][2] = acc[gr][3] = 0.0f;
        const Raw<kW> row = raw_prefix<kW>(raw.k[n]);
        key_steps<KBc, KS>(row.w, kl, kone, [&](int ks, unsigned b0, unsigned b1) { mma_f16(acc[ks * 16 / GS], qa[ks], b0, b1); });
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float sc;
#pragma unroll
          for (int gr = 0; gr < NG; ++gr) {
            const float sct = tile_meta<META, NG>(raw.ksc[n], i, gr) * static_cast<float>(1 << KBc);
            const float lot = tile_meta<META, NG>(raw.klo[n], i, gr) - sct;
            const float term = fmaf(sct * up, acc[gr][i] + acc[gr][2 + i], lot * qg[gr]);
            sc = gr == 0 ? term : sc + term;
          }
          if constexpr (MASKED && H == 1) sc = visible(t0 + 8 * n + 2 * t + i) ? sc : -INFINITY;
          s[n][i] = sc;
        }
      }
    });
    if constexpr (H == 2) {  // the other half's partial sums (the same lane of the team's other warp)
      xch[(parity * kWarps + warp) * 32 + lane] = make_float4(s[0][0], s[0][1], s[1][0], s[1][1]);
      team_barrier(team);
      const float4 o2 = xch[(parity * kWarps + (warp ^ 1)) * 32 + lane];
      s[0][0] += o2.x, s[0][1] += o2.y, s[1][0] += o2.z, s[1][1] += o2.w;
      parity ^= 1;  // (a warp writes this buffer again only after the team's next barrier)
      if constexpr (MASKED) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int i = 0; i < 2; ++i) s[n][i] = visible(t0 + 8 * n + 2 * t + i) ? s[n][i] : -INFINITY;
        }
      }
    }
    // online softmax for row g (the quad shares the tile's maximum)
    float mt = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float mnew = fmaxf(m, mt);
    float pw[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    if (!MASKED || mnew != -INFINITY) {
      const float corr = fast_exp2(m - mnew);
#pragma unroll
      for (int n = 0; n < 2; ++n) pw[n][0] = fast_exp2(s[n][0] - mnew), pw[n][1] = fast_exp2(s[n][1] - mnew);
      l = fmaf(l, corr, (pw[0][0] + pw[0][1]) + (pw[1][0] + pw[1][1]));
      if (corr != 1.0f) {
#pragma unroll
        for (int gr = 0; gr < NG; ++gr) {
          lacc[gr] *= corr;
#pragma unroll
          for (int i = 0; i < NTG; ++i) o[gr][i][0] *= corr, o[gr][i][1] *= corr, o[gr][i][2] *= corr, o[gr][i][3] *= corr;
        }
      }
      m = mnew;
    }
    // values, group by group
    with_width<VB, kAnyValueBits>(p.v.bits, [&](auto vb) {
      constexpr int VBc = decltype(vb)::value, CV = ValueChunk<VBc, GS>::kBytes;
#pragma unroll
      for (int gr = 0; gr < NG; ++gr) {
        float w[2][2];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float sct = tile_meta<META, NG>(raw.vsc[n], i, gr) * static_cast<float>(1 << VBc);
            float lot = tile_meta<META, NG>(raw.vlo[n], i, gr) - sct;
            if constexpr (VBc == 8) lot -= sct * 0.0625f;  // (the two planes' extra 2^-4)
            if constexpr (MASKED) {
              const bool on = pw[n][i] > 0.0f;
              w[n][i] = on ? pw[n][i] * sct : 0.0f;
              lacc[gr] = on ? fmaf(pw[n][i], lot, lacc[gr]) : lacc[gr];
            } else {
              w[n][i] = pw[n][i] * sct;
              lacc[gr] = fmaf(pw[n][i], lot, lacc[gr]);
            }
          }
        }
        unsigned a[4];
        split_bf16(w[0][0], w[0][1], a[0], a[1]);
        split_bf16(w[1][0], w[1][1], a[2], a[3]);
        const ValuePair<VBc, CV> lo(raw_prefix<CV>(raw.v[0][gr]), raw_prefix<CV>(raw.v[1][gr]));
        const ValuePair<VBc, CV> hi(raw_prefix<CV>(raw.v[2][gr]), raw_prefix<CV>(raw.v[3][gr]));
        [&]<int... I>(std::integer_sequence<int, I...>) {
          (mma_bf16(o[gr][I], a, lo.template reg<I>(vone), hi.template reg<I>(vone)), ...);
          if constexpr (VBc == 8) {  // the low nibbles
            (mma_bf16(o[gr][I], a, lo.template reg_low<I>(vlow), hi.template reg_low<I>(vlow)), ...);
          }
        }(std::make_integer_sequence<int, NTG>{});
      }
    });
  };
  const auto take = [&](const TileRaw<KB, VB, META, D, GS>& raw, std::int64_t t0) {
    // (a row past the launch's is not masked: its q is zero and its partial never stored)
    const bool whole = t0 >= p.sinks && (!valid || t0 + kTok <= lim);
    if (__all_sync(0xffffffffu, whole)) tile(raw, t0, std::false_type{});
    else tile(raw, t0, std::true_type{});
  };

  // the split's tiles, team w taking tiles w, w + teams, ...; up to 64 channels a warp each tile's
  // loads are issued while the one before is used (two buffers, used in turn)
  const LaneBase<KB, VB, META, D, GS> lb(p, bh, g, t, half);
  const std::int64_t s0 = static_cast<std::int64_t>(split) * p.split_len;
  const std::int64_t s1 = min(p.q_end, s0 + p.split_len);
  constexpr int kStep = kTok * kTeams;
  std::int64_t t0 = s0 + kTok * team;
  TileCursor cur(p, t0);  // the next tile to load
  if constexpr (L::kDW <= 64) {
    TileRaw<KB, VB, META, D, GS> ra, rb;
    if (t0 < s1) ra.load(p, lb, cur), cur.advance(p, kStep);
    for (; t0 < s1; t0 += 2 * kStep) {
      if (t0 + kStep < s1) rb.load(p, lb, cur), cur.advance(p, kStep);
      take(ra, t0);
      if (t0 + kStep >= s1) break;
      if (t0 + 2 * kStep < s1) ra.load(p, lb, cur), cur.advance(p, kStep);
      take(rb, t0 + kStep);
    }
  } else {  // (two buffers of a wider row spill at the 255-register limit)
    for (; t0 < s1; t0 += kStep) {
      TileRaw<KB, VB, META, D, GS> r;
      r.load(p, lb, cur), cur.advance(p, kStep);
      take(r, t0);
    }
  }
  if constexpr (H == 2) {
    // A team with a tile fewer than the other passes the exchange's barrier once more, so that
    // both have passed it as often when the block's barrier comes (compute-sanitizer's racecheck
    // counts a thread's barriers: with the counts apart it reported the merge below as a race).
    const std::int64_t tiles = s1 > s0 ? (s1 - s0 + kTok - 1) / kTok : 0;
    if ((tiles - team + kTeams - 1) / kTeams < (tiles + kTeams - 1) / kTeams) team_barrier(team);
  }

  // the quad's sums, then the block's warps merged: one partial per row and split
  l = quad_sum(l);
#pragma unroll
  for (int gr = 0; gr < NG; ++gr) lacc[gr] = quad_sum(lacc[gr]);
  float* sm_m = sm;
  float* sm_l = sm + kTeams * kRows;
  float* sm_acc = sm + 2 * kTeams * kRows;
  const int part = team * kRows + g;
  if (t == 0 && half == 0) sm_m[part] = m, sm_l[part] = l;  // (a team's two warps hold the same)
#pragma unroll
  for (int gr = 0; gr < NG; ++gr) {
#pragma unroll
    for (int i = 0; i < NTG; ++i) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int ch = half * L::kDW + gr * GS + (2 * t + c) * NTG + i;
        sm_acc[part * D + ch] = (o[gr][i][c] + o[gr][i][2 + c]) + lacc[gr];
      }
    }
  }
  __syncthreads();
  store_merged(p, b, h, row0, split, kTeams, kRows, sm_m, sm_l, sm_acc, D);
}

template <int D>
constexpr int tc_smem() {
  constexpr int teams = kWarps / tc_warps_a_tile(D);
  constexpr int exchange = tc_warps_a_tile(D) == 2 ? 2 * kWarps * 32 * 4 : 0;  // [2][warps][32] float4
  return (teams * kRows * (2 + D) + exchange) * static_cast<int>(sizeof(float));
}

// Groups of kRows query rows in a call.
int tc_row_groups(const AttnParams& p) { return (p.query_rows() + kRows - 1) / kRows; }

template <int D, int KB, int VB, int META, int GS>
void launch_tc_rows(const AttnParams& p, cudaStream_t stream) {
  const auto kernel = tc_kernel<KB, VB, META, D, GS>;
  allow_smem(kernel, tc_smem<D>());
  // every group of kRows query rows in one launch (blockIdx.z = group * B + b; at most
  // row_groups_a_launch(B) groups a launch), as the tuned path's integer tensor-core kernel
  for_row_group_launches(tc_row_groups(p), kRows, p.B, [&](int row, int ng) {
    kernel<<<dim3(p.body_splits, p.Hkv, static_cast<unsigned>(p.B * ng)), kThreads, tc_smem<D>(), stream>>>(p, row);
    SKVQ_CUDA_LAUNCH_CHECK();
  });
}

// The blocks of the kernel that fit an SM at once (looked up once a kernel).
template <int D, int KB, int VB, int META, int GS>
int tc_blocks_per_sm() {
  static const int n = [] {
    int b = 0;
    SKVQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, tc_kernel<KB, VB, META, D, GS>, kThreads, tc_smem<D>()));
    return std::max(b, 1);
  }();
  return n;
}

// f(D, GS) as integral constants, for the shapes the kernel takes (tc_shape_ok).
template <typename F>
bool with_tc_shape(int D, int GS, F&& f) {
  using std::integral_constant;
  if (D == 32 && GS == 32) return f(integral_constant<int, 32>{}, integral_constant<int, 32>{}), true;
  if (D == 64 && GS == 32) return f(integral_constant<int, 64>{}, integral_constant<int, 32>{}), true;
  if (D == 64 && GS == 64) return f(integral_constant<int, 64>{}, integral_constant<int, 64>{}), true;
  if (D == 96 && GS == 32) return f(integral_constant<int, 96>{}, integral_constant<int, 32>{}), true;
  if (D == 96 && GS == 96) return f(integral_constant<int, 96>{}, integral_constant<int, 96>{}), true;
  if (D == 128 && GS == 32) return f(integral_constant<int, 128>{}, integral_constant<int, 32>{}), true;
  if (D == 128 && GS == 64) return f(integral_constant<int, 128>{}, integral_constant<int, 64>{}), true;
  if (D == 128 && GS == 128) return f(integral_constant<int, 128>{}, integral_constant<int, 128>{}), true;
  if (D == 256 && GS == 32) return f(integral_constant<int, 256>{}, integral_constant<int, 32>{}), true;
  if (D == 256 && GS == 64) return f(integral_constant<int, 256>{}, integral_constant<int, 64>{}), true;
  if (D == 256 && GS == 128) return f(integral_constant<int, 256>{}, integral_constant<int, 128>{}), true;
  return false;
}

template <typename F>
bool with_tc_widths(int kb, int vb, F&& f) {
  using std::integral_constant;
  if (!tc_widths_ok(kb, vb)) return false;
  auto both = [&](auto k) {
    switch (vb) {
      case 2: f(k, integral_constant<int, 2>{}); break;
      case 4: f(k, integral_constant<int, 4>{}); break;
      default: f(k, k); break;  // (kb == vb: 1, 3, 5, 6 or 7)
    }
  };
  switch (kb) {
    case 2: both(integral_constant<int, 2>{}); break;
    case 4: both(integral_constant<int, 4>{}); break;
    case 1: f(integral_constant<int, 1>{}, integral_constant<int, 1>{}); break;
    case 3: f(integral_constant<int, 3>{}, integral_constant<int, 3>{}); break;
    case 5: f(integral_constant<int, 5>{}, integral_constant<int, 5>{}); break;
    case 6: f(integral_constant<int, 6>{}, integral_constant<int, 6>{}); break;
    default: f(integral_constant<int, 7>{}, integral_constant<int, 7>{}); break;
  }
  return true;
}

// The run-time widths' kernel at kAnyWidthsD: every metadata type at groups of 64 and 128 (229-255
// registers, no spills), fp16 and e4m3 at groups of 32 (255 registers, 8 bytes of spills); not fp32
// metadata at groups of 32, where the four groups' fp32 minima and scales of a tile beside the widest
// case's codes spilled 700 bytes (ptxas, session 63; those pairs stay on the float kernel).
constexpr bool tc_any_meta_ok(int meta, int group) { return meta != 1 || group != 32; }

// Whether p's widths take the kernel at p's head dim and metadata: a pair with its own kernel, or at
// kAnyWidthsD any pair of widths it can hold (the widths read at run time).
bool tc_widths_take(const AttnParams& p) {
  return tc_widths_ok(p.k.bits, p.v.bits) ||
         (p.D == kAnyWidthsD && tc_any_widths_ok(p.k.bits, p.v.bits) && tc_any_meta_ok(p.meta, p.group));
}

// f(D, KB, VB, META, GS) as integral constants for p's shape (tc_shape_ok(p) true; KB = VB =
// kAnyWidth: the widths read at run time). (Every group with_tc_shape takes has whole-word value
// segments at every width: TileLayout asserts it.)
template <typename F>
void with_tc_kernel(const AttnParams& p, F&& f) {
  bool found = false;
  const bool ok = with_tc_shape(p.D, p.group, [&](auto d, auto gs) {
    // f at p's metadata type (the run-time widths' kernel has none for fp32 metadata at groups of 32:
    // tc_any_meta_ok)
    const auto by_meta = [&](auto k, auto v) {
      found = true;
      constexpr bool fp32_ok = decltype(k)::value != kAnyWidth || tc_any_meta_ok(1, decltype(gs)::value);
      if (p.meta == 0) f(d, k, v, std::integral_constant<int, 0>{}, gs);
      else if (p.meta == 2) f(d, k, v, std::integral_constant<int, 2>{}, gs);
      else if constexpr (fp32_ok) f(d, k, v, std::integral_constant<int, 1>{}, gs);
    };
    if (with_tc_widths(p.k.bits, p.v.bits, by_meta)) return;
    if constexpr (decltype(d)::value == kAnyWidthsD) {
      using Any = std::integral_constant<int, kAnyWidth>;
      if (!tc_any_widths_ok(p.k.bits, p.v.bits) || !tc_any_meta_ok(p.meta, p.group)) return;
      if (p.v.bits == 8) by_meta(Any{}, std::integral_constant<int, 8>{});  // (its own build: kAnyValueBits)
      else by_meta(Any{}, Any{});
    }
  });
  if (!ok || !found) {
    throw Error("skvq: cuda attend: the tensor-core general kernel does not take D=" + std::to_string(p.D) + " group=" +
                std::to_string(p.group) + " with " + std::to_string(p.k.bits) + "-bit keys and " + std::to_string(p.v.bits) +
                "-bit values");
  }
}

}  // namespace

bool tc_shape_ok(const AttnParams& p) {
  static const bool off = env_switch("SKVQ_CUDA_GENERAL") == "float";
  if (off || p.q_end <= 0 || p.window % kTok != 0) return false;
  if (p.D != p.Dv || p.group != p.group_v) return false;
  if (!tc_widths_take(p)) return false;
  return with_tc_shape(p.D, p.group, [](auto, auto) {});
}

void plan_tc(AttnParams& p, int requested_splits) {
  // One wave: as many splits a KV head as fill the SMs' resident blocks, each at least 4 tiles a
  // warp. (A second, partial wave runs alone after the first: the first kernel put 576 blocks on
  // 528 places at D = 64, B = 8, 128k, the last 48 of them by themselves; docs/performance.md.)
  int sms = 132, dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  int per_sm = 1;
  with_tc_kernel(p, [&](auto d, auto k, auto v, auto meta, auto gs) {
    per_sm = tc_blocks_per_sm<decltype(d)::value, decltype(k)::value, decltype(v)::value, decltype(meta)::value, decltype(gs)::value>();
  });
  // (each group of kRows query rows counts as a head: launch_tc_rows takes them side by side)
  const std::int64_t heads = static_cast<std::int64_t>(p.B) * p.Hkv * tc_row_groups(p), slots = static_cast<std::int64_t>(per_sm) * sms;
  std::int64_t splits = requested_splits;
  if (splits <= 0) {
    splits = std::max<std::int64_t>(1, slots / heads);
    splits = std::max<std::int64_t>(1, std::min(splits, (p.q_end + kMinTileSplit - 1) / kMinTileSplit));
  }
  std::int64_t len = (p.q_end + splits - 1) / splits;
  len = (len + kTok * kWarps - 1) / (kTok * kWarps) * (kTok * kWarps);
  p.split_len = len;
  p.body_splits = static_cast<int>((p.q_end + len - 1) / len);
  // the exact tokens (sinks and tail) in splits of their own, of at most 1024 tail tokens each
  const std::int64_t tail = p.kv_len - p.q_end;
  const std::int64_t nx = std::max<std::int64_t>(1, (tail + 1023) / 1024);
  p.exact_len = std::max<std::int64_t>(1, (tail + nx - 1) / nx);
  p.splits = p.body_splits + static_cast<int>(nx);
}

void launch_tc(const AttnParams& p, cudaStream_t stream) {
  with_tc_kernel(p, [&](auto d, auto k, auto v, auto meta, auto gs) {
    launch_tc_rows<decltype(d)::value, decltype(k)::value, decltype(v)::value, decltype(meta)::value, decltype(gs)::value>(p, stream);
  });
}

}  // namespace skvq::cuda
