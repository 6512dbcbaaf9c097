"""Rows stored sorted by label as a dask array: dask_ps's accuracy against scikit-learn's.

The text-like rows of ``sgd_issue_cases`` (20k, sorted by label) as a dask
array of 8 row blocks of one class each, scattered to the workers of a
2-worker threads cluster in one of two placements:

* ``interleaved``: block ``i`` on worker ``i % 2`` (each participant holds
  both classes, one after the other);
* ``one-class-per-worker``: blocks 0-3 on one worker, 4-7 on the other;
* ``one-sorted-block-per-worker``: two blocks (the even rows and the odd
  rows, each still sorted), one a worker: each participant holds both
  classes in one block, one class after the other.

Cases ``sorted`` (``max_iter=1``) and ``sorted_default`` (the default
stopping rule); scikit-learn over 5 seeds on the in-memory rows, dask_ps
over 2::

    python benchmarks/sgd_sorted_dask.py [sorted,sorted_default]
"""

from __future__ import annotations

import pathlib
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sgd_issue_cases as cases  # noqa: E402

PLACEMENTS = {"interleaved": lambda i, n, w: i % w, "one-class-per-worker": lambda i, n, w: i * w // n}
# name -> (the rows' order, blocks, placement)
LAYOUTS = {
    "interleaved": (None, 8, PLACEMENTS["interleaved"]),
    "one-class-per-worker": (None, 8, PLACEMENTS["one-class-per-worker"]),
    "one-sorted-block-per-worker": ("halves", 2, PLACEMENTS["interleaved"]),
}


def halves(n):
    """The even rows, then the odd rows: two halves each in the stored (sorted) order."""
    return np.r_[np.arange(0, n, 2), np.arange(1, n, 2)]


def dask_blocks(client, X, y, n_blocks, worker_of):
    """``X``, ``y`` as dask arrays of ``n_blocks`` row blocks, block ``i``
    scattered to worker ``worker_of(i, n_blocks, n_workers)`` (sorted workers)."""
    import dask.array as da

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    b = np.linspace(0, X.shape[0], n_blocks + 1).astype(int)
    xs, ys = [], []
    for i in range(n_blocks):
        w, n = workers[worker_of(i, n_blocks, len(workers))], b[i + 1] - b[i]
        xs.append(da.from_delayed(client.scatter(X[b[i]:b[i + 1]], workers=[w], hash=False),
                                  shape=(n, X.shape[1]), dtype=X.dtype, meta=X[:0]))
        ys.append(da.from_delayed(client.scatter(y[b[i]:b[i + 1]], workers=[w], hash=False),
                                  shape=(n,), dtype=y.dtype))
    return da.concatenate(xs), da.concatenate(ys)


def main():
    from distributed import Client, LocalCluster

    import dask_ps.linear_model as dpl

    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["sorted", "sorted_default"]
    for name in names:
        ref = cases.fit_scores(name, range(5))
        print(f"{name}: scikit-learn {[round(s, 4) for s, _ in ref]} epochs {[e for _, e in ref]}", flush=True)
        _, _, params, kind = cases.CASES[name]
        X, y, Xt, yt = cases._data(name)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, memory_limit=0,
                          dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
            for placement, (order, n_blocks, worker_of) in LAYOUTS.items():
                o = halves(len(y)) if order == "halves" else np.arange(len(y))
                dX, dy = dask_blocks(client, X[o], y[o], n_blocks, worker_of)
                got = []
                for seed in (0, 1):
                    t = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        est = dpl.SGDClassifier(random_state=seed, client=client, **params).fit(dX, dy)
                    got.append((round(cases.score(est, Xt, yt, kind), 4), int(est.n_iter_),
                                round(time.perf_counter() - t, 1)))
                print(f"  {placement}: dask_ps (score, epochs, seconds) {got}", flush=True)


if __name__ == "__main__":
    main()
