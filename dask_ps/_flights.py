"""A session's operations in flight: pushes, clock messages and reads sent
in the background, and the order they keep (:class:`InFlight`, a member of
:class:`dask_ps._session.Session`: ``Session._in_flight``).

ps-lite's ``ZPush``/``ZPull`` and ``Wait`` in Dask terms. Every network
operation of a session is a coroutine on the worker's event loop (Dask's
comm and RPC pools: no thread or network layer of our own). A blocking call
starts it and waits (``Session._sync``); the calls here start it
with ``asyncio.run_coroutine_threadsafe`` and return at once, and the
participant's thread waits only when it needs the result:

* every flush is a :class:`Flight`, queued per table, booked in order when
  acknowledged (the cache's write-through, :mod:`dask_ps._cache`);
  ``ctx.flush(wait=False)`` returns a :class:`PushHandle` of them;
  ``ctx.clock(wait=False)`` also sends the clock's messages in the
  background, after the flushes it follows were acknowledged; blocking
  ``flush()``/``clock()`` send their flights (and the clock) in one hop to
  the event loop;
* ``ctx.prefetch(name)`` / ``ctx.prefetch_rows(name, rows)`` start a read
  and return a :class:`PullHandle`; ``handle.result()`` returns what
  ``ctx.pull``/``pull_rows`` would return at that moment.

What keeps every consistency guarantee (docs/architecture.rst, "Overlap"):

* A write reaches its servers before the writer's clock counts past it:
  a clock is one message per server of the run carrying the clock's
  pushes to that server (``_clock_message``; the servers count the clocks:
  :mod:`dask_ps._runclocks`), sent after every flush started before it was
  acknowledged, and not sent when one failed (its error is raised at the
  next call of the session).
* One table's flushes go out in order, each after the one before was
  acknowledged (rules other than a sum depend on the order), and a read of
  a table waits for that table's flushes in flight, so own writes are in
  what it returns and in the cache before the cache is used.
* A prefetched read is checked when it is consumed, against the bound of
  *that* moment: it was fetched with the tag its server gave each block
  (every update of the clocks below is in it; at least the run's minimum
  known when it was issued); if
  the reader's clock has since moved past what the tag allows (or, under
  ``refresh=True``, past the clock it was issued in), the read is made
  again. Own pushes flushed after it was issued are added to it when the
  reply shows the server had not applied them yet (each reply says which of
  this sender's numbered pushes it holds), or the block is read again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from dask_ps import _backend, _config, _routing
from dask_ps._cache import CacheEntry, ReadCache, add_into
from dask_ps._exceptions import PSError, PSValueError
from dask_ps._oplog import PushBuffer
from dask_ps._participant_state import ClockReports, ParticipantClock, is_summed_per_clock
from dask_ps._routing import TableHandle
from dask_ps._sums import held_first
from dask_ps._transport import Router, _retryable, gather_settled

logger = logging.getLogger(__name__)


@dataclass(eq=False)  # compared by identity (its messages hold arrays)
class Flight:
    """One flush of one table, sent in the background."""

    name: str
    h: TableHandle
    msgs: _routing.Messages
    msg_seq: int  # this sender's number of the push (exactly once; see PullHandle)
    clock: int  # the writer's clock when it was flushed
    buf: PushBuffer
    future: concurrent.futures.Future  # -> {block: sequence number after the push}
    # What is sent where it differs from ``msgs`` (kept dense for the cache
    # and prefetches): values encoded as their nonzeros, and their bound
    # (``Transport.wire_nonzeros``); else None and the buffer's bound.
    wired: dict | None = None
    bound: float | None = None

    def __post_init__(self):
        if self.wired is None:
            self.wired, self.bound = self.msgs, self.buf.bound


class PushHandle:
    """What ``ctx.flush(wait=False)`` returns: the pushes it sent.

    ``wait()`` blocks until the servers acknowledged them (and raises if
    one failed); ``done()`` says whether they did, without blocking. Pushes
    handed over with ``copy=False`` may be written to again once ``wait()``
    returned (or after the next blocking ``flush()``/``clock()``).
    """

    def __init__(self, in_flight: InFlight, flights: list[Flight]):
        self._in_flight = in_flight
        self._flights = flights

    def __repr__(self):
        return f"<PushHandle {sorted({f.name for f in self._flights})} done={self.done()}>"

    def done(self) -> bool:
        return all(f.future.done() for f in self._flights)

    def wait(self) -> None:
        with self._in_flight._api():
            for name in dict.fromkeys(f.name for f in self._flights):
                self._in_flight.finish_flights(name)


@dataclass(eq=False)
class PullHandle:
    """A read started ahead: ``ctx.prefetch(name)`` or
    ``ctx.prefetch_rows(name, rows)``.

    ``result()`` returns what ``ctx.pull``/``pull_rows`` would return at the
    moment it is called: values that satisfy the table's bound *at the
    reader's clock of that moment*, with all of the reader's own updates.
    It uses the prefetched values where they are still legal and reads
    again what is not (see :mod:`dask_ps._flights`). ``done()``: whether the
    prefetched values arrived.
    """

    session: object
    h: TableHandle
    reqs: dict  # block -> local rows (None: whole block), as the read asks
    uniq: np.ndarray | None  # pull_rows: sorted unique rows (None: the whole table)
    inverse: np.ndarray | None
    future: concurrent.futures.Future | None  # -> Router.fetch's reply; None: nothing prefetched
    tag: float = 0.0  # the run's min clock known when the read was sent (all updates below are in it)
    clock: int = 0  # the reader's clock when the read was sent
    for_clock: int = 0  # the clock the read is for (it waited for that clock's bound)
    summed: dict = field(default_factory=dict)  # aggregate="clock": block -> summed_below
    applied: dict = field(default_factory=dict)  # block -> latest own push number in the values
    tags: dict = field(default_factory=dict)  # block -> what its server said the read holds (parked reads)
    flushes: list = field(default_factory=list)  # own Flights of this table started after issue
    read_tags: dict = field(default_factory=dict)  # block -> the tag of what result() returned
    _value: object = None

    def __repr__(self):
        return f"<PullHandle {self.h.spec.name!r} clock={self.clock} done={self.done()}>"

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def block_tag(self, b: int) -> float:
        """Every update of the clocks below this is in block ``b``'s values."""
        t = self.tags.get(b)
        return self.tag if t is None else max(self.tag, t)

    def result(self, with_clocks: bool = False):
        """The values (see the class); ``with_clocks=True``: ``(values,
        clocks)`` as ``Session.pull`` returns them."""
        if self._value is None:
            self._value = self.session._prefetch_result(self)
        if not with_clocks:
            return self._value
        return self._value, self.session._row_clocks(self.h, self.uniq, self.inverse, self.reqs, self.read_tags)


def _check_sums_finite(name: str, msgs) -> None:
    """Every push was checked for NaN/Inf when it was made, and the servers
    trust that check; pushes summed in the buffer are checked again, since a
    sum of finite values can overflow."""
    for items in msgs.values():
        for b, _, vals in items:
            if not _backend.all_finite(vals):
                raise PSValueError(
                    f"table {name!r}: the sum of the pushes buffered since the last flush overflowed to Inf "
                    f"(block {b}); nothing of them was sent, and they were dropped", name)


async def _after(previous: concurrent.futures.Future | None) -> None:
    """Wait for ``previous`` (a flight) to end; its error is raised where it
    is reaped, not here."""
    if previous is not None and not previous.done():
        await asyncio.wait([asyncio.wrap_future(previous)])


def _log_failure(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("dask_ps: a clock report after a placement change failed: %r", task.exception())


async def _result_of(future: concurrent.futures.Future):
    return await asyncio.wrap_future(future)


class InFlight:
    """What a :class:`~dask_ps._session.Session` has in flight, per table
    and in order: flushes (:class:`Flight`), the clock's messages, and
    reads started ahead (:class:`PullHandle`).

    A member of the session (``Session._in_flight``, as ps-lite's
    ``KVWorker`` holds its ``Customer``), handed what it uses: the
    ``router`` (and through it the transport), the participant's clock
    calls (``reports``, a :class:`~dask_ps._participant_state.ClockReports`)
    and clock (``clock``, a
    :class:`~dask_ps._participant_state.ParticipantClock`: the session
    advances it through :meth:`send_clock`, this raises what the servers
    answered), the session's push ``buffers`` and their ``spares``, its
    read ``cache`` and per-table ``metrics`` (objects it shares with the
    session, which never replaces them), and the session's calls onto the
    worker's loop: ``sync`` (run a coroutine and wait), ``submit`` (start
    it), ``wait`` (for one started), and ``api`` (time a public call:
    ``PushHandle.wait``). These four are bound methods of the session,
    not the session: they are the only way in, and they carry its time
    accounting. What a read needs of the session's read path (its handle,
    the cache's rules, the result's assembly) stays there:
    ``Session._prefetch_result`` takes the prefetched blocks from
    :meth:`prefetched` and reads the rest itself.
    """

    def __init__(self, *, router: Router, reports: ClockReports, run_id: str, rank: int, clock: ParticipantClock,
                 buffers: dict, spares: dict, cache: ReadCache, metrics: dict, sync, submit, wait, api):
        self._router, self._reports = router, reports
        self._run_id, self._rank, self._clk = run_id, rank, clock
        self._buffers, self._spares, self._cache, self._metrics = buffers, spares, cache, metrics
        self._sync, self._submit, self._await, self._api = sync, submit, wait, api
        self._closed = False
        self._flights: dict[str, list[Flight]] = {}  # per table, oldest first
        # The clock message in the background: (future, wait_for, clock).
        self._clock_flight: tuple[concurrent.futures.Future, int | None, int] | None = None
        self._prefetches: dict[str, weakref.WeakSet] = {}  # unconsumed PullHandles per table
        # The placement versions the last clock message named (see placement_seen).
        self._claimed_versions: dict[str, int] = {}
        # Reads prefetched for the next clock, sent with its messages: (handle, fetch, need).
        self._deferred: list[tuple[PullHandle, dict, int | None]] = []

    def __repr__(self):
        return f"<InFlight run={self._run_id} rank={self._rank} clock={self._clk.current}>"

    def close(self) -> None:
        """The participant left: a placement change reports no clock any more."""
        self._closed = True

    def has_flights(self, name: str) -> bool:
        return bool(self._flights.get(name))

    # --- flushes ---------------------------------------------------------------------------
    def _start_flush(self, name: str, submit: bool = True) -> Flight | None:
        """Send ``name``'s buffered pushes in the background (after the
        table's flushes in flight); the buffer is this flight's from now on.
        ``submit=False``: only prepare the flight; :meth:`_send_now` sends it."""
        buf = self._buffers.get(name)
        if not buf:
            return None
        del self._buffers[name]
        h = self._router.handles[name]
        msgs = buf.messages(h)
        if buf.summed and not h.spec.allow_nonfinite:
            _check_sums_finite(name, msgs)
        wired, bound = msgs, buf.bound
        if bound is None and self._router.transport.bound_from_nonzeros(h):
            wired, bound = self._router.transport.wire_nonzeros(h, msgs)
        msg_seq = (self._clk.current << 24) + self._clk.flushes
        self._clk.flushes += 1
        flights = self._flights.setdefault(name, [])
        previous = flights[-1].future if flights else None
        if submit:
            future = self._submit(self._send_in_order(previous, name, wired, (self._run_id, self._clk.current),
                                                      msg_seq, bound))
        else:
            future = concurrent.futures.Future()  # set by _send_now
        flight = Flight(name, h, msgs, msg_seq, self._clk.current, buf, future, wired, bound)
        flights.append(flight)
        for handle in self._prefetches.get(name, ()):
            handle.flushes.append(flight)
        return flight

    async def _send_in_order(self, previous, name, msgs, run, msg_seq, bound=None):
        await _after(previous)
        return await self._router.send(name, msgs, run=run, msg_seq=msg_seq, bound=bound)

    def _send_now(self, flights: list[Flight]) -> None:
        """Send prepared flights (``_start_flush(submit=False)``) and wait: one
        hop to the event loop for all of them; their futures are set."""
        calls = []
        for f in flights:
            mine = self._flights[f.name]
            previous = mine[mine.index(f) - 1].future if mine.index(f) > 0 else None
            calls.append(self._send_in_order(previous, f.name, f.wired, (self._run_id, f.clock), f.msg_seq,
                                             f.bound))
        try:
            results = self._sync(gather_settled, calls)
        except BaseException as e:
            for f in flights:
                if not f.future.done():
                    f.future.set_exception(e)
            raise
        for f, r in zip(flights, results):
            if isinstance(r, BaseException):
                f.future.set_exception(r)
            else:
                f.future.set_result(r)

    def finish_flights(self, name: str, block: bool = True) -> None:
        """Book ``name``'s acknowledged flushes, oldest first (``block``: wait
        for all of them). A failed flush raises here; its pushes are lost."""
        flights = self._flights.get(name)
        while flights:
            flight = flights[0]
            if not block and not flight.future.done():
                return
            try:
                seqs = self._await(flight.future)
            finally:
                flights.pop(0)
                if not flights:
                    self._flights.pop(name, None)
            self._flushed(flight, seqs)

    def reap(self) -> None:
        """Book whatever finished in the background (at every call: cheap)."""
        for name in list(self._flights):
            self.finish_flights(name, block=False)
        if self._clock_flight is not None and self._clock_flight[0].done():
            self.finish_clock()

    def flush(self, wait: bool = True) -> PushHandle | None:
        """Send every buffered push: and wait for every flush in flight, or
        (``wait=False``) in the background, returning their handle."""
        if not wait:
            return PushHandle(self, [f for f in map(self._start_flush, list(self._buffers)) if f is not None])
        self._flush_now(list(self._buffers))
        for name in list(self._flights):
            self.finish_flights(name)
        return None

    def _flush_now(self, names) -> None:
        """Send the buffered pushes of tables ``names`` and wait (one hop)."""
        flights = [f for f in (self._start_flush(n, submit=False) for n in names) if f is not None]
        if flights:
            self._send_now(flights)
        for name in {f.name for f in flights}:
            self.finish_flights(name)

    def flush_table(self, name: str) -> None:
        """Send ``name``'s buffered pushes and wait for them."""
        self._flush_now([name])
        self.finish_flights(name)

    def _flushed(self, flight: Flight, seqs: dict[int, int]) -> None:
        """Book an acknowledged flush (the participant's thread, in order):
        metrics, own writes into the cache, and the buffer's memory back."""
        name, h, msgs = flight.name, flight.h, flight.msgs
        m = self._metrics[name]
        m.flushes += 1
        m.bytes_pushed += sum(v.nbytes for items in msgs.values() for _, _, v in items)
        self._cache.write_through(name, msgs, seqs, self._clk.own_writes_visible(h, flight.clock))
        recorded = is_summed_per_clock(h)
        if recorded:
            # Kept until summed everywhere: never the caller's array (copy=False).
            self._cache.record_sent(name, flight.clock, msgs, flight.buf.borrowed)
        spare = flight.buf.spare_after_send
        if spare is not None and spare is flight.buf.dense and (
                recorded or any(flight in p.flushes for p in self._prefetches.get(name, ()))):
            # Its values are still read: as own pushes a clock's sum lacks
            # (record_sent), or by a prefetch they may be missing from
            # (_own_missed). The next push's copy would overwrite them.
            spare = None
        if spare is not None:
            self._spares[name] = spare  # sent and applied: reuse its memory next time

    # --- clock -------------------------------------------------------------------------
    def send_clock(self, clock: int, wait_for: int | None, wait: bool = True) -> None:
        """Count ``clock``: one message per server (issue 36) with this
        clock's pushes there and the clock; under SSP the one to this
        worker's server also waits until the slowest reached ``wait_for``.
        The flushes in the background are acknowledged first. ``wait=False``:
        the clock advances now and its messages are waited for at the next
        ``finish_clock`` (the next clock, or a read that needs it)."""
        flights = [f for f in (self._start_flush(n, submit=False) for n in list(self._buffers)) if f is not None]
        others = [f.future for fl in self._flights.values() for f in fl if f not in flights]
        reads, self._deferred = self._deferred, []  # prefetched for this clock: carried by its messages
        future = self._submit(self._clock_message(flights, others, clock, wait_for, reads))
        if not wait:
            self._clk.advance(clock)
            self._clock_flight = (future, wait_for, clock)
            return
        m, seconds = self._clock_reply(future)
        for name in list(self._flights):
            self.finish_flights(name)
        self._clk.advance(clock)
        self._clk.settled = clock
        if wait_for is not None:
            self._clk.wait_seconds += seconds
        self._clk.learn_min(m)

    async def _report_clock(self, pending, clock: int, wait_for):
        if pending:
            done, _ = await asyncio.wait([asyncio.wrap_future(f) for f in pending])
            if any(f.exception() is not None for f in done):
                # A write that did not reach its server: the clock must not count.
                raise RuntimeError(f"clock {clock} not reported: a flush before it failed")
        t0 = time.perf_counter()
        m = await self._reports.to_servers("run_clock", clock=clock, wait_for=wait_for)
        return m, time.perf_counter() - t0

    # --- one message per server per clock (issue 36) ------------------------------------
    def _combinable(self, flights: list[Flight]) -> list | None:
        """The parts of ``flights`` as ``run_clock`` carries them, or None
        where one must go as pushes of its own (a push over several
        servers held first, without a lease: ``Router.send``)."""
        parts = []
        for f in flights:
            lease = False
            if len(f.msgs) > 1 and held_first(f.h.spec):
                if not self._router._leased(f.h, f.wired, f.bound):
                    return None
                lease = True
            parts.append((f, lease))
        return parts

    async def _clock_message(self, flights: list[Flight], others, clock: int, wait_for, reads=()):
        """Send every server of the run one message: this clock's pushes to
        it (``flights``, prepared, not sent) and ``clock``; the reply is the
        acknowledgement. The flushes in the background (``others``) are
        acknowledged first: a server counts the clock only after all of
        them. Where a part fails, every flight is sent again as pushes
        (numbered: applied once) and the clock reported after them
        (``_report_clock``). ``reads``: the next clock's reads prefetched
        (``_deferred``), made by their primaries after the clock counted
        there (parked until their bound holds), or sent as reads of their
        own where the message cannot carry them. Sets the flights' and the
        reads' futures; returns the clock's ``(min clock, seconds)``."""
        reads = [r for r in reads if not r[0].future.done()]
        try:
            if others:
                done, _ = await asyncio.wait([asyncio.wrap_future(f) for f in others])
                if any(f.exception() is not None for f in done):
                    raise RuntimeError(f"clock {clock} not reported: a flush before it failed")
            t0 = time.perf_counter()
            parts = self._combinable(flights)
            servers, waiter = await self._reports.live_servers()
            if parts is None or not servers or any(a not in servers for f in flights for a in f.msgs):
                self._read_apart(reads)
                return await self._clock_by_pushes(flights, clock, wait_for)
            versions = {n: h.version for n, h in self._router.handles.items()}
            self._claimed_versions = dict(versions)
            by_server = {a: [] for a in servers}
            for f, lease in parts:
                for addr, items in f.wired.items():
                    by_server[addr].append((f, items, lease))
            by_read = self._reads_by_server(reads, servers, clock)
            seconds, clock_s = _config.get_seconds("timeouts.rpc"), _config.get_seconds("timeouts.clock")
            calls = [self._router.transport.clock_message(
                addr, seconds + (clock_s if (addr == waiter and wait_for is not None) or by_read.get(addr) else 0),
                [(f.h, items, (self._run_id, f.clock), self._router.sender, f.msg_seq, f.bound, lease)
                 for f, items, lease in ps],
                reads=[(p.h, es, extra) for p, es, extra in by_read.get(addr, ())],
                run_id=self._run_id, rank=self._rank, clock=clock, versions=versions,
                wait_for=wait_for if addr == waiter else None, timeout=clock_s)
                for addr, ps in by_server.items()]
            replies = await gather_settled(calls)
            if any(isinstance(r, BaseException) for r in replies):
                failed = next(r for r in replies if isinstance(r, BaseException))
                self._read_apart(reads)
                if isinstance(failed, PSError) and not _retryable(failed):
                    raise failed
                logger.debug("dask_ps: %r: clock %d's message failed (%r); sent again as pushes", self, clock, failed)
                return await self._clock_by_pushes(flights, clock, wait_for)
            self._reads_answered(reads, by_read, dict(zip(by_server, replies)))
            seqs: dict[int, dict] = {id(f): {} for f in flights}
            for (addr, ps), reply in zip(by_server.items(), replies):
                for (f, items, lease), got in zip(ps, reply["seqs"]):
                    got = self._router._lease_reply(f.h, addr, got) if lease else got
                    mine = seqs[id(f)]
                    for (b, *_), sq in zip(items, got):
                        mine[b] = max(mine.get(b, 0), sq)
            for f in flights:
                f.future.set_result(seqs[id(f)])
            self._clk.settled = max(self._clk.settled, clock)
            if any(h.version > versions.get(n, h.version) for n, h in self._router.handles.items()):
                # A placement seen while this message was in flight (see placement_seen).
                task = asyncio.ensure_future(self._reports.to_servers("run_clock", clock=clock))
                task.add_done_callback(_log_failure)
            m = max([math.inf if r["min"] is None else r["min"] for r in replies], default=0)
            return m, time.perf_counter() - t0
        except BaseException as e:
            for f in flights:
                if not f.future.done():
                    f.future.set_exception(e)
            for p, _, _ in reads:
                if not p.future.done():
                    p.future.set_exception(e)  # read again at result()
            raise

    def _reads_by_server(self, reads, servers, clock: int) -> dict:
        """The prefetched reads a clock message carries, by server: each
        block at its primary (where the clock's claim counts for it); a
        read with a block elsewhere is sent on its own (``_read_apart``)."""
        by_read: dict[str, list] = {}
        apart = []
        for p, fetch, need_at in reads:
            by_addr: dict[str, list] = {}
            for b, rows in fetch.items():
                by_addr.setdefault(p.h.primary(b), []).append((b, rows))
            if any(a not in servers for a in by_addr):
                apart.append((p, fetch, need_at))
                continue
            # Read in the clock it is for, after this participant's clock counted there.
            p.tag, p.clock = max(p.tag, self._clk.known_min), clock
            extra = {"run": (self._run_id, None if p.tag == math.inf else int(p.tag)), "sender": self._router.sender}
            if need_at is not None and p.tag < need_at:
                extra["wait"] = int(need_at)
            for a, es in by_addr.items():
                by_read.setdefault(a, []).append((p, es, extra))
        self._read_apart(apart)
        return by_read

    def _reads_answered(self, reads, by_read: dict, replies: dict) -> None:
        """Hand each carried read its blocks (as ``Router.fetch`` returns
        them); one a server could not make is read again on its own."""
        got: dict[int, dict] = {id(p): {} for p, _, _ in reads}
        failed: set[int] = set()
        for addr, entries in by_read.items():
            answers = replies[addr].get("reads") or []
            for (p, es, _), r in zip(entries, answers):
                if not isinstance(r, dict) or "error" in r:
                    failed.add(id(p))
                    continue
                out = got[id(p)]
                for (b, rows), seq, vals in zip(es, r["seqs"], r["values"]):
                    out[b] = (rows, seq, vals)
                for key, into in (("summed_below", p.summed), ("applied", p.applied)):
                    if r.get(key) is not None:
                        into.update(zip((b for b, _ in es), r[key]))
                if r.get("tag") is not None:
                    p.tags.update((b, r["tag"]) for b, _ in es)
        apart = []
        for p, fetch, need_at in reads:
            if id(p) in failed or len(got[id(p)]) < len(fetch):
                apart.append((p, fetch, need_at))
            elif not p.future.done():
                p.future.set_result(got[id(p)])
        self._read_apart(apart)

    def _read_apart(self, reads) -> None:
        """Prefetched reads a clock message did not carry: sent on their own."""
        for p, fetch, need_at in reads:
            if p.future.done():
                continue

            async def read(p=p, fetch=fetch, need_at=need_at):
                try:
                    got = await self._fetch_ahead(None, p, fetch, need_at)
                except BaseException as e:  # read again at result()
                    if not p.future.done():
                        p.future.set_exception(e)
                    return
                if not p.future.done():
                    p.future.set_result(got)

            asyncio.ensure_future(read())

    def placement_seen(self, h: TableHandle) -> None:
        """(The router's ``on_handle``, on the event loop.) A newer placement
        of a table than this session's last clock message named: the servers
        count that message's clock for their blocks of that table no more
        (``RunRecord.bound``) but run-wide, one clock behind, and a read
        parked on it would wait for this participant's next message. So the
        clock every push before is acknowledged for goes to every server now
        (once per placement change)."""
        sent = self._claimed_versions.get(h.spec.name)
        if sent is not None and h.version > sent and not self._closed:
            self._claimed_versions[h.spec.name] = h.version
            task = asyncio.ensure_future(self._reports.to_servers("run_clock", clock=self._clk.settled))
            task.add_done_callback(_log_failure)

    async def _clock_by_pushes(self, flights: list[Flight], clock: int, wait_for):
        """The clock as pushes, then a report after them (every server)."""
        self._router.transport.clock_passed(self._rank, clock)  # no section of it: siblings wait for none
        results = await gather_settled([self._router.send(f.name, f.wired, run=(self._run_id, f.clock),
                                                          msg_seq=f.msg_seq, bound=f.bound) for f in flights])
        for f, r in zip(flights, results):
            if isinstance(r, BaseException):
                f.future.set_exception(r)
            else:
                f.future.set_result(r)
        return await self._report_clock([f.future for f in flights], clock, wait_for)

    def _clock_reply(self, future):
        """The reply of a clock's messages; on an error every flight is
        booked first, so that a failed flush raises its own error."""
        try:
            return self._await(future)
        except Exception:
            for name in list(self._flights):
                self.finish_flights(name)
            raise

    def finish_clock(self) -> None:
        """Wait for the clock reported in the background (flush errors first)."""
        if self._clock_flight is None:
            return
        future, wait_for, clock = self._clock_flight
        self._clock_flight = None
        t0 = time.perf_counter()
        m, _ = self._clock_reply(future)
        if wait_for is not None:
            self._clk.wait_seconds += time.perf_counter() - t0
        self._clk.settled = max(self._clk.settled, clock)
        self._clk.learn_min(m)

    def finish_all(self) -> None:
        for name in list(self._flights):
            self.finish_flights(name)
        self.finish_clock()

    def abandon(self) -> None:
        """The participant failed: let the flushes in flight end (their
        errors are not the failure's cause) and send no clock any more."""
        if self._clock_flight is not None:
            self._clock_flight[0].cancel()  # may wait for the others: not after an error
            self._clock_flight = None
        for name in list(self._flights):
            while self._flights.get(name):
                try:
                    self.finish_flights(name)
                except Exception as e:
                    logger.debug("dask_ps: %r: a flush failed after an error: %r", self, e)

    def cancel_prefetches(self) -> None:
        """The participant ends: reads started and never consumed stop."""
        self._deferred.clear()
        for handles in self._prefetches.values():
            for p in list(handles):
                if p.future is not None:
                    p.future.cancel()
        self._prefetches.clear()

    # --- prefetch ------------------------------------------------------------------------
    def read_ahead(self, p: PullHandle, fetch: dict, need_at: int | None) -> None:
        """Start the read ``p`` needs from the servers (``fetch``: block ->
        local rows or None; the session left to its cache what a cached copy
        serves): parked until their bound for ``need_at`` holds. A read for
        the next clock goes with that clock's messages."""
        name = p.h.spec.name
        if p.for_clock == self._clk.current + 1:
            # The next clock's read goes with that clock's messages (one
            # message per server per clock: _clock_message).
            p.future = concurrent.futures.Future()
            self._deferred.append((p, fetch, need_at))
        else:
            flights = self._flights.get(name)
            p.future = self._submit(self._fetch_ahead(flights[-1].future if flights else None, p, fetch, need_at))
        self._prefetches.setdefault(name, weakref.WeakSet()).add(p)

    async def _fetch_ahead(self, previous, p: PullHandle, fetch: dict, need_at):
        """On the event loop: wait (for the table's flushes in flight, and for
        the bound of the clock the read is for), then read."""
        await _after(previous)  # own flushes in flight are in what it reads
        # What the reply is: a server read in the reader's clock of now, with
        # every update of the clocks below the min clock known now, or (a
        # read parked at its servers until their bound for the clock it is
        # for holds) below what each server says (``p.tags``).
        p.tag, p.clock = max(p.tag, self._clk.known_min), self._clk.current
        extra = {}
        if need_at is not None and p.tag < need_at:
            extra["wait"], extra["replicas"] = int(need_at), False  # at the primaries (see Session._read)
        by_addr: dict[str, list] = {}
        for b, rows in fetch.items():
            by_addr.setdefault(p.h.primary(b), []).append((b, rows))
        run = (self._run_id, None if p.tag == float("inf") else int(p.tag))
        return await self._router.fetch(p.h.spec.name, by_addr, summed=p.summed, applied=p.applied, run=run,
                                        tags=p.tags, sender=self._router.sender, **extra)

    def prefetched(self, h: TableHandle, p: PullHandle) -> dict:
        """The blocks ``p`` prefetched that may serve its read now (``h``:
        the table's handle now), own writes added; the session reads the
        rest. Own flushes of the table are booked already."""
        self._prefetches.get(h.spec.name, weakref.WeakSet()).discard(p)
        if p.for_clock > self._clk.current and not p.future.done():
            # Read before the clock it was for: its fetch may wait for
            # this very participant's clock; read now instead.
            self._deferred = [d for d in self._deferred if d[0] is not p]
            return {}
        try:
            got = self._await(p.future)
        except Exception as e:  # read again by the session: it raises if the cause persists
            logger.debug("dask_ps: prefetch of %r failed (%r); reading again", h.spec.name, e)
            return {}
        return self._take_prefetched(h, p, got)

    def _prefetch_fresh(self, h: TableHandle, p: PullHandle) -> bool:
        """Whether values fetched as ``p`` was issued may serve a read now."""
        if h.version != p.h.version or h.spec.table_id != p.h.spec.table_id:
            return False
        if self._clk.current in self._clk.resumed:
            return False  # reads what the servers have: see ParticipantClock.own_writes_visible
        if not h.spec.rule.additive and (p.flushes or self._buffers.get(h.spec.name)):
            return False  # the servers compute own writes of other rules: read them there
        need = self._clk.required_tag(h)
        if need is None:  # ASP: read-my-writes only; fetched in this clock or the one before
            return p.clock >= self._clk.current - 1
        tag = min([p.block_tag(b) for b in p.tags] or [p.tag])
        return tag >= need and (not h.spec.consistency.refreshes or p.clock == self._clk.current)

    def _take_prefetched(self, h: TableHandle, p: PullHandle, got: dict) -> dict:
        """The prefetched blocks that may serve the read now, with own writes
        added where the servers had not applied them yet; cached where the
        cache holds nothing usable."""
        if not got or not self._prefetch_fresh(h, p):
            return {}
        name = h.spec.name
        summed_per_clock = is_summed_per_clock(h)
        if summed_per_clock:
            self._cache.drop_summed(name, p.tag)  # the servers applied every clock < tag before answering
        need, refresh = self._clk.required_tag(h), h.spec.consistency.refreshes
        cache = self._cache.table(name)
        out = {}
        for b, (rows, seq, vals) in got.items():
            self._metrics[name].bytes_pulled += vals.nbytes
            if summed_per_clock:
                below = p.summed.get(b, p.tag)
                if self._cache.forgotten(name, below):
                    continue  # own pushes it lacks were forgotten already: read again
                vals = self._cache.own_unsummed(name, b, rows, vals, below)
            else:
                vals = self._own_missed(p, b, rows, vals)
                if vals is None:
                    continue
            e = CacheEntry(p.block_tag(b), seq, p.clock, rows, vals)
            if not self._cache.usable(cache.get(b), need, refresh, self._clk.current):
                cache[b] = e
            out[b] = e.take(p.reqs[b]) if rows is not p.reqs[b] else e.values
        return out

    def _own_missed(self, p: PullHandle, b: int, rows, vals):
        """``vals`` plus this session's pushes to block ``b`` flushed after
        ``p`` was issued that the servers had not applied when they read it
        (its reply holds ``applied``: this sender's latest push number in
        the block). None: such a push was the caller's array (``copy=False``),
        which it may have changed since: read again."""
        applied = p.applied.get(b)
        out = vals
        for f in p.flushes:
            if applied is not None and f.msg_seq <= applied:
                continue  # in the values (one table's flushes are applied in order)
            items = [(r, v) for its in f.msgs.values() for bb, r, v in its if bb == b]
            if not items:
                continue
            if f.buf.borrowed:
                return None
            if out is vals:
                out = vals.copy()  # never write into a reply's buffer
            for prow, pvals in items:
                add_into(out, rows, prow, pvals)
        return out
