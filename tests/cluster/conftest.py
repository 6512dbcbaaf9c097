"""The cluster tests run twice: on worker processes (TCP between workers,
as on a real cluster) and on an in-process cluster (``processes=False``:
workers are threads of the test process, replies travel without a copy),
the embedded cluster's default layout. The staleness audit, exact sums and
torn-read tests hold on both.

``client`` and ``ps`` are defined again here, not inherited: the root
conftest's session-scoped ``client`` is cached against the root ``cluster``
fixture; these follow the parametrized one."""

from __future__ import annotations

import pytest
from distributed import Client
from ps_fixtures import fresh_ps, shared_cluster


@pytest.fixture(scope="session", params=["processes", "threads"])
def cluster(request):
    with shared_cluster(processes=request.param == "processes") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def client(cluster):
    with Client(cluster) as client:
        yield client


@pytest.fixture
def ps(client):
    yield from fresh_ps(client)
