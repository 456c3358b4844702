// GPU benchmarks (issue 5), side by side in one run on one device:
//   copy bandwidth; flush throughput; decode attention of skvq fused kernels
//   vs the project's fp16 kernel for B x Hkv x kv_len; a Llama-2-7B-shaped
//   32-layer cache of 1M tokens. Prints tables and "RESULT ..." lines that
//   scripts/gpu_report.py merges with PyTorch's numbers.
// Usage: bench_cuda [--quick] [--no-scale] [--flush (copy bandwidth and flush table only)] [--scale (the 1M-token cache only)]
//        | --one B Hkv T [SETTING] | --streams B Hkv T [SETTING] | --splits B Hkv T [SETTING]
//        | --upload B Hkv T [SETTING] | --host | --dtypes | --dtypes-prefill (its prefill table alone)
//        | --read-floor | --widths (every code width, 1 to 8 bits) | --head-dims [D B T] | --chunks [S1,S2,...] (chunked prefill: S new rows after a history of T)
//        | --pairs (pairs of code widths without a kernel of their own, head dim 128)
//        | --widened (3- and 1-bit codes on the token-major kernel beside K4V4 and K2V2; SKVQ_CUDA_WIDEN=0: without)
//        | --trace B Hkv T [SETTING] (a build with SKVQ_CUDA_TRACE=ON)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "skvq/cuda.hpp"
#include "core/input_check.hpp"
#include "skvq/skvq.hpp"
#ifdef SKVQ_CUDA_TRACE
#include "cuda/trace.hpp"
#endif

using namespace skvq;

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

__global__ void fill_random(__half* p, std::size_t n, std::uint32_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16, x *= 0x7feb352d, x ^= x >> 15, x *= 0x846ca68b, x ^= x >> 16;
    const std::uint32_t y = x * 1664525u + 1013904223u;
    // sum of two uniforms - 1: a triangular, zero-mean value; a few larger channels
    const float u = (x & 0xffffff) / 16777216.0f + (y & 0xffffff) / 16777216.0f - 1.0f;
    const float big = ((i & 127) % 37 == 0) ? 8.0f : 1.0f;
    p[i] = __float2half(u * scale * big);
  }
}

__global__ void fill_random_f32(float* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2246822519u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995, x ^= x >> 15;
    p[i] = (x & 0xffffff) / 8388608.0f - 1.0f;
  }
}

void random_half(__half* p, std::size_t n, std::uint32_t seed) {
  fill_random<<<2048, 256>>>(p, n, seed, 1.0f);
  CHECK(cudaGetLastError());
}

// The median of v.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time in ms of fn over reps (after warm-up), with events recorded on
// `stream` (fn's stream); setup (when given) runs before each call, warm-up
// included, outside the events.
double time_ms(int reps, const std::function<void()>& fn, const std::function<void()>& setup = {},
               cudaStream_t stream = nullptr) {
  if (setup) setup();
  fn();
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    if (setup) {
      setup();
      CHECK(cudaDeviceSynchronize());
    }
    CHECK(cudaEventRecord(a, stream));
    fn();
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return median(std::move(t));
}

// A decode step of a model as it is replayed in production: `layers` calls,
// each reading memory of its own, captured into one CUDA graph on a stream of
// its own and replayed; returns the median per-layer time in ms. The graph
// takes the host's enqueue out of the time (a single call between events
// includes it), and the layers' distinct memory keeps the L2 cold
// (stack_layers: together at least 256 MB, over four times the H200's 60 MB).
double graph_ms(int layers, int reps, const std::function<void(int, cudaStream_t)>& layer) {
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < layers; ++i) layer(i, s);  // sizes the stream's workspace, sets kernel attributes
  CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < layers; ++i) layer(i, s);
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = time_ms(reps, [&] { CHECK(cudaGraphLaunch(exec, s)); }, {}, s);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  cuda::release_workspace(s);
  CHECK(cudaStreamDestroy(s));
  return ms / layers;
}

// The packed caches of a graph_ms step: `caches` (its first, when given,
// filled) grown to `layers`, each filled with T tokens from the same keys and
// values ([B, Hkv, src_T, 128]: src_T = T, or fewer appended over and over
// where decode_table allocates no T-token fp16 history). The fills run on the
// legacy stream, which graph_ms's non-blocking stream does not wait for: the
// device is synchronized before the caches are handed on.
void fill_layers(std::vector<std::unique_ptr<cuda::DeviceCache>>& caches, int layers, const Config& cfg, int B, int Hkv,
                 std::int64_t T, const __half* k, const __half* v, std::int64_t src_T = 0) {
  if (src_T == 0) src_T = T;
  while (static_cast<int>(caches.size()) < layers) {
    caches.push_back(std::make_unique<cuda::DeviceCache>(cfg, B, Hkv, 128, T));
    for (std::int64_t t = 0; t < T; t += src_T) caches.back()->append_device(k, v, std::min(src_T, T - t));
  }
  CHECK(cudaDeviceSynchronize());
}

// Layers of a graph_ms step: enough that their bytes together reach 256 MB, at most 64.
int stack_layers(double bytes_per_layer) {
  return static_cast<int>(std::clamp(std::ceil(256e6 / bytes_per_layer), 1.0, 64.0));
}

double copy_bandwidth() {
  const std::size_t n = std::size_t{4} << 30;
  void *a, *b;
  CHECK(cudaMalloc(&a, n));
  CHECK(cudaMalloc(&b, n));
  random_half(static_cast<__half*>(a), n / 2, 1);
  const double ms = time_ms(10, [&] { CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice)); });
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(n) / (ms * 1e-3);
}

// A kernel that only reads: every thread streams 16-byte loads, four in
// flight, over the whole buffer (grid-stride), and keeps an XOR of them.
__global__ void read_stream(const uint4* p, std::size_t n, unsigned* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  unsigned x = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = p[i];
    x ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (x == 0x9e3779b9u) sink[blockIdx.x] = x;  // (keeps the loads)
}

// What reading N bytes costs by itself, at the sizes the decode table's
// kernels read: the read-only kernel above, one call between two events (the
// same buffer each call: warm L2) and per layer of an L-layer graph (buffers
// of their own, 256 MB together: cold L2), as the decode table times them;
// share of the copy bandwidth: --read-floor
void read_floor() {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const double bw = copy_bandwidth();
  std::printf("copy bandwidth %.0f GB/s; read-only kernel, %d blocks of 256 threads\n\n", bw / 1e9, sms * 8);
  std::printf("| MB read | one call ms | %% copy bw | L | graph ms | %% copy bw |\n|---|---|---|---|---|---|\n");
  unsigned* sink;
  CHECK(cudaMalloc(&sink, static_cast<std::size_t>(sms) * 8 * 4));
  for (double mb : {4.7, 9.4, 18.9, 37.7, 75.5, 151.0, 302.0, 604.0, 1208.0, 2416.0}) {
    const std::size_t n = static_cast<std::size_t>(mb * 1e6) / 16;
    const int L = stack_layers(mb * 1e6);
    std::vector<uint4*> bufs(L);
    for (auto& b : bufs) {
      CHECK(cudaMalloc(&b, n * 16));
      random_half(reinterpret_cast<__half*>(b), n * 8, 3);
    }
    const auto launch = [&](int l, cudaStream_t s) {
      read_stream<<<sms * 8, 256, 0, s>>>(bufs[l], n, sink);
      CHECK(cudaGetLastError());
    };
    const double one = time_ms(50, [&] { launch(0, nullptr); });
    const double graph = graph_ms(L, 50, launch);
    const double bytes = static_cast<double>(n) * 16;
    std::printf("| %.1f | %.4f | %.1f%% | %d | %.4f | %.1f%% |\n", bytes / 1e6, one, 100 * bytes / (one * 1e-3) / bw, L, graph,
                100 * bytes / (graph * 1e-3) / bw);
    std::printf("RESULT read_floor bytes=%.0f ms=%.5f graph_ms=%.5f layers=%d\n", bytes, one, graph, L);
    for (auto& b : bufs) CHECK(cudaFree(b));
  }
  CHECK(cudaFree(sink));
}

struct Setting {
  const char* name;
  int bk, bv, group;
};
const Setting kSettings[] = {{"K2V2g128", 2, 2, 128}, {"K4V4g128", 4, 4, 128}, {"K2V2g32", 2, 2, 32}};

Config make_config(const Setting& s, bool search = true) {
  Config c;
  c.head_dim = 128;
  c.bits_key = s.bk;
  c.bits_value = s.bv;
  c.group_size = s.group;
  c.clip_search = search;
  c.dense_view = false;
  return c;
}

// The fp16 keys and values of a decode table's shape: layer 0's random, the graph's other layers
// copies of them (their own memory: cold L2), freed with the holder.
struct Fp16Layers {
  std::vector<__half*> ks, vs;
  Fp16Layers(std::size_t n, int layers, std::uint32_t kseed, std::uint32_t vseed) : ks(layers), vs(layers) {
    for (int l = 0; l < layers; ++l) {
      CHECK(cudaMalloc(&ks[l], n * 2));
      CHECK(cudaMalloc(&vs[l], n * 2));
    }
    random_half(ks[0], n, kseed);
    random_half(vs[0], n, vseed);
    for (int l = 1; l < layers; ++l) {
      CHECK(cudaMemcpy(ks[l], ks[0], n * 2, cudaMemcpyDeviceToDevice));
      CHECK(cudaMemcpy(vs[l], vs[0], n * 2, cudaMemcpyDeviceToDevice));
    }
  }
  ~Fp16Layers() {
    for (std::size_t l = 0; l < ks.size(); ++l) cudaFree(ks[l]), cudaFree(vs[l]);
  }
  Fp16Layers(const Fp16Layers&) = delete;
  Fp16Layers& operator=(const Fp16Layers&) = delete;
};

// The flush alone, ms (time_ms: median of 3): T tokens of B=1, H heads appended in one call to a
// fresh cache allocated before the events.
double flush_ms(const Config& cfg, const __half* k, const __half* v, std::int64_t H, std::int64_t T) {
  std::unique_ptr<cuda::DeviceCache> c;
  return time_ms(
      3, [&] { c->append_device(k, v, T); },
      [&] {
        c.reset();
        c = std::make_unique<cuda::DeviceCache>(cfg, 1, H, 128, T);
      });
}

void flush_table(double bw, bool quick) {
  const std::int64_t T = quick ? 16384 : 131072, H = 32;
  const std::size_t n = static_cast<std::size_t>(H * T * 128);
  const Fp16Layers in(n, 1, 11, 12);
  std::printf("\n## Flush throughput: B=1, H=32, D=128, %lld tokens appended in one call (%lld windows)\n\n",
              static_cast<long long>(T), static_cast<long long>(T / 128));
  std::printf("| setting | search | ms | GB/s of fp16 input | %% of copy bw |\n|---|---|---|---|---|\n");
  for (const Setting& s : kSettings) {
    for (bool search : {true, false}) {
      const double ms = flush_ms(make_config(s, search), in.ks[0], in.vs[0], H, T);
      const double gbs = 2.0 * n * 2 / (ms * 1e-3) / 1e9;
      std::printf("| %s | %s | %.3f | %.1f | %.1f%% |\n", s.name, search ? "on" : "off", ms, gbs, 100 * gbs * 1e9 / bw);
      std::printf("RESULT flush setting=%s search=%d ms=%.4f gbs=%.2f\n", s.name, search, ms, gbs);
    }
  }
}

void decode_table(double bw, bool quick) {
  std::printf("\n## Decode attention, one step: Hq=32, D=128, fp16 history, q fp32\n\n");
  std::printf("one call: a single call between two events (the host's enqueue included, L2 as the last call left it);\n"
              "graph: per layer, L layers of their own memory replayed as one CUDA graph (no host time, cold L2)\n\n");
  std::printf("| B | Hkv | kv_len | kernel | MB read | one call ms | %% copy bw | L | graph ms | %% copy bw | fp16 / this (graph) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<int> Bs = {1, 8, 32}, Hs = {32, 8};
  std::vector<std::int64_t> Ts = {4096, 32768, 131072, 524288};
  if (quick) Bs = {1}, Ts = {4096, 32768};
  // fp16 histories up to 72 GB on the H200 (141 GB), up to half the memory on a smaller card (an
  // H100's 80 GB: up to 40 GB), leaving room for the packed caches. A longer one is not allocated:
  // then fp16 is not run and the packed caches (each setting on its own, freed
  // before the next) are filled from a shorter random history appended over and over, so that the
  // table also shows the steps of the contexts only the packed store holds.
  std::size_t free_bytes = 0, total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const double max_fp16_bytes = std::min(72e9, 0.5 * static_cast<double>(total_bytes));
  for (int B : Bs)
    for (int Hkv : Hs)
      for (std::int64_t T : Ts) {
        const double fp16_bytes = 2.0 * B * Hkv * T * 128 * 2;
        const bool fp16_fits = fp16_bytes <= max_fp16_bytes;
        std::int64_t src_T = T;  // (a power of two, whole windows)
        while (!fp16_fits && src_T > 128 && 2.0 * B * Hkv * src_T * 128 * 2 > max_fp16_bytes / 8) src_T /= 2;
        const std::size_t n = static_cast<std::size_t>(B) * Hkv * src_T * 128;
        const int L16 = fp16_fits ? stack_layers(fp16_bytes) : 1;
        const Fp16Layers fp16(n, L16, static_cast<std::uint32_t>(T + B), static_cast<std::uint32_t>(T + Hkv));
        const std::vector<__half*>&ks = fp16.ks, &vs = fp16.vs;
        float *q, *out;
        CHECK(cudaMalloc(&q, static_cast<std::size_t>(B) * 32 * 128 * 4));
        CHECK(cudaMalloc(&out, static_cast<std::size_t>(B) * 32 * 128 * 4));
        fill_random_f32<<<256, 256>>>(q, static_cast<std::size_t>(B) * 32 * 128, 5);
        const float scale = 1.0f / std::sqrt(128.0f);
        const int reps = T >= 131072 ? 20 : 50;
        const auto row = [&](const char* name, double bytes, double one, int layers, double graph, double graph16) {
          char ratio[32] = "-";
          if (fp16_fits) std::snprintf(ratio, sizeof ratio, "%.2f", graph16 / graph);
          std::printf("| %d | %d | %lld | %s | %.1f | %.4f | %.1f%% | %d | %.4f | %.1f%% | %s |\n", B, Hkv,
                      static_cast<long long>(T), name, bytes / 1e6, one, 100 * bytes / (one * 1e-3) / bw, layers, graph,
                      100 * bytes / (graph * 1e-3) / bw, ratio);
          std::printf("RESULT decode kernel=%s B=%d Hkv=%d T=%lld ms=%.5f bytes=%.0f graph_ms=%.5f layers=%d\n", name, B, Hkv,
                      static_cast<long long>(T), one, bytes, graph, layers);
        };
        double g16 = 0.0;
        if (fp16_fits) {
          const double t16 = time_ms(reps, [&] { cuda::attend_dense_fp16(q, ks[0], vs[0], out, B, 32, Hkv, 1, T, 128, 128, scale); });
          g16 = graph_ms(L16, reps, [&](int l, cudaStream_t s) {
            cuda::attend_dense_fp16(q, ks[l], vs[l], out, B, 32, Hkv, 1, T, 128, 128, scale, 0, s);
          });
          row("fp16", fp16_bytes, t16, L16, g16, g16);
        } else {
          std::printf("| %d | %d | %lld | fp16 | %.1f | not run: %.0f GB (fp16 histories stop at %.0f GB here) | | | | | |\n", B,
                      Hkv, static_cast<long long>(T), fp16_bytes / 1e6, fp16_bytes / 1e9, max_fp16_bytes / 1e9);
        }
        for (const Setting& st : kSettings) {
          std::vector<std::unique_ptr<cuda::DeviceCache>> caches;
          try {
            fill_layers(caches, 1, make_config(st), B, Hkv, T, ks[0], vs[0], src_T);
          } catch (const Error& e) {  // (the packed cache does not fit either)
            std::printf("| %d | %d | %lld | %s | | does not fit (%s) | | | | | |\n", B, Hkv, static_cast<long long>(T), st.name,
                        e.what());
            continue;
          }
          const double bytes = static_cast<double>(caches[0]->bytes_read_per_step());
          const int L = stack_layers(bytes);
          fill_layers(caches, L, make_config(st), B, Hkv, T, ks[0], vs[0], src_T);
          const double tq = time_ms(reps, [&] { caches[0]->attend_device(q, 32, 1, scale, out); });
          const double gq = graph_ms(L, reps, [&](int l, cudaStream_t s) { caches[l]->attend_device(q, 32, 1, scale, out, 0, s); });
          row(st.name, bytes, tq, L, gq, g16);
        }
        std::fflush(stdout);
        CHECK(cudaFree(q));
        CHECK(cudaFree(out));
      }
}

void scale_test(std::int64_t tokens) {
  const int layers = 32, H = 32;
  std::printf("\n## Scale: Llama-2-7B-shaped cache (32 layers, 32 KV heads, D=128, K2V2 g128), %lld tokens\n\n",
              static_cast<long long>(tokens));
  std::size_t free0 = 0, total = 0;
  CHECK(cudaMemGetInfo(&free0, &total));
  // One source window of 64k random tokens, appended over and over (flush kernels do all the work).
  const std::int64_t src_T = 65536;
  const std::size_t n = static_cast<std::size_t>(H) * src_T * 128;
  __half *k, *v;
  CHECK(cudaMalloc(&k, n * 2));
  CHECK(cudaMalloc(&v, n * 2));
  random_half(k, n, 21);
  random_half(v, n, 22);
  Config cfg = make_config(kSettings[0]);
  std::vector<std::unique_ptr<cuda::DeviceCache>> caches;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a));
  for (int l = 0; l < layers; ++l) {
    caches.push_back(std::make_unique<cuda::DeviceCache>(cfg, 1, H, 128, tokens));
    for (std::int64_t t = 0; t < tokens; t += src_T) caches.back()->append_device(k, v, std::min(src_T, tokens - t));
  }
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float fill_ms = 0;
  CHECK(cudaEventElapsedTime(&fill_ms, a, b));
  CHECK(cudaFree(k));
  CHECK(cudaFree(v));
  std::size_t free1 = 0;
  CHECK(cudaMemGetInfo(&free1, &total));
  float *q, *out;
  CHECK(cudaMalloc(&q, 32 * 128 * 4));
  CHECK(cudaMalloc(&out, 32 * 128 * 4));
  fill_random_f32<<<64, 256>>>(q, 32 * 128, 9);
  const double step = time_ms(10, [&] {
    for (auto& c : caches) c->attend_device(q, 32, 1, 1.0f / std::sqrt(128.0f), out);
  });
  std::int64_t held = 0, alloc = 0, read = 0;
  for (auto& c : caches) held += c->bytes_held(), alloc += c->bytes_allocated(), read += c->bytes_read_per_step();
  const double fp16 = 2.0 * layers * H * static_cast<double>(tokens) * 128 * 2;
  std::printf("| tokens | layers | device memory used | cache bytes allocated | fp16 would need | fill s | fill GB/s fp16-in | 32-layer step ms | GB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %lld | %d | %.1f GB | %.1f GB | %.1f GB | %.2f | %.0f | %.3f | %.0f |\n", static_cast<long long>(tokens), layers,
              (free0 - free1) / 1e9, alloc / 1e9, fp16 / 1e9, fill_ms / 1e3, fp16 / (fill_ms * 1e-3) / 1e9, step,
              read / (step * 1e-3) / 1e9);
  std::printf("RESULT scale tokens=%lld mem_gb=%.2f fp16_gb=%.2f fill_s=%.3f step_ms=%.4f held_gb=%.2f\n",
              static_cast<long long>(tokens), (free0 - free1) / 1e9, fp16 / 1e9, fill_ms / 1e3, step, held / 1e9);
  CHECK(cudaFree(q));
  CHECK(cudaFree(out));
}

}  // namespace

// One shape of --one and --streams: random fp16 keys and values [B, Hkv, T,
// 128], fp32 queries for Hq = 32, an output, and the packed cache filled from them.
struct OneShape {
  __half *k = nullptr, *v = nullptr;
  float *q = nullptr, *out = nullptr;
  std::unique_ptr<cuda::DeviceCache> cache;
  OneShape(int B, int Hkv, std::int64_t T, const Setting& setting) {
    const std::size_t n = static_cast<std::size_t>(B) * Hkv * T * 128;
    CHECK(cudaMalloc(&k, n * 2));
    CHECK(cudaMalloc(&v, n * 2));
    CHECK(cudaMalloc(&q, static_cast<std::size_t>(B) * 32 * 128 * 4));
    CHECK(cudaMalloc(&out, static_cast<std::size_t>(B) * 32 * 128 * 4));
    random_half(k, n, 1);
    random_half(v, n, 2);
    fill_random_f32<<<256, 256>>>(q, static_cast<std::size_t>(B) * 32 * 128, 5);
    cache = std::make_unique<cuda::DeviceCache>(make_config(setting), B, Hkv, 128, T);
    cache->append_device(k, v, T);
  }
  ~OneShape() {
    for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q), static_cast<void*>(out)}) cudaFree(p);
  }
  OneShape(const OneShape&) = delete;
  OneShape& operator=(const OneShape&) = delete;
};

// A packed decode step of x timed as the tables time it: one call between two events (the device
// waits for the host to enqueue), and per layer of a graph of `layers` layers (caches of their own:
// cold L2), after three warm-up calls.
struct StepTimes {
  double one_ms, graph_ms;
  int layers;
};
StepTimes step_times(const OneShape& x, int B, int Hkv, std::int64_t T, const Setting& setting) {
  const cuda::DeviceCache& c = *x.cache;
  for (int i = 0; i < 3; ++i) c.attend_device(x.q, 32, 1, 0.088f, x.out);
  StepTimes r{};
  r.one_ms = time_ms(20, [&] { c.attend_device(x.q, 32, 1, 0.088f, x.out); });
  std::vector<std::unique_ptr<cuda::DeviceCache>> caches;
  r.layers = stack_layers(static_cast<double>(c.bytes_read_per_step()));
  fill_layers(caches, r.layers, make_config(setting), B, Hkv, T, x.k, x.v);
  r.graph_ms = graph_ms(r.layers, 20, [&](int l, cudaStream_t st) { caches[l]->attend_device(x.q, 32, 1, 0.088f, x.out, 0, st); });
  return r;
}

// One decode step of setting s (B, Hkv, T as OneShape): the project's fp16 kernel's time on the same
// shape, the step's times (step_times) and the bytes it reads.
struct DecodeRow {
  double fp16;
  StepTimes st;
  double bytes;
};
DecodeRow decode_row(int B, int Hkv, std::int64_t T, const Setting& s) {
  const OneShape x(B, Hkv, T, s);
  const double fp16 = time_ms(20, [&] { cuda::attend_dense_fp16(x.q, x.k, x.v, x.out, B, 32, Hkv, 1, T, 128, 128, 0.088f); });
  return {fp16, step_times(x, B, Hkv, T, s), static_cast<double>(x.cache->bytes_read_per_step())};
}

// Every code width (--widths): KbVb at groups of 128, b = 1 to 8 (3, 5, 6 and 7 through the general
// path's tensor-core kernel, the others through the tuned ones), the flush of 32768 tokens of B=1
// H=32 (search on and off) and one decode step at B=1 Hkv=8 and B=8 Hkv=8 over 32768 tokens, one call
// and per layer of a graph as the tables time them, against the project's fp16 kernel on the same shape.
void widths_table(double bw) {
  std::printf("\n## Every code width: KbVb g128\n\n");
  std::printf("| bits | flush ms (search on / off) | flush %% of copy (on / off) | B | Hkv | T | fp16 ms | ms one call | ms graph | "
              "%% of copy (graph) | fp16 / graph |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  const std::int64_t FT = 32768, FH = 32;
  const std::size_t fn = static_cast<std::size_t>(FH * FT * 128);
  const Fp16Layers in(fn, 1, 21, 22);
  const double fgb = 2.0 * fn * 2 / 1e9;  // the flush's fp16 input, keys and values
  for (int bits = 1; bits <= 8; ++bits) {
    char name[16];
    std::snprintf(name, sizeof name, "K%dV%dg128", bits, bits);
    const Setting s{name, bits, bits, 128};
    const double flush[2] = {flush_ms(make_config(s, true), in.ks[0], in.vs[0], FH, FT),
                             flush_ms(make_config(s, false), in.ks[0], in.vs[0], FH, FT)};
    for (const auto& [B, Hkv] : {std::pair<int, int>{1, 8}, {8, 8}}) {
      const std::int64_t T = 32768;
      const auto [fp16, st, bytes] = decode_row(B, Hkv, T, s);
      std::printf("| %d | %.3f / %.3f | %.1f%% / %.1f%% | %d | %d | %lld | %.4f | %.4f | %.4f | %.0f%% | %.2fx |\n", bits, flush[0], flush[1],
                  100 * fgb / (flush[0] * 1e-3) * 1e9 / bw, 100 * fgb / (flush[1] * 1e-3) * 1e9 / bw, B, Hkv, static_cast<long long>(T), fp16,
                  st.one_ms, st.graph_ms, 100 * bytes / (st.graph_ms * 1e-3) / bw, fp16 / st.graph_ms);
      std::printf("RESULT widths bits=%d B=%d Hkv=%d T=%lld flush_on=%.4f flush_off=%.4f fp16=%.4f one=%.4f graph=%.4f bytes=%.0f\n", bits, B,
                  Hkv, static_cast<long long>(T), flush[0], flush[1], fp16, st.one_ms, st.graph_ms, bytes);
    }
  }
}

// One row of the decode tables of pairs_table and widened_table (and its RESULT line, tagged `tag`):
// setting s at B, Hkv, T (decode_row), its share of copy bandwidth bw and its speed against fp16.
void decode_table_row(const char* tag, const Setting& s, int B, int Hkv, std::int64_t T, double bw) {
  const auto [fp16, st, bytes] = decode_row(B, Hkv, T, s);
  std::printf("| %s | %d | %d | %lld | %.4f | %.4f | %.4f | %.0f%% | %.2fx |\n", s.name, B, Hkv, static_cast<long long>(T), fp16, st.one_ms,
              st.graph_ms, 100 * bytes / (st.graph_ms * 1e-3) / bw, fp16 / st.graph_ms);
  std::printf("RESULT %s setting=%s B=%d Hkv=%d T=%lld fp16=%.4f one=%.4f graph=%.4f bytes=%.0f\n", tag, s.name, B, Hkv,
              static_cast<long long>(T), fp16, st.one_ms, st.graph_ms, bytes);
  std::fflush(stdout);
}

// Pairs of code widths without a kernel of their own (--pairs): at head dim 128 the tensor-core
// kernel that reads its widths at run time (session 63), or the float kernel under
// SKVQ_CUDA_GENERAL=float (run both for the two side by side); one decode step at B=1 and B=8, Hkv=8,
// over 32768 tokens, one call and per layer of a graph as the tables time them, against the project's
// fp16 kernel on the same shape, with the pairs of one width each side (their own kernels) beside them.
void pairs_table(double bw) {
  std::printf("\n## Pairs of code widths (head dim 128)\n\n");
  std::printf("| setting | B | Hkv | T | fp16 ms | ms one call | ms graph | %% of copy (graph) | fp16 / graph |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  const Setting pairs[] = {{"K3V3g128", 3, 3, 128}, {"K3V2g128", 3, 2, 128}, {"K2V3g128", 2, 3, 128}, {"K4V3g128", 4, 3, 128},
                           {"K3V4g128", 3, 4, 128}, {"K8V2g128", 8, 2, 128}, {"K2V1g128", 2, 1, 128}, {"K1V2g128", 1, 2, 128},
                           {"K6V4g128", 6, 4, 128}, {"K8V7g128", 8, 7, 128}, {"K3V2g32", 3, 2, 32},   {"K8V2g32", 8, 2, 32},
                           {"K5V7g64", 5, 7, 64},   {"K4V8g128", 4, 8, 128}, {"K2V8g32", 2, 8, 32},   {"K6V8g64", 6, 8, 64}};
  for (const Setting& s : pairs) {
    for (const auto& [B, Hkv] : {std::pair<int, int>{1, 8}, {8, 8}}) decode_table_row("pairs", s, B, Hkv, 32768, bw);
  }
}

// 3- and 1-bit codes on the token-major kernel (--widened, session 65): K3V3 at groups of 128, 64 and
// 32 and K1V1 at 128 and 32, with the tuned K4V4 and K2V2 beside them, Hq = 32 over Hkv = 8 (4 query
// rows a KV head: the token-major kernel over widened codes) and Hkv = 32 (one row: not widened), one
// decode step as the tables time it, against the project's fp16 kernel on the same shape. Run it
// again under SKVQ_CUDA_WIDEN=0 for the kernels that took those codes before (the general path's
// tensor-core kernel; for 1 bit the tuned 1-bit kernels or that one, by one_bit_to_tc).
void widened_table(double bw) {
  std::printf("\n## 3- and 1-bit codes (Hq = 32, head dim 128)\n\n");
  std::printf("| setting | B | Hkv | T | fp16 ms | ms one call | ms graph | %% of copy (graph) | fp16 / graph |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  const Setting settings[] = {{"K3V3g128", 3, 3, 128}, {"K3V3g64", 3, 3, 64},   {"K3V3g32", 3, 3, 32},   {"K1V1g128", 1, 1, 128},
                              {"K1V1g32", 1, 1, 32},   {"K4V4g128", 4, 4, 128}, {"K2V2g128", 2, 2, 128}, {"K4V4g32", 4, 4, 32}};
  for (const Setting& s : settings) {
    for (const auto& [B, Hkv, T] : {std::tuple<int, int, std::int64_t>{1, 8, 32768}, {8, 8, 32768}, {32, 8, 32768}, {1, 8, 131072},
                                    {8, 8, 131072}, {1, 32, 32768}, {8, 32, 32768}}) {
      decode_table_row("widened", s, B, Hkv, T, bw);
    }
  }
}

// Moving a filled cache between host and device: --upload B Hkv T [SETTING]. Downloads it
// (to_host) and uploads it again (DeviceCache from the host cache; the result is checked equal),
// three times each, then forks it on the device (repeat 1) three times; wall clock, medians; GB/s
// of the bytes the cache holds.
void upload(int B, int Hkv, std::int64_t T, const Setting& setting) {
  const OneShape x(B, Hkv, T, setting);
  CHECK(cudaDeviceSynchronize());
  const double held = static_cast<double>(x.cache->bytes_held());
  const auto seconds = [](const auto& fn) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  };
  std::vector<double> down, up;
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<SkvqCache> host;
    down.push_back(seconds([&] { host = std::make_unique<SkvqCache>(x.cache->to_host()); }));
    std::unique_ptr<cuda::DeviceCache> back;
    up.push_back(seconds([&] { back = std::make_unique<cuda::DeviceCache>(*host, T); }));
    if (!back->to_host().same_state(*host)) {
      std::fprintf(stderr, "bench_cuda --upload: the uploaded cache differs from the host cache\n");
      std::exit(1);
    }
  }
  std::vector<double> fork;  // a copy on the device (repeat 1), bytes read and written
  for (int i = 0; i < 3; ++i) fork.push_back(seconds([&] { cuda::DeviceCache copy(*x.cache, T); }));
  std::sort(down.begin(), down.end());
  std::sort(up.begin(), up.end());
  std::sort(fork.begin(), fork.end());
  std::printf("%s B=%d Hkv=%d T=%lld: %.1f MB held; to_host %.3f s (%.2f GB/s), upload %.3f s (%.2f GB/s), "
              "fork %.4f s (%.1f GB/s read+write, allocation and freeing included)\n",
              setting.name, B, Hkv, static_cast<long long>(T), held / 1e6, down[1], held / down[1] / 1e9, up[1],
              held / up[1] / 1e9, fork[1], 2 * held / fork[1] / 1e9);
}

// The host-tensor calls as they were made until stop 45, rebuilt from public calls for --host's
// side-by-side columns: the input checked on one thread, converted into a new host tensor, copied
// from pageable memory into device buffers allocated for the call, appended (or attended), waited
// for, and the buffers freed.
void append_alloc_per_call(cuda::DeviceCache& c, const TensorView& keys, const TensorView& values) {
  std::string why;
  const float limit = std::min(detail::value_limit(c.config().metadata, &why), 65504.0f);
  detail::check_kv_pair(keys, values);
  detail::check_values(keys, "keys", limit, why);
  detail::check_values(values, "values", limit, why);
  const Tensor k16 = Tensor::copy_of(keys, DType::f16), v16 = Tensor::copy_of(values, DType::f16);
  void* dk = cuda::device_alloc(k16.nbytes());
  void* dv = cuda::device_alloc(v16.nbytes());
  cuda::copy_to_device(dk, k16.data(), k16.nbytes());
  cuda::copy_to_device(dv, v16.data(), v16.nbytes());
  c.append_device(dk, dv, keys.shape[2]);
  cuda::synchronize();
  cuda::device_free(dk);
  cuda::device_free(dv);
}
Tensor attend_alloc_per_call(const cuda::DeviceCache& c, const TensorView& queries, float scale) {
  const Tensor q = Tensor::copy_of(queries, DType::f32);
  Tensor out(DType::f32, {queries.shape[0], queries.shape[1], queries.shape[2], 128});
  auto* dq = static_cast<float*>(cuda::device_alloc(q.nbytes()));
  auto* dout = static_cast<float*>(cuda::device_alloc(out.nbytes()));
  cuda::copy_to_device(dq, q.data(), q.nbytes());
  c.attend_device(dq, queries.shape[1], queries.shape[2], scale, dout);
  cuda::copy_to_host(out.data(), dout, out.nbytes());
  cuda::device_free(dq);
  cuda::device_free(dout);
  return out;
}

// The host-tensor calls (append, attend: what `skvq generate --device cuda` makes for each layer and
// token) against the device-pointer calls on the same shapes: --host. Decode steps (one token appended
// from fp32 host tensors, then one query row attended; the device-pointer step appends fp16 rows already
// on the device and leaves the output there), then a prefill of 2048 tokens into an empty cache (fp32 and
// fp16 input; the device-pointer prefill from fp16 rows on the device). K2V2 g128, Hq = 32, D = 128;
// wall clock with the device's work waited for, the two kinds of call alternating, medians.
void host_table() {
  const Setting& setting = kSettings[0];
  const float scale = 0.088f;
  const auto seconds = [](const auto& fn) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  };
  const auto host_tensor = [](DType t, Shape4 shape, unsigned seed) {
    Tensor x(t, shape);  // (uniform in [-1, 1), every 37th channel 8x: as fill_random)
    std::uint64_t r = 0x9e3779b97f4a7c15ull * (seed + 1);
    const TensorView v = x.view();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      const float u = static_cast<float>(r >> 40) / 8388608.0f - 1.0f;
      store_from_f32(v.data + i * static_cast<std::int64_t>(dtype_size(t)), t, (i % 128) % 37 == 0 ? 8 * u : u);
    }
    return x;
  };
  std::printf("\n## Host-tensor calls against device-pointer calls: %s, Hq = 32, D = 128\n\n", setting.name);
  std::printf("Decode step: append of one token, then attention of one query row (median of 60 steps)\n\n");
  std::printf("| B | Hkv | kv_len | host calls ms | host calls, allocating (stop 45) ms | gain | device calls ms | host / device |\n"
              "|---|---|---|---|---|---|---|---|\n");
  for (int B : {1, 8})
    for (int Hkv : {8, 32})
      for (std::int64_t T : {std::int64_t{4096}, std::int64_t{32768}}) {
        const int steps = 60;
        const OneShape x(B, Hkv, T, setting);  // (its cache: the device-pointer calls')
        cuda::DeviceCache& dev_cache = *x.cache;
        cuda::DeviceCache host_cache(dev_cache, T + steps + 8), old_cache(dev_cache, T + steps + 8);  // room for the steps
        cuda::DeviceCache grown(dev_cache, T + steps + 8);
        const Tensor k1 = host_tensor(DType::f32, {B, Hkv, 1, 128}, 1), v1 = host_tensor(DType::f32, {B, Hkv, 1, 128}, 2);
        const Tensor q = host_tensor(DType::f32, {B, 32, 1, 128}, 3);
        CHECK(cudaDeviceSynchronize());
        std::vector<double> th, to, td;
        for (int i = 0; i < steps; ++i) {
          th.push_back(seconds([&] {
            host_cache.append(k1.view(), v1.view());
            const Tensor o = host_cache.attend(q.view(), scale);
          }));
          to.push_back(seconds([&] {
            append_alloc_per_call(old_cache, k1.view(), v1.view());
            const Tensor o = attend_alloc_per_call(old_cache, q.view(), scale);
          }));
          td.push_back(seconds([&] {
            grown.append_device(x.k, x.v, 1);
            grown.attend_device(x.q, 32, 1, scale, x.out);
            CHECK(cudaDeviceSynchronize());
          }));
        }
        const double h = median(th) * 1e3, o = median(to) * 1e3, d = median(td) * 1e3;
        std::printf("| %d | %d | %lld | %.4f | %.4f | %.2fx | %.4f | %.2f |\n", B, Hkv, static_cast<long long>(T), h, o, o / h, d,
                    h / d);
        std::fflush(stdout);
      }
  std::printf("\nPrefill: append of 2048 tokens into an empty cache, the device's work waited for (median of 3)\n\n");
  std::printf("| B | Hkv | input | host call ms | GB/s of input | allocating (stop 45) ms | gain | device call ms (fp16 on the device) "
              "| host / device |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int B : {1, 8})
    for (int Hkv : {8, 32})
      for (DType t : {DType::f32, DType::f16}) {
        const std::int64_t P = 2048;
        const OneShape x(B, Hkv, P, setting);
        const Tensor k = host_tensor(t, {B, Hkv, P, 128}, 4), v = host_tensor(t, {B, Hkv, P, 128}, 5);
        std::vector<double> th, to, td;
        for (int i = 0; i < 3; ++i) {
          cuda::DeviceCache a(make_config(setting), B, Hkv, 128, P), b(make_config(setting), B, Hkv, 128, P),
              c(make_config(setting), B, Hkv, 128, P);
          th.push_back(seconds([&] {
            a.append(k.view(), v.view());
            CHECK(cudaDeviceSynchronize());
          }));
          to.push_back(seconds([&] { append_alloc_per_call(c, k.view(), v.view()); }));
          td.push_back(seconds([&] {
            b.append_device(x.k, x.v, P);
            CHECK(cudaDeviceSynchronize());
          }));
        }
        const double h = median(th), o = median(to), d = median(td);
        const double in_bytes = 2.0 * static_cast<double>(k.nbytes());
        std::printf("| %d | %d | %s | %.3f | %.2f | %.3f | %.2fx | %.3f | %.1f |\n", B, Hkv, t == DType::f32 ? "fp32" : "fp16",
                    h * 1e3, in_bytes / h / 1e9, o * 1e3, o / h, d * 1e3, h / d);
        std::fflush(stdout);
      }
}

__global__ void f32_to_16(const float* x, std::size_t n, __half* h, unsigned short* b) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    h[i] = __float2half_rn(x[i]);
    b[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

// n random values in each element type, on the device: [0] fp32, [1] fp16, [2] bf16 (each the fp32
// values rounded).
struct TypedBuffers {
  void* p[3] = {};
  explicit TypedBuffers(std::size_t n, std::uint32_t seed) {
    CHECK(cudaMalloc(&p[0], n * 4));
    CHECK(cudaMalloc(&p[1], n * 2));
    CHECK(cudaMalloc(&p[2], n * 2));
    fill_random_f32<<<2048, 256>>>(static_cast<float*>(p[0]), n, seed);
    f32_to_16<<<2048, 256>>>(static_cast<const float*>(p[0]), n, static_cast<__half*>(p[1]), static_cast<unsigned short*>(p[2]));
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
  }
  ~TypedBuffers() {
    for (void* x : p) cudaFree(x);
  }
  TypedBuffers(const TypedBuffers&) = delete;
  TypedBuffers& operator=(const TypedBuffers&) = delete;
};

// --dtypes' decode table: a step with queries and output in each type.
void dtypes_decode(const Setting& st, const DType (&types)[3], float scale) {
  std::printf("Decode step, queries and output of the type (graph, per layer; median of 3 rounds)\n\n");
  std::printf("| B | Hkv | kv_len | L | fp32 ms | fp16 ms | bf16 ms | fp16 / fp32 | bf16 / fp32 |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [B, Hkv, T] : {std::tuple<int, int, std::int64_t>{1, 8, 32768}, {1, 8, 131072}, {1, 32, 32768}, {8, 8, 131072},
                                  {32, 32, 4096}}) {
    const std::size_t n = static_cast<std::size_t>(B) * Hkv * T * 128;
    __half *k, *v;
    CHECK(cudaMalloc(&k, n * 2));
    CHECK(cudaMalloc(&v, n * 2));
    random_half(k, n, 11);
    random_half(v, n, 12);
    std::vector<std::unique_ptr<cuda::DeviceCache>> caches;
    fill_layers(caches, 1, make_config(st), B, Hkv, T, k, v);
    const int L = stack_layers(static_cast<double>(caches[0]->bytes_read_per_step()));
    fill_layers(caches, L, make_config(st), B, Hkv, T, k, v);
    CHECK(cudaFree(k));
    CHECK(cudaFree(v));
    const TypedBuffers q(static_cast<std::size_t>(B) * 32 * 128, 13);
    void* out;
    CHECK(cudaMalloc(&out, static_cast<std::size_t>(B) * 32 * 128 * 4));
    std::vector<double> ms[3];
    for (int round = 0; round < 3; ++round)
      for (int i = 0; i < 3; ++i) {
        ms[i].push_back(graph_ms(L, 50, [&](int l, cudaStream_t s) {
          caches[l]->attend_device(q.p[i], types[i], 32, 1, scale, out, types[i], 0, s);
        }));
      }
    const double a = median(ms[0]), b = median(ms[1]), c = median(ms[2]);
    std::printf("| %d | %d | %lld | %d | %.4f | %.4f | %.4f | %.3f | %.3f |\n", B, Hkv, static_cast<long long>(T), L, a, b, c, b / a,
                c / a);
    std::fflush(stdout);
    CHECK(cudaFree(out));
  }
}

// --dtypes' prefill table: append_device from rows in each type.
void dtypes_prefill(const Setting& st, const DType (&types)[3]) {
  std::printf("\nPrefill: append_device of all the tokens into an empty cache (median of 5 each, alternating; "
              "bf16 and fp32 rounded to fp16 by the flush kernels as they read them)\n\n");
  std::printf("| B | Hkv | tokens | search | fp16 ms | bf16 ms | fp32 ms | fp16 GB/s in | bf16 GB/s in | fp32 GB/s in "
              "| bf16 / fp16 | fp32 / fp16 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [B, Hkv, P] : {std::tuple<int, int, std::int64_t>{1, 32, 16384}, {8, 8, 8192}, {1, 8, 1000}}) {
    const std::size_t n = static_cast<std::size_t>(B) * Hkv * P * 128;
    const TypedBuffers k(n, 21), v(n, 22);
    for (bool search : {true, false}) {
      const Config cfg = make_config(st, search);
      std::vector<double> ms[3];
      for (int round = 0; round < 5; ++round)
        for (int i : {1, 2, 0}) {
          std::unique_ptr<cuda::DeviceCache> c;
          ms[i].push_back(time_ms(1, [&] { c->append_device(k.p[i], v.p[i], P, types[i]); },
                                  [&] { c = std::make_unique<cuda::DeviceCache>(cfg, B, Hkv, 128, P); }));
        }
      const double h = median(ms[1]), b = median(ms[2]), f = median(ms[0]);
      const double in16 = 2.0 * static_cast<double>(n) * 2;  // keys and values
      std::printf("| %d | %d | %lld | %s | %.3f | %.3f | %.3f | %.0f | %.0f | %.0f | %.2f | %.2f |\n", B, Hkv,
                  static_cast<long long>(P), search ? "on" : "off", h, b, f, in16 / h / 1e6, in16 / b / 1e6, 2 * in16 / f / 1e6,
                  b / h, f / h);
      std::fflush(stdout);
    }
  }
}

// The device calls in each element type: --dtypes. A decode step (per layer of a graph of L layers,
// as decode_table's graph column) with queries and output in fp32, fp16 and bf16, the three
// alternating over 3 rounds; then append_device of a prefill into an empty cache from fp16, bf16 and
// fp32 rows on the device (bf16 and fp32 rounded to fp16 on the device: the tail's rows straight
// into it, whole windows by the flush kernels as they read them), the flush's clip search on and off, the three
// alternating; medians. K2V2 g128, Hq = 32, D = 128. --dtypes-prefill: the prefill table alone.
void dtypes_table(bool decode) {
  const Setting& st = kSettings[0];
  const DType types[3] = {DType::f32, DType::f16, DType::bf16};
  const float scale = 0.088f;
  std::printf("\n## Device calls in each element type: %s, Hq = 32, D = 128\n\n", st.name);
  if (decode) dtypes_decode(st, types, scale);
  dtypes_prefill(st, types);
}

// Chunked prefill (--chunks): a chunk of S new tokens (fp16 rows on the device) appended to a
// cache that holds a history of T tokens, then the attention of its S query rows (causal: row i
// sees the history and the chunk's rows up to i) over the T + S tokens; Hq = 32, D = 128. The
// append is timed on a fresh fork of the history's cache each time (the fork untimed); the
// attention against the project's fp16 kernel over T + S fp16 tokens, same Sq. Medians.
void chunks_table(const std::vector<std::int64_t>& sizes) {
  std::printf("\n## Chunked prefill: S new tokens after a history of T (Hq = 32, D = 128; medians)\n\n");
  std::printf("| B | Hkv | T | setting | S | append ms | attend ms | fp16 attend ms | fp16 / skvq attend | attend us a new row |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  const std::int64_t max_s = *std::max_element(sizes.begin(), sizes.end());
  for (const auto& [B, Hkv, T] : {std::tuple<int, int, std::int64_t>{1, 8, 32768}, {1, 8, 131072}, {8, 8, 32768}}) {
    const std::size_t hist = static_cast<std::size_t>(B) * Hkv * T * 128, chunk = static_cast<std::size_t>(B) * Hkv * max_s * 128;
    const std::size_t dense = static_cast<std::size_t>(B) * Hkv * (T + max_s) * 128;
    __half *hk, *hv, *ck, *cv, *dk, *dv;
    float *q, *out;
    for (auto [p, n] : {std::pair{&hk, hist}, {&hv, hist}, {&ck, chunk}, {&cv, chunk}, {&dk, dense}, {&dv, dense}}) {
      CHECK(cudaMalloc(p, n * 2));
      random_half(*p, n, static_cast<std::uint32_t>(n % 997));
    }
    const std::size_t qn = static_cast<std::size_t>(B) * 32 * max_s * 128;
    CHECK(cudaMalloc(&q, qn * 4));
    CHECK(cudaMalloc(&out, qn * 4));
    fill_random_f32<<<256, 256>>>(q, qn, 7);
    for (int si : {0, 1}) {
      const Setting& st = kSettings[si];
      cuda::DeviceCache base(make_config(st), B, Hkv, 128, T);
      base.append_device(hk, hv, T);
      CHECK(cudaDeviceSynchronize());
      for (const std::int64_t S : sizes) {
        std::unique_ptr<cuda::DeviceCache> c;
        // (the chunk's rows [B, Hkv, S, 128]: the first B * Hkv * S rows of the chunk buffer)
        const double app = time_ms(5, [&] { c->append_device(ck, cv, S); },
                                   [&] { c = std::make_unique<cuda::DeviceCache>(base, T + S, 1); });
        const double att = time_ms(10, [&] { c->attend_device(q, 32, S, 0.088f, out); });
        const double f16 = time_ms(10, [&] { cuda::attend_dense_fp16(q, dk, dv, out, B, 32, Hkv, S, T + S, 128, 128, 0.088f); });
        std::printf("| %d | %d | %lld | %s | %lld | %.3f | %.3f | %.3f | %.2f | %.2f |\n", B, Hkv, static_cast<long long>(T), st.name,
                    static_cast<long long>(S), app, att, f16, f16 / att, att * 1e3 / static_cast<double>(S));
        std::printf("RESULT chunk B=%d Hkv=%d T=%lld setting=%s S=%lld append_ms=%.5f attend_ms=%.5f fp16_ms=%.5f\n", B, Hkv,
                    static_cast<long long>(T), st.name, static_cast<long long>(S), app, att, f16);
        std::fflush(stdout);
      }
    }
    for (void* p : {static_cast<void*>(hk), static_cast<void*>(hv), static_cast<void*>(ck), static_cast<void*>(cv),
                    static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(q), static_cast<void*>(out)})
      CHECK(cudaFree(p));
  }
}

// One packed decode step on one shape (for a profiler; timed as one call, back to back, and per layer
// of a graph of L layers as the tables time it): --one B Hkv T [SETTING]
// (SETTING: one of kSettings' names, K2V2g128 when left out, or any KaVbgN with a, b in 1 to 8
// and N in {32, 64, 128}: the single-shape modes take settings the tables leave out)
void one(int B, int Hkv, std::int64_t T, const Setting& setting) {
  const OneShape x(B, Hkv, T, setting);
  const cuda::DeviceCache& c = *x.cache;
  const float* q = x.q;
  float* out = x.out;
  cuda::attend_dense_fp16(q, x.k, x.v, out, B, 32, Hkv, 1, T, 128, 128, 0.088f);
  CHECK(cudaDeviceSynchronize());
  // One call and per layer of a graph as the tables time them, and 20 calls back to back (host work
  // overlapped).
  const StepTimes st = step_times(x, B, Hkv, T, setting);
  const double many_ms = time_ms(5, [&] {
                           for (int i = 0; i < 20; ++i) c.attend_device(q, 32, 1, 0.088f, out);
                         }) / 20;
  std::printf("%s B=%d Hkv=%d T=%lld: one call %.4f ms, back to back %.4f ms a call\n", setting.name, B, Hkv,
              static_cast<long long>(T), st.one_ms, many_ms);
  std::printf("%s B=%d Hkv=%d T=%lld: graph %.4f ms a layer (%d layers)\n", setting.name, B, Hkv, static_cast<long long>(T), st.graph_ms,
              st.layers);
  // Host time to enqueue a call, and of its parts' kinds, 200 each (the device runs behind).
  const auto host_us = [](const std::function<void()>& fn) {
    CHECK(cudaDeviceSynchronize());
    const auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) fn();
    const auto b = std::chrono::steady_clock::now();
    CHECK(cudaDeviceSynchronize());
    return std::chrono::duration<double, std::micro>(b - a).count() / 200;
  };
  cudaMemPool_t pool;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  CHECK(cudaMemPoolCreate(&pool, &props));
  std::uint64_t keep = UINT64_MAX;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  const double attend_us = host_us([&] { c.attend_device(q, 32, 1, 0.088f, out); });
  const double pool_us = host_us([&] {
    void* w = nullptr;
    CHECK(cudaMallocFromPoolAsync(&w, 1 << 20, pool, 0));
    CHECK(cudaFreeAsync(w, 0));
  });
  const double launch_us = host_us([&] { fill_random_f32<<<1, 32>>>(out, 32, 1); });
  int dev = 0, sms = 0;
  const double attr_us = host_us([&] {
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  });
  std::printf("host us a call: attend_device %.2f; pool alloc + free %.2f; a kernel launch %.2f; device + attribute query %.2f\n",
              attend_us, pool_us, launch_us, attr_us);
  CHECK(cudaMemPoolDestroy(pool));
}

// One packed decode step on one shape by three routes, three rounds alternating:
// the legacy default stream, a non-blocking stream (both one call between two
// events) and a one-call CUDA graph on that stream: --streams B Hkv T [SETTING]
void streams(int B, int Hkv, std::int64_t T, const Setting& setting) {
  const OneShape x(B, Hkv, T, setting);
  const cuda::DeviceCache& c = *x.cache;
  const float* q = x.q;
  float* out = x.out;
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  c.attend_device(q, 32, 1, 0.088f, out);
  c.attend_device(q, 32, 1, 0.088f, out, 0, s);
  CHECK(cudaDeviceSynchronize());
  for (int round = 0; round < 3; ++round) {
    const double legacy = time_ms(20, [&] { c.attend_device(q, 32, 1, 0.088f, out); });
    const double stream = time_ms(20, [&] { c.attend_device(q, 32, 1, 0.088f, out, 0, s); }, {}, s);
    const double graph = graph_ms(1, 20, [&](int, cudaStream_t gs) { c.attend_device(q, 32, 1, 0.088f, out, 0, gs); });
    std::printf("%s B=%d Hkv=%d T=%lld round %d: legacy stream %.4f ms, non-blocking stream %.4f ms, graph %.4f ms\n", setting.name,
                B, Hkv, static_cast<long long>(T), round, legacy, stream, graph);
  }
  cuda::release_workspace(s);
  CHECK(cudaStreamDestroy(s));
}

// Split counts of the packed body against the default, per layer of an
// L-layer graph (cold L2, as the decode table's graph column): each request
// s gives n = ceil(tiles / s) tiles of 128 tokens a split after
// run_attention's rounding, so ceil(tiles / n) splits: --splits B Hkv T [SETTING]
void splits(int B, int Hkv, std::int64_t T, const Setting& setting) {
  OneShape x(B, Hkv, T, setting);
  const int L = stack_layers(static_cast<double>(x.cache->bytes_read_per_step()));
  std::vector<std::unique_ptr<cuda::DeviceCache>> caches;
  caches.push_back(std::move(x.cache));
  fill_layers(caches, L, make_config(setting), B, Hkv, T, x.k, x.v);
  const std::int64_t tiles = caches[0]->q_end() / 128;
  std::printf("%s B=%d Hkv=%d T=%lld, %d layers, %lld tiles a head (request: tiles a split, splits):", setting.name, B, Hkv,
              static_cast<long long>(T), L, static_cast<long long>(tiles));
  for (int round = 0; round < 2; ++round) {
    const double def = graph_ms(L, 20, [&](int l, cudaStream_t s) { caches[l]->attend_device(x.q, 32, 1, 0.088f, x.out, 0, s); });
    std::printf("\n  round %d: default %.4f ms", round, def);
    for (int req : {1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 16, 18, 20, 24, 32, 41, 48, 64, 82, 128, 256}) {
      if (req > tiles) break;
      const std::int64_t n = (tiles + req - 1) / req;
      const double t = graph_ms(L, 20, [&](int l, cudaStream_t s) { caches[l]->attend_device(x.q, 32, 1, 0.088f, x.out, req, s); });
      std::printf("; %d: %lld, %lld %.4f", req, static_cast<long long>(n), static_cast<long long>((tiles + n - 1) / n), t);
    }
  }
  std::printf("\n");
}

#ifdef SKVQ_CUDA_TRACE
// Per-block timestamps of one decode step, L2 cold (a 512 MB buffer written
// before each call), three rounds: when the body's blocks start and end, how
// long their tile loops and epilogues take, when the combine's blocks start,
// leave their wait and end (us from the first body block's start):
// --trace B Hkv T [SETTING]
void trace_step(int B, int Hkv, std::int64_t T, const Setting& setting) {
  const OneShape x(B, Hkv, T, setting);
  const cuda::DeviceCache& c = *x.cache;
  void* scratch = nullptr;
  const std::size_t scratch_bytes = std::size_t{512} << 20;
  CHECK(cudaMalloc(&scratch, scratch_bytes));
  for (int i = 0; i < 3; ++i) c.attend_device(x.q, 32, 1, 0.088f, x.out);
  const auto pct = [](std::vector<double> v, double f) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(f * static_cast<double>(v.size())))];
  };
  for (int round = 0; round < 3; ++round) {
    CHECK(cudaMemset(scratch, round, scratch_bytes));
    cuda::trace::reset();
    c.attend_device(x.q, 32, 1, 0.088f, x.out);
    const std::vector<cuda::trace::Record> r = cuda::trace::fetch();
    std::uint64_t base = UINT64_MAX;
    for (const auto& e : r)
      if (e.kind == cuda::trace::kBody) base = std::min(base, e.t0);
    if (base == UINT64_MAX) {  // (the traced body kernels: attn_tmma_kernel and attn_rs_kernel)
      std::fprintf(stderr, "bench_cuda --trace: %s B=%d Hkv=%d T=%lld runs a body kernel without timestamps\n", setting.name, B,
                   Hkv, static_cast<long long>(T));
      break;
    }
    std::vector<double> b0, b_loop, b_epi, b2, c0, c1, c2;
    std::vector<int> per_sm(1024, 0);
    const auto us = [&](std::uint64_t t) { return (static_cast<double>(t) - static_cast<double>(base)) / 1e3; };
    for (const auto& e : r) {
      if (e.kind == cuda::trace::kBody) {
        b0.push_back(us(e.t0)), b2.push_back(us(e.t2));
        b_loop.push_back((static_cast<double>(e.t1) - static_cast<double>(e.t0)) / 1e3);
        b_epi.push_back((static_cast<double>(e.t2) - static_cast<double>(e.t1)) / 1e3);
        ++per_sm[e.sm % 1024];
      } else {
        c0.push_back(us(e.t0)), c1.push_back(us(e.t1)), c2.push_back(us(e.t2));
      }
    }
    if (const char* dump = std::getenv("SKVQ_TRACE_DUMP")) {  // every record, for a closer look
      const std::string path = std::string(dump) + "_" + std::to_string(round) + ".csv";
      std::FILE* f = std::fopen(path.c_str(), "w");
      if (f == nullptr) {
        std::fprintf(stderr, "bench_cuda --trace: SKVQ_TRACE_DUMP: cannot write '%s'\n", path.c_str());
        std::exit(1);
      }
      // (tq, tf and tiles: the token-major body's, else 0 and the start)
      std::fprintf(f, "kind,sm,block,t0,t1,t2,tq,tf,tiles\n");
      const auto us0 = [&](std::uint64_t t) { return t == 0 ? 0.0 : us(t); };
      for (const auto& e : r)
        std::fprintf(f, "%u,%u,%u,%.3f,%.3f,%.3f,%.3f,%.3f,%u\n", e.kind, e.sm, e.block, us(e.t0), us(e.t1), us(e.t2), us0(e.tq),
                     us0(e.tf), e.tiles);
      std::fclose(f);
    }
    const int sms_used = static_cast<int>(std::count_if(per_sm.begin(), per_sm.end(), [](int n) { return n > 0; }));
    const int most = *std::max_element(per_sm.begin(), per_sm.end());
    std::printf("%s B=%d Hkv=%d T=%lld round %d: body %zu blocks on %d SMs (at most %d an SM)\n", setting.name, B, Hkv,
                static_cast<long long>(T), round, b0.size(), sms_used, most);
    std::printf("  body start (us) p50 %.2f p90 %.2f max %.2f | tile loop p0 %.2f p50 %.2f max %.2f | epilogue p50 %.2f max %.2f"
                " | end p0 %.2f p10 %.2f p50 %.2f p90 %.2f max %.2f\n",
                pct(b0, 0.5), pct(b0, 0.9), pct(b0, 1), pct(b_loop, 0), pct(b_loop, 0.5), pct(b_loop, 1), pct(b_epi, 0.5),
                pct(b_epi, 1), pct(b2, 0), pct(b2, 0.1), pct(b2, 0.5), pct(b2, 0.9), pct(b2, 1));
    std::printf("  combine %zu blocks: start p0 %.2f max %.2f | wait over p0 %.2f max %.2f | end p50 %.2f max %.2f\n", c0.size(),
                pct(c0, 0), pct(c0, 1), pct(c1, 0), pct(c1, 1), pct(c2, 0.5), pct(c2, 1));
  }
  CHECK(cudaFree(scratch));
}
#endif

// Decode steps at other head dims (the general-shape path; at D = 128 the tuned kernels unless
// SKVQ_CUDA_BODY=general): --head-dims. Hq = 32, Hkv = 8, K2V2 at groups of 32 and 128 against the
// project's fp16 kernel at the same D (the general path too, where D != 128), each as one call and
// per layer of a graph (cold L2), GB/s of the bytes each reads and its share of copy bandwidth.
void head_dims_table(int only_d = 0, int only_b = 0, std::int64_t only_t = 0) {
  const double bw = copy_bandwidth();
  std::printf("copy bandwidth (device to device, read + write): %.0f GB/s\n", bw / 1e9);
  const char* body = std::getenv("SKVQ_CUDA_BODY");
  std::printf("\n## Decode attention at other head dims: Hq=32, Hkv=8, one step (SKVQ_CUDA_BODY=%s)\n\n", body ? body : "");
  std::printf("| D | B | kv_len | kernel | MB read | one call ms | %% copy bw | L | graph ms | %% copy bw | fp16 / this (graph) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  const int Hkv = 8, Hq = 32;
  for (int D : {16, 32, 64, 96, 128, 256})
    for (int B : {1, 8})
      for (std::int64_t T : {std::int64_t{32768}, std::int64_t{131072}}) {
        if ((only_d && D != only_d) || (only_b && B != only_b) || (only_t && T != only_t)) continue;
        const std::size_t n = static_cast<std::size_t>(B) * Hkv * T * D;
        const double fp16_bytes = 2.0 * n * 2;
        const int L16 = stack_layers(fp16_bytes);
        const Fp16Layers fp16(n, L16, static_cast<std::uint32_t>(T + B), static_cast<std::uint32_t>(T + D));
        const std::vector<__half*>&ks = fp16.ks, &vs = fp16.vs;
        float *q, *out;
        const std::size_t nq = static_cast<std::size_t>(B) * Hq * D;
        CHECK(cudaMalloc(&q, nq * 4));
        CHECK(cudaMalloc(&out, nq * 4));
        fill_random_f32<<<256, 256>>>(q, nq, 5);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        const int reps = 20;
        const auto row = [&](const char* name, double bytes, double one, int layers, double graph, double graph16) {
          std::printf("| %d | %d | %lld | %s | %.1f | %.4f | %.1f%% | %d | %.4f | %.1f%% | %.2f |\n", D, B,
                      static_cast<long long>(T), name, bytes / 1e6, one, 100 * bytes / (one * 1e-3) / bw, layers, graph,
                      100 * bytes / (graph * 1e-3) / bw, graph16 / graph);
        };
        const double t16 = time_ms(reps, [&] { cuda::attend_dense_fp16(q, ks[0], vs[0], out, B, Hq, Hkv, 1, T, D, D, scale); });
        const double g16 = graph_ms(L16, reps, [&](int l, cudaStream_t s) {
          cuda::attend_dense_fp16(q, ks[l], vs[l], out, B, Hq, Hkv, 1, T, D, D, scale, 0, s);
        });
        row("fp16", fp16_bytes, t16, L16, g16, g16);
        for (const Setting& st : {kSettings[0], kSettings[2]}) {
          Config cfg = make_config(st);
          cfg.head_dim = D;
          std::vector<std::unique_ptr<cuda::DeviceCache>> caches;
          auto grow = [&](int layers) {
            while (static_cast<int>(caches.size()) < layers) {
              caches.push_back(std::make_unique<cuda::DeviceCache>(cfg, B, Hkv, D, T));
              caches.back()->append_device(ks[0], vs[0], T);
            }
            CHECK(cudaDeviceSynchronize());
          };
          grow(1);
          const double bytes = static_cast<double>(caches[0]->bytes_read_per_step());
          const int L = stack_layers(bytes);
          grow(L);
          const double tq = time_ms(reps, [&] { caches[0]->attend_device(q, Hq, 1, scale, out); });
          const double gq = graph_ms(L, reps, [&](int l, cudaStream_t s) { caches[l]->attend_device(q, Hq, 1, scale, out, 0, s); });
          row(st.name, bytes, tq, L, gq, g16);
        }
        std::fflush(stdout);
        CHECK(cudaFree(q));
        CHECK(cudaFree(out));
      }
}

int main(int argc, char** argv) {
  using ShapeMode = void (*)(int, int, std::int64_t, const Setting&);
  const std::pair<const char*, ShapeMode> modes[] = {{"--one", one},
                                                     {"--upload", upload},
                                                     {"--streams", streams},
                                                     {"--splits", splits},
#ifdef SKVQ_CUDA_TRACE
                                                     {"--trace", trace_step},
#endif
  };
  const auto mode = argc >= 2 ? std::find_if(std::begin(modes), std::end(modes),
                                             [&](const auto& m) { return std::strcmp(argv[1], m.first) == 0; })
                              : std::end(modes);
  if ((argc == 5 || argc == 6) && mode != std::end(modes)) {
    const Setting* setting = &kSettings[0];
    if (argc == 6) {
      setting = nullptr;
      for (const Setting& s : kSettings)
        if (std::strcmp(argv[5], s.name) == 0) setting = &s;
      static Setting other{};
      const auto bits_ok = [](int b) { return b >= 1 && b <= 8; };
      int kb = 0, vb = 0, group = 0, used = 0;
      if (setting == nullptr && std::sscanf(argv[5], "K%dV%dg%d%n", &kb, &vb, &group, &used) == 3 &&
          argv[5][used] == '\0' && bits_ok(kb) && bits_ok(vb) && (group == 32 || group == 64 || group == 128)) {
        other = Setting{argv[5], kb, vb, group};
        setting = &other;
      }
      if (setting == nullptr) {
        std::fprintf(stderr, "bench_cuda: unknown SETTING '%s' (one of:", argv[5]);
        for (const Setting& s : kSettings) std::fprintf(stderr, " %s", s.name);
        std::fprintf(stderr, ", or KaVbgN: a, b in 1 to 8; N in 32, 64, 128)\n");
        return 2;
      }
    }
    mode->second(std::atoi(argv[2]), std::atoi(argv[3]), std::atoll(argv[4]), *setting);
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--host") == 0) {
    host_table();
    return 0;
  }
  if (argc == 2 && (std::strcmp(argv[1], "--dtypes") == 0 || std::strcmp(argv[1], "--dtypes-prefill") == 0)) {
    dtypes_table(std::strcmp(argv[1], "--dtypes") == 0);
    return 0;
  }
  if ((argc == 2 || argc == 3) && std::strcmp(argv[1], "--chunks") == 0) {
    std::vector<std::int64_t> sizes{16, 128, 512, 2048};
    if (argc == 3) {  // --chunks S1,S2,...: other chunk lengths (each 1-65536)
      sizes.clear();
      for (const char* c = argv[2]; *c != '\0';) {
        char* end = nullptr;
        const long long v = std::strtoll(c, &end, 10);
        if (end == c || v < 1 || v > 65536 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "bench_cuda: --chunks '%s': each chunk length must be an integer in 1..65536, comma-separated\n", argv[2]);
          return 2;
        }
        sizes.push_back(v);
        c = *end == ',' ? end + 1 : end;
      }
      if (sizes.empty()) {
        std::fprintf(stderr, "bench_cuda: --chunks '': give at least one chunk length\n");
        return 2;
      }
    }
    chunks_table(sizes);
    return 0;
  }
  if (argc == 2 && (std::strcmp(argv[1], "--widths") == 0 || std::strcmp(argv[1], "--pairs") == 0 || std::strcmp(argv[1], "--widened") == 0)) {
    if (!cuda::available()) {
      std::printf("no GPU: %s\n", cuda::device_description().c_str());
      return 0;
    }
    const double bw = copy_bandwidth();
    std::printf("device: %s\ncopy bandwidth (device to device, read + write): %.0f GB/s\n", cuda::device_description().c_str(), bw / 1e9);
    if (std::strcmp(argv[1], "--widths") == 0) widths_table(bw);
    else if (std::strcmp(argv[1], "--pairs") == 0) pairs_table(bw);
    else widened_table(bw);
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--read-floor") == 0) {
    read_floor();
    return 0;
  }
  if ((argc == 2 || argc == 5) && std::strcmp(argv[1], "--head-dims") == 0) {
    if (argc == 5) head_dims_table(std::atoi(argv[2]), std::atoi(argv[3]), std::atoll(argv[4]));
    else head_dims_table();
    return 0;
  }
  bool quick = false, scale = true, flush_only = false, scale_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--flush") == 0) flush_only = true;
    if (std::strcmp(argv[i], "--no-scale") == 0) scale = false;
    if (std::strcmp(argv[i], "--scale") == 0) scale_only = true;  // the 1M-token cache alone
  }
  if (!cuda::available()) {
    std::printf("no GPU: %s\n", cuda::device_description().c_str());
    return 0;
  }
  std::printf("device: %s\n", cuda::device_description().c_str());
  const double bw = copy_bandwidth();
  std::printf("copy bandwidth (device to device, read + write): %.0f GB/s\n", bw / 1e9);
  std::printf("RESULT copy gbs=%.1f\n", bw / 1e9);
  if (scale_only) {
    scale_test(quick ? 131072 : 1000000);
    return 0;
  }
  flush_table(bw, quick);
  if (flush_only) return 0;
  decode_table(bw, quick);
  if (scale) scale_test(quick ? 131072 : 1000000);
  return 0;
}
