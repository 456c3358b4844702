// skvq generate: stream a model's continuation of a prompt with an fp16 or
// skvq cache; optionally save the conversation's cache or resume from one.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <span>
#include <random>

#include "cli_common.hpp"
#include "commands.hpp"
#include "model/runner.hpp"
#include "model_cli.hpp"
#include "skvq/cache_file.hpp"
#include "skvq/cuda.hpp"
#include "skvq/skvq.hpp"

namespace skvq::tools {

namespace {

struct GenerateArgs {
  std::string model, tokenizer, prompt, cache = "fp16", save_cache, load_cache, device = "cpu";
  int n = 128;
  double temperature = 0.0;
  std::uint64_t seed = 0;
  std::vector<std::string> sets;
  bool cache_given = false;  // --cache on the command line (not its default)
};

// The kind of a conversation's cache as --cache names it ("skvq" or "fp16").
std::string cache_kind(const PromptCache& c) { return c.layer(0).kind() == "skvq" ? "skvq" : "fp16"; }

int sample(const float* logits, int V, double temperature, std::mt19937_64& rng) {
  if (temperature <= 0.0) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  const float mx = *std::max_element(logits, logits + V);
  std::vector<double> p(static_cast<std::size_t>(V));
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += p[static_cast<std::size_t>(i)] = std::exp((logits[i] - mx) / temperature);
  double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (int i = 0; i < V; ++i) {
    u -= p[static_cast<std::size_t>(i)];
    if (u <= 0) return i;
  }
  return V - 1;
}

// The skvq cache's layers on the GPU (--device cuda): the model runs on the CPU and hands each layer's
// new rows and queries to its device cache, in the pieces Runner::forward takes (so that every token
// sees the cache state of one-token-at-a-time decoding).
class DeviceLayers {
 public:
  DeviceLayers(const PromptCache& host, const model::ModelConfig& mc)
      : scale_(1.0f / std::sqrt(static_cast<float>(mc.head_dim()))) {
    for (std::size_t l = 0; l < host.size(); ++l) {
      const auto& s = dynamic_cast<const SkvqCache&>(host.layer(l));
      if (s.offset() > 0) layers_.emplace_back(s, mc.seq_len);
      else layers_.emplace_back(s.config(), 1, mc.n_kv_heads, mc.head_dim(), mc.seq_len);
    }
  }
  // The next token's logits after `tokens`.
  std::vector<float> forward(const model::Runner& r, std::span<const int> tokens) {
    std::vector<float> logits;
    for (std::size_t done = 0; done < tokens.size();) {
      const cuda::DeviceCache& first = layers_.front();
      const std::size_t n = model::piece_before_flush(tokens.size() - done, first.config().window, first.offset() - first.q_end());
      logits = r.forward_with(tokens.subspan(done, n), first.offset(),
                              [&](int l, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
                                cuda::DeviceCache& d = layers_[static_cast<std::size_t>(l)];
                                d.append(k.view(), v.view());
                                copy_into(d.attend(q.view(), scale_).view(), out.view());
                              }, false);
      done += n;
    }
    return logits;
  }
  PromptCache to_host() const {
    PromptCache c;
    for (const cuda::DeviceCache& d : layers_) c.push_back(std::make_unique<SkvqCache>(d.to_host()));
    return c;
  }

 private:
  std::vector<cuda::DeviceCache> layers_;
  float scale_;
};

int run_generate(const GenerateArgs& a) {
  if (a.n < 0) throw UsageError("-n " + std::to_string(a.n) + " must be >= 0");
  if (!(a.temperature >= 0.0) || !std::isfinite(a.temperature)) {
    char t[32];
    std::snprintf(t, sizeof t, "%g", a.temperature);
    throw UsageError(std::string("--temperature ") + t + " must be a finite number >= 0");
  }
  if (a.cache != "fp16" && a.cache != "skvq") throw UsageError("--cache " + a.cache + " must be fp16 or skvq");
  if (!a.load_cache.empty() && !a.sets.empty()) throw UsageError("--set cannot change the config of a cache given by --load-cache");
  if (a.cache == "fp16" && !a.sets.empty()) throw UsageError("--set needs --cache skvq");
  const bool on_gpu = a.device == "cuda";
  if (a.device != "cpu" && !on_gpu) throw UsageError("--device " + a.device + " must be cpu or cuda");
  if (on_gpu && a.load_cache.empty() && a.cache != "skvq") {
    throw UsageError("--device cuda needs --cache skvq (the GPU holds the skvq cache only)");
  }
  if (on_gpu && !cuda::available()) throw UsageError("--device cuda: " + cuda::device_description());
  if (!a.save_cache.empty()) check_output_file("--save-cache", a.save_cache, false);  // before the generation, not after
  LoadedModel lm = load_model_args(a.model, a.tokenizer);
  const model::Runner runner(lm.model);
  const auto& mc = lm.model.cfg;
  PromptCache cache;
  std::vector<std::int32_t> history;
  if (!a.load_cache.empty()) {
    CacheFileExtras ex;
    try {
      cache = load_prompt_cache(a.load_cache, &ex);
    } catch (const Error& e) {
      throw UsageError("--load-cache " + std::string(e.what()).substr(6));
    }
    if (ex.strings["model"] != model_signature(lm.model) || cache.size() != static_cast<std::size_t>(mc.n_layers)) {
      throw UsageError("--load-cache " + a.load_cache + ": the cache belongs to a different model (" + ex.strings["model"] + ")");
    }
    if (const std::string kind = cache_kind(cache); a.cache_given && a.cache != kind) {
      throw UsageError("--cache " + a.cache + ": the cache given by --load-cache " + a.load_cache + " is an " + kind +
                       " one (a saved cache keeps its kind)");
    }
    history = ex.int_arrays["tokens"];
    if (static_cast<std::int64_t>(history.size()) != cache.layer(0).offset()) {
      throw UsageError("--load-cache " + a.load_cache + ": its token history does not match the cache");
    }
  } else {
    const Config cfg = runner_cache_config(mc.head_dim(), a.sets, "--set");
    cache = runner.make_cache(a.cache == "skvq" ? CacheKind::skvq : CacheKind::plain, cfg);
  }
  // The context the conversation may fill: the model's, or the skvq cache's max_ctx where smaller.
  std::int64_t limit = mc.seq_len;
  std::string limit_what = "the model's context of " + std::to_string(mc.seq_len) + " tokens";
  if (const auto* s = dynamic_cast<const SkvqCache*>(&cache.layer(0)); s && s->config().max_ctx && *s->config().max_ctx < limit) {
    limit = *s->config().max_ctx;
    limit_what = "the cache's max_ctx of " + std::to_string(limit) + " tokens";
  }
  std::vector<int> prompt = lm.tokenizer.encode(a.prompt, history.empty());
  if (prompt.empty()) throw UsageError("--prompt must not be empty when resuming a cache");
  if (static_cast<std::int64_t>(history.size() + prompt.size()) + 1 > limit) {
    throw UsageError("--prompt: " + std::to_string(history.size() + prompt.size()) + " tokens exceed " + limit_what);
  }
  std::optional<DeviceLayers> gpu;
  if (on_gpu && cache_kind(cache) != "skvq") {
    throw UsageError("--device cuda needs an skvq cache; --load-cache " + a.load_cache + " holds an fp16 one");
  }
  if (on_gpu) {
    try {
      gpu.emplace(cache, mc);
    } catch (const Error& e) {
      throw UsageError("--device cuda: " + std::string(e.what()).substr(6));
    }
  }
  const auto step = [&](std::span<const int> toks) { return gpu ? gpu->forward(runner, toks) : runner.forward(toks, cache, false); };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = step(prompt);
  history.insert(history.end(), prompt.begin(), prompt.end());
  std::printf("%s", a.prompt.c_str());
  std::fflush(stdout);
  std::mt19937_64 rng(a.seed);
  int prev = history.back(), produced = 0;
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.n && static_cast<std::int64_t>(history.size()) < limit; ++i) {
    const int next = sample(logits.data(), mc.vocab_size, a.temperature, rng);
    if (next == lm.tokenizer.eos() || next == lm.tokenizer.bos()) break;
    std::printf("%s", lm.tokenizer.decode(prev, next).c_str());
    std::fflush(stdout);
    const int tok[1] = {next};
    logits = step(tok);  // the cache holds every token printed
    history.push_back(next);
    prev = next;
    ++produced;
  }
  const auto t2 = std::chrono::steady_clock::now();
  std::printf("\n");
  if (gpu) cache = gpu->to_host();  // (for the report and --save-cache)
  const Accounting acc = cache.accounting();
  const StoredBytes sb = cache.stored_bytes();
  const double fp16 = static_cast<double>(acc.fp16_key_bytes + acc.fp16_value_bytes);
  const double prompt_s = std::chrono::duration<double>(t1 - t0).count(), gen_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr,
               "[%s cache%s] KV memory: fp16-equivalent %.1f KiB, stored %.1f KiB (%.3f of fp16); peak RSS %.1f MiB; "
               "prompt %zu tokens in %.3f s; generated %d tokens in %.3f s (%.1f tok/s)\n",
               cache_kind(cache).c_str(), on_gpu ? " on cuda" : "", fp16 / 1024, static_cast<double>(sb.total()) / 1024,
               fp16 > 0 ? static_cast<double>(sb.total()) / fp16 : 0.0, static_cast<double>(peak_rss_bytes()) / 1048576.0,
               prompt.size(), prompt_s, produced, gen_s, gen_s > 0 ? produced / gen_s : 0.0);
  if (produced < a.n && static_cast<std::int64_t>(history.size()) >= limit) {
    std::fprintf(stderr, "stopped after %d of %d tokens: %s is full\n", produced, a.n, limit_what.c_str());
  }
  if (!a.save_cache.empty()) {
    CacheFileExtras ex;
    ex.strings["model"] = model_signature(lm.model);
    ex.int_arrays["tokens"] = history;
    try {
      save_prompt_cache(cache, a.save_cache, ex);
    } catch (const Error& e) {
      throw UsageError("--save-cache " + std::string(e.what()).substr(6));
    }
  }
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, CommandList& commands) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text with a llama-family model and an fp16 or skvq KV cache");
  sub->add_option("--model", a->model, "llama2.c checkpoint or GGUF file")->required();
  sub->add_option("--tokenizer", a->tokenizer, "llama2.c tokenizer file (default: beside the model, or the GGUF's own)");
  sub->add_option("--prompt", a->prompt, "prompt text")->required();
  sub->add_option("-n", a->n, "tokens to generate")->capture_default_str();
  sub->add_option("--temperature", a->temperature, "0: greedy")->capture_default_str();
  sub->add_option("--seed", a->seed, "sampling seed")->check(unsigned_in_range<std::uint64_t>())->capture_default_str();
  CLI::Option* cache = sub->add_option("--cache", a->cache, "fp16 or skvq (with --load-cache: the saved cache's kind)")->capture_default_str();
  sub->add_option("--set", a->sets, "skvq config FIELD=VALUE");
  sub->add_option("--save-cache", a->save_cache, "save the conversation's cache to FILE when done");
  sub->add_option("--load-cache", a->load_cache, "resume from a cache FILE (the prompt continues it)");
  sub->add_option("--device", a->device, "cpu, or cuda: the skvq cache and its attention on the GPU")
      ->capture_default_str();
  commands.emplace_back(sub, [a, cache] {
    a->cache_given = cache->count() > 0;
    return run_generate(*a);
  });
}

}  // namespace skvq::tools
