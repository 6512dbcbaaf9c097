"""What SSP(1) costs over BSP on 2 workers (docs/benchmarks.md, "SGD
rounds sized by work": "SSP(1) itself cost").

One cluster (2 workers, 1 thread each, threads layout: every participant
and server in this process), the click-through data of ``bench_sgd``, and
after a warm-up fit of each mode, ``--passes`` passes of: BSP, SSP(1),
SSP(1) at ``ps.sgd.min-rounds-per-epoch: 4`` (BSP's round count) and BSP at
``ps.sgd.bsp-min-rounds-per-epoch: 8`` (SSP(1)'s). Each line: the fit's wall
and ``process_time`` (all threads: participants and servers) and the
parameter server's seconds of its first problem.

    python benchmarks/bench_ssp_cost.py [--rows 400000] [--epochs 3] [--catch-up]

``--catch-up``: BSP, SSP(1) and SSP(1) with ``ps.sgd.catch-up: false``
(what the catch-up costs; docs/benchmarks.md, "SGD under SSP: catching up").
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import dask
from distributed import Client, LocalCluster
from sklearn.model_selection import train_test_split

import bench_sgd
import dask_ps
from dask_ps.linear_model import SGDClassifier

VARIANTS = [("bsp", {}), ("ssp1", {}), ("ssp1", {"ps.sgd.min-rounds-per-epoch": 4}),
            ("bsp", {"ps.sgd.bsp-min-rounds-per-epoch": 8})]
# --catch-up: SSP(1) with the catch-up (the default) against the read as it is
# (ps.sgd.catch-up false: an aggregate="push" table and the additive share).
CATCH_UP_VARIANTS = [("bsp", {}), ("ssp1", {}), ("ssp1", {"ps.sgd.catch-up": False})]


def _fit(client, dX, dy, mode, settings, epochs):
    with warnings.catch_warnings(), dask.config.set(settings):
        warnings.simplefilter("ignore")
        est = SGDClassifier(loss="log_loss", alpha=1e-6, max_iter=epochs, tol=None, random_state=0,
                            batch_size=2048, client=client,
                            consistency=dask_ps.BSP() if mode == "bsp" else dask_ps.SSP(1))
        t0, p0 = time.perf_counter(), time.process_time()
        est.fit(dX, dy)
        return time.perf_counter() - t0, time.process_time() - p0, est


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--catch-up", action="store_true", help="SSP(1) with and without the catch-up, and BSP")
    ap.add_argument("--accuracy", type=int, default=0, metavar="N",
                    help="--catch-up's SSP(1) variants N fits each, their test accuracy against scikit-learn's "
                         "10 seeds (the passes' accuracies vary with timing)")
    args = ap.parse_args()
    X, y = bench_sgd.ctr_data(args.rows)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.1, random_state=0)
    variants = CATCH_UP_VARIANTS if args.catch_up else VARIANTS
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, memory_limit=0,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        dX, dy = bench_sgd.spread_blocks(client, Xtr, ytr)
        for mode in ("bsp", "ssp1"):
            _fit(client, dX, dy, mode, {}, 1)  # compile and warm up
        for _ in range(args.passes):
            for mode, settings in variants:
                wall, cpu, est = _fit(client, dX, dy, mode, settings, args.epochs)
                ps_s = est.metrics_[0].get("ps_seconds")
                print(f"{mode:5s} {str(settings):40s} wall {wall:.2f} s  cpu {cpu:.2f} s  ps {ps_s:.2f} s  "
                      f"accuracy {est.score(Xte, yte):.4f}", flush=True)
        if args.accuracy:
            _accuracies(client, dX, dy, Xtr, ytr, Xte, yte, args.epochs, args.accuracy)
    print("load", os.getloadavg())


def _accuracies(client, dX, dy, Xtr, ytr, Xte, yte, epochs, n):
    import numpy as np
    from sklearn.linear_model import SGDClassifier as Sk

    def line(label, acc):
        print(f"{label:40s} {len(acc)} fits: accuracy min {min(acc):.4f} median {np.median(acc):.4f} "
              f"max {max(acc):.4f}", flush=True)

    line("scikit-learn, seeds 0-9", [Sk(loss="log_loss", alpha=1e-6, max_iter=epochs, tol=None, random_state=s)
                                     .fit(Xtr, ytr).score(Xte, yte) for s in range(10)])
    acc = {False: [], True: []}
    for _ in range(n):  # interleaved: the same machine state for both
        for cu in (True, False):
            acc[cu].append(_fit(client, dX, dy, "ssp1", {"ps.sgd.catch-up": cu}, epochs)[2].score(Xte, yte))
    line("SSP(1), catch-up", acc[True])
    line("SSP(1), without", acc[False])


if __name__ == "__main__":
    main()
