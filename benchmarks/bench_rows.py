"""Row push/pull of a participant against a bare Dask RPC handler doing the same fancy indexing.

One run starts ``LocalCluster(n_workers=2, threads_per_worker=1)`` (worker
processes by default, ``--cluster threads`` for ``processes=False``) and, for
each case ``(n_rows x width float32 table, k rows)``, measures from a
participant task on worker A:

* **dask_ps**: ``ctx.pull_rows(table, rows)`` of a ``VAP(bound=1e30)`` table
  (VAP tables are never cached by the session, so every pull reads the
  server) and ``ctx.push_rows(table, rows, values, copy=False); ctx.flush()``
  into an ``ASP()`` table (the zero-copy push: the buffer takes the arrays,
  as the bare RPC sends them); **dask_ps copy** the default push, which
  copies both arrays into the session's buffer (the caller may reuse them);
* **bare**: ``worker.rpc(B).bench_rows_pull(rows=...)`` replying
  ``store[rows]`` and ``bench_rows_push(rows=..., values=...)`` doing
  ``np.add.at(store, rows, values)``, from the same task thread.

Every dask_ps table here is one block (``block_rows = n_rows``) hosted on
worker B, the worker holding the bare store, so both move the same bytes
over the same connection, one message per operation. ``rows`` are ``k``
distinct random rows, sorted (what a sparse minibatch's touched features
are). The ratio printed is dask_ps speed / bare speed (bare seconds /
dask_ps seconds): the issue's target is >= 0.9 for pulls and pushes.

``--steps`` instead times, inside a worker process (so with the allocator
settings Dask's nanny gives workers: ``MALLOC_TRIM_THRESHOLD_`` makes every
fresh array over 128 KiB a new ``mmap`` that page-faults on first use), the
numpy steps a row operation of each case may make: the validation passes,
the temporaries, the gather, the copies (docs/benchmarks.md, "Row path").

``--cpu`` instead measures the CPU seconds per operation of the three
threads involved: the participant's task thread and worker A's event loop
(the caller's side) and worker B's event loop (the server's side), for
dask_ps and the bare handler; CPU time is far less sensitive than wall
time to the other work on a shared machine.

``--profile`` instead runs each dask_ps operation ``--profile-reps`` times
under ``cProfile`` in the participant's thread and on both workers' event
loops (worker A: the participant's comm; worker B: the server's handler) and
prints the functions that took the most time on each side (where a row
operation's time goes; docs/benchmarks.md, "Row path").

Usage::

    python benchmarks/bench_rows.py                        # about a minute
    python benchmarks/bench_rows.py --repeat 3 --budget 1
    python benchmarks/bench_rows.py --profile --cases 0 1  # where the time goes
    python benchmarks/bench_rows.py --steps                # what each numpy step costs in a worker
    python benchmarks/bench_rows.py --cpu                  # CPU per operation, caller and server side
    python benchmarks/bench_rows.py --cpu --unkeyed        # ... with row lists keyed and in full, interleaved
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import logging
import pstats
import os
import statistics
import sys
import time

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
    OPS = ("bench_rows_init", "bench_rows_pull", "bench_rows_push", "bench_rows_loop_cpu")

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

    def loop_cpu(self):
        """CPU seconds of this worker's event loop thread (handlers run there)."""
        return time.thread_time()


def _own_rows(rows):
    """The rows as a participant's own array: a copy. The task's message
    hands ``rows`` over at whatever offset its header left (an unaligned
    int64 array: the row checks take 61 us instead of 30 at 100k rows), where
    rows a participant computes are aligned; the bare RPC gets the same copy."""
    return rows.copy()


def participant(ctx, measure, *, host, pull_table, push_table, rows, width, budget, min_reps, rounds):
    if not measure:
        return None  # the participant on the host worker only keeps ps.run company
    rows = _own_rows(rows)
    w = get_worker()
    if w.address == host:
        raise RuntimeError("the measuring participant landed on the host worker")
    rpc = w.rpc(host)
    values = np.full((len(rows), width), 1e-3, np.float32)
    pulls = {
        "dask_ps": lambda: ctx.pull_rows(pull_table, rows),
        "bare": lambda: sync(w.loop, rpc.bench_rows_pull, rows=to_serialize(rows)),
    }
    # copy=False where this dask_ps has it (the comparison with older commits runs the same script)
    zero_copy = {"copy": False} if "copy" in inspect.signature(ctx.push_rows).parameters else {}
    pushes = {
        "dask_ps": lambda: (ctx.push_rows(push_table, rows, values, **zero_copy), ctx.flush()),
        "dask_ps_copy": lambda: (ctx.push_rows(push_table, rows, values), ctx.flush()),
        "bare": lambda: sync(w.loop, rpc.bench_rows_push, rows=to_serialize(rows), values=to_serialize(values)),
    }
    return {"pull": _medians(time_ops(pulls, budget, min_reps, rounds)),
            "push": _medians(time_ops(pushes, budget, min_reps, rounds))}


def _profile_text(prof: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    # Keep the table: drop pstats' preamble and blank lines.
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:])


def _loop_profile_start(dask_worker):
    """On the worker's event loop thread (``client.run``): profile that thread."""
    prof = dask_worker._bench_rows_profile = cProfile.Profile()
    prof.enable()


def _loop_profile_stop(dask_worker, top):
    prof = dask_worker._bench_rows_profile
    prof.disable()
    del dask_worker._bench_rows_profile
    return _profile_text(prof, top)


def participant_profile(ctx, measure, *, pull_table, push_table, rows, width, reps, top, op):
    """One dask_ps operation ``reps`` times under cProfile in this thread."""
    if not measure:
        return None
    rows = _own_rows(rows)
    values = np.full((len(rows), width), 1e-3, np.float32)
    if op == "pull":
        def f():
            ctx.pull_rows(pull_table, rows)
    else:
        def f():
            ctx.push_rows(push_table, rows, values)
            ctx.flush()
    for _ in range(3):
        f()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(reps):
        f()
    prof.disable()
    return (time.perf_counter() - t0) / reps, _profile_text(prof, top)


def row_steps(n_rows, width, k, reps=30):
    """Task: median milliseconds of each numpy step of a ``k``-row operation
    on an ``(n_rows, width)`` float32 block, in this (worker) process."""
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(n_rows, k, replace=False)).astype(np.int64)
    data = rng.random((n_rows, width)).astype(np.float32)
    values = np.full((k, width), 1e-3, np.float32)
    gathered = data[rows]
    chunk = 1 << 16

    def chunked_sorted_check():
        return all(bool((rows[lo + 1:min(lo + chunk, k - 1) + 1] > rows[lo:min(lo + chunk, k - 1)]).all())
                   for lo in range(0, k - 1, chunk))

    steps = {
        "sorted check, one temporary (rows[1:] > rows[:-1])": lambda: bool(np.all(rows[1:] > rows[:-1])),
        "sorted check, by chunks of 64k": chunked_sorted_check,
        "min + max (range check)": lambda: (int(rows.min()), int(rows.max())),
        "np.unique(return_inverse=True)": lambda: np.unique(rows, return_inverse=True),
        "rows // block_rows (a row-sized temporary)": lambda: rows // n_rows,
        "rows - start, int64": lambda: rows - 1,
        "rows - start, int32": lambda: np.subtract(rows, 1, dtype=np.int32, casting="unsafe"),
        "gather data[rows]": lambda: data[rows],
        "gather np.take(data, rows, axis=0)": lambda: np.take(data, rows, axis=0),
        "copy of the gathered rows": lambda: gathered.copy(),
        "copy of rows + values (push buffer)": lambda: (rows.copy(), values.copy()),
        "NaN/Inf check of the values (sum)": lambda: np.isfinite(values.sum()),
        "scatter-add data[rows] += values": lambda: data.__setitem__(rows, data[rows] + values),
        "np.add.at(data, rows, values)": lambda: np.add.at(data, rows, values),
    }
    out = {}
    for name, f in steps.items():
        f()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts) * 1e3
    return out


def _loop_cpu(dask_worker):
    """CPU seconds of the worker's event loop thread (``client.run`` runs there)."""
    return time.thread_time()


def participant_cpu(ctx, measure, *, host, pull_table, push_table, rows, width, reps, which, fresh=0):
    """CPU seconds per operation of this thread and of this worker's loop.
    ``fresh``: the number of rows of the table; every operation then has
    rows of its own (``k`` other random rows: no row list is sent twice)."""
    if not measure:
        return None
    rows = _own_rows(rows)
    if fresh:
        rng = np.random.default_rng(1)
        lists = iter([np.sort(rng.choice(fresh, rows.size, replace=False)) for _ in range(reps + 3)])
    w = get_worker()
    rpc = w.rpc(host)
    values = np.full((len(rows), width), 1e-3, np.float32)
    zero_copy = {"copy": False} if "copy" in inspect.signature(ctx.push_rows).parameters else {}
    f = {
        ("pull", "dask_ps"): lambda r: ctx.pull_rows(pull_table, r),
        ("pull", "bare"): lambda r: sync(w.loop, rpc.bench_rows_pull, rows=to_serialize(r)),
        ("push", "dask_ps"): lambda r: (ctx.push_rows(push_table, r, values, **zero_copy), ctx.flush()),
        ("push", "bare"): lambda r: sync(w.loop, rpc.bench_rows_push, rows=to_serialize(r),
                                         values=to_serialize(values)),
    }[which]
    if fresh:
        f = (lambda g: lambda: g(next(lists)))(f)
    else:
        f = (lambda g: lambda: g(rows))(f)
    for _ in range(3):
        f()
    loop_clock = time.pthread_getcpuclockid(w.loop.asyncio_loop._thread_id)
    c0, l0 = time.thread_time(), time.clock_gettime(loop_clock)
    for _ in range(reps):
        f()
    return (time.thread_time() - c0) / reps, (time.clock_gettime(loop_clock) - l0) / reps


def cpu_case(client, ps, parts, host, pull_t, push_t, rows, width, args, reps=30, rounds=3, rows_of=0):
    """``{(op, mechanism): (thread, loop A, loop B)}``: median CPU ms per operation."""
    out = {}
    mechs = ["dask_ps", "bare"] + (["unkeyed"] if args.unkeyed else [])
    for _ in range(args.cpu_rounds or rounds):
        for which in [(op, m) for op in ("pull", "push") for m in mechs]:
            if which[1] == "unkeyed":  # row lists in full in every message (ps.row-lists.keyed off)
                client.run(_set_keyed, False)
            b0 = client.run(_loop_cpu, workers=[host])[host]
            try:
                res = ps.run(participant_cpu, parts, host=host, pull_table=pull_t, push_table=push_t, rows=rows,
                             width=width, reps=reps, which=(which[0], "dask_ps" if which[1] == "unkeyed" else which[1]),
                             **({"fresh": rows_of} if args.fresh else {}))
            finally:
                if which[1] == "unkeyed":
                    client.run(_set_keyed, True)
            b1 = client.run(_loop_cpu, workers=[host])[host]
            thread, loop_a = next(r for r in res if r is not None)
            out.setdefault(which, []).append((thread * 1e3, loop_a * 1e3, (b1 - b0) / (reps + 3) * 1e3))
    med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in out.items()}
    if args.unkeyed:  # rounds run back to back: their ratio is less sensitive to the load's drift
        for op in ("pull", "push"):
            ratios = [sum(a) / sum(b) for a, b in zip(out[(op, "dask_ps")], out[(op, "unkeyed")])]
            med[(op, "ratio")] = (statistics.median(ratios), min(ratios), max(ratios))
    return med


def _set_keyed(keyed):
    import dask

    dask.config.set({"ps.row-lists.keyed": keyed})


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
        if args.profile:
            return profile_case(client, ps, parts, host, pull_t, push_t, rows, width, args)
        if args.cpu:
            return cpu_case(client, ps, parts, host, pull_t, push_t, rows, width, args, rows_of=n_rows)
        results = ps.run(participant, parts, host=host, pull_table=pull_t, push_table=push_t, rows=rows,
                         width=width, budget=args.budget, min_reps=args.min_reps, rounds=args.rounds)
    finally:
        ps.drop_table(pull_t)
        ps.drop_table(push_t)
    return next(r for r in results if r is not None)


def profile_case(client, ps, parts, host, pull_t, push_t, rows, width, args):
    """``{op: text}``: the participant's thread and both event loops profiled."""
    out = {}
    for op in ("pull", "push"):
        client.run(_loop_profile_start)
        try:
            results = ps.run(participant_profile, parts, pull_table=pull_t, push_table=push_t, rows=rows,
                             width=width, reps=args.profile_reps, top=args.profile_top, op=op)
        finally:
            loops = client.run(_loop_profile_stop, top=args.profile_top)
        seconds, text = next(r for r in results if r is not None)
        parts_text = [f"--- participant thread (worker A) ---\n{text}"]
        for addr, t in sorted(loops.items(), key=lambda kv: kv[0] == host):
            side = "worker B: the server's handlers" if addr == host else "worker A: the participant's comm"
            parts_text.append(f"--- event loop of {side} ---\n{t}")
        out[op] = (seconds, "\n".join(parts_text))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per mechanism and operation")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cluster", choices=["processes", "threads"], default="processes")
    ap.add_argument("--cases", type=int, nargs="+", default=list(range(len(CASES))),
                    help=f"indices into {CASES} (default: all)")
    ap.add_argument("--profile", action="store_true", help="cProfile the dask_ps operations instead")
    ap.add_argument("--steps", action="store_true", help="time the numpy steps of a row operation in a worker")
    ap.add_argument("--cpu", action="store_true", help="CPU per operation of the caller's and the server's threads")
    ap.add_argument("--fresh", action="store_true",
                    help="--cpu: other rows at every operation (no row list sent twice; the cost of naming lists)")
    ap.add_argument("--unkeyed", action="store_true",
                    help="--cpu: also dask_ps with ps.row-lists.keyed off (every list in full), interleaved")
    ap.add_argument("--cpu-rounds", type=int, default=0, help="--cpu: rounds of every mechanism (default 3)")
    ap.add_argument("--profile-reps", type=int, default=40)
    ap.add_argument("--profile-top", type=int, default=15, help="functions shown per side")
    args = ap.parse_args(argv)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.cluster == "processes",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(BareRows())
        ps = dask_ps.ParameterServer(client)
        cases = [CASES[i] for i in args.cases]
        if args.steps:
            worker = sorted(ps.servers)[0]
            results = [client.submit(row_steps, *case, workers=[worker], pure=False).result() for case in cases]
            print(f"bench_rows --steps: median ms per step in a worker process ({args.cluster}); "
                  f"columns: {', '.join(f'{n}x{w} {k} rows' for n, w, k in cases)}")
            for name in results[0]:
                print(f"{name:>52} | " + " | ".join(f"{r[name]:8.3f}" for r in results))
            return
        if args.cpu:
            print(f"bench_rows --cpu: median CPU ms per operation ({args.cluster}; in-process workers share "
                  "one event loop): participant thread | worker A's loop | worker B's loop (the server) | sum"
                  + ("; other rows at every operation" if args.fresh else "; the same rows at every operation"))
            for n_rows, width, k in cases:
                for (op, mech), (thr, la, lb) in sorted(run_case(client, ps, n_rows, width, k, args).items()):
                    if mech == "ratio":  # keyed / unkeyed CPU sum, per round: median (min-max)
                        print(f"{n_rows:>10}x{width:<3} {k:>7} {op:>5} keyed/unkeyed CPU, per round: "
                              f"{thr:.2f} ({la:.2f}-{lb:.2f})", flush=True)
                        continue
                    print(f"{n_rows:>10}x{width:<3} {k:>7} {op:>5} {mech:>8} | {thr:7.3f} | {la:7.3f} | {lb:7.3f}"
                          f" | {thr + la + lb:7.3f}", flush=True)
            return
        if args.profile:
            for n_rows, width, k in cases:
                for op, (seconds, text) in run_case(client, ps, n_rows, width, k, args).items():
                    print(f"=== {op}_rows {n_rows}x{width}, {k} rows: {seconds * 1e3:.2f} ms per operation "
                          f"under cProfile ({args.profile_reps} operations, {args.cluster}) ===")
                    print(text, flush=True)
            return
        print(f"bench_rows: participant on worker A, data on worker B ({args.cluster}); "
              f"median seconds per operation; ratio = dask_ps speed / bare speed (target >= {TARGET}); "
              "push: copy=False, push copy: the default push (copies into the buffer)")
        print(f"{'table':>14} {'rows':>8} {'MB':>6} | {'pull ps':>8} {'pull bare':>9} {'ratio':>6} | "
              f"{'push ps':>8} {'push bare':>9} {'ratio':>6} | {'push copy':>9} {'ratio':>6}")
        for n_rows, width, k in cases:
            reps = [run_case(client, ps, n_rows, width, k, args) for _ in range(args.repeat)]
            line = f"{n_rows:>10}x{width:<3} {k:>8} {k * width * 4 / 1e6:>6.1f}"
            for op, mech in (("pull", "dask_ps"), ("push", "dask_ps"), ("push", "dask_ps_copy")):
                ps_t = statistics.median(r[op][mech] for r in reps)
                bare_t = statistics.median(r[op]["bare"] for r in reps)
                ratios = [r[op]["bare"] / r[op][mech] for r in reps]
                rng = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(reps) > 1 else ""
                bare = "" if mech == "dask_ps_copy" else f" {bare_t * 1e3:>7.2f}ms"
                line += f" | {ps_t * 1e3:>6.2f}ms{bare} {bare_t / ps_t:>6.2f}{rng}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
