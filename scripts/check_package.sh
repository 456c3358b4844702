#!/usr/bin/env bash
# Installs the library from BUILD_DIR into a temporary prefix and builds and
# runs a consumer that uses find_package(skvq): scripts/check_package.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$dir" --prefix "$prefix/install" >/dev/null
cmake -S tests/consumer -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix/install" >/dev/null
cmake --build "$prefix/consumer" >/dev/null
"$prefix/consumer/consumer"
