"""Clock messages combined per process (issue 36, Bösen's process oplog):
``ps.clock.combine-per-process`` off against on, interleaved, in one script.

Two worker processes with ``--threads`` threads each (one participant a
thread, its part scattered there: ``threads`` participants per process).
Workloads:

* ``loop``: a ``ParameterServer.run`` of ``--clocks`` clocks of: read the
  participant's rows of a table spread over both workers, push to them,
  ``ctx.clock()`` (a BSP table unless ``--ssp``);
* ``sgd``: an ``SGDClassifier`` fit (BSP, dense 40,000 x 20, ``--epochs``,
  ``n_jobs`` = all the participants).

What is measured, per participant-clock (load-robust, since walls lie on a
loaded machine): the clock requests each server received through the comm
(``RunManager.received["clock"]``), per server per clock; the workers'
process CPU (``getrusage``: participants, servers and comms together); the
workers' event-loop thread CPU (``time.thread_time`` on the loop: the
servers' handlers and both sides' comms, the participants' compute
excluded); and the wall time (meaningful when quiet only).

    python benchmarks/bench_clock_combine.py --threads 2 4 --clocks 300 --repeats 3
    python benchmarks/bench_clock_combine.py --threads 2 4 --workload sgd --epochs 5 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import time

import dask
import numpy as np
from distributed import Client, LocalCluster

import dask_ps


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _loop_cpu(dask_worker) -> float:  # run on the worker's event loop (a coroutine function)
    return time.thread_time()


def _received(dask_worker) -> dict:
    return dict(dask_worker.extensions["ps"].run_manager.received)


def _configure(on: bool) -> None:
    dask.config.set({"ps.clock.combine-per-process": on})


def _counters(client):
    return (sum(client.run(_cpu_seconds).values()), sum(client.run(_loop_cpu).values()),
            sum(r.get("clock", 0) for r in client.run(_received).values()))


def _loop(ctx, part, table, clocks, width):
    rows = np.arange(ctx.rank, width, ctx.n_participants)
    ones = np.ones(rows.size)
    for _ in range(clocks):
        ctx.pull_rows(table, rows)
        ctx.push_rows(table, rows, ones)
        ctx.clock()
    return ctx.current_clock


def _run_loop(client, ps, args, n):
    workers = sorted(client.scheduler_info()["workers"])
    parts = []
    for w in workers:  # ``threads`` participants on each worker
        parts += client.scatter(list(range(args.threads_now)), workers=[w], broadcast=False, hash=False)
    name = f"cc-{np.random.randint(1 << 30)}"
    width = 64 * n
    ps.create_table(name, shape=(width,), block_rows=8,
                    consistency=dask_ps.SSP(1) if args.ssp else dask_ps.BSP())
    try:
        clocks = ps.run(_loop, parts, table=name, clocks=args.clocks, width=width)
    finally:
        ps.drop_table(name)
    return sum(clocks), args.clocks


def _run_sgd(client, ps, args, n, data=[]):
    from dask_ps.linear_model import SGDClassifier

    if not data:
        from sklearn.datasets import make_classification

        data.append(make_classification(40000, 20, random_state=0))
    X, y = data[0]
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000}):
        est = SGDClassifier(random_state=0, consistency=dask_ps.BSP(), max_iter=args.epochs, tol=None, n_jobs=n,
                            client=client).fit(X, y)
    clocks = [int(m.get("clock") or 0) for m in est.metrics_]
    return sum(clocks), max(clocks)


def measure(client, ps, args, on: bool):
    client.run(_configure, on)
    n = 2 * args.threads_now
    cpu0, loop0, msgs0 = _counters(client)
    t0 = time.perf_counter()
    pclocks, clocks = (_run_sgd if args.workload == "sgd" else _run_loop)(client, ps, args, n)
    wall = time.perf_counter() - t0
    cpu1, loop1, msgs1 = _counters(client)
    return {"msgs_per_server_clock": (msgs1 - msgs0) / 2 / max(1, clocks),
            "cpu_ms": 1e3 * (cpu1 - cpu0) / pclocks, "loop_ms": 1e3 * (loop1 - loop0) / pclocks,
            "wall_ms": 1e3 * wall / max(1, clocks)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--workload", choices=["loop", "sgd"], default="loop")
    ap.add_argument("--clocks", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--ssp", action="store_true", help="loop: SSP(1) instead of BSP")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("distributed").setLevel(logging.ERROR)
    print(f"load {os.getloadavg()[0]:.1f}; workload {args.workload}" + (" SSP(1)" if args.ssp else " BSP"))
    for t in args.threads:
        args.threads_now = t
        with LocalCluster(n_workers=2, threads_per_worker=t, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            ps = dask_ps.ParameterServer(client)
            measure(client, ps, args, False)  # warm-up (compiles, connections)
            got = {False: [], True: []}
            for _ in range(args.repeats):
                for on in (False, True):  # interleaved
                    got[on].append(measure(client, ps, args, on))
            for on in (False, True):
                med = {k: statistics.median(r[k] for r in got[on]) for k in got[on][0]}
                print(f"2 x {t} threads, combine {'on ' if on else 'off'}: "
                      f"{med['msgs_per_server_clock']:.2f} clock messages per server per clock; per "
                      f"participant-clock: workers' CPU {med['cpu_ms']:.3f} ms, event loops' CPU "
                      f"{med['loop_ms']:.3f} ms; wall {med['wall_ms']:.2f} ms a clock "
                      f"(CPU runs {', '.join(format(r['cpu_ms'], '.3f') for r in got[on])})")
        print(f"  (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
