"""LDA's topic totals as the word-topic table's last row (``_runs.totals_in_word_table``):
one read and one push a server per iteration carry the rows and the totals,
and the chain is the one a separate totals table gives, exactly."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("numba")

import dask_ps  # noqa: E402
from dask_ps.decomposition import LatentDirichletAllocation  # noqa: E402
from dask_ps.decomposition._runs import totals_in_word_table  # noqa: E402


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as c:
            yield c


def _corpus(n_docs=120, doc_len=40, n_words=200, n_topics=4, seed=0):
    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(n_words, 0.05), size=n_topics)
    theta = rng.dirichlet(np.full(n_topics, 0.3), size=n_docs)
    return np.vstack([rng.multinomial(doc_len, p / p.sum()) for p in theta @ topics])


def _served(client) -> dict:
    """Reads and pushes the servers answered so far (a message each)."""
    dask_ps.get_parameter_server(client)  # the servers' plugin installed
    got = client.run(lambda dask_worker: dict(dask_worker.extensions["ps"].served))
    return {k: sum(v[k] for v in got.values()) for k in ("pulls", "pushes")}


def test_where_the_totals_are_a_row():
    refreshing = dask_ps.SSP(2, refresh=True)
    assert totals_in_word_table(refreshing, None, 1)
    assert totals_in_word_table(dask_ps.BSP(), None, 1)
    assert not totals_in_word_table(dask_ps.SSP(2), None, 1)  # cached rows: the totals stay fresher (ASP)
    assert not totals_in_word_table(refreshing, dask_ps.ASP(), 1)  # a model of their own: a table of their own
    assert not totals_in_word_table(refreshing, None, 2)  # vocabulary slices read the totals once a clock
    m = LatentDirichletAllocation()
    word, totals = m._consistencies()
    assert totals == word  # read with the rows, under their model


def test_one_read_and_one_push_a_server_per_iteration(client):
    """Under BSP (no start table to poll), each participant sends one read
    and one push per server holding its rows, per iteration; with a totals
    table it sent one more of each to that table's server."""
    X = _corpus()
    iters, P, servers = 15, 2, 2
    before = _served(client)
    m = LatentDirichletAllocation(4, max_iter=iters, evaluate_every=0, consistency=dask_ps.BSP(), n_partitions=P,
                                  client=client, random_state=0).fit(X)
    after = _served(client)
    assert m.n_iter_ == iters
    # + the starting counts (a push), the client's final read of the table, bound_'s scoring
    assert after["pulls"] - before["pulls"] <= P * servers * iters + 2 * servers, (before, after)
    assert after["pushes"] - before["pushes"] <= P * servers * (iters + 1) + servers, (before, after)


# K=3: the rows' change by comparing them; K=120: from the moved tokens (K x rows > 4 x tokens);
# "array": the array sampler's (the GPU's, here with numpy)
@pytest.mark.parametrize("K, sampler", [(3, "dense"), (120, "dense"), (3, "array")])
def test_same_chain_as_a_totals_table(client, K, sampler):
    """BSP, the same seeds: the totals as a row and as a table of their own
    (``totals_consistency=BSP()``) give the same fit, bit for bit -- the row
    holds the exact totals at every clock."""
    X = _corpus()
    kw = dict(max_iter=8, evaluate_every=2, consistency=dask_ps.BSP(), n_partitions=2, client=client,
              random_state=0, sampler=sampler)
    row = LatentDirichletAllocation(K, **kw).fit(X)
    table = LatentDirichletAllocation(K, totals_consistency=dask_ps.BSP(), **kw).fit(X)
    np.testing.assert_array_equal(row.components_, table.components_)
    assert [(it, ll) for it, _, ll in row.loglik_history_] == [(it, ll) for it, _, ll in table.loglik_history_]
    assert row.bound_ == table.bound_
    assert row.components_.sum() == pytest.approx(X.sum() + K * X.shape[1] * row.topic_word_prior_)


def test_partial_fit_starts_from_the_fitted_totals(client):
    """partial_fit: the table starts from the fitted counts, the totals row
    from their column sums; every token is counted once."""
    X = _corpus()
    m = LatentDirichletAllocation(4, max_iter=4, evaluate_every=0, n_partitions=2, client=client, random_state=0)
    m.fit(X[:60])
    m.partial_fit(X[60:])
    assert m.components_.sum() == pytest.approx(X.sum() + 4 * X.shape[1] * m.topic_word_prior_)
    assert np.isfinite(m.bound_)
