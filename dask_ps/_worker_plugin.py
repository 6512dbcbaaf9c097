"""The worker half of dask_ps: hosts shards and answers push/pull.

Installed on every worker by the scheduler plugin (``PSSchedulerPlugin.start``).
Its handlers are ordinary Dask RPC handlers (``ps_push``, ``ps_pull``, ...),
so data moves worker to worker over Dask's comm (TCP, TLS, UCX); numpy
arrays travel as zero-copy frames via ``to_serialize``, small ones inline
(``_wire.to_wire``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import defaultdict

import secrets
import weakref

import numpy as np
from distributed import WorkerPlugin
from distributed.core import Status

from dask_ps import _backend, _config, _holds
from dask_ps import _clock_combiner as clock_combiner
from dask_ps._clock_combiner import answer_sections
from dask_ps._exceptions import (
    InternalOnlyError,
    PSValueError,
    RunEndedError,
    StaleVersionError,
    UnknownTableError,
)
from dask_ps._handlers import CLIENT, INTERNAL, READ_ONLY, HandlerRegistry, InternalRPC, handler, reply_errors
from dask_ps._host_memory import freeze_before_exit, pool_in_process_memory_limits, raise_mmap_threshold
from dask_ps._liveness import RETIRE_MARGIN, Beacon, Liveness, PauseGuard
from dask_ps._replicator import Replicator
from dask_ps._row_lists import RowListCache
from dask_ps._run_manager import ENDED_RUNS_KEPT, RunManager  # noqa: F401 - ENDED_RUNS_KEPT: tests
from dask_ps._shard import ShardStore, _wire_clock
from dask_ps._spec import TableSpec
from dask_ps import _wire
from dask_ps._wire import aligned, framed, unwire_values, wire_values, wired_nbytes
from dask_ps._wire import unwrap as _unwrap

logger = logging.getLogger(__name__)

PLUGIN_NAME = "ps"
# Handlers and their access levels: the methods marked with @handler
# (WORKER_HANDLERS, built below the class; docs/security.rst).
__all__ = ["PSWorkerPlugin", "WORKER_HANDLERS", "InternalRPC", "reply_errors", "aligned", "in_process_peer"]


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
        # Pushes and reads served here and their bytes (the dashboard's rates).
        self.served = {"pushes": 0, "bytes_pushed": 0, "pulls": 0, "bytes_pulled": 0}
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._replica_locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # The runs served here: clocks, parked reads, mailboxes (issue 36).
        self.run_manager = RunManager(
            self.store, self._all_locks, self._apply, lambda: self.scheduler, self._peer_clocks, self._address,
            self._run_push, fill_sender=self, read=self._run_read)
        self.runs = self.run_manager.clocks
        # Participants' row lists by key: later messages name them (issue 36).
        self.row_lists = RowListCache(lambda: _config.get_bytes("row-lists.server-bytes"))
        self.latest_versions: dict[str, int] = {}  # table -> newest placement version announced
        self.liveness = Liveness()  # workers the scheduler removed: do not wait on them
        # A primary's forwarding of pushes to its replicas (issue 36).
        self.replicator = Replicator(self._address, lambda a: self.worker.rpc(a), lambda: self.scheduler,
                                     self.liveness, lambda: self.internal_token)
        self._evictions: set[str] = set()  # ps_evicted ids handled (a resent one is a no-op)
        # Checkpoint blocks read and checked, not installed yet: load id ->
        # (table, table_id, blocks) until the scheduler says install or discard.
        self._loads: dict[str, tuple] = {}
        # Refuses to serve after a long stop until the scheduler says whether
        # this worker was fenced out as hung (started in setup).
        self.pause_guard = PauseGuard(lambda: self.scheduler.ps_fenced_out(address=self.worker.address))
        # Created once where the scheduler plugin builds this plugin, and
        # pickled with it to every worker: only the scheduler and the workers
        # know it. Dask's comm does not say who is calling (a peer address is
        # an ephemeral port; TLS nodes usually share one certificate), so
        # internal handlers check this instead. It stops mistakes and stray
        # messages, not someone who can run code in the cluster (docs/security.rst).
        self.internal_token = secrets.token_hex(16)

    def __repr__(self):
        addr = self.worker.address if self.worker is not None else None
        return f"<PSWorkerPlugin {addr} {self.store}>"

    async def setup(self, worker):
        self.worker = worker
        _IN_PROCESS[worker.address] = self
        _backend.setup_device_memory(_config.get("rmm-pool-size"))  # GPU workers: an rmm pool, if asked
        raise_mmap_threshold(_config.get("worker-mmap-threshold"))  # a nanny's worker: large blocks reused
        pool_in_process_memory_limits(worker)  # in-process workers: one process, one (summed) limit
        # Every ps_* handler, behind the check of its access level.
        WORKER_HANDLERS.install(self, worker.handlers, lambda: self.internal_token)
        worker.extensions[PLUGIN_NAME] = self
        # This process's liveness, from a thread of its own (a busy event loop
        # is not a dead worker: _liveness.Beacon); made here, not pickled.
        self.beacon = Beacon()
        self.pause_guard._beacon = self.beacon
        self.beacon.start(worker.scheduler.address, worker.address, self.internal_token,
                          getattr(worker, "connection_args", None))
        self.pause_guard.start()
        # Announce ourselves (never called from the scheduler's add_worker:
        # an RPC to a joining worker there deadlocks, see DASK_NOTES pitfall 1).
        await self.scheduler.ps_register_server(address=worker.address)

    async def teardown(self, worker):
        self.pause_guard.stop()
        # A graceful close (retire_workers, scale down): hand our blocks to
        # other workers first. The scheduler ignores this while shutting down;
        # it bounds the wait itself (ps.timeouts.failover) and marks this
        # worker gone before it answers, so nothing waits on our copies once
        # they are dropped below (issue 34). The beacon beats meanwhile: a
        # retiring worker that stops beating is gone too.
        if self.store.tables:
            try:
                await asyncio.wait_for(
                    self.scheduler.ps_evacuate(address=worker.address),
                    _config.get_seconds("timeouts.failover") + RETIRE_MARGIN,
                )
            except Exception as e:  # the scheduler may be gone already
                logger.info("dask_ps: could not evacuate %s: %r", worker.address, e)
        beacon = getattr(self, "beacon", None)
        if beacon is not None:
            beacon.stop()
        # Handlers stay (a missing handler would answer None): with the store
        # empty they answer UnknownTableError, and callers re-route.
        self.store.tables.clear()
        if _IN_PROCESS.get(worker.address) is self:
            del _IN_PROCESS[worker.address]
        freeze_before_exit(worker)  # a closing nanny's worker: a short exit, not a kill

    @property
    def scheduler(self) -> InternalRPC:
        """This worker's rpc to the scheduler, its calls carrying the cluster's
        internal token (the scheduler's internal handlers require it)."""
        return InternalRPC(self.worker.scheduler, self.internal_token)

    @contextlib.asynccontextmanager
    async def _all_locks(self, table: str):
        """Exclusive access to a table's shards (placement changes, checkpoints)."""
        async with self._locks[table], self._replica_locks[table]:
            yield

    # --- handlers (called on the worker's event loop) -----------------------------
    @handler(INTERNAL)
    def create_shards(self, spec: dict, version: int, blocks: list, owners=None) -> None:
        """Handler: allocate the given blocks of a table (zeros)."""
        self.store.create(TableSpec.from_msg(spec), version, list(blocks), owners)

    @handler(INTERNAL)
    def drop_table(self, name: str, table_id: str | None = None) -> bool:
        """Handler: forget a table's shards."""
        self._locks.pop(name, None)
        self._replica_locks.pop(name, None)
        if table_id is not None:
            self.row_lists.forget_table(table_id)
        for load_id in [k for k, (n, tid, _) in self._loads.items() if n == name and tid in (table_id, None)]:
            del self._loads[load_id]
        return self.store.drop(name, table_id)

    @handler(CLIENT, tells_internal=True)
    async def push(self, table=None, version=None, blocks=(), rows=None, values=(), raw=False, run=None,
                   sender=None, msg_seq=None, replica=False, table_id=None, forwarder=None, bound=None,
                   hold=None, commit=None, lease=False, internal=False):
        """Handler: apply one message of updates (all blocks or none).

        ``rows`` left out: whole blocks (a dense push: a message of at most
        ten fields is sized by Dask without sampling, ``Transport.push``).

        ``run = (run_id, clock)`` tags a participant's push (per-clock
        aggregation); ``sender``/``msg_seq`` number it so a re-sent message is
        applied once. On a block's primary the message is forwarded to the
        block's replicas, and the reply waits until they applied it too.
        A forwarded message (``replica=True``) names its ``forwarder``, which
        must be the blocks' primary, and carries the internal token
        (``internal`` is set by the handler's guard, never by the message).
        ``bound``: an upper bound of every value's magnitude, which the
        sender's NaN/Inf check found; taken from an internal caller only.
        ``hold``/``commit``: a push over several servers in two phases
        (``Router.send``): ``hold=id`` checks and holds it, ``commit=(id,
        apply)`` applies (values left out: the held ones) or drops it;
        ``lease``: draw on the sender's lease and reply ``{"seqs", "lease"}``.
        """
        if rows is None and isinstance(blocks, (list, tuple)):
            rows = [None] * len(blocks)
        rows = self._rows_of(rows, blocks, table_id, run, internal)
        if isinstance(values, (list, tuple)):
            values = unwire_values([_unwrap(v) for v in values], _config.get_bytes("max-push-bytes"), decode=False)
        if replica and not internal:
            raise InternalOnlyError("a forwarded push (replica=True) may come only from the blocks' primary")
        if bound is not None and not internal:
            # A bound too small would let a sum overflow past the check.
            raise InternalOnlyError("a push's bound= may come only from a participant's session or a primary")
        if (replica and (hold is not None or commit is not None)) or not isinstance(hold, (str, type(None))):
            raise PSValueError(f"a push's hold must be an id (str) and a forwarded push is not held, got {hold!r}")
        return await self._push(table, version, blocks, rows, values, bool(raw), run, sender, msg_seq,
                                bool(replica), table_id, forwarder, trusted=internal, bound=bound, hold=hold,
                                commit=commit, lease=bool(lease) and not replica)

    def _rows_of(self, rows, blocks, table_id, run, internal=True):
        """A message's rows as arrays: a list named by its key is the one
        this worker holds under it (``RowListMissingError`` where it holds
        none: the sender sends the message again with its lists). Keys
        come from participants' sessions only (``internal``): another
        caller could otherwise replace the rows a participant's key names."""
        if not isinstance(rows, (list, tuple)):
            return rows
        rows = [{k: _unwrap(x) for k, x in r.items()} if isinstance(r, dict) else _unwrap(r) for r in rows]
        if not internal and any(isinstance(r, dict) for r in rows):
            raise InternalOnlyError("row lists named by a key may come only from a participant's session")
        run_id = run[0] if isinstance(run, (list, tuple)) and run and isinstance(run[0], str) else None
        return self.row_lists.resolve(table_id, blocks, rows, run_id)

    async def _push(self, table, version, blocks, rows, values, raw, run, sender, msg_seq, replica, table_id=None,
                    forwarder=None, trusted=False, bound=None, hold=None, commit=None, lease=False):
        """(``trusted``: the message carries the cluster's internal token, so
        it comes from a dask_ps session in a worker, which checked every
        value for NaN/Inf before sending it, or from a primary that checked
        it: the pass over the values is not made twice, and ``bound``, what
        that check found, serves the overflow check of a sum. A client's
        push is checked here, in one pass that finds the bound too.)"""
        if sender is not None and not (isinstance(sender, str) and isinstance(msg_seq, int)):
            raise PSValueError(f"push sender/msg_seq must be str/int, got {sender!r}/{msg_seq!r}")
        if run is not None:
            run_id, _ = _check_run(run)
            if sender is not None and not sender.startswith(f"{run_id}-"):
                raise PSValueError(f"a push of run {run_id} must come from one of its participants, "
                                   f"not {sender!r}")
            if not replica:  # the primary checked it before forwarding
                await self.run_manager.check_active(run_id)
        key = table if isinstance(table, str) else ""
        # Two locks per table: a primary holds its lock while it forwards to
        # replicas, and replicas apply under the other one, so two primaries
        # forwarding to each other cannot deadlock.
        async with (self._replica_locks[key] if replica else self._locks[key]):
            held = _holds.take_hold(self.store, table, version, table_id, commit)
            if commit is not None and not commit[1]:  # phase 1 was refused elsewhere: nothing applies
                return []
            if run is not None and run[0] in self.run_manager.ended:
                # Its end freed the run's exactly-once windows: a copy sent again (a forward whose
                # reply was lost, a retry that waited for this lock) would count twice. A replica
                # refuses a forward too: its primary has it fenced and copied again.
                raise RunEndedError(f"run {run[0]} has ended: its pushes are refused")
            if held is not None and held.items is not None:
                t, items, bounds = self.store.get(table, version, table_id), held.items, held.bounds
            else:
                # A forwarded push follows the primary's placement, not the sender's.
                bounds: dict[int, float] = {}
                t, items = self.store.validate_push(table, None if replica else version, blocks, rows, values,
                                                    table_id, frozen_ok=replica, check_finite=not trusted,
                                                    bound=bound if trusted else None, bounds=bounds)
            if replica:
                self.replicator.check_forwarder(t, [b for b, _, _ in items], version, forwarder)
            else:
                self.pause_guard.check()  # stopped for long: maybe fenced out, not the primary any more
                me = self.worker.address
                wrong = [b for b, _, _ in items if t.owners and t.owners[b][0] != me]
                if wrong:
                    raise StaleVersionError(
                        f"table {t.spec.name!r}: this worker is not the primary of block(s) {wrong}"
                    )
            if hold is not None:  # phase 1: checked, nothing applied until the commit
                _holds.hold(t, hold, items, bounds, run if not raw else None, keep=bool(values))
                return []
            per_clock = run is not None and t.spec.aggregate == "clock" and not raw
            # What proves the push fits (applied unchecked): its hold's check, or the sender's lease.
            checked = (held.reserved if held is not None and held.checked else None) if held is not None else (
                _holds.spend(t, sender, items, bounds, per_clock) if lease and not raw else None)
            todo = self.store.unapplied(t, items, sender, msg_seq)
            if not replica:
                self.served["pushes"] += 1
                self.served["bytes_pushed"] += sum(getattr(v, "nbytes", 0) for _, _, v in items)
            try:  # a sum that would overflow is refused (PSValueError): nothing changed
                if per_clock:
                    run_id, clock = _check_run(run)
                    self.store.accumulate(t, run_id, clock, todo, sender, checked)
                elif todo:
                    await self._apply(t, todo, raw=raw, bounds=bounds, check=checked is None)
            except PSValueError:
                self.store.unmark(t, todo, sender, msg_seq)  # not applied: a re-send is not a duplicate
                raise
            if not replica:
                await self.replicator.forward(t, items, raw, run, sender, msg_seq, bounds)
            if lease:
                return {"seqs": self.store.seqs(t, items), "lease": _holds.top_up(t, sender, [b for b, *_ in items])}
            return self.store.seqs(t, items)

    async def _apply(self, t, items, raw=False, check=True, bounds=None):
        """Apply validated items (caller holds a table lock). Large ones run on
        the offload thread so the event loop stays responsive; they write in
        place too (readers take the table's locks, so none reads meanwhile;
        a block still being sent from an earlier zero-copy reply is shared
        and gets a fresh array instead). ``bounds``: see ``ShardStore.apply``."""
        nbytes = sum(v.nbytes for _, _, v in items)
        if nbytes >= _config.get_bytes("offload-bytes"):
            from distributed.utils import offload

            fresh = await offload(self.store.apply, t, items, raw=raw, check=check, bounds=bounds)
        else:
            fresh = self.store.apply(t, items, raw=raw, check=check, bounds=bounds)
        self.store.commit(t, fresh)

    # --- placement changes, replication, checkpoints ---------------------------------------
    @handler(INTERNAL)
    async def freeze(self, table: str, table_id: str) -> None:
        """Handler (scheduler), phase 1 of a placement change: wait for pushes
        in progress, then refuse client pushes and pulls (they retry) until
        :meth:`set_placement`."""
        async with self._all_locks(table):
            t = self.store.tables.get(table)
            if t is not None and t.spec.table_id == table_id:
                t.frozen = True

    @handler(INTERNAL)
    async def copy_blocks(self, table: str, table_id: str, moves) -> None:
        """Handler (scheduler), phase 1b: copy ``moves = [(block, target), ...]``
        to their new owners. Every holder is frozen by now, so no push lands
        here while the copies are made."""
        async with self._all_locks(table):
            t = self.store.tables.get(table)
            if t is None or t.spec.table_id != table_id:
                raise UnknownTableError(f"table {table!r} is not hosted on {self.worker.address}", table)
            by_target: dict[str, list[int]] = defaultdict(list)
            if not isinstance(moves, (list, tuple)) or not all(
                    isinstance(m, (list, tuple)) and len(m) == 2 and isinstance(m[1], str)
                    and isinstance(m[0], int) and not isinstance(m[0], bool) for m in moves):
                raise PSValueError(f"table {table!r}: copy_blocks needs [(block, target address), ...]", table)
            for b, target in moves:
                if int(b) not in t.blocks:
                    raise UnknownTableError(f"table {table!r}: block {b} is not on {self.worker.address}", table)
                by_target[target].append(int(b))
            spec = t.spec.to_msg()
            await asyncio.gather(*(
                self.liveness.call(target, lambda target=target, blocks=[
                    _wire.wire_block(e) for e in self.store.export(t, bs)
                ]: self.worker.rpc(target).ps_install_blocks(spec=spec, blocks=blocks,
                                                            token=self.internal_token))
                for target, bs in by_target.items()
            ))

    @handler(INTERNAL)
    def install_blocks(self, spec: dict, blocks, version=None, owners=None) -> None:
        """Handler: receive exported blocks (migration, new replica).

        No lock here: the sender holds its own table lock while it waits for
        this, and two workers sending blocks to each other must not wait on
        each other. Installing is one synchronous step on the event loop; the
        blocks serve only once this worker adopts the new placement.
        Per-clock sums they carry for clocks this worker knows complete are
        applied here (not left for the next advance)."""
        self.store.install(TableSpec.from_msg(spec), version, owners, [_wire.unwire_block(e) for e in blocks],
                           min_clocks=self._min_clock)

    @handler(INTERNAL)
    def fence(self, table: str, table_id: str, blocks) -> list[int]:
        """Handler (scheduler): this worker's replicas of ``blocks`` missed a
        forwarded push; refuse reads of them until they are copied again.
        No lock: one synchronous step, so no read that starts later sees them."""
        return self.store.fence(table, table_id, blocks)

    @handler(INTERNAL)
    def worker_left(self, address: str) -> None:
        """Handler (scheduler): a worker was removed; stop waiting on it."""
        self.liveness.mark_dead(address)

    @handler(INTERNAL)
    def evicted(self, eviction: str, drop: bool = True) -> None:
        """Handler (scheduler): this worker was fenced out as hung (not heard
        for ``ps.timeouts.hung``) and its copies leave every placement.
        ``drop=False`` (at once): they serve nothing from now on, but stay
        while the repairs without it run. Then (``drop=True``, once no
        placement lists this worker) they missed pushes: drop them all. The
        scheduler then takes this worker back as a new member
        (``_liveness.HungWorkers``)."""
        if not isinstance(eviction, str):
            raise PSValueError(f"evicted needs an eviction id, got {eviction!r}")
        if eviction in self._evictions:
            return
        if not drop:
            self.pause_guard.suspend("fenced out as hung")
            logger.warning("dask_ps: %s was fenced out as hung; its copies serve nothing until they are "
                           "replaced", self.worker.address)
            return
        self._evictions.add(eviction)
        for name in list(self.store.tables):
            self.store.drop(name)
        self.pause_guard.clear()
        logger.warning("dask_ps: %s was fenced out as hung; dropped its copies", self.worker.address)

    @handler(INTERNAL)
    def worker_joined(self, address: str) -> None:
        """Handler (scheduler): a worker is back at an address that had left."""
        self.liveness.dead.discard(address)

    @handler(INTERNAL)
    def placement_changed(self, table: str, version: int) -> None:
        """Handler (scheduler): sessions on this worker refresh their handle."""
        self.latest_versions[table] = max(version, self.latest_versions.get(table, 0))

    @handler(INTERNAL)
    async def set_placement(self, table: str, table_id: str, version: int, owners) -> None:
        """Handler (scheduler), phase 2 of a placement change: adopt it, drop
        blocks no longer ours, serve again."""
        if not isinstance(table, str):
            raise PSValueError(f"set_placement needs a table name, got {table!r}")
        async with self._all_locks(table):
            self.store.set_placement(table, table_id, version, owners, self.worker.address)

    @handler(INTERNAL)
    async def save_blocks(self, table: str, table_id: str, directory: str) -> list[int]:
        """Handler (scheduler, for ``ps.save``): write the blocks this worker
        is primary of to ``directory/block-<b>.npz`` (values and rule state),
        via fsspec. Internal: the scheduler names the directory, under the
        path the client's ``ps.save`` gave (``_checkpoint.table_dir``)."""
        async with self._all_locks(table):
            t = self.store.tables.get(table)
            if t is None or t.spec.table_id != table_id:
                raise UnknownTableError(f"table {table!r} is not hosted on {self.worker.address}", table)
            mine = [b for b in sorted(t.blocks) if not t.owners or t.owners[b][0] == self.worker.address]
            exported = self.store.export(t, mine)
        from distributed.utils import offload

        from dask_ps._checkpoint import write_block

        for e in exported:
            await offload(write_block, directory, e)
        return mine

    @handler(INTERNAL)
    async def load_blocks(self, table: str, table_id: str, directory: str, blocks, load_id: str) -> list[int]:
        """Handler (scheduler, for ``ps.load`` and a restore from a
        checkpoint), phase 1: read blocks written by :meth:`save_blocks` and
        check them against the table's spec (shapes, dtypes, rule state,
        NaN/Inf where forbidden: ``ShardStore.check_loaded``); keep them
        aside as ``load_id``. Nothing is installed until every copy's
        owner has read its blocks (:meth:`install_loaded`)."""
        t = self.store.tables.get(table)
        if t is None or t.spec.table_id != table_id:
            raise UnknownTableError(f"table {table!r} is not hosted on {self.worker.address}", table)
        if not (isinstance(load_id, str) and isinstance(blocks, (list, tuple))
                and all(isinstance(b, int) and not isinstance(b, bool) for b in blocks)):
            raise PSValueError(f"table {table!r}: load_blocks needs a load id and block numbers", table)
        from distributed.utils import offload

        from dask_ps._checkpoint import read_checked_block

        exported = [await offload(read_checked_block, t.spec, directory, b) for b in blocks]
        self._loads[load_id] = (table, table_id, exported)
        return [int(b) for b in blocks]

    @handler(INTERNAL)
    async def install_loaded(self, table: str, table_id: str, load_id: str, discard: bool = False) -> None:
        """Handler (scheduler), phase 2 of a load: every owner read and
        checked its blocks, install them (``discard``: one failed, drop them)."""
        staged = self._loads.pop(load_id, None)
        if discard or staged is None:
            return
        if staged[:2] != (table, table_id):
            raise PSValueError(f"load {load_id} is of table {staged[0]!r}, not {table!r}", table)
        async with self._all_locks(table):
            t = self.store.tables.get(table)
            if t is None or t.spec.table_id != table_id:
                raise UnknownTableError(f"table {table!r} is not hosted on {self.worker.address}", table)
            self.store.install(t.spec, t.version, t.owners or None, staged[2])

    @handler(READ_ONLY, tells_internal=True)
    async def pull(self, table=None, version=None, blocks=(), rows=(), run=None, subscribe=None, table_id=None,
                   sender=None, sparse=False, wait=None, internal=False):
        """Handler: values of whole blocks, of ranges ``[start, stop]`` or of
        rows within blocks.

        ``run = (run_id, min_clock)``: the reader knows every participant
        finished ``min_clock`` clocks, so per-clock sums below it are applied
        first. ``wait``: the read is parked here until what it reads holds
        every update of the clocks below ``wait`` (the reply's ``tag`` says
        what it holds: ``RunManager.read_tag``). ``subscribe = (run_id,
        session, address)``: ESSP, send these rows to that session after
        every clock advance. ``sender``: the reply also says, per block, the
        number of that sender's latest push the values contain (``applied``;
        a prefetch tells by it which of its reader's own pushes it holds).
        ``sparse``: values as their rows' nonzeros where that is smaller
        (``dask_ps._sparse_rows``).
        """
        if (run is not None or subscribe is not None or wait is not None) and not internal:
            # A participant's options: ``run`` applies per-clock sums below
            # the clock it names, ``subscribe`` sends rows to an address.
            raise InternalOnlyError("ps_pull with run=, wait= or subscribe= may come only from a participant's "
                                    "session (it carries the cluster's internal token)")
        rows = self._rows_of(rows, blocks, table_id, run, internal)
        seqs, values, summed, applied, tag = await self._read(
            table, version, blocks, rows, run, subscribe, copy=False, table_id=table_id, sender=sender,
            trusted=internal, sparse=sparse is True, wait=wait)
        wired = [wire_values(a, sparse is True) for a in values]
        if sparse is True:  # the bytes sent (_read counted the rows')
            self.served["bytes_pulled"] += sum(wired_nbytes(w) - getattr(a, "nbytes", 0)  # a dict: encoded already
                                               for w, a in zip(wired, values))
        reply = {"seqs": seqs, "values": wired, "summed_below": summed, "applied": applied}
        if tag is not None:
            reply["tag"] = tag
        return framed(reply)

    async def _read(self, table, version, blocks, rows, run, subscribe, copy, table_id=None, sender=None,
                    trusted=False, sparse=False, wait=None):
        """``(seqs, values, summed_below, applied, tag)``; ``summed_below``
        (aggregate="clock", a participant's read, else None): per block, the
        clock below which every per-clock sum of the run is in the values
        returned; ``applied`` (with a ``sender``, else None): per block, that
        sender's latest push number applied to it (None: none); ``tag``
        (a read of a run, else None): every update of the clocks below it
        is in the values."""
        if sender is not None and not isinstance(sender, str):
            raise PSValueError(f"pull sender must be a str, got {sender!r}")
        if wait is not None and (run is None or not isinstance(wait, int) or isinstance(wait, bool)):
            raise PSValueError(f"a pull's wait must be a clock, with run=, got {wait!r}")
        t, reqs = self.store.validate_pull(table, version, blocks, rows, table_id, trusted=trusted)
        run_id = rec = None
        if run is not None:
            run_id, min_clock = _check_run(run)
            self.runs.note_floor(run_id, min_clock)  # learnt from a server: a floor here too
            await self.run_manager.advance(run_id, min_clock)
            if wait is not None:
                rec = await self.run_manager.park_read(run_id, t.spec.name, [b for b, _ in reqs], wait,
                                                       _config.get_seconds("timeouts.clock"))
            else:
                rec = self.runs.records.get(run_id)
        # Not while an update is applied in place on the offload thread.
        async with self._all_locks(t.spec.name):
            # Rows were checked above (one pass); what may have changed while
            # waiting for the locks is checked again.
            try:
                t = self.store.recheck_pull(t, table, version, [b for b, _ in reqs], table_id)
            except StaleVersionError:
                t, reqs = self.store.validate_pull(table, version, blocks, rows, table_id, trusted=trusted)
            self.pause_guard.check()  # stopped for long: these copies may have missed pushes
            summed = tag = None
            if run_id is not None:
                m = math.inf if min_clock is None else min_clock
                tag = m if rec is None else max(m, await self.run_manager.read_tag(rec, t, [b for b, _ in reqs]))
            if run_id is not None and t.spec.aggregate == "clock":
                # The sums this read needs, under this table's own lock: an
                # advance that recorded the min clock may still be applying
                # another table's sums (issue 14).
                await self._apply_due(t, run_id, max(m, self._min_clock.get(run_id, -1)))
                summed = [_wire_clock(self.store.summed_below_of(t, b, run_id)) for b, _ in reqs]
            seqs, values = self._read_locked(t, reqs, subscribe, copy, sparse)
            applied = None
            if sender is not None:
                applied = [max(t.blocks[b].applied[sender]) if t.blocks[b].applied.get(sender) else None
                           for b, _ in reqs]
            self.served["pulls"] += 1
            self.served["bytes_pulled"] += sum(getattr(v, "nbytes", 0) for v in values)
            return seqs, values, summed, applied, None if tag is None else _wire_clock(tag)

    def _read_locked(self, t, reqs, subscribe, copy, sparse=False):
        me = self.worker.address if self.worker is not None else None
        for b, _ in reqs:
            t.reads["primary" if not t.owners or t.owners[b][0] == me else "replica"] += 1
        self.run_manager.subscribe(subscribe, t, reqs, _subscribed_rows)
        return self.store.read(t, reqs, copy=copy, sparse=sparse)

    # --- runs (issue 36: their clocks are counted here; _run_manager.RunManager) ---------
    @property
    def subscriptions(self):
        return self.run_manager.subscriptions

    @property
    def mailboxes(self):
        return self.run_manager.mailboxes

    @property
    def _min_clock(self):
        return self.run_manager.min_clock

    @property
    def _ended_runs(self):
        return self.run_manager.ended

    async def _apply_due(self, t, run_id: str, m: float, blocks=None) -> None:
        await self.run_manager.apply_due(t, run_id, m, blocks)

    async def clock_advance(self, run_id: str, min_clock=None) -> None:
        await self.run_manager.clock_advance(run_id, min_clock)

    def _address(self) -> str | None:
        return self.worker.address if self.worker is not None else None

    async def _peer_clocks(self, peer: str, run_id: str):
        return await self.liveness.call(peer, lambda: asyncio.wait_for(
            self.worker.rpc(peer).ps_run_clocks(run_id=run_id, token=self.internal_token),
            _config.get_seconds("timeouts.rpc")))

    async def _run_push(self, **msg):
        """One push of a participant's clock message (``RunManager.run_clock``):
        trusted, as the message carried the internal token; a direct call's
        items as ``local_push`` takes them."""
        items = msg.pop("items", None)
        if items is not None:
            return await self.local_push(items=items, **msg)
        return await self.push(**msg, internal=True)

    async def _run_read(self, local=None, **msg):
        """One read of a participant's clock message (``RunManager.run_clock``),
        as ``ps_pull`` answers it; a direct call's (``local``: whether the
        reader gets copies) as ``local_pull``."""
        if local is not None:
            return await self.local_pull(copy=bool(local), **msg)
        return await self.pull(**msg, internal=True)

    @handler(INTERNAL)
    def run_update(self, record: dict) -> None:
        """Handler (scheduler): a run's membership (started, a participant
        joined, left or the run was aborted, its servers changed)."""
        if not isinstance(record, dict):
            raise PSValueError(f"run_update needs a record, got {record!r}")
        self.runs.update(record)
        clock_combiner.run_changed(record.get("run_id"), record.get("done") or (), bool(record.get("aborted")))

    @handler(INTERNAL)
    async def run_clock(self, run_id=None, rank=None, clock=None, sections=None, **msg):
        """Handler (a participant): ``rank`` completed ``clock`` clocks; with
        ``pushes``, its pushes to this server in the same message, and the
        reads of the next clock it prefetched (``RunManager.run_clock``).
        ``sections``: such messages of several participants of one worker
        process, combined (``dask_ps._clock_combiner``), each made as a
        message of its own; the reply holds each one's reply or error."""
        received = self.run_manager.received
        if sections is not None:
            received["clock"] += 1
            received["clock_sections"] += len(sections) if isinstance(sections, (list, tuple)) else 0
            return {"sections": await answer_sections(sections, self._run_clock)}
        if not isinstance(run_id, str):
            raise PSValueError(f"run_clock needs a run id (or sections), got {run_id!r}")
        kind = "clock" if msg.get("pushes") is not None else "clock_report"
        received[kind] += 1
        received["clock_sections"] += kind == "clock"
        return await self._run_clock(run_id, rank, clock, **msg)

    async def local_run_clock(self, **msg):
        """A clock call of a participant in this process: a direct call, no message."""
        self.run_manager.received["clock_local"] += 1
        return await self._run_clock(**msg)

    async def _run_clock(self, run_id: str, rank: int, clock: int, wait_for=None, timeout=None, pushes=None,
                         versions=None, reads=None):
        """One participant's clock message (or a section of a combined one)."""
        # Every keyed row list first: a message whose list is not held here
        # is refused before any of it applies (its sender sends it in full).
        for m in [*(pushes or ()), *(reads or ())]:
            if isinstance(m, dict) and isinstance(m.get("rows"), (list, tuple)):
                m["rows"] = self._rows_of(m["rows"], m.get("blocks"), m.get("table_id"), (run_id, None))
        return await self.run_manager.run_clock(run_id, rank, clock, wait_for, timeout, pushes, versions, reads)

    @handler(INTERNAL)
    async def run_wait(self, run_id: str, clock: int, timeout=None):
        """Handler (a participant's read): park until every live participant
        completed ``clock`` clocks; returns the run-wide minimum."""
        return await self.run_manager.run_wait(run_id, clock, timeout)

    @handler(INTERNAL)
    def run_clocks(self, run_id: str) -> dict | None:
        """Handler (a peer that joins a run late, the scheduler at a retried
        participant's join): this worker's run-wide clocks of ``run_id``."""
        return self.run_manager.run_clocks(run_id)

    @handler(INTERNAL)
    def cache_fill(self, session, table, version, tag, blocks, seqs, rows, values, summed_below=None,
                   run_id=None) -> None:
        """Handler: fresh rows for a session on this worker (ESSP).
        ``summed_below``: as in a pull's reply (aggregate="clock")."""
        self.run_manager.cache_fill(session, table, version, tag, blocks, seqs, rows, values, summed_below, run_id)

    @handler(INTERNAL)
    async def run_end(self, run_id: str) -> None:
        """Handler (scheduler): a run ended; apply what it left, forget it
        (its exactly-once windows included) and refuse its pushes from now on."""
        await self.run_manager.run_end(run_id)
        self.row_lists.forget_run(run_id)

    @handler(READ_ONLY)
    def gpu_info(self) -> dict | None:
        """Handler: this worker's GPU and its free memory, None without one."""
        return _backend.gpu_info()

    @handler(READ_ONLY)
    async def block_seqs(self, table: str, table_id: str, drained: bool = False) -> dict:
        """Handler (scheduler, at a run's end): the update count of every
        block of ``table`` held here (``Block.seq``; copies of a block that
        hold the same updates have the same count). ``drained``: read once
        the pushes this worker is applying as a primary are done, so every
        push counted in its primary blocks' counts has reached their
        replicas (a primary forwards under its table lock)."""
        t = self.store.tables.get(table) if isinstance(table, str) else None
        if drained and t is not None:
            async with self._locks[table]:
                t = self.store.tables.get(table)
        if t is None or t.spec.table_id != table_id:
            return {}
        return {int(b): int(blk.seq) for b, blk in t.blocks.items()}

    @handler(READ_ONLY)
    def info(self, served: bool = False) -> dict:
        """Handler: which blocks of which tables live here, and their bytes;
        ``served=True``: also the pushes and reads served (the dashboard)."""
        if served:
            return {"tables": self.info(), "served": dict(self.served), "runs": self.runs.info()}
        return {
            name: {"version": t.version, "blocks": sorted(t.blocks), "nbytes": t.nbytes,
                   "missed": sorted(t.missed), "reads": dict(t.reads)}
            for name, t in self.store.tables.items()
        }

    # --- same-process access (a participant on this worker) -------------------------
    async def local_push(self, table, version, items, raw=False, run=None, sender=None, msg_seq=None, table_id=None,
                         bound=None, hold=None, commit=None, lease=False):
        blocks, rows, values = zip(*items) if items else ((), (), ())
        return await self._push(table, version, list(blocks), list(rows), list(values), raw, run,
                                sender, msg_seq, False, table_id, trusted=True, bound=bound, hold=hold, commit=commit,
                                lease=lease)

    async def local_pull(self, table, version, blocks, rows, run=None, subscribe=None, table_id=None, sender=None,
                         copy=True, wait=None):
        """``ps_pull`` for a session in this process, without Dask's comm, its
        rows trusted (the session checked them): this worker's own session
        (copies), or one of another worker of an in-process cluster
        (``copy=False``: replies shared read-only, as the in-process comm
        hands them over; see :func:`in_process_peer`)."""
        seqs, values, summed, applied, tag = await self._read(
            table, version, blocks, rows, run, subscribe, copy=copy, table_id=table_id, sender=sender,
            trusted=True, wait=wait)
        return {"seqs": seqs, "values": values, "summed_below": summed, "applied": applied, "tag": tag}


# The dask_ps worker plugins of this process by worker address: workers of
# an in-process cluster (LocalCluster(processes=False), the embedded
# default) read each other's shards by a direct call on their shared event
# loop, as Bösen's threads share one process's tables, instead of a message
# through Dask's in-process comm (issue 12).
_IN_PROCESS: "weakref.WeakValueDictionary[str, PSWorkerPlugin]" = weakref.WeakValueDictionary()


def in_process_peer(address: str, loop=None):
    """The plugin of the running worker ``address`` if it lives in this
    process and runs on the calling event loop (or on ``loop``), else None
    (then the call goes through Dask's comm, which also reports a closed
    worker)."""
    peer = _IN_PROCESS.get(address)
    if peer is None or peer.worker is None or peer.worker.status != Status.running:
        return None
    try:
        if peer.worker.loop.asyncio_loop is not (loop or asyncio.get_running_loop()):
            return None
    except (AttributeError, RuntimeError):
        return None
    return peer


def _subscribed_rows(r):
    """A subscription's own host copy of a read's rows (None: the whole block)."""
    if isinstance(r, slice):
        return np.arange(r.start, r.stop)
    return None if r is None else _backend.to_numpy(r)


def _check_run(run):
    if not (isinstance(run, (list, tuple)) and len(run) == 2 and isinstance(run[0], str)
            and (run[1] is None or isinstance(run[1], (int, float)))):
        raise PSValueError(f"run tag must be (run_id, clock), got {run!r}")
    return run[0], run[1]


WORKER_HANDLERS = HandlerRegistry("worker", PSWorkerPlugin)
