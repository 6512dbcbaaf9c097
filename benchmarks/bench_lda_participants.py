"""How many participants a small in-memory LDA fit should get: the same fit
on one participant and on the default count (one per
``ps.lda.min-tokens-per-participant`` tokens, at most one per worker), on
one warm cluster, alternating.

    python benchmarks/bench_lda_participants.py                       # in-process workers
    python benchmarks/bench_lda_participants.py --cluster processes   # 2 worker processes
    python benchmarks/bench_lda_participants.py --k 1000 --tile 4 --docs 6882 13764 --repeat 2  # 1.8M, 3.6M tokens

K=50 (and ``--k``) on subsets of the news corpus (``bench_lda.load_news``),
``max_iter`` 50, ``evaluate_every=0``, the median of ``--repeat`` fits:
the fit's wall, the participants, and the held-out log-likelihood per token
of each (``bench_lda.heldout``).
"""

from __future__ import annotations

import argparse
import time
import warnings

import dask
import numpy as np
from distributed import Client, LocalCluster

from bench_lda import heldout, load_news, split
from dask_ps.decomposition import LatentDirichletAllocation

ARMS = {"one": {"ps.lda.min-tokens-per-participant": 10**12}, "default": {}}


def fit(client, X, test, K, iters, cfg):
    with dask.config.set(cfg):
        m = LatentDirichletAllocation(K, max_iter=iters, evaluate_every=0, client=client, random_state=0)
        t = time.perf_counter()
        m.fit(X)
        wall = time.perf_counter() - t
    return wall, len(m.metrics_), heldout(m.components_, test)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", choices=["threads", "processes"], default="threads")
    ap.add_argument("--docs", type=int, nargs="+", default=[100, 300, 700, 1500, 3441])
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tile", type=int, default=1,
                    help="the training documents repeated this many times (larger corpora, the same vocabulary)")
    args = ap.parse_args()
    train, test = split(load_news())
    if args.tile > 1:
        import scipy.sparse as sp

        train = sp.vstack([train] * args.tile, format="csr")
    warnings.simplefilter("ignore")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.cluster == "processes",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for cfg in ARMS.values():
            fit(client, train[:300], test, args.k, 2, cfg)  # warm: kernels, plugins
        print(f"cluster: {args.cluster}, 2 workers x 1 thread, K={args.k}, {args.iters} iterations")
        print(f"{'docs':>5} {'tokens':>8} | {'one s':>6} {'default s':>9} {'ratio':>6} | {'P':>3} |"
              f" held-out loglik/token one / default")
        for n in args.docs:
            X = train[:n]
            res = {a: [] for a in ARMS}
            for _ in range(args.repeat):
                for a, cfg in ARMS.items():
                    res[a].append(fit(client, X, test, args.k, args.iters, cfg))
            t = {a: float(np.median([r[0] for r in rs])) for a, rs in res.items()}
            print(f"{X.shape[0]:>5} {int(X.sum()):>8} | {t['one']:>6.2f} {t['default']:>9.2f}"
                  f" {t['default'] / t['one']:>6.2f} | {res['one'][0][1]}/{res['default'][0][1]} |"
                  f" {res['one'][0][2]:.4f} / {res['default'][0][2]:.4f}", flush=True)


if __name__ == "__main__":
    main()
