// A llama-architecture model (RMSNorm, RoPE on interleaved pairs, grouped-
// query attention, SwiGLU) with fp32 weights, and its loaders: llama2.c
// checkpoints (legacy header, version 1 fp32 and version 2 int8 exports) and
// GGUF files (F32, F16 or BF16 tensors, vocabulary embedded).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.hpp"

namespace skvq::model {

struct ModelConfig {
  int dim = 0;
  int hidden_dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int vocab_size = 0;
  int seq_len = 0;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool shared_classifier = true;
  int head_dim() const { return n_heads ? dim / n_heads : 0; }
  int kv_dim() const { return head_dim() * n_kv_heads; }
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  std::vector<float> wq;         // [dim, dim]      row-major [out, in]
  std::vector<float> wk;         // [kv_dim, dim]
  std::vector<float> wv;         // [kv_dim, dim]
  std::vector<float> wo;         // [dim, dim]
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> w1;         // [hidden, dim]   gate
  std::vector<float> w2;         // [dim, hidden]   down
  std::vector<float> w3;         // [hidden, dim]   up
};

struct Model {
  ModelConfig cfg;
  std::vector<float> tok_embeddings;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;      // [dim]
  std::vector<float> wcls;            // [vocab, dim]; empty when shared with the embedding
  const float* classifier() const { return cfg.shared_classifier ? tok_embeddings.data() : wcls.data(); }
};

// Checks shapes and ranges of a config read from a file; throws skvq::Error naming the field.
void validate_config(const ModelConfig& c, const std::string& path);

// llama2.c checkpoint (legacy version 0, or "ak42" versions 1 and 2).
Model load_llama2c(const std::string& path);
// The same from the file's bytes (`path` names it in errors).
Model parse_llama2c(std::string_view bytes, const std::string& path);
// `m` as a llama2.c checkpoint's bytes, as export.py writes them: version 0
// (legacy header, zero freq_cis tables), 1 (fp32) or 2 (int8 groups of
// `group` values with fp32 scales; group must divide dim).
std::string llama2c_bytes(const Model& m, int version, int group = 64);

// A model of config `c` with random weights (normal, scaled by 1/sqrt of the
// input width; norms 1), for tests and fuzzing seeds.
Model random_model(const ModelConfig& c, std::uint32_t seed);

// GGUF of the llama architecture; the embedded vocabulary goes to *tok.
Model load_gguf(const std::string& path, Tokenizer* tok);
// The same from the file's bytes (`path` names it in errors). *tok is set
// only when the whole model has loaded.
Model parse_gguf(std::string_view bytes, const std::string& path, Tokenizer* tok);

// Chooses the loader by the file's magic. A llama2.c checkpoint needs a
// tokenizer file (`tokenizer_path`, or tokenizer.bin / tok*.bin beside it);
// a GGUF file carries its own.
Model load_model(const std::string& path, const std::string& tokenizer_path, Tokenizer* tok);

// Writes `m` and `tok` as a GGUF file (llama architecture, tensors in `dtype`:
// "f32", "f16" or "bf16").
void write_gguf(const Model& m, const Tokenizer& tok, const std::string& path, const std::string& dtype);
// The same file's bytes.
std::string gguf_bytes(const Model& m, const Tokenizer& tok, const std::string& dtype);

}  // namespace skvq::model
