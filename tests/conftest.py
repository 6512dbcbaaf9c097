from __future__ import annotations

import pytest
from distributed import Client
from ps_fixtures import fresh_ps, shared_cluster


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
    with shared_cluster(processes=True) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def client(cluster):
    with Client(cluster) as client:
        yield client


@pytest.fixture
def ps(client):
    yield from fresh_ps(client)


@pytest.fixture(scope="module")
def sm():
    """``benchmarks/scaling_model.py`` loaded as a module (it is a script, not
    part of the package)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "scaling_model.py"
    spec = importlib.util.spec_from_file_location("scaling_model_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def sgd_by_rows():
    """SGD fits of this test get their participants and BSP rounds as before
    participants by work (``ps_fixtures.SGD_BY_ROWS``): several participants
    on a small input."""
    import dask
    from ps_fixtures import SGD_BY_ROWS

    with dask.config.set(SGD_BY_ROWS):
        yield
