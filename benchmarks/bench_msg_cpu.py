"""What a message costs the worker processes, by CPU time (issue 36), in one
cluster of 2 worker processes, so that the machine's load is the same for
both sides of each comparison:

- ``--part inline``: ``sync_measure.py``'s message cycle (rank 0 pushes
  ``--rows`` rows of one block of its peer's server, or of its own, as
  ``--flushes`` flushes a clock, reads them, clocks; rank 1 clocks), with
  small arrays inline (``ps.wire-inline-bytes`` 64 KiB, the default)
  against every array a frame (0), interleaved ``--rounds`` times: the
  worker processes' CPU (user + system) a clock, medians.
- ``--part lda``: ``bench_lda.py --part wire``'s K=1000 cycle with the
  word rows as nonzeros (``sparse_wire=True``): the participant thread's
  CPU (``time.thread_time``) in ``push_rows`` and in ``clock()``, the
  event loops' and the worker processes' CPU, an iteration. Run it on two
  trees (``PYTHONPATH``) to compare them.

    python benchmarks/bench_msg_cpu.py --part inline --rounds 8
    python benchmarks/bench_msg_cpu.py --part lda --repeats 2

CPU seconds, not walls: the machine is shared. The load average is printed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _cpu(dask_worker=None):
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _inline_bytes(value):
    def set_it():
        import dask

        dask.config.set({"ps.wire-inline-bytes": value})
    return set_it


def part_inline(client, ps, args):
    import dask_ps
    import sync_measure

    ps.create_table("msg-cpu", (2**20, 1), dtype="float64", consistency=dask_ps.BSP())
    blocks = ps.placement("msg-cpu")
    got = {}
    try:
        for blk in (blocks[0], blocks[-1]):  # one block of each worker: rank 0's own server and its peer's
            rows = np.sort(np.random.default_rng(0).choice(np.arange(blk.start, blk.stop), args.rows,
                                                           replace=False)).astype(np.int64)
            parts = [{"rows": rows, "flushes": args.flushes} for _ in range(2)]
            ps.run(sync_measure._msg_cycle, parts, table="msg-cpu", reps=5)  # warm
            for r in range(args.rounds):
                for label, value in (("inline", "64KiB"), ("frames", 0))[:: 1 if r % 2 == 0 else -1]:
                    client.run(_inline_bytes(value))
                    c0 = sum(client.run(_cpu).values())
                    out = ps.run(sync_measure._msg_cycle, parts, table="msg-cpu", reps=args.clocks)
                    c1 = sum(client.run(_cpu).values())
                    where = "peer" if out[0].get("push", 0) else "own"
                    got.setdefault((where, label), []).append((c1 - c0) / args.clocks)
    finally:
        client.run(_inline_bytes("64KiB"))
        ps.drop_table("msg-cpu")
    print(f"\n| rank 0's rows on | arrays | worker CPU ms a clock, median (range) | n |\n| --- | --- | --- | --- |")
    for (where, label), v in sorted(got.items()):
        print(f"| {where} server | {label} | {1e3 * np.median(v):.2f} ({1e3 * min(v):.2f}-{1e3 * max(v):.2f}) "
              f"| {len(v)} |")


def _lda_cycle(ctx, rank, *, name, iters):
    import bench_lda

    rng = np.random.default_rng(rank)
    words = np.sort(rng.choice(bench_lda._WIRE_V, size=int(0.98 * bench_lda._WIRE_V), replace=False))
    delta = pos = None
    push = clock = 0.0
    for it in range(iters):
        nwk = ctx.pull_rows(name, words)
        if pos is None:
            nz = np.flatnonzero(nwk)
            pos = rng.choice(nz, size=min(100_000, nz.size), replace=False)
            delta = np.zeros(nwk.shape, np.int32)
        np.add.at(delta.reshape(-1), pos, 1 if it % 2 == 0 else -1)
        t0 = time.thread_time()
        ctx.push_rows(name, words, delta, copy=False)
        t1 = time.thread_time()
        ctx.clock()
        clock += time.thread_time() - t1
        push += t1 - t0
        delta[...] = 0
    return push, clock


def part_lda(client, ps, args):
    import bench_lda

    import dask_ps

    V, K, iters = bench_lda._WIRE_V, 1000, args.iters
    rng = np.random.default_rng(0)
    init = np.zeros((V, K), np.int32)
    hit = rng.random((V, K)) < bench_lda.WIRE_DENSITY[K]
    init[hit] = rng.integers(1, 40, int(hit.sum()))
    print("\n| run | thread CPU ms an iteration: push_rows / clock() | event loops' CPU ms | worker processes' CPU ms "
          "|\n| --- | --- | --- | --- |")
    for rep in range(args.repeats + 1):  # the first warms the kernels
        name = f"msg-cpu-lda-{rep}"
        ps.create_table(name, shape=(V, K), dtype="int32", block_rows=-(-V // 14), sparse_wire=True,
                        consistency=dask_ps.SSP(2, refresh=True), init=init)
        loops0, c0 = sum(client.run(time.thread_time).values()), sum(client.run(_cpu).values())
        out = ps.run(_lda_cycle, [0, 1], name=name, iters=iters)
        loops1, c1 = sum(client.run(time.thread_time).values()), sum(client.run(_cpu).values())
        ps.drop_table(name)
        if rep:
            push, clock = (1e3 * np.mean([o[i] for o in out]) / iters for i in (0, 1))
            print(f"| {rep} | {push:.2f} / {clock:.2f} | {1e3 * (loops1 - loops0) / iters:.1f} | "
                  f"{1e3 * (c1 - c0) / iters:.1f} |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["inline", "lda"], default="inline")
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--flushes", type=int, default=12)
    ap.add_argument("--clocks", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    from distributed import Client, LocalCluster

    import dask_ps

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.run(lambda: sys.path.insert(0, str(HERE)))
        ps = dask_ps.ParameterServer(client)
        print(f"# {args.part}: load at start {os.getloadavg()[0]:.1f}")
        (part_inline if args.part == "inline" else part_lda)(client, ps, args)
        print(f"\nload at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
