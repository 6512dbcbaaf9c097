"""Participants of an SGD input by its work
(``linear_model/_participants.py``), not one per 10,000 rows: in memory,
and a dask input from its blocks' sizes.

A participant more costs a clock's sync a round and more epochs; on 2 cores
60,000 dense rows x 50 took 0.38 s on one participant and 1.47 s on the two
that the rule by rows gave (``benchmarks/bench_participants.py``). These
tests check the rule without a cluster, the rule by rows where
``ps.sgd.min-samples-per-participant`` is a number, and that a fit reaches
the cluster with the participants the rule gives."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp

from dask_ps.linear_model import _participants
from dask_ps.linear_model._participants import by_work, epoch_seconds, participants


class _Shape:
    """An array's shape (and nnz) without its memory."""

    def __init__(self, n, d, nnz=None):
        self.shape, self.ndim = (n, d), 2
        if nnz is not None:
            self.nnz = nnz


@pytest.mark.parametrize(("n", "d", "expected"), [
    (20_000, 50, 1),     # the rule by rows gave 2
    (60_000, 50, 1),     # 2: 0.38 s on one against 1.47 s on two
    (120_000, 50, 1),    # 2
    (250_000, 50, 2),    # 40 ms an epoch
    (500_000, 50, 4),    # capped by the workers below
    (400_000, 10, 1),    # few features: little work a row
    (60_000, 500, 3),
])
def test_dense_inputs_get_a_participant_per_20_ms_of_an_epoch(n, d, expected):
    assert participants(_Shape(n, d), cap=64) == expected


def test_sparse_values_cost_more_than_dense_ones():
    """A text-like row of 41 words is 3x a dense row of 50 values: 60k rows
    of it one participant (0.36 against 0.39 s on two), 120k two."""
    assert epoch_seconds(1, 41, sparse=True) > 3 * epoch_seconds(1, 50, sparse=False)
    assert participants(_Shape(60_000, 2**18, nnz=60_000 * 41), cap=2) == 1
    assert participants(_Shape(120_000, 2**18, nnz=120_000 * 41), cap=2) == 2


def test_the_workers_and_n_jobs_cap_it():
    assert participants(_Shape(10**7, 50), cap=2) == 2
    assert participants(_Shape(10**7, 50), cap=1) == 1
    assert participants(_Shape(10, 50), cap=8) == 1


def test_a_number_of_samples_is_the_rule_by_rows():
    """``ps.sgd.min-samples-per-participant`` as a number: one per that many
    samples, whatever the work (as before the rule by work)."""
    with dask.config.set({"ps.sgd.min-samples-per-participant": 10_000}):
        assert participants(_Shape(20_000, 50), cap=8) == 2
        assert participants(_Shape(19_999, 50), cap=8) == 1
    with dask.config.set({"ps.sgd.min-samples-per-participant": 100}):
        assert participants(_Shape(1_000, 3), cap=4) == 4


def test_device_data_goes_by_rows():
    assert participants(_Shape(30_000, 5), cap=8, on_device=True) == 3
    assert _participants.dask_participants([(15_000, 75_000, False)] * 2, on_device=True) == 3


def test_a_dask_input_goes_by_the_work_of_its_blocks():
    """The blocks' sizes add up to the rule of an in-memory input: 20k
    text-like rows in 2 blocks one participant (the rule by rows gave 2:
    the averaged epsilon_insensitive cell of issue 33 below scikit-learn's
    worst there), 250k dense rows x 50 two; a number of samples is the
    rule by rows."""
    rng = np.random.default_rng(0)
    text = sp.csr_matrix((np.ones(10_000 * 41), rng.integers(2**18, size=10_000 * 41),
                          np.arange(0, 10_000 * 41 + 1, 41)), shape=(10_000, 2**18))
    sizes = [_participants.block_size(text)] * 2
    assert sizes[0] == (10_000, 410_000, True)
    assert _participants.dask_participants(sizes) == 1
    assert _participants.dask_participants([(125_000, 125_000 * 50, False)] * 2) == 2
    assert _participants.block_size(np.zeros((7, 3))) == (7, 21, False)
    assert _participants.block_size(np.zeros(7)) == (7, 7, False)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 10_000}):
        assert _participants.dask_participants(sizes) == 2


def test_the_setting_moves_the_threshold():
    X = _Shape(60_000, 50)  # ~9.6 ms an epoch
    with dask.config.set({"ps.sgd.min-epoch-seconds-per-participant": 0.004}):
        assert participants(X, cap=8) == 2
    with dask.config.set({"ps.sgd.min-epoch-seconds-per-participant": 0}):
        assert participants(X, cap=8) == 8
    assert by_work(3, 3 * 50, False, 0.0) == 3


def test_real_arrays_are_measured_as_the_shapes_are():
    X = np.zeros((100, 7))
    S = sp.random(100, 1000, density=0.01, format="csr", random_state=0)
    assert participants(X, cap=4) == participants(_Shape(100, 7), cap=4)
    assert participants(S, cap=4) == participants(_Shape(100, 1000, nnz=S.nnz), cap=4)


def test_a_fit_on_a_cluster_gets_the_participants_of_the_rule():
    """60k dense rows x 50 on 2 workers: one participant (the rule by rows
    gave two); with the rule by rows asked for, two."""
    from distributed import Client, LocalCluster
    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    X, y = make_classification(60_000, 50, random_state=0)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        est = SGDClassifier(max_iter=2, tol=None, random_state=0, client=client).fit(X, y)
        assert len(est.metrics_) == 1
        with dask.config.set({"ps.sgd.min-samples-per-participant": 10_000}):
            est = SGDClassifier(max_iter=2, tol=None, random_state=0, client=client).fit(X, y)
        assert len(est.metrics_) == 2


def test_a_small_dask_input_on_two_workers_gets_one_participant():
    """20k dense rows x 50 as 4 blocks dealt to 2 workers: one participant,
    whose fit is scikit-learn's bit for bit (one participant's fit is); the
    rule by rows asked for gives two."""
    import dask.array as da
    from distributed import Client, LocalCluster
    from sklearn.datasets import make_regression
    from sklearn.linear_model import SGDRegressor as SkSGDRegressor

    from dask_ps.linear_model import SGDRegressor

    X, y = make_regression(20_000, 50, noise=1.0, random_state=0)
    params = dict(max_iter=3, tol=None, random_state=0, average=True, loss="epsilon_insensitive", shuffle=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        dX, dy = da.from_array(X, chunks=(5_000, 50)), da.from_array(y, chunks=5_000)
        est = SGDRegressor(client=client, **params).fit(dX, dy)
        assert len(est.metrics_) == 1
        ref = SkSGDRegressor(**params).fit(X, y)
        np.testing.assert_array_equal(est.coef_, ref.coef_)
        with dask.config.set({"ps.sgd.min-samples-per-participant": 10_000}):
            est = SGDRegressor(client=client, **params).fit(dX, dy)
        assert len(est.metrics_) == 2
