// GPU flush: chunk-0 permutations and the clipped min/max group quantizer,
// giving the same codes and metadata as ref::quantize_rows. Every float
// operation goes through an explicitly rounded intrinsic (__fadd_rn, ...),
// which nvcc never contracts into FMAs.
#include "cuda/common.cuh"
#include "cuda/kernels.cuh"

namespace skvq::cuda {

namespace {

__device__ __forceinline__ float round_fmt(float v, int mant, int emin, float maxv) {
  const float a = fabsf(v);
  if (a == 0.0f) return v;
  const int e = max(static_cast<int>((__float_as_uint(a) >> 23) & 0xffu), emin + 127);
  const float q = __uint_as_float(static_cast<unsigned>(e - mant) << 23);
  const float inv_q = __uint_as_float(static_cast<unsigned>(254 - (e - mant)) << 23);  // 1/q, exact
  const float r = fminf(__fmul_rn(rintf(__fmul_rn(a, inv_q)), q), maxv);
  return copysignf(r, v);
}

__device__ __forceinline__ void round_meta(int meta, float& lo, float& scale) {
  if (meta == 0) {
    lo = round_fmt(lo, 10, -14, 65504.0f);
    scale = fmaxf(round_fmt(scale, 10, -14, 65504.0f), 5.9604644775390625e-08f);
  } else if (meta == 2) {
    lo = round_fmt(lo, 3, -6, 448.0f);
    scale = fmaxf(round_fmt(scale, 3, -6, 448.0f), 0.001953125f);
  }
}

__device__ __forceinline__ unsigned char e4m3_encode(float v) {
  const unsigned char sign = signbit(v) ? 0x80 : 0x00;
  const float a = fabsf(v);
  if (a == 0.0f) return sign;
  const int e = static_cast<int>((__float_as_uint(a) >> 23) & 0xffu) - 127;
  if (e < -6) return sign | static_cast<unsigned char>(a * 512.0f);
  const int m = static_cast<int>(ldexpf(a, -e) * 8.0f) - 8;
  return sign | static_cast<unsigned char>(((e + 7) << 3) | m);
}

__device__ __forceinline__ void store_meta(unsigned char* p, int meta, float v) {
  if (meta == 0) *reinterpret_cast<__half*>(p) = __float2half_rn(v);
  else if (meta == 1) *reinterpret_cast<float*>(p) = v;
  else *p = e4m3_encode(v);
}

// clamp(rint((x - lo) / scale), 0, levels) with the correctly rounded
// quotient: the product with the reciprocal is within 2 ulp of it, so its
// rint can differ only next to a half-integer; there the exact division decides.
__device__ __forceinline__ float code_of(float x, float lo, float scale, float inv_scale, float levels) {
  const float num = __fsub_rn(x, lo);
  float q = __fmul_rn(num, inv_scale);
  const float frac = q - floorf(q);
  if (fabsf(frac - 0.5f) <= 1e-6f * fabsf(q) + 1e-30f || !(fabsf(q) < 8388608.0f)) q = __fdiv_rn(num, scale);
  return fminf(fmaxf(rintf(q), 0.0f), levels);
}

__global__ void perm_kernel(const FlushParams f, DevSide s) {
  extern __shared__ float rg[];
  const int h = blockIdx.x, D = s.D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float mn = INFINITY, mx = -INFINITY;
    for (int b = 0; b < f.B; ++b)
      for (int t = 0; t < f.window; ++t) {
        const float x = __half2float(f.src[((static_cast<std::int64_t>(b) * f.H + h) * f.src_tokens + f.first + t) * D + c]);
        mn = fminf(mn, x);
        mx = fmaxf(mx, x);
      }
    rg[c] = __fsub_rn(mx, mn);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    const float r = rg[c];
    int rank = 0;
    for (int c2 = 0; c2 < D; ++c2) {  // stable ascending, NaN last
      const float r2 = rg[c2];
      const bool tie = (r2 == r) || (isnan(r2) && isnan(r));
      rank += (!isnan(r2) && (isnan(r) || r2 < r)) || (tie && c2 < c);
    }
    s.perm[h * D + rank] = c;
  }
}

// Block: one (chunk, b*H + h, block of rows); thread: one (row, group). The
// block stages its rows in shared memory already permuted and padded, as
// float, with an odd row stride so that the threads' reads fall in distinct banks.
// One thread per (row, group). Rows are staged in shared memory as T: fp16
// (the input dtype, exact) where shared memory limits the blocks per SM
// (long groups), float elsewhere (no conversion per read).
// Up to kMaxGrid clip factors are scored side by side: each factor's error
// is still the spec's sum in slot order, but the factors' chains are
// independent, so their additions overlap instead of waiting on each other.
constexpr int kMaxGrid = 8;

// Clip factors a0 .. a0 + NA - 1 of one group scored side by side (each one's
// error summed in slot order, as the spec fixes); the best so far is kept,
// ties to the earlier factor.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <int NA, typename T>
__device__ __forceinline__ void score_factors(const FlushParams& f, const T* xs, int g, int a0, float mid, float rng,
                                              float levels, float inv_g, float& best_err, float& best_lo,
                                              float& best_scale) {
  float lo[NA], scale[NA], inv[NA], err[NA];
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const float tt = __fmul_rn(f.grid[a0 + a], rng);
    lo[a] = __fsub_rn(mid, __fmul_rn(tt, 0.5f));
    scale[a] = fmaxf(__fdiv_rn(tt, levels), 1e-8f);
    round_meta(f.meta, lo[a], scale[a]);
    inv[a] = __frcp_rn(scale[a]);
    err[a] = 0.0f;
  }
  for (int sl = 0; sl < g; ++sl) {
    const float x = to_float(xs[sl]);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const float d = __fsub_rn(__fadd_rn(__fmul_rn(code_of(x, lo[a], scale[a], inv[a], levels), scale[a]), lo[a]), x);
      err[a] = __fadd_rn(err[a], __fmul_rn(d, d));
    }
  }
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const float e = __fmul_rn(err[a], inv_g);
    if (a0 + a == 0 || e < best_err) {
      best_err = e;
      best_lo = lo[a];
      best_scale = scale[a];
    }
  }
}

template <typename T, int NA>  // NA divides n_grid: factors scored NA at a time (registers sized for NA)
__global__ void quant_kernel(const FlushParams f, DevSide s, int rows_per_block) {
  extern __shared__ __align__(16) unsigned char staging[];
  T* rows = reinterpret_cast<T*>(staging);  // [rows_per_block][P + 1]
  const int D = s.D, G = s.G, g = f.group, bits = s.bits, P = G * g, stride = P + 1;
  const int blocks_per_chunk_head = (f.window + rows_per_block - 1) / rows_per_block;
  const std::int64_t bid = blockIdx.x;
  const int rb = static_cast<int>(bid % blocks_per_chunk_head);
  const std::int64_t bh = (bid / blocks_per_chunk_head) % (static_cast<std::int64_t>(f.B) * f.H);
  const int c = static_cast<int>(bid / (blocks_per_chunk_head * static_cast<std::int64_t>(f.B) * f.H));
  const int h = static_cast<int>(bh % f.H);
  const int t0 = rb * rows_per_block, nr = min(rows_per_block, f.window - t0);
  const __half* src = f.src + (bh * f.src_tokens + f.first + static_cast<std::int64_t>(c) * f.window + t0) * D;
  const int* perm = s.perm ? s.perm + h * D : nullptr;
  for (int j = threadIdx.x; j < P; j += blockDim.x) {  // a column of the block's rows (no division per element)
    const int jj = min(j, D - 1);                        // padding repeats the last permuted value
    const __half* col = src + (perm ? perm[jj] : jj);
    for (int r = 0; r < nr; ++r) rows[r * stride + j] = static_cast<T>(col[static_cast<std::int64_t>(r) * D]);
  }
  __syncthreads();
  const int rl = threadIdx.x / G, k = threadIdx.x % G;
  if (rl >= nr) return;
  const int t = t0 + rl;
  const std::int64_t slot = f.slot0 + c;
  if (slot == 0 && t < f.n_sink) return;  // sinks stay exact
  const T* xs = rows + rl * stride + k * g;
  const float levels = static_cast<float>((1 << bits) - 1);
  const float inv_g = __fdiv_rn(1.0f, static_cast<float>(g));
  float gmin = to_float(xs[0]), gmax = gmin;
  for (int sl = 1; sl < g; ++sl) {
    const float x = to_float(xs[sl]);
    gmin = fminf(gmin, x);
    gmax = fmaxf(gmax, x);
  }
  const float mid = __fmul_rn(__fadd_rn(gmax, gmin), 0.5f);
  const float rng = __fsub_rn(gmax, gmin);
  float best_err = 0.0f, best_lo = 0.0f, best_scale = 0.0f;
  for (int a0 = 0; a0 < f.n_grid; a0 += NA) score_factors<NA, T>(f, xs, g, a0, mid, rng, levels, inv_g, best_err, best_lo, best_scale);
  // Codes of this group's real channels: whole bytes (g and D are multiples of 16).
  const float best_inv = __frcp_rn(best_scale);
  const int j0 = k * g, j1 = min(D, j0 + g);
  unsigned char* out = s.codes + slot * s.slot_codes + (bh * f.window + t) * s.row_bytes + j0 * bits / 8;
  unsigned acc = 0;
  int nbits = 0;
  for (int j = j0; j < j1; ++j) {
    acc |= static_cast<unsigned>(code_of(to_float(xs[j - j0]), best_lo, best_scale, best_inv, levels)) << nbits;
    nbits += bits;
    while (nbits >= 8) {
      *out++ = static_cast<unsigned char>(acc & 0xffu);
      acc >>= 8;
      nbits -= 8;
    }
  }
  const std::int64_t mo = slot * s.slot_meta + ((bh * f.window + t) * G + k) * f.meta_bytes;
  store_meta(s.lo + mo, f.meta, best_lo);
  store_meta(s.scale + mo, f.meta, best_scale);
}

}  // namespace

void run_perm(const FlushParams& f, DevSide& side, cudaStream_t stream) {
  perm_kernel<<<f.H, 128, side.D * sizeof(float), stream>>>(f, side);
  SKVQ_CUDA_LAUNCH_CHECK();
}

void run_flush(const FlushParams& f, DevSide& side, cudaStream_t stream) {
  const int P = side.G * f.group;
  const int rows_per_block = std::max(1, std::min(f.window, 64 / side.G));
  const std::int64_t blocks = static_cast<std::int64_t>(f.n_chunks) * f.B * f.H *
                              ((f.window + rows_per_block - 1) / rows_per_block);
  auto launch = [&](auto kernel, std::size_t elem) {
    const std::size_t smem = static_cast<std::size_t>(rows_per_block) * (P + 1) * elem;
    if (smem > 48 * 1024) {
      SKVQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    kernel<<<static_cast<unsigned>(blocks), rows_per_block * side.G, smem, stream>>>(f, side, rows_per_block);
  };
  // float staging above 16 KiB a block would cap the SM at a few blocks: stage fp16 then
  const bool half = static_cast<std::size_t>(rows_per_block) * (P + 1) * sizeof(float) > 16 * 1024;
  int na = kMaxGrid;
  while (f.n_grid % na != 0) --na;
  auto by_type = [&](auto k_half, auto k_float) {
    if (half) launch(k_half, sizeof(__half));
    else launch(k_float, sizeof(float));
  };
  switch (na) {
    case 8: by_type(quant_kernel<__half, 8>, quant_kernel<float, 8>); break;
    case 7: by_type(quant_kernel<__half, 7>, quant_kernel<float, 7>); break;
    case 6: by_type(quant_kernel<__half, 6>, quant_kernel<float, 6>); break;
    case 5: by_type(quant_kernel<__half, 5>, quant_kernel<float, 5>); break;
    case 4: by_type(quant_kernel<__half, 4>, quant_kernel<float, 4>); break;
    case 3: by_type(quant_kernel<__half, 3>, quant_kernel<float, 3>); break;
    case 2: by_type(quant_kernel<__half, 2>, quant_kernel<float, 2>); break;
    default: by_type(quant_kernel<__half, 1>, quant_kernel<float, 1>); break;
  }
  SKVQ_CUDA_LAUNCH_CHECK();
}

}  // namespace skvq::cuda
