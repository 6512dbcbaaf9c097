"""The worker-side session (``ctx``): what a participant of ``ParameterServer.run`` holds.

:class:`Session` is the participant's connection to the run and its
consistency rules: it joins and leaves the run, keeps the participant's
clock, buffers pushes (oplog) until ``flush()``/``clock()``, and decides
when a read may use the cache and when it waits. It is made of four parts,
one job each:

* this module: the connection (the worker's event loop, the router, the
  scheduler's run handlers, time accounting), the lifecycle, the clock,
  pushes into the buffers and the read path (when a read waits, what it
  fetches, how the result is assembled with own pending writes);
* :mod:`dask_ps._cache`: the blocks read (``ReadCache``), their
  invalidation and the own writes that must show in them;
* :mod:`dask_ps._flights`: what is in flight (flushes, the clock's
  messages, reads started ahead) and the order it keeps (``InFlight``, a
  member: ``Session._in_flight``, handed the router, the buffers, the
  cache and the clock it uses, not the session);
* :mod:`dask_ps._participant_state`: what the session shares with it
  (``ParticipantClock``, the per-table ``TableMetrics``) and the clock's
  own calls to the servers (``ClockReports``, ``Session._reports``).

Its methods run in the participant's task thread and hand network work to
the worker's event loop with ``asyncio.run_coroutine_threadsafe``, waiting
for the result (``Session._sync``) or not (in flight).

Consistency (see :mod:`dask_ps.consistency`): a read at clock ``c`` of a
table with staleness ``s`` needs every participant to have completed
``c - s`` clocks. Because a participant's updates reach a server before its
clock counts there, a block read from a server whose bound for it is ``m``
(the clocks every participant's message brought it, or the run's minimum
run-wide: docs/architecture.rst, "Clocks") contains every update made at
clocks ``< m``; cache entries carry that ``m`` as their tag and serve reads
with ``tag >= c - s``. Under
``refresh=True`` (SSP, ESSP) an entry also has to have been fetched in the
reader's current clock: the first read of a block in each clock goes to the
servers, and waits only if the bound is not met.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import math
import time
import uuid
from collections import Counter

import numpy as np
from distributed import get_worker, secede

from dask_ps import _backend, _clock_combiner, _config, _process_cache, _routing
from dask_ps._cache import CacheEntry, ReadCache
from dask_ps._exceptions import RunEndedError
from dask_ps._flights import InFlight, PullHandle, PushHandle, _result_of
from dask_ps._handlers import InternalRPC
from dask_ps._oplog import PushBuffer
from dask_ps._participant_state import ClockReports, CountedRPC, ParticipantClock, TableMetrics, is_summed_per_clock
from dask_ps._routing import TableHandle
from dask_ps._spec import check_row_request, check_rows_sorted, check_values
from dask_ps._sums import push_bound
from dask_ps._transport import Router, running_loop, wait_on
from dask_ps.consistency import ASP

logger = logging.getLogger(__name__)


def ps_call(method):
    """A public session call: books what finished in the background first,
    and its time counts as ``ps_seconds``."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._api():
            self._in_flight.reap()
            return method(self, *args, **kwargs)

    return call


class _ApiTimer:
    """Counts the time in the outermost public call of a session."""

    __slots__ = ("s",)

    def __init__(self, session):
        self.s = session

    def __enter__(self):
        if self.s._api_depth == 0:
            self.s._api_entered = time.perf_counter()
        self.s._api_depth += 1

    def __exit__(self, *exc):
        self.s._api_depth -= 1
        if self.s._api_depth == 0:
            self.s._ps_seconds += time.perf_counter() - self.s._api_entered
        return False


class Session:
    """One participant's handle: ``pull → compute → push → clock()``.

    Created by :meth:`ParameterServer.run` on a worker; user code receives it
    as ``ctx``. Not thread-safe: one participant, one thread.

    Communication can overlap the participant's computation (ps-lite's
    ``ZPull``/``ZPush`` and ``Wait``): ``prefetch``/``prefetch_rows`` start
    a read and return a handle whose ``result()`` is the read;
    ``flush(wait=False)`` and ``clock(wait=False)`` send in the background.
    Every guarantee of the tables' consistency models holds on these paths
    (see :mod:`dask_ps._flights`).

    Attributes
    ----------
    rank : int
        This participant's index in ``parts``.
    n_participants : int
    run_id : str
    """

    def __init__(self, run_id: str, rank: int, n_participants: int, worker=None, owner: str | None = None):
        self.worker = worker if worker is not None else get_worker()
        self.run_id = run_id
        self.rank = rank
        self.n_participants = n_participants
        self._plugin = plugin = self.worker.extensions.get("ps")
        # The scheduler's run handlers (join, leave, ...) and the servers' clock ones are internal:
        # a participant's calls carry the cluster's internal token.
        # Every message this session sends, by kind (metrics()["messages"]);
        # the scheduler's calls counted as "scheduler" (none per clock).
        self._sent: Counter = Counter()
        self._scheduler = CountedRPC((InternalRPC(self.worker.scheduler, plugin.internal_token) if plugin is not None
                                      else self.worker.scheduler), self._sent)
        # The sender id is stable across retries of this participant's task, and
        # flushes are numbered by (clock, n-th flush in the clock): a retried
        # participant that repeats a clock's pushes has them applied once. It
        # holds the run's secret: a push forged by another client with a
        # guessed sender and number cannot have the servers skip this
        # participant's real one as a duplicate (issue 34).
        self._router = Router(
            _process_cache.CombiningTransport(self.worker.rpc, self._scheduler, local=plugin,
                                              liveness=plugin.liveness if plugin is not None else None),
            sender=f"{run_id}-{owner}-{rank}" if owner else f"{run_id}-{rank}",
            latest_versions=plugin.latest_versions if plugin is not None else None,
        )
        self._router.transport.sent = self._sent
        self._key = f"{run_id}-{rank}-{uuid.uuid4().hex[:8]}"  # ESSP mailbox of this session
        self._notifying = False
        self._buffers: dict[str, PushBuffer] = {}
        self._spares: dict[str, object] = {}
        self._cache = ReadCache()
        self._metrics: dict[str, TableMetrics] = {}
        self._staleness_used: int | None = None  # the tightest bound among tables used
        self._clk = ParticipantClock()  # this participant's clock, shared with what is in flight
        self._api_depth = 0
        self._api_entered = 0.0
        self._ps_seconds = 0.0  # time in ctx calls
        self._blocked_seconds = 0.0  # of which waiting on the event loop (network, servers, others)
        self._started = time.perf_counter()
        # The clock's calls to the servers of the run, and what is in flight
        # (flushes, clock messages, reads ahead): members handed what they
        # use, sharing the buffers, the cache and the clock with the read path here.
        self._reports = ClockReports(self._router.transport, plugin.runs if plugin is not None else None,
                                     self.worker.address, run_id, rank, handles=self._router.handles)
        self._in_flight = InFlight(
            router=self._router, reports=self._reports, run_id=run_id, rank=rank, clock=self._clk,
            buffers=self._buffers, spares=self._spares, cache=self._cache, metrics=self._metrics,
            sync=self._sync, submit=self._submit, wait=self._await, api=self._api)
        self._router.on_handle = self._in_flight.placement_seen  # see InFlight.placement_seen

    def __repr__(self):
        return f"<Session run={self.run_id} rank={self.rank}/{self.n_participants} clock={self._clk.current}>"

    def _sync(self, fn, *args, **kwargs):
        """Run the coroutine ``fn(*args, **kwargs)`` on the worker's event
        loop and wait for its result (its error is raised here).

        ``run_coroutine_threadsafe`` and a wait on its future, not
        ``distributed.utils.sync``, which adds a turn of the loop and
        tornado's coroutine runner to every blocking call (a bare RPC of a
        100k-row read: 0.05 ms less of its ~1.9 ms; docs/benchmarks-history.md, KV)."""
        loop = self.worker.loop.asyncio_loop
        if running_loop() is loop:  # waiting here would block the loop that must run it
            raise RuntimeError(f"{self!r}: a blocking call made from its worker's event loop thread")
        coro = fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return wait_on(loop, coro)
        finally:
            self._blocked_seconds += time.perf_counter() - t0

    def _submit(self, coro) -> concurrent.futures.Future:
        """Start ``coro`` on the worker's event loop; do not wait."""
        return asyncio.run_coroutine_threadsafe(coro, self.worker.loop.asyncio_loop)

    def _await(self, future: concurrent.futures.Future):
        """The result of a started operation, waiting for it if need be."""
        if future.done():
            return future.result()
        return self._sync(_result_of, future)

    def _api(self):
        """Context of a public call: its time counts as ``ps_seconds``."""
        return _ApiTimer(self)

    # --- lifecycle ---------------------------------------------------------------------
    def _join(self):
        self._clk.current, attempt = self._sync(
            self._scheduler.ps_run_join, run_id=self.run_id, rank=self.rank, address=self.worker.address,
            with_attempt=True,
        )
        # A retried task resumes at the clock the run counts run-wide for it
        # and repeats it and the next one: their pushes the servers may have
        # applied already (they skip them: same numbers). The run counts a
        # clock message's clock run-wide only with the next message, so the
        # stopped task may have been one clock further (issue 36). In those
        # clocks this session cannot tell its new writes from old ones, so
        # it reads what the servers have instead of adding its own.
        if attempt > 1:
            # The run-wide clock, not a progress the scheduler sampled: a
            # clock message may have reached some servers only.
            self._clk.current = min(self._clk.current, self._sync(self._reports.run_wide_clock))
        self._clk.resumed = (self._clk.current, self._clk.current + 1) if attempt > 1 else ()
        if attempt > 1 and self._clk.current > 0:
            # The clock the run has of it may have reached some servers only
            # (the task stopped while reporting it): every server gets it.
            self._sync(self._reports.to_servers, "run_clock", clock=self._clk.current)
        self._clk.known_min = 0
        self._clk.settled = self._clk.current
        if _config.get_seconds("process-read-window") > 0:
            self._router.transport.combiner = _process_cache.acquire(self.run_id)
        if _config.get("clock.combine-per-process"):
            combiner = _clock_combiner.acquire(self.run_id, _config.get_seconds("clock.combine-window"))
            self._sync(_on_loop, combiner.join, self.rank, self._clk.current)
            self._router.transport.clock_combiner = combiner
            self._router.transport.clock_window = self._clock_window
        self._started = time.perf_counter()
        self._ps_seconds = self._blocked_seconds = 0.0

    def _leave(self, ok: bool):
        self._in_flight.cancel_prefetches()
        try:
            if ok:
                self.flush()
                self._in_flight.finish_all()
            else:  # let the flushes in flight end (their errors are not this exception's cause)
                self._in_flight.abandon()
        finally:
            self._in_flight.close()
            self._router.transport.combiner = None  # the last participant of the run here frees its combiner
            combiner, self._router.transport.clock_combiner = self._router.transport.clock_combiner, None
            self._router.transport.clock_window = None
            if combiner is not None:  # its siblings wait for it no more
                self._sync(_on_loop, combiner.leave, self.rank)
            self._sync(
                self._scheduler.ps_run_leave, run_id=self.run_id, rank=self.rank, metrics=self.metrics()
            )

    def _clock_window(self) -> float:
        """How long this participant's clock sections wait for its siblings
        (``_clock_combiner.window_for``)."""
        return _clock_combiner.window_for(self._staleness_used, _config.get_seconds("clock.combine-window"),
                                          _config.get_seconds("timeouts.clock"))

    @property
    def current_clock(self) -> int:
        """Number of ``clock()`` calls completed by this participant."""
        return self._clk.current

    def metrics(self) -> dict:
        """This participant's counters, per table, and where its time went:
        ``ps_seconds`` in calls of this session (pulls, pushes, flushes,
        clocks, prefetch results), of which ``ps_blocked_seconds`` waiting
        on the network, the servers or other participants, and
        ``compute_seconds`` everything else since it joined the run (its own
        code); ``clock_wait_seconds``: blocked in ``clock``; ``messages``:
        the requests it sent by kind (``push``, ``pull``, ``clock``,
        ``wait``: to servers through the comm; ``..._local``: direct calls
        to a server in this process; ``scheduler``; ``clock_combined``: its
        ``clock`` messages that went as sections of one message of its
        worker process, ``ps.clock.combine-per-process``) and ``bytes_pushed`` /
        ``bytes_pulled``, ``bytes_rows`` (row index bytes sent),
        ``row_lists_keyed`` (row lists sent as a key only) and
        ``row_lists_refused`` (messages a server refused for a key it did
        not hold, sent again: ``dask_ps._row_lists``), with
        ``messages_per_clock`` the same divided by the clocks completed."""
        elapsed = time.perf_counter() - self._started
        sent = dict(self._sent)
        return {
            "messages": sent,
            "messages_per_clock": {k: v / self._clk.current for k, v in sent.items()} if self._clk.current else {},
            "clock": self._clk.current,
            "clock_wait_seconds": self._clk.wait_seconds,
            "compute_seconds": max(0.0, elapsed - self._ps_seconds),
            "ps_seconds": self._ps_seconds,
            "ps_blocked_seconds": self._blocked_seconds,
            "tables": {k: v.to_dict() for k, v in self._metrics.items()},
        }

    # --- helpers ------------------------------------------------------------------
    def _handle(self, name: str) -> TableHandle:
        h = self._router.handles.get(name)
        if h is not None and h.version < self._router.latest_versions.get(name, 0):
            old_id = h.spec.table_id
            h = self._router.handles[name] = self._sync(self._router.handle, name)
            if h.spec.table_id != old_id:  # dropped and created again: nothing cached holds
                self._cache.forget(name)
        if h is None:
            h = self._sync(self._router.handle, name)
            # Checkpoints of this table wait for this run to end.
            self._sync(self._scheduler.ps_run_uses, run_id=self.run_id, table=name)
            self._metrics.setdefault(name, TableMetrics())
            s = h.spec.consistency.staleness
            if s is not None and not isinstance(h.spec.consistency, ASP):
                self._staleness_used = s if self._staleness_used is None else min(self._staleness_used, s)
            if h.spec.needs_clock_events and not self._notifying:
                self._sync(self._scheduler.ps_run_notify, run_id=self.run_id)
                self._notifying = True
        return h

    # --- push ------------------------------------------------------------------------
    @ps_call
    def push(self, name: str, values, copy: bool = True) -> None:
        """Buffer an update of the whole table (sent at ``flush``/``clock``).

        ``copy=False`` hands ``values`` over instead of copying it (ps-lite's
        ``ZPush``): do not write to it until the push was sent and
        acknowledged, i.e. until the next blocking ``flush()``/``clock()``
        returned (or the handle of ``flush(wait=False)`` says it is done).
        """
        h = self._handle(name)
        given = values
        buf = self._buffer(h)
        # A copy goes straight into the buffer's array, in the NaN/Inf check's pass.
        into = buf.copy_target() if copy and h.spec.device == "cpu" and isinstance(values, np.ndarray) else None
        # On the table's device from here on: the buffer, the overlay of own
        # pushes on reads and the write-through add them to the table's arrays
        # (cupy refuses numpy operands, and numpy cupy ones).
        self._settle_bound(h)  # a row push before it, to a table bounded at the flush: measured now
        values, bound = check_values(h.spec, values, h.spec.shape, bound=True, out=into)
        values = _backend.to_device(values, h.spec.device)
        fresh = values is not given  # a copy, a cast or device copy: the buffer's own
        buf.add_dense(values, keep=fresh or not copy, borrowed=not fresh and not copy, bound=bound)
        self._after_push(h)

    @ps_call
    def push_rows(self, name: str, rows, values, copy: bool = True) -> None:
        """Buffer an update of ``rows``.

        Duplicate rows are summed before the table's rule is applied
        (``np.add.at`` semantics: an optimizer rule takes one step with the
        summed gradient), except for ``rule="assign"``, where the last
        occurrence wins; as :meth:`ParameterServer.push_rows
        <dask_ps.ParameterServer.push_rows>`.

        ``copy=False`` hands ``rows`` and ``values`` over instead of copying
        them (ps-lite's ``ZPush``): do not write to them until the push was
        sent and acknowledged (see :meth:`push`).
        """
        h = self._handle(name)
        given_rows, given_values = rows, values
        rows, increasing = check_rows_sorted(h.spec, rows)
        # No pass for the bound of a clock's first push where the flush finds it from the nonzeros it
        # sends (Transport.wire_nonzeros); a second push measures the first's (_settle_bound).
        measure = self._settle_bound(h)
        values, bound = check_values(h.spec, values, (len(rows), *h.spec.row_shape), bound=True) if measure \
            else (check_values(h.spec, values, (len(rows), *h.spec.row_shape)), None)
        values = _backend.to_device(values, h.spec.device)  # as in push
        theirs_rows, theirs_values = rows is given_rows, values is given_values
        self._buffer(h).add_rows(rows, values, keep_rows=not theirs_rows or not copy,
                                 keep_values=not theirs_values or not copy,
                                 borrowed=not copy and (theirs_rows or theirs_values), increasing=increasing,
                                 bound=bound)
        self._after_push(h)

    def _settle_bound(self, h: TableHandle) -> bool:
        """Whether a row push of ``h`` is measured for its bound now: not the
        first push to an empty buffer of a table whose flush bounds it from
        its nonzeros (``Transport.bound_from_nonzeros``). A later push to
        that buffer first measures what it holds, so that its bound is
        known and the buffer's sum needs no exact pass (``PushBuffer``)."""
        buf = self._buffers.get(h.spec.name)
        if not self._router.transport.bound_from_nonzeros(h):
            return True
        if not buf:
            return False
        if buf.bound is None and buf.dense is None and len(buf.row_parts) == 1:
            buf.bound = push_bound(buf.row_parts[0][1])
        return True

    def _buffer(self, h: TableHandle) -> PushBuffer:
        buf = self._buffers.get(h.spec.name)
        if buf is None:
            serialized = self._router.transport.serialized
            remote = any(serialized(a) for a in {o[0] for o in h.owners})  # a few workers
            buf = self._buffers[h.spec.name] = PushBuffer(h.spec, spare=self._spares.pop(h.spec.name, None),
                                                          int32_rows=remote)
        return buf

    def _after_push(self, h: TableHandle) -> None:
        bound = h.spec.consistency.value_bound
        if bound is not None and self._buffers[h.spec.name].max_abs() > bound / self.n_participants:
            # VAP: this participant's invisible updates may not exceed v / P
            # per element, so the run's total never exceeds v.
            self._in_flight.flush_table(h.spec.name)

    @ps_call
    def flush(self, wait: bool = True) -> PushHandle | None:
        """Send every buffered push now: one message per server, concurrently.

        ``wait=False`` sends them in the background and returns at once with
        a :class:`~dask_ps._flights.PushHandle` (``wait()``, ``done()``); a
        later read of a table waits for its flushes, and ``clock()`` reports
        the clock only once they were acknowledged.
        """
        return self._in_flight.flush(wait)

    # --- clock --------------------------------------------------------------------------
    @ps_call
    def clock(self, wait: bool = True) -> None:
        """End of one iteration: flush, then count the clock.

        Updates reach their servers before the clock counts. Under SSP(s)
        (the tightest bound of the tables used) this then waits while this
        participant is more than ``s`` clocks ahead of the slowest live one.

        ``wait=False``: the flush and the clock's report go out in the
        background (the report after the flush was acknowledged) and this
        returns at once; ``current_clock`` advances now. A read then waits
        as its table's bound requires at the new clock, and the next
        ``clock()`` first waits for this one's report (so a participant is
        never more than one clock past what the servers know).
        """
        self._in_flight.finish_clock()  # the previous clock's report, if in the background
        clock = self._clk.current + 1
        wait_for = None if self._staleness_used is None else clock - self._staleness_used
        self._retire_entries_unusable_at(clock)  # before the flush: not written through for nothing
        self._in_flight.send_clock(clock, wait_for, wait)

    def _retire_entries_unusable_at(self, clock: int) -> None:
        """Mark the cached blocks no read at ``clock`` may use
        (:meth:`ReadCache.usable <dask_ps._cache.ReadCache.usable>` there;
        tags and fetch clocks never grow, so no later read either).
        Marked before the clock's flush, which would otherwise write own
        pushes through into them (LDA's word rows: a pass over every row
        read, each iteration, for a copy read again anyway); they stay until
        replaced, so that a re-read still counts as a refetch. ESSP's
        entries (filled by the servers) are left alone."""
        for name in list(self._cache.blocks):
            h = self._router.handles.get(name)
            if h is None or h.spec.consistency.name == "essp":
                continue
            self._cache.retire_unusable(name, self._clk.required_tag(h, clock), h.spec.consistency.refreshes, clock)

    # --- pull ------------------------------------------------------------------------------
    def _cacheable(self, h: TableHandle) -> bool:
        # VAP reads see the servers directly: a cached copy would hide others'
        # visible updates beyond the value bound.
        return h.spec.consistency.value_bound is None

    def _dense_read(self, h: TableHandle, b: int, rows) -> bool:
        """Whether a read of ``rows`` of block ``b`` fetches the whole block
        (no index array to send, no gather on the server, and the whole
        block cached) instead of the rows: when it needs at least
        ``ps.dense-read-fraction`` of the block's rows and the index array
        it saves is at least as large as the rows it would fetch for
        nothing. Narrow rows (a 1M x 1 table: 8 bytes of index per 4-byte
        row) qualify from a third of a block; rows of 200 bytes only from
        96%, where a whole-block read had sent a fifth more bytes and cost
        the reader a gather (15k x 50 at 80%: 0.72-0.75x a bare RPC). A
        whole block is also handed out shared: the server copies it at the
        next push, and the reader copies rows out of it."""
        if rows is None:
            return False
        start, stop = h.spec.block_bounds(b)
        n = stop - start
        if rows.size < float(_config.get("dense-read-fraction")) * n:
            return False
        row_bytes = h.spec.dtype.itemsize * math.prod(h.spec.row_shape)
        return rows.size * rows.dtype.itemsize >= (n - rows.size) * row_bytes

    @ps_call
    def pull(self, name: str, with_clocks: bool = False):
        """The whole table, as fresh as its consistency model guarantees,
        including this participant's own pending updates.

        ``with_clocks=True``: ``(values, clocks)``, ``clocks[i]`` the clock
        below which every participant's updates are in row ``i``
        (:meth:`row_clocks`)."""
        h = self._handle(name)
        reqs = {b: None for b in range(h.spec.n_blocks)}
        tags: dict[int, float] = {}
        out = self._assemble_dense(h, self._read(h, reqs, tags))
        return (out, self._row_clocks(h, None, None, reqs, tags)) if with_clocks else out

    @ps_call
    def pull_rows(self, name: str, rows, with_clocks: bool = False):
        """Values of ``rows`` (any order, duplicates allowed), as fresh as the
        table's model guarantees, including own pending updates;
        ``with_clocks=True``: ``(values, clocks)`` (see :meth:`pull`)."""
        h, reqs, uniq, inverse = self._row_read(name, rows)
        tags: dict[int, float] = {}
        out = self._assemble_rows(h, uniq, inverse, reqs, self._read(h, reqs, tags))
        return (out, self._row_clocks(h, uniq, inverse, reqs, tags)) if with_clocks else out

    def _row_clocks(self, h: TableHandle, uniq, inverse, reqs: dict, tags: dict) -> np.ndarray:
        """Per row read, the clock below which every participant's updates
        are in it (:func:`_routing.row_clocks`): its block's tag, at most the
        reader's clock (own updates are always in)."""
        cur = self._clk.current
        per_block = {b: int(min(tags.get(b, self._clk.known_min), cur)) for b in reqs}
        return _routing.row_clocks(h.spec, per_block, reqs, uniq is None, inverse)

    @ps_call
    def uncache(self, name: str) -> None:
        """Forget this session's cached copies of table ``name``'s rows and
        the memory they hold. Always legal: a later read goes to the
        servers, under the table's bound and with own writes, as a first
        read does. For a participant that holds one part of a table at a
        time (LDA's vocabulary slices): a cache would keep every part read."""
        self._handle(name)
        self._cache.forget(name)

    def held_bytes(self, name: str) -> int:
        """Bytes of table ``name`` this session holds: its cached rows and
        the own pushes it keeps (sent to an ``aggregate="clock"`` sum table,
        until the servers summed their clock), not the caller's arrays."""
        return self._cache.held_bytes(name)

    @ps_call
    def prefetch(self, name: str, for_clock: int | None = None) -> PullHandle:
        """Start reading the whole table; ``handle.result()`` returns what
        :meth:`pull` would return when it is called (ps-lite's ``ZPull``).

        The read goes out in the background while the participant computes.
        ``for_clock``: the clock at which ``result()`` will be called
        (default: the current one); the read then waits at its servers, in
        the background, until the table's bound for that clock is met; a
        read for the next clock goes with that clock's messages (one
        message per server per clock: the servers make it once the clock
        counted and the bound holds there). ``result()`` checks what arrived against the bound of
        the reader's clock *then*, adds own writes made since, and reads
        again what is not legal any more (under ``refresh=True``: read in
        another clock). Value-bounded tables (VAP, CVAP) are read at
        ``result()``.
        """
        h = self._handle(name)
        return self._prefetch(h, {b: None for b in range(h.spec.n_blocks)}, None, None, for_clock)

    @ps_call
    def prefetch_rows(self, name: str, rows, for_clock: int | None = None) -> PullHandle:
        """Start reading ``rows``; ``handle.result()`` returns what
        :meth:`pull_rows` would return when it is called (see :meth:`prefetch`)."""
        h, reqs, uniq, inverse = self._row_read(name, rows)
        return self._prefetch(h, reqs, uniq, inverse, for_clock)

    def _prefetch(self, h: TableHandle, reqs: dict, uniq, inverse, for_clock: int | None) -> PullHandle:
        """Start reading ``reqs`` (block -> local rows or None) for a read at
        clock ``for_clock`` (None: now). Blocks a cached copy serves now are
        left to the cache; value-bounded tables are read at ``result()``."""
        name, clock = h.spec.name, self._clk.current
        for_clock = clock if for_clock is None else for_clock
        if not isinstance(for_clock, int) or isinstance(for_clock, bool) or for_clock < clock:
            raise ValueError(f"table {name!r}: for_clock must be a clock >= the current one ({clock}), "
                             f"got {for_clock!r}")
        handle = PullHandle(self, h, reqs, uniq, inverse, None, tag=self._clk.known_min, clock=clock,
                            for_clock=for_clock)
        if not self._cacheable(h) or not reqs:
            return handle
        need, refresh = self._clk.required_tag(h), h.spec.consistency.refreshes
        cache = self._cache.blocks.get(name, {})
        fetch = {}
        for b, rows in reqs.items():
            e = cache.get(b)
            if not (for_clock == clock and self._cache.usable(e, need, refresh, clock) and e.covers(rows)):
                fetch[b] = None if self._dense_read(h, b, rows) else rows
        if fetch:
            s = h.spec.consistency.staleness
            self._in_flight.read_ahead(handle, fetch, None if need is None else for_clock - s)
        return handle

    def _prefetch_result(self, p: PullHandle):
        """``p.result()``: what it prefetched that may serve the read now
        (:meth:`InFlight.prefetched <dask_ps._flights.InFlight.prefetched>`),
        the rest read now."""
        with self._api():
            self._in_flight.reap()
            name = p.h.spec.name
            h = self._handle(name)
            self._in_flight.finish_flights(name)  # own writes in flight: booked (write-through, own sent pushes)
            parts = self._in_flight.prefetched(h, p) if p.future is not None else {}
            rest = {b: rows for b, rows in p.reqs.items() if b not in parts}
            m = self._metrics[name]
            tags = {b: p.block_tag(b) for b in parts}
            if rest:
                parts.update(self._read(h, rest, tags))
            else:
                m.reads += 1
                self._record_staleness(m, min([p.block_tag(b) for b in parts] or [p.tag]))
            if parts and not rest:
                m.prefetch_hits += 1
            elif p.future is not None:
                m.prefetch_rereads += 1
            p.read_tags = tags  # per block; the rows' clocks only if asked (PullHandle.result)
            if p.uniq is None:
                return self._assemble_dense(h, parts)
            return self._assemble_rows(h, p.uniq, p.inverse, p.reqs, parts)

    def _row_read(self, name: str, rows):
        """``(handle, reqs, uniq, inverse)`` of a read of ``rows``: validated
        and coalesced in one pass, ``reqs[block]`` the block's local rows
        (block 0's are the rows themselves; to a server in another process
        the transport sends them as int32, see ``Transport._wire_rows``)."""
        h = self._handle(name)
        uniq, inverse = check_row_request(h.spec, rows)
        reqs = {b: _routing.local_rows(h.spec, b, uniq[lo:hi]) for b, lo, hi in _routing.block_slices(h.spec, uniq)}
        if uniq is rows and 0 in reqs and self._cacheable(h):
            reqs[0] = reqs[0].copy()  # the cache keeps it: never a view of the caller's array
        return h, reqs, uniq, inverse

    def _owned(self, name: str, b: int, values) -> bool:
        """Whether ``values`` read from block ``b`` is this read's own (a fresh
        reply or gather), not the cache's entry nor a read-only reply."""
        if self._cache.holds(name, b, values):
            return False
        flags = getattr(values, "flags", None)
        return flags is None or getattr(flags, "writeable", True)

    def _assemble_dense(self, h: TableHandle, parts: dict):
        name = h.spec.name
        if h.spec.n_blocks == 1:
            owned = self._owned(name, 0, parts[0])
            out = parts[0] if owned else parts[0].copy()
        else:
            xp = _backend.namespace(*parts.values())
            out = xp.empty(h.spec.shape, dtype=h.spec.dtype)
            for b, arr in parts.items():
                start, stop = h.spec.block_bounds(b)
                out[start:stop] = arr
        buf = self._buffers.get(name)
        if buf and self._clk.own_writes_visible(h):
            out = buf.overlay_dense(out, owned=True)
        return out

    def _assemble_rows(self, h: TableHandle, uniq, inverse, reqs: dict, parts: dict):
        name = h.spec.name
        if not reqs:  # no rows: an empty array of the table's device
            out = _backend.zeros((0, *h.spec.row_shape), h.spec.dtype, h.spec.device)
        else:
            chunks = [parts[b] for b in reqs]
            xp = _backend.namespace(*chunks)
            if len(chunks) > 1:
                out = xp.concatenate(chunks, axis=0)
            else:  # no copy of a fresh reply nobody else holds
                out = chunks[0] if self._owned(name, next(iter(reqs)), chunks[0]) else chunks[0].copy()
        buf = self._buffers.get(name)
        if buf and self._clk.own_writes_visible(h):
            out = buf.overlay_rows(uniq, out, owned=True)
        if inverse is not None:
            out = out[_backend.namespace(out).asarray(inverse)]
        return out

    def _read(self, h: TableHandle, reqs: dict[int, np.ndarray | None], tags_out: dict) -> dict:
        """Values of ``reqs[block] = local rows or None`` satisfying the bound:
        from the cache when legal, otherwise one request per server;
        ``tags_out[block]``: the tag of what was read (``_row_clocks``)."""
        name = h.spec.name
        m = self._metrics[name]
        m.reads += 1
        self._in_flight.finish_flights(name)  # own flushes in flight: in what is read, and written through to the cache
        if not self._clk.own_writes_visible(h) and self._buffers.get(name):
            self._in_flight.flush_table(name)  # read-my-writes for optimizer tables: the server computes them
        need = self._clk.required_tag(h)
        cache = self._cache.table(name) if self._cacheable(h) else {}
        refresh = h.spec.consistency.refreshes
        essp = h.spec.consistency.name == "essp"
        if essp:
            self._drain_mailbox()
        out, missing = {}, {}
        for b, rows in reqs.items():
            e = cache.get(b)
            # ASP never waits, but re-reads once per clock: a cache that is
            # never refreshed would satisfy "read-my-writes" and nothing else.
            # refresh=True does the same on top of the bound (see ReadCache.usable).
            if self._cache.usable(e, need, refresh, self._clk.current) and e.covers(rows):
                out[b], tags_out[b] = e.take(rows), e.tag
            else:
                missing[b] = rows
                if refresh and e is not None and e.tag >= need and e.covers(rows):
                    m.refetches += 1  # plain SSP would have served this from the cache
        if not missing:
            m.cache_hits += 1
            self._record_staleness(m, min(cache[b].tag for b in reqs) if reqs else self._clk.current)
            return out
        # A read the run-wide minimum known here does not cover is parked at
        # its servers until their bound holds (issue 36: a server counts the
        # clocks of its own blocks); its reply says what it holds (``tags``).
        wait = None if need is None or self._clk.known_min >= need else int(need)
        # A valid cached entry missing some rows: fetch only those and merge
        # (the entry keeps the older tag, which both parts satisfy). Otherwise
        # fetch what is asked for and replace the entry.
        fetch, merge = {}, set()
        for b, rows in missing.items():
            e = cache.get(b)
            if self._cache.usable(e, need, refresh, self._clk.current) and rows is not None and e.rows is not None:
                fetch[b] = e.missing(rows)
                merge.add(b)
            else:
                fetch[b] = None if self._dense_read(h, b, rows) else rows
        tag = self._clk.known_min
        by_addr: dict[str, list] = {}
        for b, rows in fetch.items():
            by_addr.setdefault(h.primary(b), []).append((b, rows))

        tags: dict[int, float] = {}
        extra = {"run": (self.run_id, None if tag == float("inf") else int(tag)), "tags": tags}
        if wait is not None:
            # At the primaries: a replica's copy waits on the run-wide clocks,
            # which count this clock only with the next (docs/architecture.rst, "Clocks").
            extra["wait"], extra["replicas"] = wait, False
        if essp:
            extra["subscribe"] = (self.run_id, self._key, self.worker.address)

        summed_per_clock = is_summed_per_clock(h)
        summed: dict[int, float | None] = {}
        if summed_per_clock:
            extra["summed"] = summed
        t0 = time.perf_counter()
        got = self._sync(self._router.fetch, name, by_addr, **extra)
        m.wait_seconds += time.perf_counter() - t0 if wait is not None else 0.0
        if summed_per_clock:
            self._cache.drop_summed(name, tag)  # the servers applied every clock < tag before answering
        for b, (rows, seq, vals) in got.items():
            m.bytes_pulled += vals.nbytes
            if summed_per_clock:
                vals = self._cache.own_unsummed(name, b, rows, vals, summed.get(b, tag))
            if b in merge:
                e = cache[b].merged(rows, seq, vals)
            else:
                e = CacheEntry(_tag(tags.get(b), tag), seq, self._clk.current, rows, vals)
            if self._cacheable(h):
                cache[b] = e
            out[b], tags_out[b] = (e.take(reqs[b]) if e.rows is not reqs[b] else e.values), e.tag
        self._record_staleness(m, min([_tag(tags.get(b), tag) for b in got]
                                      + [cache[b].tag for b in reqs if b in cache] or [tag]))
        return out

    def _drain_mailbox(self) -> None:
        """ESSP: take the rows servers pushed after clock advances into the
        cache, where they are fresher and include all our own sent writes."""
        box = self._plugin.mailboxes.get(self._key) if self._plugin is not None else None
        while box:
            table, version, tag, blocks, seqs, rows, values, summed = box.popleft()
            h = self._router.handles.get(table)
            if (table not in self._cache.blocks or h is None or h.version != version
                    or self._in_flight.has_flights(table)):
                continue  # (own flushes in flight: the fill may hold them, or not)
            summed_per_clock = is_summed_per_clock(h)
            refresh = h.spec.consistency.refreshes
            # The servers push at an advance of the run's min clock to ``tag``.
            self._clk.known_min = max(self._clk.known_min, tag)
            for b, seq, r, v, below in zip(blocks, seqs, rows, values, summed):
                if self._cache.fill(table, b, tag, seq, r, v, below, summed_per_clock, refresh, self._clk.current):
                    self._metrics[table].eager_fills += 1

    def _record_staleness(self, m: TableMetrics, tag: float) -> None:
        # How many clocks behind the reader the guaranteed-visible state is.
        m.staleness[int(max(0, self._clk.current - min(tag, self._clk.current)))] += 1


async def _on_loop(fn, *args):
    """``fn(*args)`` on the worker's event loop (``Session._sync``)."""
    return fn(*args)


def _tag(server_tag, known: float) -> float:
    """A read's tag: what its server said it holds, at least the run-wide
    minimum the reader knew (None from a server: infinite, the run ended)."""
    if server_tag is None:
        return known
    return max(known, server_tag)


def participant(run_id, rank, n, fn, part, kwargs, owner=None):
    """Task: one participant of a run (see ``ParameterServer.run``);
    ``owner``: the run's secret."""
    secede()  # long-running: free the worker's thread slot
    ctx = Session(run_id, rank, n, owner=owner)
    try:
        ctx._join()
    except RunEndedError:
        return None  # its run ended before it started (Ctrl-C, another's error): nobody waits for it
    ok = False
    try:
        result = fn(ctx, part, **kwargs)
        ok = True
        return result
    except RunEndedError:
        # Nobody waits for this result (Ctrl-C, or another participant's
        # error already raised to the caller): an error here was logged by
        # Dask ("Compute Failed"), and a Ctrl-C'd gather left it unretrieved
        # ("Task exception was never retrieved ... AllExit", issue 35).
        return None
    finally:
        ctx._leave(ok)
