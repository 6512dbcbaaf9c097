"""The scheduler's CPU per participant-clock (issue 36).

A separate ``dask scheduler`` process and two ``dask worker`` processes
(one thread each); a ``ParameterServer.run`` of two participants, each
doing ``--clocks`` iterations of: read its rows of a BSP table (spread over
both workers), push to them, ``ctx.clock()``. The scheduler process's CPU
time (psutil, user + system; 10 ms ticks) is read around a run of
``--clocks`` clocks and around one of ``--short`` clocks, each followed by
an idle stretch as long as the run; the figure is the difference of the
two runs' CPU beyond the idle rate, divided by participants x the
difference in clocks (a run's fixed costs, its start, joins, leaves and
end, cancel out). The same script runs on older code (``PYTHONPATH`` picks
the checkout)::

    python benchmarks/bench_sched_clock.py --clocks 1000 --repeat 3
    python benchmarks/bench_sched_clock.py --sgd --repeat 3

``--sgd``: the same over two ``SGDClassifier`` fits (2 participants, dense
40,000 x 20, ``--epochs`` apart), the clocks being those the participants
report in ``metrics_``.

Also printed: the participants' message counts per clock where the code
reports them (``metrics()["messages"]``).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def participant(ctx, part, clocks):
    rows = np.arange(ctx.rank, 64, 2)
    for _ in range(clocks):
        ctx.pull_rows("w", rows)
        ctx.push_rows("w", rows, np.ones(rows.size))
        ctx.clock()
    return ctx.metrics().get("messages")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clocks", type=int, default=1000)
    ap.add_argument("--short", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sgd", action="store_true", help="SGDClassifier fits instead of a ps.run loop")
    ap.add_argument("--epochs", type=int, nargs=2, default=[2, 10])
    args = ap.parse_args()

    import psutil
    from distributed import Client

    import dask_ps

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        time.sleep(2.0)
        for _ in range(2):
            procs.append(subprocess.Popen(["dask", "worker", addr, "--nthreads", "1", "--no-dashboard"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        sched = psutil.Process(procs[0].pid)
        cpu = lambda: sum(sched.cpu_times()[:2])  # noqa: E731
        with Client(addr, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            ps = dask_ps.ParameterServer(client)
            ps.create_table("w", shape=(64,), block_rows=32, consistency=dask_ps.BSP())
            ps.run(participant, range(2), clocks=5)  # warm up (imports, connections)
            def measured(clocks):
                c0, t0 = cpu(), time.perf_counter()
                msgs = ps.run(participant, range(2), clocks=clocks)
                c1, t1 = cpu(), time.perf_counter()
                time.sleep(t1 - t0)  # idle, as long as the run
                idle = (cpu() - c1) / (time.perf_counter() - t1)
                return (c1 - c0) - idle * (t1 - t0), t1 - t0, idle, msgs

            if args.sgd:
                return _sgd(client, cpu, args)
            for i in range(args.repeat):
                long_cpu, long_s, idle, msgs = measured(args.clocks)
                short_cpu, short_s, _, _ = measured(args.short)
                per = (long_cpu - short_cpu) / (2 * (args.clocks - args.short))
                short_ms = (long_s - short_s) / (args.clocks - args.short) * 1e3  # a clock beyond a run's fixed costs
                print(f"run {i}: {args.clocks} clocks in {long_s:.2f} s ({short_ms:.2f} ms a clock beyond a run's start "
                      f"and end), "
                      f"scheduler CPU beyond idle ({idle * 1e3:.0f} ms/s) {long_cpu:.3f} s; {args.short} clocks "
                      f"{short_cpu:.3f} s: {per * 1e6:.0f} us per participant-clock")
                if msgs and msgs[0]:
                    print(f"  requests of participant 0 per clock: "
                          f"{ {k: round(v / args.clocks, 2) for k, v in msgs[0].items() if 'bytes' not in k} }")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _sgd(client, cpu, args) -> None:
    import dask.array as da

    from dask_ps.linear_model import SGDClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40_000, 20))
    y = (X @ rng.normal(size=20) > 0).astype(int)
    dX, dy = da.from_array(X, chunks=(20_000, 20)), da.from_array(y, chunks=20_000)

    def fit(epochs):
        c0, t0 = cpu(), time.perf_counter()
        m = SGDClassifier(max_iter=epochs, tol=None, random_state=0, client=client, n_jobs=2).fit(dX, dy)
        c1, t1 = cpu(), time.perf_counter()
        time.sleep(t1 - t0)
        idle = (cpu() - c1) / (time.perf_counter() - t1)
        clocks = sum(int(p.get("clock", 0)) for p in m.metrics_)
        return (c1 - c0) - idle * (t1 - t0), t1 - t0, idle, clocks, m.metrics_[0].get("messages_per_clock")

    fit(2)  # warm up
    lo, hi = args.epochs
    for i in range(args.repeat):
        long_cpu, long_s, idle, long_clocks, per = fit(hi)
        short_cpu, _, _, short_clocks, _ = fit(lo)
        us = (long_cpu - short_cpu) / max(1, long_clocks - short_clocks) * 1e6
        print(f"sgd {i}: {hi} epochs {long_s:.2f} s, {long_clocks} participant-clocks, scheduler CPU beyond idle "
              f"({idle * 1e3:.0f} ms/s) {long_cpu:.3f} s; {lo} epochs {short_clocks} clocks {short_cpu:.3f} s: "
              f"{us:.0f} us per participant-clock")
        if per:
            print(f"  requests of participant 0 per clock: "
                  f"{ {k: round(v, 2) for k, v in per.items() if 'bytes' not in k} }")


if __name__ == "__main__":
    sys.exit(main())
