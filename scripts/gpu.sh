#!/usr/bin/env bash
# On a GPU machine: the GPU benchmarks and PyTorch's fp16 flash attention on
# the same shapes, then the GPU tests (plus compute-sanitizer), in one run;
# prints a short table last. Uses binaries built by scripts/gpu_build.sh
# (carried in .devrun/) when present, else builds here.
# Usage: scripts/gpu.sh [--quick] [--archive] [OUT_DIR]
#   OUT_DIR (default $OUT, else /tmp/skvq-gpu) receives one file a benchmark
#   and a test job (about 35). --archive writes them to a local folder instead
#   and leaves one archive, OUT_DIR/gpu-run.tgz, also when the run is cut off
#   (a lent device call brings back only so many files).
set -uo pipefail
cd "$(dirname "$0")/.."
quick=""; archive=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick="--quick"; shift ;;
    --archive) archive=1; shift ;;
    -*) echo "scripts/gpu.sh: unknown option $1 (usage: scripts/gpu.sh [--quick] [--archive] [OUT_DIR])" >&2; exit 2 ;;
    *) break ;;
  esac
done
out=${1:-${OUT:-/tmp/skvq-gpu}}
if [ -n "$archive" ]; then
  dest=$out; out=$(mktemp -d /tmp/skvq-gpu-run.XXXXXX)
  mkdir -p "$dest"
  trap 'tar -C "$out" -czf "$dest/gpu-run.tgz" . && echo "(the run'"'"'s files: $dest/gpu-run.tgz)"' EXIT
  trap 'exit 143' TERM INT
fi
mkdir -p "$out"
[ -f .devrun/devrun.tar.xz ] && [ ! -x .devrun/skvq_tests ] && tar -C .devrun -xJf .devrun/devrun.tar.xz
if [ -x .devrun/skvq_tests ]; then
  bin=.devrun; export LD_LIBRARY_PATH="$PWD/.devrun/lib:${LD_LIBRARY_PATH:-}"
else
  cmake -S . -B build-gpu -DSKVQ_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build-gpu -j"$(nproc)" >/dev/null || exit 1
  bin=build-gpu; cp build-gpu/tests/skvq_tests build-gpu/bench/bench_cuda build-gpu/ 2>/dev/null
fi
# the shared data that scripts/gpu_build.sh put beside the binaries (the real-model tests)
[ -z "${SKVQ_SHARED_DATA:-}" ] && [ -d .devdata ] && export SKVQ_SHARED_DATA="$PWD/.devdata"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
# The benchmarks first (a minute), on a device that the tests have not yet
# kept busy for minutes (after them, session 32 measured 4 fewer cells at 70%
# of copy than a run of the benchmarks alone); their tables print last.
echo "== benchmarks"
"$bin/bench_cuda" $quick > "$out/bench_cuda.txt" 2>&1; echo "bench_cuda exit $?"
SKVQ_CUDA_MMA=1 "$bin/bench_cuda" --no-scale $quick > "$out/bench_cuda_mma.txt" 2>&1; echo "bench_cuda (tensor-core kernel) exit $?"
python3 bench/bench_torch_sdpa.py $quick > "$out/torch.txt" 2>&1; echo "torch exit $?"
[ -z "$quick" ] && { "$bin/bench_cuda" --head-dims > "$out/bench_head_dims.txt" 2>&1; echo "bench_cuda --head-dims exit $?"; }
[ -z "$quick" ] && { SKVQ_CUDA_GENERAL=float "$bin/bench_cuda" --head-dims > "$out/bench_head_dims_float.txt" 2>&1; echo "bench_cuda --head-dims (float general kernel) exit $?"; }
[ -z "$quick" ] && { "$bin/bench_cuda" --dtypes > "$out/bench_dtypes.txt" 2>&1; echo "bench_cuda --dtypes exit $?"; }
[ -z "$quick" ] && { "$bin/bench_cuda" --widths > "$out/bench_widths.txt" 2>&1; echo "bench_cuda --widths exit $?"; }
[ -z "$quick" ] && { "$bin/bench_cuda" --pairs > "$out/bench_pairs.txt" 2>&1; echo "bench_cuda --pairs exit $?"; }
[ -z "$quick" ] && { SKVQ_CUDA_GENERAL=float "$bin/bench_cuda" --pairs > "$out/bench_pairs_float.txt" 2>&1; echo "bench_cuda --pairs (float general kernel) exit $?"; }
[ -z "$quick" ] && { "$bin/bench_cuda" --widened > "$out/bench_widened.txt" 2>&1; echo "bench_cuda --widened exit $?"; }
[ -z "$quick" ] && { SKVQ_CUDA_WIDEN=0 "$bin/bench_cuda" --widened > "$out/bench_widened_general.txt" 2>&1; echo "bench_cuda --widened (not widened) exit $?"; }
# The test runs are independent of each other: they go to the GPU together
# (background jobs, each with its own output file; a full sequential pass took
# about nine minutes, near a device call's ten), and their summaries print in
# this order once all are done.
t0=$(date +%s)
job() {  # job NAME COMMAND...: COMMAND in the background, its output into $out/NAME.txt
  local name=$1; shift
  "$@" > "$out/$name.txt" 2>&1 &
}
tests="$bin/skvq_tests"
sanitize=(compute-sanitizer --error-exitcode 3 --tool)
job tests "$tests" --gtest_filter='Cuda*:Attend*:SpecCases*'
for m in fast rs imma tmma general chunk; do job "tests_$m" env SKVQ_CUDA_BODY=$m "$tests" --gtest_filter='Cuda*'; done
job tests_general_float env SKVQ_CUDA_GENERAL=float "$tests" --gtest_filter='Cuda*'
job tests_general_float_all env SKVQ_CUDA_GENERAL=float SKVQ_CUDA_BODY=general "$tests" --gtest_filter='Cuda*'
job tests_tmma_noone env SKVQ_CUDA_BODY=tmma SKVQ_CUDA_TMMA_ONE=0 "$tests" --gtest_filter='Cuda*'
job tests_nopair env SKVQ_CUDA_TMMA_PAIR=0 "$tests" --gtest_filter='Cuda*'
job tests_pairall env SKVQ_CUDA_TMMA_PAIR=1 "$tests" --gtest_filter='Cuda*'
job tests_noshort env SKVQ_CUDA_TMMA_SHORT=0 "$tests" --gtest_filter='Cuda*'
job tests_nobalance env SKVQ_CUDA_BALANCE=0 "$tests" --gtest_filter='Cuda*'
job tests_balance64 env SKVQ_CUDA_BALANCE=64 SKVQ_CUDA_BODY=tmma "$tests" --gtest_filter='Cuda*'
job tests_notail env SKVQ_CUDA_TAIL=0 "$tests" --gtest_filter='Cuda*'
job tests_immagroups env SKVQ_CUDA_IMMA_GROUPS=2 "$tests" --gtest_filter='Cuda*'
job tests_nochunk env SKVQ_CUDA_CHUNK_ROWS=0 "$tests" --gtest_filter='Cuda.Chunked*'
job tests_quotients env SKVQ_CUDA_FLUSH=quotients "$tests" --gtest_filter='Cuda.Flush*'
job tests_exact env SKVQ_CUDA_FLUSH=exact "$tests" --gtest_filter='Cuda.Flush*:Cuda.*Spec*'
job tests_nopdl env SKVQ_CUDA_PDL=0 "$tests" --gtest_filter='Cuda*'
job tests_nobodypdl env SKVQ_CUDA_BODY_PDL=0 "$tests" --gtest_filter='Cuda*'
job tests_mma env SKVQ_CUDA_MMA=1 "$tests" --gtest_filter='Cuda*'
job tests_nowiden env SKVQ_CUDA_WIDEN=0 "$tests" --gtest_filter='Cuda*'
job memcheck "${sanitize[@]}" memcheck "$tests" --gtest_filter='Cuda*'
job initcheck "${sanitize[@]}" initcheck "$tests" --gtest_filter='Cuda*'
job racecheck "${sanitize[@]}" racecheck "$tests" --gtest_filter='Cuda.Flush*'
job racecheck_claims env SKVQ_CUDA_BALANCE=64 "${sanitize[@]}" racecheck "$tests" --gtest_filter='Cuda.ClaimedTiles*'
job racecheck_general "${sanitize[@]}" racecheck "$tests" --gtest_filter='Cuda.OtherHeadDims*:Cuda.DenseFp16*:Cuda.GeneralTensorCore*'
job racecheck_widen "${sanitize[@]}" racecheck "$tests" --gtest_filter='Cuda.Widened*'
wait
echo "(the tests and sanitizers ran side by side in $(( $(date +%s) - t0 )) s)"
summary() {  # summary TITLE NAME [PATTERN [LINES]]: the lines of $out/NAME.txt that say how it went
  echo "== $1"
  grep -E "${3:-Failure|FAILED|PASSED}" "$out/$2.txt" | head -n "${4:-10}"
}
summary "GPU tests" tests "Failure|FAILED|Expected|Which is|evaluates|PASSED|SKIPPED \]" 30
for m in fast rs imma tmma general chunk; do
  summary "GPU tests, every packed body through one kernel (SKVQ_CUDA_BODY=$m)" "tests_$m"
done
summary "GPU tests, the general path's float kernel for every token (SKVQ_CUDA_GENERAL=float)" tests_general_float
summary "GPU tests, every call through the general path's float kernel (SKVQ_CUDA_GENERAL=float SKVQ_CUDA_BODY=general)" tests_general_float_all
summary "GPU tests, one query row through the token-major kernel's four-row form (SKVQ_CUDA_BODY=tmma SKVQ_CUDA_TMMA_ONE=0)" tests_tmma_noone
summary "GPU tests, the token-major kernel one tile at a time (SKVQ_CUDA_TMMA_PAIR=0)" tests_nopair
summary "GPU tests, tile pairs in blocks of any length (SKVQ_CUDA_TMMA_PAIR=1)" tests_pairall
summary "GPU tests, 4-bit codes through the three-stage ring (SKVQ_CUDA_TMMA_SHORT=0)" tests_noshort
summary "GPU tests, each block its own split's tiles (SKVQ_CUDA_BALANCE=0)" tests_nobalance
summary "GPU tests, tiles shared in chunks of 2 (SKVQ_CUDA_BALANCE=64 SKVQ_CUDA_BODY=tmma)" tests_balance64
summary "GPU tests, no small chunks at the end of a head's tiles (SKVQ_CUDA_TAIL=0)" tests_notail
summary "GPU tests, two groups of 8 query rows a launch of the integer tensor-core kernel (SKVQ_CUDA_IMMA_GROUPS=2)" tests_immagroups
summary "GPU tests, chunks without the chunk kernel (SKVQ_CUDA_CHUNK_ROWS=0)" tests_nochunk
summary "GPU flush tests, 4- and 8-bit codes by the exact quotient only (SKVQ_CUDA_FLUSH=quotients)" tests_quotients
summary "GPU flush tests, the clip search's errors summed exactly for every group (SKVQ_CUDA_FLUSH=exact)" tests_exact
summary "GPU tests, the combine kernel launched after the body (SKVQ_CUDA_PDL=0, as before compute capability 9.0)" tests_nopdl
summary "GPU tests, the body kernels launched after the stream's earlier work (SKVQ_CUDA_BODY_PDL=0)" tests_nobodypdl
summary "GPU tests, opt-in tensor-core kernel (SKVQ_CUDA_MMA=1)" tests_mma
summary "GPU tests, 3- and 1-bit codes not widened (SKVQ_CUDA_WIDEN=0)" tests_nowiden
echo "== compute-sanitizer memcheck"
tail -n 3 "$out/memcheck.txt"
echo "== compute-sanitizer initcheck and racecheck"
tail -n 1 "$out/initcheck.txt"
tail -n 1 "$out/racecheck.txt"
tail -n 1 "$out/racecheck_claims.txt"
tail -n 1 "$out/racecheck_general.txt"
tail -n 1 "$out/racecheck_widen.txt"
echo "== benchmark results (measured first, above)"
grep -v RESULT "$out/bench_cuda.txt" | tail -n 20
[ -f "$out/bench_head_dims.txt" ] && grep -E "^\| (D|16|32|64|96|256) " "$out/bench_head_dims.txt"
[ -f "$out/bench_head_dims_float.txt" ] && { echo "(the same, the general path's float kernel alone)"; grep -E "^\| (16|32|64|96|256) " "$out/bench_head_dims_float.txt"; }
[ -f "$out/bench_dtypes.txt" ] && sed -n '/^## Device calls/,$p' "$out/bench_dtypes.txt" | grep -v RESULT
[ -f "$out/bench_widened.txt" ] && { sed -n '/^## 3- and 1-bit/,$p' "$out/bench_widened.txt" | grep -v RESULT; echo "(the same, SKVQ_CUDA_WIDEN=0)"; grep -E "^\| K(3V3|1V1)" "$out/bench_widened_general.txt"; }
python3 scripts/gpu_report.py "$out/bench_cuda_mma.txt" "$out/torch.txt" > "$out/table_mma.md"
python3 scripts/gpu_report.py "$out/bench_cuda.txt" "$out/torch.txt" | tee "$out/table.md"
