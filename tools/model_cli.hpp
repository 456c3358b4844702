// Pieces the model subcommands (generate, eval, convert) share.
#pragma once

#include <string>

#include "model/model.hpp"
#include "model/tokenizer.hpp"

namespace skvq::tools {

struct LoadedModel {
  model::Model model;
  model::Tokenizer tokenizer;
};

// Loads --model (llama2.c or GGUF) and --tokenizer; errors become UsageError naming the flag.
LoadedModel load_model_args(const std::string& model_path, const std::string& tokenizer_path);

// A short text that identifies the model's architecture (checked when a cache file is loaded).
std::string model_signature(const model::Model& m);

}  // namespace skvq::tools
