// Benchmarks of the layer cache (issue 2): flush throughput (SIMD vs scalar
// reference on one thread, SIMD on one thread vs all, side by side), the decode-step cost of update_and_fetch as the
// context grows, and bytes held by the packed-only store vs fp16.
// Usage: bench_cache [--quick | --flush]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench_util.hpp"
#include "core/thread_pool.hpp"
#include "core/quant_params.hpp"
#include "cpu/quantize_simd.hpp"
#include "ref/quantize.hpp"
#include "skvq/skvq.hpp"
#include "workload/synthetic.hpp"

using namespace skvq;

namespace {

constexpr std::int64_t kHeads = 32, kDim = 128;

void flush_table(bool quick) {
  const std::int64_t n = quick ? 256 : 1024;  // tokens per run (n / 128 chunks flushed)
  workload::SyntheticSpec sp;
  sp.num_kv_heads = kHeads;
  sp.head_dim = kDim;
  sp.kv_len = n;
  Tensor k, v;
  workload::make_kv(sp, DType::f16, &k, &v);
  const double in_bytes = static_cast<double>(k.nbytes() + v.nbytes());
  const int all = detail::ThreadPool::global().size();
  std::printf("## Flush throughput: H=%lld, D=%lld, window 128, %lld tokens per run, fp16 input (K+V), SIMD target %s, "
              "%d threads\n\n",
              static_cast<long long>(kHeads), static_cast<long long>(kDim), static_cast<long long>(n),
              cpu::active_target().c_str(), all);
  std::printf("| bits | group | search | ref GB/s, 1 thread | SIMD GB/s, 1 thread | SIMD GB/s, %d threads | SIMD / ref "
              "| %d threads / 1 |\n",
              all, all);
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int bits : {2, 4})
    for (int group : {32, 128})
      for (bool search : {true, false}) {
        Config cfg;
        cfg.head_dim = kDim;
        cfg.bits_key = cfg.bits_value = bits;
        cfg.group_size = group;
        cfg.clip_search = search;
        cfg.dense_view = false;
        struct Run {
          Kernel kernel;
          int threads;
        };
        const Run runs[3] = {{Kernel::reference, 1}, {Kernel::simd, 1}, {Kernel::simd, 0}};
        std::vector<std::function<void()>> fns;
        for (const Run& run : runs) {
          fns.push_back([&] {
            SkvqCache c(cfg);
            c.set_kernel(run.kernel);
            c.set_num_threads(run.threads);
            c.append(k.view(), v.view());
          });
        }
        // in turns, so that a slow spell of the machine hits all three
        const std::vector<double> t = bench::interleaved_medians(quick ? 1 : 7, fns);
        std::printf("| %d | %d | %s | %.3f | %.3f | %.3f | %.2fx | %.2fx |\n", bits, group, search ? "on" : "off",
                    in_bytes / t[0] / 1e9, in_bytes / t[1] / 1e9, in_bytes / t[2] / 1e9, t[0] / t[1], t[1] / t[2]);
      }
  std::printf("\n");
}

// The row quantizer alone (the flush's arithmetic), same inputs for both kernels.
void kernel_table(bool quick) {
  const std::int64_t rows = quick ? 2048 : 16384;
  std::printf("## Row quantizer kernel alone: %lld rows of D=128, fp16 metadata\n\n", static_cast<long long>(rows));
  std::printf("| bits | group | search | ref Mvalues/s | SIMD Mvalues/s | SIMD / ref |\n|---|---|---|---|---|---|\n");
  workload::SyntheticSpec sp;
  sp.num_kv_heads = 1;
  sp.head_dim = kDim;
  sp.kv_len = rows;
  Tensor k, v;
  workload::make_kv(sp, DType::f32, &k, &v);
  for (int bits : {2, 4})
    for (int group : {32, 128})
      for (bool search : {true, false}) {
        std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows * kDim));
        std::vector<float> lo(static_cast<std::size_t>(rows * kDim / group)), scale(lo.size());
        const std::vector<float> grid = search ? default_clip_grid() : std::vector<float>{1.0f};
        QuantParams p;
        p.x = reinterpret_cast<const float*>(k.data());
        p.n_rows = rows;
        p.padded_dim = kDim;
        p.group_size = group;
        p.bits = bits;
        p.grid = grid.data();
        p.n_grid = static_cast<int>(grid.size());
        p.meta = MetaType::fp16;
        p.codes = codes.data();
        p.lo = lo.data();
        p.scale = scale.data();
        const double tr = bench::median_seconds(quick ? 1 : 3, [&] { ref::quantize_rows(p); });
        const double ts = bench::median_seconds(quick ? 1 : 5, [&] { cpu::quantize_rows(p); });
        const double n = static_cast<double>(rows * kDim);
        std::printf("| %d | %d | %s | %.1f | %.1f | %.2fx |\n", bits, group, search ? "on" : "off", n / tr / 1e6,
                    n / ts / 1e6, tr / ts);
      }
  std::printf("\n");
}

void decode_table(bool quick) {
  std::printf("## Decode step: update_and_fetch of one token (B=1, H=%lld, D=%lld, K2V2 g32, dense view on)\n\n",
              static_cast<long long>(kHeads), static_cast<long long>(kDim));
  std::printf("| kv_len | median step us (no flush) | mean step us (incl. flushes) | mean / mean at 1k |\n");
  std::printf("|---|---|---|---|\n");
  const std::int64_t steps = 512;  // 4 flushes in the window
  double base = 0;
  std::vector<std::int64_t> lens = {1024, 4096, 16384, 65536, 131072};
  if (quick) lens = {1024, 4096};
  for (std::int64_t len : lens) {
    workload::SyntheticSpec sp;
    sp.num_kv_heads = kHeads;
    sp.head_dim = kDim;
    sp.kv_len = len + steps;
    Tensor k, v;
    workload::make_kv(sp, DType::f16, &k, &v);
    Config cfg;
    cfg.head_dim = kDim;
    cfg.group_size = 32;
    SkvqCache c(cfg);
    c.reserve(len + steps);  // keep the one-off growth copy of the dense view out of the timed steps
    c.append(k.view().slice_tokens(0, len), v.view().slice_tokens(0, len));
    std::vector<double> ts;
    const double t0 = bench::now_seconds();
    for (std::int64_t s = 0; s < steps; ++s) {
      const double a = bench::now_seconds();
      auto out = c.update_and_fetch(k.view().slice_tokens(len + s, 1), v.view().slice_tokens(len + s, 1));
      if (out.first.shape[2] != len + s + 1) std::abort();
      ts.push_back(bench::now_seconds() - a);
    }
    const double mean = (bench::now_seconds() - t0) / static_cast<double>(steps);
    std::sort(ts.begin(), ts.end());
    if (base == 0) base = mean;
    std::printf("| %lld | %.1f | %.1f | %.2f |\n", static_cast<long long>(len), ts[ts.size() / 2] * 1e6, mean * 1e6,
                mean / base);
  }
  std::printf("\n");
}

void bytes_table(bool quick) {
  std::printf("## Bytes held: packed-only store vs fp16 (B=1, H=%lld, D=%lld, window 128, 5 sinks, fp16 metadata)\n\n",
              static_cast<long long>(kHeads), static_cast<long long>(kDim));
  std::printf("| setting | kv_len | fp16 bytes | stored bytes | stored / fp16 |\n|---|---|---|---|---|\n");
  const std::int64_t max_len = quick ? 4096 : 131072;
  workload::SyntheticSpec sp;
  sp.num_kv_heads = kHeads;
  sp.head_dim = kDim;
  sp.kv_len = max_len;
  Tensor k, v;
  workload::make_kv(sp, DType::f16, &k, &v);
  for (int group : {32, 128}) {
    Config cfg;
    cfg.head_dim = kDim;
    cfg.group_size = group;
    cfg.dense_view = false;
    SkvqCache c(cfg);
    std::int64_t fed = 0;
    for (std::int64_t len : {4096L, 32768L, 131072L}) {
      if (len > max_len) break;
      c.append(k.view().slice_tokens(fed, len - fed), v.view().slice_tokens(fed, len - fed));
      fed = len;
      const double fp16 = static_cast<double>(2 * kHeads * len * kDim * 2);
      const double held = static_cast<double>(c.stored_bytes().total());
      std::printf("| K2V2 g%d | %lld | %.0f | %.0f | %.4f |\n", group, static_cast<long long>(len), fp16, held, held / fp16);
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool flush_only = argc > 1 && std::strcmp(argv[1], "--flush") == 0;
  flush_table(quick);
  if (flush_only) return 0;
  kernel_table(quick);
  decode_table(quick);
  bytes_table(quick);
  return 0;
}
