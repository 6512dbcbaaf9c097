"""Dry run of the real-GPU tests (``test_gpu.py``) on the CPU stand-in.

``python tests/gpu/gpu_dry_run.py [pytest args]`` runs ``test_gpu.py -m
gpu`` in this process with ``cupy`` bound to ``cupy_standin`` and
``dask_cuda.LocalCUDACluster`` to an in-process ``LocalCluster`` (one worker
per listed device), so the GPU tests' own logic is checked where there is
no GPU (``test_gpu_dry_run.py`` does, in a subprocess: the module bindings
are process-wide). It says nothing about cupy or a GPU themselves.
"""

from __future__ import annotations

import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv) -> int:
    sys.path.insert(0, HERE)
    import cupy_standin
    from distributed import LocalCluster

    from dask_ps import _backend

    _backend.set_device_module(cupy_standin)
    sys.modules["cupy"] = cupy_standin
    dask_cuda = types.ModuleType("dask_cuda")

    def LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=None, **kwargs):  # noqa: N802
        n = len(str(CUDA_VISIBLE_DEVICES).split(","))
        return LocalCluster(n_workers=n, threads_per_worker=1, processes=False, dashboard_address=None)

    dask_cuda.LocalCUDACluster = LocalCUDACluster
    sys.modules["dask_cuda"] = dask_cuda
    import pytest

    return pytest.main([os.path.join(HERE, "test_gpu.py"), "-q", "-p", "no:cacheprovider", "-m", "gpu",
                        "-o", "addopts=", "--noconftest", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
