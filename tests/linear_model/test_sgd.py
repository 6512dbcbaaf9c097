"""SGDClassifier / SGDRegressor trained on the parameter server (issue 4).

One module-scoped LocalCluster(2 workers, 1 thread each) serves every test.
Parity tests compare with scikit-learn on the same data and hyper-parameters;
scikit-learn's SGD accuracy itself varies with the seed by about a point on
these data sets, so the reference is its mean over a few seeds, and the
test is one-sided: at most 1 point (1.5 sparse) below it. (Model averaging
over participants often lands above it: 0.796 vs 0.772 with hinge on the
synthetic problem.)
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import pickle
import subprocess
import sys
import time
import warnings

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_digits, make_classification, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier as SkSGDClassifier
from sklearn.linear_model import SGDRegressor as SkSGDRegressor
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

import dask_ps
from dask_ps.linear_model import SGDClassifier, SGDRegressor
from dask_ps.linear_model import _kernels, _participant, _rounds, _stochastic_gradient

da = pytest.importorskip("dask.array")

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        with Client(cluster) as c:
            yield c


# --- data ------------------------------------------------------------------------------


def _split_scale(X, y, test_size=0.2):
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_size, random_state=0)
    sc = StandardScaler().fit(Xtr)
    return sc.transform(Xtr), sc.transform(Xte), ytr, yte


def _sparse_text(n=20000, d=2**14, nnz=30, seed=0):
    """Bag-of-words-like CSR: Zipf feature popularity, L2-normalized rows, a
    sparse linear truth with label noise."""
    rng = np.random.RandomState(seed)
    p = 1.0 / np.arange(1, d + 1) ** 0.8
    p /= p.sum()
    rows = np.repeat(np.arange(n), nnz)
    cols = rng.choice(d, size=n * nnz, p=p)
    X = sp.csr_matrix((np.ones(n * nnz), (rows, cols)), shape=(n, d))
    X.sum_duplicates()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1))).ravel()
    X = sp.csr_matrix(sp.diags(1.0 / norms) @ X)
    w = rng.randn(d) * (rng.rand(d) < 0.05) * 5
    s = X @ w + 0.3 * rng.randn(n)
    y = (s > np.median(s)).astype(int)
    return X, y


def _sk_mean_score(make, Xtr, ytr, Xte, yte, seeds=range(5)):
    scores = []
    for s in seeds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            scores.append(make(random_state=s).fit(Xtr, ytr).score(Xte, yte))
    return float(np.mean(scores))


# --- the estimator uses the public API only ------------------------------------------------

ALLOWED_DASK_PS_NAMES = {
    "ParameterServer", "get_parameter_server", "checkpoint_metadata", "Consistency", "BSP", "SSP", "ESSP", "VAP", "CVAP", "ASP",
    "report_progress",  # public: a participant's loss for the dashboard's /ps page
    "ParticipantContext",  # public: the participant API its ctx is typed against
}


def test_linear_model_imports_only_public_api():
    """dask_ps.linear_model is written against the public push/pull API: it
    imports public names of dask_ps (and the numpy/cupy helper module), no
    session, transport, plugin or consistency internals."""
    pkg = pathlib.Path(_stochastic_gradient.__file__).parent
    for path in pkg.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dask_ps"):
                if node.module == "dask_ps":
                    names = {a.name for a in node.names}
                    assert names <= ALLOWED_DASK_PS_NAMES | {"_backend"}, (path.name, names)
                else:
                    assert node.module in ("dask_ps._backend",) or node.module.startswith(
                        ("dask_ps.linear_model", "dask_ps._estimators")), (path.name, node.module)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    assert not a.name.startswith("dask_ps.") or a.name == "dask_ps._backend", (path.name, a.name)
    for mod in ("_session", "_transport", "_worker_plugin", "_scheduler_plugin", "_client", "_routing", "_oplog"):
        assert not hasattr(_stochastic_gradient, mod)


# --- pure kernels (no cluster) -----------------------------------------------------------------


class _LocalCtx:
    """A one-participant stand-in for the session: the table is a local array."""

    rank = 0
    n_participants = 1

    def __init__(self, tables):
        self.tables = tables

    def pull(self, name):
        return self.tables[name].copy()

    def pull_rows(self, name, rows):
        return self.tables[name][rows].copy()

    def push(self, name, v):
        self.tables[name] += v

    def push_rows(self, name, rows, v):
        np.add.at(self.tables[name], rows, v)

    def clock(self):
        pass


def _lone_config(est, hp, d, n, max_iter, n_cols=1, sparse=False, classes=(0, 1)):
    """The run configuration of a lone participant without a stats table
    (one round per epoch of ``est.batch_size`` minibatches)."""
    S = int(np.ceil(n / est.batch_size))
    return _rounds._RunConfig(
        table="w", stats_table=None, hp=hp, n_features=d, n_cols=n_cols, n_total=n, steps_per_epoch=S,
        clock_every=S, max_iter=max_iter, t0=1.0, seeds=(0,), staleness=2, global_stop=False, decision_lag=0,
        classes=None if classes is None else np.array(classes), cw_pos=(1.0,), cw_neg=(1.0,),
        eta_init=(est.eta0,), col_freq_needed=sparse,
    )


_ALONE_LOSSES = ["hinge", "log_loss", "modified_huber", "squared_hinge", "perceptron"]
_ALONE_OPTIONS = [{}, {"average": True}, {"penalty": "elasticnet"}, {"learning_rate": "invscaling", "eta0": 0.1}]
# The default run: every loss with the defaults, and each option with one
# loss (each case compiles a kernel of its own: ~1 s of CPU on a fresh
# clone); -m slow: every loss with every option.
_ALONE_DEFAULT = {(0, loss) for loss in _ALONE_LOSSES} | {(1, "hinge"), (2, "log_loss"), (3, "modified_huber")}


@pytest.mark.parametrize("kw, loss", [
    pytest.param(kw, loss, id=f"kw{i}-{loss}", marks=() if (i, loss) in _ALONE_DEFAULT else pytest.mark.slow)
    for i, kw in enumerate(_ALONE_OPTIONS) for loss in _ALONE_LOSSES])
def test_participant_alone_is_sklearn(loss, kw):
    """One participant, no shuffling: the participant loop, minibatch after
    minibatch, reproduces scikit-learn's per-sample SGD exactly. (L1: the
    cumulative penalty restarts at each kernel call, so only one call.)"""
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    l1 = "penalty" in kw
    max_iter = 1 if l1 else 3
    ref = SkSGDClassifier(loss=loss, shuffle=False, max_iter=max_iter, tol=None, **kw).fit(X, y)
    est = SGDClassifier(loss=loss, shuffle=False, max_iter=max_iter, tol=None, batch_size=len(y) if l1 else 64, **kw)
    hp = est._hyper(1, False)
    d = X.shape[1]
    n_cols = 2 if est.average else 1
    cfg = _lone_config(est, hp, d, len(y), max_iter, n_cols=n_cols)
    tables = {"w": np.zeros((d + 1, n_cols))}
    _participant._participant_loop(_LocalCtx(tables), _participant._PartData(X, y, np.ones(len(y))), cfg)
    W = tables["w"]
    col = 1 if est.average else 0
    np.testing.assert_allclose(W[:d, col], ref.coef_[0], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(W[d, col], ref.intercept_[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("penalty,max_iter", [("l2", 3), ("elasticnet", 1)])
def test_sparse_participant_alone_is_sklearn(penalty, max_iter):
    """One participant on sparse data, no shuffling: one round per epoch
    touches every feature its samples have, so the lazy regularization adds
    nothing and the compiled round kernel is scikit-learn's SGD (rare
    features were over-shrunk when the round's touch probability was taken
    as if its samples were drawn with replacement: 0.76x scikit-learn's
    magnitude for features seen once or twice). L1: one epoch, the
    cumulative penalty restarts at each round."""
    X, y = _sparse_text(n=3000, d=2**12, nnz=10)
    X = sp.csr_matrix(X)
    kw = dict(loss="log_loss", shuffle=False, max_iter=max_iter, tol=None, penalty=penalty)
    ref = SkSGDClassifier(**kw).fit(X, y)
    est = SGDClassifier(batch_size=256, **kw)
    hp = est._hyper(1, True)
    d = X.shape[1]
    cfg = _lone_config(est, hp, d, len(y), max_iter, sparse=True)
    tables = {"w": np.zeros((d + 1, 1))}
    with dask.config.set({"ps.sgd.compiled": True}):
        _participant._participant_loop(_LocalCtx(tables), _participant._PartData(X, y, np.ones(len(y))), cfg)
    scale = np.abs(ref.coef_).max()
    np.testing.assert_allclose(tables["w"][:d, 0], ref.coef_[0], rtol=1e-7, atol=1e-9 * scale)
    np.testing.assert_allclose(tables["w"][d, 0], ref.intercept_[0], rtol=1e-7, atol=1e-9 * scale)


def _sk_loss_function(loss, epsilon):
    """scikit-learn's Cython loss object (the test oracle of the losses)."""
    cls, *args = SkSGDClassifier.loss_functions[loss]
    if loss in ("huber", "epsilon_insensitive", "squared_epsilon_insensitive"):
        args = (epsilon,)
    return cls(*args)


@pytest.mark.parametrize("cls, loss, rate, sparse, zero_row", [
    (SGDClassifier, "hinge", "pa1", False, True), (SGDClassifier, "hinge", "pa2", True, False),
    (SGDRegressor, "epsilon_insensitive", "pa1", True, False),
    (SGDRegressor, "epsilon_insensitive", "pa2", False, True),
])
def test_passive_aggressive_participant_alone_is_sklearn(cls, loss, rate, sparse, zero_row):
    """The compiled kernel has scikit-learn's passive-aggressive rules (PA-I,
    PA-II): one participant without shuffling is scikit-learn's SGD, dense
    and sparse, with averaging, or with an all-zero row (which PA-I skips
    without advancing ``t``: the averaging would then start one sample later
    per epoch here, where each epoch starts at its global count)."""
    if cls is SGDClassifier:
        X, y = load_breast_cancer(return_X_y=True)
        sk_cls = SkSGDClassifier
    else:
        X, y = make_regression(600, 12, noise=5.0, random_state=0)
        y = y / y.std()
        sk_cls = SkSGDRegressor
    X = StandardScaler().fit_transform(X)
    if zero_row:
        X[3] = 0.0
    if sparse:
        X = sp.csr_matrix(np.where(np.abs(X) > 0.5, X, 0.0))
    kw = dict(loss=loss, learning_rate=rate, eta0=0.5, penalty=None, shuffle=False, max_iter=3, tol=None,
              average=False if zero_row else 10)
    ref = sk_cls(**kw).fit(X, y)
    est = cls(batch_size=64, **kw)
    hp = est._hyper(1, sparse)
    d = X.shape[1]
    cfg = _lone_config(est, hp, d, len(y), 3, n_cols=2, sparse=sparse,
                       classes=(0, 1) if cls is SGDClassifier else None)
    tables = {"w": np.zeros((d + 1, 2))}
    _participant._participant_loop(_LocalCtx(tables), _participant._PartData(X, y, np.ones(len(y))), cfg)
    W = tables["w"]
    col = 0 if zero_row else 1  # the averaged weights' column
    np.testing.assert_allclose(W[:d, col], ref.coef_.ravel(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(W[d, col], ref.intercept_[0], rtol=1e-9, atol=1e-9)
    if not zero_row:
        np.testing.assert_allclose(W[:d, 0], ref._standard_coef.ravel(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("loss", ["hinge", "log_loss", "modified_huber", "squared_hinge", "squared_error",
                                  "huber", "epsilon_insensitive", "squared_epsilon_insensitive"])
def test_loss_gradients_match_sklearn(loss):
    """The array-API losses (used by the minibatch kernel and the stopping
    rule) are scikit-learn's Cython ones."""
    sk = _sk_loss_function(loss, 0.1)
    rng = np.random.RandomState(0)
    p = rng.randn(50) * 3
    y = (rng.rand(50) > 0.5).astype(float)
    if loss != "log_loss":
        y = 2 * y - 1
    if loss in ("squared_error", "huber", "epsilon_insensitive", "squared_epsilon_insensitive"):
        y = rng.randn(50)
    g = _kernels._loss_gradient(loss, y, p, 0.1, np)
    lv = _kernels._loss_value(loss, y, p, 0.1, np)
    if hasattr(sk, "py_dloss"):
        ref_g = np.array([sk.py_dloss(pi, yi) for pi, yi in zip(p, y)])
        ref_l = np.array([sk.py_loss(pi, yi) for pi, yi in zip(p, y)])
    else:  # sklearn._loss objects
        ref_g, ref_l = np.empty(50), np.empty(50)
        sk.gradient(y, p, None, ref_g, 1)
        sk.loss(y, p, None, ref_l, 1)
    np.testing.assert_allclose(g, ref_g, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lv, ref_l, rtol=1e-10, atol=1e-12)


def test_minibatch_kernel_learns():
    """The array-API minibatch kernel (the cupy path) trains a usable model."""
    X, y = make_classification(4000, 20, random_state=0)
    X = StandardScaler().fit_transform(X)
    est = SGDClassifier(loss="log_loss", learning_rate="constant", eta0=0.01)
    hp = est._hyper(1, False)
    W = np.zeros((21, 1))
    Y = (y == 1).astype(float)[:, None]
    for epoch in range(5):
        for idx in np.array_split(np.arange(4000), 40):
            W, _ = _kernels._minibatch_kernel(hp, W, None, X[idx], Y[idx], np.ones(len(idx)), np.ones(1), np.ones(1),
                                          np.arange(len(idx), dtype=float) + 1, np.ones(1) * 0.01,
                                          np.ones(1, bool), 1.0)
    acc = np.mean(((X @ W[:20, 0] + W[20, 0]) > 0) == y)
    ref = SkSGDClassifier(loss="log_loss", random_state=0).fit(X, y).score(X, y)
    assert acc > ref - 0.02


# --- fitting on the cluster -----------------------------------------------------------------------


def test_single_participant_fit_equals_sklearn(client):
    """A small input trains on one participant: the fit is scikit-learn's."""
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    kw = dict(loss="log_loss", shuffle=False, max_iter=4, tol=None, average=True)
    ref = SkSGDClassifier(**kw).fit(X, y)
    est = SGDClassifier(**kw).fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)
    assert est.t_ == ref.t_ and est.n_iter_ == ref.n_iter_ == 4


@pytest.mark.parametrize("loss", ["hinge", "log_loss"])
def test_parity_digits(client, loss):
    Xtr, Xte, ytr, yte = _split_scale(*load_digits(return_X_y=True))
    ref = _sk_mean_score(lambda **k: SkSGDClassifier(loss=loss, **k), Xtr, ytr, Xte, yte)
    est = SGDClassifier(loss=loss, random_state=0).fit(Xtr, ytr)
    assert est.classes_.tolist() == list(range(10)) and est.coef_.shape == (10, 64)
    assert est.score(Xte, yte) >= ref - 0.01, (est.score(Xte, yte), ref)


def test_parity_digits_two_participants(client):
    """The same with the data split over both workers (local SGD with model
    averaging through the parameter server)."""
    Xtr, Xte, ytr, yte = _split_scale(*load_digits(return_X_y=True))
    kw = dict(loss="log_loss", average=True, max_iter=20, tol=None)
    ref = _sk_mean_score(lambda **k: SkSGDClassifier(**kw, **k), Xtr, ytr, Xte, yte)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 100}):
        est = SGDClassifier(random_state=0, **kw).fit(Xtr, ytr)
    assert est.score(Xte, yte) >= ref - 0.01, (est.score(Xte, yte), ref)


@pytest.mark.parametrize("loss", ["hinge", "log_loss"])
def test_parity_breast_cancer(client, loss):
    Xtr, Xte, ytr, yte = _split_scale(*load_breast_cancer(return_X_y=True))
    kw = dict(loss=loss, average=True)  # ASGD: the seed noise of plain SGD is a point here
    ref = _sk_mean_score(lambda **k: SkSGDClassifier(**kw, **k), Xtr, ytr, Xte, yte)
    est = SGDClassifier(random_state=0, **kw).fit(Xtr, ytr)
    assert est.score(Xte, yte) >= ref - 0.01, (est.score(Xte, yte), ref)


def _synthetic_parity(n, loss):
    X, y = make_classification(n, 50, n_informative=20, random_state=0)
    Xtr, Xte, ytr, yte = _split_scale(X, y)
    ref = _sk_mean_score(lambda **k: SkSGDClassifier(loss=loss, **k), Xtr, ytr, Xte, yte, seeds=range(3))
    with dask.config.set({"ps.sgd.min-samples-per-participant": 5000}):  # two participants
        est = SGDClassifier(loss=loss, random_state=0).fit(Xtr, ytr)
    return est.score(Xte, yte), ref


@pytest.mark.parametrize("loss", ["hinge", "log_loss"])
def test_parity_synthetic_dense(client, loss):
    acc, ref = _synthetic_parity(15000, loss)
    assert acc >= ref - 0.01, (acc, ref)


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["hinge", "log_loss"])
def test_parity_synthetic_dense_large(client, loss):
    acc, ref = _synthetic_parity(300000, loss)
    assert acc >= ref - 0.01, (acc, ref)


def test_parity_regression(client):
    X, y = make_regression(20000, 50, noise=10.0, random_state=0)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0)
    ref = SkSGDRegressor(random_state=0).fit(Xtr, ytr).score(Xte, yte)
    est = SGDRegressor(random_state=0).fit(Xtr, ytr)
    assert est.coef_.shape == (50,) and est.intercept_.shape == (1,)
    assert est.score(Xte, yte) >= ref - 0.01, (est.score(Xte, yte), ref)


@pytest.mark.parametrize("loss", ["hinge", "log_loss"])
def test_parity_sparse_text(client, loss):
    X, y = _sparse_text()
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0)
    ref = _sk_mean_score(lambda **k: SkSGDClassifier(loss=loss, **k), Xtr, ytr, Xte, yte, seeds=range(3))
    est = SGDClassifier(loss=loss, random_state=0, batch_size=1024).fit(Xtr, ytr)
    assert est.score(Xte, yte) >= ref - 0.015, (est.score(Xte, yte), ref)


def test_sparse_pulls_only_touched_rows(client):
    """A sparse fit moves the rows its rounds touch, not the whole table."""
    X, y = _sparse_text(n=12000, d=2**16, nnz=10)
    est = SGDClassifier(loss="log_loss", penalty=None, max_iter=2, tol=None, random_state=0)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000, "ps.sgd.clock-samples": 1024}):
        est.fit(X, y)
    ps = dask_ps.get_parameter_server(client)
    run = list(ps.metrics().values())[-1]
    table_bytes = (2**16 + 1) * 8
    for part in run["participants"].values():
        m = next(v for k, v in part["tables"].items() if not k.endswith("-stats"))
        assert m["bytes_pushed"] / m["flushes"] < table_bytes / 2, m


def test_unsorted_csr_trains_as_sorted_and_is_left_as_given(client):
    """Column indices in any order within a row (e.g. from a matrix
    product) train the same model, up to rounding, as the canonical CSR, and
    the caller's matrix is not rewritten (the fit used to sort its indices
    in place: 0.14 s per 450k rows, for nothing the kernels need)."""
    X, y = _sparse_text(n=2000, d=2**12, nnz=15)
    X = sp.csr_matrix(X)
    X.sort_indices()
    Xu = X.copy()
    rng = np.random.default_rng(0)
    for r in range(Xu.shape[0]):  # reverse or shuffle each row's entries
        lo, hi = Xu.indptr[r], Xu.indptr[r + 1]
        perm = lo + rng.permutation(hi - lo)
        Xu.indices[lo:hi], Xu.data[lo:hi] = Xu.indices[perm], Xu.data[perm]
    Xu.has_sorted_indices = False
    before = Xu.indices.copy()
    assert not np.array_equal(before, X.indices)
    kw = dict(loss="log_loss", shuffle=False, tol=None, max_iter=3, random_state=0)
    a = SGDClassifier(**kw).fit(X, y)
    b = SGDClassifier(**kw).fit(Xu, y)
    np.testing.assert_array_equal(Xu.indices, before)
    np.testing.assert_allclose(b.coef_, a.coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b.intercept_, a.intercept_, rtol=1e-9, atol=1e-12)


def test_consistency_models(client):
    X, y = make_classification(3000, 400, n_informative=20, flip_y=0.3, random_state=0)
    X = StandardScaler().fit_transform(X)
    scores = {}
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000}):
        for c in (dask_ps.BSP(), dask_ps.SSP(staleness=1), dask_ps.ASP()):
            est = SGDClassifier(loss="log_loss", random_state=0, consistency=c, max_iter=20).fit(X, y)
            scores[repr(c)] = est.score(X, y)
    # scikit-learn's own seeds span 0.668-0.691 on this noisy set: the reference is its
    # worst of ten minus 0.02, as in benchmarks/sgd_quality.py (seed 0 alone is its best,
    # which its seeds 5, 7 and 8 would fail by the old margin).
    ref = min(
        SkSGDClassifier(loss="log_loss", random_state=seed, max_iter=20).fit(X, y).score(X, y)
        for seed in range(10)
    )
    for s in scores.values():
        assert s > ref - 0.02, (scores, ref)


def test_partial_fit_equals_fit(client):
    """Two partial_fit calls are one fit with max_iter=2 (one participant, no shuffle)."""
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    a = SGDClassifier(shuffle=False, tol=None, max_iter=2).fit(X, y)
    b = SGDClassifier(shuffle=False, tol=None)
    b.partial_fit(X, y, classes=np.unique(y))
    b.partial_fit(X, y)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-9)
    np.testing.assert_allclose(a.intercept_, b.intercept_, rtol=1e-9)
    assert a.t_ == b.t_


def test_partial_fit_improves_and_checks(client):
    X, y = make_classification(3000, 20, n_classes=3, n_informative=5, random_state=0)
    est = SGDClassifier(loss="log_loss", random_state=0)
    with pytest.raises(ValueError, match="classes must be passed"):
        est.partial_fit(X, y)
    est.partial_fit(X[:1000], y[:1000], classes=[0, 1, 2])
    s1 = est.score(X[2000:], y[2000:])
    for _ in range(3):
        est.partial_fit(X[1000:2000], y[1000:2000])
    assert est.score(X[2000:], y[2000:]) >= s1 - 0.02
    with pytest.raises(ValueError, match="classes should include all valid labels"):
        est.partial_fit(X[:10], np.full(10, 7))
    with pytest.raises(ValueError, match="features"):
        est.partial_fit(X[:10, :5], y[:10])
    r = SGDRegressor(random_state=0)
    Xr, yr = make_regression(2000, 10, random_state=0)
    for _ in range(5):
        r.partial_fit(Xr, yr)
    assert r.score(Xr, yr) > 0.9


def test_pickle_predicts_without_cluster(client, tmp_path):
    X, y = load_digits(return_X_y=True)
    est = SGDClassifier(loss="log_loss", random_state=0, client=client).fit(X, y)
    blob = pickle.dumps(est)
    again = pickle.loads(blob)
    assert again.client is None
    np.testing.assert_array_equal(again.predict(X), est.predict(X))
    # The fitted model holds numpy arrays and plain values only.
    for k, v in vars(again).items():
        assert type(v).__module__.split(".")[0] in ("numpy", "builtins", "sklearn"), (k, type(v))
    path = tmp_path / "model.pkl"
    path.write_bytes(blob)
    code = (
        "import pickle, sys, numpy as np\n"
        "from sklearn.datasets import load_digits\n"
        f"m = pickle.load(open({str(path)!r}, 'rb'))\n"
        "X, y = load_digits(return_X_y=True)\n"
        "print(m.score(X, y))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert abs(float(out.stdout.strip()) - est.score(X, y)) < 1e-12


def test_clone_keeps_client(client):
    from sklearn.base import clone

    est = SGDClassifier(alpha=1e-3, client=client)
    c = clone(est)
    assert c.client is client and c.alpha == 1e-3


def test_bad_input_raises_sklearn_errors(client):
    X, y = make_classification(200, 5, random_state=0)
    Xn = X.copy()
    Xn[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        SGDClassifier().fit(Xn, y)
    Xi = X.copy()
    Xi[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        SGDRegressor().fit(Xi, y.astype(float))
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        SGDClassifier().fit(X, y[:-1])
    with pytest.raises(ValueError, match="Unknown label type"):
        SGDClassifier().fit(X, np.linspace(0, 1, 200))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        SGDClassifier(alpha=0.0).fit(X, y)
    with pytest.raises(ValueError, match="loss"):
        SGDClassifier(loss="nope").fit(X, y)
    est = SGDClassifier(max_iter=5).fit(X, y)
    with pytest.raises(ValueError, match="X has 4 features, but SGDClassifier is expecting 5"):
        est.predict(X[:, :4])
    dX = da.from_array(Xn, chunks=(50, 5))
    with pytest.raises(ValueError, match="NaN"):
        SGDClassifier().fit(dX, da.from_array(y, chunks=50))
    with pytest.raises(ValueError, match="X has 4 features"):
        est.predict(da.from_array(X[:, :4], chunks=(50, 4)))


def test_dask_array_input(client):
    X, y = make_classification(20000, 20, random_state=0)
    X = StandardScaler().fit_transform(X)
    dX = da.from_array(X, chunks=(2500, 20))
    dy = da.from_array(y, chunks=2500)
    est = SGDClassifier(loss="log_loss", random_state=0).fit(dX, dy)
    # Not yet computed when fit starts: each worker that holds blocks once
    # Dask computed them trains them (one participant each). Which workers
    # those are is Dask's choice (usually both, not always: a busy worker
    # gets none), so this asserts what holds either way; blocks placed on
    # two named workers give two participants (test_dropin_params.py,
    # test_n_jobs_caps_a_dask_input_held_by_more_workers).
    assert len(est.metrics_) in (1, 2), len(est.metrics_)
    assert sum(m["samples"] for m in est.metrics_) == est.n_iter_ * 20000  # every row, every epoch
    ref = SkSGDClassifier(loss="log_loss", random_state=0).fit(X, y).score(X, y)
    assert est.score(X, y) > ref - 0.01
    pred = est.predict(dX)
    assert isinstance(pred, da.Array)
    np.testing.assert_array_equal(pred.compute(), est.predict(X))
    proba = est.predict_proba(dX)
    assert isinstance(proba, da.Array) and proba.shape == (20000, 2)
    np.testing.assert_allclose(proba.compute(), est.predict_proba(X))
    np.testing.assert_allclose(est.decision_function(dX).compute(), est.decision_function(X))
    # sparse chunks: trained to convergence (after 5 epochs the intercept,
    # updated 100x slower on sparse data as in scikit-learn, is not there
    # yet: scikit-learn's own 5-epoch fits of this CSR score 0.79-0.82, ours
    # 0.72-0.84 under the default staleness; at 20 epochs 0.832-0.840)
    sX = dX.map_blocks(sp.csr_matrix, meta=sp.csr_matrix((0, 20)))
    est2 = SGDClassifier(loss="log_loss", random_state=0, max_iter=20).fit(sX, dy)
    assert est2.score(X, y) > ref - 0.015


def test_dask_classes_from_the_parts_label_counts(client, monkeypatch):
    """The classes and the 'balanced' class weights of a dask y come from
    the label counts of the parts the fit prepares anyway: no other pass
    over y (a graph computed for ``da.unique`` cost ~50 ms a fit), and the
    same classes, weights and model as the in-memory fit's."""
    import distributed

    X, y = make_classification(4000, 8, n_classes=3, n_informative=4, weights=[0.6, 0.3, 0.1], random_state=0)
    y = np.array([7, 2, 40])[y]  # labels that are not 0..K-1
    dX, dy = da.from_array(X, chunks=1000), da.from_array(y, chunks=1000)

    def no_compute(*args, **kwargs):
        raise AssertionError("a graph was computed on the client to find the classes")

    monkeypatch.setattr(distributed.Client, "compute", no_compute)
    est = SGDClassifier(max_iter=2, tol=None, class_weight="balanced", random_state=0, client=client).fit(dX, dy)
    monkeypatch.undo()
    np.testing.assert_array_equal(est.classes_, [2, 7, 40])
    counts = np.array([np.sum(y == c) for c in (2, 7, 40)])
    np.testing.assert_allclose(est._expanded_class_weight, len(y) / (3 * counts))
    assert est.score(X, y) > 0.6


def test_dask_parts_released_when_the_fit_fails_before_training(client):
    """The parts a dask fit prepares before its targets are let go when the
    call fails before training took them (here: a ``coef_init`` of the
    wrong shape), even while the error's traceback is kept (as a notebook
    keeps the last one)."""
    import gc

    X, y = make_classification(2000, 8, random_state=0)
    dX, dy = client.persist([da.from_array(X, chunks=500), da.from_array(y, chunks=500)])
    gc.collect()
    before = set(client.futures)
    with pytest.raises(ValueError, match="coef_init") as kept:
        SGDClassifier(max_iter=1, client=client).fit(dX, dy, coef_init=np.zeros((1, 3)))
    gc.collect()
    deadline = time.monotonic() + 10  # the client drops released futures on its event loop
    while not set(client.futures) <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kept.tb is not None and set(client.futures) <= before


def test_dask_dataframe_input(client):
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    X, y = make_regression(8000, 10, noise=1.0, random_state=0)
    cols = [f"f{i}" for i in range(10)]
    df = dd.from_pandas(pd.DataFrame(X, columns=cols), npartitions=4)
    ys = dd.from_pandas(pd.Series(y), npartitions=4)
    est = SGDRegressor(random_state=0).fit(df, ys)
    assert list(est.feature_names_in_) == cols and est.n_features_in_ == 10
    assert est.score(pd.DataFrame(X, columns=cols), y) > 0.99
    pred = est.predict(df)
    assert isinstance(pred, da.Array)
    np.testing.assert_allclose(pred.compute(), est.predict(X), rtol=1e-10)


def test_verbose_prints_progress(client, capsys):
    X, y = load_breast_cancer(return_X_y=True)
    SGDClassifier(max_iter=3, tol=None, verbose=1).fit(StandardScaler().fit_transform(X), y)
    out = capsys.readouterr().out
    assert "-- Epoch 1" in out and "samples/s" in out


def test_metrics_per_participant(client, sgd_by_rows):
    """metrics_: one dict per participant of the fit's run, with its session's
    counters, its timings and its per-epoch history."""
    X, y = make_classification(30000, 20, random_state=0)
    est = SGDClassifier(max_iter=3, tol=None, random_state=0).fit(StandardScaler().fit_transform(X), y)
    assert len(est.metrics_) == 2  # one participant per worker
    for m in est.metrics_:
        assert m["clock"] >= 3 and "tables" in m and m["ps_seconds"] >= 0 and m["cpu_seconds"] > 0
        assert m["samples"] == 3 * 15000 and [h["epoch"] for h in m["history"]] == [1, 2, 3]
    assert pickle.loads(pickle.dumps(est)).metrics_[0]["samples"] == 45000


@pytest.mark.parametrize("early_stopping", [False, True])
def test_n_iter_counts_the_epoch_the_rule_stops_at(client, early_stopping):
    """Several participants: ``n_iter_`` counts the epochs trained, the one
    at whose end the stopping rule ended the fit included, as scikit-learn
    counts them (issue 24; it was one lower), and ``t_`` is ``1 +
    n_iter_ * n_samples``, as scikit-learn's, validation samples counted."""
    X, y = make_classification(3000, 20, random_state=0)
    X = StandardScaler().fit_transform(X)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000}):
        est = SGDClassifier(early_stopping=early_stopping, n_iter_no_change=3, random_state=0).fit(X, y)
    assert len(est.metrics_) == 2 and est.n_iter_ < est.max_iter
    for m in est.metrics_:
        assert [h["epoch"] for h in m["history"]] == list(range(1, est.n_iter_ + 1))
        assert m["history"][-1]["active"] == 0
    assert est.t_ == 1.0 + est.n_iter_ * X.shape[0]


def test_early_stopping_and_n_iter_no_change(client):
    X, y = make_classification(3000, 20, random_state=0)
    X = StandardScaler().fit_transform(X)
    est = SGDClassifier(early_stopping=True, n_iter_no_change=3, random_state=0).fit(X, y)
    assert est.n_iter_ < 1000
    est = SGDClassifier(tol=1e-1, n_iter_no_change=2, random_state=0).fit(X, y)
    assert est.n_iter_ <= 10
    r = SGDRegressor(learning_rate="adaptive", random_state=0).fit(*make_regression(2000, 5, random_state=0))
    assert r.n_iter_ < 1000


# --- scikit-learn's estimator checks ---------------------------------------------------------------

# SGD is stochastic: fitting with integer sample weights is not the same run
# as fitting on repeated samples (scikit-learn marks these xfail for its own
# SGD estimators too).
EXPECTED_FAILED = {
    "check_sample_weight_equivalence_on_dense_data": "SGD's sample order differs when samples are repeated",
    "check_sample_weight_equivalence_on_sparse_data": "SGD's sample order differs when samples are repeated",
}

# A representative subset for the default run; the full list runs under -m slow.
QUICK_CHECKS = {
    "check_no_attributes_set_in_init", "check_estimators_dtypes", "check_fit_score_takes_y",
    "check_estimators_fit_returns_self", "check_estimators_pickle", "check_fit2d_1sample",
    "check_fit2d_1feature", "check_fit1d", "check_estimators_nan_inf", "check_n_features_in",
    "check_classifiers_train", "check_classifiers_regression_target", "check_regressors_train",
    "check_supervised_y_2d", "check_dont_overwrite_parameters", "check_fit_idempotent",
    "check_estimator_sparse_array", "check_estimator_sparse_matrix", "check_dtype_object",
    "check_fit_check_is_fitted", "check_get_params_invariance", "check_set_params",
    "check_classifiers_one_label", "check_estimators_partial_fit_n_features",
    "check_classifiers_classes", "check_regressor_data_not_an_array",
}


def _check_params():
    from sklearn.utils.estimator_checks import estimator_checks_generator

    params = []
    for est in (SGDClassifier(random_state=0), SGDRegressor(random_state=0)):
        for estimator, check in estimator_checks_generator(est, legacy=True):
            f = getattr(check, "func", check)
            name = getattr(f, "__name__", str(f))
            marks = [] if name in QUICK_CHECKS else [pytest.mark.slow]
            if name in EXPECTED_FAILED:
                marks.append(pytest.mark.xfail(reason=EXPECTED_FAILED[name], strict=True))
            params.append(pytest.param(estimator, check, id=f"{type(est).__name__}-{name}", marks=marks))
    return params


@pytest.mark.parametrize("estimator, check", _check_params())
def test_sklearn_compatible(client, estimator, check):
    check(estimator)


# --- GPU --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_minibatch_kernel_on_cupy():
    cupy = pytest.importorskip("cupy")
    X, y = make_classification(4000, 32, random_state=0)
    X = StandardScaler().fit_transform(X)
    est = SGDClassifier(loss="log_loss", learning_rate="constant", eta0=0.01)
    hp = est._hyper(1, False)
    W = cupy.zeros((33, 1))
    Xc = cupy.asarray(X)
    Y = cupy.asarray((y == 1).astype(float)[:, None])
    for idx in np.array_split(np.arange(4000), 20):
        W, _ = _kernels._minibatch_kernel(hp, W, None, Xc[idx], Y[idx], cupy.ones(len(idx)), np.ones(1), np.ones(1),
                                      cupy.arange(len(idx), dtype=float) + 1, np.ones(1) * 0.01,
                                      np.ones(1, bool), 1.0)
    assert isinstance(W, cupy.ndarray)
    acc = float(cupy.mean(((Xc @ W[:32, 0] + W[32, 0]) > 0) == cupy.asarray(y)))
    assert acc > 0.8


# --- resuming: retried participants, checkpoints, a worker killed mid-fit (issue 6) ---------------


class _RecordingCtx:
    """A participant's session over local tables (as ``_LocalCtx``) that
    records every push with its clock and snapshots the tables at each
    clock: what a retried participant finds in the run."""

    def __init__(self, tables, rank=0, n_participants=2, clock=0):
        self.tables = tables
        self.rank = rank
        self.n_participants = n_participants
        self.current_clock = clock
        self.pushes = []
        self.snapshots = {clock: {k: v.copy() for k, v in tables.items()}}

    def pull(self, name):
        return self.tables[name].copy()

    def pull_rows(self, name, rows):
        return self.tables[name][rows].copy()

    def push(self, name, v):
        self.pushes.append((self.current_clock, name, None, np.array(v)))
        self.tables[name] += v

    def push_rows(self, name, rows, v):
        self.pushes.append((self.current_clock, name, np.array(rows), np.array(v)))
        np.add.at(self.tables[name], rows, v)

    def clock(self):
        self.current_clock += 1
        self.snapshots[self.current_clock] = {k: v.copy() for k, v in self.tables.items()}


def _fake_run_config(est, X, y, global_stop, max_iter, steps=8, clock_every=3, n_participants=2):
    hp = est._hyper(1, sp.issparse(X))
    d = X.shape[1]
    cfg = _rounds._RunConfig(
        table="w", stats_table="s", hp=hp, n_features=d, n_cols=1, n_total=X.shape[0] * n_participants,
        steps_per_epoch=steps, clock_every=clock_every, max_iter=max_iter, t0=1.0, seeds=(7, 8),
        staleness=1 if global_stop else None, global_stop=global_stop, decision_lag=1 if global_stop else 0,
        classes=np.array([0, 1]), cw_pos=(1.0,), cw_neg=(1.0,), eta_init=(est.eta0,),
        col_freq_needed=sp.issparse(X), stats_stride=max_iter,
    )
    rows = max_iter if global_stop else n_participants * max_iter
    tables = {"w": np.zeros((d + 1, 1)), "s": np.zeros((rows, 2 + 4))}
    return cfg, tables


def _decisions(result):
    return [(h["epoch"], h["decided"], repr(h["objective"]), h["active"]) for h in result["history"]]


def _same_pushes(a, b):
    assert len(a) == len(b)
    for (ca, na, ra, va), (cb, nb, rb, vb) in zip(a, b):
        assert (ca, na) == (cb, nb)
        assert (ra is None and rb is None) or np.array_equal(ra, rb)
        np.testing.assert_array_equal(va, vb)


@pytest.mark.parametrize("global_stop", [True, False])
@pytest.mark.parametrize("sparse", [False, True])
def test_retried_participant_repeats_the_pushes_of_its_clock(global_stop, sparse):
    """Under BSP, a participant restarted at ``ctx.current_clock`` C (Dask
    retried it after its worker died), finding the tables as they were at
    clock C, makes exactly the pushes the first attempt made from clock C on
    (same clock, same rows, bitwise the same values), and ends with the same
    stopping state -- in mid-epoch and at an epoch boundary. A chunked run
    (epochs 0-4, then 5-11 from the returned state) makes them too. (Under a
    staleness bound a participant keeps its own model, which a retry does
    not have: ``test_retried_participant_under_staleness_replays_its_schedule``.)"""
    X, y = make_classification(600, 6, random_state=0)
    X = StandardScaler().fit_transform(X)
    if sparse:
        X = sp.csr_matrix(np.where(np.abs(X) > 0.7, X, 0.0))
    # adaptive: each epoch without improvement divides eta by 5 -- a stopping
    # state that the pushes depend on. Not an L1 penalty: its Tsuruoka state
    # carries over the rounds and a retry starts it afresh (as a retry under
    # a staleness bound starts from its read: below, and docs/architecture.rst)
    est = SGDClassifier(learning_rate="adaptive", eta0=0.5, tol=1e-1, n_iter_no_change=1, penalty="l2")
    part = _participant._PartData(X, y, np.ones(600))
    cfg, tables = _fake_run_config(est, X, y, global_stop, max_iter=12)
    cfg = dataclasses.replace(cfg, staleness=0)  # BSP
    full = _RecordingCtx({k: v.copy() for k, v in tables.items()})
    res = _participant._participant_loop(full, part, cfg)
    assert full.current_clock >= 22  # 3 clocks per epoch; went past the resume points below
    assert res["state"]["stop"]["eta"][0] < 0.5 / 5**3  # eta changed
    for c in (4, 16, 21):  # epoch 1 round 1, epoch 5 round 1, the start of epoch 7
        retry = _RecordingCtx({k: v.copy() for k, v in full.snapshots[c].items()}, clock=c)
        again = _participant._participant_loop(retry, part, cfg)
        _same_pushes(retry.pushes, [p for p in full.pushes if p[0] >= c])
        assert again["n_iter"] == res["n_iter"] and again["state"] == res["state"]
        assert _decisions(again) == _decisions(res)
    # chunked: the same pushes, the same end state
    first = _RecordingCtx({k: v.copy() for k, v in tables.items()})
    r1 = _participant._participant_loop(first, part, dataclasses.replace(cfg, max_iter=5))
    second = _RecordingCtx(first.tables)
    r2 = _participant._participant_loop(second, part, dataclasses.replace(cfg, epoch0=5, states=(r1["state"],)))
    chunked = first.pushes + [(c + first.current_clock, *rest) for c, *rest in second.pushes]
    _same_pushes(chunked, full.pushes)
    assert r2["state"] == res["state"]


def _retry_replays_its_schedule(est, sparse, bsp, c=7):
    """A participant's whole run and a retry of it at clock ``c`` (from the
    tables as they were there): asserts the retry replays the schedule
    (the same clocks, tables and rows from ``c`` on, the same draws and
    epochs); returns the two final weight tables ``(full, retry)``."""
    X, y = make_classification(600, 6, random_state=0)
    X = StandardScaler().fit_transform(X)
    if sparse:
        X = sp.csr_matrix(np.where(np.abs(X) > 0.7, X, 0.0))
    part = _participant._PartData(X, y, np.ones(600))
    cfg, tables = _fake_run_config(est, X, y, True, max_iter=6)
    if bsp:
        cfg = dataclasses.replace(cfg, staleness=0)
    full = _RecordingCtx({k: v.copy() for k, v in tables.items()})
    res = _participant._participant_loop(full, part, cfg)
    retry = _RecordingCtx({k: v.copy() for k, v in full.snapshots[c].items()}, clock=c)
    again = _participant._participant_loop(retry, part, cfg)
    schedule = [(p[0], p[1], None if p[2] is None else p[2].tolist()) for p in full.pushes if p[0] >= c]
    assert [(p[0], p[1], None if p[2] is None else p[2].tolist()) for p in retry.pushes] == schedule
    assert again["state"]["rng"] == res["state"]["rng"] and again["n_iter"] == res["n_iter"]
    return full.tables["w"], retry.tables["w"]


@pytest.mark.parametrize("sparse", [False, True])
def test_retried_participant_with_an_l1_penalty_replays_its_schedule(sparse):
    """An L1 penalty's state (Tsuruoka's ``q`` per weight, ``u``) carries over
    a participant's rounds; a retry at clock C starts it afresh. The retry
    replays the schedule (the same clocks and rows, the same stopping
    decisions) and leaves a table near the first attempt's."""
    est = SGDClassifier(learning_rate="constant", eta0=0.05, tol=None, penalty="elasticnet", alpha=1e-3)
    w_full, w_retry = _retry_replays_its_schedule(est, sparse, bsp=True)
    assert np.linalg.norm(w_retry - w_full) <= 0.05 * np.linalg.norm(w_full)


@pytest.mark.parametrize("sparse", [False, True])
def test_retried_participant_under_staleness_replays_its_schedule(sparse):
    """Under SSP a participant pushes ``(W - M) / P``, ``M`` its own last
    model, which a retry at clock C does not have: it takes the table it
    reads at C instead (documented in ``_Participant.own_model``). The retry
    still replays the first attempt's schedule (the same clocks, tables and
    rows from C on, the same draws), and the table it leaves differs from
    the first attempt's by the one-time offset ``(M - read) / P`` plus what
    the changed reads trained differently, not by a drift."""
    est = SGDClassifier(learning_rate="constant", eta0=0.05, tol=None)
    w_full, w_retry = _retry_replays_its_schedule(est, sparse, bsp=False)
    assert np.all(np.isfinite(w_retry))
    assert np.linalg.norm(w_retry - w_full) <= np.linalg.norm(w_full)


def _manifest_metadata(path):
    return json.loads((pathlib.Path(path) / "manifest.json").read_text())["metadata"]


def test_checkpoint_every_saves_and_a_second_fit_resumes(client, tmp_path, sgd_by_rows):
    """checkpoint_every saves after each run of that many epochs; a fit
    stopped after 4 epochs and resumed by another estimator up to 10 reaches
    an uninterrupted 10-epoch fit's accuracy (2 participants: the runs are
    asynchronous, so not bitwise) and its t_; other parameters, another
    estimator or other data refuse to resume."""
    X, y = make_classification(30000, 20, n_informative=8, random_state=0)
    Xtr, Xte, ytr, yte = _split_scale(X, y)
    # averaged SGD: plain SGD's test accuracy varies by 2 points between two
    # asynchronous fits on these data (0.864-0.884), the average's by 0.001
    kw = {"max_iter": 10, "tol": None, "random_state": 0, "average": True}
    ref = SGDClassifier(**kw).fit(Xtr, ytr)
    ckpt = str(tmp_path / "ckpt")
    first = SGDClassifier(**dict(kw, max_iter=4), checkpoint=ckpt, checkpoint_every=3).fit(Xtr, ytr)
    meta = _manifest_metadata(ckpt)
    assert first.n_iter_ == 4 and meta["epoch"] == 4 and meta["n_iter"] == 4
    assert meta["t_"] == first.t_ and meta["estimator"] == "dask_ps.linear_model.SGDClassifier"
    resumed = SGDClassifier(**kw, checkpoint=ckpt, checkpoint_every=3).fit(Xtr, ytr)
    assert resumed.n_iter_ == 10 and resumed.t_ == ref.t_
    assert _manifest_metadata(ckpt)["epoch"] == 10
    manifest = json.loads((pathlib.Path(ckpt) / "manifest.json").read_text())
    assert len(manifest["tables"]) == 2  # the resumed fit saved under the same table names
    acc_ref, acc = ref.score(Xte, yte), resumed.score(Xte, yte)
    assert abs(acc - acc_ref) <= 0.02, (acc, acc_ref)
    # The first 4 epochs were not trained again: a fresh 6-epoch fit is not it.
    assert not np.allclose(resumed.coef_, SGDClassifier(**dict(kw, max_iter=6)).fit(Xtr, ytr).coef_)
    # A fit that is done returns the saved model without training.
    again = SGDClassifier(**kw, checkpoint=ckpt).fit(Xtr, ytr)
    np.testing.assert_allclose(again.coef_, resumed.coef_, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="belongs to another fit.*alpha"):
        SGDClassifier(**kw, alpha=0.01, checkpoint=ckpt).fit(Xtr, ytr)
    with pytest.raises(ValueError, match="belongs to another fit.*n_features"):
        SGDClassifier(**kw, checkpoint=ckpt).fit(Xtr[:, :10], ytr)
    with pytest.raises(ValueError, match="belongs to another fit.*classes"):
        SGDClassifier(**kw, checkpoint=ckpt).fit(Xtr, ytr + 1)
    with pytest.raises(ValueError, match="belongs to another fit.*n_samples"):  # other data: resumed silently
        SGDClassifier(**kw, checkpoint=ckpt).fit(Xtr[:-100], ytr[:-100])
    with pytest.raises(ValueError, match="not written by SGDRegressor"):
        SGDRegressor(**kw, checkpoint=ckpt).fit(Xtr, ytr.astype(float))
    with pytest.raises(ValueError, match="checkpoint_every is set but checkpoint is None"):
        SGDClassifier(checkpoint_every=2).fit(Xtr, ytr)
    with pytest.raises(ValueError, match="replication"):
        SGDClassifier(replication=0).fit(Xtr, ytr)


@pytest.mark.parametrize("cls, kw", [
    (SGDClassifier, {"early_stopping": True, "n_iter_no_change": 3}),
    (SGDClassifier, {"tol": 1e-3, "n_iter_no_change": 3, "learning_rate": "adaptive", "eta0": 0.05}),
    (SGDRegressor, {"tol": 1e-4, "average": True}),
])
def test_checkpointed_and_resumed_fits_equal_one_fit(client, tmp_path, cls, kw):
    """One participant (a deterministic run): a fit in runs of 2 epochs, and a
    fit stopped after 3 epochs then resumed, equal the plain fit -- the
    stopping rule (early stopping's validation scores, tol, the adaptive
    eta) carries over between runs and through a checkpoint."""
    if cls is SGDClassifier:
        X, y = make_classification(4000, 10, random_state=1)
    else:
        X, y = make_regression(4000, 10, noise=10.0, random_state=1)
        y = y / y.std()
    X = StandardScaler().fit_transform(X)
    kw = dict(kw, random_state=0)
    ref = cls(**kw).fit(X, y)
    assert 3 < ref.n_iter_ < 1000
    chunked = cls(**kw, checkpoint=str(tmp_path / "a"), checkpoint_every=2).fit(X, y)
    cls(**dict(kw, max_iter=3), checkpoint=str(tmp_path / "b")).fit(X, y)
    resumed = cls(**kw, checkpoint=str(tmp_path / "b")).fit(X, y)
    for est in (chunked, resumed):
        assert est.n_iter_ == ref.n_iter_ and est.t_ == ref.t_
        np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # 18-30 s on a loaded 2-core machine: a 3-worker cluster and two 20-epoch fits
def test_sgd_fit_survives_a_worker_killed_mid_fit():
    """kill -9 of a worker that holds weight blocks (and a participant, and
    data) 0.2 s into the training of a 3-participant fit with replication=2: Dask
    retries the participant, which gets its data back from the copy on
    another worker and resumes at its clock; the fit completes within 0.02
    test accuracy of an undisturbed fit with the same settings."""
    import os
    import signal
    import threading
    import time

    from distributed import Client, LocalCluster

    X, y = make_classification(220000, 20, n_informative=10, random_state=0)
    Xtr, Xte, ytr, yte = _split_scale(X, y, test_size=20000)
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as c:
        ps = dask_ps.get_parameter_server(c)

        def fit():
            t0 = time.perf_counter()
            est = SGDClassifier(loss="log_loss", max_iter=20, tol=None, random_state=0, replication=2,
                                client=c).fit(Xtr, ytr)
            return est, time.perf_counter() - t0

        quiet, seconds = fit()
        killed = {}

        before = set(ps.tables())  # the undisturbed fit's tables may not be dropped yet

        def kill_a_block_holder():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                names = [t for t in ps.tables()
                         if t.startswith("dask_ps-sgd-") and not t.endswith("-stats") and t not in before]
                if names:
                    break
                time.sleep(0.01)
            # 0.2 s into the training (it was a second: on a quiet machine the
            # second fit's training took about one, and the kill missed it).
            time.sleep(0.2)
            victim = ps.placement(names[0])[0].worker
            pid = c.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)
            killed[victim] = time.monotonic()

        killer = threading.Thread(target=kill_a_block_holder, daemon=True)
        killer.start()
        t0 = time.monotonic()
        disturbed, _ = fit()
        done = time.monotonic()
        killer.join(timeout=5)
        assert killed and next(iter(killed.values())) < done, "the worker was not killed during the fit"
        run = list(ps.metrics().values())[-1]
        assert max(run["attempts"].values()) >= 2, run["attempts"]  # a participant was retried
        acc_quiet, acc = quiet.score(Xte, yte), disturbed.score(Xte, yte)
        print(f"undisturbed {acc_quiet:.4f} ({seconds:.1f} s), killed mid-fit {acc:.4f} ({done - t0:.1f} s)")
        assert quiet.n_iter_ == disturbed.n_iter_ == 20
        assert abs(acc - acc_quiet) <= 0.02, (acc, acc_quiet)


@pytest.mark.parametrize("penalty", ["l2", "elasticnet"])
def test_compiled_kernel_matches_sklearn_over_many_chunks(penalty, monkeypatch):
    """The compiled round kernel trains dense rounds in chunks through one
    buffer: a lone participant without shuffling, over many chunks, is
    still scikit-learn's per-sample SGD up to rounding (the weights are
    rescaled at each chunk's end; one epoch: the differences grow over
    epochs on this nearly separable problem). The L1 penalty's cumulative
    state carries over the chunks (it restarted at each: 18% off)."""
    X, y = make_classification(3000, 400, n_informative=20, flip_y=0.3, random_state=0)
    X = StandardScaler().fit_transform(X)
    ref = SkSGDClassifier(loss="log_loss", shuffle=False, max_iter=1, tol=None, penalty=penalty).fit(X, y)
    est = SGDClassifier(loss="log_loss", shuffle=False, max_iter=1, tol=None, batch_size=500, penalty=penalty)
    hp = est._hyper(1, False)
    d = X.shape[1]
    cfg = _lone_config(est, hp, d, len(y), 1)
    tables = {"w": np.zeros((d + 1, 1))}
    with dask.config.set({"ps.sgd.compiled": True}):
        c = _rounds._CompiledData.make(cfg, X, np.zeros((len(y), 1)), np.ones(len(y)), np.arange(len(y)))
        if c is None:
            pytest.skip("numba is not installed")
        assert c.chunk < len(y)
        calls = []
        kernel = c.mod.sgd_round
        monkeypatch.setattr(c.mod, "sgd_round", lambda *a: calls.append(1) or kernel(*a))
        _participant._participant_loop(_LocalCtx(tables), _participant._PartData(X, y, np.ones(len(y))), cfg)
    assert len(calls) == -(-len(y) // c.chunk) > 1  # the compiled path ran, one call per chunk
    # Exact in one chunk; each chunk's rescaling rounds (~1e-9 of the scale here).
    scale = np.abs(ref.coef_).max()
    np.testing.assert_allclose(tables["w"][:d, 0], ref.coef_[0], rtol=1e-7, atol=1e-7 * scale)
    np.testing.assert_allclose(tables["w"][d, 0], ref.intercept_[0], rtol=1e-7, atol=1e-7 * scale)


@pytest.mark.parametrize("n_features", [1, 63, 64, 65, 1000, 2**20])
def test_compact_rows_is_the_rows_relabelled_over_their_features(n_features):
    """The sparse round's compact problem (``compact_rows``): the sorted
    features the rows touch, and the rows with their columns renumbered to
    positions in that list; its scratch bitmap is left zeroed for the next
    round (checked by running two rounds on one scratch)."""
    numba_sgd = pytest.importorskip("dask_ps.linear_model._sgd_numba")
    gen = np.random.default_rng(n_features)
    # Rows of up to 12 distinct features, in no particular order within a row.
    cols = [gen.choice(n_features, size=int(gen.integers(0, min(12, n_features) + 1)), replace=False)
            for _ in range(300)]
    indptr = np.concatenate([[0], np.cumsum([c.size for c in cols])])
    indices = np.concatenate(cols).astype(np.int32)
    data = np.arange(1, indices.size + 1, dtype=np.float64)  # each value says where it came from
    X = sp.csr_matrix((data, indices, indptr), shape=(300, n_features))
    bits = np.zeros(n_features // 64 + 1, dtype=np.uint64)
    rank = np.zeros(bits.shape[0], dtype=np.int64)
    slot = np.full(300, -1, dtype=np.int32)
    rng = np.random.default_rng(0)
    for rows in (rng.permutation(300)[:120], rng.permutation(300)[:77]):
        cols, cdata, cind, cptr = numba_sgd.compact_rows(
            rows, X.data, X.indices.astype(np.int32), X.indptr.astype(np.int32), bits, rank, slot)
        sub = X[rows]
        np.testing.assert_array_equal(cols, np.unique(sub.indices))
        np.testing.assert_array_equal(cptr, sub.indptr)
        np.testing.assert_array_equal(cdata, sub.data)
        np.testing.assert_array_equal(cols[cind], sub.indices)
        assert not bits.any() and (slot == -1).all()
