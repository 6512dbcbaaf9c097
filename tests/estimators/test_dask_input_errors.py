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


@pytest.mark.parametrize("kind", ["Float64", "Int64", "string", "category"])
def test_a_dask_dataframe_of_pandas_extension_dtypes_fits_as_pandas_does(local_client, kind):
    """Nullable and string columns: scikit-learn converts them (a pandas
    DataFrame fits); on a dask DataFrame ``np.dtype(Float64Dtype())`` raised
    a TypeError before any data was read."""
    pd = pytest.importorskip("pandas")
    X, y = _data(300)
    pdf = pd.DataFrame(X, columns=list("abcd"))
    pdf = (pdf * 10).round().astype("Int64") if kind == "Int64" else pdf.astype(kind)
    est = SGDClassifier(client=local_client, random_state=0, max_iter=5, tol=None)
    est.fit(dd.from_pandas(pdf, npartitions=2), dd.from_pandas(pd.Series(y), npartitions=2))
    ref = sk_linear_model.SGDClassifier(random_state=0, max_iter=5, tol=None).fit(pdf, y)
    assert est.coef_.dtype == np.float64
    assert est.score(pdf.astype(float), y) >= ref.score(pdf.astype(float), y) - 0.05


def test_a_non_numeric_dask_dataframe_column_says_what_scikit_learn_says(local_client, caplog):
    pd = pytest.importorskip("pandas")
    X, y = _data(300)
    bad = pd.DataFrame(X, columns=list("abcd")).astype(object)
    bad.iloc[3, 1] = "x"
    theirs = _sk_error(sk_linear_model.SGDClassifier(), bad, y)
    with pytest.raises(ValueError) as info:
        SGDClassifier(client=local_client).fit(dd.from_pandas(bad, npartitions=2),
                                               dd.from_pandas(pd.Series(y), npartitions=2))
    assert "could not convert string to float: 'x'" in str(info.value) and "could not convert" in theirs
    _no_task_failed(caplog)


@pytest.mark.parametrize("early_stopping", [False, True])
def test_all_zero_dask_sample_weights_are_refused_as_scikit_learn_refuses_them(local_client, early_stopping):
    """A dask input's weights were checked for their length only: all zero
    fitted an all-zero model without a word."""
    X, y = _data(400)
    with pytest.raises(ValueError) as sk_info:
        sk_linear_model.SGDClassifier(early_stopping=early_stopping).fit(X, y, sample_weight=np.zeros(400))
    theirs = str(sk_info.value)
    with pytest.raises(ValueError) as info:
        SGDClassifier(client=local_client, early_stopping=early_stopping).fit(
            da.from_array(X, chunks=(200, 4)), da.from_array(y, chunks=200), sample_weight=da.zeros(400, chunks=200))
    assert str(info.value) == theirs
    w = np.zeros(400)
    w[7] = 1.0  # one weight is enough, as for scikit-learn
    SGDClassifier(client=local_client, max_iter=2, tol=None).fit(
        da.from_array(X, chunks=(200, 4)), da.from_array(y, chunks=200), sample_weight=da.from_array(w, chunks=200))


@pytest.mark.parametrize("ours, theirs", [(SGDClassifier, sk_linear_model.SGDClassifier),
                                          (SGDRegressor, sk_linear_model.SGDRegressor)],
                         ids=["classifier", "regressor"])
def test_a_sparsified_model_predicts_dask_input(local_client, ours, theirs):
    """After ``sparsify()`` (scikit-learn's: ``coef_`` a scipy sparse matrix,
    which keeps predicting), the dask path's tasks failed in ``matmul``."""
    X, y = _data(400)
    est = ours(client=local_client, random_state=0, max_iter=5, tol=None).fit(X, y)
    dense = est.predict(X)
    est.sparsify()
    np.testing.assert_array_equal(est.predict(da.from_array(X, chunks=(100, 4))).compute(), dense)
    np.testing.assert_allclose(est.decision_function(da.from_array(X, chunks=(100, 4))).compute()
                               if hasattr(est, "decision_function") else dense,
                               est.decision_function(X) if hasattr(est, "decision_function") else dense)


def test_a_y_partitioned_otherwise_than_x_says_so(local_client, caplog):
    """X and y with as many rows and partitions but other divisions: two
    participants' parts had other lengths, the totals matched, and the fit
    ended in ``AssertionError: invalid parts without an error``."""
    import dask

    pd = pytest.importorskip("pandas")
    X, y = _data(4000)
    Xd = dd.from_pandas(pd.DataFrame(X), npartitions=4)
    ys = dd.from_pandas(pd.Series(y), npartitions=4).repartition(divisions=[0, 1500, 2000, 3500, 3999])
    with dask.config.set({"ps.sgd.min-samples-per-participant": 500}), \
            pytest.raises(ValueError, match=r"X and y have the same number of rows \(4000\) but their blocks do not "
                                            r"line up.*repartition"):
        SGDClassifier(client=local_client, max_iter=2, tol=None).fit(Xd, ys)
    _no_task_failed(caplog)


@pytest.mark.parametrize("ours", [SGDClassifier, SGDRegressor], ids=["classifier", "regressor"])
def test_score_on_a_dask_dataframe_is_scikit_learns_score(local_client, ours):
    """``score`` on a dask DataFrame called ``len`` on the lazy predictions,
    whose lengths are unknown: dask's "unknown chunk size" error."""
    pd = pytest.importorskip("pandas")
    X, y = _data(400)
    est = ours(client=local_client, random_state=0, max_iter=5, tol=None).fit(X, y)
    Xd = dd.from_pandas(pd.DataFrame(X), npartitions=2)
    yd = dd.from_pandas(pd.Series(y), npartitions=2)
    w = np.linspace(0.5, 1.5, 400)
    assert est.score(Xd, yd) == pytest.approx(est.score(X, y), abs=1e-12)
    assert est.score(Xd, yd, sample_weight=dd.from_pandas(pd.Series(w), npartitions=2)) == pytest.approx(
        est.score(X, y, sample_weight=w), abs=1e-12)
