// How far apart the clip search's candidates are: for groups of fp16 values
// drawn from a few distributions, each factor of the default grid quantized
// by the scalar reference (spec section 4, fp16 metadata), its error summed as
// the spec sums it, then which factor wins and the relative margin between the
// smallest error and the next. An estimate of the errors that is coarser than
// the certified one (src/cuda/clip_proxy.hpp) can decide only the groups
// whose margin exceeds its own relative bound: the table gives that share for
// a few bounds (docs/performance-history.md, "Flush throughput", session 36).
// With DATA_DIR (the shared data folder) the rows also take real keys and
// values: the lm128 model (head dim 128) run over the start of WikiText in
// segments of its context, each token's key and value rows as groups (of
// 128, or of 32 consecutive channels: the channel reordering left out).
//
// Usage: clip_margins [GROUPS_PER_CELL [DATA_DIR]]   (default 20000; seed fixed)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/model.hpp"
#include "model/runner.hpp"
#include "model/tokenizer.hpp"
#include "ref/quantize.hpp"
#include "skvq/config.hpp"
#include "skvq/dtype.hpp"
#include "skvq/error.hpp"
#include "skvq/layer_cache.hpp"
#include "skvq/prompt_cache.hpp"
#include "skvq/tensor.hpp"

namespace {

// The spec's error of one factor: (sum over slots, in order, of (recon - x)^2) * (1/g), all float32.
float spec_error(const std::vector<float>& x, int bits, float a) {
  const int g = static_cast<int>(x.size());
  std::vector<std::uint8_t> codes(x.size());
  float lo = 0.0f, scale = 0.0f;
  skvq::ref::quantize_group(x.data(), g, bits, &a, 1, skvq::MetaType::fp16, codes.data(), &lo, &scale);
  float sum = 0.0f;
  for (int i = 0; i < g; ++i) {
    const float d = skvq::ref::dequantize(codes[i], lo, scale) - x[i];
    sum += d * d;
  }
  return sum * (1.0f / static_cast<float>(g));
}

// One row of the table: `next` fills a group of g values; n groups.
void row(const char* data, int g, int bits, long n, const std::function<void(std::vector<float>&)>& next) {
  const std::vector<float>& grid = skvq::default_clip_grid();
  const double bounds[] = {1e-4, 1e-3, 3e-3, 1e-2};
  std::vector<long> wins(grid.size(), 0), below(std::size(bounds), 0);
  std::vector<float> x(static_cast<std::size_t>(g)), e(grid.size());
  long used = 0;
  for (long it = 0; it < n; ++it) {
    next(x);
    for (std::size_t a = 0; a < grid.size(); ++a) e[a] = spec_error(x, bits, grid[a]);
    const std::size_t best = static_cast<std::size_t>(std::min_element(e.begin(), e.end()) - e.begin());
    if (!(e[best] > 0.0f)) continue;  // an exact group: every factor ties at 0
    ++used;
    ++wins[best];
    float next_err = INFINITY;
    for (std::size_t a = 0; a < grid.size(); ++a)
      if (a != best) next_err = std::min(next_err, e[a]);
    const double margin = (static_cast<double>(next_err) - e[best]) / e[best];
    for (std::size_t q = 0; q < std::size(bounds); ++q) below[q] += margin < bounds[q];
  }
  std::printf("| %s | %d | %d | %ld | ", data, g, bits, used);
  for (std::size_t a = 0; a < grid.size(); ++a) std::printf("%s%.1f%%", a ? " / " : "", 100.0 * wins[a] / std::max(used, 1L));
  for (std::size_t q = 0; q < std::size(bounds); ++q) std::printf(" | %.2f%%", 100.0 * below[q] / std::max(used, 1L));
  std::printf(" |\n");
}

// Keys and values of every layer and KV head of lm128 over the start of WikiText, as fp16 rows
// [row][128]: `segments` runs of the model's context length each.
void real_rows(const std::string& dir, int segments, std::vector<float>& keys, std::vector<float>& values) {
  namespace m = skvq::model;
  const m::Model model = m::load_llama2c(dir + "/lm128/model.bin");
  const m::Tokenizer tok = m::Tokenizer::load_llama2c(dir + "/lm128/tokenizer.bin", model.cfg.vocab_size);
  std::ifstream f(dir + "/text/wikitext-test.raw.txt", std::ios::binary);
  if (!f) throw skvq::Error("clip_margins: cannot read " + dir + "/text/wikitext-test.raw.txt");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::vector<int> toks = tok.encode(text, false);
  const m::Runner runner(model);
  const std::int64_t ctx = model.cfg.seq_len;
  for (int sgi = 0; sgi < segments; ++sgi) {
    if (static_cast<std::int64_t>(toks.size()) < (sgi + 1) * ctx) break;
    std::vector<int> seg(toks.begin() + sgi * ctx, toks.begin() + (sgi + 1) * ctx);
    seg[0] = 1;  // BOS
    skvq::PromptCache cache = runner.make_cache(skvq::CacheKind::plain);
    runner.forward(seg, cache, false);
    for (std::size_t l = 0; l < cache.size(); ++l) {
      const auto& plain = dynamic_cast<const skvq::PlainCache&>(cache.layer(l));
      for (auto [view, out] : {std::pair{plain.keys(), &keys}, std::pair{plain.values(), &values}}) {
        const std::int64_t rows = view.shape[0] * view.shape[1] * view.shape[2], d = view.shape[3];
        if (d != 128) throw skvq::Error("clip_margins: lm128's head dim is not 128");
        skvq::Tensor t = skvq::Tensor::copy_of(view, skvq::DType::f32);
        const float* p = reinterpret_cast<const float*>(t.data());
        out->insert(out->end(), p, p + rows * d);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  char* end = nullptr;
  const long n = argc > 1 ? std::strtol(argv[1], &end, 10) : 20000;
  if (argc > 3 || n < 1 || (argc > 1 && *end != '\0')) {
    std::fprintf(stderr, "clip_margins: usage: clip_margins [GROUPS_PER_CELL [DATA_DIR]], a positive integer; got '%s'\n",
                 argc > 1 ? argv[1] : "");
    return 2;
  }
  const std::vector<float>& grid = skvq::default_clip_grid();
  std::printf("%ld groups a row (fewer for the real rows: as many as there are), fp16 values, fp16 metadata\n\n", n);
  std::printf("| data | group | bits | groups | wins by factor (");
  for (std::size_t a = 0; a < grid.size(); ++a) std::printf("%s%.2f", a ? " / " : "", static_cast<double>(grid[a]));
  std::printf(") | margin < 1e-4 | < 1e-3 | < 3e-3 | < 1e-2 |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int kind = 0; kind < 3; ++kind) {
    for (int g : {128, 32}) {
      for (int bits : {2, 4}) {
        std::mt19937_64 rng(1234 + 17 * kind + g + bits);
        std::normal_distribution<double> normal(0.0, 1.0);
        std::student_t_distribution<double> heavy(3.0);
        row(kind == 0 ? "normal" : kind == 1 ? "Student t, 3 dof" : "normal + 3", g, bits, n, [&](std::vector<float>& x) {
          for (float& v : x) {
            const double r = kind == 1 ? heavy(rng) : normal(rng) + (kind == 2 ? 3.0 : 0.0);
            v = skvq::f16_to_f32(skvq::f32_to_f16(static_cast<float>(r)));
          }
        });
      }
    }
  }
  if (argc > 2) {
    std::vector<float> keys, values;
    try {
      real_rows(argv[2], 4, keys, values);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "clip_margins: DATA_DIR '%s': %s\n", argv[2], e.what());
      return 1;
    }
    for (auto [name, rows] : {std::pair{"lm128 keys, WikiText", &keys}, std::pair{"lm128 values, WikiText", &values}}) {
      for (int g : {128, 32}) {
        for (int bits : {2, 4}) {
          std::size_t at = 0;
          const long groups = std::min<long>(n, static_cast<long>(rows->size() / static_cast<std::size_t>(g)));
          row(name, g, bits, groups, [&](std::vector<float>& x) {
            std::copy(rows->begin() + static_cast<std::ptrdiff_t>(at), rows->begin() + static_cast<std::ptrdiff_t>(at + x.size()), x.begin());
            at += x.size();
          });
        }
      }
    }
  }
  return 0;
}
