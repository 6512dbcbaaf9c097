"""The worker half of dask_ps: hosts shards and answers push/pull.

Installed on every worker by the scheduler plugin (``PSSchedulerPlugin.start``).
Its handlers are ordinary Dask RPC handlers (``ps_push``, ``ps_pull``, ...),
so data moves worker to worker over Dask's comm (TCP, TLS, UCX), and numpy
arrays travel as zero-copy frames via ``to_serialize``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict, deque

import functools
import inspect

from distributed import WorkerPlugin
from distributed.core import error_message
from distributed.protocol.serialize import Serialized, to_serialize

from dask_ps import _backend, _config
from dask_ps._exceptions import PSError, PSValueError
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec

logger = logging.getLogger(__name__)

PLUGIN_NAME = "ps"
HANDLERS = (
    "ps_create_shards", "ps_drop_table", "ps_push", "ps_pull", "ps_info",
    "ps_clock_advance", "ps_cache_fill", "ps_run_end",
)


class PSWorkerPlugin(WorkerPlugin):
    """Worker extension: a :class:`ShardStore` plus the ``ps_*`` handlers.

    All store mutations happen on the worker's event loop; large updates are
    computed on Dask's offload thread into fresh arrays and swapped in on the
    loop, under a per-table lock so writes never interleave.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.store = ShardStore()
        self.worker = None
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # ESSP: run_id -> session key -> (session's worker, {table: {block: rows}})
        self.subscriptions: dict[str, dict[str, tuple[str, dict]]] = defaultdict(dict)
        # ESSP: session key -> fresh rows pushed to a session on this worker
        self.mailboxes: dict[str, deque] = defaultdict(deque)
        self._min_clock: dict[str, float] = {}  # run_id -> highest min clock heard of

    def __repr__(self):
        addr = self.worker.address if self.worker is not None else None
        return f"<PSWorkerPlugin {addr} {self.store}>"

    async def setup(self, worker):
        self.worker = worker
        worker.handlers.update({op: reply_errors(getattr(self, op[3:])) for op in HANDLERS})
        worker.extensions[PLUGIN_NAME] = self
        # Announce ourselves (never called from the scheduler's add_worker:
        # an RPC to a joining worker there deadlocks, see DASK_NOTES pitfall 1).
        await worker.scheduler.ps_register_server(address=worker.address)

    async def teardown(self, worker):
        for op in HANDLERS:
            worker.handlers.pop(op, None)
        worker.extensions.pop(PLUGIN_NAME, None)
        self.store.tables.clear()

    # --- handlers (called on the worker's event loop) -----------------------------
    def create_shards(self, spec: dict, version: int, blocks: list) -> None:
        """Handler: allocate the given blocks of a table (zeros)."""
        self.store.create(TableSpec.from_msg(spec), version, list(blocks))

    def drop_table(self, name: str, table_id: str | None = None) -> bool:
        """Handler: forget a table's shards."""
        self._locks.pop(name, None)
        return self.store.drop(name, table_id)

    async def push(self, table=None, version=None, blocks=(), rows=(), values=(), raw=False, run=None):
        """Handler: apply one message of updates (all blocks or none).
        ``run = (run_id, clock)`` tags a participant's push (per-clock aggregation)."""
        rows = [_unwrap(r) for r in rows] if isinstance(rows, (list, tuple)) else rows
        values = [_unwrap(v) for v in values] if isinstance(values, (list, tuple)) else values
        async with self._locks[table if isinstance(table, str) else ""]:
            t, items = self.store.validate_push(table, version, blocks, rows, values)
            if run is not None and t.spec.aggregate == "clock" and not raw:
                run_id, clock = _check_run(run)
                self.store.accumulate(t, run_id, clock, items)
                return self.store.seqs(t, items)
            await self._apply(t, items, raw=bool(raw))
            return self.store.seqs(t, items)

    async def _apply(self, t, items, raw=False):
        """Apply validated items; large ones on the offload thread (lock held)."""
        nbytes = sum(v.nbytes for _, _, v in items)
        if nbytes >= _config.get_bytes("offload-bytes"):
            from distributed.utils import offload

            fresh = await offload(self.store.apply, t, items, raw=raw, in_place=False)
        else:
            fresh = self.store.apply(t, items, raw=raw)
        self.store.commit(t, fresh)

    async def pull(self, table=None, version=None, blocks=(), rows=(), run=None, subscribe=None):
        """Handler: values of whole blocks or of rows within blocks.

        ``run = (run_id, min_clock)``: the reader knows every participant
        finished ``min_clock`` clocks, so per-clock sums below it are applied
        first. ``subscribe = (run_id, session, address)``: ESSP, send these
        rows to that session after every clock advance.
        """
        rows = [_unwrap(r) for r in rows] if isinstance(rows, (list, tuple)) else rows
        seqs, values = await self._read(table, version, blocks, rows, run, subscribe, copy=False)
        return {"seqs": seqs, "values": [to_serialize(a) for a in values]}

    async def _read(self, table, version, blocks, rows, run, subscribe, copy):
        t, reqs = self.store.validate_pull(table, version, blocks, rows)
        if run is not None:
            run_id, min_clock = _check_run(run)
            await self._advance(run_id, min_clock)
        if subscribe is not None:
            run_id, session, address = subscribe
            _, tables = self.subscriptions[run_id].setdefault(session, (address, {}))
            for (b, _), r in zip(reqs, rows):
                tables.setdefault(t.spec.name, {})[b] = r
        return self.store.read(t, reqs, copy=copy)

    # --- clock events ----------------------------------------------------------------------
    async def _advance(self, run_id: str, min_clock) -> None:
        """Apply per-clock sums of ``run_id`` below ``min_clock`` (None: all)."""
        m = math.inf if min_clock is None else min_clock
        if m <= self._min_clock.get(run_id, -1):
            return
        self._min_clock[run_id] = m
        for name, t in list(self.store.tables.items()):
            if not t.pending:
                continue
            async with self._locks[name]:
                for items in self.store.due(t, run_id, m):
                    await self._apply(t, items)

    async def clock_advance(self, run_id: str, min_clock=None) -> None:
        """Handler (scheduler, when a run's min clock grows): apply due
        per-clock sums, then push fresh rows to ESSP subscribers."""
        await self._advance(run_id, min_clock)
        subs = self.subscriptions.get(run_id)
        if not subs or min_clock is None:
            return
        sends = []
        for session, (address, tables) in list(subs.items()):
            for name, blocks in tables.items():
                t = self.store.tables.get(name)
                if t is None:
                    continue
                reqs = [(b, r) for b, r in blocks.items() if b in t.blocks]
                dev_reqs = [(b, None if r is None else _backend.to_device(r, t.spec.device)) for b, r in reqs]
                seqs, values = self.store.read(t, dev_reqs, copy=address == self.worker.address)
                fill = dict(
                    session=session, table=name, version=t.version, tag=min_clock,
                    blocks=[b for b, _ in reqs], seqs=seqs,
                    rows=[None if r is None else to_serialize(r) for _, r in reqs],
                    values=[to_serialize(v) for v in values],
                )
                if address == self.worker.address:
                    self.cache_fill(**{**fill, "rows": [r for _, r in reqs], "values": values})
                else:
                    sends.append(self.worker.rpc(address).ps_cache_fill(**fill))
        for r in await asyncio.gather(*sends, return_exceptions=True):
            if isinstance(r, Exception):
                logger.debug("dask_ps: ESSP push failed: %r", r)

    def cache_fill(self, session, table, version, tag, blocks, seqs, rows, values) -> None:
        """Handler: fresh rows for a session on this worker (ESSP)."""
        self.mailboxes[session].append((table, version, tag, list(blocks), list(seqs), list(rows), list(values)))

    async def run_end(self, run_id: str) -> None:
        """Handler (scheduler): a run ended; apply what it left, forget it."""
        await self._advance(run_id, None)
        for session in self.subscriptions.pop(run_id, {}):
            self.mailboxes.pop(session, None)
        for session in [k for k in self.mailboxes if k.startswith(run_id)]:
            self.mailboxes.pop(session, None)
        self._min_clock.pop(run_id, None)

    def info(self) -> dict:
        """Handler: which blocks of which tables live here, and their bytes."""
        return {
            name: {"version": t.version, "blocks": sorted(t.blocks), "nbytes": t.nbytes}
            for name, t in self.store.tables.items()
        }

    # --- same-process access (a participant on this worker) -------------------------
    async def local_push(self, table, version, items, raw=False, run=None):
        async with self._locks[table]:
            blocks, rows, values = zip(*items) if items else ((), (), ())
            t, items = self.store.validate_push(table, version, list(blocks), list(rows), list(values))
            if run is not None and t.spec.aggregate == "clock" and not raw:
                self.store.accumulate(t, run[0], run[1], items)
            else:
                self.store.commit(t, self.store.apply(t, items, raw=raw))
            return self.store.seqs(t, items)

    async def local_pull(self, table, version, blocks, rows, run=None, subscribe=None):
        seqs, values = await self._read(table, version, blocks, rows, run, subscribe, copy=True)
        return {"seqs": seqs, "values": values}


def reply_errors(handler):
    """Return dask_ps errors to the caller (who re-raises them) without
    Dask logging a traceback for what is only bad input; other exceptions
    keep Dask's default handling."""
    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def wrapper(**msg):
            try:
                return await handler(**msg)
            except PSError as e:
                return error_message(e, status="uncaught-error")
    else:

        @functools.wraps(handler)
        def wrapper(**msg):
            try:
                return handler(**msg)
            except PSError as e:
                return error_message(e, status="uncaught-error")

    return wrapper


def _check_run(run):
    if not (isinstance(run, (list, tuple)) and len(run) == 2 and isinstance(run[0], str)
            and (run[1] is None or isinstance(run[1], (int, float)))):
        raise PSValueError(f"run tag must be (run_id, clock), got {run!r}")
    return run[0], run[1]


def _unwrap(x):
    """Arrays arrive deserialized; anything else that is still opaque is refused."""
    if isinstance(x, Serialized):
        raise PSValueError("payload could not be deserialized")
    return x
