// Saving and loading a whole prompt cache in the safetensors format: every
// layer's codes, metadata, tail, sinks, permutations, counters and config,
// so that a loaded cache continues exactly as the saved one would have.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "skvq/prompt_cache.hpp"

namespace skvq {

// Format written by this version; files with a newer version are refused.
constexpr int kCacheFileVersion = 1;

// Extra data a caller keeps beside the cache (the token history of a
// conversation, the model it belongs to): strings and int32 arrays.
struct CacheFileExtras {
  std::map<std::string, std::string> strings;
  std::map<std::string, std::vector<std::int32_t>> int_arrays;
};

// Writes atomically: a temporary file in the same directory, flushed to disk,
// then renamed over `path`. On error the previous file is left untouched.
// Throws skvq::Error.
void save_prompt_cache(const PromptCache& cache, const std::string& path, const CacheFileExtras& extras = {});

// Throws skvq::Error with a clear message for a missing, truncated, corrupted
// (checksum), foreign (not an skvq cache) or newer-version file.
PromptCache load_prompt_cache(const std::string& path, CacheFileExtras* extras = nullptr);
PromptCache load_prompt_cache_bytes(std::span<const std::uint8_t> bytes, CacheFileExtras* extras = nullptr);

// The serialized bytes (what save_prompt_cache writes).
std::vector<std::uint8_t> prompt_cache_bytes(const PromptCache& cache, const CacheFileExtras& extras = {});

}  // namespace skvq
