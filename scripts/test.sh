#!/usr/bin/env bash
# Set up, build and run the tests: scripts/test.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
bash scripts/build.sh "$dir" "$@" >/dev/null
cd "$dir"
ctest --output-on-failure -j"$(nproc)"
