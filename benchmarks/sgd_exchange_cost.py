"""What dealing a dask input's rows again between the participants costs,
against an epoch (``ps.sgd.exchange-rows``, issue 33).

A 2-worker cluster (threads or worker processes), a dask array of 8 row
blocks sorted by label (4 on each worker, one class a worker), dense
(``--dense-n`` x 100) or sparse (text-like rows, ``--sparse-n`` x 2^18, ~40
non-zeros a row). For each: the seconds to prepare the parts
(``_data._dask_parts``: assemble and check each worker's blocks) without and
with the exchange, and a one-epoch ``SGDClassifier`` fit on the exchanged
parts (``max_iter=1, tol=None``), the median of ``--repeat`` runs::

    python benchmarks/sgd_exchange_cost.py --cluster threads processes
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
import warnings

import dask
import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sgd_sorted_dask  # noqa: E402


def data(kind, n, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "dense":
        X = rng.standard_normal((n, 100))
        y = (X @ rng.standard_normal(100) > 0).astype(np.int64)
    else:
        lengths = np.clip(rng.poisson(40, n), 1, None)
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        X = sp.csr_matrix((np.ones(indptr[-1]), rng.integers(0, 1 << 18, indptr[-1]), indptr), shape=(n, 1 << 18))
        y = (X @ rng.standard_normal(1 << 18) > 0).astype(np.int64)
    o = np.argsort(y, kind="stable")
    return X[o], y[o]


def timed(fn, repeat):
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def measure(client, kind, n, repeat):
    import dask_ps.linear_model as dpl
    from dask_ps.linear_model._data import _dask_parts, _Input

    X, y = data(kind, n)
    dX, dy = sgd_sorted_dask.dask_blocks(client, X, y, 8, sgd_sorted_dask.PLACEMENTS["one-class-per-worker"])
    inp = _Input("dask", dX, dy, None, X.shape[1], X.dtype, kind != "dense", "cpu")

    def parts(mode):
        def run():
            with dask.config.set({"ps.sgd.exchange-rows": mode}):
                p, _, _ = _dask_parts(client, inp, True, order_seed=1)
                client.gather(p.futures)  # made, not only submitted
                p.release()
        return run

    est = dpl.SGDClassifier(max_iter=1, tol=None, random_state=0, client=client)

    def fit():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(dX, dy)

    fit()  # compiles the kernels
    kept, dealt = timed(parts("never"), repeat), timed(parts("always"), repeat)
    epoch = timed(fit, repeat)
    return kept, dealt, epoch


def main():
    from distributed import Client, LocalCluster

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", nargs="+", default=["threads"], choices=["threads", "processes"])
    ap.add_argument("--dense-n", type=int, default=200_000)
    ap.add_argument("--sparse-n", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| layout | data | parts, kept (s) | parts, rows dealt again (s) | exchange (s) | one-epoch fit (s) "
          "| exchange / epoch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for layout in args.cluster:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=layout == "processes", memory_limit=0,
                          dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
            for kind, n in (("dense", args.dense_n), ("sparse", args.sparse_n)):
                kept, dealt, epoch = measure(client, kind, n, args.repeat)
                print(f"| {layout} | {kind} {n} | {kept:.3f} | {dealt:.3f} | {dealt - kept:.3f} | {epoch:.3f} "
                      f"| {(dealt - kept) / epoch:.2f} |", flush=True)


if __name__ == "__main__":
    main()
