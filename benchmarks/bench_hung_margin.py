"""The margin of the hung-worker detector under CPU load (issue 34).

``HungWorkers`` fences out a member not heard (neither its beacon thread
nor its Dask heartbeat) for ``ps.timeouts.hung`` (6 s). This measures, on
healthy workers, the longest silence the detector itself sees: a
``LocalCluster`` of ``--workers`` worker processes with a ``replication=2``
table and a client pushing into it every 20 ms, while ``B`` extra processes
burn CPU (pure-Python loops, ``B`` in ``--burners``), for ``--seconds``
each. Every check of the detector (4 a second, on the scheduler's loop)
records ``now - last_heard(w)`` for each member: the figure compared with
the limit. Reports per level: the 1-minute load average at the end
(``os.getloadavg``, the machine's other jobs included), the longest
silence of any worker, its ratio to the limit, and workers fenced out
(must be 0: none is stopped).

``--fit``: instead of the pushing client, a cold first fit
(``SGDClassifier(replication=2)`` on 20,000 x 30 samples, each worker
process with an empty numba cache, so every kernel compiles in every
worker) during the level; the silences of a fit's compile and kernels on
top of the load.

    python benchmarks/bench_hung_margin.py [--burners 0,4,8,16] [--seconds 30] [--workers 3] [--fit]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import threading
import time

import numpy as np
from distributed import Client, LocalCluster

import dask_ps
from dask_ps import _config
from dask_ps._scheduler_plugin import PSSchedulerPlugin

N_ROWS, BLOCK_ROWS = 60, 5


def burn(seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass


def _record_silences(plugin):
    """Wrap the detector's periodic check: the longest ``now - last_heard``
    per member, as the check sees it."""
    from distributed.metrics import time as dtime

    worst: dict[str, float] = {}
    check = plugin.hung.check

    def recording():
        now = dtime()
        for w in list(plugin.members):
            worst[w] = max(worst.get(w, 0.0), now - plugin.hung.last_heard(w))
        check()

    plugin.hung.check = recording
    plugin.hung._callback.callback = recording
    return worst


def cold_fit(client):
    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    X, y = make_classification(20_000, 30, n_informative=10, random_state=0)
    return SGDClassifier(client=client, replication=2, max_iter=5, tol=None, random_state=0).fit(X, y).score(X, y)


def one_level(n_burners, seconds, n_workers, fit=False):
    import tempfile

    ctx = mp.get_context("spawn")
    cache = tempfile.mkdtemp(prefix="numba-cold-")
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=None,
                      env={"NUMBA_CACHE_DIR": cache}) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
        plugin = next(p for p in c.scheduler.plugins.values() if isinstance(p, PSSchedulerPlugin))
        time.sleep(2.0)  # every beacon heard once
        worst = _record_silences(plugin)
        burners = [ctx.Process(target=burn, args=(seconds,), daemon=True) for _ in range(n_burners)]
        for b in burners:
            b.start()
        stop, pushes = threading.Event(), [0]

        def push():
            while not stop.is_set():
                ps.push("w", np.ones(N_ROWS))
                pushes[0] += 1
                time.sleep(0.02)

        th = threading.Thread(target=push, daemon=True)
        t0 = time.monotonic()
        if fit:
            score = cold_fit(client)
        else:
            th.start()
            time.sleep(seconds)
            stop.set()
            th.join(60)
            score = None
        for b in burners:
            b.join(10)
        fenced = [m for _, m in client.get_events("ps-worker-left")]
        limit = _config.get_seconds("timeouts.hung")
        longest = max(worst.values()) if worst else float("nan")
        return {"burners": n_burners, "load1": round(os.getloadavg()[0], 1), "pushes": pushes[0],
                "fit_score": score, "seconds": round(time.monotonic() - t0, 1),
                "longest_silence_s": round(longest, 2), "of_limit": round(longest / limit, 2),
                "per_worker_s": sorted(round(v, 2) for v in worst.values()), "fenced": len(fenced)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--burners", default="0,4,8,16")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--fit", action="store_true", help="a cold first fit instead of a pushing client")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for n in (int(x) for x in args.burners.split(",")):
        rows.append(one_level(n, args.seconds, args.workers, fit=args.fit))
        print(json.dumps(rows[-1]), flush=True)
    print(f"cpus {os.cpu_count()}, limit {_config.get_seconds('timeouts.hung')} s")


if __name__ == "__main__":
    main()
