"""Key-value push/pull throughput: dask_ps against a bare Dask RPC handler and a Dask Actor.

One run starts ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``
and measures, on the same arrays and in the same run:

* dense push and pull of a float32 array of each size (default 4 KiB, 256 KiB,
  4 MiB, 64 MiB), from two places:

  - **client**: the client process calls ``ps.push`` / ``ps.pull``; the bare
    RPC baseline is ``client.rpc(B).bench_push(data=...)``; the Actor is
    called from the client;
  - **participant**: a task on worker A (a participant of ``ps.run``) calls
    ``ctx.push(name, x, copy=False); ctx.flush()`` (the zero-copy push; a
    second row shows the default push, which copies ``x`` into the session's
    buffer) and ``ctx.pull(name)``; the baselines are
    ``worker.rpc(B).bench_*`` and Actor calls made from the same task
    thread.

  Every dask_ps table here is one block (``block_rows = n_rows``) hosted on
  worker B, the worker that holds the bare store and the Actor, and the
  participant runs on the *other* worker A: every mechanism moves the same
  bytes over the same TCP connection, one message per operation. (A
  participant on B itself would use dask_ps's same-process shortcut, which no
  baseline has.) For sizes above ``ps.block-bytes`` the client also measures a
  table with the default blocking (several blocks over both workers).

  Participant pulls read a table with ``VAP(bound=1e30)`` consistency: VAP
  tables are never cached by the session, so every ``ctx.pull`` reads the
  server (under BSP/SSP/ASP a repeated pull is a cache hit and costs no
  network). Participant pushes use an ``ASP()`` table (pushes do not depend on
  the model, except that VAP adds a pass over the buffer on every push).

* an iteration of a participant (``iteration`` rows): a default (copying)
  push, ~2 ms of numpy compute, then ``ctx.clock(wait=False)`` (the push is
  sent while the next iteration computes) or ``ctx.clock()``; the baselines
  send with a bare RPC (or the Actor), then compute. Not a target: it shows
  what overlapping the send with compute is worth.

* row operations: ``--rows`` single-row pushes of a ``(rows, width)`` table.
  dask_ps batches them in the participant (``ctx.push_rows(name, [i], row)``
  each, then one ``ctx.flush()``); the baseline sends one bare RPC per row
  (``store[i] += row`` on B), from the same task thread.

Each cell is timed for ``--budget`` seconds (at least ``--min-reps``
operations), interleaved with the other mechanisms in ``--rounds`` rounds so
that drift on a shared machine hits all of them alike; the table reports
the median time per operation as MB/s (10^6 bytes/s) and operations/s.
``--repeat k`` runs the whole sweep k times in the same cluster and reports
the median over repeats with the range of every ratio, which is what to use
on a machine shared with other work.

``--no-malloc-trim`` starts the workers without the
``MALLOC_TRIM_THRESHOLD_=65536`` that Dask's nanny sets by default; with it
every fresh multi-MiB allocation in a worker pays page faults, which hurts
whichever mechanism allocates more.

Usage::

    python benchmarks/bench_kv.py                       # one sweep, ~1.5-2 minutes
    python benchmarks/bench_kv.py --repeat 3 --budget 0.6
    python benchmarks/bench_kv.py --sizes 4KiB 4MiB --budget 0.5 --skip-rows
"""

from __future__ import annotations

import argparse
import inspect
import logging
import math
import platform
import statistics
import sys
import time

import dask
import numpy as np
from dask.utils import format_bytes, parse_bytes
from distributed import Client, LocalCluster, WorkerPlugin, get_worker
from distributed.actor import Actor
from distributed.protocol.serialize import to_serialize
from distributed.utils import sync

import dask_ps

logger = logging.getLogger("bench_kv")

DEFAULT_SIZES = ["4KiB", "256KiB", "4MiB", "64MiB"]

# Targets from the issue.
TARGET_VS_BARE = 0.9  # dask_ps / bare RPC, at sizes >= 4 MiB
TARGET_VS_BARE_MIN_BYTES = 4 * 2**20
TARGET_VS_ACTOR = 1.5  # dask_ps / Actor, every size
TARGET_ROWS = 20.0  # batched rows / one RPC per row


# --- baselines ---------------------------------------------------------------------------
class BareKV(WorkerPlugin):
    """The hand-written baseline: one array per worker, ``store += data`` in a handler."""

    name = "bench-kv"
    idempotent = True
    OPS = ("bench_init", "bench_push", "bench_pull", "bench_push_row")

    def setup(self, worker):
        self.store = None
        worker.handlers.update({op: getattr(self, op[6:]) for op in self.OPS})

    def teardown(self, worker):
        for op in self.OPS:
            worker.handlers.pop(op, None)

    def init(self, shape):
        self.store = np.zeros(tuple(shape), np.float32)

    def push(self, data):
        self.store += data

    def pull(self):
        # A copy: replying with the live array risks torn reads under
        # concurrent pushes (DASK_NOTES pitfall 3).
        return to_serialize(self.store.copy())

    def push_row(self, row, data):
        self.store[row] += data


class ArrayActor:
    """The Actor baseline: the array lives in an Actor on worker B."""

    def __init__(self, n):
        self.store = np.zeros(n, np.float32)

    def push(self, data):
        self.store += data

    def pull(self):
        return self.store.copy()


# --- timing --------------------------------------------------------------------------------
def time_ops(ops: dict, budget: float, min_reps: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each op: one warm-up call, then ``rounds`` rounds in
    which every op runs for ``budget / rounds`` seconds (and at least
    ``ceil(min_reps / rounds)`` times)."""
    for f in ops.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in ops}
    per_round = budget / rounds
    reps = math.ceil(min_reps / rounds)
    for _ in range(rounds):
        for k, f in ops.items():
            end = time.perf_counter() + per_round
            n = 0
            while n < reps or time.perf_counter() < end:
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
                n += 1
    return times


def _medians(times):
    return {k: statistics.median(v) for k, v in times.items()}


# --- participant side (runs in a task on worker A) -----------------------------------------
def participant_kv(ctx, measure, *, host, push_table, pull_table, n, actor, budget, min_reps, rounds):
    """A ``ps.run`` participant: dask_ps, bare RPC and Actor, from one task thread."""
    if not measure:
        return None  # the participant on the host worker only keeps ps.run company
    w = get_worker()
    if w.address == host:
        raise RuntimeError("the measuring participant landed on the host worker")
    x = np.full(n, 1e-3, np.float32)
    rpc = w.rpc(host)
    act = Actor(ArrayActor, *actor)
    # copy=False (the zero-copy push) where this dask_ps has it; the default push copies into the buffer
    zero_copy = {"copy": False} if "copy" in inspect.signature(ctx.push).parameters else {}
    pushes = {
        "dask_ps": lambda: (ctx.push(push_table, x, **zero_copy), ctx.flush()),
        "dask_ps_copy": lambda: (ctx.push(push_table, x), ctx.flush()),
        "bare": lambda: sync(w.loop, rpc.bench_push, data=to_serialize(x)),
        "actor": lambda: act.push(x).result(),
    }
    # An iteration: push (default copy), ~2 ms of compute, then the clock. With
    # clock(wait=False) a buffered push is sent while the next iteration computes.
    work_in = np.random.default_rng(0).random(1 << 16)
    work_out = np.empty_like(work_in)
    t0 = time.perf_counter()
    for _ in range(20):
        np.sin(work_in, out=work_out)
    reps = max(1, round(2e-3 / ((time.perf_counter() - t0) / 20)))

    def work():
        for _ in range(reps):
            np.sin(work_in, out=work_out)

    iterations = {
        "dask_ps": lambda: (ctx.push(push_table, x), work(), ctx.clock(wait=False)),
        "dask_ps_blocking": lambda: (ctx.push(push_table, x), work(), ctx.clock()),
        "bare": lambda: (sync(w.loop, rpc.bench_push, data=to_serialize(x)), work()),
        "actor": lambda: (act.push(x).result(), work()),
        "work": work,
    }
    pulls = {
        "dask_ps": lambda: ctx.pull(pull_table),
        "bare": lambda: sync(w.loop, rpc.bench_pull),
        "actor": lambda: act.pull().result(),
    }
    return {
        "push": _medians(time_ops(pushes, budget, min_reps, rounds)),
        "pull": _medians(time_ops(pulls, budget, min_reps, rounds)),
        "iteration": _medians(time_ops(iterations, budget, min_reps, rounds)),
        "zero_copy": bool(zero_copy),
    }


def participant_rows(ctx, measure, *, host, table, n_rows, width, budget, min_reps):
    """A ``ps.run`` participant: ``n_rows`` single-row pushes, batched by
    dask_ps vs one bare RPC each (the latter timed over ``budget`` seconds)."""
    if not measure:
        return None
    w = get_worker()
    if w.address == host:
        raise RuntimeError("the measuring participant landed on the host worker")
    row = np.full((1, width), 1e-3, np.float32)
    rpc = w.rpc(host)

    def batched():
        for i in range(n_rows):
            ctx.push_rows(table, [i], row)
        ctx.flush()

    batched()  # warm-up
    t_batched = []
    end = time.perf_counter() + budget
    while len(t_batched) < min_reps or time.perf_counter() < end:
        t0 = time.perf_counter()
        batched()
        t_batched.append(time.perf_counter() - t0)

    flat = row[0]
    sync(w.loop, rpc.bench_push_row, row=0, data=to_serialize(flat))  # warm-up
    count = 0
    t0 = time.perf_counter()
    end = t0 + budget
    while count < n_rows and (count < 100 or time.perf_counter() < end):
        sync(w.loop, rpc.bench_push_row, row=count, data=to_serialize(flat))
        count += 1
    t_single = time.perf_counter() - t0
    return {
        "batched_rows_per_s": n_rows / statistics.median(t_batched),
        "single_rows_per_s": count / t_single,
        "single_count": count,
    }


# --- driver (client process) -----------------------------------------------------------------
class Bench:
    def __init__(self, client: Client, ps: dask_ps.ParameterServer, args):
        self.client = client
        self.ps = ps
        self.args = args
        self.servers = sorted(ps.servers)
        # (size, caller, op, note) -> {"nbytes", "t": [one {mechanism: seconds} per repeat]}
        self.rows: dict[tuple, dict] = {}
        self.row_results: list[dict] = []  # one per repeat

    def _table_on(self, base: str, host: str | None, **kwargs) -> tuple[str, str]:
        """Create a one-block table whose block lives on ``host`` (any worker if
        None). Placement is a hash of the name, so try a few names."""
        for i in range(64):
            name = f"{base}-{i}"
            self.ps.create_table(name, **kwargs)
            where = {p.worker for p in self.ps.placement(name)}
            if host is None or where == {host}:
                return name, next(iter(where))
            self.ps.drop_table(name)
        raise RuntimeError(f"could not place a table on {host}")

    def _parts(self, host: str) -> list[bool]:
        # ps.run puts participant ``rank`` on ``servers[rank % n]``; measure on
        # the rank placed on the worker that does not host the data.
        parts = [s != host for s in self.servers]
        if sum(parts) != 1:
            raise RuntimeError(f"need exactly two workers, have {self.servers}")
        return parts

    def size(self, label: str, nbytes: int) -> None:
        a, c = self.args, self.client
        n = nbytes // 4
        x = np.full(n, 1e-3, np.float32)
        push_t, host = self._table_on(
            f"bench-push-{label}", None, shape=(n,), dtype="float32", block_rows=n,
            consistency=dask_ps.ASP(),
        )
        pull_t, _ = self._table_on(
            f"bench-pull-{label}", host, shape=(n,), dtype="float32", block_rows=n,
            consistency=dask_ps.VAP(bound=1e30),
        )
        self.ps.push(pull_t, x)
        c.sync(c.rpc(host).bench_init, shape=[n])
        actor_fut = c.submit(ArrayActor, n, actor=True, workers=[host], pure=False)
        actor = actor_fut.result()
        rpc = c.rpc(host)
        logger.info("%s: tables %s, %s on %s", label, push_t, pull_t, host)

        # Client side.
        pushes = {
            "dask_ps": lambda: self.ps.push(push_t, x),
            "bare": lambda: c.sync(rpc.bench_push, data=to_serialize(x)),
            "actor": lambda: actor.push(x).result(),
        }
        pulls = {
            "dask_ps": lambda: self.ps.pull(push_t),
            "bare": lambda: c.sync(rpc.bench_pull),
            "actor": lambda: actor.pull().result(),
        }
        blocked = None
        default_blocks = dask_ps.TableSpec.create("probe", (n,), "float32").n_blocks
        if default_blocks > 1:
            blocked, _ = self._table_on(f"bench-blocks-{label}", None, shape=(n,), dtype="float32",
                                        consistency=dask_ps.ASP())
            pushes["dask_ps_blocks"] = lambda: self.ps.push(blocked, x)
            pulls["dask_ps_blocks"] = lambda: self.ps.pull(blocked)
        t_push = _medians(time_ops(pushes, a.budget, a.min_reps, a.rounds))
        t_pull = _medians(time_ops(pulls, a.budget, a.min_reps, a.rounds))
        self._add(label, nbytes, "client", "push", t_push)
        self._add(label, nbytes, "client", "pull", t_pull)
        if blocked is not None:
            where = {p.worker for p in self.ps.placement(blocked)}
            note = f"default blocking: {default_blocks} blocks on {len(where)} workers"
            for op, t in (("push", t_push), ("pull", t_pull)):
                self._add(label, nbytes, "client", op, {"dask_ps": t["dask_ps_blocks"], "bare": t["bare"],
                                                        "actor": t["actor"]}, note=note)
        logger.info("%s: client side done", label)

        # Participant side (task on the other worker).
        res = self.ps.run(
            participant_kv, self._parts(host), host=host, push_table=push_t, pull_table=pull_t, n=n,
            actor=(actor._address, actor.key), budget=a.budget, min_reps=a.min_reps, rounds=a.rounds,
        )
        (res,) = [r for r in res if r is not None]
        self._add(label, nbytes, "participant", "push", res["push"], note="copy=False" if res["zero_copy"] else "")
        if res["zero_copy"]:
            self._add(label, nbytes, "participant", "push", {**res["push"], "dask_ps": res["push"]["dask_ps_copy"]},
                      note="default push: copies into the buffer")
        self._add(label, nbytes, "participant", "pull", res["pull"], note="VAP table: uncached reads")
        it = res["iteration"]
        logger.info("%s: the iteration's compute took %.2f ms", label, it["work"] * 1e3)
        self._add(label, nbytes, "participant", "iteration", it,
                  note="push (default copy), ~2 ms compute, clock(wait=False); baselines: send, compute")
        self._add(label, nbytes, "participant", "iteration", {**it, "dask_ps": it["dask_ps_blocking"]},
                  note="push (default copy), ~2 ms compute, clock()")
        logger.info("%s: participant side done", label)

        for t in (push_t, pull_t, blocked):
            if t is not None:
                self.ps.drop_table(t)
        actor_fut.release()  # frees the Actor on its worker
        c.sync(rpc.bench_init, shape=[0])

    def _add(self, label, nbytes, where, op, t, note=""):
        r = self.rows.setdefault((label, where, op, note), {"nbytes": nbytes, "t": []})
        r["t"].append(t)

    def row_ops(self) -> None:
        a = self.args
        table, host = self._table_on(
            "bench-rows", None, shape=(a.rows, a.width), dtype="float32", block_rows=a.rows,
            consistency=dask_ps.ASP(),
        )
        self.client.sync(self.client.rpc(host).bench_init, shape=[a.rows, a.width])
        res = self.ps.run(
            participant_rows, self._parts(host), host=host, table=table, n_rows=a.rows,
            width=a.width, budget=a.budget, min_reps=a.min_reps,
        )
        (result,) = [r for r in res if r is not None]
        self.row_results.append(result)
        self.ps.drop_table(table)
        self.client.sync(self.client.rpc(host).bench_init, shape=[0])

    # --- report ---------------------------------------------------------------------
    def report(self) -> str:
        """Markdown tables. With several repeats, a cell is the median over
        repeats and a ratio shows its median and [min-max] over repeats."""
        a = self.args
        med = statistics.median

        def cell(t, nbytes):
            return f"{nbytes / t / 1e6:,.1f} ({1 / t:,.0f}/s)"

        def ratio(values):
            m = med(values)
            return m, (f"{m:.2f}" if len(values) == 1 else f"{m:.2f} [{min(values):.2f}-{max(values):.2f}]")

        lines = [
            (
                "| size | caller | op | dask_ps MB/s (ops/s) | bare RPC MB/s (ops/s) | Actor MB/s (ops/s) "
                "| dask_ps / bare | dask_ps / Actor | note |"
            ),
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        misses = []
        for (size, where, op, note), r in self.rows.items():
            ts, nb = r["t"], r["nbytes"]
            t = {k: med(x[k] for x in ts) for k in ("dask_ps", "bare", "actor")}
            vs_bare, txt_b = ratio([x["bare"] / x["dask_ps"] for x in ts])
            vs_actor, txt_a = ratio([x["actor"] / x["dask_ps"] for x in ts])
            if op != "iteration" and nb >= TARGET_VS_BARE_MIN_BYTES and vs_bare < TARGET_VS_BARE:
                txt_b += " ✗"
                misses.append(f"{size} {where} {op}{' (' + note + ')' if note else ''}: "
                              f"dask_ps/bare {vs_bare:.2f} < {TARGET_VS_BARE}")
            if op != "iteration" and vs_actor < TARGET_VS_ACTOR:
                txt_a += " ✗"
                misses.append(f"{size} {where} {op}{' (' + note + ')' if note else ''}: "
                              f"dask_ps/Actor {vs_actor:.2f} < {TARGET_VS_ACTOR}")
            lines.append(
                f"| {size} | {where} | {op} | {cell(t['dask_ps'], nb)} | {cell(t['bare'], nb)} "
                f"| {cell(t['actor'], nb)} | {txt_b} | {txt_a} | {note} |"
            )
        reps = f", median of {a.repeat} repeats" if a.repeat > 1 else ""
        out = [f"## Dense push/pull (float32, median time per operation{reps})", "", *lines, ""]
        if self.row_results:
            rr = self.row_results
            batched = med(x["batched_rows_per_s"] for x in rr)
            single = med(x["single_rows_per_s"] for x in rr)
            r_med, txt = ratio([x["batched_rows_per_s"] / x["single_rows_per_s"] for x in rr])
            if r_med < TARGET_ROWS:
                txt += " ✗"
                misses.append(f"rows: batched/one-RPC-per-row {r_med:.1f} < {TARGET_ROWS}")
            calls = sum(x["single_count"] for x in rr)
            out += [
                (
                    f"## Row pushes ({a.rows:,} single-row pushes of {a.width} float32 = "
                    f"{format_bytes(4 * a.width)} per row, participant on the other worker{reps})"
                ),
                "",
                "| mechanism | rows/s | ratio |",
                "| --- | --- | --- |",
                f"| dask_ps: {a.rows:,} x ctx.push_rows + 1 flush | {batched:,.0f} | {txt} |",
                f"| bare RPC, one call per row ({calls:,} calls timed) | {single:,.0f} | 1 |",
                "",
            ]
        out += [
            "## Targets",
            "",
            f"- dask_ps / bare RPC >= {TARGET_VS_BARE} at sizes >= {format_bytes(TARGET_VS_BARE_MIN_BYTES)}",
            f"- dask_ps / Actor >= {TARGET_VS_ACTOR} at every size",
            f"- batched rows / one RPC per row >= {TARGET_ROWS}",
            "",
            ("Missed (✗, judged on the median):\n" + "\n".join(f"- {m}" for m in misses))
            if misses else "All targets met.",
            "",
        ]
        return "\n".join(out)


def _dask_ps_source() -> str:
    """Where dask_ps was imported from, with its commit (``+dirty`` when the
    package has uncommitted changes), for the record."""
    import os
    import subprocess

    pkg = os.path.dirname(os.path.abspath(dask_ps.__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pkg, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=pkg,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return pkg
    return f"{pkg} at {rev}{'+dirty' if dirty else ''}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="array sizes (dask byte strings)")
    p.add_argument("--budget", type=float, default=1.5, help="seconds per cell (default 1.5)")
    p.add_argument("--min-reps", type=int, default=3, help="minimum operations per cell (default 3)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per cell (default 5)")
    p.add_argument("--rows", type=int, default=10_000, help="single-row pushes (default 10,000)")
    p.add_argument("--width", type=int, default=64, help="float32 values per row (default 64)")
    p.add_argument("--repeat", type=int, default=1,
                   help="repeat the whole sweep in the same cluster; report medians and ratio ranges (default 1)")
    p.add_argument("--skip-rows", action="store_true", help="skip the row-push benchmark")
    p.add_argument(
        "--no-malloc-trim", action="store_true",
        help="start workers without the MALLOC_TRIM_THRESHOLD_=65536 that Dask's nanny sets by default "
        "(with it, every fresh multi-MiB allocation in a worker page-faults)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress log on stderr")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logger.setLevel(logging.WARNING if args.quiet else logging.INFO)
    sizes = [(label, parse_bytes(label)) for label in args.sizes]
    for label, nbytes in sizes:
        if nbytes % 4 or nbytes <= 0:
            p.error(f"size {label} is not a positive multiple of 4 bytes")
    if args.repeat < 1 or args.rounds < 1 or args.budget <= 0:
        p.error("--repeat and --rounds must be >= 1 and --budget > 0")
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    if args.no_malloc_trim:
        environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    t0 = time.perf_counter()
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}), LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        client.register_plugin(BareKV())
        ps = dask_ps.ParameterServer(client)
        bench = Bench(client, ps, args)
        for rep in range(args.repeat):
            for label, nbytes in sizes:
                logger.info("repeat %d/%d: size %s", rep + 1, args.repeat, label)
                bench.size(label, nbytes)
            if not args.skip_rows:
                logger.info("repeat %d/%d: row pushes", rep + 1, args.repeat)
                bench.row_ops()
    elapsed = time.perf_counter() - t0
    print(
        f"# bench_kv: dask_ps {dask_ps.__version__} ({_dask_ps_source()}), Python {platform.python_version()}, "
        f"numpy {np.__version__}, LocalCluster(2 workers x 1 thread, processes), "
        f"budget {args.budget}s/cell in {args.rounds} rounds, {args.repeat} repeat(s), "
        f"MALLOC_TRIM_THRESHOLD_={environ.get('MALLOC_TRIM_THRESHOLD_', 'unset')} on workers, {elapsed:.0f}s total\n"
    )
    print(bench.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
