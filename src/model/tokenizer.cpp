// llama2.c-compatible tokenizer.
#include "model/tokenizer.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/open_input.hpp"
#include "skvq/error.hpp"

namespace skvq::model {

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, int bos, int eos)
    : pieces_(std::move(pieces)), scores_(std::move(scores)), bos_(bos), eos_(eos) {
  if (pieces_.size() != scores_.size()) throw Error("skvq: tokenizer: pieces and scores differ in count");
  for (int i = static_cast<int>(pieces_.size()) - 1; i >= 0; --i) index_[pieces_[static_cast<std::size_t>(i)]] = i;
  // byte pieces: "<0xXX>" or, in byte-level vocabularies, the raw byte
  bool every_byte = true;
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    int id = lookup(hex);
    if (id < 0) id = lookup(std::string(1, static_cast<char>(b)));
    byte_piece_[b] = id;
    every_byte &= id >= 0;
  }
  add_space_prefix_ = !every_byte;
}

int Tokenizer::lookup(const std::string& s) const {
  const auto it = index_.find(s);
  return it == index_.end() ? -1 : it->second;
}

Tokenizer Tokenizer::load_llama2c(const std::string& path, int vocab_size) {
  std::ifstream f;
  if (const std::string why = open_input(f, path); !why.empty()) throw Error("skvq: tokenizer " + path + ": " + why);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_llama2c(bytes, path, vocab_size);
}

Tokenizer Tokenizer::parse_llama2c(std::string_view bytes, const std::string& path, int vocab_size) {
  std::size_t pos = 0;
  auto read = [&](void* dst, std::size_t n) {
    if (n > bytes.size() - pos) return false;
    std::memcpy(dst, bytes.data() + pos, n);
    pos += n;
    return true;
  };
  std::int32_t max_len = 0;
  if (!read(&max_len, 4) || max_len < 1 || max_len > 1 << 16) {
    // A SentencePiece model (a protobuf ModelProto) opens with its first piece: field 1, length-delimited.
    const bool sentencepiece = bytes.size() > 2 && bytes[0] == '\x0a' && bytes[2] == '\x0a';
    throw Error("skvq: tokenizer " + path + ": bad header (max_token_length)" +
                (sentencepiece ? std::string("; it looks like a SentencePiece .model (protobuf), which skvq does not read: "
                                             "give the llama2.c tokenizer file (.bin) made from it")
                               : std::string()));
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  for (int i = 0; i < vocab_size; ++i) {
    float score = 0;
    std::int32_t len = 0;
    if (!read(&score, 4) || !read(&len, 4)) {
      throw Error("skvq: tokenizer " + path + ": truncated at token " + std::to_string(i) + " of " +
                  std::to_string(vocab_size));
    }
    if (len < 0 || len > max_len) throw Error("skvq: tokenizer " + path + ": token " + std::to_string(i) + " has length " + std::to_string(len));
    std::string s(static_cast<std::size_t>(len), '\0');
    if (!read(s.data(), s.size())) throw Error("skvq: tokenizer " + path + ": truncated in token " + std::to_string(i));
    pieces.push_back(std::move(s));
    scores.push_back(score);
  }
  return Tokenizer(std::move(pieces), std::move(scores));
}

std::vector<int> Tokenizer::encode(const std::string& text, bool bos) const {
  if (pieces_.empty()) throw Error("skvq: tokenizer: encode with an empty vocabulary");
  std::vector<int> toks;
  if (bos) toks.push_back(bos_);
  if (text.empty()) return toks;
  std::vector<int> t;
  if (add_space_prefix_) {
    const int sp = lookup(" ");
    if (sp >= 0) t.push_back(sp);
  }
  for (std::size_t i = 0; i < text.size();) {  // one UTF-8 code point at a time
    const unsigned char c = static_cast<unsigned char>(text[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > text.size()) n = 1;
    const int id = lookup(text.substr(i, n));
    if (id >= 0) {
      t.push_back(id);
    } else {
      for (std::size_t k = 0; k < n; ++k) {
        const int b = byte_piece_[static_cast<unsigned char>(text[i + k])];
        t.push_back(b >= 0 ? b : 0);  // <unk> = 0 where there is no byte piece
        if (b < 0) break;             // one <unk> per unknown code point
      }
    }
    i += n;
  }
  for (;;) {  // merge the best-scoring adjacent pair while one exists
    float best = -1e30f;
    int best_id = -1;
    std::size_t best_i = 0;
    for (std::size_t i = 0; i + 1 < t.size(); ++i) {
      const int id = lookup(pieces_[static_cast<std::size_t>(t[i])] + pieces_[static_cast<std::size_t>(t[i + 1])]);
      if (id >= 0 && scores_[static_cast<std::size_t>(id)] > best) {
        best = scores_[static_cast<std::size_t>(id)];
        best_id = id;
        best_i = i;
      }
    }
    if (best_id < 0) break;
    t[best_i] = best_id;
    t.erase(t.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
  }
  toks.insert(toks.end(), t.begin(), t.end());
  return toks;
}

std::string Tokenizer::decode(int prev, int token) const {
  if (token < 0 || token >= size()) return "";
  std::string s = pieces_[static_cast<std::size_t>(token)];
  if (prev == bos_ && add_space_prefix_ && !s.empty() && s[0] == ' ') s.erase(0, 1);
  unsigned b = 0;
  if (s.size() == 6 && std::sscanf(s.c_str(), "<0x%02X>", &b) == 1) return std::string(1, static_cast<char>(b));
  if (token == bos_ || token == eos_) return "";
  return s;
}

}  // namespace skvq::model
