"""Calls after the first (``partial_fit``, ``warm_start`` refits) start
where scikit-learn's do. Found by comparing with scikit-learn over its
parameters (the thirteenth session): an ``adaptive`` rate decayed by one
fit (to ~1e-7) carried into the next ``partial_fit`` or warm refit, which
then barely learned (R^2 -24.5 against scikit-learn's 1.000), and a warm
classifier with ``average`` restarted from its unaveraged weights (up to
0.11 off scikit-learn's refit). One participant's fit is scikit-learn's;
later calls agree to rounding (their sums are taken in another order)."""

from __future__ import annotations

import numpy as np
import pytest
import sklearn.linear_model as skl
from numpy.testing import assert_allclose
from sklearn.datasets import make_classification, make_regression

from dask_ps.linear_model import SGDClassifier, SGDRegressor

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _shifted():
    X, y = make_regression(2000, 5, noise=1, random_state=0)
    y = y / y.std()
    return X[:1000], y[:1000], X[1000:], y[1000:] + 5.0


def test_partial_fit_after_an_adaptive_fit_starts_at_eta0():
    Xa, ya, Xb, yb = _shifted()
    ours = SGDRegressor(learning_rate="adaptive", eta0=0.01, random_state=0).fit(Xa, ya)
    theirs = skl.SGDRegressor(learning_rate="adaptive", eta0=0.01, random_state=0).fit(Xa, ya)
    for i in range(10):
        ours.partial_fit(Xb[i * 100:(i + 1) * 100], yb[i * 100:(i + 1) * 100])
        theirs.partial_fit(Xb[i * 100:(i + 1) * 100], yb[i * 100:(i + 1) * 100])
    assert theirs.intercept_[0] > 4.9  # the shift learned
    assert_allclose(ours.intercept_, theirs.intercept_, rtol=1e-9)
    assert_allclose(ours.coef_, theirs.coef_, rtol=1e-9, atol=1e-12)


def _problem(cls, seed):
    """1,000 rows x 8 and the two estimators of ``cls`` (ours, scikit-learn's)."""
    if cls == "classifier":
        return (*make_classification(1000, 8, random_state=seed), SGDClassifier, skl.SGDClassifier)
    return (*make_regression(1000, 8, noise=5, random_state=seed), SGDRegressor, skl.SGDRegressor)


@pytest.mark.parametrize("cls", ["classifier", "regressor"])
def test_a_warm_adaptive_refit_runs_as_scikit_learns(cls):
    X, y, ours, theirs = _problem(cls, seed=0)
    kw = dict(learning_rate="adaptive", eta0=0.01, warm_start=True, random_state=0)
    a, b = ours(**kw).fit(X, y), theirs(**kw).fit(X, y)
    a.fit(X, y)
    b.fit(X, y)
    assert a.n_iter_ == b.n_iter_ > 6  # 6: stopped at once, from the decayed rate
    assert_allclose(a.coef_, b.coef_, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cls", ["classifier", "regressor"])
def test_a_warm_averaged_refit_restarts_where_scikit_learns_does(cls):
    """scikit-learn's classifier restarts from ``coef_`` (the averaged model)
    with fresh averages, its regressor from the unaveraged weights with the
    old averages; both are followed."""
    X, y, ours, theirs = _problem(cls, seed=1)
    kw = dict(average=True, max_iter=3, tol=None, learning_rate="constant", eta0=0.001, warm_start=True,
              random_state=0)
    a, b = ours(**kw).fit(X, y), theirs(**kw).fit(X, y)
    a.fit(X, y)
    b.fit(X, y)
    assert_allclose(a.coef_, b.coef_, rtol=1e-9, atol=1e-12)
    assert_allclose(a.intercept_, b.intercept_, rtol=1e-9, atol=1e-12)


def test_a_validation_set_smaller_than_the_classes_is_scikit_learns_error():
    """A lone classifier drew an unstratified split where scikit-learn's
    stratified one cannot be drawn, and fitted; now scikit-learn's error."""
    X, y = make_classification(300, 6, n_informative=4, n_classes=3, random_state=0)
    kw = dict(early_stopping=True, validation_fraction=0.001, random_state=0)
    with pytest.raises(ValueError) as theirs:
        skl.SGDClassifier(**kw).fit(X, y)
    with pytest.raises(ValueError) as ours:
        SGDClassifier(**kw).fit(X, y)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("cls", ["binary", "multiclass", "regressor"])
@pytest.mark.parametrize("average", [False, True])
def test_float32_data_gives_scikit_learns_attribute_dtypes(cls, average):
    """scikit-learn keeps ``coef_`` float32 for float32 data and
    ``intercept_`` float64 (so ``predict`` is float64), but for a
    classifier's averaged or multiclass fit (float32); the intercept was
    always float32 here."""
    if cls == "regressor":
        X, y = make_regression(500, 6, random_state=0)
        ours, theirs = SGDRegressor, skl.SGDRegressor
    else:
        X, y = make_classification(500, 6, n_informative=4, n_redundant=0, n_classes=2 if cls == "binary" else 3,
                                   random_state=0)
        ours, theirs = SGDClassifier, skl.SGDClassifier
    X = X.astype(np.float32)
    kw = dict(random_state=0, average=average, max_iter=3, tol=None)
    a, b = ours(**kw).fit(X, y), theirs(**kw).fit(X, y)
    assert (a.coef_.dtype, a.intercept_.dtype) == (b.coef_.dtype, b.intercept_.dtype)
    predict = "predict" if cls == "regressor" else "decision_function"
    assert getattr(a, predict)(X).dtype == getattr(b, predict)(X).dtype
