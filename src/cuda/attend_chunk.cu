// The chunk kernel (session 51): the packed body for many query rows a KV head at once (a chunked
// prefill, long speculative checks), where attn_imma_kernel takes 8 rows a block and each block
// unpacks every history token for itself.
//
// A block (4 warps) owns one (batch, kv head, split of the packed body) and kChunkRows = 64 query
// rows, 16 a warp, and streams the split's 128-token tiles through the same cp.async ring as the
// other pipelined kernels (TileStream). Each tile is unpacked once a block into shared memory: key
// codes one byte each, value codes as fp16 integers (exact: codes up to 255). Every warp then runs
// its rows over all 128 tokens of the tile from there (ldmatrix), in two halves of 64 tokens (an
// online-softmax step each), so the unpacking is shared by 64 rows instead of 8 and each B fragment
// a warp loads by 16:
//   scores  int8 mma.sync m16n8k32 (exact int32 sums), one a row set of 8 rows: A = q rounded to 16
//           bits against its row's max |q| (A rows 0-7 the high bytes, rows 8-15 the low bytes), B =
//           key codes; a token's score is sum over its key groups of ksc * step * (256 hi + lo) +
//           klo * sum(q), the integer form of attn_imma_kernel (docs/numerics.md);
//   values  fp16 mma.sync m16n8k16 (fp32 sums), A rows 0-7 one row set's weights p * vsc * 2^E,
//           rows 8-15 the other's, each rounded once to fp16 (to within 2^-11 of itself: half the
//           GPU tests' allowance for the value weights, docs/numerics.md); 2^E, a power of two the
//           warp keeps, puts the largest value scale seen so far just below 2^15, so no weight
//           overflows fp16 and none underflows by more than 2^-39 of that scale; when a tile's
//           scales need a smaller E the sums are scaled by the exact power of two; B = value codes;
//           sum(p * vlo) alongside in float.
// Rows are independent of each other, so the warps need no merge: each writes its rows' partials.
// The channel order inside the unpacked rows is free (q is placed to match; the values' order is
// undone when the partials are written) and is chosen so that a 32-bit word of packed codes turns
// into its unpacked bytes or bf16 pairs with one shift and one mask each.
// Measured (session 51, docs/performance.md "Chunked prefill"): 8 rows a warp and 32 a block ran
// only 1.1-1.6x faster than attn_imma_kernel (two warps a scheduler at 213-253 registers: latency,
// not issue, bound); int8 value products (weights rounded to 16 bits per 64 tokens, value codes
// transposed into shared memory) were no faster than the bf16 ones at K2V2 and 1.3x slower at K4V4.
// Until session 58 the value products ran twice, on the weights' high and low bf16 parts (to within
// 2^-18); one fp16 product a weight halves them (docs/performance.md, "Chunked prefill (session 58)").
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "cuda/kernels.cuh"
#include "cuda/pipeline.cuh"

namespace skvq::cuda {

namespace {

constexpr int kKsStride = kD + 16;  // bytes a row of unpacked key codes (144: ldmatrix rows on distinct banks)
constexpr int kVsStride = kD + 8;   // fp16 a row of unpacked value codes (272 bytes: likewise)
constexpr int kWarpRows = 16;       // query rows a warp (two row sets of 8)
constexpr int kHalf = 64;           // tokens an online-softmax step (half a tile)
static_assert(kChunkRows == kWarpRows * kThreads / 32, "16 rows a warp");

// Unpacked key column c holds channel chunk_key_channel<KB>(c) of the packed (permuted) row: a
// packed word of 4 PK codes becomes PK words, word k holding code k of each of its 4 bytes.
template <int KB>
__host__ __device__ constexpr int chunk_key_channel(int c) {
  constexpr int PK = 8 / KB, W = 4 * PK;
  const int r = c % W;
  return c - r + PK * (r % 4) + r / 4;
}
// Unpacked value column c holds channel chunk_value_channel<VB>(c): a packed word of 32 / VB codes
// becomes 16 / VB fp16 pairs, pair k holding codes k and 16 / VB + k (the word's halves); 8-bit
// codes stay in order.
template <int VB>
__host__ __device__ constexpr int chunk_value_channel(int c) {
  if (VB == 8) return c;
  constexpr int W = 32 / VB, H = W / 2;
  const int r = c % W;
  return c - r + (r % 2) * H + r / 2;
}

__device__ __forceinline__ void ldsm_x4(const void* p, unsigned (&r)[4]) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t(const void* p, unsigned (&r)[4]) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// The exponent E that puts the tile's largest value scale just below 2^15 (14 less its binary
// exponent), the same in every lane; INT_MAX where the tile's live rows hold no positive scale. Each
// lane takes every 32nd of the live rows' scales (stale rows past `live` may hold anything).
template <int META, int NG>
__device__ __forceinline__ int tile_value_exponent(const unsigned char* vsc, int live, int lane) {
  constexpr int mb = meta_bytes<META>();
  float mx = 0.0f;
#pragma unroll
  for (int k = 0; k < kFastTile / 32; ++k) {
    const int row = lane + 32 * k;
#pragma unroll
    for (int vg = 0; vg < NG; ++vg)
      if (row < live) mx = fmaxf(mx, fabsf(load_meta(vsc + (row * NG + vg) * mb, META)));
  }
  // non-negative floats order as their bits do
  const unsigned top = __reduce_max_sync(0xffffffffu, __float_as_uint(mx));
  if (top == 0u || top >= 0x7f800000u) return top == 0u ? INT_MAX : -113;
  const int e = static_cast<int>(top >> 23) - 127;  // scales are normal floats (>= 2^-27)
  return min(14 - e, 126);
}

// The tile's key codes into Ks (one byte a code, chunk_key_channel order), all threads.
template <int KB>
__device__ __forceinline__ void unpack_keys(const unsigned char* kc, unsigned char* Ks) {
  constexpr int PK = 8 / KB, KROW = 16 * KB, PARTS = KROW / 16;
  constexpr unsigned kMask = ((1u << KB) - 1u) * 0x01010101u;
#pragma unroll
  for (int it = 0; it < kFastTile * PARTS / kThreads; ++it) {
    const int c = threadIdx.x + it * kThreads, row = c / PARTS, part = c % PARTS;
    const uint4 w = *reinterpret_cast<const uint4*>(kc + row * KROW + part * 16);
    unsigned char* dst = Ks + row * kKsStride + part * 16 * PK;
    if constexpr (PK == 1) {
      *reinterpret_cast<uint4*>(dst) = w;
    } else {
      const unsigned in[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (PK == 4) {
          *reinterpret_cast<uint4*>(dst + 16 * i) =
              make_uint4(in[i] & kMask, (in[i] >> 2) & kMask, (in[i] >> 4) & kMask, (in[i] >> 6) & kMask);
        } else {
          *reinterpret_cast<uint2*>(dst + 8 * i) = make_uint2(in[i] & kMask, (in[i] >> 4) & kMask);
        }
      }
    }
  }
}

// The tile's value codes into Vs (fp16 integers, chunk_value_channel order), all threads.
template <int VB>
__device__ __forceinline__ void unpack_values(const unsigned char* vc, __half* Vs) {
  constexpr int VROW = 16 * VB, PARTS = VROW / 16, PV = 8 / VB;
#pragma unroll
  for (int it = 0; it < kFastTile * PARTS / kThreads; ++it) {
    const int c = threadIdx.x + it * kThreads, row = c / PARTS, part = c % PARTS;
    const uint4 w = *reinterpret_cast<const uint4*>(vc + row * VROW + part * 16);
    const unsigned in[4] = {w.x, w.y, w.z, w.w};
    unsigned* dst = reinterpret_cast<unsigned*>(Vs + row * kVsStride + part * 16 * PV);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (VB == 8) {  // bytes 2k, 2k + 1 through float (2^23 + byte, less 2^23: exact)
        unsigned o[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const float a = __uint_as_float(__byte_perm(in[i], 0x4B000000u, 0x7540u | (2 * k))) - 8388608.0f;
          const float b = __uint_as_float(__byte_perm(in[i], 0x4B000000u, 0x7540u | (2 * k + 1))) - 8388608.0f;
          const __half2 h = __floats2half2_rn(a, b);
          o[k] = *reinterpret_cast<const unsigned*>(&h);
        }
        *reinterpret_cast<uint2*>(dst + 2 * i) = make_uint2(o[0], o[1]);
      } else {  // pairs (k, H + k) as fp16 1024 + code (0x6400 | code), less 1024: exact
        constexpr int H = 16 / VB;  // pairs a word
        constexpr unsigned kMask2 = ((1u << VB) - 1u) * 0x00010001u;
        const __half2 base = __floats2half2_rn(1024.0f, 1024.0f);
        unsigned o[H];
#pragma unroll
        for (int k = 0; k < H; ++k) {
          const unsigned x = ((in[i] >> (VB * k)) & kMask2) | 0x64006400u;
          const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&x), base);
          o[k] = *reinterpret_cast<const unsigned*>(&d);
        }
#pragma unroll
        for (int k = 0; k < H; k += 4) *reinterpret_cast<uint4*>(dst + H * i + k) = make_uint4(o[k], o[k + 1], o[k + 2], o[k + 3]);
      }
    }
  }
}

template <int KB, int VB, int META, int GS>
__global__ void __launch_bounds__(kThreads, 2) attn_chunk_kernel(const AttnParams p, int row0) {
  start_body();
  extern __shared__ __align__(16) unsigned char smem[];
  static_assert(GS == 32 || GS == 64 || GS == 128, "group size");
  static_assert(VB >= 2, "fp16 value pairs");
  constexpr int gshift = GS == 32 ? 0 : GS == 64 ? 1 : 2, spg = 1 << gshift;  // k-steps (32 channels) a group
  constexpr int kgs = 2 - gshift;                                             // log2 of the groups a row
  constexpr int NG = 1 << kgs;                                                // groups a row
  constexpr int mb = meta_bytes<META>();
  const FastLayout<kFastTile> lay(p);
  unsigned char* ring = smem;
  unsigned char* Ks = smem + kStages * lay.stage;
  auto* Vs = reinterpret_cast<__half*>(Ks + kFastTile * kKsStride);
  // blockIdx.z: the batch entry, then the block's group of kChunkRows query rows after row0
  const int split = blockIdx.x, h = blockIdx.y, b = static_cast<int>(blockIdx.z % static_cast<unsigned>(p.B));
  row0 += static_cast<int>(blockIdx.z / static_cast<unsigned>(p.B)) * kChunkRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int G = p.Hq / p.Hkv, n_rows = p.query_rows();
  const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hkv + h;
  const int* kperm = p.k.perm ? p.k.perm + h * kD : nullptr;
  const TileStream<kFastTile, KB, VB> tiles(p, lay, ring, bh, split);
  tiles.start();

  // This lane's two query rows: r = 0, 1 is row 16 warp + 8 r + g of the block. q rounded to 16 bits
  // against its row's max |q| (attn_imma_kernel's form); qa[r][ks]: the score MMAs' A fragment of
  // row set r, k-step ks (a0: rows high bytes, a1: low bytes (A rows 8-15), a2, a3: k + 16).
  unsigned qa[2][4][4];
  float qstep[2], qsg[2][NG];
  std::int64_t limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + kWarpRows * warp + 8 * r + g;
    const bool valid = row < n_rows;
    const int gq = valid ? row / p.Sq : 0, qi = valid ? row % p.Sq : 0;
    const float* qrow = p.q + ((static_cast<std::int64_t>(b) * p.Hq + h * G + gq) * p.Sq + qi) * kD;
    limit[r] = valid ? p.kv_len - p.Sq + qi : -1;
    float qs[4];
    qstep[r] = q16_fragments(qrow, kperm, valid, p.scale,
                             [t](int ks, int e, int j) { return chunk_key_channel<KB>(32 * ks + 16 * e + 4 * t + j); }, qa[r], qs);
#pragma unroll
    for (int kg = 0; kg < NG; ++kg) qsg[r][kg] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) qsg[r][ks >> gshift] += qs[ks];
  }

  // Online softmax of each row over the tokens of this lane (m shared by the row's 4 lanes, l this
  // lane's share); acc[nt]: value n-tile nt, columns 8 nt + 2 t + i of row set 0 ([i]) and of row
  // set 1 ([2 + i]), times 2^E (the value MMAs' A rows 0-7 are row set 0's weights, rows 8-15 row set
  // 1's); lacc[r][vg]: sum of p * vlo of value group vg over this lane's tokens.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[16][4], lacc[2][NG];
  int E = INT_MAX;  // the weights' exponent (none yet: acc is zero)
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int vg = 0; vg < NG; ++vg) lacc[0][vg] = lacc[1][vg] = 0.0f;

  for (int tile = 0; tile < tiles.n_tiles; ++tile) {
    const unsigned char* stage = tiles.acquire(tile);  // (its barrier: every warp is done with Ks, Vs)
    unpack_keys<KB>(stage + lay.kc, Ks);
    unpack_values<VB>(stage + lay.vc, Vs);
    __syncthreads();
    const std::int64_t t0 = tiles.first_token(tile);
    const int live = tiles.live_rows(tile);  // rows past it hold stale bytes: masked, values zeroed
    const int e_tile = tile_value_exponent<META, NG>(stage + lay.vsc, live, lane);
    if (e_tile < E) {  // larger scales than any before: smaller weights, the sums so far likewise (exact)
      if (E != INT_MAX) {  // 2^(e_tile - E) as two factors, each within float's normal range
        const int d = e_tile - E;
        const float f0 = pow2(d / 2), f1 = pow2(d - d / 2);
#pragma unroll
        for (int nt = 0; nt < 16; ++nt)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[nt][j] = acc[nt][j] * f0 * f1;
      }
      E = e_tile;
    }
    const float wscale = E == INT_MAX ? 1.0f : pow2(E);
    auto rel = [t0](std::int64_t x) { return static_cast<int>(x < t0 ? -1 : x - t0 > kFastTile ? kFastTile : x - t0); };
    const int lo = rel(p.sinks), hi0 = min(rel(limit[0]), live - 1), hi1 = min(rel(limit[1]), live - 1);

    // the tile in two halves of 64 tokens (one online-softmax step each: fewer live registers)
#pragma unroll 1
    for (int half = 0; half < kFastTile / kHalf; ++half) {
      const int h0 = half * kHalf;
      // scores of tokens h0 + 8 nt + 2 t + i (C columns); B: keys of token h0 + 8 nt + g, by
      // ldmatrix (lane l addresses row l % 8 of matrix l / 8: 16 bytes at column 16 (l / 8) of the
      // k-step pair), shared by the two row sets
      float s[2][kHalf / 8][2];
#pragma unroll
      for (int nt = 0; nt < kHalf / 8; ++nt) {
        const unsigned char* kr = Ks + (h0 + 8 * nt + lane % 8) * kKsStride + 16 * (lane / 8);
        unsigned kb[2][4];
        ldsm_x4(kr, kb[0]);       // k-steps 0, 1
        ldsm_x4(kr + 64, kb[1]);  // k-steps 2, 3
        float sc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
        for (int kg = 0; kg < NG; ++kg) {
          int c[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
          for (int ks = kg * spg; ks < (kg + 1) * spg; ++ks)
#pragma unroll
            for (int r = 0; r < 2; ++r) imma<true, false>(c[r], qa[r][ks], kb[ks / 2][2 * (ks % 2)], kb[ks / 2][2 * (ks % 2) + 1]);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int mo = (((h0 + 8 * nt + 2 * t + i) << kgs) + kg) * mb;
            const float ksc = load_meta(stage + lay.ksc + mo, META), klo = load_meta(stage + lay.klo + mo, META);
#pragma unroll
            for (int r = 0; r < 2; ++r)
              sc[r][i] += fmaf(ksc * qstep[r], static_cast<float>(c[r][i] * 256 + c[r][2 + i]), klo * qsg[r][kg]);
          }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int local = h0 + 8 * nt + 2 * t + i;
          s[0][nt][i] = (local >= lo && local <= hi0) ? sc[0][i] : -INFINITY;
          s[1][nt][i] = (local >= lo && local <= hi1) ? sc[1][i] : -INFINITY;
        }
      }

      float pw[2][kHalf / 8][2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float corr = softmax_step<kHalf / 8, 1, 2>(s[r], m[r], l[r], pw[r]);
        if (corr != 1.0f) {
#pragma unroll
          for (int nt = 0; nt < 16; ++nt) acc[nt][2 * r] *= corr, acc[nt][2 * r + 1] *= corr;
#pragma unroll
          for (int vg = 0; vg < NG; ++vg) lacc[r][vg] *= corr;
        }
      }

      // values, 16 tokens (k) at a time: tokens h0 + 16 kt + 2 t + i (scores n-tile 2 kt) and
      // h0 + 16 kt + 8 + 2 t + i (n-tile 2 kt + 1); B by ldmatrix.trans (lane l addresses token row
      // l % 8 of the 8 + 8 tokens' half (l / 8) % 2, channels of n-tile 2 np + l / 16)
#pragma unroll
      for (int kt = 0; kt < kHalf / 16; ++kt) {
#pragma unroll
        for (int vg = 0; vg < NG; ++vg) {
          float u[2][4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int local = h0 + 16 * kt + 8 * (e / 2) + 2 * t + e % 2;
            const int mo = ((local << kgs) + vg) * mb;
            const bool ok = local < live;  // weight 0 either way, but stale metadata could be NaN
            const float vs = ok ? load_meta(stage + lay.vsc + mo, META) * wscale : 0.0f;  // exact
            const float vl = ok ? load_meta(stage + lay.vlo + mo, META) : 0.0f;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const float pe = pw[r][2 * kt + e / 2][e % 2];
              u[r][e] = pe * vs;
              lacc[r][vg] = fmaf(pe, vl, lacc[r][vg]);
            }
          }
          unsigned a[4];  // a0: row set 0, k 2 t, 2 t + 1; a1: row set 1; a2, a3: k + 8
          a[0] = pack_half2(u[0][0], u[0][1]);
          a[1] = pack_half2(u[1][0], u[1][1]);
          a[2] = pack_half2(u[0][2], u[0][3]);
          a[3] = pack_half2(u[1][2], u[1][3]);
          const __half* vr = Vs + (h0 + 16 * kt + 8 * ((lane / 8) % 2) + lane % 8) * kVsStride + 8 * (lane / 16);
#pragma unroll
          for (int np = vg * (GS / 16); np < (vg + 1) * (GS / 16); ++np) {
            unsigned vb[4];
            ldsm_x4_t(vr + 16 * np, vb);
            mma_f16(acc[2 * np], a, vb[0], vb[1]);
            mma_f16(acc[2 * np + 1], a, vb[2], vb[3]);
          }
        }
      }
    }
  }

  // each warp's rows are its own: their partials through shared memory (over the unpacked tiles)
  __shared__ float sm_m[kChunkRows], sm_l[kChunkRows];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
#pragma unroll
    for (int vg = 0; vg < NG; ++vg) lacc[r][vg] = quad_sum(lacc[r][vg]);
  }
  __syncthreads();  // every warp is done with Ks and Vs
  float* sm_acc = reinterpret_cast<float*>(Ks);  // [kChunkRows][kD]: 32 KB of the 52 KB of Ks and Vs
  const float unscale = E == INT_MAX ? 1.0f : pow2(-E);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = kWarpRows * warp + 8 * r + g;
    if (t == 0) sm_m[row] = m[r], sm_l[row] = l[r];
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int col = 8 * nt + 2 * t + i;
        sm_acc[row * kD + chunk_value_channel<VB>(col)] = fmaf(acc[nt][2 * r + i], unscale, lacc[r][col / GS]);
      }
  }
  __syncthreads();
  store_merged(p, b, h, row0, split, 1, kChunkRows, sm_m, sm_l, sm_acc, kD);
}

template <int KB, int VB, int META>
BodyKernelFn chunk_by_group(int group) {
  if (group == 32) return attn_chunk_kernel<KB, VB, META, 32>;
  if (group == 64) return attn_chunk_kernel<KB, VB, META, 64>;
  return attn_chunk_kernel<KB, VB, META, 128>;
}
template <int KB, int VB>
BodyKernelFn chunk_by_meta(const AttnParams& p) {
  if (p.meta == 0) return chunk_by_group<KB, VB, 0>(p.group);
  if (p.meta == 1) return chunk_by_group<KB, VB, 1>(p.group);
  return chunk_by_group<KB, VB, 2>(p.group);
}

}  // namespace

bool chunk_shape_ok(const AttnParams& p) {
  const bool groups = p.group == 32 || p.group == 64 || p.group == 128;
  const int kb = p.k.bits, vb = p.v.bits;
  const bool bits = (kb == 2 && vb == 2) || (kb == 4 && vb == 4) || (kb == 8 && vb == 8) || (kb == 4 && vb == 2) ||
                    (kb == 8 && vb == 4);
  return groups && bits && p.D == kD && (p.Dv == 0 || p.Dv == kD);
}

BodyKernelFn chunk_kernel(const AttnParams& p) {
  if (!chunk_shape_ok(p)) return nullptr;
  const int kb = p.k.bits, vb = p.v.bits;
  if (kb == 2) return chunk_by_meta<2, 2>(p);
  if (kb == 4 && vb == 4) return chunk_by_meta<4, 4>(p);
  if (kb == 4) return chunk_by_meta<4, 2>(p);
  if (vb == 8) return chunk_by_meta<8, 8>(p);
  return chunk_by_meta<8, 4>(p);
}

int chunk_smem_bytes(const AttnParams& p) {
  return kStages * FastLayout<kFastTile>(p).stage + kFastTile * kKsStride + kFastTile * kVsStride * 2;
}

}  // namespace skvq::cuda
