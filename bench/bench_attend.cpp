// Benchmark of one decode step's attention (issue 4): packed attend at 2/2
// and 4/4 bits vs dense fp16 attention through the same kernel vs
// materialize-then-attend, side by side, with bytes read per step and the
// machine's copy bandwidth measured in the same run.
// Usage: bench_attend [--quick | --len N (one row)] [--kv-heads H (grouped-query: Hq = 32 over H)] | --layout N
//   --layout N: K2V2 and K4V4 at kv_len N with the store on huge pages or on
//   4 KiB pages, walked chunk by chunk or head by head (SKVQ_CPU_WALK=head),
//   all four timed in turns with the copy.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "bench_util.hpp"
#include "core/skvq_state.hpp"
#include "core/store_alloc.hpp"
#include "core/thread_pool.hpp"
#include "cpu/quantize_simd.hpp"
#include "skvq/skvq.hpp"
#include "workload/synthetic.hpp"

using namespace skvq;

namespace {

constexpr std::int64_t kHeads = 32, kDim = 128;

// One copy of 512 MiB with every thread; bandwidth = (bytes read + bytes written) / s.
struct CopyProbe {
  static constexpr std::size_t n = std::size_t{1} << 29;
  std::vector<char> a = std::vector<char>(n, 1), b = std::vector<char>(n, 2);
  void run() {
    auto& pool = detail::ThreadPool::global();
    const int parts = pool.size() * 4;
    pool.parallel_for(parts, pool.size(), [&](std::int64_t i) {
      const std::size_t chunk = n / static_cast<std::size_t>(parts);
      std::memcpy(b.data() + static_cast<std::size_t>(i) * chunk, a.data() + static_cast<std::size_t>(i) * chunk, chunk);
    });
    if (b[n / 2] != 1) std::abort();
  }
  static double bandwidth(double seconds) { return 2.0 * static_cast<double>(n) / seconds; }
};

// An fp16 tensor in the packed store's kind of memory (2 MiB-aligned regions
// advised for transparent huge pages), so that dense attention and the
// materialized history are read from pages of the same kind as the packed
// store's: on 4 KiB pages the dense step's time moved by 10-12% with where
// its buffers happened to land (session 19).
struct HugeF16 {
  std::size_t bytes;
  void* p;
  TensorView t;
  explicit HugeF16(Shape4 s)
      : bytes(static_cast<std::size_t>(s[0] * s[1] * s[2] * s[3]) * 2),
        p(detail::store_allocate(bytes)),
        t(TensorView::contiguous(p, DType::f16, s)) {}
  ~HugeF16() { detail::store_deallocate(p, bytes); }
  HugeF16(const HugeF16&) = delete;
  HugeF16& operator=(const HugeF16&) = delete;
  const TensorView& view() const { return t; }
};

// A long history by tiling a shorter synthetic one (timing does not depend on the values).
void tiled_kv(std::int64_t len, HugeF16* k, HugeF16* v) {
  workload::SyntheticSpec sp;
  sp.num_kv_heads = k->view().shape[1];
  sp.head_dim = kDim;
  sp.kv_len = std::min<std::int64_t>(len, 4096);
  Tensor k0, v0;
  workload::make_kv(sp, DType::f16, &k0, &v0);
  for (std::int64_t t = 0; t < len; t += sp.kv_len) {
    const std::int64_t n = std::min(sp.kv_len, len - t);
    copy_into(k0.view().slice_tokens(0, n), k->view().slice_tokens(t, n));
    copy_into(v0.view().slice_tokens(0, n), v->view().slice_tokens(t, n));
  }
}

std::int64_t packed_read_bytes(const SkvqCache& c) {
  const StoredBytes s = c.stored_bytes();
  const std::int64_t live_tail = (c.offset() - c.q_end()) * c.state().heads * kDim * 2 * 2;
  return s.codes + s.metadata + s.sinks + live_tail;
}

// What the store's pages and the kernel's walk order bring, side by side.
int layout_table(std::int64_t len) {
  HugeF16 k({1, kHeads, len, kDim}), v({1, kHeads, len, kDim});
  tiled_kv(len, &k, &v);
  Tensor q = Tensor(DType::f32, {1, kHeads, 1, kDim});
  workload::fill_normal(q.view(), 99, 0.5f);
  Tensor out(DType::f32, {1, kHeads, 1, kDim});
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  CopyProbe copy;
  std::printf("## Store pages and walk order, one decode step: B=1, Hq=H=32, D=128, kv_len %lld, %d threads\n\n",
              static_cast<long long>(len), detail::ThreadPool::global().size());
  std::printf("| bits | huge pages, chunk walk ms | huge pages, head walk ms | 4 KiB pages, chunk walk ms | 4 KiB pages, head walk ms | "
              "copy GB/s | %%bw (huge, chunk) | %%bw (4 KiB, head) |\n|---|---|---|---|---|---|---|---|\n");
  for (int bits : {2, 4}) {
    Config c;
    c.head_dim = kDim;
    c.dense_view = false;
    c.bits_key = c.bits_value = bits;
    SkvqCache huge(c), small(c);
    detail::store_use_regions(true);
    huge.append(k.view(), v.view());
    detail::store_use_regions(false);
    small.append(k.view(), v.view());
    detail::store_use_regions(true);
    auto step = [&](const SkvqCache& cache, bool head_walk) {
      if (head_walk) setenv("SKVQ_CPU_WALK", "head", 1);
      attend(cache, q.view(), scale, out.view());
      if (head_walk) unsetenv("SKVQ_CPU_WALK");
    };
    const std::vector<double> med = bench::interleaved_medians(
        7, {[&] { copy.run(); }, [&] { step(huge, false); }, [&] { step(huge, true); }, [&] { step(small, false); },
            [&] { step(small, true); }});
    const double bw = CopyProbe::bandwidth(med[0]), bytes = static_cast<double>(packed_read_bytes(huge));
    std::printf("| K%dV%d g32 | %.3f | %.3f | %.3f | %.3f | %.1f | %.0f%% | %.0f%% |\n", bits, bits, med[1] * 1e3, med[2] * 1e3,
                med[3] * 1e3, med[4] * 1e3, bw / 1e9, 100 * bytes / med[1] / bw, 100 * bytes / med[4] / bw);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--layout") == 0) return layout_table(std::atoll(argv[2]));
  bool quick = false;
  std::int64_t one_len = 0, kv_heads = kHeads;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--len") == 0 && i + 1 < argc) one_len = std::atoll(argv[++i]);
    else if (std::strcmp(argv[i], "--kv-heads") == 0 && i + 1 < argc) kv_heads = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "bench_attend: unknown or incomplete argument '%s'\n"
                   "usage: bench_attend [--quick | --len N] [--kv-heads H] | --layout N\n", argv[i]);
      return 2;
    }
  }
  if (kv_heads < 1 || kHeads % kv_heads != 0) {
    std::fprintf(stderr, "bench_attend: --kv-heads %lld must divide %lld\n", static_cast<long long>(kv_heads),
                 static_cast<long long>(kHeads));
    return 2;
  }
  const int threads = detail::ThreadPool::global().size();
  std::printf("## Decode attention, one step: B=1, Hq=32, H=%lld, D=128, fp16 history, %d threads, SIMD target %s\n\n",
              static_cast<long long>(kv_heads), threads, cpu::active_target().c_str());
  std::printf("copy bandwidth (read+write, %d threads) measured with every row: a shared VM's memory bandwidth can\n"
              "drift over minutes (one dev VM moved between 40 and 75 GB/s), so the copy, dense fp16, K2V2 and K4V4\n"
              "are timed in turns (medians of the rounds) and each row's shares are of the copy bandwidth measured in\n"
              "the same rounds.\n\n",
              threads);
  std::printf("| kv_len | fp16 dense ms | K2V2 g32 ms | K4V4 g32 ms | materialize+attend K2V2 ms | fp16 / K2V2 | fp16 / K4V4 | "
              "MB read fp16 | MB read K2V2 | MB read K4V4 | copy GB/s | fp16 %%bw | K2V2 %%bw | K4V4 %%bw |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::int64_t> lens = {1024, 4096, 16384, 65536, 131072};
  if (quick) lens = {1024, 4096};
  if (one_len > 0) lens = {one_len};  // one row
  const std::int64_t max_len = lens.back();
  HugeF16 k({1, kv_heads, max_len, kDim}), v({1, kv_heads, max_len, kDim});
  tiled_kv(max_len, &k, &v);
  Tensor q = Tensor(DType::f32, {1, kHeads, 1, kDim});
  workload::fill_normal(q.view(), 99, 0.5f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  Config c2, c4;
  c2.head_dim = c4.head_dim = kDim;
  c2.dense_view = c4.dense_view = false;
  c4.bits_key = c4.bits_value = 4;
  SkvqCache p2(c2), p4(c4);
  CopyProbe copy;
  std::int64_t fed = 0;
  Tensor out(DType::f32, {1, kHeads, 1, kDim});
  for (std::int64_t len : lens) {
    p2.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
    p4.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
    fed = len;
    const int reps = len >= 65536 ? 7 : 15;
    const TensorView kd = k.view().slice_tokens(0, len), vd = v.view().slice_tokens(0, len);
    const std::vector<double> med = bench::interleaved_medians(
        reps, {[&] { copy.run(); }, [&] { attend_dense(q.view(), kd, vd, scale, out.view()); },
               [&] { attend(p2, q.view(), scale, out.view()); }, [&] { attend(p4, q.view(), scale, out.view()); }});
    const double bw = CopyProbe::bandwidth(med[0]), t_dense = med[1], t2 = med[2], t4 = med[3];
    HugeF16 km({1, kv_heads, len, kDim}), vm({1, kv_heads, len, kDim});
    const double tm = bench::median_seconds(reps, [&] {
      p2.fetch_into(km.view(), vm.view());
      attend_dense(q.view(), km.view(), vm.view(), scale, out.view());
    });
    const double b_dense = static_cast<double>(2 * kv_heads * len * kDim * 2);
    const double b2 = static_cast<double>(packed_read_bytes(p2)), b4 = static_cast<double>(packed_read_bytes(p4));
    std::printf("| %lld | %.3f | %.3f | %.3f | %.3f | %.2fx | %.2fx | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.0f%% |\n",
                static_cast<long long>(len), t_dense * 1e3, t2 * 1e3, t4 * 1e3, tm * 1e3, t_dense / t2, t_dense / t4,
                b_dense / 1e6, b2 / 1e6, b4 / 1e6, bw / 1e9, 100 * b_dense / t_dense / bw, 100 * b2 / t2 / bw, 100 * b4 / t4 / bw);
    std::fflush(stdout);
  }
  return 0;
}
