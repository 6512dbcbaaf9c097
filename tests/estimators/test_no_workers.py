"""A fit on a scheduler without workers fails after ``ps.timeouts.no-workers``
with an error that names the scheduler and what to start (issue 24,
item 4). On 3860c22 it waited silently until killed (9.5 min in the report).
"""

from __future__ import annotations

import threading

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

pytest.importorskip("numba")

import dask_ps  # noqa: E402
from dask_ps.decomposition import LatentDirichletAllocation  # noqa: E402
from dask_ps.linear_model import SGDClassifier  # noqa: E402


@pytest.fixture
def no_workers():
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster, set_as_default=False) as client:
            yield cluster, client


def _data():
    rng = np.random.RandomState(0)
    X = rng.randn(100, 3)
    return X, (X[:, 0] > 0).astype(int)


@pytest.mark.parametrize("fit", [
    lambda client: SGDClassifier(max_iter=2, client=client).fit(*_data()),
    lambda client: LatentDirichletAllocation(2, max_iter=2, client=client).fit(np.ones((5, 4))),
    lambda client: dask_ps.ParameterServer(client).run(lambda ctx, part: part, [1, 2]),
], ids=["SGDClassifier", "LatentDirichletAllocation", "ParameterServer.run"])
def test_no_workers_fails_after_the_configured_wait(no_workers, fit):
    cluster, client = no_workers
    address = cluster.scheduler_address
    with dask.config.set({"ps.timeouts.no-workers": "1s"}):
        with pytest.raises(dask_ps.NoWorkersError) as info:
            fit(client)
    message = str(info.value)
    assert "has waited 1 s" in message  # the configured wait, not the default's
    assert address in message and f"dask worker {address}" in message
    assert info.value.address == address
    assert isinstance(info.value, TimeoutError)


def test_the_default_wait_is_at_most_a_minute():
    assert 0 < dask.utils.parse_timedelta(dask.config.get("ps.timeouts.no-workers")) <= 60


def test_a_worker_that_joins_during_the_wait_is_used(no_workers):
    cluster, client = no_workers
    threading.Timer(1.0, cluster.scale, args=(1,)).start()
    with dask.config.set({"ps.timeouts.no-workers": "60s"}):
        est = SGDClassifier(max_iter=2, tol=None, client=client).fit(*_data())
    assert est.score(*_data()) > 0.5
