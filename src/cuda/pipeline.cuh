// The packed body's pipeline, shared by the tuned attention kernels (attend.cu) and the chunk
// kernel (attend_chunk.cu): the block shape, programmatic dependent launch, the integer forms of q
// and of value weights, the online-softmax step of the tensor-core kernels, the int8 MMA, and the
// tiles of packed codes and metadata streamed through a cp.async ring in shared memory. Included
// by one translation unit each (an anonymous namespace: each gets its own copies).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/device_state.cuh"
#include "cuda/partials.cuh"

namespace skvq::cuda {

namespace {

constexpr int kCPL = 16;     // codes (channels) per lane
constexpr int kLanes = 8;    // lanes per token: D = 128
constexpr int kD = kCPL * kLanes;
constexpr int kThreads = 128;

// Programmatic dependent launch (sm_90): the pipelined kernels let the
// combine kernel start while they run (each block signals at its start,
// once its own wait below is over, so the combine grid launches once the
// last wave of the body is resident), and the combine kernel waits for their
// completion and memory before it reads the workspace. Launched without the
// attribute (older GPUs, the general kernel's path) the wait returns at
// once: the stream already ordered them.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// The first thing a pipelined kernel's block does. The body launch is itself
// a programmatic dependent of whatever the stream ran before it (since
// session 39; SKVQ_CUDA_BODY_PDL=0: not), so its blocks may be resident
// while that work ends: each waits for it before it reads anything, and
// only then lets the combine kernel start, whose exact part (the query, the
// sinks and the tail) is read before the combine's own wait.
__device__ __forceinline__ void start_body() {
  wait_prerequisites();
  launch_dependents();  // the combine kernel may start (it waits for this grid's results)
}

// The integer forms shared by the dp4a and tensor-core paths (docs/numerics.md):
// q rounded to 16 bits against its row's max |q| as a high and a low byte
// (q ~ (256 hi + lo) * step), and value weights rounded to 16 unsigned bits
// against their block's maximum (u ~ r * step).
__device__ __forceinline__ float q16_step(float qmax) { return qmax > 0.0f ? qmax / 32512.0f : 1.0f; }
__device__ __forceinline__ void q16_split(float x, float step, int& hi, int& lo) {
  const int r = static_cast<int>(fminf(fmaxf(rintf(x / step), -32512.0f), 32512.0f));
  hi = (r + 128) >> 8;  // floor: lo in [-128, 127]
  lo = r - 256 * hi;
}
// One query row as the A fragments of the integer score MMAs (m16n8k32; a row's 32 channels a lane,
// its 4 lanes t = lane % 4 together): channel(ks, e, j) is the channel of this lane's value j of
// half e of k-step ks; q in log2 units (times scale / ln 2; 0 for an invalid row), rounded to 16
// bits against the row's max |q|. qa[ks][2 e] holds the high bytes, qa[ks][2 e + 1] the low ones;
// qs[ks] is the row's sum of q over k-step ks (all 4 lanes); returns the rounding step.
template <typename Channel>
__device__ __forceinline__ float q16_fragments(const float* qrow, const int* kperm, bool valid, float scale, Channel channel,
                                               unsigned (&qa)[4][4], float (&qs)[4]) {
  float qf[4][2][4], qmax = 0.0f;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    qs[ks] = 0.0f;
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int ch = channel(ks, e, j);
        qf[ks][e][j] = valid ? qrow[kperm ? kperm[ch] : ch] * (scale * 1.4426950408889634f) : 0.0f;  // log2 units
        qmax = fmaxf(qmax, fabsf(qf[ks][e][j]));
        qs[ks] += qf[ks][e][j];
      }
  }
  qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 1));
  qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 2));
  const float qstep = q16_step(qmax);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    qs[ks] += __shfl_xor_sync(0xffffffffu, qs[ks], 1);
    qs[ks] += __shfl_xor_sync(0xffffffffu, qs[ks], 2);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      unsigned hp = 0, lp = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int hi, lo;
        q16_split(qf[ks][e][j], qstep, hi, lo);
        hp |= static_cast<unsigned>(hi & 0xFF) << (8 * j);
        lp |= static_cast<unsigned>(lo & 0xFF) << (8 * j);
      }
      qa[ks][2 * e] = hp, qa[ks][2 * e + 1] = lp;
    }
  }
  return qstep;
}
struct W16 {
  float step, inv;  // u ~ r * step, r = rint(u * inv) in [0, 65535]
  __device__ __forceinline__ unsigned round(float u) const { return __float2uint_rn(fminf(u * inv, 65535.0f)); }
  // r in the low 16 bits (above them the bits of 2^23; the callers' byte permutes take bytes 0
  // and 1): u * inv + 2^23 rounded once to float (whose ulp there is 1) is 2^23 + rint(u * inv),
  // without a conversion instruction. For 0 <= u <= umax, the block's maximum of the very values
  // rounded (as every caller has it), and inv from w16_fast, no clamp is needed: step =
  // RN(umax RN(1/65535)) is normal (umax >= 2^-100, else inv = 0) and rcp.approx is at most 1 ulp
  // off, so u * inv <= 65535 (1 + 2^-21) < 65535.5 and the sum rounds to at most 2^23 + 65535
  // (docs/numerics.md).
  __device__ __forceinline__ unsigned round_low16(float u) const { return __float_as_uint(fmaf(u, inv, 8388608.0f)); }
};
// The step of a block of weights whose largest is umax, and its correctly rounded reciprocal.
__device__ __forceinline__ W16 w16_of(float umax) {
  const float step = umax * (1.0f / 65535.0f);
  return W16{step, umax > 0.0f ? __frcp_rn(step) : 0.0f};
}
// w16_of with the reciprocal by rcp.approx (at most 1 ulp off, docs/numerics.md);
// a block whose largest weight is below 2^-100 of the softmax's running
// maximum gets all-zero weights (their share of any output is below 2^-90).
// With round_low16 in every kernel but the dp4a kernel's one-group-a-row path:
// measured faster in each of them, 3% slower there (docs/performance-history.md, session 21).
__device__ __forceinline__ W16 w16_fast(float umax) {
  const float step = umax * (1.0f / 65535.0f);
  float inv;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(inv) : "f"(step));
  return W16{step, umax >= 0x1p-100f ? inv : 0.0f};
}

// One online-softmax step of a query row in the tensor-core kernels: this
// lane holds N of the row's scores and the row's other lanes are those
// reached by the XOR shuffles. Weights into pw, the row's max m and sum l
// (this lane's share) updated; returns the factor (1 when none) by which the
// caller must scale the row's accumulators.
template <int N, int... XOR>
__device__ __forceinline__ float softmax_step(const float (&s)[N], float& m, float& l, float (&pw)[N]) {
  float mt = s[0];
#pragma unroll
  for (int e = 1; e < N; ++e) mt = fmaxf(mt, s[e]);
  ((mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, XOR))), ...);
  const float mnew = fmaxf(m, mt);
  if (mnew == -INFINITY) {
#pragma unroll
    for (int e = 0; e < N; ++e) pw[e] = 0.0f;
    return 1.0f;
  }
  const float corr = fast_exp2(m - mnew);
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    pw[e] = fast_exp2(s[e] - mnew);
    sum += pw[e];
  }
  l = l * corr + sum;
  m = mnew;
  return corr;
}
// The same with the scores as NT x 2 (s[nt][i] is score 2 nt + i).
template <int NT, int... XOR>
__device__ __forceinline__ float softmax_step(const float (&s)[NT][2], float& m, float& l, float (&pw)[NT][2]) {
  float sf[2 * NT], pf[2 * NT];
#pragma unroll
  for (int e = 0; e < 2 * NT; ++e) sf[e] = s[e / 2][e % 2];
  const float corr = softmax_step<2 * NT, XOR...>(sf, m, l, pf);
#pragma unroll
  for (int e = 0; e < 2 * NT; ++e) pw[e / 2][e % 2] = pf[e];
  return corr;
}

// 4x4 byte transpose: y[b] holds byte b of w0, w1, w2, w3 (byte j from wj).
__device__ __forceinline__ void transpose_bytes4x4(unsigned w0, unsigned w1, unsigned w2, unsigned w3, unsigned (&y)[4]) {
  const unsigned ab0 = __byte_perm(w0, w1, 0x5140), ab1 = __byte_perm(w0, w1, 0x7362);
  const unsigned cd0 = __byte_perm(w2, w3, 0x5140), cd1 = __byte_perm(w2, w3, 0x7362);
  y[0] = __byte_perm(ab0, cd0, 0x5410), y[1] = __byte_perm(ab0, cd0, 0x7632);
  y[2] = __byte_perm(ab1, cd1, 0x5410), y[3] = __byte_perm(ab1, cd1, 0x7632);
}

// One int8 MMA (m16n8k32, exact int32 sums); SA / SB: whether A / B bytes are signed.
template <bool SA, bool SB>
__device__ __forceinline__ void imma(int (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#define SKVQ_IMMA(AT, BT)                                                                                     \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
  if constexpr (SA && !SB) SKVQ_IMMA("s8", "u8");
  else if constexpr (!SA && SB) SKVQ_IMMA("u8", "s8");
  else if constexpr (!SA && !SB) SKVQ_IMMA("u8", "u8");
  else SKVQ_IMMA("s8", "s8");
#undef SKVQ_IMMA
}

// ---- pipelined kernel for the packed body (window a multiple of 64) ----
//
// The block stages 64-token tiles of packed codes and metadata in shared
// memory with 16-byte cp.async copies, kStages deep, so that many bytes are
// in flight while the groups compute on an earlier tile from shared memory.
// Tokens below `sinks` (chunk 0's exact rows) are masked here; the combine
// kernel covers them and the tail (exact_row).
constexpr int kFastTile = 128;  // tokens per tile of the float32 kernel
constexpr int kMmaTile = 64;    // tokens per tile of the tensor-core kernel (4 warps x 16)
constexpr int kPiece = 64;      // tiles are copied in pieces of 64 rows: the window is a multiple of it
constexpr int kStages = 3;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
// Waits until at most AHEAD - 1 committed groups are still in flight: the oldest tile of a ring
// whose copies run AHEAD tiles ahead has landed.
template <int AHEAD = kStages - 1>
__device__ __forceinline__ void cp_async_wait_stages() { asm volatile("cp.async.wait_group %0;\n" ::"n"(AHEAD - 1)); }

// One warp's share of a copy: 16-byte pieces strided over its 32 lanes.
__device__ __forceinline__ void copy_range_warp(unsigned char* dst, const unsigned char* src, int bytes) {
  for (int u = threadIdx.x % 32; u < bytes / 16; u += 32) cp_async16(dst + u * 16, src + u * 16);
}

template <int TILE>
struct FastLayout {  // byte offsets inside one stage
  int kc, vc, klo, ksc, vlo, vsc, stage;
  // bytes per token: key and value codes, key and value metadata (one array of minima, one of scales)
  __host__ __device__ constexpr FastLayout(std::int64_t krow, std::int64_t vrow, std::int64_t kmeta, std::int64_t vmeta)
      : kc(0),
        vc(pad(TILE * krow)),
        klo(vc + pad(TILE * vrow)),
        ksc(klo + pad(TILE * kmeta)),
        vlo(ksc + pad(TILE * kmeta)),
        vsc(vlo + pad(TILE * vmeta)),
        stage(vsc + pad(TILE * vmeta)) {}
  __host__ __device__ FastLayout(const AttnParams& p)
      : FastLayout(p.k.row_bytes, p.v.row_bytes, static_cast<std::int64_t>(p.k.G) * p.meta_bytes,
                   static_cast<std::int64_t>(p.v.G) * p.meta_bytes) {}
  static __host__ __device__ constexpr int pad(std::int64_t x) { return static_cast<int>((x + 15) & ~15LL); }
};

// Starts the 16-byte copies of rows [t0, t0 + n) of one slot (codes and
// metadata of keys and values) into rows [r0, r0 + n) of stage `stage`.
// Each warp of the (4-warp) block takes whole arrays: key codes, value
// codes, key metadata, value metadata, so that the address arithmetic is
// done once per array rather than by every warp for every array.
template <int TILE>
__device__ __forceinline__ void issue_rows(const AttnParams& p, const FastLayout<TILE>& lay, unsigned char* stage,
                                           std::int64_t bh, std::int64_t t0, int r0, int n) {
  static_assert(kThreads == 128, "one warp per array pair");
  const int mb = p.meta_bytes;
  const std::int64_t slot = static_cast<std::int64_t>((static_cast<unsigned long long>(t0) * p.div_magic) >> p.div_shift);
  const std::int64_t rowi = bh * p.window + (t0 - slot * p.window);
  const int warp = threadIdx.x / 32;
  if (warp == 0) {
    const int kr = static_cast<int>(p.k.row_bytes);
    copy_range_warp(stage + lay.kc + r0 * kr, p.k.codes + slot * p.k.slot_codes + rowi * kr, n * kr);
  } else if (warp == 1) {
    const int vr = static_cast<int>(p.v.row_bytes);
    copy_range_warp(stage + lay.vc + r0 * vr, p.v.codes + slot * p.v.slot_codes + rowi * vr, n * vr);
  } else if (warp == 2) {
    const int kmr = p.k.G * mb;
    const std::int64_t km = slot * p.k.slot_meta + rowi * kmr;
    copy_range_warp(stage + lay.klo + r0 * kmr, p.k.lo + km, n * kmr);
    copy_range_warp(stage + lay.ksc + r0 * kmr, p.k.scale + km, n * kmr);
  } else {
    const int vmr = p.v.G * mb;
    const std::int64_t vm = slot * p.v.slot_meta + rowi * vmr;
    copy_range_warp(stage + lay.vlo + r0 * vmr, p.v.lo + vm, n * vmr);
    copy_range_warp(stage + lay.vsc + r0 * vmr, p.v.scale + vm, n * vmr);
  }
}

// One warp's share of a copy of BYTES (a multiple of 16) known at compile
// time: each lane's pieces at immediate offsets from one address pair.
template <int BYTES>
__device__ __forceinline__ void copy_fixed_warp(unsigned char* dst, const unsigned char* src) {
  static_assert(BYTES % 16 == 0, "16-byte pieces");
  const int lane = threadIdx.x % 32;
  dst += lane * 16, src += lane * 16;
#pragma unroll
  for (int i = 0; i < BYTES / 512; ++i) cp_async16(dst + i * 512, src + i * 512);
  if constexpr (BYTES % 512 != 0) {
    if (lane * 16 < BYTES % 512) cp_async16(dst + (BYTES / 512) * 512, src + (BYTES / 512) * 512);
  }
}

// What one warp of the pipelined kernels copies per tile (aligned case): its
// array (codes) or pair of arrays (metadata minima and scales, `pair` bytes
// apart) at slot 0 and row 0 of the block's KV head, bytes per row and per
// slot, and where the rows go in a stage. Kept in shared memory, where it
// costs a load per tile instead of registers for the whole loop.
struct WarpCopy {
  const unsigned char* src;
  std::int64_t pair, slot_bytes;
  int row_bytes, dst0, dst1;
};

// The tiles of one block's token range [t_begin, t_end) in the packed body,
// streamed through the kStages-deep shared-memory ring: start() fills the
// first stages; acquire(tile) waits for a tile, starts the copy of the one
// kStages - 1 ahead and returns the tile's stage (tiles are issued in order).
// The copy goes to the stage of tile - 1, which every warp has finished with
// when it reaches acquire's barrier: the loops need no barrier of their own.
// When the window is a multiple of TILE (the usual case: every tile is whole
// and inside one slot, since ranges start at multiples of TILE and end at
// one or at the flush frontier, a multiple of the window) each warp keeps
// the slot and row of the next tile and copies its array with sizes known at
// compile time (rows of D = 128 codes are 16 KB bytes); otherwise a tile is
// copied in as few runs of rows as the slots it spans allow, rows past t_end
// not copied (the last tile may be partial).
// STAGES: the ring's depth (kStages, or one more for a kernel that holds two
// tiles at once); copies run two tiles ahead either way, so with STAGES = 4 a
// block may acquire tile + 1 while still reading tile (the refill goes to the
// stage of tile - 1). STAGES = 2 (ClaimedTiles only): copies one tile ahead,
// a ring of two stages (attn_tmma_kernel's SHORT: more blocks an SM where the
// ring's size limits them).
template <int TILE, int KB, int VB, int META_ROW = 0, int STAGES = kStages>
struct TileStream {  // META_ROW: metadata bytes a token and side when known at compile time (else 0)
  static_assert(STAGES >= 2 && STAGES <= kStages + 1, "two to four stages");
  const AttnParams& p;
  const FastLayout<TILE>& lay;
  unsigned char* ring;
  std::int64_t bh, t_begin, t_end;
  int n_tiles;
  bool aligned;
  mutable int slot, row;  // aligned: the next tile's slot and first row in it
  mutable int acq = 0;    // the ring stage of the next tile acquire() returns
  const WarpCopy* mine;

  __device__ TileStream(const AttnParams& p_, const FastLayout<TILE>& lay_, unsigned char* ring_, std::int64_t bh_, int split)
      : TileStream(p_, lay_, ring_, bh_, static_cast<std::int64_t>(split) * p_.split_len,
                   min(p_.q_end, static_cast<std::int64_t>(split) * p_.split_len + p_.split_len)) {}
  // The tokens [t_begin_, t_end_) (t_begin_ a multiple of TILE).
  __device__ TileStream(const AttnParams& p_, const FastLayout<TILE>& lay_, unsigned char* ring_, std::int64_t bh_,
                        std::int64_t t_begin_, std::int64_t t_end_)
      : p(p_), lay(lay_), ring(ring_), bh(bh_) {
    __shared__ WarpCopy copies[kThreads / 32];
    t_begin = t_begin_;
    t_end = t_end_;
    n_tiles = static_cast<int>((t_end - t_begin + TILE - 1) / TILE);
    aligned = p.window % TILE == 0;
    seek(t_begin);
    const int warp = threadIdx.x / 32;
    mine = &copies[warp];
    if (threadIdx.x % 32 == 0) {
      const DevSide& side = warp % 2 == 0 ? p.k : p.v;
      WarpCopy c;
      c.row_bytes = warp < 2 ? static_cast<int>(side.row_bytes) : side.G * p.meta_bytes;
      c.slot_bytes = warp < 2 ? side.slot_codes : side.slot_meta;
      c.src = (warp < 2 ? side.codes : side.lo) + bh * p.window * c.row_bytes;
      c.pair = warp < 2 ? 0 : static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(side.scale) - reinterpret_cast<std::uintptr_t>(side.lo));
      c.dst0 = warp == 0 ? lay.kc : warp == 1 ? lay.vc : warp == 2 ? lay.klo : lay.vlo;
      c.dst1 = warp == 2 ? lay.ksc : lay.vsc;
      copies[warp] = c;
    }
    __syncwarp();
  }
  __device__ std::int64_t first_token(int tile) const { return t_begin + static_cast<std::int64_t>(tile) * TILE; }
  // aligned: the next tile starts at token t
  __device__ void seek(std::int64_t t) const {
    slot = static_cast<int>((static_cast<unsigned long long>(t) * p.div_magic) >> p.div_shift);
    row = static_cast<int>(t - static_cast<std::int64_t>(slot) * p.window);
  }
  // aligned, TILE == kFastTile: the next tile is the KV head's tile x (its tokens from x TILE), by a
  // 32-bit division by the tiles a window (a multiply-high, an add and a shift; seek's is 64-bit).
  // ClaimedTiles forms it again for every tile rather than stepping it from the last: kept across a
  // tile's work, slot and row cost two registers, and the kernels run at their cap (session 35:
  // stepping them made ptxas spill).
  __device__ void seek_tile(int x) const {
    static_assert(TILE == kFastTile, "window_tiles divides by the windows of kFastTile tiles");
    slot = static_cast<int>(p.window_tiles.div(static_cast<unsigned>(x)));
    row = (x - slot * static_cast<int>(p.window_tiles.d)) * TILE;
  }
  // rows of the tile that hold tokens of the range
  __device__ int live_rows(int tile) const {
    const std::int64_t left = t_end - first_token(tile);
    return left < TILE ? static_cast<int>(left) : TILE;
  }
  __device__ void issue_aligned(unsigned char* stage) const {
    static_assert(kThreads == 128, "one warp per array pair");
    const WarpCopy c = *mine;
    const unsigned char* src = c.src + slot * c.slot_bytes + static_cast<std::int64_t>(row) * c.row_bytes;
    const int warp = threadIdx.x / 32;
    if (warp == 0) {
      copy_fixed_warp<TILE * (kD * KB / 8)>(stage + c.dst0, src);
    } else if (warp == 1) {
      copy_fixed_warp<TILE * (kD * VB / 8)>(stage + c.dst0, src);
    } else {
      const auto* src1 = reinterpret_cast<const unsigned char*>(reinterpret_cast<std::uintptr_t>(src) + c.pair);
      if constexpr (META_ROW > 0) {
        copy_fixed_warp<TILE * META_ROW>(stage + c.dst0, src);
        copy_fixed_warp<TILE * META_ROW>(stage + c.dst1, src1);
      } else {
        copy_range_warp(stage + c.dst0, src, TILE * c.row_bytes);
        copy_range_warp(stage + c.dst1, src1, TILE * c.row_bytes);
      }
    }
    row += TILE;
    if (row == p.window) row = 0, ++slot;
  }
  // Starts the copies of `tile` into ring stage `stage_index`.
  __device__ void issue(int tile, int stage_index) const {
    unsigned char* stage = ring + stage_index * lay.stage;
    if (aligned) {
      issue_aligned(stage);
      return;
    }
    const std::int64_t t0 = first_token(tile);
    const int live = live_rows(tile);
    for (int r = 0; r < live;) {  // runs inside one window (window and t0 are multiples of kPiece)
      const std::int64_t t = t0 + r;
      const std::int64_t s = static_cast<std::int64_t>((static_cast<unsigned long long>(t) * p.div_magic) >> p.div_shift);
      const int in_window = static_cast<int>((s + 1) * p.window - t);
      const int n = min(live - r, in_window);
      issue_rows(p, lay, stage, bh, t, r, n);
      r += n;
    }
  }
  __device__ void start() const {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_tiles) issue(s, s);
      cp_async_commit();
    }
  }
  // Tiles are acquired in order; tile + kStages - 1 goes to the stage of tile + kStages - 1 - STAGES
  // (tile - 1 with the usual depth, tile - 2 with one stage more).
  __device__ const unsigned char* acquire(int tile) const {
    static_assert(STAGES >= kStages, "acquire copies two tiles ahead");
    cp_async_wait_stages();
    __syncthreads();
    constexpr int kAhead = kStages - 1;
    if (tile + kAhead < n_tiles) issue(tile + kAhead, acq + kAhead >= STAGES ? acq + kAhead - STAGES : acq + kAhead);
    cp_async_commit();
    const unsigned char* stage = ring + acq * lay.stage;
    acq = acq == STAGES - 1 ? 0 : acq + 1;
    return stage;
  }
};

}  // namespace

}  // namespace skvq::cuda
