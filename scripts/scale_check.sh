#!/usr/bin/env bash
# The one prepared 16-core scaling check (issue 36), for the lent device
# machine's CPU cores (16 cores; Python 3.12 without dask: see
# ../shared/gpu/README.md). Run after scripts/gpu_check.sh, or alone where
# there is no time for both.
#
# Once, here (not on the device), fetch what it lacks into .whl/ (git-ignored):
#     bash scripts/gpu_wheels.sh          (the dask wheels and .whl/news.npz, ~5 MiB)
# Then one device run, carrying them:
#     device run: bash scripts/scale_check.sh        (timeout_s 590, carry [".whl"])
# and give the machine back. Everything goes to $OUT/log, the measurements
# to $OUT/scale.json; the last lines ("SCALE CHECK SUMMARY") are each fit
# predicted by the simulation (constants from the 2-worker cluster of the
# same run) against measured.
#
# What is measured (benchmarks/sync_measure.py --pin): clusters of worker
# processes, each pinned to cores of its own (core 0 left to the client and
# the scheduler where one is spare): P = 2, 4, 8, 14 of one thread, and 8 of
# two threads (16 participants) against 8 of one (SCALE_WORKERS overrides); the per-message and
# per-byte constants (P = 2), the sync cycles (SGD, LDA, seeded LDA) at each
# P, the SGD click-through and LDA K=50 fits with the data growing with the
# participants (weak scaling: 100,000 rows and 750 news documents a
# participant; SGD trains one a worker). Time: about 7 minutes, estimated, not yet
# run on 16 cores (machine start not counted).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/log"
ls .whl/*.whl .whl/news.npz >/dev/null 2>&1 || { echo "no .whl/: run scripts/gpu_wheels.sh first and carry .whl" | tee "$LOG"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed" | tee "$LOG"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)" | tee "$LOG"
python3 -c "import sys, numpy, scipy, sklearn, numba, dask, distributed; print(sys.version.split()[0], 'numpy', numpy.__version__, 'scipy', scipy.__version__, 'sklearn', sklearn.__version__, 'numba', numba.__version__, 'dask', dask.__version__)" 2>&1 | tee -a "$LOG"

step() {  # step SECONDS NAME COMMAND...: run with a limit, log, note a timeout
  local limit=$1 name=$2; shift 2
  echo "=== $name ($(date +%T))" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | grep -v "created table\|dask_ps: \|Nanny\|close-stream\|Remove worker\|Lost all\|Closing\|Scheduler closing\|Retire worker\|Close client\|Remove client" | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "=== $name: TIMED OUT after ${limit}s" | tee -a "$LOG"
  return 0
}

# the clusters, each written to the JSON as it ends (a timeout keeps what was measured)
step 480 measure python3 benchmarks/sync_measure.py --layouts processes --workers ${SCALE_WORKERS:-2 4 8 14 8x2} \
  --pin --repeats ${SCALE_REPEATS:-2} --lda-corpus .whl/news.npz --json "$OUT/scale.json"
step 60 predict python3 benchmarks/sync_scale.py --measured "$OUT/scale.json" --validate-only

{
  echo "=== SCALE CHECK SUMMARY (predicted / measured wall, error; each cluster: processes-PxT)"
  grep -E '^\| processes' "$LOG" | cut -d'|' -f2,3,5,6,7
} | tee -a "$LOG"
