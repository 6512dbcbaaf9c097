"""Moving table data over Dask's comm (the one seam between pure code and the network).

``Router`` turns a push or pull of a whole table or of rows into one message
per server (``_routing``), sends them concurrently through ``Transport``,
and merges the replies. ``Transport`` is Dask's RPC connection pool; when
the caller runs inside a worker that hosts blocks itself, those blocks are
read and written in-process, without a comm or serialization.

Reads from replicas: a pull of a block goes to the copy ``read_from``
picks (``TableHandle.read_from``: this worker's own copy if it holds one,
else one chosen by a key stable per sender), unless ``ps.read-replicas`` is
false; a read refused there (a fenced or frozen copy) retries at the primary.

Failover: every push is numbered (``sender``, ``msg_seq``). When a server
is gone or the table's placement changed (``StaleVersionError``), the Router
fetches the new placement and re-sends the failed items to their new owners;
servers skip a numbered push they already applied, so a push counts exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
import zlib
from collections import Counter

import numpy as np
from distributed.utils import thread_state

from dask_ps import _backend, _config, _routing, _sparse_rows
from dask_ps._exceptions import (ClockTimeoutError, PSError, RowListMissingError, StaleVersionError,
                                 UnknownTableError)
from dask_ps._liveness import Liveness, WorkerGone
from dask_ps._routing import TableHandle
from dask_ps._row_lists import RowListKeys
from dask_ps._sums import held_first, push_bound
from dask_ps._wire import framed, to_wire, unwire_values, wire_values
from dask_ps._worker_plugin import in_process_peer


_INT32_MAX = int(np.iinfo(np.int32).max)


async def _within(seconds: float, coro):
    """``coro`` with a deadline, run in the caller's task (``asyncio.wait_for``
    would start one more task per message)."""
    async with asyncio.timeout(seconds):
        return await coro


async def gather_settled(coros: list) -> list:
    """``asyncio.gather(*coros, return_exceptions=True)``, without the task
    a gather of one would start (the common case: one server, one flush)."""
    if len(coros) == 1:
        try:
            return [await coros[0]]
        except Exception as e:
            return [e]
    return list(await asyncio.gather(*coros, return_exceptions=True)) if coros else []


async def _awaited(awaitable):
    return await awaitable


def blocking_call(client, fn, *args, **kwargs):
    """``client.sync(fn, *args, **kwargs)``: run the coroutine on the client's
    event loop and wait for its result (its error is raised here).

    From another thread, ``run_coroutine_threadsafe`` and a wait on its
    future, not ``distributed.utils.sync``, which adds a turn of the loop
    and tornado's coroutine runner to every blocking call (as
    ``Session._sync``; docs/benchmarks-history.md, KV). From the loop's own thread
    or an asynchronous client: ``client.sync``, which knows those cases."""
    loop = client.loop.asyncio_loop
    if client.asynchronous or getattr(thread_state, "asynchronous", False) or running_loop() is loop:
        return client.sync(fn, *args, **kwargs)
    return wait_on(loop, fn(*args, **kwargs))


def wait_on(loop, coro):
    """Run ``coro`` on ``loop`` (running in another thread) and wait for its
    result; its error is raised here. A closed loop raises RuntimeError and
    the coroutine is closed (never left unawaited). Awaitables that are not
    coroutines are wrapped in one."""
    if not asyncio.iscoroutine(coro):
        coro = _awaited(coro)
    try:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed
        coro.close()
        raise
    return future.result()


def running_loop():
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _retryable(e: BaseException) -> bool:
    # OSError covers CommClosedError and refused connections (a dead worker).
    # Not a ClockTimeoutError (a TimeoutError, so an OSError): the server's
    # answer after a full ps.timeouts.clock; sent again, a stalled run's
    # clock waited twice that before it raised.
    return isinstance(e, (StaleVersionError, UnknownTableError, OSError)) and not isinstance(e, ClockTimeoutError)


def _note_done(error: BaseException, done: list, refused: list) -> None:
    """A server refused its part of an operation that other servers did
    (each server applies its part of a push whole or not at all, not the
    whole push): say which blocks were done, so a caller knows what to redo."""
    blocks = sorted({e[0] for entries, _ in done for e in entries})
    if blocks and isinstance(error, PSError):
        error.add_note(f"dask_ps: block(s) {blocks} of this operation were done by their servers; "
                       f"block(s) {sorted({e[0] for e in refused})} were not")


class Transport:
    """Send ``ps_*`` messages: ``rpc`` is a Dask ``ConnectionPool`` (the
    client's or a worker's); ``local`` the worker plugin of this process, if any."""

    def __init__(self, rpc, scheduler, local=None, liveness=None):
        self.rpc = rpc
        self.scheduler = scheduler
        self.local = local
        # A session's pushes and pulls carry the cluster's internal token: the
        # servers trust its checks (NaN/Inf at every push; pulled rows sorted,
        # unique and in range) and skip their own.
        self._trusted = {"token": local.internal_token} if local is not None else {}
        self.liveness = liveness if liveness is not None else Liveness()
        self.local_address = local.worker.address if local is not None and local.worker else None
        # int32 arrays free to carry rows of messages (_wire_rows); used and
        # given back on the event loop only.
        self._row_scratch: list[np.ndarray] = []
        # Requests sent and the bytes of values they carried, by kind ("push",
        # "pull", "clock"; "..._local": a direct call, no message on the
        # comm): a session's ``metrics()["messages"]``.
        self.sent: Counter = Counter()
        # A participant's row lists sent once to each server, then named by
        # a key (issue 36; dask_ps._row_lists): None where off, or for a client.
        self.row_keys = (RowListKeys(_config.get_bytes("row-lists.participant-bytes"))
                         if local is not None and _config.get("row-lists.keyed") else None)

    def __repr__(self):
        return f"<Transport local={self.local_address}>"

    def _wire_rows(self, h: TableHandle, rows, taken: list, addr: str | None = None, block: int = 0,
                   keyed: list | None = None):
        """A block's local rows as they go into a message to another process:
        None (the whole block), ``[start, stop]`` for a range (no index
        array), else a zero-copy frame. int64 rows (block 0's are the
        caller's global rows; coalesced rows; a caller's rows handed over
        with ``copy=False``) go as int32 in a scratch array of this
        transport, appended to ``taken``, where the block's rows fit: half
        the bytes to send, and the server receives less fresh memory, which
        page-faults in a worker process (a 100k-row push: 3.4-3.5 ms instead
        of 3.7-3.8; a 100k-row read went from 0.86 to 0.98 of a bare RPC).
        The caller's arrays are kept as they are for the write-through,
        prefetches and the cache. The scratch is given back once the server
        answered; after a failure it is dropped (the comm may still hold it).

        ``addr``, ``block``, ``keyed`` (a participant's message to ``addr``,
        with ``row_keys``): a list ``addr`` holds goes as ``{"key"}``, one it
        may not as ``{"key", "rows"}``, its key appended to ``keyed``
        (acknowledged with the reply: ``_keyed``)."""
        wire = _routing.wire_rows(rows)
        key = None
        if keyed is not None and self.row_keys is not None and isinstance(wire, np.ndarray):
            key = self.row_keys.key_of(h.spec.table_id, block, wire)
            if key is not None and self.row_keys.held_at(key, addr):
                self.sent["row_lists_keyed"] += 1
                return {"key": key}
        if isinstance(wire, np.ndarray):
            self.sent["bytes_rows"] += wire.size * (4 if wire.dtype == np.int64 and
                                                    h.spec.block_rows <= _INT32_MAX else wire.itemsize)
        if isinstance(wire, np.ndarray) and wire.dtype == np.int64 and h.spec.block_rows <= _INT32_MAX:
            n = wire.size
            i = next((i for i, a in enumerate(self._row_scratch) if a.shape[0] >= n), None)
            buf = self._row_scratch.pop(i) if i is not None else np.empty(n, dtype=np.int32)
            taken.append(buf)
            np.copyto(buf[:n], wire, casting="unsafe")  # local rows are < block_rows
            wire = buf[:n]
        if wire is None or isinstance(wire, list):
            return wire
        if key is not None:
            keyed.append(key)
            return {"key": key, "rows": to_wire(wire)}
        return to_wire(wire)

    async def _keyed(self, addr: str, kind: str, build, call):
        """Send ``build(taken, keyed)``'s message with ``call(msg)``; where
        ``addr`` refuses a row list's key (restarted, failed over, evicted
        it: ``RowListMissingError``, nothing applied), once more with every
        list in full. The lists a message carried are ``addr``'s once it answered."""
        for attempt in range(2):
            taken: list = []
            keyed: list = []
            msg = build(taken, keyed)
            try:
                reply = await call(msg)
            except RowListMissingError:
                if self.row_keys is None or attempt:
                    raise
                self._give_back(taken)  # answered: the comm holds it no more
                self.row_keys.forget_server(addr)
                self.sent["row_lists_refused"] += 1
                self.sent[kind] += 1  # the message sent again
                continue
            self._give_back(taken)
            if keyed:
                self.row_keys.acknowledged(addr, keyed)
            return reply

    def _give_back(self, taken: list) -> None:
        self._row_scratch.extend(taken)
        if len(self._row_scratch) > 4:  # as many as messages in flight at once, usually
            self._row_scratch.sort(key=len)
            del self._row_scratch[:-4]

    def _sparse(self, h: TableHandle, addr: str) -> bool:
        """Whether rows of ``h`` to or from ``addr`` go as their nonzeros
        (``sparse_wire`` tables): a participant's, in a worker, whose
        compiled kernels are loaded anyway (a client's first decode would
        load numba's, ~0.3 s, for a read or two), and not over an
        in-process comm, which copies nothing."""
        return h.spec.sparse_wire and self.local is not None and not addr.startswith("inproc://")

    def bound_from_nonzeros(self, h: TableHandle) -> bool:
        """Whether a push of ``h`` finds its bound at :meth:`wire_nonzeros`
        rather than in a pass over its dense values when it is made: an
        integer ``sum`` table whose rows go as their nonzeros to a server
        in another process (LDA's counts)."""
        spec = h.spec
        return (spec.sparse_wire and spec.dtype.kind in "iu" and spec.rule.name == "sum"
                and any(self._sparse(h, a) and self.serialized(a) for a in {o[0] for o in h.owners}))

    def wire_nonzeros(self, h: TableHandle, msgs: _routing.Messages):
        """``(items by server, bound)``: the items of a push of ``h`` with
        the values to servers in other processes encoded as their nonzeros
        here, once (:func:`~dask_ps._wire.wire_values` sends them as they
        are), and an upper bound of every value's magnitude, found from those
        nonzeros (the rest: a pass over their dense values): no pass over
        the dense delta of rows that go as nonzeros (K=1000 LDA: 8 ms a
        clock for the participant's). Rows that do not shrink stay dense."""
        out, bound = {}, 0.0
        for addr, items in msgs.items():
            sparse = self._sparse(h, addr) and self.serialized(addr)
            wired = []
            for b, r, v in items:
                enc = _sparse_rows.encode(v) if sparse else None
                if enc is not None:
                    v = _sparse_rows.EncodedRows(tuple(enc[_sparse_rows.KEY]), np.dtype(enc["dtype"]), enc["counts"],
                                                 enc["cols"], enc["vals"])
                bound = max(bound, push_bound(v))
                wired.append((b, r, v))
            out[addr] = wired
        return out, bound

    def serialized(self, addr: str) -> bool:
        """Whether a message to ``addr`` goes through Dask's comm (another
        process), not a direct call in this process."""
        if self.local is None or self.local.worker is None:
            return True
        loop = self.local.worker.loop.asyncio_loop
        return addr != self.local_address and in_process_peer(addr, loop) is None

    def _direct(self, addr: str):
        """The worker plugin to call directly for ``addr`` instead of through
        Dask's comm, or None: this worker's own, or another worker of this
        in-process cluster (``_worker_plugin.in_process_peer``). The call
        runs in the caller's task: a worker of this process that closes
        answers or raises, there is no connection for Liveness to cancel."""
        if self.local is None:
            return None
        if addr == self.local_address:
            return self.local
        peer = in_process_peer(addr)
        if peer is not None and addr in self.liveness.dead:
            raise WorkerGone(f"worker {addr} has left the cluster")
        return peer

    async def _call_direct(self, target, call):
        """Await a direct call; another worker's under ``ps.timeouts.rpc``."""
        if target is self.local:
            return await call
        return await _within(_config.get_seconds("timeouts.rpc"), call)

    async def push(self, addr: str, h: TableHandle, items, raw=False, run=None, sender=None, msg_seq=None,
                   bound=None, **phase):
        """Apply ``items`` on ``addr``; returns each block's sequence number after it.
        ``bound``: of every value's magnitude, as the session's NaN/Inf
        check found it (sent with the internal token only: the server's
        overflow check then trusts it instead of measuring the values).
        ``phase``: ``hold=id`` or ``commit=(id, apply)`` of a two-phase push,
        ``lease=True`` (``Router.send``; the reply is then ``{"seqs", "lease"}``)."""
        target = self._direct(addr)
        self.sent["push" if target is None else "push_local"] += 1
        self.sent["bytes_pushed"] += sum(_dense_nbytes(v) for _, _, v in items)
        if target is not None:
            items = [(b, _routing.wire_rows(r), v) for b, r, v in items]
            return await self._call_direct(target, target.local_push(
                h.spec.name, h.version, items, raw=raw, run=run, sender=sender, msg_seq=msg_seq,
                table_id=h.spec.table_id, bound=bound, **phase))
        sparse = self._sparse(h, addr)
        values = [wire_values(v, sparse) for _, _, v in items]

        def build(taken, keyed):
            msg = dict(
                table=h.spec.name,
                table_id=h.spec.table_id,
                version=h.version,
                blocks=[b for b, _, _ in items],
                values=values,
                sender=sender,
                msg_seq=msg_seq,
                **self._trusted,
            )
            # Fields at the handler's defaults are left out: Dask sizes every
            # message (dask.sizeof, to decide whether to serialize it off the
            # event loop) and samples one of more than ten fields, which costs
            # more than the rest of its walk (a client's dense push: 13 fields,
            # to_frames 76 -> 59 us with 10).
            if any(r is not None for _, r, _ in items):
                msg["rows"] = [self._wire_rows(h, r, taken, addr, b, keyed) for b, r, _ in items]
            if raw:
                msg["raw"] = True
            if run is not None:
                msg["run"] = run
            if bound is not None and self._trusted:
                msg["bound"] = bound
            msg.update(phase)
            return framed(msg)

        return await self._keyed(addr, "push", build, lambda msg: self.liveness.call(addr, lambda: _within(
            _config.get_seconds("timeouts.rpc"), self.rpc(addr).ps_push(**msg))))

    async def run_call(self, addr: str, op: str, seconds: float, **msg):
        """A participant's clock call to a server: ``run_clock`` (report a
        clock) or ``run_wait`` (park until the run's minimum reaches a
        clock), within ``seconds``; directly where the server is in this
        process (its own worker: no message at all)."""
        target = self._direct(addr)
        kind = {"run_clock": "clock", "run_wait": "wait"}.get(op, "clocks")
        self.sent[kind if target is None else f"{kind}_local"] += 1
        if target is not None:
            reply = getattr(target, "local_run_clock" if op == "run_clock" else op)(**msg)
            return await _within(seconds, reply) if asyncio.iscoroutine(reply) else reply
        return await self.liveness.call(addr, lambda: _within(
            seconds, getattr(self.rpc(addr), f"ps_{op}")(**msg, **self._trusted)))

    async def clock_message(self, addr: str, seconds: float, parts: list, reads=(), **msg):
        """A participant's one message to a server for a clock (issue 36):
        its pushes there (``parts``: ``(h, items, run, sender, msg_seq,
        bound, lease)``, maybe none), the clock (``msg``: ``run_clock``'s
        fields) and the reads of the next clock it prefetched there
        (``reads``: ``(h, [(block, rows), ...], extra)``, ``extra`` as
        ``pull`` takes it), within ``seconds``. Returns ``{"min", "seqs"}``,
        a reply per part as ``push`` gives it, and ``"reads"``: a reply per
        read as ``pull`` gives it, or ``{"error"}``."""
        target = self._direct(addr)
        self.sent["clock" if target is None else "clock_local"] += 1
        self.sent["bytes_pushed"] += sum(_dense_nbytes(v) for p in parts for _, _, v in p[1])
        if target is not None:
            pushes = [dict(items=[(b, _routing.wire_rows(r), v) for b, r, v in items], table=h.spec.name,
                           version=h.version, run=run, sender=sender, msg_seq=msg_seq, table_id=h.spec.table_id,
                           bound=bound, lease=lease)
                      for h, items, run, sender, msg_seq, bound, lease in parts]
            if reads:
                msg["reads"] = [dict(local=target is self.local, table=h.spec.name, version=h.version,
                                     blocks=[b for b, _ in es], rows=[_routing.wire_rows(r) for _, r in es],
                                     table_id=h.spec.table_id, **extra) for h, es, extra in reads]
            return await _within(seconds, target.local_run_clock(pushes=pushes, **msg))
        values = [[wire_values(v, self._sparse(h, addr)) for _, _, v in items] for h, items, *_ in parts]

        def build(taken, keyed):
            pushes = []
            for (h, items, run, sender, msg_seq, bound, lease), vals in zip(parts, values):
                push = dict(table=h.spec.name, table_id=h.spec.table_id, version=h.version,
                            blocks=[b for b, _, _ in items], values=vals, sender=sender, msg_seq=msg_seq, run=run)
                if any(r is not None for _, r, _ in items):
                    push["rows"] = [self._wire_rows(h, r, taken, addr, b, keyed) for b, r, _ in items]
                if bound is not None and self._trusted:
                    push["bound"] = bound
                if lease:
                    push["lease"] = True
                pushes.append(push)
            if reads:
                msg["reads"] = [dict(table=h.spec.name, table_id=h.spec.table_id, version=h.version,
                                     blocks=[b for b, _ in es],
                                     rows=[self._wire_rows(h, r, taken, addr, b, keyed) for b, r in es],
                                     **({"sparse": True} if self._sparse(h, addr) else {}), **extra)
                                for h, es, extra in reads]
            return framed(dict(pushes=pushes, **msg, **self._trusted))

        reply = await self._keyed(addr, "clock", build, lambda m: self.send_clock(addr, seconds, m))
        for r in reply.get("reads") or () if isinstance(reply, dict) else ():
            if isinstance(r, dict) and isinstance(r.get("values"), (list, tuple)):
                r["values"] = [_backend.received(v) if not addr.startswith("inproc://") else v
                               for v in unwire_values(r["values"])]
                self.sent["bytes_pulled"] += sum(int(getattr(v, "nbytes", 0)) for v in r["values"])
        return reply

    async def send_clock(self, addr: str, seconds: float, msg: dict):
        """Send one built clock message (``clock_message``) to ``addr``, a
        server in another process (:class:`~dask_ps._process_cache.CombiningTransport`
        hands it to its run's clock combiner instead)."""
        return await self.liveness.call(addr, lambda: _within(seconds, self.rpc(addr).ps_run_clock(**msg)))

    def clock_passed(self, rank: int, clock: int) -> None:
        """Participant ``rank`` sends ``clock`` otherwise than as clock messages."""

    async def commit(self, addr: str, h: TableHandle, hold_id: str, apply: bool = True, run=None, sender=None,
                     msg_seq=None):
        """Phase 2 of a two-phase push: apply (or drop, ``apply=False``) the
        push held at ``addr`` as ``hold_id``; returns its blocks' sequence numbers."""
        target = self._direct(addr)
        self.sent["commit" if target is None else "commit_local"] += 1
        if target is not None:
            return await self._call_direct(target, target.local_push(
                h.spec.name, h.version, [], run=run, sender=sender, msg_seq=msg_seq, table_id=h.spec.table_id,
                commit=(hold_id, apply), lease=apply))
        msg = dict(table=h.spec.name, table_id=h.spec.table_id, version=h.version, values=[], sender=sender,
                   msg_seq=msg_seq, commit=[hold_id, apply], lease=apply, **self._trusted)
        if run is not None:
            msg["run"] = run
        return await self.liveness.call(addr, lambda: _within(
            _config.get_seconds("timeouts.rpc"), self.rpc(addr).ps_push(**msg)))

    async def pull(self, addr: str, h: TableHandle, reqs, **extra) -> dict:
        """``{"seqs": [...], "values": [...]}`` for ``(block, rows)`` requests.
        ``extra``: ``run``/``subscribe`` of a participant (see ``ps_pull``)."""
        blocks = [b for b, _ in reqs]
        target = self._direct(addr)
        self.sent["pull" if target is None else "pull_local"] += 1
        seconds = _config.get_seconds("timeouts.rpc")
        if extra.get("wait") is not None:  # parked at the server until its bound holds
            seconds += _config.get_seconds("timeouts.clock")
        if target is not None:
            # Another worker's replies are shared read-only, as the in-process
            # comm hands them over; this worker's own session gets copies.
            if target is not self.local:
                return await _within(seconds, target.local_pull(
                    h.spec.name, h.version, blocks, [_routing.wire_rows(r) for _, r in reqs],
                    table_id=h.spec.table_id, copy=False, **extra))
            return await self._call_direct(target, target.local_pull(
                h.spec.name, h.version, blocks, [_routing.wire_rows(r) for _, r in reqs],
                table_id=h.spec.table_id, copy=target is self.local, **extra))
        # Not aligned(): a request's only arrays are rows, an index the
        # server's gather converts as it reads (no slower unaligned), and a
        # pad would cost the server a buffer and a read of its own.
        if self._sparse(h, addr):
            extra["sparse"] = True  # the server sends rows as their nonzeros where smaller

        def build(taken, keyed):
            return dict(table=h.spec.name, table_id=h.spec.table_id, version=h.version, blocks=blocks,
                        rows=[self._wire_rows(h, r, taken, addr, b, keyed) for b, r in reqs],
                        **self._trusted, **extra)

        reply = await self._keyed(addr, "pull", build, lambda m: self.liveness.call(addr, lambda: _within(
            seconds, self.rpc(addr).ps_pull(**m))))
        values = reply.get("values") if isinstance(reply, dict) else None
        if isinstance(values, (list, tuple)):
            values = unwire_values(values)  # decoded: fresh arrays
            if not addr.startswith("inproc://"):
                values = [_backend.received(v) for v in values]  # buffers only this reader holds
            reply["values"] = values
            self.sent["bytes_pulled"] += sum(int(getattr(v, "nbytes", 0)) for v in values)
        return reply


def _dense_nbytes(v) -> int:
    """The bytes of pushed values, as an array (also rows encoded as their nonzeros)."""
    return int(getattr(v, "dense_nbytes", None) or getattr(v, "nbytes", 0))


class Router:
    """Table-level push/pull on top of a :class:`Transport`, with a cache of
    table handles (spec + placement) fetched from the scheduler."""

    def __init__(self, transport: Transport, sender: str | None = None, latest_versions: dict | None = None):
        self.transport = transport
        self.handles: dict[str, TableHandle] = {}
        # table -> newest placement version announced by the scheduler (kept
        # up to date by the owner of this dict: the client's event
        # subscription, or the worker plugin)
        self.latest_versions = latest_versions if latest_versions is not None else {}
        self.sender = sender or uuid.uuid4().hex
        self._msg_seq = itertools.count()
        # ((table, table id), server) -> (trusted until, {block: bound it may push unchecked}): see _leased.
        # The table id: a table dropped and created again under its name has none of the old one's leases.
        self._leases: dict[tuple[tuple[str, str], str], tuple[float, dict[int, float]]] = {}
        # Called after a failed attempt (the client's: raises if the scheduler
        # is gone, so a retry does not wait for connects to a dead address).
        self.lost_check = None
        # The client's: ``on_handle(h)`` sees every handle fetched (it notes
        # restores from a checkpoint); ``await rollback_check(name, done)``
        # after a refresh in a retry may raise RolledBackError (``done``:
        # part of the operation was done already).
        self.on_handle = None
        self.rollback_check = None
        # Spreads readers over the copies of a block, the same choice every time.
        self._read_key = zlib.crc32(self.sender.encode())

    async def handle(self, name: str, refresh: bool = False) -> TableHandle:
        h = self.handles.get(name)
        if h is None or refresh or h.version < self.latest_versions.get(name, 0):
            msg = await self.transport.scheduler.ps_get_table(name=name)
            h = self.handles[name] = TableHandle.from_msg(msg)
            if self.on_handle is not None:
                self.on_handle(h)
        return h

    def forget(self, name: str) -> None:
        self.handles.pop(name, None)

    async def _with_failover(self, name: str, by_addr: dict, call, note: bool = True):
        """Run ``call(h, addr, entries)`` for every server at once; re-route the
        entries of failed servers after a placement refresh, until
        ``ps.timeouts.failover``. Entries start with their block number.
        Returns ``[(entries, reply), ...]``."""
        h = await self.handle(name)
        table_id = h.spec.table_id
        deadline = time.monotonic() + _config.get_seconds("timeouts.failover")
        delay = 0.02
        # (entries, reply) pairs: a retry may reach an address that already
        # answered for other entries (a replica read retried at the primary).
        out = []
        while True:
            addrs = list(by_addr)
            results = await gather_settled([call(h, a, by_addr[a]) for a in addrs])
            failed, error = [], None
            for a, r in zip(addrs, results):
                if isinstance(r, BaseException):
                    if not _retryable(r):
                        if note:
                            _note_done(r, out + [(by_addr[x], y) for x, y in zip(addrs, results)
                                                 if not isinstance(y, BaseException)], by_addr[a])
                        raise r
                    failed.extend(by_addr[a])
                    error = r
                else:
                    out.append((by_addr[a], r))
            if not failed:
                return out
            if self.lost_check is not None:
                self.lost_check(error)
            if time.monotonic() > deadline:
                raise PSError(
                    f"table {name!r}: blocks {sorted({e[0] for e in failed})} stayed unreachable for "
                    f"ps.timeouts.failover; last error: {error!r}"
                ) from error
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)
            h = await self.handle(name, refresh=True)  # raises if the table is gone or lost
            if self.rollback_check is not None:
                await self.rollback_check(name, bool(out))
            if h.spec.table_id != table_id:
                raise StaleVersionError(
                    f"table {name!r} was dropped and created again while this operation was "
                    f"in flight; blocks {sorted({e[0] for e in failed})} were not written or read. "
                    f"The table is now: {h.spec.describe()}"
                ) from error
            by_addr = {}
            for e in failed:
                by_addr.setdefault(h.primary(e[0]), []).append(e)

    async def send(self, name: str, msgs: _routing.Messages, raw: bool = False, run=None,
                   msg_seq: int | None = None, bound: float | None = None) -> dict[int, int]:
        """One message per server, all in flight at once; returns the sequence
        number of every block after this push. ``msg_seq`` numbers the push
        for exactly-once delivery (default: the next number of this sender);
        ``bound``: of every value's magnitude (see ``Transport.push``)."""
        if msg_seq is None:
            msg_seq = next(self._msg_seq)
        lease = {}
        h = await self.handle(name)
        if not raw and len(msgs) > 1 and held_first(h.spec):
            if not self._leased(h, msgs, bound):
                return await self._send_held(name, [msgs], run, msg_seq, bound)
            lease = {"lease": True}  # every server's part fits this sender's lease there: one phase

        async def call(h, addr, items):
            reply = await self.transport.push(addr, h, items, raw, run, self.sender, msg_seq, bound, **lease)
            if reply is None:  # a worker without dask_ps handlers (closing): re-route
                raise WorkerGone(f"worker {addr} does not serve dask_ps")
            return self._lease_reply(h, addr, reply)

        seqs: dict[int, int] = {}
        for items, reply in await self._with_failover(name, dict(msgs), call):
            for (b, *_), s in zip(items, reply):
                seqs[b] = max(seqs.get(b, 0), s)
        return seqs

    def _leased(self, h: TableHandle, msgs, bound) -> bool:
        """Whether this sender's leases (``_holds.top_up``: bounds each
        server reserved for its next pushes) cover every part of a push;
        then the push goes in one phase, drawn from them here as the
        servers will (their replies bring the leases up to date)."""
        now, need, key = time.monotonic(), {}, (h.spec.name, h.spec.table_id)
        for addr, items in msgs.items():
            have = self._leases.get((key, addr))
            if have is None or have[0] < now:
                return False
            for b, _, v in items:
                x = (bound if bound is not None else push_bound(v)) * (1 + 1e-6)  # the server measures alike
                need[(addr, b)] = need.get((addr, b), 0.0) + x
                if have[1].get(b, 0.0) < need[(addr, b)]:
                    return False
        for (addr, b), x in need.items():
            self._leases[(key, addr)][1][b] -= x
        return True

    def _lease_reply(self, h: TableHandle, addr: str, reply):
        """A push's reply: its sequence numbers; a server's lease for the
        next push is noted (trusted for half of its life at the server)."""
        if not isinstance(reply, dict):
            return reply
        life = _config.get_seconds("timeouts.failover") / 2
        self._leases[((h.spec.name, h.spec.table_id), addr)] = (time.monotonic() + life, {int(b): float(x) for b, x in reply.get("lease") or ()})
        return reply["seqs"]

    async def _send_held(self, name: str, rounds: list, run, msg_seq: int, bound) -> dict[int, int]:
        """A push over several servers, all or nothing (issue 34): phase 1
        holds it at every server, checked as it would be applied (a sum
        that would overflow is refused there) but not applied, its bound
        reserved against other pushes; phase 2 applies the held parts (a
        message of the blocks only). A refusal in phase 1 drops what was
        held: nothing was applied. Rounds (a large dense push) are all held
        first; their values are sent again with the commit, not kept."""
        keep, base, n = len(rounds) == 1, uuid.uuid4().hex, itertools.count()
        held: list[tuple[str, str, list]] = []  # (address, hold id, items)

        async def hold(h, addr, items):
            hold_id = f"{base}-{next(n)}"
            if await self.transport.push(addr, h, items, False, run, self.sender, msg_seq, bound,
                                         hold=hold_id) is None:
                raise WorkerGone(f"worker {addr} does not serve dask_ps")
            held.append((addr, hold_id, items))
            return []

        try:
            for msgs in rounds:
                await self._with_failover(name, dict(msgs), hold, note=False)  # held is not applied
        except BaseException:
            h = self.handles.get(name)
            if h is not None:  # what is not dropped now expires (ps.timeouts.failover)
                await gather_settled([self.transport.commit(a, h, i, False) for a, i, _ in held])
            raise
        seqs: dict[int, int] = {}
        results = await gather_settled([self._commit(name, *x, keep, run, msg_seq, bound) for x in held])
        for r in results:
            if isinstance(r, BaseException):
                raise r
            for b, s in r.items():
                seqs[b] = max(seqs.get(b, 0), s)
        return seqs

    async def _commit(self, name, addr, hold_id, items, keep, run, msg_seq, bound) -> dict[int, int]:
        """Phase 2 at one server; where its hold is gone (a placement change
        dropped it) or the server is, the part is sent again as a push."""
        h = await self.handle(name)
        try:
            if keep:
                reply = await self.transport.commit(addr, h, hold_id, True, run, self.sender, msg_seq)
            else:
                reply = await self.transport.push(addr, h, items, False, run, self.sender, msg_seq, bound,
                                                  commit=(hold_id, True), lease=True)
            if reply is None:
                raise WorkerGone(f"worker {addr} does not serve dask_ps")
            return {b: s for (b, *_), s in zip(items, self._lease_reply(h, addr, reply))}
        except Exception as e:
            if not _retryable(e):
                raise

        async def call(h, a, its):
            return await self.transport.push(a, h, its, False, run, self.sender, msg_seq, bound)

        by_addr: dict[str, list] = {}
        for it in items:
            by_addr.setdefault(h.primary(it[0]), []).append(it)
        return {b: s for its, reply in await self._with_failover(name, by_addr, call)
                for (b, *_), s in zip(its, reply)}

    def read_from(self, h: TableHandle, block: int, replicas: bool = True) -> str:
        """The worker a read of ``block`` goes to first (see
        ``TableHandle.read_from``); its primary if not ``replicas``."""
        if not replicas:
            return h.primary(block)
        return h.read_from(block, self.transport.local_address, self._read_key)

    async def fetch(self, name: str, reqs, summed: dict | None = None, applied: dict | None = None,
                    tags: dict | None = None, replicas: bool | None = None, **extra) -> dict[int, tuple]:
        """Pull ``[(block, rows), ...]`` (or such lists in a dict, grouped by
        any address); returns ``{block: (rows, seq, values)}``. Each block is
        read from the copy :meth:`read_from` picks; a failed read is retried
        at the block's primary. ``summed`` (a dict, aggregate="clock"): filled
        with each block's ``summed_below`` from the replies (see ``ps_pull``);
        ``applied`` (a dict; pass ``sender=`` in ``extra``): with the number
        of that sender's latest push each block's values contain; ``tags``
        (a dict; with ``run=``): with what each block's server said its read
        holds; ``replicas``: whether copies other than the primary may serve
        (None: ``ps.read-replicas``)."""
        h = await self.handle(name)
        entries = [e for es in reqs.values() for e in es] if isinstance(reqs, dict) else list(reqs)
        if replicas is None:
            replicas = bool(_config.get("read-replicas"))  # once per read, not per block
        by_addr: dict[str, list] = {}
        for e in entries:
            by_addr.setdefault(self.read_from(h, e[0], replicas), []).append(e)

        async def call(h, addr, entries):
            reply = await self.transport.pull(addr, h, entries, **extra)
            if reply is None:
                raise WorkerGone(f"worker {addr} does not serve dask_ps")
            return reply

        out = {}
        for entries, reply in await self._with_failover(name, by_addr, call):
            for (b, rows), seq, vals in zip(entries, reply["seqs"], reply["values"]):
                out[b] = (rows, seq, vals)
            if summed is not None and reply.get("summed_below") is not None:
                summed.update(zip((e[0] for e in entries), reply["summed_below"]))
            if applied is not None and reply.get("applied") is not None:
                applied.update(zip((e[0] for e in entries), reply["applied"]))
            if tags is not None and reply.get("tag") is not None:  # what the server's read holds
                tags.update((e[0], reply["tag"]) for e in entries)
        return out

    # --- whole-table and row operations for the client ------------------------------
    async def push_dense(self, name: str, values, raw: bool = False, bound: float | None = None):
        """The whole table's values, in rounds of at most
        ``ps.dense-push-message-bytes`` per server (``_routing.in_rounds``),
        one after the other; returns every block's sequence number.
        ``bound``: of the values' magnitudes, if the caller's check found it."""
        h = await self.handle(name)
        rounds = _routing.in_rounds(_routing.split_dense(h, values), _config.get_bytes("dense-push-message-bytes"))
        if not raw and len(rounds) > 1 and held_first(h.spec):
            return await self._send_held(name, rounds, None, next(self._msg_seq), bound)
        seqs: dict[int, int] = {}
        for msgs in rounds:
            seqs.update(await self.send(name, msgs, raw, bound=bound))
        return seqs

    async def push_rows(self, name: str, rows, values):
        """``rows`` sorted and unique (see ``_routing.coalesce_rows``)."""
        h = await self.handle(name)
        return await self.send(name, _routing.split_rows(h, rows, values))

    async def pull_dense(self, name: str):
        h = await self.handle(name)
        got = await self.fetch(name, _routing.dense_requests(h))
        return _routing.assemble_blocks(h, {b: v for b, (_, _, v) in got.items()})

    async def pull_rows(self, name: str, rows):
        h = await self.handle(name)
        reqs, uniq, inverse = _routing.row_requests(h, rows)
        got = await self.fetch(name, reqs)
        return _routing.assemble_rows(h, {b: v for b, (_, _, v) in got.items()}, uniq, inverse)
