#!/usr/bin/env bash
# Builds the libFuzzer target with clang and fuzzes the cache-file loader:
# scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
secs=${1:-60}
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DSKVQ_FUZZ=ON \
  -DSKVQ_BUILD_TESTS=OFF -DSKVQ_BUILD_BENCH=OFF -DSKVQ_BUILD_TOOLS=OFF -DSKVQ_SANITIZE=ON -DSKVQ_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_cache_file fuzz_make_corpus >/dev/null
corpus=build-fuzz/corpus
rm -rf "$corpus" && mkdir -p "$corpus"
./build-fuzz/fuzz/fuzz_make_corpus "$corpus"
./build-fuzz/fuzz/fuzz_cache_file -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=4096 "$corpus" 2>&1 | tail -n 5
