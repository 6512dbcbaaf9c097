"""How many participants a small in-memory SGD fit should get: the same fit
on one participant, on the rule by rows (one participant per 10,000
samples, 4 rounds an epoch under BSP: the rule before "participants by
work") and on the defaults, on one warm cluster, alternating.

    python benchmarks/bench_participants.py                       # in-process workers (the embedded default)
    python benchmarks/bench_participants.py --cluster processes   # 2 worker processes
    python benchmarks/bench_participants.py --input dask          # a dask input: 4 blocks held by the workers

With ``--input dask`` the training rows are a persisted dask array of 4
blocks (dealt by Dask to the 2 workers) and the "rows" arm is a dask
input's rule before its participants went by work (one participant per
10,000 rows, one round an epoch under BSP).

For each input (dense ``make_classification`` rows, text-like hashed CSR
rows; several sizes) it prints the median wall time of a fit (default
stopping rule, or ``--max-iter`` epochs) of each arm, the defaults' time
over the others', the participants and epochs of each arm, and the test
accuracy. Every arm runs on the cluster (a ``client`` is passed), so the
one-participant arm does not skip the cluster.
"""

from __future__ import annotations

import argparse
import time

import dask
import numpy as np
from distributed import Client, LocalCluster

from bench_sgd import dense_data, hashed_data
from dask_ps.linear_model import SGDClassifier

ARMS = {
    "one": {"ps.sgd.min-samples-per-participant": 10**12},
    "rows": {"ps.sgd.min-samples-per-participant": 10_000, "ps.sgd.bsp-min-rounds-per-epoch": 4},
    "default": {},
}


def fit_once(client, X, y, Xte, yte, cfg, kw):
    with dask.config.set(cfg):
        est = SGDClassifier(client=client, random_state=0, **kw)
        t0 = time.perf_counter()
        est.fit(X, y)
        wall = time.perf_counter() - t0
    P = len(est.metrics_) if isinstance(est.metrics_, list) else 1
    return wall, est.n_iter_, est.score(Xte, yte), P


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", choices=["threads", "processes"], default="threads")
    ap.add_argument("--sizes", type=int, nargs="+", default=[20_000, 60_000, 120_000, 250_000])
    ap.add_argument("--data", nargs="+", choices=["dense", "sparse"], default=["dense", "sparse"])
    ap.add_argument("--features", type=int, default=50, help="dense columns")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-iter", type=int, default=None, help="fixed epochs (tol=None) instead of the default rule")
    ap.add_argument("--input", choices=["memory", "dask"], default="memory")
    args = ap.parse_args()
    if args.input == "dask":
        ARMS["rows"] = {"ps.sgd.min-samples-per-participant": 10_000}
    kw = {} if args.max_iter is None else {"max_iter": args.max_iter, "tol": None}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.cluster == "processes",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        print(f"cluster: {args.cluster}, 2 workers x 1 thread; {args.input} input; fit {kw or 'defaults'}")
        print(f"{'data':>6} {'rows':>7} {'values/row':>10} | {'seconds one / rows / default':>28} |"
              f" {'default/one':>11} {'default/rows':>12} | {'P':>5} | {'epochs':>10} | accuracy one / rows / default")
        for kind in args.data:
            for n in args.sizes:
                m = n + n // 4
                X, y = dense_data(m, args.features) if kind == "dense" else hashed_data(m, 2**18, 50)
                Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
                if args.input == "dask":
                    import dask.array as da

                    Xtr = da.from_array(Xtr, chunks=(n // 4, X.shape[1]), asarray=False)
                    ytr = da.from_array(ytr, chunks=n // 4)
                    Xtr, ytr = client.persist([Xtr, ytr])
                fit_once(client, Xtr[:5000], ytr[:5000], Xte, yte, ARMS["one"], kw)  # compile, warm
                res = {a: [] for a in ARMS}
                for _ in range(args.repeat):
                    for a, cfg in ARMS.items():
                        res[a].append(fit_once(client, Xtr, ytr, Xte, yte, cfg, kw))
                t = {a: float(np.median([r[0] for r in rs])) for a, rs in res.items()}
                vals = X.shape[1] if kind == "dense" else X[:n].nnz / n
                first = {a: rs[0] for a, rs in res.items()}
                print(f"{kind:>6} {n:>7} {vals:>10.0f} | {t['one']:>8.2f} {t['rows']:>8.2f} {t['default']:>9.2f} |"
                      f" {t['default'] / t['one']:>11.2f} {t['default'] / t['rows']:>12.2f} |"
                      f" {'/'.join(str(first[a][3]) for a in ARMS):>5} |"
                      f" {'/'.join(str(first[a][1]) for a in ARMS):>10} |"
                      f" {' / '.join(f'{first[a][2]:.4f}' for a in ARMS)}", flush=True)


if __name__ == "__main__":
    main()
