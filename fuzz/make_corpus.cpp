// Writes the fuzzers' seed corpora, a few valid files of each format:
// DIR/cache (prompt-cache files), DIR/npy, DIR/model (llama2.c versions 0-2
// and GGUF in each tensor type) and DIR/tokenizer (the vocabulary size byte
// that fuzz_tokenizer reads first, then a llama2.c tokenizer file); DIR/ops
// is left empty (fuzz_cache_ops starts from nothing).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/npy.hpp"
#include "model/model.hpp"
#include "skvq/cache_file.hpp"
#include "skvq/skvq.hpp"
#include "workload/synthetic.hpp"

namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}


void caches(const fs::path& dir) {
  int n = 0;
  for (auto meta : {skvq::MetaType::fp16, skvq::MetaType::fp8_e4m3}) {
    for (std::int64_t len : {3, 21}) {
      skvq::Config cfg;
      cfg.head_dim = 8;
      cfg.window = 8;
      cfg.n_sink = 2;
      cfg.group_size = 4;
      cfg.metadata = meta;
      skvq::ModelDesc m;
      m.layers = {{true, 8}, {false, 8}};
      auto pc = skvq::PromptCache::build(m, skvq::CacheKind::skvq, cfg);
      skvq::workload::SyntheticSpec sp;
      sp.num_kv_heads = 1;
      sp.head_dim = 8;
      sp.kv_len = len;
      sp.outlier_channels = 1;
      skvq::Tensor k, v;
      skvq::workload::make_kv(sp, skvq::DType::f16, &k, &v);
      for (std::size_t l = 0; l < pc.size(); ++l) pc.layer(l).append(k.view(), v.view());
      skvq::CacheFileExtras ex;
      ex.int_arrays["tokens"] = {1, 2, 3};
      skvq::save_prompt_cache(pc, (dir / ("seed" + std::to_string(n++) + ".safetensors")).string(), ex);
    }
  }
}

void npys(const fs::path& dir) {
  const float f[24] = {1, -2, 3.5f, 0, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26};
  write(dir / "f4_1d.npy", skvq::io::npy_bytes("<f4", {5}, f, 20));
  write(dir / "f4_4d.npy", skvq::io::npy_bytes("<f4", {1, 2, 3, 4}, f, 96));
  write(dir / "f2_2d.npy", skvq::io::npy_bytes("<f2", {3, 4}, f, 24));
  write(dir / "i4_0.npy", skvq::io::npy_bytes("<i4", {0, 3}, f, 0));
  write(dir / "f8.npy", skvq::io::npy_bytes("<f8", {2}, f, 16));
  std::string v2 = skvq::io::npy_bytes("<f4", {2, 2}, f, 16);  // format 2.0: a 4-byte header length
  const std::size_t hlen = v2.size() - 10 - 16;
  v2[6] = 2;
  v2.insert(8, std::string{static_cast<char>(hlen & 0xff), static_cast<char>(hlen >> 8), 0, 0});
  v2.erase(12, 2);
  write(dir / "v2.npy", v2);
}

void models(const fs::path& dir) {
  namespace m = skvq::model;
  m::ModelConfig c;
  c.dim = 16, c.hidden_dim = 24, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 6, c.seq_len = 8;
  std::vector<std::string> pieces{"<unk>", "<s>", "</s>", " ", "a", " a"};
  const m::Tokenizer tok(pieces, {0, 0, 0, -1, -2, -0.5f});
  for (bool shared : {true, false}) {
    c.shared_classifier = shared;
    const m::Model model = m::random_model(c, shared ? 1 : 2);
    const std::string tag = shared ? "shared" : "cls";
    for (int version : {0, 1, 2}) write(dir / ("v" + std::to_string(version) + "_" + tag + ".bin"), m::llama2c_bytes(model, version, 8));
    for (const char* dt : {"f32", "f16", "bf16"}) {
      const fs::path p = dir / (std::string(dt) + "_" + tag + ".gguf");
      m::write_gguf(model, tok, p.string(), dt);
    }
  }
}

void tokenizers(const fs::path& dir) {
  auto file = [](int vocab, int max_len, const std::vector<std::pair<float, std::string>>& toks) {
    std::string b(1, static_cast<char>(vocab - 3));
    auto put = [&](const void* p, std::size_t n) { b.append(static_cast<const char*>(p), n); };
    put(&max_len, 4);
    for (const auto& [score, s] : toks) {
      const auto len = static_cast<std::int32_t>(s.size());
      put(&score, 4);
      put(&len, 4);
      b += s;
    }
    return b;
  };
  write(dir / "small", file(6, 5, {{0, "<unk>"}, {0, "<s>"}, {0, "</s>"}, {-1, " "}, {-2, "a"}, {-0.5f, " a"}}));
  std::vector<std::pair<float, std::string>> bytes{{0, "<unk>"}, {0, "<s>"}, {0, "</s>"}};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    bytes.emplace_back(0.0f, hex);
  }
  write(dir / "bytes", file(258, 6, {bytes.begin(), bytes.begin() + 258}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const fs::path root = argv[1];
  for (const char* sub : {"cache", "ops", "npy", "model", "tokenizer"}) fs::create_directories(root / sub);
  caches(root / "cache");
  npys(root / "npy");
  models(root / "model");
  tokenizers(root / "tokenizer");
  return 0;
}
