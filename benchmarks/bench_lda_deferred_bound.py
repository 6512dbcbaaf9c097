"""An LDA fit's wall with ``bound_`` computed at the end of the fit (on the
workers, ``ps.lda.deferred-bound-tokens: 0``) against the default (at its
first read, in the calling process), alternating on one warm cluster; and
what the first read of the deferred ``bound_`` then costs.

    python benchmarks/bench_lda_deferred_bound.py                       # in-process workers
    python benchmarks/bench_lda_deferred_bound.py --cluster processes   # 2 worker processes

K=50 on the news corpus (``bench_lda.load_news``), 2 workers x 1 thread
(2 participants), ``max_iter`` 10 and 50, the median of ``--repeat`` fits.
"""

from __future__ import annotations

import argparse
import time
import warnings

import dask
import numpy as np
from distributed import Client, LocalCluster

from bench_lda import load_news, split
from dask_ps.decomposition import LatentDirichletAllocation


def fit(client, X, iters, eager):
    with dask.config.set({"ps.lda.deferred-bound-tokens": 0} if eager else {}):
        m = LatentDirichletAllocation(50, max_iter=iters, client=client, random_state=0)
        t = time.perf_counter()
        m.fit(X)
        wall = time.perf_counter() - t
    t = time.perf_counter()
    bound = m.bound_
    return wall, time.perf_counter() - t, bound, len(m.metrics_)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", choices=["threads", "processes"], default="threads")
    ap.add_argument("--docs", type=int, nargs="+", default=[1500, 0], help="0: the whole training split")
    ap.add_argument("--iters", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    X_all = split(load_news())[0]
    warnings.simplefilter("ignore")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.cluster == "processes",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        fit(client, X_all[:300], 2, True)  # warm: kernels, plugins
        fit(client, X_all[:300], 2, False)
        print(f"cluster: {args.cluster}, 2 workers x 1 thread, K=50")
        print(f"{'docs':>5} {'tokens':>8} {'iters':>5} {'P':>2} | {'fit s, bound at the end':>23} {'at first read':>13}"
              f" {'ratio':>6} | {'first read s':>12} | bound_ (end / read)")
        for n_docs in args.docs:
            X = X_all if n_docs == 0 else X_all[:n_docs]
            for iters in args.iters:
                eager, lazy = [], []
                for _ in range(args.repeat):
                    eager.append(fit(client, X, iters, True))
                    lazy.append(fit(client, X, iters, False))
                e, l_ = np.median([r[0] for r in eager]), np.median([r[0] for r in lazy])
                read = np.median([r[1] for r in lazy])
                print(f"{X.shape[0]:>5} {int(X.sum()):>8} {iters:>5} {lazy[0][3]:>2} | {e:>23.2f} {l_:>13.2f}"
                      f" {l_ / e:>6.2f} | {read:>12.2f} | {eager[0][2]:.6f} / {lazy[0][2]:.6f}", flush=True)


if __name__ == "__main__":
    main()
