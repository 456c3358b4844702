#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries here (nvcc, sm_90 code alone: the
# device is an H200, and the compute_80 PTX of the default build would make
# the binaries too large to carry) and gathers them with the shared libraries
# they need into .devrun/ for the device run. (CI and scripts/build.sh build
# the default architectures, sm_90 plus compute_80 PTX.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build-gpu -DSKVQ_CUDA=ON -DSKVQ_CUDA_ARCHITECTURES=90-real >/dev/null
rm -rf .devrun && mkdir -p .devrun/lib
cp build-gpu/tests/skvq_tests build-gpu/bench/bench_cuda build-gpu/bench/bench_attend build-gpu/bench/bench_cache .devrun/
for lib in libhwy.so.1 libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" .devrun/lib/
done
# the device call carries at most 64 MiB: stripped, then binaries and
# libraries in one xz archive (about 37 MB), which scripts/gpu.sh unpacks
strip .devrun/skvq_tests .devrun/bench_cuda .devrun/bench_attend .devrun/bench_cache
tar -C .devrun -cf - skvq_tests bench_cuda bench_attend bench_cache lib | xz -9e > .devrun/devrun.tar.xz
rm -rf .devrun/lib .devrun/skvq_tests .devrun/bench_cuda .devrun/bench_attend .devrun/bench_cache
du -sh .devrun
# The small-head model and the text of the real-model GPU tests (about 5 MB; lm128's 70.7 MB would not
# fit a device call beside the binaries), for scripts/gpu.sh to point the tests at: .devdata, carried
# with .devrun (both git-ignored).
if [ -d ../shared/data/babyllama ] && [ -d ../shared/data/text ]; then
  rm -rf .devdata && mkdir -p .devdata && cp -r ../shared/data/babyllama ../shared/data/text .devdata/ && chmod -R u+w .devdata
  du -sh .devdata
fi
