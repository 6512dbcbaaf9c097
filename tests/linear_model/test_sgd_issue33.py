"""Issue 33's failure rows, off the default path: each case scores at least
scikit-learn's worst of five seeds minus 0.02 (test R^2 or accuracy) on
several participants, on the data of ``benchmarks/sgd_issue_cases.py``
(which prints the before/after table, docs/benchmarks.md "SGD quality").

What each caught on ``1322df5`` (the rate scaled from the participant's
mean squared row norm, averaging weighted by one participant's samples,
sparse rounds composed of runs of the input's stored order):

* ``average=True``, huber: R^2 0.961 (2 participants), 0.822 (4) against
  0.995; epsilon_insensitive on 4: 0.954-0.959 against 0.997;
* heavy-tailed row norms, squared_error, constant 0.01, 10 epochs: R^2
  diverged (below -1e6) on 2 and 4 participants against 0.371-0.392;
* text-like rows stored sorted by label, one epoch: accuracy 0.51-0.71 (2),
  0.52-0.75 (4) against 0.764-0.778; with the default stopping rule 0.62-0.76
  after 6 epochs against 0.788-0.794 after 17-21.
"""

from __future__ import annotations

import pathlib
import sys

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

from dask_ps.linear_model._kernels import sample_scale

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import sgd_issue_cases  # noqa: E402
import sgd_sorted_dask  # noqa: E402

REFERENCE_SEEDS = 5


def _cluster(n_workers):
    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=False, memory_limit=0,
                           dashboard_address=None)
    return cluster, Client(cluster, set_as_default=False)


@pytest.fixture(scope="module")
def two():
    """Two participants: 20k rows on two workers, as the rule by rows gave
    on the embedded default (by work these inputs train on one; the cases
    stand for the inputs of more work that do get two)."""
    cluster, client = _cluster(2)
    with cluster, client, dask.config.set({"ps.sgd.min-samples-per-participant": 10_000}):
        yield client


@pytest.fixture(scope="module")
def four():
    """Four participants: four workers, ``min-samples-per-participant`` 5000."""
    cluster, client = _cluster(4)
    with cluster, client, dask.config.set({"ps.sgd.min-samples-per-participant": 5000}):
        yield client


def _assert_as_good(name, client, seeds=(0, 1)):
    ref = [s for s, _ in sgd_issue_cases.fit_scores(name, range(REFERENCE_SEEDS))]
    got = [s for s, _ in sgd_issue_cases.fit_scores(name, seeds, client)]
    worst = min(ref)
    assert min(got) >= worst - sgd_issue_cases.SLACK, (
        f"{name}: dask_ps {np.round(got, 4).tolist()} against scikit-learn's {np.round(ref, 4).tolist()}")


@pytest.mark.parametrize("name", ["average_huber", "heavy", "sorted", "sorted_default"])
def test_issue33_cases_on_two_participants(two, name):
    _assert_as_good(name, two)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["average_eps", "average_huber", "heavy", "sorted"])
def test_issue33_cases_on_four_participants(four, name):
    _assert_as_good(name, four)


def test_sample_scale_bounds_each_samples_own_step():
    """``f = min(P, max(1, 1/s))``: never below scikit-learn's rate, at most
    ``P`` times it, and the local step on the margin ``f s`` never above
    ``max(s, 1)`` -- a long row's step is bounded by its own norm."""
    s = np.array([0.0, 1e-4, 0.01, 0.1, 0.5, 1.0, 3.0])
    for P in (2.0, 16.0, 64.0):
        f = sample_scale(s, P)
        assert np.all((f >= 1.0) & (f <= P))
        assert np.all(f * s <= np.maximum(s, 1.0) + 1e-12)
        assert f[0] == P and f[-1] == 1.0 and f[-2] == 1.0
    assert sample_scale(np.array([0.1]), 64.0)[0] == pytest.approx(10.0)


def test_sorted_dask_input_as_good_as_sklearn(two):
    """Text-like rows stored sorted by label as a dask array of 8 partitions
    of one class each, dealt to the two workers in turn: each participant
    holds both classes, one after the other. One epoch scored 0.506-0.508
    on df0779d (its samples trained in that order, in runs of up to 64)
    against scikit-learn's 0.764-0.778 on the same rows; each part is now
    assembled in a shuffled order (``_data._shuffled_concatenation``)."""
    import dask_ps.linear_model as dpl

    ref = [s for s, _ in sgd_issue_cases.fit_scores("sorted", range(REFERENCE_SEEDS))]
    X, y, Xt, yt = sgd_issue_cases._data("sorted")
    assert np.all(np.diff(y) >= 0)
    dX, dy = sgd_sorted_dask.dask_blocks(two, X, y, 8, sgd_sorted_dask.PLACEMENTS["interleaved"])
    got = []
    for seed in (0, 1):
        est = dpl.SGDClassifier(random_state=seed, max_iter=1, tol=None, client=two).fit(dX, dy)
        assert len(est.metrics_) == 2
        got.append(float(np.mean(est.predict(Xt) == yt)))
    assert min(got) >= min(ref) - sgd_issue_cases.SLACK, (got, ref)


def test_one_sorted_block_per_worker_as_good_as_sklearn(two):
    """The rows sorted by label as two blocks, one a worker (placed on
    named workers), each holding both classes stored one after the other:
    the chi-square across the parts sees nothing (both parts balanced) and
    a one-block part was used as stored, so its participant trained runs of
    one class. One epoch scored 0.507 on 3c53016 against scikit-learn's
    0.764-0.778; the part's order statistic (``_exchange.order_z``) now
    finds the grouping and the block is assembled in a seeded shuffle."""
    import dask_ps.linear_model as dpl

    ref = [s for s, _ in sgd_issue_cases.fit_scores("sorted", range(REFERENCE_SEEDS))]
    X, y, Xt, yt = sgd_issue_cases._data("sorted")
    o = sgd_sorted_dask.halves(len(y))  # two halves, each sorted by label
    dX, dy = sgd_sorted_dask.dask_blocks(two, X[o], y[o], 2, sgd_sorted_dask.PLACEMENTS["interleaved"])
    got, coefs = [], []
    for seed in (0, 1, 0):
        est = dpl.SGDClassifier(random_state=seed, max_iter=1, tol=None, client=two).fit(dX, dy)
        assert len(est.metrics_) == 2
        got.append(float(np.mean(est.predict(Xt) == yt)))
        coefs.append(est.coef_.copy())
    assert min(got) >= min(ref) - sgd_issue_cases.SLACK, (got, ref)
    assert np.array_equal(coefs[0], coefs[2])


@pytest.mark.parametrize("classifier", [True, False])
def test_order_z_tells_a_grouped_part_from_a_random_one(classifier):
    from dask_ps.linear_model import _exchange

    rs = np.random.RandomState(0)
    y = (rs.rand(5000) < 0.3).astype(int) if classifier else rs.lognormal(size=5000)
    for seed in range(20):  # random orders stay far below the bar
        assert not _exchange.stored_grouped(np.random.RandomState(seed).permutation(y), classifier)
    assert _exchange.stored_grouped(np.sort(y), classifier)
    # runs of 50 rows sorted (one label, or a range of targets), the runs in a random order
    runs = np.sort(y).reshape(-1, 50)[rs.permutation(100)].ravel()
    assert _exchange.stored_grouped(runs, classifier)
    assert not _exchange.stored_grouped(np.array(["a", "b", "a"]), classifier)
    assert not _exchange.stored_grouped(np.full(100, 2.0), classifier)


def _sorted_regression():
    """Text-like rows and a linear target, stored sorted by the target."""
    X, y, Xt, yt = sgd_issue_cases._text_like(20000, classifier=False)
    o = np.argsort(y, kind="stable")
    return X[o], y[o], Xt, yt


def test_one_class_per_worker_dask_input_as_good_as_sklearn(two, caplog):
    """The rows sorted by label as 8 one-class blocks, blocks 0-3 scattered
    to one worker and 4-7 to the other (``dask_blocks`` places each block
    on a named worker: the placement is the test's, not Dask's): each
    participant holds one class. One epoch scored 0.547-0.607 on 8a9006a
    against scikit-learn's 0.764-0.778; the parts' label counts now show
    the skew and the rows are dealt again between the participants
    (``_exchange.balance``, logged at INFO), in a seeded deal: the same
    ``random_state`` gives the same model."""
    import logging

    import dask_ps.linear_model as dpl

    ref = [s for s, _ in sgd_issue_cases.fit_scores("sorted", range(REFERENCE_SEEDS))]
    X, y, Xt, yt = sgd_issue_cases._data("sorted")
    dX, dy = sgd_sorted_dask.dask_blocks(two, X, y, 8, sgd_sorted_dask.PLACEMENTS["one-class-per-worker"])
    got, coefs = [], []
    for seed in (0, 1, 0):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dask_ps.linear_model"):
            est = dpl.SGDClassifier(random_state=seed, max_iter=1, tol=None, client=two).fit(dX, dy)
        assert len(est.metrics_) == 2
        assert any("participants' labels differ from the whole" in r.getMessage() for r in caplog.records)
        got.append(float(np.mean(est.predict(Xt) == yt)))
        coefs.append(est.coef_.copy())
    assert min(got) >= min(ref) - sgd_issue_cases.SLACK, (got, ref)
    assert np.array_equal(coefs[0], coefs[2]) and not np.array_equal(coefs[0], coefs[1])


def test_regression_sorted_by_target_a_range_per_worker_as_good_as_sklearn(two, capsys):
    """A regressor's rows sorted by target, half the range on each worker
    (placed as above): R^2 0.180 after 5 epochs on 8a9006a against
    scikit-learn's 0.2235-0.2237; the parts' target samples show the skew
    and the rows are dealt again (said on standard error with ``verbose``)."""
    import sklearn.linear_model as skl
    from sklearn.metrics import r2_score

    import dask_ps.linear_model as dpl

    X, y, Xt, yt = _sorted_regression()
    params = {"max_iter": 5, "tol": None}
    ref = [r2_score(yt, skl.SGDRegressor(random_state=s, **params).fit(X, y).predict(Xt))
           for s in range(REFERENCE_SEEDS)]
    dX, dy = sgd_sorted_dask.dask_blocks(two, X, y, 8, sgd_sorted_dask.PLACEMENTS["one-class-per-worker"])
    got = [r2_score(yt, dpl.SGDRegressor(random_state=s, client=two, verbose=s, **params).fit(dX, dy).predict(Xt))
           for s in (0, 1)]
    assert min(got) >= min(ref) - sgd_issue_cases.SLACK, (got, ref)
    assert "participants' targets differ from the whole" in capsys.readouterr().err


def test_skew_tells_a_grouped_deal_from_a_random_one():
    """The chi-square test of the parts' shares: below ``SKEW_P_VALUE``
    for rows dealt a class (a target range) a part, above it for rows
    dealt at random (fixed seeds: these deals, not a rate)."""
    from dask_ps.linear_model._data import label_counts
    from dask_ps.linear_model._exchange import SKEW_P_VALUE, skew, target_sample

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 6000)
    z = rng.standard_normal(6000)

    def infos(labels, targets, parts):
        return [(len(i), *label_counts(labels[i]), target_sample(targets[i])) for i in parts]

    order = np.argsort(y, kind="stable")
    for P in (2, 4, 16):
        grouped = np.array_split(order, P)
        dealt = np.array_split(rng.permutation(6000), P)
        assert skew(infos(y, z, grouped), True) < SKEW_P_VALUE
        assert skew(infos(y, z, dealt), True) > 0.01
        by_target = np.array_split(np.argsort(z), P)
        assert skew(infos(y, z, by_target), False) < SKEW_P_VALUE
        assert skew(infos(y, z, dealt), False) > 0.01
    assert skew(infos(y, z, [np.arange(6000)]), True) == 1.0


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_rows_dealt_again_are_a_seeded_permutation_of_all_rows(sparse):
    """``deal_counts`` keeps every part's size; split then join moves
    every row once, X, y and weights together, the same for the same seeds."""
    import scipy.sparse as sp

    from dask_ps.linear_model._exchange import _join, _split, deal_counts
    from dask_ps.linear_model._participant import _PartData

    rng = np.random.default_rng(1)
    sizes = [7, 30, 1, 12]
    counts = deal_counts(sizes, np.random.default_rng(2))
    assert counts.sum(axis=1).tolist() == sizes and counts.sum(axis=0).tolist() == sizes
    Xs = [rng.random((n, 5)) for n in sizes]
    start = np.cumsum([0] + sizes)
    parts = [_PartData(sp.csr_matrix(x) if sparse else x, np.arange(start[i], start[i + 1]),
                       np.arange(start[i], start[i + 1]) + 0.5) for i, x in enumerate(Xs)]

    def deal():
        pieces = [_split(p, i, counts, [11, 12, 13, 14]) for i, p in enumerate(parts)]
        return [_join([pieces[i][j] for i in range(4) if counts[i, j]], j, [5, 6, 7, 8]) for j in range(4)]

    new, again = deal(), deal()
    full = np.vstack(Xs)
    assert [len(p) for p in new] == sizes
    rows = np.concatenate([p.y for p in new])
    assert np.array_equal(np.sort(rows), np.arange(start[-1]))
    for p, q in zip(new, again):
        X = p.X.toarray() if sparse else p.X
        assert np.array_equal(X, full[p.y]) and np.array_equal(p.sw, p.y + 0.5)
        assert np.array_equal(p.y, q.y)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_shuffled_concatenation_is_a_seeded_shuffle_of_the_rows(sparse):
    """A part's blocks in one shuffled order: every row once, X, y and the
    sample weights in the same order, the same order for the same seed."""
    import scipy.sparse as sp

    from dask_ps.linear_model._data import _shuffled_concatenation

    rng = np.random.default_rng(0)
    sizes = [5, 1, 7, 3]
    Xs = [rng.random((n, 4)) * (rng.random((n, 4)) < 0.5) for n in sizes]
    ys = [np.full(n, k) for k, n in enumerate(sizes)]
    sws = [np.arange(n, dtype=float) + 10 * k for k, n in enumerate(sizes)]
    blocks = [sp.csr_matrix(x) for x in Xs] if sparse else Xs
    X, y, sw = _shuffled_concatenation(blocks, ys, sws, seed=3)
    X = X.toarray() if sparse else X
    full, fy, fw = np.vstack(Xs), np.concatenate(ys), np.concatenate(sws)
    key = np.lexsort(full.T[::-1])
    order = np.lexsort(X.T[::-1])
    assert np.array_equal(X[order], full[key]) and not np.array_equal(y, fy)
    where = {w: i for i, w in enumerate(fw)}  # sample weights are distinct: each row's origin
    origin = np.array([where[w] for w in sw])
    assert np.array_equal(np.sort(origin), np.arange(len(fy)))
    assert np.array_equal(X, full[origin]) and np.array_equal(y, fy[origin])
    X2, y2, _ = _shuffled_concatenation(blocks, ys, sws, seed=3)
    assert np.array_equal(X2.toarray() if sparse else X2, X) and np.array_equal(y2, y)
