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
* ``kill-during-retire`` (issue 34): two participants of a ``ps.run`` push
  (each push flushed, so acknowledged), a worker that runs no participant
  retires, and another block holder is killed (SIGKILL) once the
  evacuation copies its first blocks (a hook on the scheduler plugin,
  plus a random 0-0.3 s): the placement change must finish (``stuck``
  counts runs where ``wait_for_placement`` or the run did not return in
  ``--stuck-after`` s), and a loss must be a ``DataLostError``
  (``reported``), never a table that silently lacks acknowledged pushes.

For each: runs, acknowledged pushes, lost (acknowledged pushes missing from
the table, summed over runs: must be 0), duplicated (counted twice: must be
0), the longest stall a push saw (seconds between two acknowledged pushes),
and false fencings (workers fenced out that were never stopped or killed).
A run whose final pull raises (``DataLostError``) counts every acknowledged
push as lost.

    python benchmarks/bench_chaos.py [--runs 3] [--stop 8] [--only stop2,kill-retire] [--hung 6s]
        [--seconds 6] [--stuck-after 180]
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
SCENARIOS = ("kill", "stop1", "stop2", "kill-join", "kill-retire", "busy", "kill-during-retire")


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


def push_and_count(ctx, part, seconds):
    """A participant: push ones into the table, each push flushed (so
    acknowledged when flush returns), for ``seconds``."""
    import time as _time

    import numpy as _np

    acked = failed = 0
    t0 = _time.monotonic()
    while _time.monotonic() - t0 < seconds:
        try:
            ctx.push("w", _np.ones(N_ROWS))
            ctx.flush()
            acked += 1
        except Exception:  # noqa: BLE001 - counted (may be applied: a duplicate is not a loss)
            failed += 1
        _time.sleep(0.02)
    return acked, failed


def _in_thread(fn, timeout):
    """``fn()`` in a daemon thread: (finished, result or exception)."""
    box = {}

    def target():
        try:
            box["ok"] = fn()
        except BaseException as e:  # noqa: BLE001 - returned
            box["err"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        return False, None
    return True, box.get("ok", box.get("err"))


def _kill_on_first_evacuation_copy(plugin, retiree, victim, pid, rng):
    """Wrap the scheduler plugin's worker calls: the first ``ps_copy_blocks``
    with the retiree as source kills ``victim`` (after 0-0.3 s)."""
    call = plugin.calls.call_once
    fired = []

    def hooked(worker, op, **msg):
        if op == "ps_copy_blocks" and worker == retiree and not fired:
            fired.append(time.monotonic())
            threading.Timer(rng.uniform(0, 0.3), os.kill, args=(pid, signal.SIGKILL)).start()
        return call(worker, op, **msg)

    plugin.calls.call_once = hooked
    return fired


def kill_during_retire_run(seconds, stuck_after, seed):
    """Issue 34, case 1 (module docstring)."""
    from dask_ps._scheduler_plugin import PSSchedulerPlugin

    rng = np.random.default_rng(seed)
    c = LocalCluster(n_workers=4, threads_per_worker=2, dashboard_address=None)
    client = Client(c)
    try:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
        servers = ps.servers  # the run's participants go to servers[0] and servers[1]
        retiree, victim = servers[2], servers[3]
        pid = client.run(os.getpid, workers=[victim])[victim]
        plugin = next(p for p in c.scheduler.plugins.values() if isinstance(p, PSSchedulerPlugin))
        fired = _kill_on_first_evacuation_copy(plugin, retiree, victim, pid, rng)
        box = {}
        runner = threading.Thread(target=lambda: box.update(r=_in_thread(
            lambda: ps.run(push_and_count, range(2), seconds=seconds), stuck_after)), daemon=True)
        runner.start()
        time.sleep(1.5)
        retired, _ = _in_thread(lambda: client.retire_workers([retiree]), stuck_after)
        if not fired:  # the evacuation copied nothing from the retiree: kill anyway
            os.kill(pid, signal.SIGKILL)
        runner.join(stuck_after + 5)
        finished, res = box.get("r", (False, None))
        settled, _ = _in_thread(ps.wait_for_placement, stuck_after) if finished else (False, None)
        out = {"acked": 0, "failed": 0, "lost": 0, "reported": 0, "duplicated": 0,
               "stuck": int(not (retired and finished and settled)), "error": None}
        if out["stuck"]:
            t = plugin.tables.get("w")
            out["error"] = (f"stuck: retired={retired} run={finished} settled={settled} "
                            f"owners={getattr(t, 'owners', None)} lost={getattr(t, 'lost', None)}")
            return out
        if isinstance(res, BaseException):
            out["error"] = repr(res)
            if "DataLost" in type(res).__name__ or "DataLost" in repr(res):
                out["reported"] = 1
            return out
        out["acked"] = sum(a for a, _ in res)
        out["failed"] = sum(f for _, f in res)
        try:
            got = ps.pull("w")
            out["lost"] = int(max(0, out["acked"] - got.min()))
            out["duplicated"] = int(max(0, got.max() - (out["acked"] + out["failed"])))
        except Exception as e:  # noqa: BLE001 - a reported loss
            out["reported"], out["error"] = 1, repr(e)
        return out
    finally:
        _in_thread(client.close, 30)
        _in_thread(c.close, 60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stop", type=float, default=8.0)
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--hung", default=None, help="ps.timeouts.hung (default: the package's)")
    ap.add_argument("--seconds", type=float, default=6.0, help="kill-during-retire: seconds of pushing")
    ap.add_argument("--stuck-after", type=float, default=180.0,
                    help="kill-during-retire: a run or placement change not done after this counts as stuck")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cfg = {} if args.hung is None else {"ps.timeouts.hung": args.hung}
    rows = {}
    with dask.config.set(cfg):
        for scenario in args.only.split(","):
            if scenario == "kill-during-retire":
                results = []
                for i in range(args.runs):
                    results.append(kill_during_retire_run(args.seconds, args.stuck_after, seed=i))
                    print(" run", i, json.dumps(results[-1]), flush=True)
                rows[scenario] = {k: sum(r[k] for r in results)
                                  for k in ("acked", "failed", "lost", "reported", "duplicated", "stuck")}
                rows[scenario].update(runs=len(results), errors=[r["error"] for r in results if r["error"]])
                print(scenario, json.dumps(rows[scenario]), flush=True)
                continue
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
