"""The scheduler half of dask_ps: metadata only.

Holds which tables exist (their specs), where each row block lives, which
workers serve shards, and the runs' membership (``_runs.Runs``; the servers
count the clocks, ``_runclocks``). It never holds parameter data: values
move between workers (and the client) directly.
Placement changes (repair, evacuate, rebalance, resync) are
``_rebalance.PlacementChanger``; calls to workers go through
``_liveness.WorkerCalls``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

from dask.utils import format_bytes
from distributed import SchedulerPlugin
from distributed.core import error_message
from distributed.protocol.pickle import dumps, loads

from dask_ps import _config, _dashboard
from dask_ps._exceptions import (DataLostError, PSError, PSValueError, SchedulerLostError, TableExistsError,
                                 UnknownTableError)
from dask_ps._handlers import CLIENT, INTERNAL, READ_ONLY, HandlerRegistry, InternalRPC, check_owner, handler
from dask_ps._liveness import HungWorkers, Liveness, WorkerCalls
from dask_ps._memory_check import bytes_per_value, check_headroom, check_total
from dask_ps._placement import place_blocks
from dask_ps._rebalance import PlacementChanger
from dask_ps._retire import Retirements
from dask_ps._runs import Runs
from dask_ps._spec import TableSpec
from dask_ps._worker_plugin import PLUGIN_NAME, PSWorkerPlugin

logger = logging.getLogger(__name__)

ROLLBACK_HISTORY = 32  # rollback records kept per table (ps.rollbacks)
SAVES_KEPT = 64  # saves driven here whose manifest the client may still note (ps_note_checkpoint)


@dataclass
class SchedulerTableState:
    spec: TableSpec
    spec_msg: dict
    version: int
    owners: list[list[str]]  # owners[block] = [primary, replicas...]
    lost: dict[int, str] = field(default_factory=dict)  # block -> how it was lost
    checkpoint: tuple[str, str] | None = None  # (path, data dir) of the latest save
    checkpoint_time: float | None = None  # when that save (or load) was noted
    restored: int = 0  # blocks restored from a checkpoint after a loss (updates since were lost)
    # the latest restores from a checkpoint (records as RolledBackError.rollbacks)
    rollbacks: deque = field(default_factory=lambda: deque(maxlen=ROLLBACK_HISTORY))
    rollback_count: int = 0  # restores since the table was created (handles carry it: clients raise once)
    # block -> replicas that missed a forwarded push: fenced (no reads), never
    # a copy source or a promoted primary, copied again by ``PlacementChanger.resync``
    stale: dict[int, set[str]] = field(default_factory=dict)
    # While a placement change copies blocks (``PlacementChanger.change``,
    # until every holder adopted): the placement before it. Its holders have
    # the up-to-date copies; the new owners' copies are not all made yet.
    changing_from: list[list[str]] | None = None

    def __repr__(self):
        return f"<SchedulerTableState {self.spec.name!r} v{self.version} {len(self.owners)} blocks>"

    def handle_msg(self) -> dict:
        if self.lost:
            raise DataLostError(
                f"table {self.spec.name!r}: row block(s) {sorted(self.lost)} were lost "
                f"({'; '.join(sorted(set(self.lost.values())))}) and there is no replica or "
                "checkpoint to restore them from. Drop the table, or ps.load() a checkpoint.",
                self.spec.name,
            )
        return {"spec": self.spec_msg, "version": self.version, "owners": self.owners,
                "stale": [[b, sorted(ws)] for b, ws in sorted(self.stale.items())],
                "rollbacks": self.rollback_count}

    def stale_owned(self, owners=None) -> dict[int, set[str]]:
        """Stale copies that ``owners`` (default: the current placement) keeps."""
        owners = self.owners if owners is None else owners
        out = {b: ws & set(owners[b]) for b, ws in self.stale.items() if b < len(owners)}
        return {b: ws for b, ws in out.items() if ws}

    def holders(self) -> set[str]:
        return {w for ws in self.owners for w in ws}

    def up_to_date(self, b: int) -> set[str]:
        """The workers that hold an up-to-date copy of block ``b`` (during a
        placement change: the old placement's, whose copies are complete)."""
        owners = self.changing_from if self.changing_from is not None else self.owners
        have = set(owners[b]) if b < len(owners) else set()
        return have - self.stale.get(b, set())

    def listed(self) -> set[str]:
        """Every worker a placement names (during a change, old and new)."""
        return self.holders() | {w for ws in (self.changing_from or ()) for w in ws}


class PSSchedulerPlugin(SchedulerPlugin):
    """Scheduler extension: table registry, placement, membership, run clocks.

    Registering it (``client.register_plugin(PSSchedulerPlugin())``) also
    installs :class:`PSWorkerPlugin` on every current and future worker.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.scheduler = None
        self.members: set[str] = set()
        self.tables: dict[str, SchedulerTableState] = {}
        self._table_locks: dict[str, asyncio.Lock] = {}
        self._servers_changed = None
        self._background: set[asyncio.Task] = set()
        self.retire = Retirements(self)  # retiring workers: evacuation, then gone
        self._retiring = self.retire.retiring
        self.liveness = Liveness()
        self.internal_token = None  # the workers' (set in start); internal handlers require it
        self.calls = WorkerCalls(self.worker_rpc, self.liveness, self._retiring, self.members)
        self.run_book = Runs(self.calls, self.members, self.in_background)  # membership; servers count clocks
        self.runs = self.run_book.runs
        # Built in start, once the scheduler is known, from what they use (_build_parts).
        self.placement: PlacementChanger | None = None  # repair, evacuate, rebalance, resync
        self.hung: HungWorkers | None = None  # fences out members that stop answering
        self._saves: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()  # (path, data) -> {table: id}
        self.creating: dict[str, list[list[str]]] = {}  # table -> owners, while its shards are created
        self.totals: Counter = Counter()  # metrics summed over finished participants
        self.dashboard = None  # the /ps page's state (_dashboard.PSDashboard), set in start
        # This plugin instance, i.e. these tables: a new scheduler (even at the
        # same address, with a client that reconnected to it) has another.
        # A ParameterServer sends the id it attached to with every call.
        self.cluster_id = uuid.uuid4().hex

    def __repr__(self):
        return f"<PSSchedulerPlugin servers={len(self.members)} tables={sorted(self.tables)} runs={len(self.runs)}>"

    def worker_rpc(self, worker: str) -> InternalRPC:
        """The scheduler's rpc to ``worker``, carrying the internal token that
        the workers' internal handlers require (docs/security.rst)."""
        return InternalRPC(self.scheduler.rpc(worker), self.internal_token)

    async def start(self, scheduler):
        self.scheduler = scheduler
        self._servers_changed = asyncio.Condition()
        self._build_parts(scheduler)
        # The workers' plugin, and with it the cluster's internal token: known
        # before any worker sets up (its ps_register_server needs it).
        registered = scheduler.worker_plugins.get(PLUGIN_NAME)
        worker_plugin = PSWorkerPlugin() if registered is None else loads(registered)
        self.internal_token = worker_plugin.internal_token
        # Every ps_* handler, behind the check of its access level.
        SCHEDULER_HANDLERS.install(self, scheduler.handlers, lambda: self.internal_token, before=self._check_cluster)
        scheduler.extensions[PLUGIN_NAME] = self
        from dask_ps import _prometheus

        _prometheus.register(self)
        if registered is None:
            await scheduler.register_worker_plugin(None, dumps(worker_plugin), name=PLUGIN_NAME, idempotent=True)
        self.dashboard = _dashboard.install(scheduler, self)  # the /ps page on the Dask dashboard
        self.hung.start()

    def _build_parts(self, scheduler) -> None:
        """The placement changer and the hung-worker watch, each handed the
        state and the calls it uses (never this plugin)."""
        self.placement = PlacementChanger(
            tables=self.tables, table_lock=self.table_lock, members=self.members, retiring=self._retiring,
            running_members=self.running_members, scheduler=scheduler, liveness=self.liveness,
            calls=self.calls, in_background=self.in_background, note_rollback=self.note_rollback,
        )
        self.hung = HungWorkers(
            scheduler=scheduler, members=self.members, retiring=self._retiring, tables=self.tables,
            creating=self.creating, liveness=self.liveness, calls=self.calls, worker_rpc=self.worker_rpc,
            in_background=self.in_background, repair=self.placement.repair, retiree_left=self.retire.left,
            rejoin=self.register_server,
        )

    def _check_cluster(self, op: str, msg: dict):
        """A message that carries ``cluster_id`` (a ParameterServer's calls)
        is refused unless it names this plugin instance, so an object
        attached to a lost scheduler never reads or changes a new cluster's
        tables as its own (run before every handler: ``HandlerRegistry.install``)."""
        expected = msg.pop("cluster_id", None)
        if expected is not None and expected != self.cluster_id:
            return error_message(SchedulerLostError(
                f"the scheduler at {self.scheduler.address} is not the one this ParameterServer "
                f"attached to: its dask_ps state is another cluster's (id {self.cluster_id}, "
                f"expected {expected}; refused {op})"
            ), status="uncaught-error")
        return None

    @handler(READ_ONLY)
    def cluster(self) -> dict:
        """Handler: ``{"cluster_id": ...}`` of this plugin instance (see ``_check_cluster``)."""
        return {"cluster_id": self.cluster_id}

    async def close(self):
        from dask_ps import _prometheus

        _prometheus.unregister(self)
        if self.hung is not None:
            self.hung.stop()
        self.run_book.abort_all("the scheduler is closing")
        self.tables.clear()

    def restart(self, scheduler):
        # Workers come back empty after a restart: every table is gone.
        self.tables.clear()
        self.members.clear()
        self.run_book.abort_all("the cluster was restarted")

    def remove_worker(self, scheduler, worker, *, stimulus_id=None, **kwargs):
        """A worker left (killed, retired, or the cluster is closing): take it
        out of every placement and repair in the background (promote a
        replica, add a new one, or restore from a checkpoint). A retiring
        one may still serve its evacuation (``_retire.Retirements``)."""
        if not self.retire.removed(worker, stimulus_id):
            self._worker_gone(worker, stimulus_id)

    def _worker_gone(self, worker, stimulus_id):
        self.retire.forget(worker)
        self.hung.forget(worker)
        self.liveness.mark_dead(worker)
        self.members.discard(worker)
        if self.scheduler.status.name != "running":
            return  # shutting down: nothing to repair
        # Everyone stops waiting on it now (a connect to a dead address would
        # retry for distributed.comm.timeouts.connect).
        self.scheduler.log_event("ps-worker-left", {"address": worker})
        self._in_background(self.calls.broadcast("ps_worker_left", address=worker))
        self.run_book.servers_changed()  # the participants stop reporting clocks to it
        for t in list(self.tables.values()):
            if worker in t.listed():
                self._in_background(self.placement.repair(t.spec.name, gone={worker}, reason=f"{worker} left ({stimulus_id})"))

    # --- background tasks; what Retirements uses of this plugin ---------------------------
    def in_background(self, coro) -> None:
        """Run ``coro`` as a background task (``ps_placement_settled`` waits for it)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    _in_background = in_background
    worker_gone = _worker_gone  # (Retirements)

    @property
    def retiring(self) -> set[str]:
        """Workers being retired (still serving while their blocks move)."""
        return self._retiring

    # --- membership -------------------------------------------------------------
    @handler(INTERNAL)
    async def register_server(self, address: str) -> None:
        """Handler (worker plugin setup): this worker can host shards. Tables
        rebalance onto it in the background (consistent hashing: about 1/N
        of the blocks move).

        Only a worker Dask has: the worker's setup calls this after Dask
        registered it, and a worker that dies meanwhile (killed as it
        starts) may be removed before this runs. Taken as a member, it
        would never leave again (Dask removes a worker once): every run's
        start, abort and end, every broadcast and rebalance would wait on
        connects to its dead address (``distributed.comm.timeouts.connect``
        each), and blocks would be moved onto it."""
        if address not in self.scheduler.workers:
            logger.info("dask_ps: %s registered as a server after Dask removed it: not taken", address)
            return
        new = address not in self.members
        self.members.add(address)
        if address in self.liveness.dead:  # back at the same address: reachable again
            self.liveness.dead.discard(address)
            self.scheduler.log_event("ps-worker-joined", {"address": address})
            self._in_background(self.calls.broadcast("ps_worker_joined", address=address))
        async with self._servers_changed:
            self._servers_changed.notify_all()
        if new:
            self.run_book.servers_changed()  # it counts the runs' clocks from now on
        if new and self.tables:
            for name in list(self.tables):
                self._in_background(self.placement.rebalance(name))

    @handler(INTERNAL)
    async def evacuate(self, address: str) -> None:
        """Handler (worker plugin teardown, e.g. ``retire_workers``): wait until
        the worker's blocks have moved away (it still serves them meanwhile),
        at most ``ps.timeouts.failover``; it is marked gone before this
        returns (``_retire.Retirements.wait_evacuated``)."""
        await self.retire.wait_evacuated(address)

    def log_event(self, topic, msg):
        # retire_workers marks a worker closing_gracefully before closing it.
        if isinstance(msg, dict) and msg.get("action") == "worker-status-change" and topic in self.members:
            self.retire.status_changed(topic, msg.get("status"))

    @handler(READ_ONLY)
    async def placement_settled(self) -> None:
        """Handler: wait for background placement changes (tests, benchmarks)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    @handler(READ_ONLY)
    def active_runs(self, tables=None) -> list[str]:
        """Handler: runs in progress (that used any of ``tables``, if given)."""
        return self.run_book.active(tables)

    @handler(INTERNAL)
    def run_uses(self, run_id: str, table: str) -> None:
        """Handler: a participant of ``run_id`` uses ``table``."""
        self.run_book.uses(run_id, table)

    # --- checkpoints: ps.save and ps.load drive them, workers read and write the blocks ---------
    def _checkpoint_dir(self, path, data, name) -> str:
        """Where table ``name``'s blocks of the checkpoint ``path``/``data`` are
        (only ever under that directory: ``_checkpoint.table_dir``)."""
        from dask_ps._checkpoint import table_dir

        if not isinstance(path, str) or not path:
            raise PSValueError(f"a checkpoint path must be a non-empty str, got {path!r}", name)
        try:
            return table_dir(path, data, name)
        except ValueError as e:
            raise PSValueError(f"table {name!r}: {e}", name) from None

    @handler(CLIENT)
    async def save_tables(self, path: str, data: str, tables) -> dict:
        """Handler (``ps.save``): the holders of each of ``tables`` write the
        blocks they are primary of under ``path/data/<table>`` (a directory
        computed here, so nothing is written anywhere else); returns each
        table's spec for the manifest. The save counts as the tables'
        checkpoint once the client committed the manifest and said so
        (:meth:`note_checkpoint`)."""
        if not isinstance(tables, (list, tuple)) or not all(isinstance(n, str) for n in tables):
            raise PSValueError(f"ps.save needs table names, got {tables!r}")
        dirs = {name: self._checkpoint_dir(path, data, name) for name in tables}
        specs, saved = {}, {}
        for name in tables:
            async with self.table_lock(name):  # no placement change meanwhile
                t = self._table(name)
                t.handle_msg()  # a table with lost blocks raises DataLostError
                try:
                    written = await asyncio.gather(*(
                        self.calls.call(w, "ps_save_blocks", table=name, table_id=t.spec.table_id,
                                        directory=dirs[name])
                        for w in sorted(t.holders())
                    ))
                except Exception as e:
                    if type(e) is not Exception:
                        raise
                    # A worker's error, as the scheduler's rpc gives it (not deserialized).
                    raise PSError(f"ps.save: table {name!r}: writing its blocks to {dirs[name]} failed on a "
                                  f"worker: {e}") from None
                got = sorted(b for bs in written for b in bs)
                if got != list(range(t.spec.n_blocks)):
                    raise PSValueError(f"ps.save: table {name!r}: blocks written {got}, expected all "
                                       f"{t.spec.n_blocks}; retry", name)
                specs[name], saved[name] = t.spec_msg, t.spec.table_id
        self._saves[(path, data)] = saved
        while len(self._saves) > SAVES_KEPT:
            self._saves.popitem(last=False)
        return specs

    @handler(CLIENT)
    def note_checkpoint(self, path: str, data: str, tables: list[str]) -> None:
        """Handler (``ps.save``, once its manifest is committed): ``tables``
        were saved to ``path`` (their blocks are restored from it after a
        loss). Only a save this scheduler drove (:meth:`save_tables`) of
        those very tables is accepted: a made-up path is refused."""
        saved = self._saves.get((path, data)) if isinstance(path, str) and isinstance(data, str) else None
        if not isinstance(tables, (list, tuple)):
            raise PSValueError(f"note_checkpoint needs table names, got {tables!r}")
        for name in tables:
            t = self.tables.get(name)
            if t is not None and (saved is None or saved.get(name) != t.spec.table_id):
                raise PSValueError(f"table {name!r}: no ps.save of it to {path!r} ({data}) went through this "
                                   "scheduler: a checkpoint is noted only after the save wrote it", name)
        for name in tables:
            if name in self.tables:
                self._record_checkpoint(self.tables[name], path, data)
                saved.pop(name, None)

    def _record_checkpoint(self, t: SchedulerTableState, path: str, data: str) -> None:
        t.checkpoint = (path, data)
        t.checkpoint_time = time.time()

    @handler(CLIENT)
    async def load_table(self, name: str, table_id: str, path: str, data: str) -> None:
        """Handler (``ps.load``, after it created the table): fill every copy
        of every block of table ``name`` from the checkpoint ``path``/``data``,
        or no copy at all: each block is checked against the table's spec
        first (shapes, dtypes, rule state, NaN/Inf where forbidden;
        :meth:`PlacementChanger.load_copies`). Then the checkpoint is the table's."""
        directory = self._checkpoint_dir(path, data, name)
        async with self.table_lock(name):
            t = self._table(name)
            if t.spec.table_id != table_id:
                raise PSValueError(f"table {name!r} was created again while it was being loaded", name)
            t.handle_msg()
            await self.placement.load_copies(t, directory, list(range(t.spec.n_blocks)))
            self._record_checkpoint(t, path, data)

    def note_rollback(self, t: SchedulerTableState, blocks: list[int], reason: str) -> None:
        """``blocks`` of ``t`` were lost and restored from its checkpoint:
        every update since that checkpoint is gone. Recorded on the table
        (``ps_rollbacks``) and on every active run, whose end reports it
        (``ParameterServer.run`` raises ``RolledBackError``)."""
        record = {
            "table": t.spec.name, "blocks": sorted(int(b) for b in blocks), "reason": reason,
            "checkpoint": t.checkpoint[0], "checkpoint_time": t.checkpoint_time, "restored_at": time.time(),
        }
        t.rollbacks.append(record)
        t.rollback_count += 1
        # The event also says which table (its id) and how many restores it
        # had: a client's next call on it raises RolledBackError once.
        self.scheduler.log_event("ps-rollback", {**record, "table_id": t.spec.table_id, "count": t.rollback_count})
        self.run_book.rolled_back(record)

    async def _copies_disagree(self, name: str, attempts: int = 3) -> list:
        """Listed, not stale copies of ``name``'s blocks that miss updates
        their block's primary had applied and forwarded, or that are
        missing, as ``[block, worker, seq, least]``; asked again before they
        count. Such copies are marked stale (no reads) and copied again.

        A push may be between its primary and a replica as the counts are
        read (an aborted run's participants go on until their next clock,
        another run or client may push): the primaries' counts are read
        first, once the pushes they are applying are done (``drained``: a
        primary forwards under its table lock), then every copy's. A
        replica's count must be at least its primary's first; the
        primary's at least every replica's first (a replica applies only
        what its primary applied before)."""
        found = []
        for attempt in range(attempts):
            t = self.tables.get(name)
            if t is None or t.lost or t.changing_from is not None:
                return []
            owners = [list(ws) for ws in t.owners]
            holders = sorted({w for ws in owners for w in ws if w in self.members})
            first = await self._block_seqs(holders, name, t.spec.table_id, drained=True)
            got = await self._block_seqs(holders, name, t.spec.table_id)
            if self.tables.get(name) is not t or t.owners != owners:
                return []  # the placement changed meanwhile: it made its own copies
            found = []
            for b, ws in enumerate(owners):
                listed = [w for w in ws if w in got and w in first and w not in t.stale.get(b, ())]
                if not listed or listed[0] != ws[0]:
                    continue  # no count of its primary (gone, or stale: being copied again)
                primary, replicas = listed[0], listed[1:]
                least = {primary: max((first[r][b] for r in replicas if first[r].get(b) is not None), default=None)}
                least.update((r, first[primary].get(b)) for r in replicas)
                for w in listed:
                    have, want = got[w].get(b), least[w]
                    if want is not None and (have is None or have < want):
                        found.append([b, w, have, want])
            if not found:
                return []
            await asyncio.sleep(0.2 * (attempt + 1))
        t = self.tables.get(name)
        if t is not None:
            by_worker: dict[str, list[int]] = {}
            for b, w, _, _ in found:
                t.stale.setdefault(b, set()).add(w)
                by_worker.setdefault(w, []).append(b)
            await asyncio.gather(*(
                asyncio.wait_for(self.calls.call(w, "ps_fence", table=name, table_id=t.spec.table_id, blocks=bs), 10)
                for w, bs in by_worker.items()
            ), return_exceptions=True)
            logger.error("dask_ps: table %r: copies that missed updates at the end of a run: %s; copying them again",
                         name, found)
            if name not in self.placement.resync_pending:
                self.placement.resync_pending.add(name)
                self.in_background(self.placement.resync(name))
        return found

    async def _block_seqs(self, holders, name: str, table_id: str, drained: bool = False) -> dict:
        """``holder -> {block: Block.seq}`` of the holders that answered in 10 s."""
        seqs = await asyncio.gather(*(
            asyncio.wait_for(self.calls.call(w, "ps_block_seqs", table=name, table_id=table_id, drained=drained), 10)
            for w in holders
        ), return_exceptions=True)
        return {w: s for w, s in zip(holders, seqs) if isinstance(s, dict)}

    @handler(INTERNAL)
    def alive(self, address: str) -> None:
        """Handler (a worker's ``_liveness.Beacon``, one-way, from its own
        thread): that worker's process runs, whatever its event loop does."""
        if isinstance(address, str) and (address in self.scheduler.workers or address in self._retiring):
            self.hung.alive(address)

    @handler(INTERNAL)
    def fenced_out(self, address: str) -> bool:
        """Handler (a worker that was stopped for long, ``PauseGuard``): was
        it fenced out as hung (its copies must not serve until it dropped them)?"""
        return address in self.hung.fenced

    @handler(READ_ONLY)
    def rollbacks(self, table: str | None = None) -> list[dict]:
        """Handler: the latest restores from a checkpoint (of ``table``, or of every table)."""
        names = [table] if table is not None else sorted(self.tables)
        return [r for name in names for r in self._table(name).rollbacks]

    # --- placement (the freeze/copy/adopt protocol is _rebalance.PlacementChanger) ----
    def running_members(self) -> set[str]:
        """Members that can take blocks: not closing or being retired."""
        ws = self.scheduler.workers
        return {w for w in self.members if w in ws and ws[w].status.name == "running"}

    _running_members = running_members

    def table_lock(self, name: str) -> asyncio.Lock:
        """The lock that orders creation and placement changes of table ``name``."""
        return self._table_locks.setdefault(name, asyncio.Lock())

    @handler(INTERNAL)
    async def replica_missed(self, table: str, table_id: str, replica: str, blocks) -> None:
        """Handler (a block's primary): ``replica`` failed to apply a forwarded
        push to ``blocks``; returns once the copy is fenced
        (:meth:`PlacementChanger.replica_missed`)."""
        await self.placement.replica_missed(table, table_id, replica, blocks)

    @handler(READ_ONLY)
    async def servers(self, n: int = 0, timeout: float = 0, running: bool = False) -> list[str]:
        """Handler: current shard servers; with ``n``, wait up to ``timeout``
        seconds until at least ``n`` have registered. ``running``: only
        those Dask runs tasks on, if any (where work is placed: a worker
        paused by its memory monitor starts none, issue 34)."""
        if n and len(self.members) < n:
            async with self._servers_changed:
                try:
                    await asyncio.wait_for(
                        self._servers_changed.wait_for(lambda: len(self.members) >= n), timeout
                    )
                except asyncio.TimeoutError:
                    pass
        ws = self.scheduler.workers
        live = [a for a in sorted(self.members) if a in ws and ws[a].status.name == "running"] if running else []
        return live or sorted(self.members)

    # --- tables -------------------------------------------------------------------
    @handler(CLIENT)
    async def create_table(self, spec: dict) -> dict:
        """Handler: create a table (idempotent for an identical spec)."""
        new = TableSpec.from_msg(spec)
        async with self.table_lock(new.name):
            have = self.tables.get(new.name)
            if have is not None:
                if have.spec.same_as(new):
                    return have.handle_msg()
                raise TableExistsError(
                    f"table {new.name!r} already exists with {have.spec.describe()}; "
                    f"requested {new.describe()}. Drop it first or use another name.",
                    new.name,
                )
            self._check_memory(new)
            owners = place_blocks(
                new.name,
                new.n_blocks,
                self.members,
                vnodes=int(_config.get("vnodes")),
                load_factor=float(_config.get("load-factor")),
                replication=new.replication,
            )
            version = 1
            by_worker: dict[str, list[int]] = {}
            for b, ws in enumerate(owners):
                for w in ws:
                    by_worker.setdefault(w, []).append(b)
            if new.device == "cuda":
                await self._check_gpu_memory(new, by_worker)
            check_headroom(new, by_worker, self.scheduler.workers)  # each worker, against Dask's thresholds
            # Until the table is registered, its blocks are only here: a
            # worker holding a sole copy must not be fenced out as hung
            # meanwhile (HungWorkers reads ``creating``).
            self.creating[new.name] = owners
            try:
                await asyncio.gather(
                    *(
                        self.worker_rpc(w).ps_create_shards(spec=spec, version=version, blocks=bs, owners=owners)
                        for w, bs in by_worker.items()
                    )
                )
            finally:
                self.creating.pop(new.name, None)
            state = SchedulerTableState(new, spec, version, owners)
            self.tables[new.name] = state
            # A worker fenced out or removed while the shards were created
            # was not repaired out of this table (it was not registered yet):
            # repair now, before its eviction could leave a listed owner with
            # no copy (HungWorkers._take_back waits for this).
            for w in sorted(state.holders()):
                if w in self.hung.fenced or w in self.liveness.dead:
                    self._in_background(self.placement.repair(
                        new.name, gone={w}, reason=f"{w} left while the table was created"))
            logger.info("dask_ps: created table %r (%s) on %d workers", new.name, new.describe(), len(by_worker))
            return state.handle_msg()

    def _check_memory(self, spec: TableSpec) -> None:
        """Refuse a table that cannot fit the members' summed memory
        limits (``_memory_check.check_total``)."""
        check_total(spec, [self.scheduler.workers[w].memory_limit for w in self.members
                           if w in self.scheduler.workers])

    async def _gpus(self, workers) -> dict:
        """Each worker's GPU (``_backend.gpu_info``), None where it has none."""
        workers = sorted(workers)
        infos = await asyncio.gather(*(self.calls.call(w, "ps_gpu_info") for w in workers), return_exceptions=True)
        return {w: (None if isinstance(i, BaseException) else i) for w, i in zip(workers, infos)}

    @handler(READ_ONLY)
    async def resolve_device(self) -> str:
        """Handler: ``device="auto"`` -- "cuda" when every worker has a GPU, else "cpu"."""
        gpus = await self._gpus(self.members)
        return "cuda" if gpus and all(gpus.values()) else "cpu"

    async def _check_gpu_memory(self, spec: TableSpec, by_worker: dict) -> None:
        """Refuse a ``device="cuda"`` table that a worker cannot hold: a worker
        without a GPU, or blocks (x optimizer state) above
        ``ps.max-memory-fraction`` of a GPU's free memory, summed over the
        workers that share that GPU (several dask-cuda workers may)."""
        gpus = await self._gpus(by_worker)
        missing = sorted(w for w, g in gpus.items() if not g)
        if missing:
            raise PSValueError(
                f"table {spec.name!r}: device='cuda' but worker(s) {missing} have no usable GPU (cupy "
                "missing or no CUDA device). Use dask-cuda workers, device='cpu', or device='auto'.",
                spec.name,
            )
        block_bytes = spec.nbytes / max(1, spec.n_blocks) * bytes_per_value(spec)
        need: dict[tuple, float] = {}
        free: dict[tuple, int] = {}
        for w, blocks in by_worker.items():
            ws = self.scheduler.workers.get(w)
            gpu = (ws.host if ws is not None else w, gpus[w]["device"])
            need[gpu] = need.get(gpu, 0.0) + len(blocks) * block_bytes
            free[gpu] = gpus[w]["free"]
        fraction = float(_config.get("max-memory-fraction"))
        for gpu, n in need.items():
            if n > fraction * free[gpu]:
                raise PSValueError(
                    f"table {spec.name!r} needs {format_bytes(int(n))} on the GPU {gpu[1]} of {gpu[0]} "
                    f"({spec.describe()}), but it has {format_bytes(free[gpu])} free (ps.max-memory-fraction "
                    f"= {fraction}). Use a smaller table, a smaller dtype, or more GPUs.",
                    spec.name,
                )

    def _table(self, name) -> SchedulerTableState:
        t = self.tables.get(name)
        if t is None:
            raise UnknownTableError(
                f"table {name!r} does not exist; existing tables: {sorted(self.tables)}", name
            )
        return t

    @handler(READ_ONLY)
    def get_table(self, name: str) -> dict:
        """Handler: spec, version and placement of a table."""
        return self._table(name).handle_msg()

    @handler(READ_ONLY)
    def list_tables(self) -> list[str]:
        return sorted(self.tables)

    @handler(CLIENT)
    async def drop_table(self, name: str) -> None:
        t = self.tables.get(name)
        if t is None:
            self._table(name)  # raises UnknownTableError
        del self.tables[name]
        lock = self._table_locks.get(name)
        if lock is not None and not lock.locked():  # one a table ever made (every fit's) grew without end
            del self._table_locks[name]
        workers = {w for ws in t.owners for w in ws if w in self.members}
        await asyncio.gather(
            *(self.worker_rpc(w).ps_drop_table(name=name, table_id=t.spec.table_id) for w in workers),
            return_exceptions=True,
        )

    # --- runs (membership; the servers count the clocks: _runs, _runclocks) -----------------
    @handler(CLIENT)
    async def run_start(self, run_id: str, n: int, name: str = "", info: dict | None = None, owner=None) -> None:
        self.run_book.check_new(run_id, n, owner)
        await self.run_book.start(run_id, n, name, _dashboard.check_run_info(info), owner=owner)

    @handler(INTERNAL)
    def run_record(self, run_id: str) -> dict | None:
        """Handler (a worker that has not heard of a run): its membership record."""
        run = self.runs.get(run_id)
        return None if run is None else self.run_book.record(run)

    @handler(INTERNAL)
    async def run_join(self, run_id: str, rank: int, address: str, with_attempt: bool = False):
        """Handler: a participant starts (or restarts); returns its clock so a
        retried task resumes at the clock the servers have of it
        (``with_attempt``: ``[clock, attempt]``, attempt 1 for the first)."""
        clock, attempt = await self.run_book.join(run_id, rank, address)
        return [clock, attempt] if with_attempt else clock

    @handler(INTERNAL)
    def run_notify(self, run_id: str) -> None:
        """Handler: a participant uses a table whose servers act on clock
        advances (ESSP pushes, per-clock aggregation): the run's end waits
        for them to apply what it left."""
        self.run_book.notify_at_end(run_id)

    @handler(INTERNAL)
    async def run_leave(self, run_id: str, rank: int, metrics: dict | None = None) -> None:
        """Handler: a participant returned or raised; it no longer holds others."""
        await self.run_book.leave(run_id, rank, metrics, self.totals)

    @handler(CLIENT)
    async def run_abort(self, run_id: str, reason: str, owner=None) -> None:
        run = self.runs.get(run_id)
        if run is None:
            return
        check_owner(run, owner)
        await self.run_book.abort(run_id, reason)

    @handler(CLIENT)
    async def run_end(self, run_id: str, owner=None) -> dict | None:
        """Handler: forget a run; returns its per-participant metrics. Servers
        apply what the run left (per-clock sums) before this returns."""
        run = self.runs.get(run_id)
        if run is None:
            return None
        check_owner(run, owner)
        # A repair of a table it used that is in progress (a worker died just
        # before the end) may restore blocks from a checkpoint: let it finish
        # so that the run reports the rollback.
        for name in sorted(run.tables):
            async with self.table_lock(name):
                pass
        await self.run_book.end(run)
        disagree = await self._run_copies_disagree(run)
        if self.dashboard is not None:
            self.dashboard.run_ended(run, copies_disagree=bool(disagree))
        return self.run_book.summary(run, disagree)

    async def _run_copies_disagree(self, run) -> list[dict]:
        """Every listed up-to-date copy of every block of the run's tables
        holds the same updates, or the run may have read one that missed
        some (issue 22: a fit returned a chance-level model with no error):
        the client raises CopiesDisagreeError."""
        disagree = []
        for name in sorted(run.tables):
            try:
                found = await self._copies_disagree(name)
            except Exception as e:  # noqa: BLE001 - a holder that left: its repair handles it
                logger.debug("dask_ps: comparing the copies of %r: %r", name, e)
                continue
            if found:
                disagree.append({"table": name, "copies": found})
        return disagree


SCHEDULER_HANDLERS = HandlerRegistry("scheduler", PSSchedulerPlugin)
