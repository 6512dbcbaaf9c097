"""The worker-side session (``ctx``): what a participant of ``ParameterServer.run`` holds.

It keeps the participant's clock, a cache of pulled blocks tagged with the
clock they reflect, and a buffer of pushes (oplog) that is sent at
``flush()``/``clock()``. Its methods run in the participant's task thread and
hand network work to the worker's event loop with ``distributed.utils.sync``.

Consistency (see :mod:`dask_ps.consistency`): a read at clock ``c`` of a
table with staleness ``s`` needs every participant to have completed
``c - s`` clocks. Because a participant's updates reach the servers before its
clock counts, any server value read after the run's minimum clock reached
``m`` contains every update made at clocks ``< m``; cache entries carry that
``m`` as their tag and serve reads with ``tag >= c - s``. Under
``refresh=True`` (SSP, ESSP) an entry also has to have been fetched in the
reader's current clock: the first read of a block in each clock goes to the
servers, and waits only if the bound is not met.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from distributed import get_worker, secede
from distributed.utils import sync

from dask_ps import _backend, _config, _routing
from dask_ps._handlers import InternalRPC
from dask_ps._oplog import PushBuffer
from dask_ps._overlap import Overlap, PullHandle, PushHandle, add_into, ps_call
from dask_ps._routing import TableHandle
from dask_ps._spec import check_row_request, check_rows_sorted, check_values
from dask_ps._transport import Router, Transport
from dask_ps.consistency import ASP

logger = logging.getLogger(__name__)


def _same_rows(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two sorted row lists are the same (a loop that reads and
    pushes the rows it read: no binary search needed)."""
    return a is b or (a.size == b.size and bool(np.array_equal(a, b)))


# A cached entry of some rows uses a lookup table over its row numbers when
# it holds at least 1 in this many of them; sparser ones binary-search.
_DENSE_ROWS = 32


@dataclass
class CacheEntry:
    """A cached block (or some of its rows).

    ``positions`` finds rows of an entry that holds many of its block's rows
    through a lookup table over the row numbers (4 bytes per row number up
    to the largest held, built at first use): a table of a million rows read
    in rounds of ~170k touched rows (sparse SGD) spent most of its pull time
    in binary searches of sorted row lists, each step a cache miss. An entry
    of a few rows of a large block binary-searches: a table there would cost
    more to build (per row number) than the searches it saves."""

    tag: float  # the values contain every update made at clocks < tag
    seq: int  # server sequence number of the block when read
    clock: int  # the reader's own clock when it was fetched from the servers (-1: pushed by them)
    rows: np.ndarray | None  # local rows held (sorted), None = whole block
    values: object
    _index: np.ndarray | None = field(default=None, repr=False, compare=False)
    # No read at the owner's current clock or later may use it: own pushes
    # are not written through into it any more (Session._retire_entries_unusable_at).
    retired: bool = field(default=False, compare=False)

    def _dense(self) -> bool:
        return self.rows.size * _DENSE_ROWS >= (int(self.rows[-1]) + 1 if self.rows.size else 0)

    def positions(self, local_rows: np.ndarray) -> np.ndarray:
        """Where each of ``local_rows`` is in ``rows`` (-1: not held)."""
        if self._index is None and not self._dense():
            if self.rows.size == 0:
                return np.full(local_rows.shape, -1, dtype=np.intp)
            pos = np.minimum(np.searchsorted(self.rows, local_rows), self.rows.size - 1)
            return np.where(self.rows[pos] == local_rows, pos, -1)
        if self._index is None:
            size = int(self.rows[-1]) + 1 if self.rows.size else 0
            index = np.full(size, -1, dtype=np.int64 if self.rows.size >= 2**31 else np.int32)
            index[self.rows] = np.arange(self.rows.size, dtype=index.dtype)
            self._index = index
        if local_rows.size and int(local_rows.max()) < self._index.size:
            return self._index[local_rows]
        out = np.full(local_rows.shape, -1, dtype=self._index.dtype)
        inside = local_rows < self._index.size
        out[inside] = self._index[local_rows[inside]]
        return out

    def covers(self, local_rows: np.ndarray | None) -> bool:
        if self.rows is None:
            return True
        if local_rows is None:
            return False
        if _same_rows(self.rows, local_rows):
            return True
        return bool(np.all(self.positions(local_rows) >= 0))

    def missing(self, local_rows: np.ndarray) -> np.ndarray:
        """Those of ``local_rows`` not held."""
        return local_rows[self.positions(local_rows) < 0]

    def merged(self, rows: np.ndarray, seq: int, values) -> "CacheEntry":
        """This entry plus freshly read ``rows`` (sorted, none held yet). The
        older tag and sequence number stay: the merged entry satisfies both."""
        xp = _backend.namespace(self.values)
        # A row's place in the merged list is the number of rows held or read
        # below it: for many rows of the block, a mark per row number and a
        # running count (which is also the merged entry's lookup table); for
        # few, each list binary-searched in the other. No sort either way.
        n = self.rows.size + rows.size
        size = max(int(self.rows[-1]) + 1 if self.rows.size else 0, int(rows[-1]) + 1 if rows.size else 0)
        rank = None
        if n * _DENSE_ROWS >= size:
            held = np.zeros(size, dtype=bool)
            held[self.rows] = True
            held[rows] = True
            rank = np.cumsum(held, dtype=np.int64 if size >= 2**31 else np.int32) - 1
            pos_old, pos_new = rank[self.rows], rank[rows]
            rank[~held] = -1
        else:
            pos_old = np.searchsorted(rows, self.rows) + np.arange(self.rows.size)
            pos_new = np.searchsorted(self.rows, rows) + np.arange(rows.size)
        all_rows = np.empty(n, dtype=np.result_type(self.rows, rows))
        all_rows[pos_old] = self.rows
        all_rows[pos_new] = rows
        vals = xp.empty((n, *self.values.shape[1:]), dtype=self.values.dtype)
        vals[xp.asarray(pos_old)] = self.values
        vals[xp.asarray(pos_new)] = values
        return CacheEntry(self.tag, min(self.seq, seq), self.clock, all_rows, vals, _index=rank)

    def common(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions in this entry and in ``rows`` of the rows both hold."""
        pos = self.positions(rows)
        hit = np.flatnonzero(pos >= 0)
        return pos[hit], hit

    def take(self, local_rows: np.ndarray | None):
        if self.rows is None:
            if local_rows is None:
                return self.values
            xp = _backend.namespace(self.values)
            return self.values[xp.asarray(local_rows)]
        if _same_rows(self.rows, local_rows):
            return self.values  # as for a whole block: the callers copy
        xp = _backend.namespace(self.values)
        return self.values[xp.asarray(self.positions(local_rows))]


@dataclass
class TableMetrics:
    reads: int = 0
    cache_hits: int = 0
    wait_seconds: float = 0.0
    staleness: Counter = field(default_factory=Counter)
    bytes_pushed: int = 0
    bytes_pulled: int = 0
    flushes: int = 0
    eager_fills: int = 0  # ESSP: blocks refreshed by a server push
    refetches: int = 0  # refresh=True: blocks fetched although the cached copy met the bound
    prefetch_hits: int = 0  # prefetched reads served entirely by what was prefetched
    prefetch_rereads: int = 0  # prefetched reads that read (some blocks) again at result()

    def to_dict(self) -> dict:
        return {
            "reads": self.reads,
            "cache_hits": self.cache_hits,
            "cache_hit_rate": self.cache_hits / self.reads if self.reads else 0.0,
            "wait_seconds": self.wait_seconds,
            "staleness": dict(sorted(self.staleness.items())),
            "bytes_pushed": self.bytes_pushed,
            "bytes_pulled": self.bytes_pulled,
            "flushes": self.flushes,
            "eager_fills": self.eager_fills,
            "refetches": self.refetches,
            "prefetch_hits": self.prefetch_hits,
            "prefetch_rereads": self.prefetch_rereads,
        }


class Session(Overlap):
    """One participant's handle: ``pull → compute → push → clock()``.

    Created by :meth:`ParameterServer.run` on a worker; user code receives it
    as ``ctx``. Not thread-safe: one participant, one thread.

    Communication can overlap the participant's computation (ps-lite's
    ``ZPull``/``ZPush`` and ``Wait``): ``prefetch``/``prefetch_rows`` start
    a read and return a handle whose ``result()`` is the read;
    ``flush(wait=False)`` and ``clock(wait=False)`` send in the background.
    Every guarantee of the tables' consistency models holds on these paths
    (see :mod:`dask_ps._overlap`).

    Attributes
    ----------
    rank : int
        This participant's index in ``parts``.
    n_participants : int
    run_id : str
    """

    def __init__(self, run_id: str, rank: int, n_participants: int, worker=None):
        self.worker = worker if worker is not None else get_worker()
        self.run_id = run_id
        self.rank = rank
        self.n_participants = n_participants
        self._plugin = plugin = self.worker.extensions.get("ps")
        # The scheduler's run handlers (join, clock, leave, ...) are internal:
        # a participant's calls carry the cluster's internal token.
        self._scheduler = (InternalRPC(self.worker.scheduler, plugin.internal_token) if plugin is not None
                           else self.worker.scheduler)
        # The sender id is stable across retries of this participant's task, and
        # flushes are numbered by (clock, n-th flush in the clock): a retried
        # participant that repeats a clock's pushes has them applied once.
        self._router = Router(
            Transport(self.worker.rpc, self._scheduler, local=plugin,
                      liveness=plugin.liveness if plugin is not None else None),
            sender=f"{run_id}-{rank}",
            latest_versions=plugin.latest_versions if plugin is not None else None,
        )
        self._flushes_this_clock = 0
        self._key = f"{run_id}-{rank}-{uuid.uuid4().hex[:8]}"  # ESSP mailbox of this session
        self._notifying = False
        self._buffers: dict[str, PushBuffer] = {}
        self._spares: dict[str, object] = {}
        self._cache: dict[str, dict[int, CacheEntry]] = {}
        self._own_seq: dict[tuple[str, int], int] = {}  # (table, block) -> seq after our last push
        # aggregate="clock" sum tables: own pushes sent but perhaps not yet
        # summed into the servers' values, as (clock, {block: [(rows, values)]})
        # per table; dropped once the run's min clock passes their clock.
        self._sent: dict[str, list[tuple[int, dict[int, list]]]] = {}
        self._sent_floor: dict[str, float] = {}  # clocks below this were dropped from _sent
        self._metrics: dict[str, TableMetrics] = {}
        self._clock_wait = 0.0
        self._staleness_used: int | None = None  # the tightest bound among tables used
        self._clock = 0
        self._resumed_clock: int | None = None  # a retried attempt's first clock (see _join)
        self._known_min = 0.0
        self._closed = False
        self._init_overlap()

    def __repr__(self):
        return f"<Session run={self.run_id} rank={self.rank}/{self.n_participants} clock={self._clock}>"

    def _sync(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return sync(self.worker.loop, fn, *args, **kwargs)
        finally:
            self._blocked_seconds += time.perf_counter() - t0

    # --- lifecycle ---------------------------------------------------------------------
    def _join(self):
        self._clock, attempt = self._sync(
            self._scheduler.ps_run_join, run_id=self.run_id, rank=self.rank, address=self.worker.address,
            with_attempt=True,
        )
        # A retried task repeats the clock it was stopped in, whose pushes the
        # servers may have applied already (they skip them: same numbers).
        # In that clock this session cannot tell its new writes from old
        # ones, so it reads what the servers have instead of adding its own.
        self._resumed_clock = self._clock if attempt > 1 else None
        self._known_min = 0
        self._started = time.perf_counter()
        self._ps_seconds = self._blocked_seconds = 0.0

    def _leave(self, ok: bool):
        self._cancel_prefetches()
        try:
            if ok:
                self.flush()
                self._finish_all()
            else:  # let the flushes in flight end (their errors are not this exception's cause)
                if self._clock_flight is not None:
                    self._clock_flight[0].cancel()  # may wait for the others: not after an error
                    self._clock_flight = None
                for name in list(self._flights):
                    while self._flights.get(name):
                        try:
                            self._finish_flights(name)
                        except Exception as e:
                            logger.debug("dask_ps: %r: a flush failed after an error: %r", self, e)
        finally:
            self._closed = True
            self._sync(
                self._scheduler.ps_run_leave, run_id=self.run_id, rank=self.rank, metrics=self.metrics()
            )

    @property
    def current_clock(self) -> int:
        """Number of ``clock()`` calls completed by this participant."""
        return self._clock

    def metrics(self) -> dict:
        """This participant's counters, per table, and where its time went:
        ``ps_seconds`` in calls of this session (pulls, pushes, flushes,
        clocks, prefetch results), of which ``ps_blocked_seconds`` waiting
        on the network, the servers or other participants, and
        ``compute_seconds`` everything else since it joined the run (its own
        code); ``clock_wait_seconds``: blocked in ``clock``."""
        elapsed = time.perf_counter() - self._started
        return {
            "clock": self._clock,
            "clock_wait_seconds": self._clock_wait,
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
                self._cache.pop(name, None)
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

    def _own_writes_visible(self, h: TableHandle, clock: int | None = None) -> bool:
        """Whether this session can add its own updates to what it reads (a
        sum). Otherwise the server computes the result (an optimizer step,
        or a sum in the clock a retried task repeats, which may count a
        push already) and reads flush pending pushes first."""
        # ``clock``: of a write (a flush booked after the clock advanced).
        return h.spec.rule.additive and (self._clock if clock is None else clock) != self._resumed_clock

    @staticmethod
    def _summed_per_clock(h: TableHandle) -> bool:
        """A sum table with aggregate="clock": the servers hold a push until
        its clock is complete everywhere, so this session adds its own sent
        pushes the servers have not summed yet to what it fetches (read-my-writes)."""
        return h.spec.rule.additive and h.spec.aggregate == "clock"

    def _wait_min(self, need: float, metrics: TableMetrics | None) -> None:
        """Block until the run's min clock is at least ``need``."""
        if self._known_min >= need:
            return
        t0 = time.perf_counter()
        m = self._sync(
            self._scheduler.ps_wait_clock,
            run_id=self.run_id,
            clock=int(need),
            timeout=_config.get_seconds("timeouts.clock"),
        )
        self._known_min = float("inf") if m is None else max(self._known_min, m)
        dt = time.perf_counter() - t0
        if metrics is not None:
            metrics.wait_seconds += dt
        else:
            self._clock_wait += dt

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
        # On the table's device from here on: the buffer, the overlay of own
        # pushes on reads and the write-through add them to the table's arrays
        # (cupy refuses numpy operands, and numpy cupy ones).
        values = _backend.to_device(check_values(h.spec, values, h.spec.shape), h.spec.device)
        fresh = values is not given  # a cast or device copy: the buffer's own
        self._buffer(h).add_dense(values, keep=fresh or not copy, borrowed=not fresh and not copy)
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
        values = check_values(h.spec, values, (len(rows), *h.spec.row_shape))
        values = _backend.to_device(values, h.spec.device)  # as in push
        theirs_rows, theirs_values = rows is given_rows, values is given_values
        self._buffer(h).add_rows(rows, values, keep_rows=not theirs_rows or not copy,
                                 keep_values=not theirs_values or not copy,
                                 borrowed=not copy and (theirs_rows or theirs_values), increasing=increasing)
        self._after_push(h)

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
            self._flush_table(h.spec.name)

    @ps_call
    def flush(self, wait: bool = True) -> PushHandle | None:
        """Send every buffered push now: one message per server, concurrently.

        ``wait=False`` sends them in the background and returns at once with
        a :class:`~dask_ps._overlap.PushHandle` (``wait()``, ``done()``); a
        later read of a table waits for its flushes, and ``clock()`` reports
        the clock only once they were acknowledged.
        """
        if not wait:
            return self._flush_async()
        self._flush_now(list(self._buffers))
        for name in list(self._flights):
            self._finish_flights(name)
        return None

    def _flush_table(self, name: str) -> None:
        """Send ``name``'s buffered pushes and wait for them."""
        self._flush_now([name])
        self._finish_flights(name)

    def _flushed(self, flight, seqs: dict[int, int]) -> None:
        """Book an acknowledged flush (the participant's thread, in order)."""
        name, h, msgs = flight.name, flight.h, flight.msgs
        m = self._metrics[name]
        m.flushes += 1
        m.bytes_pushed += sum(v.nbytes for items in msgs.values() for _, _, v in items)
        self._write_through(h, msgs, seqs, flight.clock)
        if self._summed_per_clock(h):
            by_block: dict[int, list] = {}
            for items in msgs.values():
                for b, rows, vals in items:
                    # Kept until summed everywhere: never the caller's array (copy=False).
                    by_block.setdefault(b, []).append((rows, vals.copy() if flight.buf.borrowed else vals))
            self._sent.setdefault(name, []).append((flight.clock, by_block))
        spare = flight.buf.spare_after_send
        if spare is not None:
            self._spares[name] = spare  # sent and applied: reuse its memory next time

    def _write_through(self, h: TableHandle, msgs, seqs: dict[int, int], clock: int | None = None) -> None:
        """Keep own writes visible in the cache after they were sent
        (read-my-writes); ``clock``: the writer's clock when they were sent."""
        name = h.spec.name
        cache = self._cache.get(name, {})
        for b, s in seqs.items():
            self._own_seq[(name, b)] = s
        if not cache:
            return
        if not self._own_writes_visible(h, clock):
            for b in seqs:  # the server's result is not ours to compute: re-read
                cache.pop(b, None)
            return
        for items in msgs.values():
            for b, rows, vals in items:
                e = cache.get(b)
                if e is None or e.retired:
                    continue
                # A reply can share the server's array (in-process): copy first.
                e.values = _backend.writable(e.values)
                xp = _backend.namespace(e.values)
                if e.rows is None:
                    if rows is None:
                        e.values += vals
                    else:
                        _backend.add_rows(e.values, xp.asarray(rows), vals)
                elif rows is None:
                    e.values += vals[xp.asarray(e.rows)]
                elif _same_rows(e.rows, rows):
                    e.values += vals  # pushed the rows it read (the usual loop)
                else:
                    ie, iv = e.common(rows)
                    if ie.size:
                        _backend.add_rows(e.values, xp.asarray(ie), vals[xp.asarray(iv)])

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
        self._finish_clock()  # the previous clock's report, if in the background
        clock = self._clock + 1
        wait_for = None if self._staleness_used is None else clock - self._staleness_used
        self._retire_entries_unusable_at(clock)  # before the flush: not written through for nothing
        if not wait:
            self._flush_async()
            self._clock, self._flushes_this_clock = clock, 0
            self._start_clock(wait_for)  # after every flight so far
            return
        # One hop to the event loop: the flushes, then one RPC that reports
        # the clock and, under SSP, waits for the slowest.
        flights = [f for f in (self._start_flush(n, submit=False) for n in list(self._buffers)) if f is not None]
        reply = self._send_now(flights, report=(clock, wait_for))
        for name in list(self._flights):
            self._finish_flights(name)  # a failed flush raises here (the clock was not reported)
        if reply is None:
            raise RuntimeError(f"{self!r}: clock {clock} was not reported: a flush before it failed")
        self._clock, self._flushes_this_clock = clock, 0
        if isinstance(reply, BaseException):
            raise reply
        m, seconds = reply  # the clock's RPC (with the wait for the slowest), not the flushes
        if wait_for is not None:
            self._clock_wait += seconds
        self._known_min = float("inf") if m is None else max(self._known_min, m)

    def _retire_entries_unusable_at(self, clock: int) -> None:
        """Mark the cached blocks no read at ``clock`` may use (:meth:`_usable`
        there; tags and fetch clocks never grow, so no later read either).
        Marked before the clock's flush, which would otherwise write own
        pushes through into them (LDA's word rows: a pass over every row
        read, each iteration, for a copy read again anyway); they stay until
        replaced, so that a re-read still counts as a refetch. ESSP's
        entries (filled by the servers) are left alone."""
        for name, cache in self._cache.items():
            h = self._router.handles.get(name)
            if h is None or h.spec.consistency.name == "essp":
                continue
            need, refresh = self._required_tag(h, clock), h.spec.consistency.refreshes
            for e in cache.values():
                if not self._usable(e, need, refresh, clock):
                    e.retired = True

    # --- pull ------------------------------------------------------------------------------
    def _required_tag(self, h: TableHandle, clock: int | None = None) -> float | None:
        """Minimum cache tag a read of ``h`` needs now, or at ``clock``
        (None: never wait, ASP)."""
        c = h.spec.consistency
        if isinstance(c, ASP) or c.staleness is None:
            return None
        return (self._clock if clock is None else clock) - c.staleness

    def _usable(self, e: CacheEntry | None, need: float | None, refresh: bool, clock: int | None = None) -> bool:
        """Whether cached entry ``e`` may serve a read that needs tag ``need``
        (at the current clock, or at ``clock``).

        ASP (``need is None``) and ``refresh=True`` tables re-read once per
        clock: the entry must have been fetched in the reader's clock. Bounded
        models need ``tag >= need``."""
        if e is None:
            return False
        clock = self._clock if clock is None else clock
        if need is None:
            return e.clock == clock
        return e.tag >= need and (not refresh or e.clock == clock)

    def _cacheable(self, h: TableHandle) -> bool:
        # VAP reads see the servers directly: a cached copy would hide others'
        # visible updates beyond the value bound.
        return h.spec.consistency.value_bound is None

    @ps_call
    def pull(self, name: str):
        """The whole table, as fresh as its consistency model guarantees,
        including this participant's own pending updates."""
        h = self._handle(name)
        reqs = {b: None for b in range(h.spec.n_blocks)}
        return self._assemble_dense(h, self._read(h, reqs))

    @ps_call
    def pull_rows(self, name: str, rows):
        """Values of ``rows`` (any order, duplicates allowed), as fresh as the
        table's model guarantees, including own pending updates."""
        h, reqs, uniq, inverse = self._row_read(name, rows)
        return self._assemble_rows(h, uniq, inverse, reqs, self._read(h, reqs))

    @ps_call
    def prefetch(self, name: str, for_clock: int | None = None) -> PullHandle:
        """Start reading the whole table; ``handle.result()`` returns what
        :meth:`pull` would return when it is called (ps-lite's ``ZPull``).

        The read goes out in the background while the participant computes.
        ``for_clock``: the clock at which ``result()`` will be called
        (default: the current one); the read then waits, in the background,
        until the table's bound for that clock is met (e.g. the next clock's
        read of a BSP table goes out once every participant reported the
        current one). ``result()`` checks what arrived against the bound of
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
        e = self._cache.get(name, {}).get(b)
        if e is not None and values is e.values:
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
        if buf and self._own_writes_visible(h):
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
        if buf and self._own_writes_visible(h):
            out = buf.overlay_rows(uniq, out, owned=True)
        if inverse is not None:
            out = out[_backend.namespace(out).asarray(inverse)]
        return out

    def _own_unsummed(self, h: TableHandle, b: int, rows, vals, summed_below):
        """``vals`` (block ``b``'s ``rows`` as a server returned them, with
        every per-clock sum of clocks ``< summed_below``) plus this session's
        own sent pushes of later clocks, which the server holds back until
        their clock is complete (aggregate="clock" sum tables)."""
        below = float("inf") if summed_below is None else summed_below
        out = vals
        for clock, by_block in self._sent.get(h.spec.name, ()):
            if clock < below:
                continue
            for prow, pvals in by_block.get(b, ()):
                if out is vals:
                    out = vals.copy()  # never write into a reply's buffer
                add_into(out, rows, prow, pvals)
        return out

    def _drop_summed(self, name: str, floor: float) -> None:
        """Forget own sent pushes of clocks ``< floor``: every server value
        fetched from now on (the run's min clock is ``>= floor``) has them."""
        sent = self._sent.get(name)
        if sent is None or floor <= self._sent_floor.get(name, 0):
            return
        self._sent_floor[name] = floor
        self._sent[name] = [e for e in sent if e[0] >= floor]

    def _read(self, h: TableHandle, reqs: dict[int, np.ndarray | None]) -> dict:
        """Values of ``reqs[block] = local rows or None`` satisfying the bound:
        from the cache when legal, otherwise one request per server."""
        name = h.spec.name
        m = self._metrics[name]
        m.reads += 1
        self._finish_flights(name)  # own flushes in flight: in what is read, and written through to the cache
        if not self._own_writes_visible(h) and self._buffers.get(name):
            self._flush_table(name)  # read-my-writes for optimizer tables: the server computes them
        need = self._required_tag(h)
        cache = self._cache.setdefault(name, {}) if self._cacheable(h) else {}
        refresh = h.spec.consistency.refreshes
        essp = h.spec.consistency.name == "essp"
        if essp:
            self._drain_mailbox()
        out, missing = {}, {}
        for b, rows in reqs.items():
            e = cache.get(b)
            # ASP never waits, but re-reads once per clock: a cache that is
            # never refreshed would satisfy "read-my-writes" and nothing else.
            # refresh=True does the same on top of the bound (see _usable).
            if self._usable(e, need, refresh) and e.covers(rows):
                out[b] = e.take(rows)
            else:
                missing[b] = rows
                if refresh and e is not None and e.tag >= need and e.covers(rows):
                    m.refetches += 1  # plain SSP would have served this from the cache
        if not missing:
            m.cache_hits += 1
            self._record_staleness(m, min(cache[b].tag for b in reqs) if reqs else self._clock)
            return out
        if need is not None:
            # Only when the bound needs it: a refresh=True read of an entry
            # that meets the bound finds _known_min >= its tag >= need.
            self._wait_min(need, m)
        # A valid cached entry missing some rows: fetch only those and merge
        # (the entry keeps the older tag, which both parts satisfy). Otherwise
        # fetch what is asked for and replace the entry.
        fetch, merge = {}, set()
        for b, rows in missing.items():
            e = cache.get(b)
            if self._usable(e, need, refresh) and rows is not None and e.rows is not None:
                fetch[b] = e.missing(rows)
                merge.add(b)
            else:
                fetch[b] = None if self._dense_read(h, b, rows) else rows
        tag = self._known_min
        by_addr: dict[str, list] = {}
        for b, rows in fetch.items():
            by_addr.setdefault(h.primary(b), []).append((b, rows))

        extra = {"run": (self.run_id, None if tag == float("inf") else int(tag))}
        if essp:
            extra["subscribe"] = (self.run_id, self._key, self.worker.address)

        summed_per_clock = self._summed_per_clock(h)
        summed: dict[int, float | None] = {}
        if summed_per_clock:
            extra["summed"] = summed
        got = self._sync(self._router.fetch, name, by_addr, **extra)
        if summed_per_clock:
            self._drop_summed(name, tag)  # the servers applied every clock < tag before answering
        for b, (rows, seq, vals) in got.items():
            m.bytes_pulled += vals.nbytes
            if summed_per_clock:
                vals = self._own_unsummed(h, b, rows, vals, summed.get(b, tag))
            if b in merge:
                e = cache[b].merged(rows, seq, vals)
            else:
                e = CacheEntry(tag, seq, self._clock, rows, vals)
            if self._cacheable(h):
                cache[b] = e
            out[b] = e.take(reqs[b]) if e.rows is not reqs[b] else e.values
        self._record_staleness(m, min([tag] + [cache[b].tag for b in reqs if b in cache]))
        return out

    def _drain_mailbox(self) -> None:
        """ESSP: take the rows servers pushed after clock advances into the
        cache, where they are fresher and include all our own sent writes."""
        box = self._plugin.mailboxes.get(self._key) if self._plugin is not None else None
        while box:
            table, version, tag, blocks, seqs, rows, values, summed = box.popleft()
            cache = self._cache.get(table)
            h = self._router.handles.get(table)
            if cache is None or h is None or h.version != version or self._flights.get(table):
                continue  # (own flushes in flight: the fill may hold them, or not)
            summed_per_clock = self._summed_per_clock(h)
            refresh = h.spec.consistency.refreshes
            # The servers push at an advance of the run's min clock to ``tag``.
            self._known_min = max(self._known_min, tag)
            for b, seq, r, v, below in zip(blocks, seqs, rows, values, summed):
                e = cache.get(b)
                if seq < self._own_seq.get((table, b), 0) or (e is not None and tag <= e.tag):
                    continue
                if summed_per_clock:
                    if below is not None and below < self._sent_floor.get(table, 0):
                        continue  # own pushes it lacks were dropped already: skip it
                    v = self._own_unsummed(h, b, r, v, below)
                if e is not None and seq >= e.seq:
                    clock = e.clock  # at least as new as the copy it replaces
                elif refresh and e is not None and e.clock == self._clock:
                    continue  # older than this clock's server read: keep that
                else:
                    clock = -1  # not a server read of this reader's: refresh=True re-reads it
                cache[b] = CacheEntry(tag, seq, clock, r, v)
                self._metrics[table].eager_fills += 1

    @staticmethod
    def _entry(tag, seq, clock, rows, values) -> CacheEntry:
        return CacheEntry(tag, seq, clock, rows, values)

    def _record_staleness(self, m: TableMetrics, tag: float) -> None:
        # How many clocks behind the reader the guaranteed-visible state is.
        m.staleness[int(max(0, self._clock - min(tag, self._clock)))] += 1


def participant(run_id, rank, n, fn, part, kwargs):
    """Task: one participant of a run (see ``ParameterServer.run``)."""
    secede()  # long-running: free the worker's thread slot
    ctx = Session(run_id, rank, n)
    ctx._join()
    ok = False
    try:
        result = fn(ctx, part, **kwargs)
        ok = True
        return result
    finally:
        ctx._leave(ok)
