"""The real-GPU tests' own logic, checked in every test run: ``test_gpu.py``
run on the CPU stand-in (``gpu_dry_run.py``) in a subprocess. What it
cannot check (cupy's kernels, device memory, Dask's cupy serializer between
worker processes, dask-cuda) is what ``scripts/gpu_check.sh`` runs on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys


def test_gpu_tests_pass_on_the_standin():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, os.path.join(here, "gpu_dry_run.py")],
                         capture_output=True, text=True, cwd=root, env=env, timeout=600)
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    assert " passed" in out.stdout and "failed" not in out.stdout, tail
