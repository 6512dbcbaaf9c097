"""A lone participant's fit is scikit-learn's (issue 24).

With one participant (a small in-memory input and no cluster chosen: it
trains in the calling process) the compiled kernel runs scikit-learn's
``_plain_sgd`` rule over whole rounds: the weight vector's scale,
averaging and Tsuruoka's L1 state kept over the fit, every weight decayed
and averaged at each sample on sparse data (no lazy regularization of
compacted rounds), the early-stopping validation split drawn as
scikit-learn's ``_make_validation_split`` and the samples in the order of
scikit-learn's shuffle (its seeds drawn from the estimator's
``random_state`` as scikit-learn draws them). These tests compare with
scikit-learn's own estimators, bit for bit; each failed before that (L1
weights near 1e-4 instead of 0, the averages of a sparse ``partial_fit``
off by 45%, another validation split, another order)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn.linear_model as skl
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.datasets import load_iris
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit

from dask_ps.linear_model import SGDClassifier, SGDRegressor

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

# scikit-learn's test_sgd.py's X4/Y4: two redundant feature groups.
X4 = np.array([[1, 0.9, 0.8, 0, 0, 0], [1, 0.84, 0.98, 0, 0, 0], [1, 0.96, 0.88, 0, 0, 0],
               [1, 0.91, 0.99, 0, 0, 0], [0, 0, 0, 0.89, 0.91, 1], [0, 0, 0, 0.79, 0.84, 1],
               [0, 0, 0, 0.91, 0.95, 1], [0, 0, 0, 0.93, 1, 1]])
Y4 = np.array([1, 1, 1, 1, 2, 2, 2, 2])
# scikit-learn's X3/Y3: features absent from half of the samples.
X3 = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0],
               [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0]], dtype=float)
Y3 = np.array([1, 1, 1, 1, 2, 2, 2, 2], dtype=float)


@pytest.mark.parametrize("sparse", [False, True])
def test_lone_l1_reaches_exact_zeros_as_scikit_learn(sparse):
    """L1 with the state carried over the fit: the weights of the redundant
    features are exactly 0, and the model is scikit-learn's bit for bit
    (per round, the penalty owed by a weight clipped to 0 was forgotten)."""
    idx = np.random.RandomState(13).permutation(8)
    X = sp.csr_matrix(X4[idx]) if sparse else X4[idx]
    Y = Y4[idx]
    for max_iter in (5, 2000):
        kw = dict(penalty="l1", alpha=0.2, fit_intercept=False, max_iter=max_iter, tol=None, shuffle=False)
        ours = SGDClassifier(**kw).fit(X, Y)
        theirs = skl.SGDClassifier(**kw).fit(X, Y)
        assert_array_equal(ours.coef_, theirs.coef_)
    assert_array_equal(ours.coef_[0, 1:-1], np.zeros(4))


@pytest.mark.parametrize("penalty", ["l2", "elasticnet"])
def test_lone_sparse_fit_is_scikit_learns(penalty):
    """Sparse data, several epochs, weights and averages: every weight
    decays and is averaged at each sample, as in scikit-learn (compacted
    rounds decayed the features of a round only, then lazily)."""
    X = sp.csr_matrix(X3)
    kw = dict(loss="squared_error", penalty=penalty, alpha=0.01, average=True, max_iter=7, tol=None,
              shuffle=False, learning_rate="constant", eta0=0.01)
    ours = SGDRegressor(**kw).fit(X, Y3)
    theirs = skl.SGDRegressor(**kw).fit(X, Y3)
    assert_array_equal(ours.coef_, theirs.coef_)
    assert_array_equal(ours.intercept_, theirs.intercept_)


def test_lone_sparse_partial_fit_averages_untouched_features():
    """Two ``partial_fit`` calls on halves with disjoint features: the
    first half's weights decay and their averages move during the second
    call, as scikit-learn's (they were left as they were: 45% off)."""
    X = sp.csr_matrix(X3)
    kw = dict(loss="squared_error", learning_rate="constant", eta0=0.001, alpha=0.01, max_iter=1,
              average=True, shuffle=False)
    ours, theirs = SGDRegressor(**kw), skl.SGDRegressor(**kw)
    for est in (ours, theirs):
        est.partial_fit(X[:4], Y3[:4])
        est.partial_fit(X[4:], Y3[4:])
    assert_allclose(ours.coef_, theirs.coef_, rtol=1e-12, atol=1e-18)
    assert_allclose(ours.intercept_, theirs.intercept_, rtol=1e-12)


@pytest.mark.parametrize("kind", ["classifier", "binary", "regressor"])
@pytest.mark.parametrize("sparse", [False, True])
def test_lone_validation_split_is_scikit_learns(kind, sparse):
    """Early stopping: the validation samples are scikit-learn's split with
    the estimator's ``random_state`` (a ``RandomState`` consumed by it), so
    the fit equals a fit on scikit-learn's training samples, and
    scikit-learn's own fit (each participant drew from its own seed)."""
    X, y = load_iris(return_X_y=True)
    if kind == "binary":
        y = (y == 2).astype(int)
    Xf = sp.csr_matrix(X) if sparse else X
    est_cls = SGDRegressor if kind == "regressor" else SGDClassifier
    sk_cls = skl.SGDRegressor if kind == "regressor" else skl.SGDClassifier
    kw = dict(learning_rate="constant", eta0=0.01, tol=None, max_iter=10, shuffle=False)
    early = est_cls(early_stopping=True, validation_fraction=0.4, random_state=np.random.RandomState(42), **kw)
    early.fit(Xf, y)
    cv = (ShuffleSplit if kind == "regressor" else StratifiedShuffleSplit)(test_size=0.4, random_state=42)
    if kind == "binary":  # fit_binary's make_dataset draws once from the RandomState before the split
        rs = np.random.RandomState(42)
        rs.randint(1, np.iinfo(np.int32).max)
        cv = StratifiedShuffleSplit(test_size=0.4, random_state=rs)
    train, _ = next(cv.split(X, y))
    train = np.sort(train)
    plain = est_cls(random_state=np.random.RandomState(42), **kw).fit(Xf[train], y[train])
    assert early.n_iter_ == plain.n_iter_ == 10
    assert_array_equal(early.coef_, plain.coef_)
    theirs = sk_cls(early_stopping=True, validation_fraction=0.4, random_state=np.random.RandomState(42), **kw)
    theirs.fit(Xf, y)
    assert_array_equal(early.coef_, theirs.coef_)


def test_lone_validation_split_checks_its_weights():
    """scikit-learn's error where the validation samples' weights are all
    zero (not only all the weights): checked on the split itself."""
    X, y = load_iris(return_X_y=True)
    _, val = next(StratifiedShuffleSplit(test_size=0.2, random_state=0).split(X, y))
    sw = np.ones(len(y))
    sw[val] = 0.0
    with pytest.raises(ValueError, match="validation set are all zero"):
        SGDClassifier(early_stopping=True, validation_fraction=0.2, random_state=0).fit(X, y, sample_weight=sw)


@pytest.mark.parametrize("sparse", [False, True])
def test_lone_shuffled_fits_are_scikit_learns(sparse):
    """``shuffle=True``: each output's samples in the order of
    scikit-learn's shuffle (``SequentialDataset.shuffle`` with the seed
    scikit-learn draws for it: one per class of a multiclass fit), and one
    ``RandomState`` shared by successive fits consumed as scikit-learn
    consumes it; early stopping scores the unscaled weights, as
    scikit-learn does. Binary, multiclass (modified Huber, L2 with its
    scale factor), regression with averaging, and early stopping."""
    X, y = load_iris(return_X_y=True)
    target = X[:, 0].copy()
    X = sp.csr_matrix(X) if sparse else X
    cases = [
        (SGDClassifier, skl.SGDClassifier, (y == 1).astype(int), dict(loss="hinge", max_iter=8, tol=None)),
        (SGDClassifier, skl.SGDClassifier, y, dict(loss="modified_huber", alpha=0.01, max_iter=10, tol=None)),
        (SGDRegressor, skl.SGDRegressor, target, dict(penalty="elasticnet", average=3, max_iter=6, tol=None)),
        (SGDClassifier, skl.SGDClassifier, y, dict(alpha=1e-3, tol=1e-3, max_iter=1000, early_stopping=True,
                                                   n_iter_no_change=10)),
    ]
    ours_rs, theirs_rs = np.random.RandomState(3), np.random.RandomState(3)
    for est_cls, sk_cls, yy, kw in cases:
        for rs_ours, rs_theirs in ((0, 0), (ours_rs, theirs_rs)):  # an int, then a shared RandomState
            ours = est_cls(random_state=rs_ours, **kw).fit(X, yy)
            theirs = sk_cls(random_state=rs_theirs, **kw).fit(X, yy)
            assert_array_equal(ours.coef_, theirs.coef_)
            assert_array_equal(ours.intercept_, theirs.intercept_)


_EXTRAS = ({}, {"penalty": "elasticnet", "alpha": 0.01}, {"learning_rate": "adaptive", "eta0": 0.01})


# Each (data layout, loss, penalty, learning rate) compiles a lone kernel of
# its own on a fresh clone (~2.5 s of CPU): the default run takes the
# elastic net and the adaptive rate on sparse data (where the penalty of the
# weights trained from mattered), dense data at the defaults; -m slow every
# option on both.
@pytest.mark.parametrize("kind", ["binary", "multiclass", "regressor"])
@pytest.mark.parametrize("early_stopping", [False, True])
@pytest.mark.parametrize("sparse, extras", [
    pytest.param(False, _EXTRAS[:1], id="False-defaults"),
    pytest.param(True, _EXTRAS, id="True"),
    pytest.param(False, _EXTRAS, id="False", marks=pytest.mark.slow),
])
def test_lone_stopping_rule_is_scikit_learns(kind, early_stopping, sparse, extras):
    """Where the stopping rule (``tol``, ``n_iter_no_change``) ends a fit,
    ``n_iter_`` counts the epoch it stopped at and ``t_`` all the samples
    of each epoch (the validation set's too), as scikit-learn's; the rule
    reads scikit-learn's objective (each sample's loss plus the penalty of
    the weights it is trained from, as its ``WeightVector`` keeps their
    norms), so it stops at the same epoch; and a ``partial_fit`` after
    the fit (which starts at ``t_``) continues as scikit-learn's. Before:
    ``n_iter_`` one lower, ``t_`` without the validation samples, and the
    penalty of the epoch's last weights, which stopped some fits epochs
    apart (sparse data, elastic net)."""
    from sklearn.datasets import make_classification, make_regression

    stopped = 0
    for seed in range(3):
        for extra in extras:
            if kind == "regressor":
                X, y = make_regression(120, 6, noise=5.0, random_state=seed)
                ours, theirs = SGDRegressor, skl.SGDRegressor
            else:
                X, y = make_classification(120, 6, n_informative=4, n_classes=3 if kind == "multiclass" else 2,
                                           random_state=seed)
                ours, theirs = SGDClassifier, skl.SGDClassifier
            if sparse:
                X = sp.csr_matrix(np.where(np.abs(X) < 0.5, 0.0, X))
            kw = dict(early_stopping=early_stopping, random_state=seed, tol=1e-3, max_iter=200, n_iter_no_change=3,
                      **extra)
            a, b = theirs(**kw).fit(X, y), ours(**kw).fit(X, y)
            assert (b.n_iter_, b.t_) == (a.n_iter_, a.t_), (seed, extra)
            assert_array_equal(b.coef_, a.coef_)
            assert_array_equal(b.intercept_, a.intercept_)
            stopped += a.n_iter_ < 200
            if extra.get("learning_rate") == "adaptive":
                continue  # (a partial_fit here starts at the rate the fit reached, scikit-learn's at eta0)
            a.partial_fit(X, y)
            b.partial_fit(X, y)
            assert b.t_ == a.t_
            # (to the last bits only mostly: a partial_fit after a fit sometimes differs by an ulp, as before)
            assert_allclose(b.coef_, a.coef_, rtol=1e-9, atol=1e-12)
    assert stopped >= 2 * len(extras)  # the rule ended most fits (two thirds)



def test_the_weights_finite_check_is_exact():
    """A lone fit checks its weights after each epoch as scikit-learn does
    (``_lone.finite``): finite weights whose sum overflows count as finite,
    without a warning; a NaN or an infinity anywhere, or in the intercept,
    does not."""
    from dask_ps.linear_model._lone import finite

    big = np.array([3e38, 3e38, -1.0], dtype=np.float32)  # their float32 sum overflows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert finite(0.0, big)
    assert finite(0.0, np.array([1e308, 1e308]))
    for bad in (np.nan, np.inf, -np.inf):
        assert not finite(0.0, np.array([1.0, bad, 2.0]))
        assert not finite(bad, np.array([1.0, 2.0]))
    assert finite(0.0, np.zeros(0))


def test_a_diverging_lone_fit_fails_as_scikit_learns():
    """Weights that overflow stop the fit with scikit-learn's error, at the
    same epoch."""
    rng = np.random.RandomState(0)
    X = rng.randn(50, 3) * 1e150
    y = rng.randn(50)
    kw = dict(learning_rate="constant", eta0=1e10, max_iter=5, tol=None, random_state=0)
    with pytest.raises(ValueError) as theirs:
        skl.SGDRegressor(**kw).fit(X, y)
    with pytest.raises(ValueError) as ours:
        SGDRegressor(**kw).fit(X, y)
    assert str(ours.value) == str(theirs.value), (str(ours.value), str(theirs.value))
