// skvq eval: the fp16 cache and every named skvq configuration over the same
// tokens (in model-context-length segments): bits held, KV bytes, perplexity,
// KL divergence from the fp16 run and top-1 agreement with it.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "commands.hpp"
#include "core/open_input.hpp"
#include "model/runner.hpp"
#include "model_cli.hpp"
#include "skvq/skvq.hpp"

namespace skvq::tools {

namespace {

struct EvalArgs {
  std::string model, tokenizer, text, json;
  std::int64_t max_tokens = 16384;
  std::vector<std::string> configs;
};

struct Named {
  std::string name, spec;  // spec: the --config as given
  bool fp16 = false;
  Config cfg;
};

struct Result {
  std::string name;
  double avg_bits = 0, ppl = 0, mean_kl = 0, top1 = 0;
  std::int64_t kv_bytes = 0, stored_bytes = 0;
  double kv_ratio = 1, seconds = 0;
};

Named parse_config(const std::string& spec, int head_dim) {
  Named n;
  const auto colon = spec.find(':');
  n.name = spec.substr(0, colon);
  n.spec = spec;
  if (n.name.empty()) throw UsageError("--config " + spec + ": needs a NAME before ':'");
  // the settings after the colon, comma-separated ("NAME" and "NAME:" alone: the spec's defaults)
  std::vector<std::string> sets;
  if (colon != std::string::npos && colon + 1 < spec.size()) {
    for (std::size_t b = colon + 1;;) {
      const auto e = spec.find(',', b);
      sets.push_back(spec.substr(b, e == std::string::npos ? std::string::npos : e - b));
      if (sets.back().empty()) throw UsageError("--config " + spec + ": an empty FIELD=VALUE (two commas together, or one at an end)");
      if (e == std::string::npos) break;
      b = e + 1;
    }
  }
  n.cfg = runner_cache_config(head_dim, sets, "--config " + spec + ":");
  return n;
}

std::string read_text(const std::string& path) {
  std::ifstream f;
  if (const std::string why = open_input(f, path); !why.empty()) throw UsageError("--text " + path + ": " + why);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (s.compare(0, 3, "\xEF\xBB\xBF") == 0) s.erase(0, 3);  // UTF-8 BOM
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') continue;  // CRLF -> LF
    out += s[i];
  }
  if (out.empty()) throw UsageError("--text " + path + ": is empty");
  return out;
}

void log_softmax(const float* z, int V, std::vector<double>& out) {
  double mx = z[0];
  for (int i = 1; i < V; ++i) mx = std::max(mx, static_cast<double>(z[i]));
  double s = 0;
  for (int i = 0; i < V; ++i) s += std::exp(z[i] - mx);
  const double lse = mx + std::log(s);
  out.resize(static_cast<std::size_t>(V));
  for (int i = 0; i < V; ++i) out[static_cast<std::size_t>(i)] = z[i] - lse;
}

int run_eval(const EvalArgs& a) {
  if (a.max_tokens < 2) throw UsageError("--max-tokens " + std::to_string(a.max_tokens) + " must be >= 2");
  if (!a.json.empty()) check_output_file("--json", a.json, true);  // before the evaluation, not after
  LoadedModel lm = load_model_args(a.model, a.tokenizer);
  const model::Runner runner(lm.model);
  const auto& mc = lm.model.cfg;
  std::vector<Named> runs;
  runs.push_back({"fp16", "", true, {}});
  for (const auto& s : a.configs) {
    runs.push_back(parse_config(s, mc.head_dim()));
    if (runs.back().name == "fp16") throw UsageError("--config " + s + ": the name fp16 is taken by the baseline");
    for (std::size_t i = 1; i + 1 < runs.size(); ++i)
      if (runs[i].name == runs.back().name)
        throw UsageError("--config " + s + ": the name " + runs.back().name + " is given twice (names key the table and --json)");
  }
  if (a.configs.empty()) runs.push_back(parse_config("skvq-default", mc.head_dim()));
  std::vector<int> toks = lm.tokenizer.encode(read_text(a.text), false);
  if (static_cast<std::int64_t>(toks.size()) > a.max_tokens) toks.resize(static_cast<std::size_t>(a.max_tokens));
  if (toks.size() < 2) throw UsageError("--text " + a.text + ": fewer than 2 tokens");
  const std::size_t seg = static_cast<std::size_t>(std::max(mc.seq_len - 1, 1));
  // every segment's tokens go into one cache: a smaller max_ctx would fail in the middle of the run
  const std::int64_t longest = static_cast<std::int64_t>(std::min(seg, toks.size()));
  for (const Named& run : runs) {
    if (!run.fp16 && run.cfg.max_ctx && *run.cfg.max_ctx < longest) {
      throw UsageError("--config " + run.spec + ": max_ctx=" + std::to_string(*run.cfg.max_ctx) + " is less than eval's segments of " +
                       std::to_string(longest) + " tokens");
    }
  }
  const std::size_t n_seg = (toks.size() + seg - 1) / seg;
  const int V = mc.vocab_size;
  const bool tty = isatty(2) != 0;
  std::vector<float> ref_logp;  // fp16 log-probs [n_scored, V]
  std::vector<Result> results;
  std::vector<double> lp;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const Named& run = runs[r];
    Result res;
    res.name = run.name;
    double nll = 0, kl = 0, kv_sum = 0, fp16_sum = 0;
    std::int64_t scored = 0, agree = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t sg = 0; sg < n_seg; ++sg) {
      if (tty) {
        const int w = 30, done = static_cast<int>(w * (r * n_seg + sg) / (runs.size() * n_seg));
        std::fprintf(stderr, "\r[%s%s] %-24s segment %zu/%zu", std::string(static_cast<std::size_t>(done), '#').c_str(),
                     std::string(static_cast<std::size_t>(w - done), ' ').c_str(), run.name.c_str(), sg + 1, n_seg);
      }
      std::vector<int> input{lm.tokenizer.bos()};
      const std::size_t b = sg * seg, e = std::min(toks.size(), b + seg);
      input.insert(input.end(), toks.begin() + static_cast<std::ptrdiff_t>(b), toks.begin() + static_cast<std::ptrdiff_t>(e));
      PromptCache cache = runner.make_cache(run.fp16 ? CacheKind::plain : CacheKind::skvq, run.cfg);
      const std::vector<float> logits = runner.forward(std::span<const int>(input).first(input.size() - 1), cache, true);
      for (std::size_t i = 0; i + 1 < input.size(); ++i) {
        log_softmax(logits.data() + i * static_cast<std::size_t>(V), V, lp);
        const int target = input[i + 1];
        nll -= lp[static_cast<std::size_t>(target)];
        const std::size_t pos = static_cast<std::size_t>(scored);
        if (run.fp16) {
          for (int v = 0; v < V; ++v) ref_logp.push_back(static_cast<float>(lp[static_cast<std::size_t>(v)]));
        } else {
          const float* ref = ref_logp.data() + pos * static_cast<std::size_t>(V);
          double k = 0;
          int am_ref = 0, am = 0;
          for (int v = 0; v < V; ++v) {
            k += std::exp(static_cast<double>(ref[v])) * (ref[v] - lp[static_cast<std::size_t>(v)]);
            if (ref[v] > ref[am_ref]) am_ref = v;
            if (lp[static_cast<std::size_t>(v)] > lp[static_cast<std::size_t>(am)]) am = v;
          }
          kl += std::max(k, 0.0);
          agree += am == am_ref;
        }
        ++scored;
      }
      const Accounting acc = cache.accounting();
      const std::int64_t kv = run.fp16 ? acc.residual_fp16_bytes
                                       : acc.compressed_key_bytes + acc.compressed_value_bytes + acc.residual_fp16_bytes + acc.perm_bytes;
      kv_sum += static_cast<double>(kv);
      fp16_sum += static_cast<double>(acc.fp16_key_bytes + acc.fp16_value_bytes);
      res.kv_bytes = std::max(res.kv_bytes, kv);
      res.stored_bytes = std::max(res.stored_bytes, cache.stored_bytes().total());
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    res.ppl = std::exp(nll / static_cast<double>(scored));
    res.mean_kl = run.fp16 ? 0.0 : kl / static_cast<double>(scored);
    res.top1 = run.fp16 ? 1.0 : static_cast<double>(agree) / static_cast<double>(scored);
    res.avg_bits = 16.0 * kv_sum / fp16_sum;
    res.kv_ratio = results.empty() ? 1.0 : static_cast<double>(res.kv_bytes) / static_cast<double>(results[0].kv_bytes);
    results.push_back(res);
  }
  if (tty) std::fprintf(stderr, "\r%70s\r", "");
  std::printf("model %s, %zu tokens of %s in %zu segments of <= %zu (+BOS); peak RSS %.1f MiB\n", a.model.c_str(),
              toks.size(), a.text.c_str(), n_seg, seg, static_cast<double>(peak_rss_bytes()) / 1048576.0);
  std::printf("| %-28s | %8s | %12s | %8s | %9s | %10s | %6s | %14s | %7s |\n", "config", "avg_bits", "kv_bytes", "kv_ratio", "ppl",
              "mean_kl", "top1", "stored_bytes", "sec");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(30, '-').c_str(), std::string(10, '-').c_str(),
              std::string(14, '-').c_str(), std::string(10, '-').c_str(), std::string(11, '-').c_str(),
              std::string(12, '-').c_str(), std::string(8, '-').c_str(), std::string(16, '-').c_str(), std::string(9, '-').c_str());
  nlohmann::json js = nlohmann::json::array();
  for (const auto& r : results) {
    std::printf("| %-28s | %8.3f | %12lld | %8.4f | %9.4f | %10.3e | %6.4f | %14lld | %7.1f |\n", r.name.c_str(), r.avg_bits,
                static_cast<long long>(r.kv_bytes), r.kv_ratio, r.ppl, r.mean_kl, r.top1, static_cast<long long>(r.stored_bytes),
                r.seconds);
    js.push_back({{"name", r.name}, {"avg_bits", r.avg_bits}, {"kv_bytes", r.kv_bytes}, {"kv_ratio", r.kv_ratio},
                  {"ppl", r.ppl}, {"mean_kl", r.mean_kl}, {"top1_agreement", r.top1}, {"stored_bytes", r.stored_bytes},
                  {"tokens", toks.size()}});
  }
  if (!a.json.empty()) write_all_or_nothing(std::filesystem::path(a.json).parent_path().empty() ? "." : std::filesystem::path(a.json).parent_path(),
                                            {{std::filesystem::path(a.json).filename().string(), js.dump(2) + "\n"}}, {}, "--json");
  return 0;
}

}  // namespace

void register_eval(CLI::App& app, CommandList& commands) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand("eval", "Perplexity, KL and top-1 agreement of skvq configs against the fp16 cache");
  sub->add_option("--model", a->model, "llama2.c checkpoint or GGUF file")->required();
  sub->add_option("--tokenizer", a->tokenizer, "llama2.c tokenizer file (default: beside the model, or the GGUF's own)");
  sub->add_option("--text", a->text, "UTF-8 text file")->required();
  sub->add_option("--max-tokens", a->max_tokens, "tokens of the text to use")->check(int64_in_range())->capture_default_str();
  sub->add_option("--config", a->configs, "NAME:FIELD=VALUE,... (repeatable; default one config with the spec defaults)");
  sub->add_option("--json", a->json, "also write the table as JSON to FILE");
  commands.emplace_back(sub, [a] { return run_eval(*a); });
}

}  // namespace skvq::tools
