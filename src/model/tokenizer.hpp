// The llama2.c tokenizer: a scored vocabulary, greedy pair merges by score,
// byte fallback where the vocabulary has byte pieces.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace skvq::model {

class Tokenizer {
 public:
  Tokenizer() = default;
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, int bos = 1, int eos = 2);

  // llama2.c tokenizer file: int32 max_token_length, then per token float
  // score, int32 length, bytes. `vocab_size` from the model.
  static Tokenizer load_llama2c(const std::string& path, int vocab_size);
  // The same from the file's bytes (`path` names it in errors).
  static Tokenizer parse_llama2c(std::string_view bytes, const std::string& path, int vocab_size);

  // Text -> token ids (BOS first when `bos`). Sentencepiece-style
  // vocabularies get a leading space ("dummy prefix"); byte-level
  // vocabularies (a piece for every byte) take the text's bytes as is.
  std::vector<int> encode(const std::string& text, bool bos) const;
  // The text of `token` following `prev` (a leading space after BOS is dropped).
  std::string decode(int prev, int token) const;

  int size() const { return static_cast<int>(pieces_.size()); }
  int bos() const { return bos_; }
  int eos() const { return eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  const std::vector<std::string>& pieces() const { return pieces_; }
  const std::vector<float>& scores() const { return scores_; }

 private:
  int lookup(const std::string& s) const;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> index_;
  int byte_piece_[256] = {};
  bool add_space_prefix_ = true;
  int bos_ = 1, eos_ = 2;
};

}  // namespace skvq::model
