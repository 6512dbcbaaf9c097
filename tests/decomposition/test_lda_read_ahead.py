"""LDA's read sent with the clock before (issue 36: one request per server
per clock): under BSP, the seeded default, a participant starts its next
iteration's read of the word rows and the totals before it clocks, so the
clock's message to each server carries it and the server answers once
every participant has clocked there. Before, the read went after the
clock returned: two requests per server per iteration."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dask_ps
from dask_ps.decomposition import LatentDirichletAllocation

ITERATIONS = 6


@pytest.fixture(scope="module")
def counts():
    rng = np.random.default_rng(0)
    return sp.random(600, 500, density=0.05, random_state=1, data_rvs=lambda n: rng.integers(1, 4, n)).tocsr()


def _fit(X, client, read_ahead, **kw):
    with dask.config.set({"ps.lda.read-ahead": read_ahead}):
        return LatentDirichletAllocation(n_components=10, max_iter=ITERATIONS, random_state=0, n_partitions=2,
                                         client=client, **kw).fit(X)


def _requests(m, kind):
    got = m["messages"]
    return got.get(kind, 0) + got.get(f"{kind}_local", 0)


@pytest.mark.parametrize("layout", ["embedded", "processes"])
def test_a_bsp_iteration_is_one_request_per_server_and_the_same_chain(counts, client, layout):
    c = None if layout == "embedded" else client
    ahead, after = _fit(counts, c, True), _fit(counts, c, False)
    # the same values read: the seeded BSP chain, bit for bit
    np.testing.assert_array_equal(ahead.components_, after.components_)
    for a, b in zip(ahead.metrics_, after.metrics_):
        clocks = a["clock"]
        assert clocks == ITERATIONS + 1  # the starting counts, then one a sweep
        servers = _requests(a, "clock") // clocks
        assert servers == 2 and _requests(a, "clock") == servers * clocks, a["messages"]
        # one read a server before the first sweep; every later one went with a clock
        assert _requests(a, "pull") == servers, a["messages"]
        assert _requests(b, "pull") == servers * ITERATIONS, b["messages"]


def _table(m, suffix):
    return m["tables"][[t for t in m["tables"] if t.endswith(suffix)][0]]


def _word_reads(m):
    """Read requests for the word rows: the others poll the run's start
    table (a one-row VAP table on one server) until all have started."""
    return _requests(m, "pull") - _table(m, "started")["reads"]


def test_a_refreshing_model_reads_after_its_clock(counts):
    """``SSP(2, refresh=True)``, the unseeded default: its read is sent
    after the clock, as fresh as it can be (made as the clock arrived, it
    missed more of the others' latest pushes: a lower log-likelihood)."""
    m = _fit(counts, None, True, consistency=dask_ps.SSP(2, refresh=True))
    for p in m.metrics_:
        assert _table(p, "word-topic")["prefetch_hits"] == 0
        assert _word_reads(p) == (_requests(p, "clock") // p["clock"]) * ITERATIONS, p["messages"]


def test_essp_reads_after_its_clock(counts):
    """ESSP's servers push rows to the readers: its reads are not started
    early."""
    m = _fit(counts, None, True, consistency=dask_ps.ESSP(2, refresh=True))
    for p in m.metrics_:
        assert _table(p, "word-topic")["prefetch_hits"] == 0
        assert _word_reads(p) == (_requests(p, "clock") // p["clock"]) * ITERATIONS, p["messages"]
