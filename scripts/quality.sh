#!/usr/bin/env bash
# The eval tables of docs/quality.md: first 16k tokens of WikiText on both shared models.
# Usage: scripts/quality.sh [OUT_DIR]   (needs ../shared/data beside the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/quality}
mkdir -p "$out"
data=../shared/data
text=$data/text/wikitext-test.raw.txt
lm=()
lm+=(--config "default:")
for b in "8 8" "4 4" "4 2" "2 2"; do
  set -- $b
  for g in 32 128; do
    lm+=(--config "K${1}V${2}-g${g}:bits_key=$1,bits_value=$2,group_size=$g")
    lm+=(--config "K${1}V${2}-g${g}-plain:bits_key=$1,bits_value=$2,group_size=$g,reorder=false,clip_search=false")
  done
done
lm+=(--config "K2V2-g32-meta-fp32:group_size=32,metadata=fp32")
lm+=(--config "K2V2-g32-meta-e4m3:group_size=32,metadata=fp8_e4m3")
./build/skvq eval --model $data/lm128/model.bin --text "$text" --max-tokens 16384 "${lm[@]}" --json "$out/lm128.json" | tee "$out/lm128.md"
bl=()
for b in 8 4 2; do
  for g in 8 16; do
    for w in 32 64; do
      bl+=(--config "K${b}V${b}-g${g}-w${w}:bits_key=$b,bits_value=$b,group_size=$g,window=$w")
    done
  done
done
./build/skvq eval --model $data/babyllama/model5000.bin --text "$text" --max-tokens 16384 "${bl[@]}" --json "$out/babyllama.json" | tee "$out/babyllama.md"
