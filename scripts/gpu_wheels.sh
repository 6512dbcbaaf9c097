#!/usr/bin/env bash
# Fetch, on this machine, the wheels that the lent GPU machine lacks (it has
# numpy, cupy, scikit-learn, pandas, pytest, ... but no dask), into .whl/ for
# scripts/gpu_check.sh (carry [".whl"] on the device run). Uses the shared
# ../shared/gpu/fetch-wheels.sh (dask 2026.7.1, distributed, dask-cuda 26.10
# and what they need) plus what dask_ps imports there. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
../shared/gpu/fetch-wheels.sh fsspec cloudpickle prometheus_client numba==0.68.1 llvmlite==0.50.0
