"""Where a participant's narrow pull and dense push spend their time, layer by layer.

One run starts ``LocalCluster(n_workers=2, threads_per_worker=1,
processes=True)``, puts a one-block table on worker B and runs one
participant on worker A, which times, interleaved in ``--rounds`` rounds of
``--reps`` operations each (median time per operation; CPU seconds per
operation of the participant's thread, of worker A's event loop and of
worker B's, the server's, read by an RPC before and after each cell):

* a pull of ``--rows`` sorted rows of a ``--table-rows x 1`` float32 table:

  - ``pull bare``: ``worker.rpc(B).bench_rows_pull(rows=...)`` (fancy indexing
    in a bare handler, ``bench_rows.BareRows``);
  - ``pull raw ps_pull``: the message a session sends (int32 rows, the
    internal token) to the ``ps_pull`` handler, straight
    through the RPC: the server's handler and the message's format;
  - ``pull transport``: ``Transport.pull`` (liveness, the RPC deadline, the
    rows' int32 copy, the reply);
  - ``pull router.fetch``: ``Router.fetch`` (placement, failover);
  - ``pull ctx.pull_rows``: the session (row checks, split by block, read
    path, assembly);

* a dense push of ``--push-bytes`` (one block):

  - ``push bare``: ``worker.rpc(B).bench_push(data=...)`` (``store += data``,
    ``bench_kv.BareKV``);
  - ``push raw ps_push``: a session's message without the bound of its
    values, straight to ``ps_push`` (so the server measures them);
  - ``push ctx copy=False`` / ``push ctx copy``: ``ctx.push(...); ctx.flush()``,
    zero-copy and the default push (copies into the session's buffer).

The difference between two consecutive rows is what that layer adds.

Usage::

    python benchmarks/bench_layers.py                         # about a minute
    python benchmarks/bench_layers.py --push-bytes 64MiB --reps 4 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from dask.utils import parse_bytes
from distributed import Client, LocalCluster, get_worker
from distributed.protocol.serialize import to_serialize
from distributed.utils import sync

import dask_ps
from dask_ps._worker_plugin import aligned

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kv import BareKV  # noqa: E402
from bench_rows import BareRows, _own_rows, table_on  # noqa: E402


def participant(ctx, measure, *, host, pull_t, push_t, rows, n, reps, rounds):
    if not measure:
        return None
    rows = _own_rows(rows)
    w = get_worker()
    rpc = w.rpc(host)
    router = ctx._router
    transport = router.transport
    token = transport._trusted["token"]
    ctx.pull_rows(pull_t, rows)
    h = router.handles[pull_t]
    reqs = [(0, rows)]
    rows32 = rows.astype(np.int32)
    x = np.full(n, 1e-3, np.float32)
    ph = ctx._handle(push_t)

    def raw_pull():
        return sync(w.loop, rpc.ps_pull, table=pull_t, table_id=h.spec.table_id, version=h.version, blocks=[0],
                    rows=[to_serialize(rows32)], token=token)

    def raw_push():
        return sync(w.loop, rpc.ps_push, **aligned(dict(
            table=push_t, table_id=ph.spec.table_id, version=ph.version, blocks=[0], rows=[None],
            values=[to_serialize(x)], raw=False, run=None, sender=None, msg_seq=None, token=token)))

    ops = {
        "pull bare": lambda: sync(w.loop, rpc.bench_rows_pull, rows=to_serialize(rows)),
        "pull raw ps_pull": raw_pull,
        "pull transport": lambda: sync(w.loop, transport.pull, h.primary(0), h, reqs),
        "pull router.fetch": lambda: sync(w.loop, router.fetch, pull_t, reqs),
        "pull ctx.pull_rows": lambda: ctx.pull_rows(pull_t, rows),
        "push bare": lambda: sync(w.loop, rpc.bench_push, data=to_serialize(x)),
        "push raw ps_push": raw_push,
        "push ctx copy=False": lambda: (ctx.push(push_t, x, copy=False), ctx.flush()),
        "push ctx copy": lambda: (ctx.push(push_t, x), ctx.flush()),
    }
    loop_clock = time.pthread_getcpuclockid(w.loop.asyncio_loop._thread_id)
    wall = {k: [] for k in ops}
    cpu = {k: [] for k in ops}
    for f in ops.values():
        f()
        f()
    for _ in range(rounds):
        for k, f in ops.items():
            b0 = sync(w.loop, rpc.bench_rows_loop_cpu)
            c0, l0 = time.thread_time(), time.clock_gettime(loop_clock)
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            c1, l1 = time.thread_time(), time.clock_gettime(loop_clock)
            b1 = sync(w.loop, rpc.bench_rows_loop_cpu)
            cpu[k].append(((c1 - c0) / reps, (l1 - l0) / reps, (b1 - b0) / reps))
            wall[k].append(statistics.median(ts))
    return {k: (statistics.median(wall[k]), *(statistics.median(c[i] for c in cpu[k]) for i in range(3)))
            for k in ops}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table-rows", type=int, default=1_000_000)
    ap.add_argument("--rows", type=int, default=100_000, help="rows pulled (sorted, distinct)")
    ap.add_argument("--push-bytes", default="4MiB")
    ap.add_argument("--reps", type=int, default=40, help="operations per cell and round")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    n = parse_bytes(args.push_bytes) // 4
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.register_plugin(BareRows())
        client.register_plugin(BareKV())
        ps = dask_ps.ParameterServer(client)
        servers = sorted(ps.servers)
        host = servers[1]
        client.run(lambda dask_worker: dask_worker.plugins["bench-rows"].init((args.table_rows, 1)), workers=[host])
        client.sync(client.rpc(host).bench_init, shape=[n])
        pull_t = table_on(ps, "layers-pull", host, shape=(args.table_rows, 1), dtype="float32",
                          block_rows=args.table_rows, consistency=dask_ps.VAP(1e30))
        push_t = table_on(ps, "layers-push", host, shape=(n,), dtype="float32", block_rows=n,
                          consistency=dask_ps.ASP())
        rows = np.sort(np.random.default_rng(0).choice(args.table_rows, args.rows, replace=False)).astype(np.int64)
        res = ps.run(participant, [s != host for s in servers], host=host, pull_t=pull_t, push_t=push_t, rows=rows,
                     n=n, reps=args.reps, rounds=args.rounds)
        r = next(x for x in res if x is not None)
        print(f"bench_layers: pull {args.rows} of {args.table_rows} x 1, push {args.push_bytes}; "
              f"median ms per operation: wall | CPU of the participant's thread | of worker A's loop | "
              f"of worker B's loop (the server) | the three CPUs' sum")
        for key, (wl, c, lp, lb) in r.items():
            print(f"{key:>22}: {wl * 1e3:8.3f} | {c * 1e3:7.3f} | {lp * 1e3:7.3f} | {lb * 1e3:7.3f} | "
                  f"{(c + lp + lb) * 1e3:7.3f}")


if __name__ == "__main__":
    main()
