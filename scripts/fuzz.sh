#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and fuzzes every reader of
# untrusted files (prompt caches, .npy, models, tokenizers), each from its
# seed corpus, and the cache's operations against the scalar reference
# (fuzz_cache_ops, from no seeds): scripts/fuzz.sh [SECONDS a target]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
secs=${1:-60}
targets=(cache_file cache_ops npy model tokenizer)
corpora=(cache ops npy model tokenizer)
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DSKVQ_FUZZ=ON \
  -DSKVQ_BUILD_TESTS=OFF -DSKVQ_BUILD_BENCH=OFF -DSKVQ_BUILD_TOOLS=OFF -DSKVQ_SANITIZE=ON -DSKVQ_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_make_corpus "${targets[@]/#/fuzz_}" >/dev/null
corpus=build-fuzz/corpus
rm -rf "$corpus" && mkdir -p "$corpus"
./build-fuzz/fuzz/fuzz_make_corpus "$corpus"
for i in "${!targets[@]}"; do
  echo "-- fuzz_${targets[$i]} (${secs} s)"
  log=build-fuzz/fuzz_${targets[$i]}.log
  if ! ./build-fuzz/fuzz/fuzz_"${targets[$i]}" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix=build-fuzz/ "$corpus/${corpora[$i]}" >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "fuzz_${targets[$i]}: FAILED (the input is in the build-fuzz/crash-* file named above)"
    exit 1
  fi
  tail -n 3 "$log"
done
