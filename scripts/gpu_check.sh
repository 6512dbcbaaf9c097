#!/usr/bin/env bash
# The one prepared GPU check (issues 7 and 15), for the lent GPU machine (one
# H200, Python 3.12, CUDA 13, cupy; no dask: see ../shared/gpu/README.md).
#
# Once, here (not on the GPU machine), fetch the wheels it lacks into .whl/
# (git-ignored through .git/info/exclude):
#     bash scripts/gpu_wheels.sh
# Then one device run, carrying the wheels:
#     device run: bash scripts/gpu_check.sh        (timeout_s 590, carry [".whl"])
# and give the machine back. Everything goes to $OUT/log; the last lines
# ("GPU CHECK SUMMARY") are the four figures docs/benchmarks.md records:
#   1. tests/gpu/test_gpu.py (pytest -m gpu) results;
#   2. push/pull GB/s of a cuda table vs a bare cupy RPC (target >= 0.8x);
#   3. SGD dense d=128 logistic regression samples/s (target >= 1e8);
#   4. LDA K=100 tokens/s (target >= 1e8).
# Time: about 8 minutes of the 15 a session gets (machine start not counted).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/log"
ls .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/: run scripts/gpu_wheels.sh first and carry .whl" | tee "$LOG"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed" | tee "$LOG"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$LOG"
python3 -c "import sys, numpy, cupy, dask, distributed, dask_cuda, sklearn; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'dask', dask.__version__, 'dask_cuda', dask_cuda.__version__, 'sklearn', sklearn.__version__)" 2>&1 | tee -a "$LOG"

step() {  # step SECONDS NAME COMMAND...: run with a limit, log, note a timeout
  local limit=$1 name=$2; shift 2
  echo "=== $name ($(date +%T))" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "=== $name: TIMED OUT after ${limit}s" | tee -a "$LOG"
  return 0
}

step 200 tests python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" -rfEs tests/gpu/test_gpu.py
step 80 kv python3 benchmarks/bench_gpu.py --part kv --mib 16 64 256 --budget 1.0
step 110 sgd python3 benchmarks/bench_gpu.py --part sgd
step 110 lda python3 benchmarks/bench_gpu.py --part lda

{
  echo "=== GPU CHECK SUMMARY"
  echo "1. tests:  $(grep -E '^[0-9]+ (passed|failed)|^(FAILED|ERROR) |[0-9]+ (passed|failed|skipped|error)' "$LOG" | tail -1)"
  echo "2. $(grep '^FIGURE kv' "$LOG" | tail -1)"
  echo "3. $(grep '^FIGURE sgd' "$LOG" | tail -1)"
  echo "4. $(grep '^FIGURE lda' "$LOG" | tail -1)"
} | tee -a "$LOG"
