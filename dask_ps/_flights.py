"""A session's operations in flight: pushes, clock reports and reads sent
in the background, and the order they keep (:class:`InFlight`, the part of
:class:`dask_ps._session.Session` that owns them).

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
from distributed.comm import CommClosedError

from dask_ps import _backend, _config, _routing
from dask_ps._cache import CacheEntry, add_into
from dask_ps._exceptions import PSError, PSValueError
from dask_ps._liveness import WorkerGone
from dask_ps._oplog import PushBuffer
from dask_ps._routing import TableHandle
from dask_ps._sums import held_first
from dask_ps._transport import _retryable, gather_settled

_GONE = object()  # a server that left the cluster while a clock call was made to it

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


class PushHandle:
    """What ``ctx.flush(wait=False)`` returns: the pushes it sent.

    ``wait()`` blocks until the servers acknowledged them (and raises if
    one failed); ``done()`` says whether they did, without blocking. Pushes
    handed over with ``copy=False`` may be written to again once ``wait()``
    returned (or after the next blocking ``flush()``/``clock()``).
    """

    def __init__(self, session, flights: list[Flight]):
        self._session = session
        self._flights = flights

    def __repr__(self):
        return f"<PushHandle {sorted({f.name for f in self._flights})} done={self.done()}>"

    def done(self) -> bool:
        return all(f.future.done() for f in self._flights)

    def wait(self) -> None:
        with self._session._api():
            for name in dict.fromkeys(f.name for f in self._flights):
                self._session._finish_flights(name)


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
    _value: object = None

    def __repr__(self):
        return f"<PullHandle {self.h.spec.name!r} clock={self.clock} done={self.done()}>"

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def block_tag(self, b: int) -> float:
        """Every update of the clocks below this is in block ``b``'s values."""
        t = self.tags.get(b)
        return self.tag if t is None else max(self.tag, t)

    def result(self):
        if self._value is None:
            self._value = self.session._prefetch_result(self)
        return self._value


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
    and in order: flushes (:class:`Flight`), the clock's report, and reads
    started ahead (:class:`PullHandle`).

    A part of ``Session`` (its base class): it uses the session's
    connection (``_router``, ``_scheduler``, ``_sync``, ``_submit``,
    ``_await``, ``_api``), clock (``_clock``, ``_known_min``,
    ``_flushes_this_clock``), push buffers (``_buffers``, ``_spares``),
    cache (``_cache``, a :class:`~dask_ps._cache.ReadCache`), read path
    (``_read``, ``_handle``, ``_assemble_*``, ``_dense_read``) and metrics.
    """

    def _init_flights(self) -> None:
        self._flights: dict[str, list[Flight]] = {}  # per table, oldest first
        # The clock message in the background: (future, wait_for, clock).
        self._clock_flight: tuple[concurrent.futures.Future, int | None, int] | None = None
        self._prefetches: dict[str, weakref.WeakSet] = {}  # unconsumed PullHandles per table
        # Every own push of the clocks below is acknowledged by every server.
        self._settled = 0
        # The placement versions the last clock message named (see _placement_seen).
        self._claimed_versions: dict[str, int] = {}
        # Reads prefetched for the next clock, sent with its messages: (handle, fetch, need).
        self._deferred: list[tuple[PullHandle, dict, int | None]] = []

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
        msg_seq = (self._clock << 24) + self._flushes_this_clock
        self._flushes_this_clock += 1
        flights = self._flights.setdefault(name, [])
        previous = flights[-1].future if flights else None
        if submit:
            future = self._submit(self._send_in_order(previous, name, msgs, (self.run_id, self._clock), msg_seq,
                                                      buf.bound))
        else:
            future = concurrent.futures.Future()  # set by _send_now
        flight = Flight(name, h, msgs, msg_seq, self._clock, buf, future)
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
            calls.append(self._send_in_order(previous, f.name, f.msgs, (self.run_id, f.clock), f.msg_seq,
                                             f.buf.bound))
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

    def _finish_flights(self, name: str, block: bool = True) -> None:
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

    def _reap(self) -> None:
        """Book whatever finished in the background (at every call: cheap)."""
        for name in list(self._flights):
            self._finish_flights(name, block=False)
        if self._clock_flight is not None and self._clock_flight[0].done():
            self._finish_clock()

    def _flush_async(self) -> PushHandle:
        return PushHandle(self, [f for f in map(self._start_flush, list(self._buffers)) if f is not None])

    def _flush_now(self, names) -> None:
        """Send the buffered pushes of tables ``names`` and wait (one hop)."""
        flights = [f for f in (self._start_flush(n, submit=False) for n in names) if f is not None]
        if flights:
            self._send_now(flights)
        for name in {f.name for f in flights}:
            self._finish_flights(name)

    def _flush_table(self, name: str) -> None:
        """Send ``name``'s buffered pushes and wait for them."""
        self._flush_now([name])
        self._finish_flights(name)

    def _flushed(self, flight: Flight, seqs: dict[int, int]) -> None:
        """Book an acknowledged flush (the participant's thread, in order):
        metrics, own writes into the cache, and the buffer's memory back."""
        name, h, msgs = flight.name, flight.h, flight.msgs
        m = self._metrics[name]
        m.flushes += 1
        m.bytes_pushed += sum(v.nbytes for items in msgs.values() for _, _, v in items)
        self._cache.write_through(name, msgs, seqs, self._own_writes_visible(h, flight.clock))
        recorded = self._summed_per_clock(h)
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
    async def _report_clock(self, pending, clock: int, wait_for):
        if pending:
            done, _ = await asyncio.wait([asyncio.wrap_future(f) for f in pending])
            if any(f.exception() is not None for f in done):
                # A write that did not reach its server: the clock must not count.
                raise RuntimeError(f"clock {clock} not reported: a flush before it failed")
        t0 = time.perf_counter()
        m = await self._to_servers("run_clock", clock=clock, wait_for=wait_for)
        return m, time.perf_counter() - t0

    async def _to_servers(self, op: str, clock: int, wait_for=None) -> float:
        """Report ``clock`` to every server of the run (``op="run_clock"``;
        the servers count the clocks, issue 36), or park until the run's
        minimum reaches ``clock`` (``op="run_wait"``). A wait (``wait_for``
        of a report, SSP) goes to one server: this worker's own if it is
        one (no message), since any server's minimum bounds the whole run's
        (``_runclocks``). Returns the highest minimum a server answered."""
        rec = await self._plugin.runs.get(self.run_id)
        me, dead = self.worker.address, self._router.transport.liveness.dead
        servers = [a for a in rec.servers if a not in dead] or [me]
        waiter = me if me in servers else servers[0]
        if op == "run_clock":
            targets = servers
            calls = [self._to_server(a, op, clock=clock, wait_for=wait_for if a == waiter else None, rank=self.rank)
                     for a in servers]
            need = wait_for
        else:
            targets, calls, need = [waiter], [self._to_server(waiter, op, clock=clock)], clock
        results = await gather_settled(calls)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        m = max([math.inf if r is None else r for r in results if r is not _GONE], default=0)
        if need is not None and results[targets.index(waiter)] is _GONE:  # it left: wait at another
            m = max(m, await self._to_servers("run_wait", clock=need))
        return m

    async def _run_wide_clock(self) -> int:
        """The highest run-wide clock a server of the run has of this
        participant (a retried one resumes there: every push before it is
        on every server)."""
        rec = await self._plugin.runs.get(self.run_id)
        dead = self._router.transport.liveness.dead
        got = await gather_settled([self._router.transport.run_call(a, "run_clocks", _config.get_seconds("timeouts.rpc"),
                                                                    run_id=self.run_id)
                                    for a in rec.servers if a not in dead])
        return max([int(g["clocks"][self.rank]) for g in got if isinstance(g, dict) and g.get("clocks")], default=0)

    async def _to_server(self, addr: str, op: str, **msg):
        """One clock call, retried until it is answered, the server leaves
        (``_GONE``) or ``ps.timeouts.failover`` passes: a live server that
        missed a clock would hold every read that waits on it."""
        clock_timeout, rpc_timeout = _config.get_seconds("timeouts.clock"), _config.get_seconds("timeouts.rpc")
        waits = op == "run_wait" or msg.get("wait_for") is not None
        seconds = clock_timeout + rpc_timeout if waits else rpc_timeout
        deadline = time.monotonic() + _config.get_seconds("timeouts.failover")
        delay = 0.02
        while True:
            try:
                return await self._router.transport.run_call(addr, op, seconds, run_id=self.run_id,
                                                              timeout=clock_timeout, **msg)
            except WorkerGone:
                return _GONE
            except PSError:  # the server's answer (a timeout of the wait, an aborted run): no retry
                raise
            except (OSError, CommClosedError, TimeoutError) as e:  # a connection lost or slow: again
                if addr in self._router.transport.liveness.dead:
                    return _GONE
                if time.monotonic() > deadline:
                    raise PSError(f"{self!r}: server {addr} did not answer its {op} for "
                                  f"ps.timeouts.failover: {e!r}") from e
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.5)

    # --- one message per server per clock (issue 36) ------------------------------------
    def _combinable(self, flights: list[Flight]) -> list | None:
        """The parts of ``flights`` as ``run_clock`` carries them, or None
        where one must go as pushes of its own (a push over several
        servers held first, without a lease: ``Router.send``)."""
        parts = []
        for f in flights:
            lease = False
            if len(f.msgs) > 1 and held_first(f.h.spec):
                if not self._router._leased(f.h, f.msgs, f.buf.bound):
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
            rec = await self._plugin.runs.get(self.run_id)
            me, dead = self.worker.address, self._router.transport.liveness.dead
            servers = [a for a in rec.servers if a not in dead]
            if parts is None or not servers or any(a not in servers for f in flights for a in f.msgs):
                self._read_apart(reads)
                return await self._clock_by_pushes(flights, clock, wait_for)
            waiter = me if me in servers else servers[0]
            versions = {n: h.version for n, h in self._router.handles.items()}
            self._claimed_versions = dict(versions)
            by_server = {a: [] for a in servers}
            for f, lease in parts:
                for addr, items in f.msgs.items():
                    by_server[addr].append((f, items, lease))
            by_read = self._reads_by_server(reads, servers, clock)
            seconds, clock_s = _config.get_seconds("timeouts.rpc"), _config.get_seconds("timeouts.clock")
            calls = [self._router.transport.clock_message(
                addr, seconds + (clock_s if (addr == waiter and wait_for is not None) or by_read.get(addr) else 0),
                [(f.h, items, (self.run_id, f.clock), self._router.sender, f.msg_seq, f.buf.bound, lease)
                 for f, items, lease in ps],
                reads=[(p.h, es, extra) for p, es, extra in by_read.get(addr, ())],
                run_id=self.run_id, rank=self.rank, clock=clock, versions=versions,
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
            self._settled = max(self._settled, clock)
            if any(h.version > versions.get(n, h.version) for n, h in self._router.handles.items()):
                # A placement seen while this message was in flight (see _placement_seen).
                asyncio.ensure_future(self._to_servers("run_clock", clock=clock)).add_done_callback(_log_failure)
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
            p.tag, p.clock = max(p.tag, self._known_min), clock
            extra = {"run": (self.run_id, None if p.tag == math.inf else int(p.tag)), "sender": self._router.sender}
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

    def _placement_seen(self, h: TableHandle) -> None:
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
            task = asyncio.ensure_future(self._to_servers("run_clock", clock=self._settled))
            task.add_done_callback(_log_failure)

    async def _clock_by_pushes(self, flights: list[Flight], clock: int, wait_for):
        """The clock as pushes, then a report after them (every server)."""
        results = await gather_settled([self._router.send(f.name, f.msgs, run=(self.run_id, f.clock),
                                                          msg_seq=f.msg_seq, bound=f.buf.bound) for f in flights])
        for f, r in zip(flights, results):
            if isinstance(r, BaseException):
                f.future.set_exception(r)
            else:
                f.future.set_result(r)
        return await self._report_clock([f.future for f in flights], clock, wait_for)

    def _finish_clock(self) -> None:
        """Wait for the clock reported in the background (flush errors first)."""
        if self._clock_flight is None:
            return
        future, wait_for, clock = self._clock_flight
        self._clock_flight = None
        t0 = time.perf_counter()
        try:
            m, _ = self._await(future)
        except Exception:
            for name in list(self._flights):
                self._finish_flights(name)  # a failed flush raises its own error first
            raise
        if wait_for is not None:
            self._clock_wait += time.perf_counter() - t0
        self._settled = max(self._settled, clock)
        self._known_min = float("inf") if m is None else max(self._known_min, m)

    def _finish_all(self) -> None:
        for name in list(self._flights):
            self._finish_flights(name)
        self._finish_clock()

    def _cancel_prefetches(self) -> None:
        """The participant ends: reads started and never consumed stop."""
        self._deferred.clear()
        for handles in self._prefetches.values():
            for p in list(handles):
                if p.future is not None:
                    p.future.cancel()
        self._prefetches.clear()

    # --- prefetch ------------------------------------------------------------------------
    def _prefetch(self, h: TableHandle, reqs: dict, uniq, inverse, for_clock: int | None) -> PullHandle:
        """Start reading ``reqs`` (block -> local rows or None) for a read at
        clock ``for_clock`` (None: now). Blocks a cached copy serves now are
        left to the cache; value-bounded tables are read at ``result()``."""
        name = h.spec.name
        for_clock = self._clock if for_clock is None else for_clock
        if not isinstance(for_clock, int) or isinstance(for_clock, bool) or for_clock < self._clock:
            raise ValueError(f"table {name!r}: for_clock must be a clock >= the current one ({self._clock}), "
                             f"got {for_clock!r}")
        handle = PullHandle(self, h, reqs, uniq, inverse, None, tag=self._known_min, clock=self._clock,
                            for_clock=for_clock)
        if not self._cacheable(h) or not reqs:
            return handle
        need, refresh = self._required_tag(h), h.spec.consistency.refreshes
        cache = self._cache.blocks.get(name, {})
        fetch = {}
        for b, rows in reqs.items():
            e = cache.get(b)
            if not (for_clock == self._clock and self._cache.usable(e, need, refresh, self._clock)
                    and e.covers(rows)):
                fetch[b] = None if self._dense_read(h, b, rows) else rows
        if fetch:
            s = h.spec.consistency.staleness
            need_at = None if need is None else for_clock - s
            flights = self._flights.get(name)
            if for_clock == self._clock + 1:
                # The next clock's read goes with that clock's messages (one
                # message per server per clock: _clock_message).
                handle.future = concurrent.futures.Future()
                self._deferred.append((handle, fetch, need_at))
            else:
                handle.future = self._submit(self._fetch_ahead(
                    flights[-1].future if flights else None, handle, fetch, need_at))
            self._prefetches.setdefault(name, weakref.WeakSet()).add(handle)
        return handle

    async def _fetch_ahead(self, previous, p: PullHandle, fetch: dict, need_at):
        """On the event loop: wait (for the table's flushes in flight, and for
        the bound of the clock the read is for), then read."""
        await _after(previous)  # own flushes in flight are in what it reads
        # What the reply is: a server read in the reader's clock of now, with
        # every update of the clocks below the min clock known now, or (a
        # read parked at its servers until their bound for the clock it is
        # for holds) below what each server says (``p.tags``).
        p.tag, p.clock = max(p.tag, self._known_min), self._clock
        extra = {}
        if need_at is not None and p.tag < need_at:
            extra["wait"], extra["replicas"] = int(need_at), False  # at the primaries (see Session._read)
        by_addr: dict[str, list] = {}
        for b, rows in fetch.items():
            by_addr.setdefault(p.h.primary(b), []).append((b, rows))
        run = (self.run_id, None if p.tag == float("inf") else int(p.tag))
        return await self._router.fetch(p.h.spec.name, by_addr, summed=p.summed, applied=p.applied, run=run,
                                        tags=p.tags, sender=self._router.sender, **extra)

    def _prefetch_result(self, p: PullHandle):
        with self._api():
            self._reap()
            name = p.h.spec.name
            h = self._handle(name)
            self._finish_flights(name)  # own writes in flight: booked (write-through, own sent pushes)
            parts = {}
            if p.future is not None:
                self._prefetches.get(name, weakref.WeakSet()).discard(p)
                if p.for_clock > self._clock and not p.future.done():
                    # Read before the clock it was for: its fetch may wait for
                    # this very participant's clock; read now instead.
                    self._deferred = [d for d in self._deferred if d[0] is not p]
                    got = {}
                else:
                    try:
                        got = self._await(p.future)
                    except Exception as e:  # read again below: it raises if the cause persists
                        logger.debug("dask_ps: prefetch of %r failed (%r); reading again", name, e)
                        got = {}
                parts = self._take_prefetched(h, p, got)
            rest = {b: rows for b, rows in p.reqs.items() if b not in parts}
            m = self._metrics[name]
            if rest:
                parts.update(self._read(h, rest))
            else:
                m.reads += 1
                self._record_staleness(m, min([p.block_tag(b) for b in parts] or [p.tag]))
            if parts and not rest:
                m.prefetch_hits += 1
            elif p.future is not None:
                m.prefetch_rereads += 1
            if p.uniq is None:
                return self._assemble_dense(h, parts)
            return self._assemble_rows(h, p.uniq, p.inverse, p.reqs, parts)

    def _prefetch_fresh(self, h: TableHandle, p: PullHandle) -> bool:
        """Whether values fetched as ``p`` was issued may serve a read now."""
        if h.version != p.h.version or h.spec.table_id != p.h.spec.table_id:
            return False
        if self._clock in self._resumed_clocks:
            return False  # reads what the servers have: see Session._own_writes_visible
        if not h.spec.rule.additive and (p.flushes or self._buffers.get(h.spec.name)):
            return False  # the servers compute own writes of other rules: read them there
        need = self._required_tag(h)
        if need is None:  # ASP: read-my-writes only; fetched in this clock or the one before
            return p.clock >= self._clock - 1
        tag = min([p.block_tag(b) for b in p.tags] or [p.tag])
        return tag >= need and (not h.spec.consistency.refreshes or p.clock == self._clock)

    def _take_prefetched(self, h: TableHandle, p: PullHandle, got: dict) -> dict:
        """The prefetched blocks that may serve the read now, with own writes
        added where the servers had not applied them yet; cached where the
        cache holds nothing usable."""
        if not got or not self._prefetch_fresh(h, p):
            return {}
        name = h.spec.name
        summed_per_clock = self._summed_per_clock(h)
        if summed_per_clock:
            self._cache.drop_summed(name, p.tag)  # the servers applied every clock < tag before answering
        need, refresh = self._required_tag(h), h.spec.consistency.refreshes
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
            if not self._cache.usable(cache.get(b), need, refresh, self._clock):
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
