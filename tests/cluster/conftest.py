"""The cluster tests run twice: on worker processes (TCP between workers,
as on a real cluster) and on an in-process cluster (``processes=False``:
workers are threads of the test process, replies travel without a copy),
the embedded cluster's default layout. The staleness audit, exact sums and
torn-read tests hold on both."""

from __future__ import annotations

import logging

import pytest
from distributed import LocalCluster


@pytest.fixture(scope="session", params=["processes", "threads"])
def cluster(request):
    logging.getLogger("distributed").setLevel(logging.WARNING)
    with LocalCluster(
        n_workers=2, threads_per_worker=2, processes=request.param == "processes", dashboard_address=None
    ) as cluster:
        yield cluster


# Own client and ps fixtures (the root conftest's are cached per session
# against the root cluster fixture; these follow the parametrized one).
@pytest.fixture(scope="session")
def client(cluster):
    from distributed import Client

    with Client(cluster) as client:
        yield client


@pytest.fixture
def ps(client):
    import dask_ps

    ps = dask_ps.ParameterServer(client)
    yield ps
    for name in ps.tables():  # every test starts with no tables
        ps.drop_table(name)
