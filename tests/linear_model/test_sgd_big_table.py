"""A weights table wider than any one worker holds (issue 23): hashed SGD
participants read and push only their rows (never the whole table, nor a
full-size array of their own), ``ParameterServer.memory`` and ``metrics_``
report the bytes each worker holds, and (slow) a 2^28 float32 table trains
over worker processes whose memory limit is below its size with Dask's
memory monitor on, no worker paused or restarted."""

from __future__ import annotations

import os
import warnings

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dask_ps
from dask_ps.linear_model import SGDClassifier
from dask_ps.linear_model import _rounds


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


def _hashed(n, d, nnz=20, seed=0):
    """A hashed CSR (float32) over ``d`` columns and labels from a sparse model."""
    rng = np.random.default_rng(seed)
    vocab = rng.integers(0, d, 20 * nnz * 50)  # the features in use, spread over the whole table
    cols = vocab[rng.zipf(1.3, size=(n, nnz)) % vocab.shape[0]]
    X = sp.csr_matrix((np.ones(n * nnz, dtype=np.float32), (np.repeat(np.arange(n), nnz), cols.ravel())),
                      shape=(n, d))
    X.sum_duplicates()
    X.data[:] = 1.0
    w = {int(f): rng.normal() for f in np.unique(vocab)}
    score = np.array([sum(w[int(c)] for c in X.indices[X.indptr[i]:X.indptr[i + 1]]) for i in range(n)])
    y = (score + 0.3 * rng.normal(size=n) > np.median(score)).astype(int)
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)
    return X, y


def _weights(metrics):
    """The name of the fit's weights table in a participant's ``metrics_``."""
    return next(t for t in metrics["tables"] if not t.endswith(("-stats", "-progress", "-start")))


def test_participants_read_only_their_rows_of_a_wide_table(client):
    """Default stopping rule (penalty term at each epoch's end): on a table
    wider than ps.sgd.whole-table-bytes no participant reads the whole table
    (before, each read it at every epoch's end), and metrics_ says how many
    bytes of the fit's tables each one's worker held."""
    d = 2 ** 20
    X, y = _hashed(6000, d)
    table_bytes = (d + 1) * 4
    with dask.config.set({"ps.sgd.whole-table-bytes": "1MiB", "ps.sgd.min-samples-per-participant": 1000,
                          "ps.block-bytes": "256KiB"}):  # 16 blocks: on both workers
        est = SGDClassifier(client=client, max_iter=4, random_state=0).fit(X, y)
    assert len(est.metrics_) == 2
    for m in est.metrics_:
        pulled = m["tables"][_weights(m)]["bytes_pulled"]
        assert 0 < pulled < table_bytes / 4, pulled  # the rows of its rounds and features: not a share, let alone all
    held = {m["worker"]: m["table_bytes"] for m in est.metrics_}
    assert len(held) == 2 and all(0 < b < table_bytes for b in held.values())
    assert sum(held.values()) >= table_bytes  # every block is somewhere (plus the small stats table)
    assert all(m["worker_memory_limit"] for m in est.metrics_)
    assert est.score(X, y) > 0.75


def test_a_wide_table_gives_the_same_model_read_by_rows(client):
    """tol=None (no penalty term read): the same fit bit for bit whether the
    participants could hold the whole table or not (BSP: reproducible), and
    a lone participant of a wide table (pushing its rounds' rows, no local
    copy of the table) a model as good as one holding the table. (A lone
    participant that holds the table trains as scikit-learn does, sample by
    sample in scikit-learn's order over the whole table, _lone; one of a
    wide table trains in compacted rounds with lazy regularization: not the
    same arithmetic, so not the same bits.)"""
    X, y = _hashed(4000, 2 ** 18, seed=1)
    kw = dict(client=client, max_iter=3, tol=None, random_state=0)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000}):
        whole = SGDClassifier(**kw).fit(X, y)
        with dask.config.set({"ps.sgd.whole-table-bytes": "64KiB"}):
            rows = SGDClassifier(**kw).fit(X, y)
    np.testing.assert_array_equal(whole.coef_, rows.coef_)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 100_000, "ps.sgd.partial-fit-in-process": False}):
        alone_whole = SGDClassifier(**kw).fit(X, y)
        with dask.config.set({"ps.sgd.whole-table-bytes": "64KiB"}):
            alone_rows = SGDClassifier(**kw).fit(X, y)
    assert len(alone_rows.metrics_) == 1
    m = alone_rows.metrics_[0]
    assert m["tables"][_weights(m)]["bytes_pulled"] < (2 ** 18 + 1) * 4
    assert abs(alone_rows.score(X, y) - alone_whole.score(X, y)) < 0.05


class _PushRecorder:
    """A participant's ctx that records its pushes into one table (a sum)."""

    def __init__(self, table, P):
        self.table, self.n_participants, self.current_clock = table, P, 0

    def push_rows(self, name, rows, delta):
        self.table[rows] += delta


def test_own_models_of_sparse_participants_hold_their_rows_only():
    """Under a staleness bound each participant keeps its model as the table
    counts it (sync_round: the table stays the exact mean of the
    participants' models): on sparse data only the rows of its own features
    and the intercept's, not the table's (d + 1) rows, and the table is
    still the exact mean, row by row."""
    from dask_ps.linear_model import _participant

    rng = np.random.default_rng(0)
    d, K, P = 2 ** 20, 1, 3
    table = np.zeros((d + 1, K))
    parts, feats = [], []
    for rank in range(P):
        f = np.sort(rng.choice(d, size=50, replace=False))
        p = _participant._Participant.__new__(_participant._Participant)
        p.ctx, p.solo, p.sparse, p.xp, p.mine, p._own_rows = _PushRecorder(table, P), False, True, np, None, None
        p.catch_up = None  # the push rule alone (the start of a round is not in this test)
        p.cfg = type("cfg", (), {"table": "w", "start_table": None, "n_features": d, "n_cols": K, "staleness": 2})()
        # rounds whose every step was large (mean rate factor 1): no additive share, the exact mean
        p.rounds = type("rounds", (), {"mean_scale": 1.0})()
        p.X = sp.csr_matrix((np.ones(f.shape[0]), (np.zeros(f.shape[0], dtype=int), f)), shape=(1, d))
        parts.append(p)
        feats.append(np.append(f, d))
    latest = np.zeros((P, d + 1, K))
    for _ in range(30):
        rank = int(rng.integers(P))
        rows = np.sort(rng.choice(feats[rank], size=10, replace=False))
        W0 = rng.normal(size=(rows.shape[0], K))  # any read: stale, another participant's
        W = W0 + rng.normal(size=W0.shape)
        parts[rank].sync_round(rows, W0, W)
        latest[rank][rows] = W
    np.testing.assert_allclose(table, latest.mean(axis=0), atol=1e-12)
    for p, f in zip(parts, feats):
        assert p.mine is None or p.mine.shape == (f.shape[0], K)  # 51 rows, not 2^20 + 1


# a mask over the features and a lookup of positions; the mask only; a table far wider than the data: the sort
@pytest.mark.parametrize("d", [2 ** 12, 2 ** 17, 2 ** 26])
def test_own_rows_are_the_features_present_and_the_intercept(d):
    """A sparse participant's own rows (the rows of its own model under a
    staleness bound) are its distinct features, sorted, then the
    intercept's row, and a round's rows are found at their positions among
    them, whichever way either is found."""
    from dask_ps.linear_model import _participant

    X, _ = _hashed(2000, d, seed=5)
    p = _participant._Participant.__new__(_participant._Participant)
    p.X, p._own_rows = X, None
    p.cfg = type("cfg", (), {"n_features": d})()
    rows = p.own_rows()
    assert rows.dtype == np.int64
    np.testing.assert_array_equal(rows, np.append(np.unique(X.indices), d))
    some = np.sort(np.random.default_rng(0).choice(rows, size=rows.shape[0] // 3, replace=False))
    np.testing.assert_array_equal(p.own_positions(some), np.searchsorted(rows, some))
    assert (p._own_rows[1] is not None) == (d == 2 ** 12)

def test_a_staleness_bound_trains_a_wide_table(client):
    X, y = _hashed(6000, 2 ** 20, seed=2)
    with dask.config.set({"ps.sgd.whole-table-bytes": "1MiB", "ps.sgd.min-samples-per-participant": 1000}):
        ssp = SGDClassifier(client=client, max_iter=3, tol=None, random_state=0, consistency=dask_ps.SSP(1)).fit(X, y)
    assert np.isfinite(ssp.coef_).all() and ssp.score(X, y) > 0.8


def test_lazy_counts_of_a_wide_table_are_per_feature_present():
    """A participant's lazy-regularization counts (the rounds' 1/q) on a table
    much wider than its data hold only the features its rounds touch: no
    array over the table's 2^24 features in the participant's worker."""
    X, y = _hashed(3000, 2 ** 24, seed=3)
    Y = np.where(y[:, None] == 1, 1.0, -1.0)
    train = np.arange(X.shape[0])
    cfg = _rounds._RunConfig(
        table="w", stats_table=None, hp=SGDClassifier()._hyper(1, True), n_features=2 ** 24, n_cols=1,
        n_total=3000, steps_per_epoch=8, clock_every=1, max_iter=2, t0=1.0, seeds=(0,), staleness=0,
        global_stop=False, decision_lag=0, classes=np.array([0, 1]), cw_pos=(1.0,), cw_neg=(1.0,),
        eta_init=(0.0,), col_freq_needed=True, whole_table=False)  # as a fit finds it (ps.sgd.whole-table-bytes)
    c = _rounds._CompiledData.make(cfg, X, Y, np.ones(3000), train)
    assert not c.in_place
    rounds = [train[:400], train[400:]]
    prep = _rounds._RoundPrep(cfg, c, rounds)
    try:
        rnd = prep.take((0, None))
        rows, iq = rnd.rows, rnd.inv_q  # (after the counts)
        present = np.unique(X.indices)
        np.testing.assert_array_equal(prep.count_features, present)
        assert prep.counts.shape[0] == present.shape[0] < 2 ** 16 and prep.counts_of_feature is None
        in_both = np.isin(rows[:-1], np.unique(X[rounds[1]].indices))
        np.testing.assert_array_equal(iq, np.where(in_both, 1.0, 2.0))  # 2 rounds over the rounds touching it
    finally:
        prep.close()


def test_compact_rows_of_a_wide_table_sorts_instead_of_a_lookup_table():
    from dask_ps.linear_model._kernels import compact_rows_xp

    X, _ = _hashed(500, 2 ** 26, seed=4)
    cols, C = compact_rows_xp(X, 2 ** 26, np)  # 4 x nnz << 2^26: the sort
    expect = np.unique(X.indices)
    np.testing.assert_array_equal(cols, expect)
    np.testing.assert_array_equal(C.toarray(), X[:, expect].toarray())


def test_memory_reports_the_bytes_each_server_holds(client):
    ps = dask_ps.ParameterServer(client)
    ps.create_table("big-table-memory", shape=(2 ** 20, 2), dtype="float32", replication=2)
    try:
        mem = ps.memory()
        assert set(mem) == set(ps.servers)
        held = [m["tables"]["big-table-memory"] for m in mem.values()]
        assert sum(held) == 2 * 2 ** 20 * 2 * 4  # both copies of every block
        assert all(m["table_bytes"] >= m["tables"]["big-table-memory"] for m in mem.values())
        assert all(m["memory_limit"] > 0 for m in mem.values())
    finally:
        ps.drop_table("big-table-memory")
    assert all("big-table-memory" not in m["tables"] for m in ps.memory().values())


def _peak_and_pid():
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    return os.getpid(), hwm * 1024


@pytest.mark.slow
def test_a_table_larger_than_any_worker_trains_without_pauses_or_restarts():
    """2^28 float32 weights (1 GiB) over 8 worker processes limited to
    768 MiB each, Dask's memory monitor on at its defaults (pause at 80%,
    restart at 95%): the fit ends, no worker was restarted or paused, each
    held less than its memory limit of the table and their sum is the table.
    (Over 6 such workers, about 200 MiB of blocks each on top of a process
    of about 220 MiB, ``create_table`` refuses the table: past Dask's spill
    threshold less ``ps.worker-memory-headroom``; issue 34 saw those 6
    workers paused 5 times.)"""
    from distributed import Client, LocalCluster

    d, limit = 2 ** 28, 768 * 2 ** 20
    X, y = _hashed(30000, d, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = LocalCluster(n_workers=8, threads_per_worker=1, processes=True, memory_limit=limit,
                               dashboard_address=None)
    with cluster, Client(cluster) as c:
        pids = c.run(os.getpid)
        with dask.config.set({"ps.sgd.min-samples-per-participant": 2000}):  # one participant per worker
            est = SGDClassifier(client=c, max_iter=2, tol=None, random_state=0).fit(X, y)
        peaks = c.run(_peak_and_pid)
        logs = [msg for nanny in (False, True) for lines in c.get_worker_logs(nanny=nanny).values()
                for _, msg in lines if "Pausing worker" in msg or "memory budget" in msg]
        assert c.run(os.getpid) == pids, "a worker was restarted"
    assert not logs, logs
    held = [m["table_bytes"] for m in est.metrics_]
    assert len(held) == 8 and max(held) < limit and sum(held) >= (d + 1) * 4 > limit
    assert all(peak < 0.8 * limit for _, peak in peaks.values()), peaks
    assert est.coef_.shape == (1, d) and est.score(X, y) > 0.6
