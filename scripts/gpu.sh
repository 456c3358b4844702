#!/usr/bin/env bash
# On a GPU machine: the GPU benchmarks and PyTorch's fp16 flash attention on
# the same shapes, then the GPU tests (plus compute-sanitizer), in one run;
# prints a short table last. Uses binaries built by scripts/gpu_build.sh
# (carried in .devrun/) when present, else builds here.
# Usage: scripts/gpu.sh [--quick] [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
quick=""; [ "${1:-}" = "--quick" ] && { quick="--quick"; shift; }
out=${1:-${OUT:-/tmp/skvq-gpu}}
mkdir -p "$out"
if [ -x .devrun/skvq_tests ]; then
  [ -f .devrun/lib.tar.xz ] && [ ! -d .devrun/lib ] && tar -C .devrun -xJf .devrun/lib.tar.xz
  bin=.devrun; export LD_LIBRARY_PATH="$PWD/.devrun/lib:${LD_LIBRARY_PATH:-}"
else
  cmake -S . -B build-gpu -DSKVQ_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build-gpu -j"$(nproc)" >/dev/null || exit 1
  bin=build-gpu; cp build-gpu/tests/skvq_tests build-gpu/bench/bench_cuda build-gpu/ 2>/dev/null
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
# The benchmarks first (a minute), on a device that the tests have not yet
# kept busy for minutes (after them, session 32 measured 4 fewer cells at 70%
# of copy than a run of the benchmarks alone); their tables print last.
echo "== benchmarks"
"$bin/bench_cuda" $quick > "$out/bench_cuda.txt" 2>&1; echo "bench_cuda exit $?"
SKVQ_CUDA_MMA=1 "$bin/bench_cuda" --no-scale $quick > "$out/bench_cuda_mma.txt" 2>&1; echo "bench_cuda (tensor-core kernel) exit $?"
python3 bench/bench_torch_sdpa.py $quick > "$out/torch.txt" 2>&1; echo "torch exit $?"
echo "== GPU tests"
"$bin/skvq_tests" --gtest_filter='Cuda*:Attend*:SpecCases*' > "$out/tests.txt" 2>&1
grep -E "Failure|FAILED|Expected|Which is|evaluates|PASSED|SKIPPED \]" "$out/tests.txt" | head -n 30
for m in fast rs imma tmma; do
  echo "== GPU tests, every packed body through one kernel (SKVQ_CUDA_BODY=$m)"
  SKVQ_CUDA_BODY=$m "$bin/skvq_tests" --gtest_filter='Cuda*' > "$out/tests_$m.txt" 2>&1
  grep -E "Failure|FAILED|PASSED" "$out/tests_$m.txt" | head -n 10
done
echo "== GPU tests, one query row through the token-major kernel's four-row form (SKVQ_CUDA_BODY=tmma SKVQ_CUDA_TMMA_ONE=0)"
SKVQ_CUDA_BODY=tmma SKVQ_CUDA_TMMA_ONE=0 "$bin/skvq_tests" --gtest_filter='Cuda*' > "$out/tests_tmma_noone.txt" 2>&1
grep -E "Failure|FAILED|PASSED" "$out/tests_tmma_noone.txt" | head -n 10
echo "== GPU tests, the token-major kernel one tile at a time (SKVQ_CUDA_TMMA_PAIR=0)"
SKVQ_CUDA_TMMA_PAIR=0 "$bin/skvq_tests" --gtest_filter='Cuda*' > "$out/tests_nopair.txt" 2>&1
grep -E "Failure|FAILED|PASSED" "$out/tests_nopair.txt" | head -n 10
echo "== GPU tests, each block its own split's tiles (SKVQ_CUDA_BALANCE=0), and tiles shared in chunks of 2 (=64)"
SKVQ_CUDA_BALANCE=0 "$bin/skvq_tests" --gtest_filter='Cuda*' > "$out/tests_nobalance.txt" 2>&1
grep -E "Failure|FAILED|PASSED" "$out/tests_nobalance.txt" | head -n 10
SKVQ_CUDA_BALANCE=64 SKVQ_CUDA_BODY=tmma "$bin/skvq_tests" --gtest_filter='Cuda*' > "$out/tests_balance64.txt" 2>&1
grep -E "Failure|FAILED|PASSED" "$out/tests_balance64.txt" | head -n 10

echo "== GPU flush tests, 4- and 8-bit codes by the exact quotient only (SKVQ_CUDA_FLUSH=quotients)"
SKVQ_CUDA_FLUSH=quotients "$bin/skvq_tests" --gtest_filter='Cuda.Flush*' > "$out/tests_quotients.txt" 2>&1
grep -E "Failure|FAILED|PASSED" "$out/tests_quotients.txt" | head -n 10
echo "== GPU flush tests, the clip search's errors summed exactly for every group (SKVQ_CUDA_FLUSH=exact)"
SKVQ_CUDA_FLUSH=exact "$bin/skvq_tests" --gtest_filter='Cuda.Flush*:Cuda.*Spec*' > "$out/tests_exact.txt" 2>&1
grep -E "Failure|FAILED|PASSED" "$out/tests_exact.txt" | head -n 10
echo "== GPU tests, the combine kernel launched after the body (SKVQ_CUDA_PDL=0, as before compute capability 9.0)"
SKVQ_CUDA_PDL=0 "$bin/skvq_tests" --gtest_filter='Cuda*' > "$out/tests_nopdl.txt" 2>&1
grep -E "Failure|FAILED|PASSED" "$out/tests_nopdl.txt" | head -n 10
echo "== GPU tests, opt-in tensor-core kernel (SKVQ_CUDA_MMA=1)"
SKVQ_CUDA_MMA=1 "$bin/skvq_tests" --gtest_filter='Cuda*' > "$out/tests_mma.txt" 2>&1
grep -E "Failure|FAILED|PASSED" "$out/tests_mma.txt" | head -n 10
echo "== compute-sanitizer memcheck"
compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/skvq_tests" --gtest_filter='Cuda*' 2>&1 | tail -n 3 | tee "$out/memcheck.txt"
echo "== compute-sanitizer initcheck and racecheck"
compute-sanitizer --tool initcheck --error-exitcode 3 "$bin/skvq_tests" --gtest_filter='Cuda*' 2>&1 | tail -n 1 | tee "$out/initcheck.txt"
compute-sanitizer --tool racecheck --error-exitcode 3 "$bin/skvq_tests" --gtest_filter='Cuda.Flush*' 2>&1 | tail -n 1 | tee "$out/racecheck.txt"
SKVQ_CUDA_BALANCE=64 compute-sanitizer --tool racecheck --error-exitcode 3 "$bin/skvq_tests" --gtest_filter='Cuda.ClaimedTiles*' 2>&1 | tail -n 1 | tee -a "$out/racecheck.txt"
echo "== benchmark results (measured first, above)"
grep -v RESULT "$out/bench_cuda.txt" | tail -n 20
python3 scripts/gpu_report.py "$out/bench_cuda_mma.txt" "$out/torch.txt" > "$out/table_mma.md"
python3 scripts/gpu_report.py "$out/bench_cuda.txt" "$out/torch.txt" | tee "$out/table.md"
