"""The minibatch kernel's time (``ps.sgd.kernel: minibatch``, the path of
cupy data, here on the host): an ``SGDClassifier`` fit of ``--rows`` dense
rows of ``--features`` columns, ``--epochs`` epochs, on ``--participants``
simulated participants (``sgd_sim.simulate_fit``, no cluster), after a small
warm-up fit; prints the fit's seconds and its training accuracy.
``--case text-regressor``: an ``SGDRegressor`` at ``constant`` 0.01 on
``sgd_data``'s text-like counts (8,000 rows: the quick sweep's cell where a
regressor's minibatches are cut and trained again in chunks), its held-out
R^2; ``--case regressor``: the default ``SGDRegressor`` on dense rows.
Before and after: run it with each tree first on ``PYTHONPATH``, in turn::

    for tree in /path/to/old .; do PYTHONPATH=$tree python benchmarks/bench_minibatch.py --features 50; done
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import warnings

import dask
from sklearn.datasets import make_classification, make_regression

import dask_ps.linear_model as lm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sgd_data  # noqa: E402
import sgd_sim  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40000)
    ap.add_argument("--features", type=int, default=50)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--participants", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--case", choices=["classifier", "regressor", "text-regressor"], default="classifier")
    args = ap.parse_args()
    cls, kw = lm.SGDClassifier, {}
    if args.case == "text-regressor":
        X, y, Xt, yt = sgd_data.make("text", False, 8000)
        cls, kw = lm.SGDRegressor, dict(learning_rate="constant", eta0=0.01)
    elif args.case == "regressor":
        X, y = make_regression(n_samples=args.rows, n_features=args.features, n_informative=10, noise=10.0,
                               random_state=0)
        Xt, yt, cls = X, y, lm.SGDRegressor
    else:
        X, y = make_classification(n_samples=args.rows, n_features=args.features, n_informative=10, random_state=0)
        Xt, yt = X, y
    with warnings.catch_warnings(), dask.config.set({"ps.sgd.kernel": "minibatch"}):
        warnings.simplefilter("ignore")
        sgd_sim.simulate_fit(cls(random_state=0, max_iter=1, tol=None, **kw), X[:2000], y[:2000], 2)
        for _ in range(args.repeats):
            t = time.perf_counter()
            est = sgd_sim.simulate_fit(cls(random_state=0, max_iter=args.epochs, tol=None, **kw), X, y,
                                       args.participants)
            print(f"{lm.__file__}: {time.perf_counter() - t:.3f} s, score {est.score(Xt, yt):.4f}", flush=True)


if __name__ == "__main__":
    main()
