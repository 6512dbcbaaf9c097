"""Helpers of the shared-cluster fixtures (tests/conftest.py, tests/cluster/conftest.py)."""

from __future__ import annotations

import logging

from distributed import LocalCluster


def shared_cluster(processes: bool):
    """The small cluster shared by the tests that do not change membership."""
    logging.getLogger("distributed").setLevel(logging.WARNING)
    return LocalCluster(n_workers=2, threads_per_worker=2, processes=processes, dashboard_address=None)


def fresh_ps(client):
    """A ParameterServer that drops every table the test left (generator)."""
    import dask_ps

    ps = dask_ps.ParameterServer(client)
    yield ps
    for name in ps.tables():  # every test starts with no tables
        ps.drop_table(name)
