"""glibc's mmap threshold in a nanny's worker process (``dask_ps._host_memory``)."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import textwrap

import pytest

from dask_ps._host_memory import raise_mmap_threshold

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or "musl" in (ctypes.util.find_library("c") or ""),
                           reason="glibc's mallopt")

# Allocate, write and free a 4 MiB array 200 times and count the page faults.
CHILD = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from dask_ps._host_memory import raise_mmap_threshold
    raised = raise_mmap_threshold(sys.argv[1] if sys.argv[1] != "none" else None)
    np.ones(1 << 19).sum()  # warm: the heap grows once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):
        a = np.empty(1 << 19)  # 4 MiB
        a[:] = 1.0
        del a
    print(raised, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(threshold, nanny=True):
    env = dict(os.environ)
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    if nanny:
        env["MALLOC_TRIM_THRESHOLD_"] = "65536"  # what Dask's nanny sets
    out = subprocess.run([sys.executable, "-c", CHILD, threshold], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", int(out[1])


@glibc
def test_a_nanny_worker_reuses_large_blocks_once_raised():
    """Under the nanny's variable every 4 MiB array is a fresh mmap that
    faults its pages again; with the threshold raised the same block comes
    back from the heap."""
    raised, faults = _faults("32MiB")
    assert raised
    kept, faults_nanny = _faults("none")
    assert not kept
    assert faults_nanny > 200 * 200  # pages of every array (about half of the 1024 here)
    assert faults < faults_nanny / 20


def test_nothing_changes_outside_a_nanny_worker():
    """The caller's process (threads layout) and workers without the
    nanny's variable keep glibc's own rule."""
    assert raise_mmap_threshold("32MiB", environ={}) is False
    assert raise_mmap_threshold(None, environ={"MALLOC_TRIM_THRESHOLD_": "65536"}) is False
    if sys.platform.startswith("linux"):
        raised, _ = _faults("32MiB", nanny=False)
        assert not raised
