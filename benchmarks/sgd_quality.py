"""The SGD quality sweep: dask_ps against scikit-learn's worst seed.

For every case (estimator, loss, learning-rate schedule, dense or sparse
data, number of rows, number of workers, ``max_iter``) both fit with
``tol=None`` over the seeds, and the case passes when every dask_ps fit
scores at least scikit-learn's worst of 30 seeds minus ``SLACK`` (test accuracy for
classifiers, test R^2 for regressors), under the default consistency unless
``--consistency`` says otherwise. The participants are what a user gets
(one per worker holding at least ``ps.sgd.min-samples-per-participant``
samples: 1k rows train on one, 20k on two), or with ``--forced`` one per
worker whatever the input's size (``min-samples-per-participant`` 100).

The same code runs the small sweep of the default tests
(``tests/linear_model/test_sgd_quality.py``), the wide one of ``-m slow``,
and this script:

    python benchmarks/sgd_quality.py                         # the wide sweep, a table per case
    python benchmarks/sgd_quality.py --rows 20000 --workers 4 --losses squared_error
    python benchmarks/sgd_quality.py --forced --rows 1000 --consistency bsp
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

SLACK = 0.02
CLASSIFIER_LOSSES = ("hinge", "log_loss", "modified_huber")
REGRESSOR_LOSSES = ("squared_error", "huber")
SCHEDULES = ("optimal", "invscaling", "constant", "adaptive")


@dataclass(frozen=True)
class Case:
    loss: str
    schedule: str
    sparse: bool
    n_rows: int
    max_iter: int

    @property
    def classifier(self) -> bool:
        return self.loss in CLASSIFIER_LOSSES

    def params(self) -> dict:
        p = {"loss": self.loss, "max_iter": self.max_iter, "tol": None, "learning_rate": self.schedule}
        if self.schedule != "optimal":
            p["eta0"] = 0.01
        return p


_DATA: dict = {}


def data(classifier: bool, sparse: bool, n_rows: int):
    """Train and test sets (80/20) of ``n_rows``: make_classification or
    make_regression with 20 features; sparse: 70% of the entries zeroed, CSR."""
    key = (classifier, sparse, n_rows)
    if key not in _DATA:
        from sklearn.datasets import make_classification, make_regression

        n = int(n_rows * 1.25)
        if classifier:
            X, y = make_classification(n, 20, n_informative=10, random_state=0)
        else:
            X, y = make_regression(n, 20, n_informative=10, noise=10.0, random_state=0)
        if sparse:
            X = X * (np.random.RandomState(1).rand(*X.shape) < 0.3)
            X = sp.csr_matrix(X)
        _DATA[key] = (X[:n_rows], y[:n_rows], X[n_rows:], y[n_rows:])
    return _DATA[key]


def _score(est, X, y, classifier):
    from sklearn.metrics import r2_score

    if classifier:
        return float(np.mean(est.predict(X) == y))
    p = est.predict(X)
    return float(r2_score(y, p)) if np.all(np.isfinite(p)) else -np.inf


def sklearn_scores(case: Case, seeds) -> list[float]:
    from sklearn.linear_model import SGDClassifier, SGDRegressor

    X, y, Xt, yt = data(case.classifier, case.sparse, case.n_rows)
    cls = SGDClassifier if case.classifier else SGDRegressor
    out = []
    for s in seeds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(_score(cls(random_state=s, **case.params()).fit(X, y), Xt, yt, case.classifier))
    return out


def dask_ps_scores(case: Case, seeds, client, **extra) -> list[float]:
    import dask_ps.linear_model

    X, y, Xt, yt = data(case.classifier, case.sparse, case.n_rows)
    cls = dask_ps.linear_model.SGDClassifier if case.classifier else dask_ps.linear_model.SGDRegressor
    out = []
    for s in seeds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = cls(random_state=s, client=client, **case.params(), **extra).fit(X, y)
        out.append(_score(est, Xt, yt, case.classifier))
    return out


def cases(losses, schedules, sparse, rows, max_iters):
    for loss, schedule, sp_, n, E in itertools.product(losses, schedules, sparse, rows, max_iters):
        yield Case(loss, schedule, sp_, n, E)


# scikit-learn's seeds the reference is the worst of. The verdict compares
# extremes of two samples: where seeds spread a fit over 0.1 or more (hinge
# with the 'optimal' steps on 1k rows: 0.53-0.78), three of scikit-learn's
# own other seeds (100-102) fell below its worst of seeds 0-9 minus 0.02 in 4
# of 142 cases of the sweep, and below its worst of seeds 0-29 in 2.
REFERENCE_SEEDS = 30


def run_case(case: Case, seeds, client, **extra) -> dict:
    """Both sides' scores and the verdict: every dask_ps seed at least
    scikit-learn's worst over seeds ``0..REFERENCE_SEEDS-1`` minus ``SLACK``
    (a case where scikit-learn itself diverges, worst R^2 below 0, is
    reported but not judged)."""
    ref = sklearn_scores(case, range(REFERENCE_SEEDS))
    got = dask_ps_scores(case, seeds, client, **extra)
    worst = min(ref)
    judged = np.isfinite(worst) and worst > 0
    return {"case": case, "sklearn": ref, "dask_ps": got, "worst": worst,
            "ok": (not judged) or min(got) >= worst - SLACK, "judged": bool(judged)}


def main():
    import dask
    from distributed import Client, LocalCluster

    # Imported here, not first inside the dask.config.set block of --forced:
    # leaving that block would drop the ps.* defaults the import registered.
    import dask_ps  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--losses", nargs="+", default=list(CLASSIFIER_LOSSES + REGRESSOR_LOSSES))
    ap.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    ap.add_argument("--rows", nargs="+", type=int, default=[1000, 20000, 200000])
    ap.add_argument("--workers", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--max-iter", nargs="+", type=int, default=list(range(1, 11)))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--dense-only", action="store_true")
    ap.add_argument("--consistency", default=None, help="bsp, ssp, asp (default: the configured default)")
    ap.add_argument("--processes", action="store_true", help="worker processes (default: threads)")
    ap.add_argument("--forced", action="store_true", help="one participant per worker whatever the size")
    args = ap.parse_args()
    extra = {}
    if args.consistency:
        extra["consistency"] = {"bsp": dask_ps.BSP(), "ssp": dask_ps.SSP(2), "asp": dask_ps.ASP()}[args.consistency]
    seeds = range(args.seeds)
    sparse = [False] if args.dense_only else [False, True]
    n_bad = n_all = 0
    for workers in args.workers:
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=args.processes,
                          dashboard_address=None) as cluster, Client(cluster) as client, \
                dask.config.set({"ps.sgd.min-samples-per-participant": 100} if args.forced else {}):
            for case in cases(args.losses, args.schedules, sparse, args.rows, args.max_iter):
                t = time.perf_counter()
                r = run_case(case, seeds, client, **extra)
                n_all += 1
                n_bad += not r["ok"]
                print(f"P={workers} {'dense ' if not case.sparse else 'sparse'} {case.loss:15s} "
                      f"{case.schedule:10s} n={case.n_rows:<6d} E={case.max_iter:<2d} "
                      f"sklearn worst {r['worst']:.4f}  dask_ps min {min(r['dask_ps']):.4f} "
                      f"mean {np.mean(r['dask_ps']):.4f}  {'ok' if r['ok'] else 'FAIL'}"
                      f"{'' if r['judged'] else ' (not judged)'}  {time.perf_counter() - t:.1f}s", flush=True)
    print(f"{n_bad} of {n_all} cases below scikit-learn's worst seed - {SLACK}")


if __name__ == "__main__":
    main()
