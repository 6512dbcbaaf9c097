#!/usr/bin/env bash
# The one prepared GPU check (issue 7): run on the lent GPU machine through the
# device tool, with `.whl` carried (see ../shared/gpu/README.md: fetch the wheels
# once with ../shared/gpu/fetch-wheels.sh fsspec cloudpickle prometheus_client numba,
# and `echo /.whl/ >> .git/info/exclude`).
#   device run: bash scripts/gpu_check.sh      (timeout_s 590, carry [".whl"])
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/log"
timeout 240 python3 -m pytest -m gpu -x -q -p no:cacheprovider -o addopts="" tests/gpu/test_gpu.py 2>&1 | tee -a "$OUT/log"
timeout 90 python3 benchmarks/bench_gpu.py --part kv --mib 16 64 256 --budget 1.5 2>&1 | tee -a "$OUT/log"
timeout 120 python3 benchmarks/bench_gpu.py --part sgd 2>&1 | tee -a "$OUT/log"
timeout 120 python3 benchmarks/bench_gpu.py --part lda 2>&1 | tee -a "$OUT/log"
