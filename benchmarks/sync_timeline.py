"""A timeline of an SGD fit's clocks on 2 worker processes (issue 36's
simulation, what it leaves out): per participant and clock, when its one
message a server left its event loop and when the replies were in, and at
each server when the message's handler ran (``RunManager.run_clock``
entry and exit: a direct call at its own server). Times from
``time.time()`` on one machine, relative to the message's start.

    python benchmarks/sync_timeline.py --n 200000 --repeats 2

The handlers are wrapped in the workers for the fits measured (after a
warm fit), and unwrapped by the end of the run (the cluster closes).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import warnings

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import scaling_model as sm  # noqa: E402


def _instrument(dask_worker=None):
    """On a worker: record (kind, rank, clock, start, end) of every
    ``run_clock`` handled here and every clock message sent from here."""
    import time

    from dask_ps import _flights, _run_manager

    log = dask_worker._ps_timeline = []
    RM, IF = _run_manager.RunManager, _flights.InFlight
    real_rc, real_cm = RM.run_clock, IF._clock_message

    async def run_clock(self, run_id, rank, clock, *a, **k):
        t0 = time.time()
        try:
            return await real_rc(self, run_id, rank, clock, *a, **k)
        finally:
            log.append(("server", int(rank), int(clock), t0, time.time()))

    async def clock_message(self, flights, others, clock, wait_for, reads=()):
        t0 = time.time()
        try:
            return await real_cm(self, flights, others, clock, wait_for, reads)
        finally:
            log.append(("message", int(self._rank), int(clock), t0, time.time()))

    RM.run_clock, IF._clock_message = run_clock, clock_message


def _fetch(dask_worker=None):
    out = list(dask_worker._ps_timeline)
    dask_worker._ps_timeline.clear()
    return out


def report(logs):
    """Rows of the timeline, one a clock: each rank's message (start since
    the first, duration) and its handlers at the servers (own first)."""
    ev = [(w[-5:], *e) for w, lst in logs.items() for e in lst]
    if not ev:
        return ["(no clock messages: the fit sent none)"]
    t0 = min(e[4] for e in ev)
    where = {e[2]: e[0] for e in ev if e[1] == "message"}
    rows = []
    for c in sorted({e[3] for e in ev if e[1] == "message"}):
        parts = []
        for r in sorted(where):
            m = next((e for e in ev if e[1] == "message" and e[2] == r and e[3] == c), None)
            if m is None:
                continue
            srv = sorted((e for e in ev if e[1] == "server" and e[2] == r and e[3] == c),
                         key=lambda e: e[0] != where[r])
            at = " ".join(f"{e[0]} {1e3 * (e[4] - m[4]):+.1f}..{1e3 * (e[5] - m[4]):+.1f}" for e in srv)
            parts.append(f"rank {r}: sent at {1e3 * (m[4] - t0):.1f} ms, replies in {1e3 * (m[5] - m[4]):.1f} ms; "
                         f"servers (own first) {at}")
        rows.append(f"clock {c}: " + " | ".join(parts))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="click-through rows (sync_measure.py's fit)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    from bench_sgd import ctr_data
    from distributed import Client, LocalCluster

    X, y = ctr_data(args.n, sm.D_SGD)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.run(lambda: sys.path.insert(0, str(HERE)))
        sm.process_cpu = lambda c: (0.0, 0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sm.sgd_fit(client, X[:60_000], y[:60_000], 1, 2)  # warm: kernels, plugins
            client.run(_instrument)
            for rep in range(args.repeats):
                f = sm.sgd_fit(client, X, y, args.epochs, 2)
                print(f"\n## fit {rep + 1}: wall {f['wall']:.3f} s, ps_seconds "
                      f"{[round(p['ps_seconds'], 3) for p in f['participants']]}, thread CPU "
                      f"{[round(p['cpu_seconds'], 3) for p in f['participants']]}, load {os.getloadavg()[0]:.1f}\n")
                for row in report(client.run(_fetch)):
                    print("- " + row)


if __name__ == "__main__":
    main()
