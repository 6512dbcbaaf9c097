"""The SGD rounds off the critical path (issue 12): sparse rounds compacted
ahead in a background thread (``_rounds._RoundPrep``), later epochs read in
blocks (``_block_order``), the next round's weights read while a round
trains and clocks sent in the background (the session's ``prefetch_rows`` /
``clock(wait=False)``), the table kept the exact mean of the participants'
models whatever their reads held (``sync_round``), at least
``ps.sgd.min-rounds-per-epoch`` rounds an epoch, and a checkpointed fit that trains a chunk again when its tables were
rolled back to the checkpoint (``dask_ps.RolledBackError``)."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_classification
from sklearn.linear_model import SGDClassifier as SkSGDClassifier

import dask_ps
from dask_ps import RolledBackError
from dask_ps.linear_model import SGDClassifier
from dask_ps.linear_model import _participant, _rounds, _training
from dask_ps.linear_model._in_process import InProcessSession
from ps_fixtures import SGD_BY_ROWS

numba_sgd = pytest.importorskip("dask_ps.linear_model._sgd_numba")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


def _sparse_problem(n=6000, d=5000, nnz=12, seed=0):
    """Hashed-text-like CSR (Zipf columns) with labels from a sparse linear model."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, d + 1) ** 1.1
    cols = rng.choice(d, size=(n, nnz), p=p / p.sum())
    X = sp.csr_matrix((np.ones(n * nnz), (np.repeat(np.arange(n), nnz), cols.ravel())), shape=(n, d))
    X.sum_duplicates()
    w = rng.normal(size=d) * (rng.random(d) < 0.2)
    y = (X @ w + 0.3 * rng.normal(size=n) > 0).astype(int)
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)
    return X, y


# --- the order of later epochs ---------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 5, 63, 64, 65, 130, 4096, 5000])
def test_block_order_permutes_whole_blocks(n):
    """A later epoch's order of a round: every sample once, in blocks of
    ``ORDER_BLOCK`` consecutive samples (the last one shorter), the blocks
    in a random order that changes from epoch to epoch."""
    rng = np.random.RandomState(0)
    block = _rounds.ORDER_BLOCK
    orders = [_rounds._block_order(rng, n) for _ in range(4)]
    for order in orders:
        assert order.dtype == np.int64
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
        position = np.argsort(order)  # where each sample is read
        for a in range(0, n, block):  # each block read whole and in order
            where = position[a:a + block]
            np.testing.assert_array_equal(where, where[0] + np.arange(where.shape[0]))
    if n > 3 * block:
        assert any(not np.array_equal(orders[0], o) for o in orders[1:])


@pytest.mark.parametrize("n, S, m", [(300, 30, 4), (100_000, 400, 50), (70_000, 64, 8)])
def test_fixed_rounds_are_blocks_of_consecutive_samples(n, S, m):
    """The fixed sparse rounds hold every training sample once; on large
    inputs in runs of ``_composition_block`` consecutive samples (cheap to
    compact), and on small ones (fewer than ``ORDER_BLOCK`` blocks a round)
    shuffled sample by sample exactly as ``Generator.permutation`` did."""
    train_idx = np.arange(0, 2 * n, 2)  # a validation split leaves gaps
    run_rounds = []
    epoch0 = _rounds._epoch_rounds(np.random.RandomState(0), True, train_idx, S, m, True, run_rounds, 0, 7)
    assert [g for g, _ in epoch0] == list(range(len(run_rounds))) == list(range(-(-S // m)))
    order = np.concatenate(run_rounds)
    np.testing.assert_array_equal(np.sort(order), train_idx)
    block = _rounds._composition_block(n, len(run_rounds))
    if n < len(run_rounds) * _rounds.ORDER_BLOCK ** 2:
        assert block < _rounds.ORDER_BLOCK
    if block == 1:
        np.testing.assert_array_equal(order, np.random.default_rng([7, 1]).permutation(train_idx))
        return
    pos = np.searchsorted(train_idx, order)  # positions among the training samples
    starts = np.flatnonzero(pos % block == 0)  # each block whole and in order, from a multiple of block
    for a in starts:
        run = pos[a:a + min(block, n - pos[a])]
        np.testing.assert_array_equal(run, pos[a] + np.arange(run.shape[0]))
    assert not np.array_equal(pos, np.arange(n))  # shuffled
    # each round mixes samples from all over the data
    for r in run_rounds:
        assert r.min() < n // 2 < r.max()


# --- rounds compacted ahead ------------------------------------------------------------------


def _config(est, X, P=2, n_total=None, max_iter=3, staleness=2):
    hp = est._hyper(1, sp.issparse(X))
    est.t_ = 1.0
    n = X.shape[0]
    start = _training._Start(W0=np.zeros((X.shape[1] + 1, 1)), seeds=tuple(range(1, P + 1)), name="w")
    return _training._run_config(est, hp, start, "s" if P > 1 else None, staleness, X.shape[1], 1, n_total or n * P,
                                 [n] * P, max_iter, np.array([0, 1]), None, None, sp.issparse(X))


@pytest.mark.parametrize("cache, in_place", [(True, False), (False, False), (False, True), (True, True)])
@pytest.mark.parametrize("penalty", ["l2", "elasticnet", None])
@pytest.mark.parametrize("d", [20000, 200])
@pytest.mark.parametrize("dense_counts", [True, False])
@pytest.mark.parametrize("by_numpy", [False, True], ids=["kernels", "numpy"])
def test_round_prep_builds_what_compact_rows_builds(cache, in_place, penalty, d, dense_counts, by_numpy,
                                                    monkeypatch):
    """``_RoundPrep`` builds each round in its thread as the inline
    compaction did: the touched rows (+ the intercept row), the compact CSR,
    the round's targets and weights, and ``1/q`` of its rows: the epoch's
    rounds over the rounds that touch the feature (lazy regularization gives
    a feature exactly an epoch's regularization); whether rounds are kept
    across epochs (``ps.sgd.round-cache-bytes``) or built again, in any
    order of requests and takes. Rounds built again over a table held
    whole (``in_place``, not with L1) are their rows of the participant's
    CSR itself, with the same touched rows and ``1/q`` (as the epoch's
    rounds and the counts of those touching each row). The counts behind
    ``1/q`` kept per feature of the table or per feature touched (a table
    wider than its data): the same ``1/q``. Built by the compiled kernels
    (rounds not kept are built into the arrays of rounds trained before) or
    by numpy (a small participant's: ``NUMPY_PREP_NONZEROS``): the same
    rounds."""
    X, y = _sparse_problem(d=d)
    if not dense_counts:
        monkeypatch.setattr(_rounds._RoundPrep, "_dense_counts", lambda self: False)
    est = SGDClassifier(penalty=penalty, batch_size=128, max_iter=3)
    if not in_place:
        monkeypatch.setattr(_rounds, "_trains_in_place", lambda cfg, cache: False)
    with dask.config.set({"ps.sgd.clock-samples": 1024, "ps.sgd.round-cache-bytes": "1GiB" if cache else 1}):
        cfg = _config(est, X)
        train_idx = np.arange(X.shape[0])
        Y = np.where(y == 1, 1.0, -1.0)[:, None]
        monkeypatch.setattr(_rounds, "NUMPY_PREP_NONZEROS", X.nnz if by_numpy else 0)
        c = _rounds._CompiledData.make(cfg, X, Y, np.ones(X.shape[0]), train_idx)
    assert c.prep_in_numpy == by_numpy
    assert (c.cache is not None) == cache
    if in_place and penalty == "elasticnet":  # L1's state is per weight of a round: compacted
        assert not c.in_place
        return
    assert c.in_place == in_place
    run_rounds = []
    _rounds._epoch_rounds(np.random.RandomState(0), True, train_idx, cfg.steps_per_epoch, cfg.clock_every, True,
                          run_rounds, 0, 7)
    assert len(run_rounds) >= 4
    prep = _rounds._RoundPrep(cfg, c, run_rounds)
    try:
        bits = np.zeros(X.shape[1] // 64 + 1, dtype=np.uint64)
        rank = np.zeros(bits.shape[0], dtype=np.int64)
        slot = np.full(X.shape[0], -1, dtype=np.int32)
        whole_q = None
        if penalty is not None:  # 1/q: the epoch's rounds over the rounds touching the feature
            touching = sum(np.bincount(np.unique(X[r].indices), minlength=X.shape[1]) for r in run_rounds)
            with np.errstate(divide="ignore"):
                whole_q = len(run_rounds) / touching
        for rid in [2, 0]:
            prep.request(rid)
        recycled = {}  # buffer -> the round handed back in it (rounds not kept: later rounds are built into it)
        reused = 0
        for epoch_order in ([0, 1, 2, 3], [3, 1, 0, 2]):
            for rid in epoch_order:
                assert prep.rows(rid) is prep.rows(rid) or not cache
                rnd = prep.take((rid, None))
                cols, cdata, cind, cptr = numba_sgd.compact_rows(run_rounds[rid], X.data, X.indices, X.indptr,
                                                                 bits, rank, slot)
                np.testing.assert_array_equal(rnd.rows, np.append(cols, X.shape[1]))
                (local, (d2, i2, p2), Yr, swr, rows_again) = rnd.chunks[0]
                assert rnd.in_place == in_place
                if in_place:  # the participant's own CSR, targets and weights, read at the round's samples
                    np.testing.assert_array_equal(local, run_rounds[rid])
                    assert local is rows_again and d2 is c.data and i2 is c.ind and p2 is c.ptr
                    assert Yr is c.Y and swr is c.sw and rnd.n == run_rounds[rid].shape[0]
                    if penalty is not None:  # (R, counts): 1/q = R / counts, where counted per feature
                        share = rnd.inv_q
                        np.testing.assert_array_equal(share[0] / share[1] if dense_counts else share, whole_q[cols])
                    prep.recycle(rnd)
                    continue
                np.testing.assert_array_equal(d2, cdata)
                np.testing.assert_array_equal(i2, cind)
                np.testing.assert_array_equal(p2, cptr)
                np.testing.assert_array_equal(Yr[0], Y[run_rounds[rid], 0])
                np.testing.assert_array_equal(local, np.arange(run_rounds[rid].shape[0]))
                assert rnd.n == run_rounds[rid].shape[0]
                if penalty is None:
                    assert rnd.inv_q is None
                else:
                    np.testing.assert_array_equal(rnd.inv_q, whole_q[cols])
                base = d2.base if d2.base is not None else d2
                reused += recycled.get(id(base), rid) != rid
                prep.recycle(rnd)
                recycled[id(base)] = rid
        assert len(c.cache or {}) == (4 if cache else 0) and not prep.pending
        assert (reused > 0) == (not cache and not in_place and not by_numpy)
        assert not (in_place and prep.spare)  # nothing to build into: no CSR is written
        if penalty is not None and dense_counts:  # one count per feature of the table (int32)
            np.testing.assert_array_equal(prep.counts_of_feature, touching)
            assert prep.counts_of_feature.dtype == np.int32 and prep.count_features is None
        elif penalty is not None:  # counts of the touched features only, not one per feature of the table
            assert prep.count_features.shape[0] == np.count_nonzero(touching) and prep.counts_of_feature is None
    finally:
        prep.close()


@pytest.mark.parametrize("in_place", [True, False])
def test_the_first_round_is_ready_before_the_counts(in_place, monkeypatch):
    """The first round a participant asks for is built before the lazy
    regularization's counts over all the rounds (``_RoundPrep._count``):
    its rows are read and it is trained while they are counted, and it
    takes its ``1/q`` (the same) after its training. Rounds trained in
    place have their second round built before the counts too (its
    features, which the counts reuse): its read starts while the first
    trains."""
    X, y = _sparse_problem(d=20000)
    if not in_place:
        monkeypatch.setattr(_rounds, "_trains_in_place", lambda cfg, cache: False)
    with dask.config.set({"ps.sgd.clock-samples": 1024}):
        cfg = _config(SGDClassifier(batch_size=128), X, max_iter=1)
        train_idx = np.arange(X.shape[0])
        c = _rounds._CompiledData.make(cfg, X, np.where(y == 1, 1.0, -1.0)[:, None], np.ones(X.shape[0]),
                                       train_idx)
    assert c.in_place == in_place and c.lazy
    run_rounds = []
    _rounds._epoch_rounds(np.random.RandomState(0), True, train_idx, cfg.steps_per_epoch, cfg.clock_every, True,
                          run_rounds, 0, 7)
    counting, go = threading.Event(), threading.Event()
    count = _rounds._RoundPrep._count

    def held_count(self):
        counting.set()
        assert go.wait(30)
        count(self)

    monkeypatch.setattr(_rounds._RoundPrep, "_count", held_count)
    prep = _rounds._RoundPrep(cfg, c, run_rounds)
    try:
        prep.request(0)
        prep.request(1)
        rnd = prep.take((0, None))  # while the counts wait
        assert counting.wait(30) and not prep._counted.done()
        assert prep.ready(1) == in_place  # built before the counts where in place
        features = np.unique(X[run_rounds[0]].indices)
        np.testing.assert_array_equal(rnd.rows, np.append(features, X.shape[1]))
        go.set()
        touching = sum(np.bincount(np.unique(X[r].indices), minlength=X.shape[1]) for r in run_rounds)

        def inv_q(share):  # a round trained in place: (R, counts)
            return share[0] / share[1] if in_place else share

        np.testing.assert_array_equal(inv_q(rnd.inv_q), len(run_rounds) / touching[features])
        np.testing.assert_array_equal(inv_q(prep.take((1, None)).inv_q),
                                      len(run_rounds) / touching[np.unique(X[run_rounds[1]].indices)])
    finally:
        go.set()
        prep.close()


def test_a_lone_request_is_counted():
    """A participant retried at an epoch's last round asks for that round
    alone: its rounds (trained in place) are counted all the same."""
    X, y = _sparse_problem(d=20000)
    with dask.config.set({"ps.sgd.clock-samples": 1024}):
        cfg = _config(SGDClassifier(batch_size=128), X, max_iter=1)
        train_idx = np.arange(X.shape[0])
        c = _rounds._CompiledData.make(cfg, X, np.where(y == 1, 1.0, -1.0)[:, None], np.ones(X.shape[0]),
                                       train_idx)
    assert c.in_place and c.lazy
    run_rounds = []
    _rounds._epoch_rounds(np.random.RandomState(0), True, train_idx, cfg.steps_per_epoch, cfg.clock_every, True,
                          run_rounds, 0, 7)
    last = len(run_rounds) - 1
    prep = _rounds._RoundPrep(cfg, c, run_rounds)
    try:
        prep.request(last)
        R, counts = prep.take((last, None)).inv_q
        touching = sum(np.bincount(np.unique(X[r].indices), minlength=X.shape[1]) for r in run_rounds)
        np.testing.assert_array_equal(counts, touching[np.unique(X[run_rounds[last]].indices)])
        assert R == len(run_rounds)
    finally:
        prep.close()


@pytest.mark.parametrize("max_iter", [2, 3, 4])
def test_a_run_of_a_few_epochs_trains_in_place_bit_for_bit(client, monkeypatch, max_iter):
    """A run of at most ``IN_PLACE_EPOCHS`` epochs over a table the
    participants may hold whole trains its rounds in place (no round is
    compacted: over so few epochs the compaction cost more than it saved),
    its kept rounds only their rows and 1/q, and the model is the
    compacted rounds' bit for bit, the later epochs' reordered rounds
    included; a longer run compacts them."""
    X, y = _sparse_problem(n=30000, d=20000)
    calls = {"compact_rows": 0}
    compact_rows = numba_sgd.compact_rows

    def counted(*args):
        calls["compact_rows"] += 1
        return compact_rows(*args)

    models = {}
    monkeypatch.setattr(_rounds, "NUMPY_PREP_NONZEROS", 0)  # the kernels build the rounds (counted)
    for in_place in (True, False):
        with monkeypatch.context() as m:
            m.setattr(numba_sgd, "compact_rows", counted)
            if not in_place:
                m.setattr(_rounds, "_trains_in_place", lambda cfg, cache: False)
            with warnings.catch_warnings(), dask.config.set(SGD_BY_ROWS):  # 2 participants, 5 rounds
                warnings.simplefilter("ignore")
                est = SGDClassifier(max_iter=max_iter, tol=None, random_state=0, client=client, n_jobs=2,
                                    average=True).fit(X, y)
        models[in_place] = (est.coef_, est.intercept_, calls["compact_rows"])
        calls["compact_rows"] = 0
        rounds = sum(m["clock"] for m in est.metrics_) // max_iter  # the participants' rounds of an epoch
    assert rounds == 2 * 5  # 15k samples a participant: at least 4 rounds (SGD_BY_ROWS)
    assert models[False][2] == rounds  # each compacted once and kept
    assert models[True][2] == (0 if max_iter <= _rounds.IN_PLACE_EPOCHS else rounds)
    np.testing.assert_array_equal(models[True][0], models[False][0])
    np.testing.assert_array_equal(models[True][1], models[False][1])


def test_rounds_of_a_one_epoch_run_are_not_kept():
    """A run of one epoch (``partial_fit``, ``max_iter=1``) reads each
    round once: it keeps none (its buffers are recycled instead)."""
    X, _ = _sparse_problem()
    est = SGDClassifier(batch_size=128)
    for max_iter, kept in ((1, False), (2, True)):
        cfg = _config(est, X, max_iter=max_iter)
        c = _rounds._CompiledData.make(cfg, X, np.ones((X.shape[0], 1)), np.ones(X.shape[0]),
                                       np.arange(X.shape[0]))
        assert (c.cache is not None) == kept


@pytest.mark.parametrize("n_features", [1, 64, 65, 5000])
def test_round_features_are_the_rows_features_sorted(n_features):
    """``round_features``: the sorted features of the given CSR rows (a
    round trained in place reads and writes these rows of the table), its
    bitmap left zeroed for the next round; with ``counts``, each feature
    found counted once per call (the rounds touching it), without, nothing
    counted."""
    X = sp.random(300, n_features, density=min(1.0, 8 / n_features), format="csr", random_state=n_features)
    bits = np.zeros(n_features // 64 + 1, dtype=np.uint64)
    rng = np.random.default_rng(0)
    counts = np.zeros(n_features, dtype=np.int32)
    expected = np.zeros(n_features, dtype=np.int32)
    for rows in (rng.permutation(300)[:120], rng.permutation(300)[:7], np.arange(0), rng.permutation(300)[:50]):
        for counted in (counts, np.zeros(0, dtype=np.int32)):
            cols = numba_sgd.round_features(rows, X.indices, X.indptr, bits, counted)
            assert cols.dtype == np.int64
            np.testing.assert_array_equal(cols, np.unique(X[rows].indices))
            assert not bits.any()
        expected[np.unique(X[rows].indices)] += 1
        np.testing.assert_array_equal(counts, expected)


def test_sgd_round_rescales_only_the_touched_weights():
    """``sgd_round`` over a whole table with the round's rows as ``touched``
    leaves every other weight as it was (a single pass's in-place rounds:
    the weight scale is applied to the round's rows only), and the touched
    ones are the weights trained over all rows."""
    X = sp.random(200, 500, density=0.01, format="csr", random_state=1)
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)
    rows = np.arange(0, 200, 2)
    touched = np.unique(X[rows].indices).astype(np.int64)
    y = np.where(np.arange(200) % 3 == 0, 1.0, -1.0)
    w0 = np.linspace(-1.0, 1.0, 500)

    def train(w, touched):
        return numba_sgd.sgd_round(
            False, np.zeros((1, 1)), X.data, X.indices, X.indptr, rows, y, np.ones(200), w, np.zeros(1), 0.0, 0.0,
            numba_sgd.LOSS_IDS["log_loss"], 0.0, 2, 1e-2, 0.15, 2, 0.0, 0.0, 0.5, 10.0, True, 1.0, 1.0, 1.0, 0, 1.0,
            1.0, 1e-9, np.zeros(1), 0.0, 1.0, np.array([1.0, 0.0, 1.0, 0.0, 0.0]), False, touched)

    everything, only = w0.copy(), w0.copy()
    assert train(everything, np.zeros(0, dtype=np.int64)) == train(only, touched)
    untouched = np.setdiff1d(np.arange(500), touched)
    assert untouched.size and touched.size
    np.testing.assert_array_equal(only[untouched], w0[untouched])
    np.testing.assert_array_equal(only[touched], everything[touched])
    assert not np.array_equal(everything[untouched], w0[untouched])  # decayed over all rows


@pytest.mark.parametrize("kwargs", [{}, {"average": True}, {"n_classes": 3}, {"penalty": "elasticnet"}])
def test_single_pass_trains_rounds_in_place_bit_for_bit(client, monkeypatch, kwargs):
    """A single pass (``max_iter=1``: rounds read once) over a table the
    participants may hold whole trains its rounds in place in each
    participant's CSR: no round is compacted (``compact_rows`` never runs),
    and the model is the compacted rounds' one bit for bit. An L1 penalty
    (elasticnet) keeps compacted rounds."""
    kwargs = dict(kwargs)
    n_classes = kwargs.pop("n_classes", 2)
    X, y = _sparse_problem(n=30000, d=20000)
    if n_classes > 2:
        y = y + (np.arange(y.shape[0]) % 7 == 0)
    calls = {"compact_rows": 0, "round_features": 0}

    def counted(name):
        fn = getattr(numba_sgd, name)

        def call(*args):
            calls[name] += 1
            return fn(*args)
        return call

    models = {}
    monkeypatch.setattr(_rounds, "NUMPY_PREP_NONZEROS", 0)  # the kernels build the rounds (counted)
    for in_place in (True, False):
        with monkeypatch.context() as m:
            for name in calls:
                m.setattr(numba_sgd, name, counted(name))
            if not in_place:
                m.setattr(_rounds, "_trains_in_place", lambda cfg, cache: False)
            with warnings.catch_warnings(), dask.config.set(SGD_BY_ROWS):  # 2 participants, 5 rounds
                warnings.simplefilter("ignore")
                est = SGDClassifier(max_iter=1, tol=None, random_state=0, client=client, n_jobs=2, **kwargs)
                est.fit(X, y)
        assert len(est.metrics_) == 2
        models[in_place] = (est.coef_, est.intercept_, dict(calls))
        calls.update(dict.fromkeys(calls, 0))
    l1 = kwargs.get("penalty") == "elasticnet"
    R = sum(m["clock"] for m in est.metrics_)  # the participants' rounds (one epoch)
    assert R == 2 * 5  # 15k samples a participant: at least 4 rounds (SGD_BY_ROWS)
    # 2 participants x 5 rounds, whose features the lazy regularization counts after the first round
    # is built (and in place, reuses): compacted first, that round's features are compact_rows'
    assert models[True][2] == ({"compact_rows": R, "round_features": R - 2} if l1 else
                               {"compact_rows": 0, "round_features": R})
    assert models[False][2] == {"compact_rows": R, "round_features": R - 2}
    np.testing.assert_array_equal(models[True][0], models[False][0])
    np.testing.assert_array_equal(models[True][1], models[False][1])


class _TwoParticipantsInProcess(InProcessSession):
    """One of two participants, over tables in this process (run one after
    the other: the second reads the first's pushes)."""

    n_participants = 2

    def __init__(self, tables, rank):
        super().__init__()
        self.tables = tables
        self.rank = rank

    def clock(self):
        self.current_clock += 1


@pytest.mark.parametrize("cache", [True, False])
def test_participant_with_rounds_built_ahead_is_bitwise_the_same(cache):
    """The participant's pushes do not depend on whether its rounds were
    kept or built again each epoch, nor on the background thread: two
    participants in turn over local tables end with the same table, bitwise,
    as with rounds rebuilt in every epoch."""
    X, y = _sparse_problem(n=4000)
    est = SGDClassifier(loss="log_loss", batch_size=128, max_iter=4, tol=None, random_state=0)
    results = []
    for budget in ("1GiB", 1):
        with dask.config.set({"ps.sgd.clock-samples": 512, "ps.sgd.round-cache-bytes": budget}):
            cfg = _config(est, X[:2000], max_iter=4)
            tables = {"w": np.zeros((X.shape[1] + 1, 1)), "s": np.zeros((4, 6))}
            for rank in (0, 1):
                part = _participant._PartData(X[rank * 2000:(rank + 1) * 2000], y[rank * 2000:(rank + 1) * 2000],
                                              np.ones(2000))
                res = _participant._participant_loop(_TwoParticipantsInProcess(tables, rank), part, cfg)
                assert res["profile"]["round_prep_seconds"] >= 0 and res["profile"]["kernel_seconds"] > 0
            results.append(tables["w"].copy())
    np.testing.assert_array_equal(results[0], results[1])
    assert np.abs(results[0]).max() > 0


def test_min_rounds_per_epoch():
    """With several participants an epoch has at least
    ``ps.sgd.min-rounds-per-epoch`` rounds (where it has that many
    minibatches; default 8, so that SSP(2) never spans whole epochs of a
    small input); a lone participant keeps one round an epoch."""
    X = sp.random(16000, 50, density=0.1, format="csr", random_state=0)
    est = SGDClassifier(batch_size=256)
    cfg = _config(est, X)  # 63 minibatches: at least 8 rounds of them
    assert cfg.steps_per_epoch == 63 and -(-cfg.steps_per_epoch // cfg.clock_every) >= 8
    with dask.config.set({"ps.sgd.min-rounds-per-epoch": 1}):
        assert _config(est, X).clock_every == 63  # clock-samples 65536 makes one round of them
    with dask.config.set({"ps.sgd.min-rounds-per-epoch": 4}):
        cfg = _config(est, X)
        assert -(-cfg.steps_per_epoch // cfg.clock_every) >= 4
        solo = _config(est, X, P=1)
        assert solo.clock_every == solo.steps_per_epoch
        big_X = sp.random(450000, 5, density=0.2, format="csr", random_state=0)
        big = _config(SGDClassifier(batch_size=2048), big_X)
        assert big.steps_per_epoch == 220 and big.clock_every == 220 // 4  # 4 rounds of 112k samples
        with dask.config.set({"ps.sgd.clock-samples": 65536}):
            # large inputs: rounds of at most ps.sgd.clock-samples
            assert _config(SGDClassifier(batch_size=2048), big_X).clock_every == 65536 // 2048
    with dask.config.set({"ps.sgd.min-rounds-per-epoch": 100}):
        assert _config(est, X).clock_every == 1


def _rounds_per_epoch(cfg):
    return -(-cfg.steps_per_epoch // cfg.clock_every)


def test_bsp_min_rounds_per_epoch():
    """Under BSP (staleness 0) an epoch has at least
    ``ps.sgd.bsp-min-rounds-per-epoch`` rounds (1), not
    ``ps.sgd.min-rounds-per-epoch`` (8: a staleness bound's reason), and a
    round up to ``ps.sgd.clock-samples`` (131072) samples: a participant of
    450k samples clocks 4 times an epoch instead of 9 (issue 23); a small
    input clocks once an epoch (a clock's sync is more than its round's
    compute there), but a single pass averages the participants' models
    at least ``_training.MIN_AVERAGES`` (4) times."""
    big = sp.random(450000, 5, density=0.2, format="csr", random_state=0)
    est = SGDClassifier(batch_size=2048)
    assert _rounds_per_epoch(_config(est, big, staleness=0, max_iter=5)) == 4
    assert _rounds_per_epoch(_config(est, big, staleness=2)) == 9  # SSP(2): at least 8 rounds
    small = sp.random(16000, 50, density=0.1, format="csr", random_state=0)
    for max_iter, least in ((1, 4), (2, 1), (4, 1), (1000, 1)):  # 63 minibatches
        rounds = _rounds_per_epoch(_config(SGDClassifier(batch_size=256), small, staleness=0, max_iter=max_iter))
        assert least <= rounds < 2 * least, (max_iter, rounds)
    assert _rounds_per_epoch(_config(SGDClassifier(batch_size=20000), small, staleness=0, max_iter=1)) == 4  # compiled
    with dask.config.set({"ps.sgd.clock-samples": 32768}):  # a round never has more than clock-samples
        cfg = _config(est, big, staleness=0)
        assert cfg.clock_every * (450000 // cfg.steps_per_epoch) <= 32768 and _rounds_per_epoch(cfg) == 14
    with dask.config.set({"ps.sgd.bsp-min-rounds-per-epoch": 8}):
        assert _rounds_per_epoch(_config(est, big, staleness=0)) == 9
    with dask.config.set({"ps.sgd.bsp-min-rounds-per-epoch": 4}):
        assert 4 <= _rounds_per_epoch(_config(SGDClassifier(batch_size=256), small, staleness=0, max_iter=1000)) < 8
    assert _config(est, big, P=1, staleness=0).clock_every == 220  # a lone participant: one round an epoch


# --- the table is the exact mean of the participants' models ------------------------------


class _PushRecorder:
    """A participant's ctx that records its pushes into one table (a sum)."""

    def __init__(self, table, P):
        self.table, self.n_participants, self.current_clock = table, P, 0

    def push(self, name, delta):
        self.table += delta

    def push_rows(self, name, rows, delta):
        self.table[rows] += delta


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("P", [2, 4])
def test_table_is_the_mean_of_the_models_whatever_the_reads_held(sparse, P):
    """Each participant trains its rounds from arbitrary reads (stale,
    missing the others' pushes, as SSP allows) and pushes through
    ``sync_round``: the table is always the start plus the mean of the
    participants' latest models' distances from it, row by row (a row a
    participant never trained stays the start there). With the old rule,
    ``(W - read) / P``, the same rounds left the table far from that mean."""
    rng = np.random.default_rng(0)
    d, K = 30, 2
    start = np.zeros((d + 1, K))
    table = start.copy()
    parts = []
    for rank in range(P):
        p = _participant._Participant.__new__(_participant._Participant)
        p.ctx, p.solo, p.sparse, p.xp, p.mine, p._own_rows = _PushRecorder(table, P), False, sparse, np, None, None
        p.catch_up = None  # the push rule is the same with it: only the start of a round differs
        p.cfg = type("cfg", (), {"table": "w", "start_table": None, "n_features": d, "n_cols": K, "staleness": 2})()
        p.X = sp.csr_matrix(np.ones((1, d))) if sparse else np.zeros((1, d))  # sparse: every feature its own
        p.rounds = type("rounds", (), {"mean_scale": 1.0})()  # every sample's own step large: no additive share
        parts.append(p)
    latest = np.repeat(start[None], P, axis=0)
    for _ in range(20):
        rank = int(rng.integers(P))
        p = parts[rank]
        rows = np.sort(rng.choice(d + 1, size=8, replace=False)) if sparse else None
        read = rng.normal(size=(d + 1, K))  # anything: stale, partial, another participant's
        W0 = read if rows is None else read[rows]
        W = W0 + rng.normal(size=W0.shape)
        p.sync_round(rows, W0, W)
        if rows is None:
            latest[rank] = W
        else:
            latest[rank][rows] = W
    np.testing.assert_allclose(table, latest.mean(axis=0), atol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("s", [1, 3])
def test_small_step_rounds_push_the_additive_delta_under_a_bound(sparse, s):
    """Rounds whose samples all trained at ``P`` times scikit-learn's rate
    (``mean_scale = P``: small own steps) push ``(W - M) / P + (M - W0) / (P s)``
    under SSP(s): at ``s = 1`` the additive delta ``(W - W0) / P`` of
    SSP-SGD, which loses nothing of what a stale read missed; at ``s = 3``
    a third of it on top of the exact mean's push (``additive_share``)."""
    rng = np.random.default_rng(1)
    d, K, P = 12, 1, 4
    table = np.zeros((d + 1, K))
    p = _participant._Participant.__new__(_participant._Participant)
    p.ctx, p.solo, p.sparse, p.xp, p.mine, p._own_rows = _PushRecorder(table, P), False, sparse, np, None, None
    p.catch_up = None
    p.cfg = type("cfg", (), {"table": "w", "start_table": None, "n_features": d, "n_cols": K, "staleness": s})()
    p.X = sp.csr_matrix(np.ones((1, d))) if sparse else np.zeros((1, d))
    p.rounds = type("rounds", (), {"mean_scale": float(P)})()
    assert p.additive_share() == pytest.approx(1.0 / s)
    mine = np.zeros((d + 1, K))
    expected = table.copy()
    for _ in range(6):
        rows = np.sort(rng.choice(d + 1, size=5, replace=False)) if sparse else None
        read = rng.normal(size=(d + 1, K))
        W0 = read if rows is None else read[rows]
        W = W0 + rng.normal(size=W0.shape)
        at = slice(None) if rows is None else rows
        expected[at] += (W - mine[at]) / P + (mine[at] - W0) / (P * s)
        mine[at] = W
        p.sync_round(rows, W0, W)
        np.testing.assert_allclose(table, expected, atol=1e-12)
    p.rounds.mean_scale = 1.0
    assert p.additive_share() == 0.0


# --- on a cluster: reads a round ahead, background clocks -----------------------------------


@pytest.mark.parametrize("consistency", [dask_ps.BSP(), dask_ps.SSP(2)])
@pytest.mark.parametrize("sparse", [True, False])
def test_fit_reads_ahead_and_matches_the_fit_without(client, consistency, sparse):
    """Two participants read each round's weights a round ahead (prefetch
    hits in ``metrics_``) and clock in the background; the model's test
    accuracy is within a point of the same fit without overlap
    (``ps.sgd.overlap: false``) and two of scikit-learn's. (Not equal, even
    under BSP: a read at clock c holds every update of the clocks below c
    and may hold some of clock c already, from a participant ahead.)
    ``metrics_`` splits each participant's time (compute, blocked, rounds'
    preparation, kernel)."""
    if sparse:
        X, y = _sparse_problem(n=24000, d=20000)
    else:
        X, y = make_classification(24000, 20, n_informative=5, n_redundant=0, class_sep=2.0, random_state=0)
    Xtr, ytr, Xte, yte = X[:20000], y[:20000], X[20000:], y[20000:]
    kw = dict(loss="log_loss", max_iter=4, tol=None, random_state=0, batch_size=256, client=client,
              consistency=consistency)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000, "ps.sgd.clock-samples": 2048}):
        ahead = SGDClassifier(**kw).fit(Xtr, ytr)
        with dask.config.set({"ps.sgd.overlap": False}):
            plain = SGDClassifier(**kw).fit(Xtr, ytr)
    assert len(ahead.metrics_) == 2
    for m in ahead.metrics_:
        hits = sum(t.get("prefetch_hits", 0) for t in m["tables"].values())
        assert hits > 0, m["tables"]
        assert "prefetch_rows" in m["ps_seconds_by_call"] or "prefetch" in m["ps_seconds_by_call"]
        for key in ("compute_seconds", "ps_blocked_seconds", "round_prep_seconds", "kernel_seconds"):
            assert m[key] >= 0, key
    for m in plain.metrics_:
        assert not any(t.get("prefetch_hits", 0) for t in m["tables"].values())
    # (six seeds each, SSP(2): sparse 0.839-0.845 ahead, 0.834-0.848 not; dense 0.982-0.988, 0.985-0.988)
    assert abs(ahead.score(Xte, yte) - plain.score(Xte, yte)) <= 0.015
    sk = SkSGDClassifier(loss="log_loss", max_iter=4, tol=None, random_state=0).fit(Xtr, ytr)
    assert ahead.score(Xte, yte) >= sk.score(Xte, yte) - 0.015
    assert set(ahead._fit_profile) >= {"parts_seconds", "tables_seconds", "run_seconds", "pull_seconds"}


def _rolled_back_once(monkeypatch, fail_run, failed=False):
    """Make ``ParameterServer.run``'s ``fail_run``-th call (1-based) end as
    one does after a worker holding blocks of the weights table died with
    ``replication=1``: the lost blocks hold the checkpoint's values (here:
    the whole table is mixed with garbage, worse), and the run finishes and
    raises ``RolledBackError``, or (``failed``) fails with the ``PSError`` of
    a read that found the blocks unreachable while they were restored, and
    ``ps.rollbacks(table)`` lists the restore until the table is loaded."""
    real_run, real_load = dask_ps.ParameterServer.run, dask_ps.ParameterServer.load
    calls, listed = [], {}

    def run(self, fn, parts, **kwargs):
        results = real_run(self, fn, parts, **kwargs)
        calls.append(kwargs["cfg"].epoch0)
        if len(calls) != fail_run:
            return results
        table = kwargs["cfg"].table
        self.push(table, np.full(self.spec(table).shape, 1e3))
        path = fail_run_path[0]
        record = {"table": table, "blocks": [0], "reason": "worker tcp://x left", "checkpoint": path,
                  "checkpoint_time": time.time() - 1, "restored_at": time.time(), "clocks": [3, 3],
                  "run_started": time.time() - 2}
        if failed:
            listed[table] = [record]
            raise dask_ps.PSError(f"table {table!r}: blocks [0] stayed unreachable for ps.timeouts.failover")
        raise RolledBackError.from_run("fake-run", [record], results)

    def load(self, path, tables=None, **kwargs):
        listed.clear()  # a load makes new tables
        return real_load(self, path, tables=tables, **kwargs)

    fail_run_path = []
    monkeypatch.setattr(dask_ps.ParameterServer, "run", run)
    monkeypatch.setattr(dask_ps.ParameterServer, "load", load)
    monkeypatch.setattr(dask_ps.ParameterServer, "rollbacks", lambda self, table=None: list(listed.get(table, [])))
    monkeypatch.setattr(dask_ps.ParameterServer, "wait_for_placement", lambda self: None)
    return calls, fail_run_path


@pytest.mark.parametrize("participants", [1, 2])
@pytest.mark.parametrize("sparse,failed", [(False, False), (True, False), (True, True)])
def test_rolled_back_chunk_is_trained_again_from_the_checkpoint(client, tmp_path, monkeypatch, sparse, failed,
                                                                 participants):
    """A checkpointed fit whose run ends in ``RolledBackError`` (its tables
    were restored from the checkpoint during the run), or fails while they
    are restored (``failed``: a read found the blocks unreachable; the
    restore is listed by ``ps.rollbacks``), loads the checkpoint
    again, trains that chunk again, records it in ``rollbacks_`` and warns;
    the model is the undisturbed fit's (one participant: bitwise; two: the
    same training accuracy within two points, as two undisturbed fits). A rollback
    from another checkpoint path is not this fit's to repair: the error is
    raised."""
    if sparse:
        X, y = _sparse_problem(n=12000, d=3000)
    else:
        X, y = make_classification(12000, 20, n_informative=5, n_redundant=0, class_sep=2.0, random_state=0)
    kw = dict(loss="log_loss", max_iter=6, tol=None, random_state=0, client=client, checkpoint_every=2,
              consistency=dask_ps.BSP())
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000 if participants == 2 else 100000}):
        quiet = SGDClassifier(**kw, checkpoint=str(tmp_path / "quiet")).fit(X, y)
        assert len(quiet.metrics_) == participants
        assert quiet.rollbacks_ == [] and len(quiet.run_ids_) == 3
        path = str(tmp_path / "disturbed")
        calls, where = _rolled_back_once(monkeypatch, fail_run=2, failed=failed)  # epochs 2-3, after the first save
        where.append(path)
        with pytest.warns(RuntimeWarning, match="trained again|training again"):
            disturbed = SGDClassifier(**kw, checkpoint=path).fit(X, y)
        assert calls == [0, 2, 2, 4]  # the second chunk ran twice
        [rb] = disturbed.rollbacks_
        assert rb["epochs"] == [2, 4] and rb["resumed_from_epoch"] == 2
        assert rb["run_id"] == ("(a failed run)" if failed else "fake-run")
        assert rb["rollbacks"][0]["checkpoint"] == path and len(disturbed.run_ids_) == 3
        if participants == 1:
            np.testing.assert_array_equal(disturbed.coef_, quiet.coef_)
            np.testing.assert_array_equal(disturbed.intercept_, quiet.intercept_)
        else:
            assert abs(disturbed.score(X, y) - quiet.score(X, y)) <= 0.02
        assert disturbed.n_iter_ == quiet.n_iter_ == 6
        # A rollback to a checkpoint this fit did not write: raised as it is.
        monkeypatch.undo()
        calls, where = _rolled_back_once(monkeypatch, fail_run=2, failed=failed)
        where.append(str(tmp_path / "elsewhere"))
        with pytest.raises(dask_ps.PSError if failed else RolledBackError):
            SGDClassifier(**kw, checkpoint=str(tmp_path / "third")).fit(X, y)


@pytest.mark.slow  # 30-90 s on a loaded 2-core machine: a 3-worker cluster, a kill, a chunk trained twice
def test_rolled_back_fit_survives_a_killed_block_holder(tmp_path):
    """kill -9 of a worker that holds blocks of the weights table but no
    data, in the second chunk of a fit with ``checkpoint`` and
    ``replication=1``: the scheduler restores its blocks from the checkpoint
    saved after the first chunk, ``ps.run`` raises ``RolledBackError``, and
    the fit loads the checkpoint, trains the chunk again and completes,
    within two points of test accuracy of the undisturbed fit."""
    import dask.array as da
    from distributed import Client, LocalCluster

    X, y = make_classification(120000, 20, n_informative=10, random_state=0)
    X = (X - X.mean(0)) / X.std(0)
    Xtr, ytr, Xte, yte = X[:100000], y[:100000], X[100000:], y[100000:]
    with dask.config.set({"ps.block-bytes": "64B"}), \
            LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as c:
        ps = dask_ps.get_parameter_server(c)
        workers = sorted(c.scheduler_info()["workers"])
        data_workers, victim = workers[:2], workers[2]
        blocks_x, blocks_y = [], []
        for i, w in enumerate(data_workers):  # the participants' data on two workers, none on the victim
            a, b = i * 50000, (i + 1) * 50000
            fx = c.scatter(Xtr[a:b], workers=[w], hash=False)
            fy = c.scatter(ytr[a:b], workers=[w], hash=False)
            blocks_x.append(da.from_delayed(fx, shape=(b - a, 20), dtype=X.dtype))
            blocks_y.append(da.from_delayed(fy, shape=(b - a,), dtype=y.dtype))
        dX, dy = da.concatenate(blocks_x), da.concatenate(blocks_y)
        kw = dict(loss="log_loss", max_iter=20, tol=None, random_state=0, client=c, batch_size=64,
                  checkpoint_every=2)
        quiet = SGDClassifier(**kw, checkpoint=str(tmp_path / "quiet")).fit(dX, dy)
        path = tmp_path / "disturbed"
        killed = {}

        def kill_the_victim_in_the_second_chunk():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (path / "manifest.json").exists():
                time.sleep(0.01)
            time.sleep(0.05)  # into the second chunk's run (a kill during the save is handled too)
            names = [t for t in ps.tables() if t.startswith("dask_ps-sgd-") and not t.endswith("-stats")]
            if names and any(p.worker == victim for p in ps.placement(names[0])):
                os.kill(c.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
                killed["at"] = time.monotonic()

        killer = threading.Thread(target=kill_the_victim_in_the_second_chunk, daemon=True)
        killer.start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            disturbed = SGDClassifier(**kw, checkpoint=str(path)).fit(dX, dy)
        killer.join(timeout=5)
        assert killed, "the victim held no block of the weights table, or was not killed"
        assert disturbed.rollbacks_, "the fit was not rolled back (the kill came after the run?)"
        assert any("training again" in str(w.message) for w in caught)
        assert disturbed.rollbacks_[0]["resumed_from_epoch"] >= 2
        assert disturbed.n_iter_ == quiet.n_iter_ == 20
        acc_quiet, acc = quiet.score(Xte, yte), disturbed.score(Xte, yte)
        assert abs(acc - acc_quiet) <= 0.02, (acc, acc_quiet)


def test_in_process_session_sums_duplicate_rows_as_a_session_does():
    """The in-process participant's push_rows sums duplicate rows (np.add.at),
    as a session's push_rows does on a sum table; assign keeps the last."""
    s = InProcessSession()
    s.create_table("w", np.zeros((4, 2)))
    s.create_table("a", np.zeros((4, 2)), assign=True)
    rows = np.array([2, 0, 2])
    vals = np.array([[1.0, 1.0], [5.0, 5.0], [2.0, 3.0]])
    s.push_rows("w", rows, vals)
    s.push_rows("a", rows, vals)
    np.testing.assert_array_equal(s.pull("w"), [[5, 5], [0, 0], [3, 4], [0, 0]])
    np.testing.assert_array_equal(s.pull("a"), [[5, 5], [0, 0], [2, 3], [0, 0]])


def test_a_received_sparse_block_is_trained_in_place():
    """A participant's part made of one CSR block uses the block's arrays:
    a block received from another process holds views of the message's
    frames, which ``csr_matrix(X)`` copied at every fit (scipy's prune)."""
    from dask_ps.linear_model._data import _assemble_part

    X = sp.random(500, 40, density=0.1, format="csr", random_state=0, dtype=np.float64)
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)

    def framed(a):  # as distributed's deserialization leaves it: a view of a uint8 frame
        frame = np.empty(a.nbytes + 64, dtype=np.uint8)
        view = frame[:a.nbytes].view(a.dtype)
        view[:] = a
        return view

    block = sp.csr_matrix((framed(X.data), framed(X.indices), framed(X.indptr)), shape=X.shape)
    block.data, block.indices, block.indptr = framed(X.data), framed(X.indices), framed(X.indptr)
    y = np.arange(500) % 2
    spec = {"estimator": "SGDClassifier", "n_features": 40, "classifier": True}
    part = _assemble_part([(block, y)], spec)
    assert part.X.data is block.data and part.X.indices is block.indices
    assert (part.X != X).nnz == 0


@pytest.mark.parametrize("sparse", [True, False])
def test_a_parts_check_is_scikit_learns(sparse):
    """A part's validation (``_assemble_part``) checks X's values for NaN/Inf
    in one pass that sums their squares: scikit-learn's error where a value
    is NaN or Inf; finite values whose squares overflow are accepted."""
    from sklearn.utils import check_array

    from dask_ps._estimators import InvalidPart
    from dask_ps.linear_model._data import _assemble_part

    rng = np.random.RandomState(0)
    X = sp.random(300, 20, density=0.2, format="csr", random_state=0) if sparse else rng.randn(300, 20)
    y = np.arange(300) % 2
    spec = {"estimator": "SGDClassifier", "n_features": 20, "classifier": True}
    part = _assemble_part([(X, y)], spec)
    assert not isinstance(part, InvalidPart)
    for bad in (np.nan, np.inf, -np.inf):
        Xb = X.copy()
        (Xb.data if sparse else Xb.reshape(-1))[3] = bad
        with pytest.raises(ValueError) as theirs:
            check_array(Xb, accept_sparse="csr", input_name="X", estimator="SGDClassifier")
        invalid = _assemble_part([(Xb, y)], spec)
        assert isinstance(invalid, InvalidPart) and str(invalid.error) == str(theirs.value)
    Xh = X.copy()
    (Xh.data if sparse else Xh.reshape(-1))[5] = 1e200  # finite: its square is not
    assert not isinstance(_assemble_part([(Xh, y)], spec), InvalidPart)
