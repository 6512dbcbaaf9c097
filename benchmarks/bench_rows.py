"""Row push/pull of a participant against a bare Dask RPC handler doing the same fancy indexing.

One run starts ``LocalCluster(n_workers=2, threads_per_worker=1)`` (worker
processes by default, ``--cluster threads`` for ``processes=False``) and, for
each case ``(n_rows x width float32 table, k rows)``, measures from a
participant task on worker A:

* **dask_ps**: ``ctx.pull_rows(table, rows)`` of a ``VAP(bound=1e30)`` table
  (VAP tables are never cached by the session, so every pull reads the
  server) and ``ctx.push_rows(table, rows, values); ctx.flush()`` into an
  ``ASP()`` table;
* **bare**: ``worker.rpc(B).bench_rows_pull(rows=...)`` replying
  ``store[rows]`` and ``bench_rows_push(rows=..., values=...)`` doing
  ``np.add.at(store, rows, values)``, from the same task thread.

Every dask_ps table here is one block (``block_rows = n_rows``) hosted on
worker B, the worker holding the bare store, so both move the same bytes
over the same connection, one message per operation. ``rows`` are ``k``
distinct random rows, sorted (what a sparse minibatch's touched features
are). The ratio printed is dask_ps speed / bare speed (bare seconds /
dask_ps seconds): the issue's target is >= 0.9 for pulls and pushes.

Usage::

    python benchmarks/bench_rows.py                        # about a minute
    python benchmarks/bench_rows.py --repeat 3 --budget 1
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys

import numpy as np
from distributed import Client, LocalCluster, WorkerPlugin, get_worker
from distributed.protocol.serialize import to_serialize
from distributed.utils import sync

import dask_ps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kv import _medians, time_ops  # noqa: E402  (the same timing as bench_kv)

CASES = [(1_000_000, 1, 100_000), (4_000_000, 1, 300_000), (15_000, 50, 12_000), (1_000_000, 16, 100_000)]
TARGET = 0.9


class BareRows(WorkerPlugin):
    """The baseline: one array per worker and two handlers doing the indexing."""

    name = "bench-rows"
    idempotent = True
    OPS = ("bench_rows_init", "bench_rows_pull", "bench_rows_push")

    def setup(self, worker):
        self.store = None
        worker.handlers.update({op: getattr(self, op[len("bench_rows_"):]) for op in self.OPS})

    def teardown(self, worker):
        for op in self.OPS:
            worker.handlers.pop(op, None)

    def init(self, shape):
        self.store = np.zeros(tuple(shape), np.float32)

    def pull(self, rows):
        return to_serialize(self.store[rows])  # fancy indexing: already a copy

    def push(self, rows, values):
        np.add.at(self.store, rows, values)


def participant(ctx, measure, *, host, pull_table, push_table, rows, width, budget, min_reps, rounds):
    if not measure:
        return None  # the participant on the host worker only keeps ps.run company
    w = get_worker()
    if w.address == host:
        raise RuntimeError("the measuring participant landed on the host worker")
    rpc = w.rpc(host)
    values = np.full((len(rows), width), 1e-3, np.float32)
    pulls = {
        "dask_ps": lambda: ctx.pull_rows(pull_table, rows),
        "bare": lambda: sync(w.loop, rpc.bench_rows_pull, rows=to_serialize(rows)),
    }
    pushes = {
        "dask_ps": lambda: (ctx.push_rows(push_table, rows, values), ctx.flush()),
        "bare": lambda: sync(w.loop, rpc.bench_rows_push, rows=to_serialize(rows), values=to_serialize(values)),
    }
    return {"pull": _medians(time_ops(pulls, budget, min_reps, rounds)),
            "push": _medians(time_ops(pushes, budget, min_reps, rounds))}


def table_on(ps, base, host, **kwargs):
    """A one-block table whose block lives on ``host`` (placement hashes the name)."""
    for i in range(64):
        name = f"{base}-{i}"
        ps.create_table(name, **kwargs)
        if {p.worker for p in ps.placement(name)} == {host}:
            return name
        ps.drop_table(name)
    raise RuntimeError(f"could not place a table on {host}")


def run_case(client, ps, n_rows, width, k, args):
    servers = sorted(ps.servers)
    host = servers[1]
    client.run(lambda dask_worker: dask_worker.plugins["bench-rows"].init((n_rows, width)), workers=[host])
    common = dict(shape=(n_rows, width), dtype="float32", block_rows=n_rows)
    pull_t = table_on(ps, f"rows-pull-{n_rows}-{width}", host, consistency=dask_ps.VAP(1e30), **common)
    push_t = table_on(ps, f"rows-push-{n_rows}-{width}", host, consistency=dask_ps.ASP(), **common)
    rows = np.sort(np.random.default_rng(0).choice(n_rows, k, replace=False)).astype(np.int64)
    parts = [s != host for s in servers]  # rank r runs on servers[r % n]
    try:
        results = ps.run(participant, parts, host=host, pull_table=pull_t, push_table=push_t, rows=rows,
                         width=width, budget=args.budget, min_reps=args.min_reps, rounds=args.rounds)
    finally:
        ps.drop_table(pull_t)
        ps.drop_table(push_t)
    return next(r for r in results if r is not None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per mechanism and operation")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cluster", choices=["processes", "threads"], default="processes")
    args = ap.parse_args(argv)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.cluster == "processes",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(BareRows())
        ps = dask_ps.ParameterServer(client)
        print(f"bench_rows: participant on worker A, data on worker B ({args.cluster}); "
              f"median seconds per operation; ratio = dask_ps speed / bare speed (target >= {TARGET})")
        print(f"{'table':>14} {'rows':>8} {'MB':>6} | {'pull ps':>8} {'pull bare':>9} {'ratio':>6} | "
              f"{'push ps':>8} {'push bare':>9} {'ratio':>6}")
        for n_rows, width, k in CASES:
            reps = [run_case(client, ps, n_rows, width, k, args) for _ in range(args.repeat)]
            line = f"{n_rows:>10}x{width:<3} {k:>8} {k * width * 4 / 1e6:>6.1f}"
            for op in ("pull", "push"):
                ps_t = statistics.median(r[op]["dask_ps"] for r in reps)
                bare_t = statistics.median(r[op]["bare"] for r in reps)
                ratios = [r[op]["bare"] / r[op]["dask_ps"] for r in reps]
                rng = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(reps) > 1 else ""
                line += f" | {ps_t * 1e3:>6.2f}ms {bare_t * 1e3:>7.2f}ms {bare_t / ps_t:>6.2f}{rng}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
