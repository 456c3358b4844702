// The model runner on the two shared real models: cache plumbing against a
// cache-free forward, greedy generation, GGUF and llama2.c format round
// trips, tokenizers, quality trends, and bad files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <tuple>

#include <nlohmann/json.hpp>

#include "model/model.hpp"
#include "model/runner.hpp"
#include "skvq/cuda.hpp"
#include "test_util.hpp"

namespace skvq::test {
namespace {

namespace fs = std::filesystem;
using model::Model;
using model::Runner;
using model::Tokenizer;

const fs::path kData = test::shared_data();

#define REQUIRE_DATA()                                                        \
  if (!fs::exists(kData / "lm128" / "model.bin")) GTEST_SKIP() << "no " << kData

struct Loaded {
  Model m;
  Tokenizer tok;
};

const Loaded& baby() {
  static const Loaded l = [] {
    Loaded x;
    x.m = model::load_model((kData / "babyllama/model5000.bin").string(), "", &x.tok);
    return x;
  }();
  return l;
}

const Loaded& lm128() {
  static const Loaded l = [] {
    Loaded x;
    x.m = model::load_model((kData / "lm128/model.bin").string(), "", &x.tok);
    return x;
  }();
  return l;
}

std::vector<int> wikitext_tokens(const Tokenizer& tok, std::size_t n) {
  std::ifstream f(kData / "text/wikitext-test.raw.txt", std::ios::binary);
  std::string s(8192, '\0');
  f.read(s.data(), 8192);
  s.resize(static_cast<std::size_t>(f.gcount()));
  s.erase(0, 3);  // BOM
  std::vector<int> t = tok.encode(s, true);
  t.resize(std::min(n, t.size()));
  return t;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("skvq_model_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(Model, Fp16CacheMatchesCacheFreeForward) {
  REQUIRE_DATA();
  for (const Loaded* l : {&baby(), &lm128()}) {
    const Runner r(l->m);
    const std::vector<int> toks = wikitext_tokens(l->tok, l == &baby() ? 200 : 400);
    // One call through the cache == the same attention kernel over dense K/V without a cache, bit for bit.
    PromptCache one = r.make_cache(CacheKind::plain);
    EXPECT_EQ(r.forward(toks, one, true), model::forward_no_cache(l->m, toks, model::NoCacheAttention::simd));
    // In three calls, as a chat would, against float64 attention without a cache. float32
    // attention alone moves the logits by up to ~1e-4 of their range (docs/numerics.md).
    PromptCache cache = r.make_cache(CacheKind::plain);
    std::vector<float> got;
    for (auto [b, e] : {std::pair<std::size_t, std::size_t>{0, 37}, {37, 38}, {38, toks.size()}}) {
      const auto part = r.forward(std::span<const int>(toks).subspan(b, e - b), cache, true);
      got.insert(got.end(), part.begin(), part.end());
    }
    EXPECT_LT(max_rel_diff(got, model::forward_no_cache(l->m, toks)), 2e-4);
  }
}

// forward_with leaves the attention to its caller: one call a layer, with the new rows' shapes,
// and, when the caller runs the plain cache's attention over its own plain cache, forward()'s logits
// for the same pieces; bad arguments are errors that name them.
TEST(Model, ForwardWithLeavesTheAttentionToItsCaller) {
  REQUIRE_DATA();
  const Runner r(lm128().m);
  const std::vector<int> toks = wikitext_tokens(lm128().tok, 60);
  PromptCache ref = r.make_cache(CacheKind::plain), mine = r.make_cache(CacheKind::plain);
  std::vector<int> layers;
  std::vector<float> got, want;
  for (const auto& be : {std::pair<std::size_t, std::size_t>{0, 50}, {50, 60}}) {
    const std::size_t b = be.first, e = be.second;  // (clang 14 cannot capture structured bindings)
    const auto piece = std::span<const int>(toks).subspan(b, e - b);
    const auto ref_part = r.forward(piece, ref, true);
    want.insert(want.end(), ref_part.begin(), ref_part.end());
    const auto part = r.forward_with(piece, static_cast<std::int64_t>(b),
                                     [&](int l, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
                                       layers.push_back(l);
                                       EXPECT_EQ(k.shape(), (Shape4{1, 2, static_cast<std::int64_t>(e - b), 128}));
                                       LayerCache& lc = mine.layer(static_cast<std::size_t>(l));
                                       lc.append(k.view(), v.view());
                                       attend(lc, q.view(), 1.0f / std::sqrt(128.0f), out.view());
                                     });
    got.insert(got.end(), part.begin(), part.end());
  }
  EXPECT_EQ(layers.size(), 2u * 6u);
  EXPECT_EQ(got, want);  // the same pieces through the same kernel: bit for bit
  // the last token's logits alone, as forward() gives them
  PromptCache ref_last = r.make_cache(CacheKind::plain), mine_last = r.make_cache(CacheKind::plain);
  const auto last = r.forward_with(
      toks, 0,
      [&](int l, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
        LayerCache& lc = mine_last.layer(static_cast<std::size_t>(l));
        lc.append(k.view(), v.view());
        attend(lc, q.view(), 1.0f / std::sqrt(128.0f), out.view());
      },
      false);
  EXPECT_EQ(last.size(), static_cast<std::size_t>(r.model().cfg.vocab_size));
  EXPECT_EQ(last, r.forward(toks, ref_last, false));
  auto none = [](int, const Tensor&, const Tensor&, const Tensor&, Tensor&) {};
  expect_error([&] { r.forward_with(toks, -1, none); }, {"pos0=-1"});
  expect_error([&] { r.forward_with(std::vector<int>{1, 9999}, 0, none); }, {"token id 9999"});
  expect_error([&] { r.forward_with(std::vector<int>{}, 0, none); }, {"no tokens"});
}

TEST(Model, BabyLlamaGreedyContinuation) {
  REQUIRE_DATA();
  const Runner r(baby().m);
  for (CacheKind kind : {CacheKind::plain, CacheKind::skvq}) {
    Config cfg;
    cfg.window = 200;  // larger than the text: identical to fp16
    PromptCache cache = r.make_cache(kind, cfg);
    std::vector<int> toks = baby().tok.encode("Once upon a time", true);
    std::vector<float> logits = r.forward(toks, cache, false);
    std::string out;
    int prev = toks.back();
    for (int i = 0; i < 80; ++i) {
      const int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out += baby().tok.decode(prev, next);
      const int one[1] = {next};
      logits = r.forward(one, cache, false);
      prev = next;
    }
    const std::string want = ", there was a little girl named Lily. She loved to play outside in the sunshine.";
    EXPECT_EQ(out.substr(0, want.size()), want);
  }
}

TEST(Model, SkvqWithWindowBeyondTheTextIsIdenticalToFp16) {
  REQUIRE_DATA();
  const Runner r(lm128().m);
  const auto toks = wikitext_tokens(lm128().tok, 300);
  Config cfg;
  cfg.window = 512;
  PromptCache a = r.make_cache(CacheKind::plain), b = r.make_cache(CacheKind::skvq, cfg);
  EXPECT_EQ(r.forward(toks, a, true), r.forward(toks, b, true));
}

// Mean KL and top-1 agreement of an skvq config against fp16 over `toks`.
std::pair<double, double> kl_top1(const Runner& r, const std::vector<int>& toks, const Config& cfg) {
  PromptCache a = r.make_cache(CacheKind::plain), b = r.make_cache(CacheKind::skvq, cfg);
  const auto la = r.forward(toks, a, true), lb = r.forward(toks, b, true);
  const std::size_t V = static_cast<std::size_t>(r.model().cfg.vocab_size), n = toks.size();
  double kl = 0, agree = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float* x = la.data() + i * V;
    const float* y = lb.data() + i * V;
    const double mx = *std::max_element(x, x + V), my = *std::max_element(y, y + V);
    double sx = 0, sy = 0;
    for (std::size_t v = 0; v < V; ++v) sx += std::exp(x[v] - mx), sy += std::exp(y[v] - my);
    double k = 0;
    for (std::size_t v = 0; v < V; ++v) {
      const double lpx = x[v] - mx - std::log(sx), lpy = y[v] - my - std::log(sy);
      k += std::exp(lpx) * (lpx - lpy);
    }
    kl += k;
    agree += (std::max_element(x, x + V) - x) == (std::max_element(y, y + V) - y);
  }
  return {kl / static_cast<double>(n), agree / static_cast<double>(n)};
}

TEST(Model, QuantizationCostGrowsAsBitsFall) {
  REQUIRE_DATA();
  const Runner r(lm128().m);
  const auto toks = wikitext_tokens(lm128().tok, 1000);
  double prev_kl = 0;
  for (int bits : {8, 4, 2}) {
    Config cfg;
    cfg.bits_key = cfg.bits_value = bits;
    const auto [kl, top1] = kl_top1(r, toks, cfg);
    EXPECT_GT(kl, prev_kl) << bits << " bits";
    EXPECT_GT(top1, 0.8) << bits << " bits";
    prev_kl = kl;
  }
}

TEST(Model, GgufConversionGivesIdenticalLogits) {
  REQUIRE_DATA();
  for (const Loaded* l : {&baby(), &lm128()}) {
    const std::string path = tmp("m.gguf");
    model::write_gguf(l->m, l->tok, path, "f32");
    Tokenizer tok2;
    const Model m2 = model::load_model(path, "", &tok2);
    EXPECT_EQ(tok2.pieces(), l->tok.pieces());
    EXPECT_EQ(tok2.encode("Hello world", true), l->tok.encode("Hello world", true));
    const auto toks = wikitext_tokens(l->tok, 120);
    const Runner r1(l->m), r2(m2);
    PromptCache c1 = r1.make_cache(CacheKind::plain), c2 = r2.make_cache(CacheKind::plain);
    EXPECT_EQ(r1.forward(toks, c1, true), r2.forward(toks, c2, true));
    for (const char* dt : {"f16", "bf16"}) {  // reduced tensor types load and stay close
      model::write_gguf(l->m, l->tok, path, dt);
      const Model m3 = model::load_model(path, "", &tok2);
      EXPECT_NEAR(m3.layers[0].wq[7], l->m.layers[0].wq[7], std::fabs(l->m.layers[0].wq[7]) * 0x1p-8 + 1e-7);
    }
    fs::remove(path);
  }
}

TEST(Model, Llama2cVersionedExportsLoad) {
  REQUIRE_DATA();
  const Model& m = baby().m;
  const std::string path = tmp("v.bin");
  for (int version : {0, 1, 2}) {
    {
      std::ofstream f(path, std::ios::binary);
      const std::string b = model::llama2c_bytes(m, version, 32);
      f.write(b.data(), static_cast<std::streamsize>(b.size()));
    }
    const Model m2 = model::load_llama2c(path);
    EXPECT_EQ(m2.cfg.dim, m.cfg.dim);
    EXPECT_EQ(m2.final_norm, m.final_norm);
    if (version < 2) {
      EXPECT_EQ(m2.layers[3].w2, m.layers[3].w2);
      EXPECT_EQ(m2.tok_embeddings, m.tok_embeddings);
    } else {  // int8 groups: within half a step of the original
      for (std::size_t i = 0; i < 64; ++i) EXPECT_NEAR(m2.layers[1].wq[i], m.layers[1].wq[i], 0.01);
    }
    // truncated by one byte: a clear error
    fs::resize_file(path, fs::file_size(path) - 1);
    EXPECT_THROW(model::load_llama2c(path), Error);
  }
  fs::remove(path);
}

// A model of its own classifier (not the embedding) survives every format:
// llama2.c versions 0-2 and GGUF, the classifier in the right place.
TEST(Model, SeparateClassifierInEveryFormat) {
  model::ModelConfig c;
  c.dim = 16, c.hidden_dim = 24, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 7, c.seq_len = 8;
  c.shared_classifier = false;
  const Model m = model::random_model(c, 5);
  ASSERT_EQ(m.wcls.size(), 7u * 16u);
  for (int version : {0, 1, 2}) {
    const Model m2 = model::parse_llama2c(model::llama2c_bytes(m, version, 8), "v" + std::to_string(version));
    EXPECT_FALSE(m2.cfg.shared_classifier) << version;
    EXPECT_EQ(m2.cfg.n_kv_heads, 2) << version;
    ASSERT_EQ(m2.wcls.size(), m.wcls.size()) << version;
    for (std::size_t i = 0; i < m.wcls.size(); ++i) {  // int8 groups of 8: within half a step of the group's largest
      ASSERT_NEAR(m2.wcls[i], m.wcls[i], version < 2 ? 0.0 : 0.5 * 4.0 / 127) << version << " " << i;
    }
    EXPECT_EQ(m2.layers[1].ffn_norm, m.layers[1].ffn_norm) << version;
  }
  std::vector<std::string> pieces;
  for (int i = 0; i < 7; ++i) pieces.push_back(std::string(1, static_cast<char>('a' + i)));
  const Tokenizer tok(pieces, std::vector<float>(7, 0.0f));
  Tokenizer t2;
  const Model m3 = model::parse_gguf(model::gguf_bytes(m, tok, "f32"), "sep.gguf", &t2);
  EXPECT_FALSE(m3.cfg.shared_classifier);
  EXPECT_EQ(m3.wcls, m.wcls);
  EXPECT_EQ(t2.pieces(), pieces);
}

// Files the fuzzers were written for: each is a clear error (before, some
// were read out of bounds or narrowed out of range), and a failed GGUF load
// leaves the caller's tokenizer as it was.
TEST(Model, CraftedFilesAreClearErrors) {
  model::ModelConfig c;
  c.dim = 8, c.hidden_dim = 16, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 2, c.vocab_size = 5, c.seq_len = 4;
  const Model m = model::random_model(c, 1);
  // version 2 whose group (3) divides no tensor's size but whose file has the
  // size that the header implies: the embedding's scales were read past their end
  {
    std::string b = model::llama2c_bytes(m, 1);
    b.resize(256, '\0');
    b[4] = 2;  // version 2
    const std::int32_t group = 3;
    std::memcpy(b.data() + 37, &group, 4);
    const std::size_t n_matrix = 5 * 8 + (2 * 64 + 2 * 64 + 3 * 128), n_norm = 2 * 8 + 8;
    b.resize(256 + 4 * n_norm + n_matrix + 4 * (n_matrix / 3), '\0');
    expect_error([&] { model::parse_llama2c(b, "g3.bin"); }, {"g3.bin", "not a multiple of group_size=3"});
  }
  // legacy header with vocab_size = INT32_MIN (no positive counterpart)
  {
    std::string b = model::llama2c_bytes(m, 0);
    const std::int32_t v = std::numeric_limits<std::int32_t>::min();
    std::memcpy(b.data() + 20, &v, 4);
    expect_error([&] { model::parse_llama2c(b, "vmin.bin"); }, {"vocab_size=-2147483648"});
  }
  // a non-finite embedding (only the layers' weights were checked)
  {
    Model bad = m;
    bad.tok_embeddings[3] = std::numeric_limits<float>::infinity();
    expect_error([&] { model::parse_llama2c(model::llama2c_bytes(bad, 1), "inf.bin"); }, {"non-finite"});
  }
  // GGUF metadata out of the range it is narrowed to
  std::vector<std::string> pieces{"a", "b", "c", "d", "e"};
  const Tokenizer tok(pieces, std::vector<float>(5, 0.0f));
  const std::string good = model::gguf_bytes(m, tok, "f32");
  {
    Tokenizer t;
    EXPECT_EQ(model::parse_gguf(good, "good.gguf", &t).cfg.dim, 8);
    EXPECT_EQ(t.size(), 5);
  }
  // key `name` of type u32 (its value's 4 bytes follow the type) rewritten as
  // f32 `value`
  auto retyped = [&](const std::string& name, float value) {
    std::string b = good;
    const std::size_t at = b.find(name);
    EXPECT_NE(at, std::string::npos) << name;
    const std::uint32_t f32_type = 6;
    std::memcpy(b.data() + at + name.size(), &f32_type, 4);
    std::memcpy(b.data() + at + name.size() + 4, &value, 4);
    return b;
  };
  const Tokenizer before({"x", "y", "z"}, {0.0f, 0.0f, 0.0f});
  for (const auto& kvn : std::vector<std::tuple<std::string, float, std::string>>{
           {"llama.embedding_length", 1e20f, "llama.embedding_length=1e+20 is not an integer"},
           {"llama.block_count", std::nanf(""), "llama.block_count=nan is not an integer"},
           {"llama.context_length", 2.5f, "llama.context_length=2.5 is not an integer"},
           {"general.alignment", -64.0f, "general.alignment=-64 is not in [1, 4096]"},
           {"tokenizer.ggml.bos_token_id", 3e9f, "tokenizer.ggml.bos_token_id=3e+09 is not an integer"}}) {
    const auto& [key, value, needle] = kvn;
    const std::string bytes = retyped(key, value);
    Tokenizer t = before;
    expect_error([&] { model::parse_gguf(bytes, "bad.gguf", &t); }, {"bad.gguf", needle.c_str()});
    EXPECT_EQ(t.pieces(), before.pieces()) << key;
  }
  {  // rope base: an f32 already; infinity
    std::string b = good;
    const std::string name = "llama.rope.freq_base";
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(b.data() + b.find(name) + name.size() + 4, &inf, 4);
    Tokenizer t = before;
    expect_error([&] { model::parse_gguf(b, "rope.gguf", &t); }, {"llama.rope.freq_base=inf is not a finite float"});
    EXPECT_EQ(t.pieces(), before.pieces());
  }
  {  // a finite negative base (found by fuzz_model: its message cast it to an integer, out of range)
    std::string b = good;
    const std::string name = "llama.rope.freq_base";
    const float neg = -7.5e26f;
    std::memcpy(b.data() + b.find(name) + name.size() + 4, &neg, 4);
    Tokenizer t;
    expect_error([&] { model::parse_gguf(b, "rope.gguf", &t); }, {"rope_theta=-7.5e+26 must be positive and finite"});
  }
  {  // a tensor that fails after the vocabulary has been read: the tokenizer is untouched
    std::string b = good;
    const std::size_t at = b.find("output_norm.weight");
    ASSERT_NE(at, std::string::npos);
    b[at] = 'X';
    Tokenizer t = before;
    expect_error([&] { model::parse_gguf(b, "t.gguf", &t); }, {"tensor output_norm.weight is missing"});
    EXPECT_EQ(t.pieces(), before.pieces());
  }
}

TEST(Model, Tokenizers) {
  REQUIRE_DATA();
  const Tokenizer& bt = baby().tok;
  const auto t = bt.encode("Once upon a time", true);
  EXPECT_EQ(t.front(), 1);
  EXPECT_EQ(bt.pieces()[static_cast<std::size_t>(t[1])], " ");  // the dummy prefix
  std::string back;
  for (std::size_t i = 1; i < t.size(); ++i) back += bt.decode(t[i - 1], t[i]);
  EXPECT_EQ(back, "Once upon a time");
  EXPECT_EQ(bt.encode("a\nb", false)[2], 0);  // newline is <unk> in this vocabulary
  const Tokenizer& lt = lm128().tok;
  const std::string s = "Caf\xc3\xa9 = 3\n\tend";
  const auto u = lt.encode(s, true);
  ASSERT_EQ(u.size(), s.size() + 1);
  for (std::size_t i = 0; i < s.size(); ++i) EXPECT_EQ(u[i + 1], static_cast<unsigned char>(s[i]) + 3);
  std::string back2;
  for (std::size_t i = 1; i < u.size(); ++i) back2 += lt.decode(u[i - 1], u[i]);
  EXPECT_EQ(back2, s);
}

TEST(Model, BadFilesAreClearErrors) {
  REQUIRE_DATA();
  const std::string path = tmp("bad.bin");
  auto write = [&](const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  const std::string good = read_file(kData / "babyllama/model5000.bin");
  for (std::size_t n : {0ul, 10ul, 28ul, 1000ul, good.size() / 2, good.size() - 4}) {
    write(good.substr(0, n));
    EXPECT_THROW(model::load_llama2c(path), Error) << n;
  }
  std::string bad_hdr = good;
  const std::int32_t heads = 7;  // does not divide dim 128
  std::memcpy(bad_hdr.data() + 12, &heads, 4);
  write(bad_hdr);
  try {
    model::load_llama2c(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_heads=7"), std::string::npos) << e.what();
  }
  // GGUF: truncated anywhere
  model::write_gguf(baby().m, baby().tok, path, "f16");
  const std::string gg = read_file(path);
  for (std::size_t n = 0; n < gg.size(); n += gg.size() / 37) {
    write(gg.substr(0, n));
    Tokenizer tk;
    EXPECT_THROW(model::load_gguf(path, &tk), Error) << n;
  }
  // tokenizer: truncated
  const std::string tb = read_file(kData / "babyllama/tok105.bin");
  write(tb.substr(0, tb.size() / 2));
  EXPECT_THROW(Tokenizer::load_llama2c(path, 105), Error);
  // tokenizer: the SentencePiece model beside it is named as such
  try {
    Tokenizer::load_llama2c((kData / "babyllama/tok105.model").string(), 105);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SentencePiece"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST(Model, CommandLineRejectsBadInput) {
  REQUIRE_DATA();
  const std::string model = (kData / "babyllama/model5000.bin").string();
  const std::string err = tmp("err.txt");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate --model /nonexistent.bin --prompt hi", "--model"},
      {"generate --model " + model + " --prompt hi --cache fp8", "--cache fp8"},
      {"generate --model " + model + " --prompt hi --cache skvq --set bits_key=9", "bits_key=9"},
      {"generate --model " + model + " --prompt hi -n -3", "-n -3"},
      {"generate --model " + model + " --prompt hi --load-cache /nonexistent.st", "--load-cache"},
      {"eval --model " + model + " --text /nonexistent.txt", "--text"},
      // directories given as input files (they open as streams and fail only when read)
      {"eval --model " + model + " --text " + fs::temp_directory_path().string(), ": is a directory"},
      {"generate --model " + fs::temp_directory_path().string() + " --prompt hi", ": is a directory"},
      {"generate --model " + model + " --prompt hi --load-cache " + fs::temp_directory_path().string(), ": is a directory"},
      {"eval --model " + model + " --text " + model + " --config :bits_key=2", "NAME"},
      {"eval --model " + model + " --text " + model + " --config a:window=1", "--config a:window=1: window=1"},
      {"eval --model " + model + " --text " + model + " --config a:window=4,n_sink=4",
       "--config a:window=4,n_sink=4: n_sink=4 must be in [0, 3]"},
      {"eval --model " + model + " --text " + model + " --config fp16:bits_key=4", "fp16"},
      {"eval --model " + model + " --text " + model + " --config a:bits_key=4,,window=8", "--config a:bits_key=4,,window=8: an empty FIELD=VALUE"},
      {"eval --model " + model + " --text " + model + " --config a:bits_key=4,", "--config a:bits_key=4,: an empty FIELD=VALUE"},
      {"eval --model " + model + " --text " + model + " --config a:bits_key=2 --config a:bits_key=4", "given twice"},
      // the cache's head dim comes from the model: another one is refused, not ignored
      {"generate --model " + model + " --prompt hi --cache skvq --set head_dim=8",
       "--set: head_dim=8, but the model's heads have 16 channels"},
      {"eval --model " + model + " --text " + model + " --config a:head_dim=32", "--config a:head_dim=32: head_dim=32, but the model's heads have 16"},
      // the runner's caches keep no dense view; a max_ctx the prompt or eval's segments overflow is refused up front
      {"generate --model " + model + " --prompt hi --cache skvq --set dense_view=true", "--set: dense_view=true, but the model runner's caches keep no dense view"},
      {"eval --model " + model + " --text " + model + " --config a:dense_view=true", "--config a:dense_view=true: dense_view=true, but the model runner's caches keep no dense view"},
      {"generate --model " + model + " --prompt hi --cache skvq --set max_ctx=3", "--prompt: 4 tokens exceed the cache's max_ctx of 3 tokens"},
      {"eval --model " + model + " --text " + model + " --config a:max_ctx=10",
       "--config a:max_ctx=10: max_ctx=10 is less than eval's segments of 255 tokens"},
      {"convert --model " + model + " --out /tmp/x.gguf --dtype q4", "--dtype q4"},
      {"generate --model " + model + " --prompt hi --temperature -1", "--temperature -1 must be a finite number >= 0"},
      {"generate --model " + model + " --prompt hi --temperature nan", "--temperature nan must be a finite number >= 0"},
      {"generate --model " + model + " --prompt hi --temperature inf", "--temperature inf must be a finite number >= 0"},
      {"generate --model " + model + " --prompt hi --device gpu", "--device gpu must be cpu or cuda"},
      {"generate --model " + model + " --prompt hi --device cuda", "--device cuda needs --cache skvq"},
      // no GPU: the device's description; on a GPU: groups of 8 channels, which the GPU cache does not take
      {"generate --model " + model + " --prompt hi --cache skvq --set group_size=8 --device cuda", "--device cuda: "},
      // outputs that cannot be written are refused before the work (one line on stderr: no generation
      // summary, no evaluation table), naming the flag and the path
      {"generate --model " + model + " --prompt hi --save-cache " + err + "/sub/c.st", "--save-cache " + err + "/sub/c.st: directory"},
      {"generate --model " + model + " --prompt hi --save-cache " + fs::temp_directory_path().string(), "is a directory"},
      {"eval --model " + model + " --text " + model + " --json " + err + "/sub/t.json", err + " is not a directory"},
      {"convert --model " + model + " --out " + err + "/x.gguf", "--out " + err + "/x.gguf: " + err + " is not a directory"},
      // refused by the file system, not by the permission bits, when running as root
      {"eval --model " + model + " --text " + model + " --json /proc/skvq-none/t.json",
       "--json /proc/skvq-none/t.json: directory /proc is not writable"},
  };
  for (const auto& [args, needle] : cases) {
    const auto [rc, text] = run_cli(args, err);
    EXPECT_EQ(rc, 2) << args;
    EXPECT_NE(text.find(needle), std::string::npos) << args << " -> " << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  }
  fs::remove(err);
}

TEST(Model, GenerateSavesAndResumesACache) {
  REQUIRE_DATA();
  const std::string model = (kData / "babyllama/model5000.bin").string();
  const std::string file = tmp("conv.safetensors"), out1 = tmp("o1.txt"), out2 = tmp("o2.txt");
  const std::string cli = SKVQ_CLI_PATH;
  // one go: prompt A then B; resumed: A saved, then B from the file
  ASSERT_EQ(std::system((cli + " generate --model " + model + " --cache skvq --set window=16 --set n_sink=2 --set group_size=8" +
                         " --prompt 'Once upon a time' -n 20 --save-cache " + file + " >" + out1 + " 2>/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((cli + " generate --model " + model + " --load-cache " + file + " --prompt ' The end.' -n 20 >" + out2 +
                         " 2>/dev/null").c_str()), 0);
  const std::string resumed = read_file(out2);
  EXPECT_GT(resumed.size(), std::string(" The end.").size());
  // the same conversation in-process
  const Runner r(baby().m);
  Config cfg;
  cfg.window = 16;
  cfg.n_sink = 2;
  cfg.group_size = 8;
  PromptCache cache = r.make_cache(CacheKind::skvq, cfg);
  auto run = [&](const std::vector<int>& prompt, int n, std::string* text) {
    auto logits = r.forward(prompt, cache, false);
    int prev = prompt.back();
    for (int i = 0; i < n; ++i) {
      const int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      *text += baby().tok.decode(prev, next);
      const int one[1] = {next};
      logits = r.forward(one, cache, false);
      prev = next;
    }
  };
  std::string t1, t2;
  run(baby().tok.encode("Once upon a time", true), 20, &t1);
  run(baby().tok.encode(" The end.", false), 20, &t2);
  EXPECT_EQ(resumed, " The end." + t2 + "\n");
  // the saved cache keeps its kind: --cache naming the other one is refused (one line, exit 2), the same one taken
  const std::string resume = cli + " generate --model " + model + " --load-cache " + file + " --prompt ' The end.' -n 20";
  const int refused = std::system((resume + " --cache fp16 >" + out2 + " 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(refused));
  EXPECT_EQ(WEXITSTATUS(refused), 2);
  const std::string err = read_file(out2);
  EXPECT_EQ(err, "skvq generate: --cache fp16: the cache given by --load-cache " + file + " is an skvq one (a saved cache keeps its kind)\n");
  ASSERT_EQ(std::system((resume + " --cache skvq >" + out2 + " 2>/dev/null").c_str()), 0);
  EXPECT_EQ(read_file(out2), resumed);
  for (const auto& p : {file, out1, out2}) fs::remove(p);
}

// A cache whose max_ctx is below the model's context ends the generation where it is full, as the
// model's context does: the tokens it holds are printed, then one line says why it stopped.
TEST(Model, GenerateStopsWhereTheCacheIsFull) {
  REQUIRE_DATA();
  const std::string model = (kData / "babyllama/model5000.bin").string();
  const std::string out = tmp("full.txt"), err = tmp("full.err");
  const std::string gen = std::string(SKVQ_CLI_PATH) + " generate --model " + model + " --prompt 'Once upon a time' -n 40";
  ASSERT_EQ(std::system((gen + " --cache skvq --set max_ctx=24 >" + out + " 2>" + err).c_str()), 0);
  const std::string short_text = read_file(out), short_err = read_file(err);
  // "Once upon a time" is 18 tokens with BOS: 6 generated fill the 24
  EXPECT_NE(short_err.find("stopped after 6 of 40 tokens: the cache's max_ctx of 24 tokens is full"), std::string::npos) << short_err;
  ASSERT_EQ(std::system((gen + " --cache skvq >" + out + " 2>/dev/null").c_str()), 0);
  const std::string long_text = read_file(out);
  // the same greedy tokens as far as the small cache went (character-level vocabulary: one a token)
  ASSERT_EQ(short_text.size(), std::string("Once upon a time").size() + 6 + 1);
  EXPECT_EQ(long_text.substr(0, short_text.size() - 1), short_text.substr(0, short_text.size() - 1));
  for (const auto& p : {out, err}) fs::remove(p);
}

// generate --device cuda: the skvq cache and its attention on the GPU, with the model on the CPU.
// lm128's greedy continuation is the CPU cache's, and a conversation saved from the GPU resumes
// alike on the CPU and on the GPU (the attention kernels round differently from the CPU's, so a
// near-tie among the logits could in principle differ; none does here).
TEST(Model, GenerateOnTheGpuAsOnTheCpu) {
  REQUIRE_DATA();
  if (!cuda::available()) GTEST_SKIP() << cuda::device_description();
  const std::string model = (kData / "lm128/model.bin").string(), cli = SKVQ_CLI_PATH, file = tmp("gpu.safetensors");
  const auto generate_with = [&](const std::string& model_path, const std::string& args) {
    const std::string out = tmp("gen.txt");
    EXPECT_EQ(std::system((cli + " generate --model " + model_path + " " + args + " >" + out + " 2>/dev/null").c_str()), 0) << args;
    std::string text = read_file(out);
    fs::remove(out);
    return text;
  };
  const auto generate = [&](const std::string& args) { return generate_with(model, args); };
  const std::string cpu = generate("--cache skvq --prompt 'The history of the' -n 200");
  EXPECT_GT(cpu.size(), std::string("The history of the").size() + 40);  // (78 tokens, then the end of text)
  EXPECT_EQ(generate("--cache skvq --device cuda --prompt 'The history of the' -n 200 --save-cache " + file), cpu);
  const std::string resumed = generate("--load-cache " + file + " --prompt ' In the' -n 60");
  EXPECT_GT(resumed.size(), 40u);
  EXPECT_EQ(generate("--load-cache " + file + " --device cuda --prompt ' In the' -n 60"), resumed);
  fs::remove(file);
  // babyllama: head dim 16 (the GPU's general-shape path), small windows so that it flushes
  const std::string baby_model = (kData / "babyllama/model5000.bin").string();
  const std::string baby = "--cache skvq --set window=16 --set n_sink=2 --prompt 'Once upon a time' -n 120";
  const std::string baby_cpu = generate_with(baby_model, baby);
  EXPECT_GT(baby_cpu.size(), 100u);
  EXPECT_EQ(generate_with(baby_model, baby + " --device cuda"), baby_cpu);
  // code widths outside the tuned kernels' (3-bit keys, 5-bit values)
  const std::string odd = baby + " --set bits_key=3 --set bits_value=5";
  const std::string odd_cpu = generate_with(baby_model, odd);
  EXPECT_GT(odd_cpu.size(), 100u);
  EXPECT_EQ(generate_with(baby_model, odd + " --device cuda"), odd_cpu);
}

TEST(Model, ConvertAndInspectCommands) {
  REQUIRE_DATA();
  const std::string cli = SKVQ_CLI_PATH;
  const std::string gguf = tmp("c.gguf"), cache = tmp("i.safetensors"), out = tmp("o.txt");
  const std::string model = (kData / "babyllama/model5000.bin").string();
  ASSERT_EQ(std::system((cli + " convert --model " + model + " --out " + gguf + " >/dev/null 2>&1").c_str()), 0);
  // the converted file generates the same text as the original
  const std::string gen = " generate --prompt 'Once upon a time' -n 40 --model ";
  ASSERT_EQ(std::system((cli + gen + model + " > " + out + ".a 2>/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((cli + gen + gguf + " --save-cache " + cache + " > " + out + ".b 2>/dev/null").c_str()), 0);
  const std::string ta = read_file(out + ".a"), tb = read_file(out + ".b");
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta.find(", there was a little girl"), std::string::npos) << ta;
  ASSERT_EQ(std::system((cli + " inspect " + cache + " --json > " + out + " 2>/dev/null").c_str()), 0);
  const auto js = nlohmann::json::parse(read_file(out));
  EXPECT_EQ(js["layers"].size(), 5u);
  EXPECT_EQ(js["layers"][0]["kind"], "plain");
  EXPECT_GT(js["layers"][0]["offset"].get<int>(), 40);
  EXPECT_EQ(js["int_arrays"]["tokens"].get<int>(), js["layers"][0]["offset"].get<int>());
  for (const auto& f : {gguf, cache, out, out + ".a", out + ".b"}) fs::remove(f);
}

}  // namespace
}  // namespace skvq::test
