"""The minibatch kernel's time (``ps.sgd.kernel: minibatch``, the path of
cupy data, here on the host): an ``SGDClassifier`` fit of ``--rows`` dense
rows of ``--features`` columns, ``--epochs`` epochs, on ``--participants``
simulated participants (``sgd_sim.simulate_fit``, no cluster), after a small
warm-up fit; prints the fit's seconds and its training accuracy. Before and
after: run it with each tree first on ``PYTHONPATH``, in turn::

    for tree in /path/to/old .; do PYTHONPATH=$tree python benchmarks/bench_minibatch.py --features 50; done
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import warnings

import dask
from sklearn.datasets import make_classification

import dask_ps.linear_model as lm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sgd_sim  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40000)
    ap.add_argument("--features", type=int, default=50)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--participants", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    X, y = make_classification(n_samples=args.rows, n_features=args.features, n_informative=10, random_state=0)
    with warnings.catch_warnings(), dask.config.set({"ps.sgd.kernel": "minibatch"}):
        warnings.simplefilter("ignore")
        sgd_sim.simulate_fit(lm.SGDClassifier(random_state=0, max_iter=1, tol=None), X[:2000], y[:2000], 2)
        for _ in range(args.repeats):
            t = time.perf_counter()
            est = sgd_sim.simulate_fit(lm.SGDClassifier(random_state=0, max_iter=args.epochs, tol=None), X, y,
                                       args.participants)
            print(f"{lm.__file__}: {time.perf_counter() - t:.3f} s, accuracy {est.score(X, y):.4f}", flush=True)


if __name__ == "__main__":
    main()
