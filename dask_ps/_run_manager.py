"""The runs a worker serves (issue 36): their clocks, the reads parked on
them, per-clock sums and ESSP pushes when a run's minimum grows, the
mailboxes of its sessions here, and its end.

:class:`RunManager` owns that state; the worker plugin's ``ps_run_*``,
``ps_cache_fill`` and ``ps_run_end`` handlers delegate to it, as
distributed's shuffle plugin delegates to its ``_ShuffleRunManager``. It is
handed what it uses (the shard store, the tables' locks, the apply step,
the calls to the scheduler and to peers) and never reaches back into the
plugin.

Clocks (docs/architecture.rst, "Clocks"): a participant sends each server
of its run one message per clock, its pushes to that server and the clock
(``run_clock`` with ``pushes``; :meth:`RunClocks.claim
<dask_ps._runclocks.RunClocks.claim>`). A read that must wait parks at the
server it reads from (``wait=``) until that server's bound for its blocks
holds (:meth:`RunManager.read_tag`).

Runs on the worker's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter, OrderedDict, defaultdict, deque

import numpy as np

from dask_ps import _config
from dask_ps._exceptions import PSValueError, RunEndedError
from dask_ps._runclocks import RunClocks, push_fresh_rows
from dask_ps._shard import _wire_clock

logger = logging.getLogger(__name__)

ENDED_RUNS_KEPT = 1024  # ended run ids remembered per worker


class RunManager:
    """The runs this worker serves.

    ``store``: the :class:`~dask_ps._shard.ShardStore`; ``all_locks(name)``:
    exclusive access to a table; ``apply(t, items, check=False)``: apply
    validated items (a coroutine); ``scheduler()``: the rpc to the
    scheduler (internal); ``peer_call(address, run_id)``: a peer server's
    clocks of a run; ``address()``: this worker's address;
    ``push(**msg)``: apply one push message of a participant (a coroutine,
    its reply the blocks' sequence numbers); ``read(**msg)``: one read of
    a participant (a coroutine, its reply as ``ps_pull``'s); ``fill_sender``:
    see :func:`~dask_ps._runclocks.push_fresh_rows` (the plugin).
    """

    def __init__(self, store, all_locks, apply, scheduler, peer_call, address, push, fill_sender=None, read=None):
        self.store = store
        self._all_locks = all_locks
        self._apply = apply
        self._scheduler = scheduler
        self._peer_call = peer_call
        self._address = address
        self._push = push
        self._read = read
        self.fill_sender = fill_sender
        # ESSP: run_id -> session key -> (session's worker, {table: {block: rows}})
        self.subscriptions: dict[str, dict[str, tuple[str, dict]]] = defaultdict(dict)
        # ESSP: session key -> fresh rows pushed to a session on this worker
        self.mailboxes: dict[str, deque] = defaultdict(deque)
        self.min_clock: dict[str, float] = {}  # run_id -> highest run-wide min clock heard of
        # Runs whose pushes this worker accepts (the scheduler said they are
        # active); forgotten at run_end, when their windows are freed.
        self.active: set[str] = set()
        self._checks: dict[str, asyncio.Future] = {}  # run_id -> scheduler lookup in flight
        # The latest runs ended here (refused without asking the scheduler;
        # bounded: an older one is refused because the scheduler no longer has it).
        self.ended: OrderedDict[str, None] = OrderedDict()
        # Clock calls received (``ps_run_clock``): "clock" messages through
        # the comm (a clock's pushes and reads), "clock_sections" the
        # participants' clocks they carried (several where combined per
        # process), "clock_report" reports without pushes, "clock_local"
        # direct calls from this process.
        self.received: Counter = Counter()
        self.clocks = RunClocks(self._run_record, peer_call, self._on_advance, me=address, ended=self.ended,
                                resync=lambda: _config.get_seconds("timeouts.clock-resync"))

    def __repr__(self):
        return f"<RunManager {self.clocks!r}>"

    # --- the scheduler's and peers' side ---------------------------------------------------
    async def _run_record(self, run_id: str):
        return await asyncio.wait_for(self._scheduler().ps_run_record(run_id=run_id),
                                      _config.get_seconds("timeouts.rpc"))

    async def check_active(self, run_id: str) -> None:
        """Refuse pushes of a run that ended (its exactly-once windows are
        freed at its end, so a late or re-sent push would count again) or
        that the scheduler does not know. Asks the scheduler once per run."""
        if run_id in self.active:
            return
        if run_id not in self.ended:
            check = self._checks.get(run_id)
            if check is None:
                check = self._checks[run_id] = asyncio.ensure_future(asyncio.wait_for(
                    self._scheduler().ps_active_runs(), _config.get_seconds("timeouts.rpc")))
                check.add_done_callback(lambda _: self._checks.pop(run_id, None))
            active = await asyncio.shield(check)
            # An end may have arrived while we asked.
            if run_id in active and run_id not in self.ended:
                self.active.add(run_id)
                return
        raise RunEndedError(f"run {run_id} has ended (or was never started): its pushes are refused")

    # --- clocks --------------------------------------------------------------------------------
    async def run_clock(self, run_id: str, rank: int, clock: int, wait_for=None, timeout=None, pushes=None,
                        versions=None, reads=None):
        """``rank`` completed ``clock`` clocks. Without ``pushes``: every push
        of its clocks before was acknowledged everywhere (a run-wide clock).
        With ``pushes`` (a list, maybe empty: one message per server per
        clock): its pushes to this server of clock ``clock - 1``, applied
        here first, then counted as :meth:`RunClocks.claim`; ``versions``:
        its placement version of each table it holds; ``reads``: reads of
        the clock that follows (prefetched ahead), made after the clock
        counted, each parked until its bound holds here (``wait``). Returns
        the run-wide minimum, after waiting (``wait_for``, SSP) until every
        participant reached that clock; with ``pushes`` ``{"min", "seqs"}``
        and ``"reads"``: each read's reply, or ``{"error"}`` (the reader
        reads it again)."""
        rec = await self.clocks.get(run_id)
        seqs = None
        if pushes is not None:
            if not isinstance(pushes, (list, tuple)):
                raise PSValueError(f"run {run_id}: a clock message's pushes must be a list, got {pushes!r}")
            if rec.aborted:
                raise rec.aborted_error()
            seqs = await asyncio.gather(*(self._push(**p) for p in pushes))
            self.clocks.claim(rec, rank, clock, versions)
        else:
            self.clocks.clock(rec, rank, clock)
        if wait_for is not None:
            # A participant's pace (SSP): the clocks every other one reached.
            await self.clocks.wait(rec, int(wait_for), timeout, measure=lambda r: r.progress())
        got = None
        if reads:
            if not isinstance(reads, (list, tuple)) or self._read is None:
                raise PSValueError(f"run {run_id}: a clock message's reads must be a list, got {reads!r}")
            got = [{"error": repr(r)} if isinstance(r, BaseException) else r
                   for r in await asyncio.gather(*(self._read(**r) for r in reads), return_exceptions=True)]
        m = _wire_clock(rec.min_clock)
        if seqs is None:
            return m
        return {"min": m, "seqs": list(seqs)} if got is None else {"min": m, "seqs": list(seqs), "reads": got}

    async def run_wait(self, run_id: str, clock: int, timeout=None):
        rec = await self.clocks.get(run_id)
        return _wire_clock(await self.clocks.wait(rec, int(clock), timeout))

    def run_clocks(self, run_id: str) -> dict | None:
        rec = self.clocks.records.get(run_id)
        return None if rec is None else {"clocks": list(rec.clocks), "min": _wire_clock(rec.min_clock)}

    def primary_here(self, t, blocks) -> bool:
        me = self._address()
        return all(not t.owners or t.owners[b][0] == me for b in blocks)

    def tag_of(self, rec, t, blocks) -> float:
        """What a read of ``blocks`` of ``t`` here is guaranteed to hold: the
        run-wide minimum, or this server's bound where it is their primary."""
        m = rec.min_clock
        if self.primary_here(t, blocks):
            m = max(m, rec.bound(t.spec.name, t.version))
        return m

    async def park_read(self, run_id: str, name: str, blocks, need: int, timeout=None):
        """Park a read of ``blocks`` of table ``name`` until its tag here
        reaches ``need`` (Bösen's ``HandleRowRequest``). Returns the record."""
        rec = await self.clocks.get(run_id)

        def measure(r):
            t = self.store.tables.get(name)
            return r.min_clock if t is None else self.tag_of(r, t, blocks)

        await self.clocks.wait(rec, int(need), timeout, measure=measure)
        return rec

    async def read_tag(self, rec, t, blocks) -> float:
        """Under the table's locks: the read's tag; per-clock sums of the
        read's blocks below it applied first (aggregate="clock")."""
        tag = self.tag_of(rec, t, blocks)
        if t.spec.aggregate == "clock" and tag > self.min_clock.get(rec.run_id, -1):
            await self.apply_due(t, rec.run_id, tag, blocks)
        return tag

    # --- clock events ----------------------------------------------------------------------
    async def advance(self, run_id: str, min_clock) -> None:
        """Apply per-clock sums of ``run_id`` below ``min_clock`` (None: all)."""
        m = math.inf if min_clock is None else min_clock
        if m <= self.min_clock.get(run_id, -1) or run_id in self.ended:
            return
        # Recorded first, applied table by table: a read of a table meanwhile
        # applies that table's due sums itself, under its lock (see _read).
        self.min_clock[run_id] = m
        for name, t in list(self.store.tables.items()):
            if not t.pending:
                continue
            async with self._all_locks(name):
                if self.store.tables.get(name) is t:
                    await self.apply_due(t, run_id, m)

    async def apply_due(self, t, run_id: str, m: float, blocks=None) -> None:
        """Apply the per-clock sums of ``run_id`` below clock ``m`` (of
        ``blocks`` only, if given; the caller holds the table's locks, so
        no read sees them half applied)."""
        if run_id in self.ended:
            return  # all applied at its end
        for items in self.store.due(t, run_id, m, blocks):
            await self._apply(t, items, check=False)  # checked when they were pushed (accumulate)

    def _on_advance(self, run_id: str, m: float) -> None:
        """A run's minimum grew here: apply its due per-clock sums and push
        fresh rows to its ESSP readers, in the background (only if there
        are any: a clock report's reply does not wait for them)."""
        if self.subscriptions.get(run_id) or any(t.pending for t in self.store.tables.values()):
            asyncio.ensure_future(self.clock_advance(run_id, None if math.isinf(m) else m))
        elif run_id not in self.ended:  # nothing to apply: noted for blocks installed later
            self.min_clock[run_id] = max(m, self.min_clock.get(run_id, -1))

    async def clock_advance(self, run_id: str, min_clock=None) -> None:
        """When a run's min clock grows here: apply due per-clock sums, then
        push fresh rows to ESSP subscribers."""
        await self.advance(run_id, min_clock)
        if self.subscriptions.get(run_id) and min_clock is not None and self.fill_sender is not None:
            await push_fresh_rows(self.fill_sender, run_id, min_clock)

    def cache_fill(self, session, table, version, tag, blocks, seqs, rows, values, summed_below=None,
                   run_id=None) -> None:
        """Fresh rows for a session on this worker (ESSP); a fill of a run
        that ended here is dropped (issue 22)."""
        if not (isinstance(run_id, str) and isinstance(session, str) and session.startswith(f"{run_id}-")):
            raise PSValueError(f"a cache fill needs the run id its session {session!r} belongs to")
        if run_id in self.ended:
            return
        summed = list(summed_below) if summed_below is not None else [None] * len(blocks)
        self.mailboxes[session].append(
            (table, version, tag, list(blocks), list(seqs), list(rows), list(values), summed)
        )

    def subscribe(self, subscribe, t, reqs, as_rows) -> None:
        """ESSP: note the rows a session read, to push them after advances."""
        if subscribe is None or subscribe[0] in self.ended:
            return
        run_id, session, address = subscribe
        _, tables = self.subscriptions[run_id].setdefault(session, (address, {}))
        subs = tables.setdefault(t.spec.name, {})
        for b, r in reqs:
            r = as_rows(r)
            prev = subs.get(b, r)  # rows read at different times add up (None: the whole block)
            subs[b] = None if r is None or prev is None else _union(prev, r)

    async def run_end(self, run_id: str) -> None:
        """A run ended: apply what it left, forget it (its exactly-once
        windows included) and refuse its pushes from now on."""
        if not isinstance(run_id, str):
            raise PSValueError(f"run_end needs a run id, got {run_id!r}")
        await self.advance(run_id, None)
        self.ended[run_id] = None
        while len(self.ended) > ENDED_RUNS_KEPT:
            self.ended.popitem(last=False)
        self.active.discard(run_id)
        for session in self.subscriptions.pop(run_id, {}):
            self.mailboxes.pop(session, None)
        for session in [k for k in self.mailboxes if k.startswith(run_id)]:
            self.mailboxes.pop(session, None)
        self.min_clock.pop(run_id, None)
        self.clocks.end(run_id)
        self.store.forget_run(run_id)


def _union(a, b):
    return np.union1d(a, b)
