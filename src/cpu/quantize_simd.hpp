// Highway SIMD row quantizer: same contract and same results as
// ref::quantize_rows, vectorised across rows (one row per lane).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/quant_params.hpp"

namespace skvq::cpu {

// Runs on the best SIMD target of this CPU (runtime dispatch).
void quantize_rows(const QuantParams& p);

// ref::pack_codes's contract and bytes (the stream's covered bytes zero
// beforehand); 2- and 4-bit codes from a whole byte on go a vector at a time.
void pack_codes(const std::uint8_t* codes, std::int64_t n, int bits, std::uint8_t* stream, std::int64_t first);

// Name of the target the dispatcher picks now ("AVX2", "AVX3", "SSE4", ...).
std::string active_target();

// For tests: every target compiled in and supported here, and a way to force
// one (0 restores normal dispatch).
std::vector<std::int64_t> available_targets();
void force_target(std::int64_t target);
std::string target_name(std::int64_t target);

}  // namespace skvq::cpu
