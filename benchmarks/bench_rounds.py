"""SGD rounds sized by work and SSP(1)'s overlap, side by side with the schedule's rounds (issue 36).

On 2 workers (threads of this process, then worker processes) the same
click-through fit (``bench_sgd.ctr_data``, ``loss="log_loss"``,
``alpha=1e-6``, ``max_iter=E``, ``tol=None``) under:

- ``BSP, schedule (main)``: the default, rounds of ``ps.sgd.clock-samples``
  (at least ``ps.sgd.bsp-min-rounds-per-epoch`` an epoch): main's code
  path (``ps.sgd.rounds-by-work: never``);
- ``SSP(1), schedule (main)``: the sync of round r overlapped with round
  r + 1's compute (the read of round r + 1 waits for the others' round
  r - 1 only), the schedule's 8 rounds an epoch; at this size ``auto``
  changes nothing (the schedule's rounds are shorter than
  ``ps.sgd.clock-samples``);
- ``SSP(1), 16k rounds (main)`` / ``... by work (forced)``: rounds of
  16,384 samples (11 an epoch), kept, or sized by work with
  ``ps.sgd.work-ratio`` 1e9 (as if a clock's sync were a cluster's): the
  first epoch measured, the rest in 4 rounds an epoch
  (``ps.sgd.work-min-rounds-per-epoch``).

Per variant: the fit's wall (median of ``--repeat``), its CPU seconds
(this process and the workers': what load stretches least), test ROC AUC,
the rounds an epoch after the measured one, and the participants' time in
the parameter server's calls::

    python benchmarks/bench_rounds.py                      # 400k rows, E=3, both layouts (~5 min on 2 cores)
    python benchmarks/bench_rounds.py --n 1000000 --layouts processes
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from unittest import mock

import dask
import numpy as np

import bench_sgd

SMALL = {"ps.sgd.clock-samples": 16384}  # 11 rounds an epoch of 180k samples: rounds the rule may size
VARIANTS = {
    "BSP, schedule (main)": ("bsp", {"ps.sgd.rounds-by-work": "never"}),
    "SSP(1), schedule (main)": ("ssp1", {"ps.sgd.rounds-by-work": "never"}),
    "SSP(1), 16k rounds (main)": ("ssp1", {**SMALL, "ps.sgd.rounds-by-work": "never"}),
    "SSP(1), 16k rounds, by work (forced)": ("ssp1", {**SMALL, "ps.sgd.rounds-by-work": "auto",
                                                      "ps.sgd.work-ratio": 1e9}),
}


def fit_once(client, dX, dy, Xte, yte, E, consistency, settings):
    """One fit: (wall s, ROC AUC, rounds an epoch after the measured one,
    mean ps_seconds, CPU seconds of this process and the workers')."""
    import dask_ps
    from dask_ps.linear_model import SGDClassifier
    from dask_ps.linear_model._round_size import RoundsByWork

    model = dask_ps.BSP() if consistency == "bsp" else dask_ps.SSP(1)
    rounds = []
    real = RoundsByWork.measured

    def measured(self, cfg, epochs, results):
        real(self, cfg, epochs, results)
        rounds.append(-(-cfg.steps_per_epoch // (self.decided or cfg.clock_every)))

    with warnings.catch_warnings(), dask.config.set(settings), mock.patch.object(RoundsByWork, "measured", measured):
        warnings.simplefilter("ignore")
        est = SGDClassifier(loss="log_loss", alpha=1e-6, max_iter=E, tol=None, random_state=0, batch_size=2048,
                            client=client, consistency=model)
        cpu = bench_sgd.CPUClock(client)
        c0, t = cpu.read(), time.perf_counter()
        est.fit(dX, dy)
        wall = time.perf_counter() - t
        cpu_s = cpu.read() - c0
    per_epoch = rounds[0] if rounds else None
    ps_s = float(np.mean([m["ps_seconds"] for m in est.metrics_]))
    return wall, bench_sgd.roc_auc(est, Xte, yte), per_epoch, ps_s, cpu_s


def run_layout(layout, X, y, args):
    from distributed import Client, LocalCluster
    from sklearn.model_selection import train_test_split

    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.1, random_state=0)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=layout == "processes", memory_limit=0,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        dX, dy = bench_sgd.spread_blocks(client, Xtr, ytr)
        fit_once(client, dX, dy, Xte, yte, 1, "bsp", {})  # warm-up: imports, compiles
        rows = []
        for name, (cons, settings) in VARIANTS.items():
            runs = sorted((fit_once(client, dX, dy, Xte, yte, args.epochs, cons, settings)
                           for _ in range(args.repeat)), key=lambda r: r[0])
            wall, auc, per_epoch, ps_s, cpu_s = runs[len(runs) // 2]
            rows.append((layout, name, wall, [r[0] for r in runs], auc, per_epoch, ps_s, cpu_s))
            print(f"  {layout:9s} {name:26s} {wall:6.2f} s ({' '.join(f'{r[0]:.2f}' for r in runs)}) "
                  f"AUC {auc:.4f} rounds/epoch after the first: {per_epoch or '-'}; ps {ps_s:.2f} s; "
                  f"CPU {cpu_s:.2f} s", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400_000, help="click-through rows (90%% trained on)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layouts", nargs="+", default=["threads", "processes"], choices=["threads", "processes"])
    args = ap.parse_args()
    X, y = bench_sgd.ctr_data(args.n)
    print(f"click-through {args.n} rows, E={args.epochs}, 2 workers; load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    rows = []
    for layout in args.layouts:
        rows += run_layout(layout, X, y, args)
    print(f"\nload average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}\n")
    print("| layout | variant | wall (s), median (all) | vs main | CPU s (the median fit's) | test ROC AUC | "
          "rounds an epoch after the first | time in the PS calls a participant (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    base = {r[0]: r[2] for r in rows if r[1].startswith("BSP, schedule")}
    for layout, name, wall, walls, auc, per_epoch, ps_s, cpu_s in rows:
        print(f"| {layout} | {name} | {wall:.2f} ({', '.join(f'{w:.2f}' for w in walls)}) | "
              f"{wall / base[layout]:.2f} | {cpu_s:.2f} | {auc:.4f} | {per_epoch or '-'} | {ps_s:.2f} |")


if __name__ == "__main__":
    main()
