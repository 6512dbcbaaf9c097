from __future__ import annotations

import faulthandler
import os
import sys

import pytest
from distributed import Client
from ps_fixtures import fresh_ps, shared_cluster


# A test, its fixtures and their teardown included, that runs this long has
# hung past pytest-timeout's 300 s. pytest-timeout's alarm needs the main
# thread to run Python; a process where it cannot (the GIL held in C code,
# the process frozen) ran CI out of its 90 minutes with no word (stop 43).
# faulthandler's watchdog is a C thread: it writes every thread's stack to
# the real stderr and ends the run, 300 s past the test's own timeout.
WATCHDOG_GRACE = 300
_real_stderr = None


def pytest_configure(config):
    global _real_stderr
    _real_stderr = os.dup(sys.stderr.fileno())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    marker = item.get_closest_marker("timeout")
    timeout = marker.args[0] if marker and marker.args else item.config.getoption("timeout", None) or 300
    faulthandler.dump_traceback_later(float(timeout) + WATCHDOG_GRACE, exit=True, file=_real_stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


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
