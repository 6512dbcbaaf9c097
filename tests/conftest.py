from __future__ import annotations

import faulthandler
import os
import sys
import time

import pytest
from distributed import Client
from hypothesis import settings as hypothesis_settings
from ps_fixtures import fresh_ps, shared_cluster


# Property-based tests draw the same examples every run (a test that can
# fail by chance is a broken test): HYPOTHESIS_PROFILE=explore draws anew.
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# A test, its fixtures and their teardown included, that runs this long has
# hung past pytest-timeout's 300 s. pytest-timeout's alarm needs the main
# thread to run Python; a process where it cannot (the GIL held in C code,
# the process frozen) ran CI out of its 90 minutes with no word (stop 43).
# faulthandler's watchdog is a C thread: it writes every thread's stack to
# the real stderr and ends the run, 300 s past the test's own timeout, or
# once the whole run has taken 80 minutes (CI stops at 90), whichever comes
# first (the default selection only: ``-m slow`` runs longer). Every 250
# tests the progress line says the run's seconds so far.
WATCHDOG_GRACE = 300
RUN_LIMIT = 80 * 60
_run = {"start": time.monotonic(), "stderr": None, "done": 0, "limit": RUN_LIMIT}


def pytest_configure(config):
    _run["start"] = time.monotonic()
    _run["stderr"] = os.dup(sys.stderr.fileno())
    _run["limit"] = RUN_LIMIT if config.option.markexpr == "not slow and not gpu" else float("inf")


def _test_timeout(item) -> float:
    """The test's pytest-timeout seconds (its marker, else ``--timeout``);
    inf where timeouts are off (``--timeout=0``) or a debugger may stop
    the test (``--pdb``, ``--trace``)."""
    config = item.config
    if config.getoption("usepdb", False) or config.getoption("trace", False):
        return float("inf")
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        timeout = marker.args[0] if marker.args else marker.kwargs["timeout"]
    else:
        timeout = config.getoption("timeout", None)
    return float(timeout) if timeout else float("inf")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    left = _run["limit"] - (time.monotonic() - _run["start"])
    seconds = min(_test_timeout(item) + WATCHDOG_GRACE, left)
    if seconds != float("inf"):  # a debugging session, or -m slow without timeouts: no watchdog
        faulthandler.dump_traceback_later(max(1.0, seconds), exit=True, file=_run["stderr"])
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    _run["done"] += 1
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    if _run["done"] % 250 == 0 and reporter is not None:
        reporter.write(f" ({time.monotonic() - _run['start']:.0f} s)")


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
