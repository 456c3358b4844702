// skvq demo: a built-in, deterministic LLM-like workload run through several
// bit settings; prints bytes held, ratio to fp16 and the errors each setting
// causes in keys, values and attention outputs. Needs no files.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "cli_common.hpp"
#include "commands.hpp"
#include "ref/attention.hpp"
#include "skvq/skvq.hpp"
#include "workload/synthetic.hpp"

namespace skvq::tools {

namespace {

struct DemoArgs {
  std::int64_t kv_len = 4096;
  std::int64_t heads = 8;
  std::int64_t head_dim = 128;
  std::uint32_t seed = 1234;
};

double rel_mse(const TensorView& a, const TensorView& ref) {
  double num = 0, den = 0;
  for (std::int64_t b = 0; b < a.shape[0]; ++b)
    for (std::int64_t h = 0; h < a.shape[1]; ++h)
      for (std::int64_t t = 0; t < a.shape[2]; ++t)
        for (std::int64_t d = 0; d < a.shape[3]; ++d) {
          const double r = ref.at(b, h, t, d), e = a.at(b, h, t, d) - r;
          num += e * e;
          den += r * r;
        }
  return den > 0 ? num / den : 0.0;
}

struct Setting {
  const char* name;
  int bk, bv, group;
  bool reorder, search;
};

int run_demo(const DemoArgs& a) {
  if (a.kv_len < 1) throw UsageError("--kv-len " + std::to_string(a.kv_len) + " must be >= 1");
  if (a.heads < 1) throw UsageError("--heads " + std::to_string(a.heads) + " must be >= 1");
  if (a.head_dim < 2 || a.head_dim > 1024) throw UsageError("--head-dim " + std::to_string(a.head_dim) + " must be in [2, 1024]");
  // The demo holds the keys and values several times over (fp16 inputs, their reconstructions,
  // float32 attention inputs): at most 2^30 values a tensor, about 10 GB in all.
  constexpr std::int64_t kMaxValues = std::int64_t{1} << 30;
  if (a.kv_len > kMaxValues / a.heads / a.head_dim) {
    throw UsageError("--kv-len " + std::to_string(a.kv_len) + " x --heads " + std::to_string(a.heads) + " x --head-dim " +
                     std::to_string(a.head_dim) + " is more than the demo's 2^30 values a key or value tensor; use a smaller --kv-len");
  }
  workload::SyntheticSpec sp;
  sp.kv_len = a.kv_len;
  sp.num_kv_heads = a.heads;
  sp.head_dim = a.head_dim;
  sp.seed = a.seed;
  Tensor k, v;
  workload::make_kv(sp, DType::f16, &k, &v);
  const std::int64_t hq = a.heads * 4, nq = 4;
  const Tensor q = workload::make_queries(sp, hq, nq, k, DType::f32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  Tensor ref_out(DType::f32, {1, hq, nq, a.head_dim});
  // The queries sit after the whole history: attend over all of it.
  auto attend_all = [&](const TensorView& kk, const TensorView& vv, const TensorView& out) {
    Tensor qq(DType::f32, {1, hq, nq, a.head_dim});
    copy_into(q.view(), qq.view());
    // Each query row sees every key: shift the causal offset by padding with the full history.
    for (std::int64_t i = 0; i < nq; ++i) {
      ref::dense_attention(qq.view().slice_tokens(i, 1), kk, vv, scale, out.slice_tokens(i, 1));
    }
  };
  attend_all(k.view(), v.view(), ref_out.view());
  const double fp16_bytes = static_cast<double>(k.nbytes() + v.nbytes());

  std::printf("skvq demo: synthetic LLM-like K/V, batch 1, %lld KV heads, %lld tokens, head_dim %lld\n",
              static_cast<long long>(a.heads), static_cast<long long>(a.kv_len), static_cast<long long>(a.head_dim));
  std::printf("(4 outlier channels per head, RoPE-rotated keys, 4 large sink rows; %lld query heads (GQA 4), %lld queries)\n",
              static_cast<long long>(hq), static_cast<long long>(nq));
  std::printf("window 128, 5 sinks, packed-only store (no dense copy held)\n\n");
  std::printf("%-22s %14s %8s %12s %12s %14s %10s\n", "setting", "bytes held", "ratio", "key relMSE",
              "value relMSE", "attn out relerr", "flush ms");
  std::printf("%-22s %14.0f %8.4f %12s %12s %14s %10s\n", "fp16 (exact)", fp16_bytes, 1.0, "0", "0", "0", "-");
  const Setting settings[] = {
      {"K8V8 g32", 8, 8, 32, true, true},          {"K4V4 g32", 4, 4, 32, true, true},
      {"K4V2 g32", 4, 2, 32, true, true},          {"K2V2 g32", 2, 2, 32, true, true},
      {"K2V2 g128", 2, 2, 128, true, true},        {"K2V2 g32 no-reorder", 2, 2, 32, false, true},
      {"K2V2 g32 plain minmax", 2, 2, 32, false, false},
  };
  for (const auto& s : settings) {
    Config cfg;
    cfg.head_dim = static_cast<int>(a.head_dim);
    cfg.bits_key = s.bk;
    cfg.bits_value = s.bv;
    cfg.group_size = s.group;
    cfg.reorder = s.reorder;
    cfg.clip_search = s.search;
    cfg.dense_view = false;
    SkvqCache cache(cfg);
    const auto t0 = std::chrono::steady_clock::now();
    cache.append(k.view(), v.view());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Tensor kr(DType::f16, k.shape()), vr(DType::f16, v.shape());
    cache.fetch_into(kr.view(), vr.view());
    Tensor out(DType::f32, ref_out.shape());
    attend_all(kr.view(), vr.view(), out.view());
    const double held = static_cast<double>(cache.stored_bytes().total());
    std::printf("%-22s %14.0f %8.4f %12.3e %12.3e %14.3e %10.1f\n", s.name, held, held / fp16_bytes,
                rel_mse(kr.view(), k.view()), rel_mse(vr.view(), v.view()),
                std::sqrt(rel_mse(out.view(), ref_out.view())), ms);
  }
  std::printf("\nbytes held = codes + lo/scale metadata + exact sinks + exact fp16 tail + permutations.\n");
  const char* model = "../shared/data/lm128/model.bin";
  if (std::filesystem::exists(model)) {
    std::printf("Real model: skvq eval --model %s --text ../shared/data/text/wikitext-test.raw.txt\n", model);
  } else {
    std::printf("Real model: point `skvq eval --model MODEL.bin --tokenizer TOK.bin --text FILE` at a llama2.c\n"
                "checkpoint (the project's evaluation models live in ../shared/data, beside the repository).\n");
  }
  return 0;
}

}  // namespace

void register_demo(CLI::App& app, CommandList& commands) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* sub = app.add_subcommand("demo", "Built-in LLM-like workload through several bit settings (no files needed)");
  sub->add_option("--kv-len", args->kv_len, "tokens in the synthetic context")->check(int64_in_range())->capture_default_str();
  sub->add_option("--heads", args->heads, "KV heads")->check(int64_in_range())->capture_default_str();
  sub->add_option("--head-dim", args->head_dim, "head dim")->check(int64_in_range())->capture_default_str();
  sub->add_option("--seed", args->seed, "workload seed")->check(unsigned_in_range<std::uint32_t>())->capture_default_str();
  commands.emplace_back(sub, [args] { return run_demo(*args); });
}

}  // namespace skvq::tools
