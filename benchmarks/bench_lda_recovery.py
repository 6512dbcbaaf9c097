"""What LDA's fault tolerance costs and what a lost worker costs (issue 6).

On a LocalCluster of 3 workers (1 thread each), 3 participants, the same
corpus, K and iterations for every fit:

1. Cost of fault tolerance: fit time of ``replication=2`` (chunks of
   ``checkpoint_every`` iterations, assignments stored in replicated tables
   between chunks) and of ``checkpoint=<dir>`` (the same, saved to disk),
   relative to a plain fit, interleaved over ``--repeat`` rounds.
2. A worker killed (SIGKILL) in the middle of a ``replication=2`` fit: its
   fit time and final log-likelihood relative to the undisturbed
   ``replication=2`` fits of part 1, and the number of chunks redone.

    python benchmarks/bench_lda_recovery.py [--docs 3000] [--iters 40] [--every 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import tempfile
import threading
import time

import numpy as np
import scipy.sparse as sp
from distributed import Client, LocalCluster

import dask_ps
from dask_ps.decomposition import LatentDirichletAllocation


def corpus(n_docs, doc_len=120, n_words=2000, n_topics=20, seed=0):
    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(n_words, 0.05), size=n_topics)
    theta = rng.dirichlet(np.full(n_topics, 0.3), size=n_docs)
    return sp.csr_matrix(np.vstack([rng.multinomial(doc_len, p / p.sum()) for p in theta @ topics]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    X = corpus(args.docs, n_topics=args.topics)
    tmp = tempfile.mkdtemp(prefix="bench_lda_recovery-")
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        dask_ps.get_parameter_server(client)  # install the plugins before timing
        print(f"# bench_lda_recovery: {X.shape[0]} docs, {int(X.sum())} tokens, K={args.topics}, "
              f"{args.iters} iterations, checkpoint_every={args.every}, 3 workers x 1 thread, "
              f"{args.repeat} interleaved round(s)")

        def fit(**kw):
            return LatentDirichletAllocation(
                args.topics, max_iter=args.iters, evaluate_every=0, n_partitions=3, random_state=0,
                client=client, **kw).fit(X)

        variants = {
            "plain": {},
            "replication=2": {"replication": 2, "checkpoint_every": args.every},
            "checkpoint": {"checkpoint_every": args.every},
        }
        fit()  # warm-up (numba compilation, imports on the workers)
        times = {k: [] for k in variants}
        lls = {k: [] for k in variants}
        for r in range(args.repeat):
            for name, kw in variants.items():
                if name == "checkpoint":
                    kw = dict(kw, checkpoint=os.path.join(tmp, f"ckpt-{r}"))
                t0 = time.perf_counter()
                est = fit(**kw)
                times[name].append(time.perf_counter() - t0)
                lls[name].append(est.loglik_history_[-1][2])
        base = statistics.median(times["plain"])
        print("\n| fit | seconds (median) | time / plain [min-max] | final loglik (median) |")
        print("| --- | --- | --- | --- |")
        for name in variants:
            ratios = [t / p for t, p in zip(times[name], times["plain"])]
            print(f"| {name} | {statistics.median(times[name]):.2f} | {statistics.median(ratios):.2f} "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}] | {statistics.median(lls[name]):.6g} |")

        # 2. kill a worker in the middle of a replication=2 fit
        killed = {}
        mid = base * 0.5

        def killer():
            time.sleep(mid)
            victim = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
            os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
            killed["at"] = time.perf_counter()

        th = threading.Thread(target=killer, daemon=True)
        t0 = time.perf_counter()
        th.start()
        est = fit(**variants["replication=2"])
        seconds = time.perf_counter() - t0
        th.join(5)
        quiet_t = statistics.median(times["replication=2"])
        quiet_ll = statistics.median(lls["replication=2"])
        ll = est.loglik_history_[-1][2]
        print(f"\nkill -9 of a worker {killed.get('at', float('nan')) - t0:.1f} s into a replication=2 fit: "
              f"{seconds:.2f} s ({seconds / quiet_t:.2f}x the undisturbed median), chunks redone "
              f"{est.n_restarts_}, final loglik {ll:.6g} ({(ll - quiet_ll) / abs(quiet_ll) * 100:+.2f}% vs "
              "undisturbed)")


if __name__ == "__main__":
    main()
