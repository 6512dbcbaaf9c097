"""What the all-or-nothing push over several servers costs (issue 34).

A push whose blocks lie on several servers of a table whose servers may
refuse it for its result (a ``sum`` table that forbids NaN/Inf, an integer
``sum`` table) goes in one message per server when every part fits the
sender's leases there, else is held at every server first and applied by a
second, small message (``Router.send``, ``Router._send_held``). This
measures it against the push it replaced (one message per server, each
server checking its part alone), in the same cluster, interleaved: the old
push is the same code with ``_transport.held_first`` patched to answer
False (client and workers), so the servers' checks are the same in both.

``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``; a
float32 table of 8 blocks over both workers; per size:

* ``client dense``: ``ps.push(name, x)`` of the whole table;
* ``client rows``: ``ps.push_rows`` of two rows, one in a block of each worker;
* ``participant dense``: a participant's ``ctx.push(name, x); ctx.flush()``.

Reported: median milliseconds per push of each over ``--rounds``
interleaved rounds of ``--reps`` pushes, and the ratio new / old.

Usage::

    python benchmarks/bench_push_phases.py                    # ~1 minute
    python benchmarks/bench_push_phases.py --sizes 4KiB 4MiB --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from dask.utils import parse_bytes
from distributed import Client, LocalCluster

import dask_ps
from dask_ps import _transport


def _set_two_phase(on: bool) -> None:
    import dask_ps._sums as sums
    _transport.held_first = sums.held_first if on else (lambda spec: False)


def _timed(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def _participant(ctx, _, name, n, reps, rounds):
    x = np.full(n, 1e-3, np.float32)
    out = {True: [], False: []}
    for _ in range(rounds):
        for on in (False, True):
            _set_two_phase(on)

            def push():
                ctx.push(name, x)
                ctx.flush()
            out[on].append(_timed(push, reps))
    _set_two_phase(True)
    ctx.clock()
    return out


def _spread_table(ps, name, n):
    """A table of 8 blocks whose blocks are on both workers; a block of each."""
    for i in range(32):
        ps.create_table(f"{name}-{i}", shape=(n,), dtype="float32", block_rows=max(1, n // 8),
                        allow_nonfinite=False)
        where = [p.worker for p in ps.placement(f"{name}-{i}")]
        if len(set(where)) == 2:
            first = {w: p.start for p, w in zip(ps.placement(f"{name}-{i}"), where)}
            return f"{name}-{i}", sorted(first.values())
        ps.drop_table(f"{name}-{i}")
    raise RuntimeError("no table over both workers")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["4KiB", "256KiB", "4MiB"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args(argv)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        print(f"{'size':>8} {'operation':<18} {'old ms':>12} {'new ms':>13} {'ratio':>6}")
        for label in a.sizes:
            n = parse_bytes(label) // 4
            name, starts = _spread_table(ps, f"phases-{label}", n)
            x = np.full(n, 1e-3, np.float32)
            rows = np.array(starts[:2])
            ops = {"client dense": lambda: ps.push(name, x),
                   "client rows": lambda: ps.push_rows(name, rows, np.ones(2, np.float32))}
            for op, fn in ops.items():
                got = {True: [], False: []}
                fn()  # warm
                for _ in range(a.rounds):
                    for on in (False, True):
                        _set_two_phase(on)
                        got[on].append(_timed(fn, a.reps))
                _set_two_phase(True)
                one, two = statistics.median(got[False]), statistics.median(got[True])
                print(f"{label:>8} {op:<18} {one:12.3f} {two:13.3f} {two / one:6.2f}", flush=True)
            (res,) = ps.run(_participant, [None], name=name, n=n, reps=a.reps, rounds=a.rounds)
            one, two = statistics.median(res[False]), statistics.median(res[True])
            print(f"{label:>8} {'participant dense':<18} {one:12.3f} {two:13.3f} {two / one:6.2f}", flush=True)
            ps.drop_table(name)


if __name__ == "__main__":
    main()
