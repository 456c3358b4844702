#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries here (nvcc, sm_90 code alone: the
# device is an H200, and the compute_80 PTX of the default build would make
# the binaries too large to carry) and gathers them with the shared libraries
# they need into .devrun/ for the device run. (CI and scripts/build.sh build
# the default architectures, sm_90 plus compute_80 PTX.)
#
# --keep-before: the bench_cuda of the build already in build-gpu/ (the code before this change) goes
# into the archive too, as bench_cuda_before, for side-by-side runs of the two in one device call
# (next to the new one in the archive it costs little: their kernels are mostly the same bytes).
# --before FILE: FILE (a bench_cuda kept from an earlier build) goes in as bench_cuda_before instead.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/gpu_build.sh [--keep-before | --before FILE]"
before=""
case "${1:-}" in
  --keep-before)
    [ $# -eq 1 ] || { echo "scripts/gpu_build.sh: --keep-before takes no value ($usage)" >&2; exit 2; }
    before=build-gpu/bench/bench_cuda ;;
  --before)
    [ $# -eq 2 ] || { echo "scripts/gpu_build.sh: --before needs one FILE ($usage)" >&2; exit 2; }
    before=$2 ;;
  "") ;;
  *) echo "scripts/gpu_build.sh: unknown argument $1 ($usage)" >&2; exit 2 ;;
esac
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
if [ -n "$before" ]; then
  [ -x "$before" ] || { echo "scripts/gpu_build.sh: no executable $before to keep as bench_cuda_before" >&2; exit 2; }
  cp "$before" "$keep/bench_cuda_before"
fi
bash scripts/build.sh build-gpu -DSKVQ_CUDA=ON -DSKVQ_CUDA_ARCHITECTURES=90-real >/dev/null
rm -rf .devrun && mkdir -p .devrun/lib
cp build-gpu/tests/skvq_tests build-gpu/bench/bench_cuda build-gpu/bench/bench_attend build-gpu/bench/bench_cache .devrun/
bins="bench_cuda skvq_tests bench_attend bench_cache"
if [ -n "$before" ]; then
  cp "$keep/bench_cuda_before" .devrun/
  bins="bench_cuda bench_cuda_before skvq_tests bench_attend bench_cache"
fi
for lib in libhwy.so.1 libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" .devrun/lib/
done
# the device call carries at most 64 MiB: stripped, then binaries and
# libraries in one xz archive (about 37 MB), which scripts/gpu.sh unpacks
(cd .devrun && strip $bins)
tar -C .devrun -cf - $bins lib | xz -9e -T1 > .devrun/devrun.tar.xz
(cd .devrun && rm -rf lib $bins)
du -sh .devrun
# The small-head model and the text of the real-model GPU tests (about 5 MB; lm128's 70.7 MB would not
# fit a device call beside the binaries), for scripts/gpu.sh to point the tests at: .devdata, carried
# with .devrun (both git-ignored).
if [ -d ../shared/data/babyllama ] && [ -d ../shared/data/text ]; then
  rm -rf .devdata && mkdir -p .devdata && cp -r ../shared/data/babyllama ../shared/data/text .devdata/ && chmod -R u+w .devdata
  du -sh .devdata
fi
