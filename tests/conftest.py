from __future__ import annotations

import logging

import pytest
from distributed import Client, LocalCluster


def pytest_collection_modifyitems(config, items):
    # GPU tests need cupy and a device; skip cleanly elsewhere.
    try:
        import cupy

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs cupy and a CUDA GPU")
        for item in items:
            # the marker, not item.keywords: those hold the directory name
            # too, and tests/gpu/ also has the stand-in tests (no GPU needed)
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster():
    """One small cluster shared by the tests that do not change membership."""
    logging.getLogger("distributed").setLevel(logging.WARNING)
    with LocalCluster(
        n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def client(cluster):
    with Client(cluster) as client:
        yield client


@pytest.fixture
def ps(client):
    import dask_ps

    ps = dask_ps.ParameterServer(client)
    yield ps
    for name in ps.tables():  # every test starts with no tables
        ps.drop_table(name)
