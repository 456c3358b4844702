#!/usr/bin/env bash
# The main job: set up, build, and run the built-in demo workload.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build >/dev/null
exec ./build/skvq demo "$@"
