"""Chaos: failures injected into a cluster while a client pushes (issue 22).

A ``LocalCluster`` of worker processes, a ``replication=2`` table of 12
blocks, and a client pushing ones into the whole table every 20 ms (each
push numbered, retried by the failover loop). One failure per run:

* ``kill``: SIGKILL of one worker (its nanny starts a new one);
* ``stop1``: SIGSTOP of one worker for ``--stop`` seconds, then SIGCONT;
* ``stop2``: SIGSTOP of two workers 1 s apart for ``--stop`` s each;
* ``kill-join``: a worker joins (``cluster.scale``) and another is killed
  while the tables rebalance onto it;
* ``kill-retire``: one worker retires (``retire_workers``) and another is
  killed during the retire;
* ``busy``: no failure, but a cold start under load: every worker's event
  loop busy for 8 s and a task holding the GIL for 2 x 4 s on one.

For each: runs, acknowledged pushes, lost (acknowledged pushes missing from
the table, summed over runs: must be 0), duplicated (counted twice: must be
0), the longest stall a push saw (seconds between two acknowledged pushes),
and false fencings (workers fenced out that were never stopped or killed).
A run whose final pull raises (``DataLostError``) counts every acknowledged
push as lost.

    python benchmarks/bench_chaos.py [--runs 3] [--stop 8] [--only stop2,kill-retire] [--hung 6s]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time

import dask
import numpy as np
from distributed import Client, LocalCluster

import dask_ps

logger = logging.getLogger("bench_chaos")
N_ROWS, BLOCK_ROWS = 60, 5
SCENARIOS = ("kill", "stop1", "stop2", "kill-join", "kill-retire", "busy")


class Pusher:
    def __init__(self, ps, table):
        self.ps, self.table = ps, table
        self.acked = self.failed = 0
        self.stall = 0.0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        self._last = time.monotonic()
        while not self._stop.is_set():
            try:
                self.ps.push(self.table, np.ones(N_ROWS))
                self.acked += 1
                now = time.monotonic()
                self.stall, self._last = max(self.stall, now - self._last), now
            except Exception as e:  # noqa: BLE001 - counted
                self.failed += 1
                logger.info("push failed: %r", e)
            time.sleep(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(300)
        self.stall = max(self.stall, time.monotonic() - self._last)  # a stall still open at the end


def busy_event_loop(seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass


def hold_the_gil(seconds, stretches):
    """libc's sleep through ctypes.PyDLL, which keeps the GIL."""
    import ctypes
    import ctypes.util

    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    for _ in range(stretches):
        libc.sleep(int(seconds))
        time.sleep(0.05)


def one_run(scenario, stop_s):
    n = 4
    with LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=None) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
        servers = ps.servers
        pids = client.run(os.getpid)
        disturbed = set()
        with Pusher(ps, "w") as p:
            time.sleep(1.0)
            if scenario == "kill":
                disturbed.add(servers[0])
                os.kill(pids[servers[0]], signal.SIGKILL)
                time.sleep(stop_s)
            elif scenario in ("stop1", "stop2"):
                victims = servers[:1] if scenario == "stop1" else servers[:2]
                disturbed |= set(victims)
                try:
                    for v in victims:
                        os.kill(pids[v], signal.SIGSTOP)
                        time.sleep(1.0)
                    time.sleep(max(0.0, stop_s - len(victims)))
                finally:
                    for v in victims:
                        os.kill(pids[v], signal.SIGCONT)
                        time.sleep(1.0)
            elif scenario == "kill-join":
                c.scale(n + 1)
                client.wait_for_workers(n + 1, timeout=120)
                time.sleep(0.1)
                disturbed.add(servers[0])
                os.kill(pids[servers[0]], signal.SIGKILL)
                time.sleep(stop_s)
            elif scenario == "kill-retire":
                retire = threading.Thread(target=client.retire_workers, args=([servers[0]],))
                retire.start()
                time.sleep(0.1)
                disturbed |= {servers[0], servers[1]}
                os.kill(pids[servers[1]], signal.SIGKILL)
                retire.join(300)
                time.sleep(stop_s)
            elif scenario == "busy":
                gil = client.submit(hold_the_gil, 4, 2, workers=[servers[1]], pure=False)
                client.run(busy_event_loop, 8.0)
                gil.result()
                time.sleep(1.0)
            time.sleep(2.0)
        ps.wait_for_placement()
        fenced = {m.get("address") for _, m in client.get_events("ps-worker-left") if "hung" in str(m.get("reason"))}
        try:
            got = ps.pull("w")
            lost = int(max(0, p.acked - got.min()))
            duplicated = int(max(0, got.max() - (p.acked + p.failed)))
            error = None
        except Exception as e:  # noqa: BLE001 - reported
            lost, duplicated, error = p.acked, 0, repr(e)
        return {"acked": p.acked, "failed": p.failed, "lost": lost, "duplicated": duplicated,
                "stall_s": round(p.stall, 2), "false_fencings": len(fenced - disturbed), "error": error}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stop", type=float, default=8.0)
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--hung", default=None, help="ps.timeouts.hung (default: the package's)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cfg = {} if args.hung is None else {"ps.timeouts.hung": args.hung}
    rows = {}
    with dask.config.set(cfg):
        for scenario in args.only.split(","):
            results = [one_run(scenario, args.stop) for _ in range(args.runs)]
            rows[scenario] = {
                "runs": len(results),
                "acked": sum(r["acked"] for r in results),
                "lost": sum(r["lost"] for r in results),
                "duplicated": sum(r["duplicated"] for r in results),
                "stall_s_max": max(r["stall_s"] for r in results),
                "false_fencings": sum(r["false_fencings"] for r in results),
                "errors": [r["error"] for r in results if r["error"]],
            }
            print(scenario, json.dumps(rows[scenario]), flush=True)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
