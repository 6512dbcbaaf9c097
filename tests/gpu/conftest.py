"""Fixtures of the GPU tests: the CPU stand-in for cupy (``cupy_standin``)
and an in-process cluster whose workers share it.

The stand-in reaches the workers because ``LocalCluster(processes=False)``
runs them as threads of the test process: ``dask_ps._backend`` is one
module, and ``standin`` sets its device module for the test's duration.
"""

from __future__ import annotations

import logging

import pytest
from distributed import Client, LocalCluster

import cupy_standin
from dask_ps import _backend


@pytest.fixture
def standin():
    """``device="cuda"`` is the stand-in while the test runs (one fake GPU
    with 16 GiB free), transfers counted from zero."""
    previous = _backend.set_device_module(cupy_standin)
    gpu = dict(cupy_standin.GPU)
    cupy_standin.reset_transfers()
    try:
        yield cupy_standin
    finally:
        _backend.set_device_module(previous)
        cupy_standin.GPU.update(gpu)


@pytest.fixture(scope="module")
def standin_client():
    """Two in-process workers (threads of this process) sharing the stand-in."""
    logging.getLogger("distributed").setLevel(logging.WARNING)
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def sps(standin, standin_client):
    """A ParameterServer on the in-process cluster, with the stand-in as the device."""
    import dask_ps

    ps = dask_ps.ParameterServer(standin_client)
    yield ps
    for name in ps.tables():
        ps.drop_table(name)
