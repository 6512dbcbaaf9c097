"""SGD parity with two participants on every data set of the parity tests
(issue 14, item 8), through the public estimator API only.

Most parity tests in ``test_sgd.py`` fit on one participant (their data are
below ``ps.sgd.min-samples-per-participant``), where the parameter server is
only storage. Here ``ps.sgd.min-samples-per-participant`` is lowered so that
each fit runs on both workers, and two things are checked:

* the test accuracy (R^2 for regression) is at most a point below
  scikit-learn's mean over seeds, as in ``test_sgd.py``;
* the **training objective** (mean loss plus ``alpha/2 * ||coef||^2``, the
  objective scikit-learn's SGD minimizes; summed over the one-vs-all
  problems of a multiclass fit) is at most ``K`` times scikit-learn's worst
  over three seeds.

Accuracy alone does not see consistency being ignored: a linear classifier
whose weights are all scaled, or averaged from models trained apart on the
two halves, predicts almost the same labels. The objective does. The tables
use ``BSP()`` so that a fit reads the same values every time (its result
does not depend on timing), and ``tol=None`` with a fixed ``max_iter``.

How the bounds ``K`` were chosen, and shown to catch consistency being
ignored: every fit below was run with ``random_state`` 0, 1 and 2 once as
it is and once with the participants' reads broken (``Session._read``
patched so that a participant reads each block once, at its first read,
and from then on sees only its own pushes: "reads ignore other
participants' pushes"). Ratio of the objective to scikit-learn's worst
seed, correct / broken, and what the broken fit's accuracy was:

=============  ==================  ==================  ===  ===================================
data set       correct             broken              K    broken accuracy (correct)
=============  ==================  ==================  ===  ===================================
digits         0.70 - 1.24         2.77 - 4.29         1.6  0.82 - 0.94 (0.94 - 0.96)
breast cancer  1.07 - 1.43         3.4 - 70            2.0  0.43 - 0.97 (0.96 - 0.97)
synthetic      0.88 - 0.90         1.11 - 10.6         1.0  0.35 - 0.81 (0.76 - 0.77)
regression     0.996               102 - 404           1.01 R^2 0.002 - 0.75 (0.998)
sparse text    1.001               1.09 - 1.10         1.02 0.705 - 0.711 (0.712 - 0.722)
=============  ==================  ==================  ===  ===================================

Then this module itself was run with a pytest plugin whose autouse fixture
patched ``Session._read`` that way on both workers (``client.run``): all
five tests failed (objective ratios 2.77 > 1.6 digits, 4.53 > 2.0 breast
cancer, 1.11 > 1.0 synthetic, 1.09 > 1.02 sparse text; regression R^2
0.749 < 0.988), and passed again without it.

So with reads that ignore the other participant every test here fails (on
the objective; on accuracy too for regression and often elsewhere), while
with broken reads the accuracy-only checks of ``test_sgd.py`` passed for
breast cancer, the synthetic problem and (at its 1.5 point tolerance) the
sparse text in some of those runs. (A broken participant sees half of its
own progress, since it pushes its deltas scaled by 1/2 for the model
average, so it trains towards its own half's optimum while the table adds
up both: the weights end near twice a half's solution.)
"""

from __future__ import annotations

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

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as c:
            yield c


def _split_scale(X, y):
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0)
    sc = StandardScaler().fit(Xtr)
    return sc.transform(Xtr), sc.transform(Xte), ytr, yte


def _sparse_text(n=20000, d=2**14, nnz=30, seed=0):
    """The bag-of-words-like CSR of ``test_sgd.py``."""
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
    return X, (s > np.median(s)).astype(int)


def _data(name):
    if name == "digits":
        return _split_scale(*load_digits(return_X_y=True))
    if name == "breast_cancer":
        return _split_scale(*load_breast_cancer(return_X_y=True))
    if name == "synthetic":
        return _split_scale(*make_classification(15000, 50, n_informative=20, random_state=0))
    if name == "regression":
        X, y = make_regression(20000, 50, noise=10.0, random_state=0)
        return train_test_split(X, y, test_size=0.2, random_state=0)
    X, y = _sparse_text()
    return train_test_split(X, y, test_size=0.25, random_state=0)


def objective(est, X, y, loss, alpha):
    """What scikit-learn's SGD minimizes (l2 penalty), on the training data;
    a multiclass classifier: summed over its one-vs-all problems."""
    coef = np.ravel(est.coef_)
    penalty = 0.5 * alpha * float(coef @ coef)
    if loss == "squared_error":
        return 0.5 * float(np.mean((est.predict(X) - y) ** 2)) + penalty
    d = est.decision_function(X)
    d = d[:, None] if d.ndim == 1 else d
    classes = est.classes_[1:] if d.shape[1] == 1 else est.classes_
    total = 0.0
    for k, c in enumerate(classes):
        margin = np.where(y == c, 1.0, -1.0) * d[:, k]
        total += float(np.mean(np.logaddexp(0, -margin) if loss == "log_loss" else np.maximum(0, 1 - margin)))
    return total + penalty


# data set -> hyper-parameters (both libraries), samples per participant, K, accuracy tolerance
CASES = {
    "digits": (dict(loss="log_loss", max_iter=20, tol=None), 100, 1.6, 0.01),
    # alpha 1e-3: with scikit-learn's 1e-4 the data are nearly separable and
    # its own objective varies 2x between seeds
    "breast_cancer": (dict(loss="hinge", alpha=1e-3, max_iter=30, tol=None), 100, 2.0, 0.01),
    "synthetic": (dict(loss="hinge", max_iter=20, tol=None), 5000, 1.0, 0.015),
    "regression": (dict(loss="squared_error", max_iter=20, tol=None), 5000, 1.01, 0.01),
    "sparse_text": (dict(loss="log_loss", max_iter=10, tol=None), 5000, 1.02, 0.015),
}


@pytest.mark.parametrize("name", list(CASES))
def test_two_participants_reach_scikit_learns_objective(client, name):
    """Accuracy within a point of scikit-learn's mean and a training
    objective at most K times scikit-learn's worst seed, with the data on
    two participants (see the module docstring for K and for what a broken
    consistency did)."""
    hp, per_participant, bound, tolerance = CASES[name]
    Xtr, Xte, ytr, yte = _data(name)
    regression = name == "regression"
    alpha = hp.get("alpha", 1e-4)
    refs = []
    for seed in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            refs.append((SkSGDRegressor if regression else SkSGDClassifier)(random_state=seed, **hp).fit(Xtr, ytr))
    ref_score = float(np.mean([r.score(Xte, yte) for r in refs]))
    ref_objective = max(objective(r, Xtr, ytr, hp["loss"], alpha) for r in refs)

    extra = {"batch_size": 1024} if name == "sparse_text" else {}
    with dask.config.set({"ps.sgd.min-samples-per-participant": per_participant}):
        est = (SGDRegressor if regression else SGDClassifier)(
            random_state=0, consistency=dask_ps.BSP(), **hp, **extra
        ).fit(Xtr, ytr)
    assert len(est.metrics_) == 2  # both workers trained: the parameter server synchronized them
    score, obj = est.score(Xte, yte), objective(est, Xtr, ytr, hp["loss"], alpha)
    assert score >= ref_score - tolerance, (score, ref_score)
    assert obj <= bound * ref_objective, (obj / ref_objective, bound)
