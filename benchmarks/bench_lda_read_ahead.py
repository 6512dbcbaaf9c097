"""An LDA fit's wall with each iteration's read sent after its clock
(``ps.lda.read-ahead: false``) against the default (sent with the clock
before, in the same message to each server), alternating on one warm
cluster; the requests per participant and iteration, and whether the
models are the same.

    python benchmarks/bench_lda_read_ahead.py                       # in-process workers
    python benchmarks/bench_lda_read_ahead.py --cluster processes   # 2 worker processes

The news corpus (``bench_lda.load_news``), 2 workers x 1 thread, 2
participants (``n_partitions=2``), BSP (the seeded default: the only
model that reads ahead), ``--iters`` iterations, K = ``--k``, the median
of ``--repeat`` fits each.
"""

from __future__ import annotations

import argparse
import time
import warnings

import dask
import numpy as np
from bench_lda import load_news, split
from distributed import Client, LocalCluster

from dask_ps.decomposition import LatentDirichletAllocation

# requests to the servers (``_local``: to its own worker's, a direct call); the
# other counters (bytes, row lists named by key, clocks combined) are not
REQUESTS = ("push", "commit", "clock", "pull", "wait")


def fit(client, X, k, iters, ahead):
    with dask.config.set({"ps.lda.read-ahead": ahead}):
        m = LatentDirichletAllocation(k, max_iter=iters, client=client, random_state=0, n_partitions=2)
        t = time.perf_counter()
        m.fit(X)
        wall = time.perf_counter() - t
    reqs = [sum(v for key, v in p["messages"].items() if key.removesuffix("_local") in REQUESTS) for p in m.metrics_]
    pulls = [sum(p[f"{key}_seconds"] for key in ("pull", "clock")) for p in m.metrics_]
    return wall, float(np.mean(reqs)) / (iters + 1), float(np.mean(pulls)), m.components_, \
        m.loglik_history_[-1][2] / m.n_tokens_


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", choices=["threads", "processes"], default="threads")
    ap.add_argument("--k", type=int, nargs="+", default=[50, 1000])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--docs", type=int, default=0, help="0: the whole training split")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    X = split(load_news())[0]
    X = X if args.docs == 0 else X[:args.docs]
    warnings.simplefilter("ignore")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.cluster == "processes",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        fit(client, X[:300], 20, 2, True)  # warm: kernels, plugins
        fit(client, X[:300], 20, 2, False)
        print(f"cluster: {args.cluster}, 2 workers x 1 thread, 2 participants, {X.shape[0]} documents, "
              f"{int(X.sum())} tokens, {args.iters} iterations")
        print(f"{'K':>5} | {'fit s, read after':>17} {'read ahead':>10} {'ratio':>6} | {'requests/it':>11} "
              f"{'(ahead)':>8} | {'pull+clock s':>12} {'(ahead)':>8} | same model")
        for k in args.k:
            after, ahead = [], []
            for _ in range(args.repeat):
                after.append(fit(client, X, k, args.iters, False))
                ahead.append(fit(client, X, k, args.iters, True))
            a, b = (np.median([r[0] for r in rs]) for rs in (after, ahead))
            same = all(np.array_equal(x[3], y[3]) for x, y in zip(after, ahead))
            print(f"{k:>5} | {a:>17.2f} {b:>10.2f} {b / a:>6.2f} | {after[0][1]:>11.2f} {ahead[0][1]:>8.2f} | "
                  f"{np.median([r[2] for r in after]):>12.3f} {np.median([r[2] for r in ahead]):>8.3f} | {same} | "
                  f"{np.median([r[4] for r in after]):.4f} ({np.median([r[4] for r in ahead]):.4f})",
                  flush=True)


if __name__ == "__main__":
    main()
