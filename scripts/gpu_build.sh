#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries here (nvcc, sm_90) and gathers
# them with the shared libraries they need into .devrun/ for the device run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build-gpu -DSKVQ_CUDA=ON >/dev/null
rm -rf .devrun && mkdir -p .devrun/lib
cp build-gpu/tests/skvq_tests build-gpu/bench/bench_cuda build-gpu/bench/bench_attend .devrun/
for lib in libhwy.so.1 libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" .devrun/lib/
done
# the device call carries at most 64 MiB: stripped binaries, libraries compressed
# (scripts/gpu.sh unpacks them)
strip .devrun/skvq_tests .devrun/bench_cuda .devrun/bench_attend
tar -C .devrun -cJf .devrun/lib.tar.xz lib && rm -rf .devrun/lib
du -sh .devrun
