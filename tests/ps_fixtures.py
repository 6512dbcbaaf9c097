"""Helpers of the shared-cluster fixtures (tests/conftest.py, tests/cluster/conftest.py)."""

from __future__ import annotations

import contextlib
import logging
import time

from distributed import LocalCluster


# An SGD fit's participants and BSP rounds as before participants by work:
# one participant per 10,000 samples, at least 4 rounds an epoch. The tests
# of several participants' paths on small inputs set it
# (``dask.config.set(SGD_BY_ROWS)``; in a subprocess, ``SGD_BY_ROWS_ENV``).
SGD_BY_ROWS = {"ps.sgd.min-samples-per-participant": 10_000, "ps.sgd.bsp-min-rounds-per-epoch": 4}
SGD_BY_ROWS_ENV = {"DASK_PS__" + "__".join(k.split(".")[1:]).upper().replace("-", "_"): str(v)
                   for k, v in SGD_BY_ROWS.items()}


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


def wait_until(predicate, what, timeout=120, poll=0.2):
    """``predicate()``'s first true value, polled; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def lda_corpus(n_docs=400, doc_len=80, n_words=200, n_topics=5, alpha=0.3, eta=0.05, seed=0):
    """Documents drawn from the LDA generative process; returns (X, true topics)."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(n_words, eta), size=n_topics)
    theta = rng.dirichlet(np.full(n_topics, alpha), size=n_docs)
    X = np.vstack([rng.multinomial(doc_len, p / p.sum()) for p in theta @ topics])
    return sp.csr_matrix(X), topics


@contextlib.contextmanager
def replicated_pair(n_rows):
    """An in-process cluster of 2 workers and table ``"w"`` of ``n_rows``
    in one block, on both (replication 2, ASP): ``(ps, primary, replica)``;
    skips where the worker plugins are not in this process."""
    import pytest
    from distributed import Client

    import dask_ps
    from dask_ps._worker_plugin import _IN_PROCESS

    with LocalCluster(n_workers=2, processes=False, threads_per_worker=2, dashboard_address=None) as c, \
            Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.wait_for_servers(2)
        ps.create_table("w", shape=(n_rows,), block_rows=n_rows, replication=2, consistency=dask_ps.ASP())
        (primary, replica), = ps._handle("w").owners
        if not all(hasattr(_IN_PROCESS.get(w), "_push") for w in (primary, replica)):
            pytest.skip("no in-process worker plugin")
        yield ps, primary, replica
