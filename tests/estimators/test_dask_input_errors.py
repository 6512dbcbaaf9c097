"""Errors in dask inputs are said in the caller, with scikit-learn's exact
wording and totals, and without a worker traceback (issue 24, item 2).

On 3860c22 NaN in a dask array said ``Input contains NaN.`` (scikit-learn:
``Input X contains NaN.``), a ``y`` of another length with unknown chunks
reported one part's sizes, and both failed a Dask task: Dask logged
``Compute Failed`` with the worker's traceback.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sklearn import decomposition as sk_decomposition
from sklearn import linear_model as sk_linear_model

pytest.importorskip("numba")
da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")

from dask_ps.decomposition import LatentDirichletAllocation  # noqa: E402
from dask_ps.linear_model import SGDClassifier, SGDRegressor  # noqa: E402


@pytest.fixture(scope="module")
def local_client():
    """Workers in this process: their log records reach caplog."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster, set_as_default=False) as client:
            yield client


def _sk_error(est, *args) -> str:
    with pytest.raises(ValueError) as info:
        est.fit(*args)
    return str(info.value)


def _no_task_failed(caplog):
    failed = [r.getMessage() for r in caplog.records if "Compute Failed" in r.getMessage()]
    assert not failed, failed[0][:300]


def _data(n=400, d=4, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    return X, (X[:, 0] > 0).astype(int)


@pytest.mark.parametrize("ours, theirs", [(SGDClassifier, sk_linear_model.SGDClassifier),
                                          (SGDRegressor, sk_linear_model.SGDRegressor)],
                         ids=["classifier", "regressor"])
def test_nan_in_a_dask_array_says_what_scikit_learn_says(local_client, caplog, ours, theirs):
    X, y = _data()
    X[250, 2] = np.nan
    message = _sk_error(theirs(max_iter=2), X, y)
    assert message.startswith("Input X contains NaN.")
    caplog.set_level(logging.INFO)
    with pytest.raises(ValueError) as info:
        ours(max_iter=2, client=local_client).fit(da.from_array(X, chunks=100), da.from_array(y, chunks=100))
    assert str(info.value) == message
    _no_task_failed(caplog)


def test_nan_in_a_dask_y_says_what_scikit_learn_says(local_client, caplog):
    X, y = _data()
    y = y.astype(float)
    y[7] = np.nan
    message = _sk_error(sk_linear_model.SGDRegressor(max_iter=2), X, y)
    caplog.set_level(logging.INFO)
    with pytest.raises(ValueError) as info:
        SGDRegressor(max_iter=2, client=local_client).fit(da.from_array(X, chunks=100), da.from_array(y, chunks=100))
    assert str(info.value) == message
    _no_task_failed(caplog)


def test_y_of_another_length_with_unknown_chunks_reports_the_totals(local_client, caplog):
    """X: 400 rows in two partitions of unknown length; y: 200 + 150. Was
    ``[200, 150]``, one part's sizes."""
    X, y = _data()
    dX = dd.from_array(X, chunksize=200).to_dask_array()
    dy = dd.from_array(y[:350].astype(float), chunksize=200).to_dask_array()
    assert np.isnan(dX.shape[0]) and dX.numblocks[0] == dy.numblocks[0] == 2
    message = _sk_error(sk_linear_model.SGDClassifier(max_iter=2), X, y[:350])
    assert "[400, 350]" in message
    caplog.set_level(logging.INFO)
    with pytest.raises(ValueError) as info:
        SGDClassifier(max_iter=2, client=local_client).fit(dX, dy)
    assert str(info.value) == message
    _no_task_failed(caplog)


def test_a_complex_dask_array_is_refused_from_its_metadata(local_client):
    """The dtype is known without computing: the graph (which would fail)
    is never run."""
    import dask

    def boom():
        raise RuntimeError("computed")

    X, y = _data()
    dX = da.from_delayed(dask.delayed(boom)(), shape=X.shape, dtype=complex)
    message = _sk_error(sk_linear_model.SGDClassifier(max_iter=2), X.astype(complex), y)
    with pytest.raises(ValueError) as info:
        SGDClassifier(max_iter=2, client=local_client).fit(dX, da.from_array(y, chunks=100))
    # scikit-learn's message, which prints the values after this line (none here)
    assert str(info.value).splitlines()[0] == message.splitlines()[0] == "Complex data not supported"


def test_lda_nan_in_a_dask_array_says_what_scikit_learn_says(local_client, caplog):
    X = np.random.RandomState(0).randint(0, 3, size=(40, 10)).astype(float)
    X[33, 4] = np.nan
    message = _sk_error(sk_decomposition.LatentDirichletAllocation(2, max_iter=1), X)
    assert message.startswith("Input X contains NaN.")
    caplog.set_level(logging.INFO)
    with pytest.raises(ValueError) as info:
        LatentDirichletAllocation(2, max_iter=2, client=local_client).fit(da.from_array(X, chunks=(20, 10)))
    assert str(info.value) == message
    _no_task_failed(caplog)
    X[33, 4] = -1  # negative counts: scikit-learn's check_non_negative, said here too
    with pytest.raises(ValueError, match="Negative values in data passed to LatentDirichletAllocation"):
        LatentDirichletAllocation(2, max_iter=2, client=local_client).fit(da.from_array(X, chunks=(20, 10)))
    _no_task_failed(caplog)
