"""The seed paper's claim, measured: bounded staleness vs. BSP with stragglers.

Least squares by minibatch SGD with 4 participants on a LocalCluster. Each
iteration's compute is emulated with a sleep of a fixed duration (so the
2-core machine's contention does not blur who is slow); one participant is
a straggler. Two scenarios:

- ``persistent``: participant 3 always takes twice as long (the issue's setup);
- ``transient``: every participant, at every clock, takes 3x as long with
  probability 0.2 (stragglers that come and go, as on shared clusters).

For BSP, SSP(1, 2, 4, 8), ESSP(2), VAP, ASP it prints time per clock, time
blocked, the time to reach a fixed objective, the final objective, and
writes objective-vs-time plots to ``docs/staleness_<scenario>.png``.

    python benchmarks/bench_staleness.py [--clocks 60] [--scenario both]
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

import numpy as np
from distributed import Client, LocalCluster

import dask_ps

logger = logging.getLogger("bench_staleness")

P = 4


def make_problem(n=20_000, d=50, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w_true = rng.normal(size=d)
    y = X @ w_true + 0.1 * rng.normal(size=n)
    return X, y


def objective(X, y, w):
    r = X @ w - y
    return float(r @ r / len(y))


def participant(ctx, part, clocks, base, scenario, lr, batch):
    X, y = part
    rng = np.random.default_rng(ctx.rank)
    for c in range(clocks):
        w = ctx.pull("w")
        idx = rng.integers(0, len(y), batch)
        g = 2 * X[idx].T @ (X[idx] @ w - y[idx]) / batch
        if scenario == "persistent":
            slow = 2.0 if ctx.rank == P - 1 else 1.0
        else:
            slow = 3.0 if rng.random() < 0.2 else 1.0
        time.sleep(base * slow)  # the iteration's compute time
        ctx.push("w", -lr * g / ctx.n_participants)
        ctx.clock()
    return ctx.metrics()


def run_one(ps, client, name, model, parts, X, y, args):
    ps.create_table("w", shape=(X.shape[1],), consistency=model)
    trace, done = [], threading.Event()

    def monitor():
        t0 = time.perf_counter()
        while not done.is_set():
            trace.append((time.perf_counter() - t0, objective(X, y, ps.pull("w"))))
            time.sleep(0.01)

    th = threading.Thread(target=monitor)
    t0 = time.perf_counter()
    th.start()
    ms = ps.run(participant, parts, clocks=args.clocks, base=args.base, scenario=args.scenario_now,
                lr=args.lr, batch=args.batch)
    seconds = time.perf_counter() - t0
    done.set()
    th.join()
    final = objective(X, y, ps.pull("w"))
    trace.append((seconds, final))
    ps.drop_table("w")
    blocked = [m["clock_wait_seconds"] + sum(t["wait_seconds"] for t in m["tables"].values()) for m in ms]
    return {
        "name": name,
        "seconds": seconds,
        "per_clock": seconds / args.clocks,
        "blocked_fast": float(np.mean(blocked[: P - 1])),
        "final": final,
        "trace": trace,
    }


def time_to(trace, target):
    for t, obj in trace:
        if obj <= target:
            return t
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clocks", type=int, default=60)
    ap.add_argument("--base", type=float, default=0.02, help="seconds of compute per iteration")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--scenario", choices=["persistent", "transient", "both"], default="both")
    ap.add_argument("--plot-dir", default="docs")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    logging.getLogger("dask_ps").setLevel(logging.WARNING)

    X, y = make_problem()
    models = [
        ("BSP", dask_ps.BSP()),
        ("SSP(1)", dask_ps.SSP(1)),
        ("SSP(2)", dask_ps.SSP(2)),
        ("SSP(4)", dask_ps.SSP(4)),
        ("SSP(8)", dask_ps.SSP(8)),
        ("ESSP(2)", dask_ps.ESSP(2)),
        ("VAP(0.5)", dask_ps.VAP(0.5)),
        ("ASP", dask_ps.ASP()),
    ]
    scenarios = ["persistent", "transient"] if args.scenario == "both" else [args.scenario]
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None) as cluster, Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        parts = client.scatter([(X[i::P], y[i::P]) for i in range(P)])
        for scenario in scenarios:
            args.scenario_now = scenario
            results = []
            for name, model in models:
                logger.info("%s: %s", scenario, name)
                results.append(run_one(ps, client, name, model, parts, X, y, args))
            bsp = results[0]
            # Target: 1.1x the objective BSP ends with after all its clocks.
            target = bsp["final"] * 1.1
            t_bsp = time_to(bsp["trace"], target)
            print(f"\nscenario: {scenario} straggler; {P} participants, {args.clocks} clocks, "
                  f"{args.base * 1000:.0f} ms compute per clock; target objective {target:.4g}")
            print(f"{'model':10s} {'s/clock':>8s} {'blocked/fast':>12s} {'t→target':>9s} {'speedup':>8s} "
                  f"{'final obj':>10s} {'vs BSP':>7s}")
            for r in results:
                t = time_to(r["trace"], target)
                print(f"{r['name']:10s} {r['per_clock']:8.4f} {r['blocked_fast']:12.3f} {t:9.3f} "
                      f"{t_bsp / t:8.2f} {r['final']:10.4g} {r['final'] / bsp['final']:7.3f}")
            plot(results, scenario, target, args.plot_dir)


def plot(results, scenario, target, plot_dir):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib not installed: no plot (pip install -e '.[bench]')")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        t, obj = zip(*r["trace"])
        ax.plot(t, obj, label=r["name"], lw=1.2)
    ax.axhline(target, color="k", ls=":", lw=0.8, label="target")
    ax.set_yscale("log")
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("objective (mean squared error)")
    ax.set_title(f"SGD least squares, 4 participants, {scenario} straggler")
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    path = f"{plot_dir}/staleness_{scenario}.png"
    fig.savefig(path, dpi=110)
    logger.info("wrote %s", path)


if __name__ == "__main__":
    main()
