"""The scheduler half of dask_ps: metadata only.

Holds which tables exist (their specs), where each row block lives, which
workers serve shards, and the clocks of running participants. It never holds
parameter data: values move between workers (and the client) directly.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field

from dask.utils import format_bytes
from distributed import SchedulerPlugin
from distributed.comm import CommClosedError
from distributed.protocol.pickle import dumps

from dask_ps import _config
from dask_ps._exceptions import (
    ClockTimeoutError,
    DataLostError,
    PSError,
    PSValueError,
    RunAbortedError,
    TableExistsError,
    UnknownTableError,
)
from dask_ps._liveness import Liveness
from dask_ps._placement import place_blocks
from dask_ps._spec import TableSpec
from dask_ps._worker_plugin import PLUGIN_NAME, PSWorkerPlugin, reply_errors

logger = logging.getLogger(__name__)

HANDLERS = (
    "ps_register_server",
    "ps_evacuate",
    "ps_note_checkpoint",
    "ps_active_runs",
    "ps_placement_settled",
    "ps_servers",
    "ps_create_table",
    "ps_get_table",
    "ps_list_tables",
    "ps_drop_table",
    "ps_run_start",
    "ps_run_join",
    "ps_clock",
    "ps_wait_clock",
    "ps_run_leave",
    "ps_run_notify",
    "ps_run_uses",
    "ps_run_abort",
    "ps_run_end",
    "ps_replica_missed",
    "ps_resolve_device",
)


def _bytes_per_value(spec) -> int:
    """Copies of the table's values a block holds: the values plus the
    optimizer state of its rule (momentum/adagrad: 1, adam: 2)."""
    return 1 + {"momentum": 1, "adagrad": 1, "adam": 2}.get(spec.rule.name, 0)


@dataclass
class SchedulerTableState:
    spec: TableSpec
    spec_msg: dict
    version: int
    owners: list[list[str]]  # owners[block] = [primary, replicas...]
    lost: dict[int, str] = field(default_factory=dict)  # block -> how it was lost
    checkpoint: tuple[str, str] | None = None  # (path, data dir) of the latest save
    restored: int = 0  # blocks restored from a checkpoint after a loss (updates since were lost)
    # block -> replicas that missed a forwarded push: fenced (no reads), never
    # a copy source or a promoted primary, copied again by ``_resync``
    stale: dict[int, set[str]] = field(default_factory=dict)

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
                "stale": [[b, sorted(ws)] for b, ws in sorted(self.stale.items())]}

    def stale_owned(self, owners=None) -> dict[int, set[str]]:
        """Stale copies that ``owners`` (default: the current placement) keeps."""
        owners = self.owners if owners is None else owners
        out = {b: ws & set(owners[b]) for b, ws in self.stale.items() if b < len(owners)}
        return {b: ws for b, ws in out.items() if ws}

    def holders(self) -> set[str]:
        return {w for ws in self.owners for w in ws}


@dataclass
class RunState:
    """Clocks of one ``ParameterServer.run``: ``clocks[rank]`` is the number
    of ``clock()`` calls that participant has completed."""

    run_id: str
    n: int
    clocks: list[int]
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    done: set[int] = field(default_factory=set)
    where: dict[int, str] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    aborted: str | None = None
    metrics: dict[int, dict] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    notify: bool = False  # tell servers when min_clock grows (ESSP, aggregate="clock")
    tables: set[str] = field(default_factory=set)  # tables its participants used
    notified: float = 0  # the last min clock sent to servers

    def __repr__(self):
        return f"<RunState {self.run_id} clocks={self.clocks} done={sorted(self.done)}>"

    @property
    def min_clock(self) -> float:
        live = [c for r, c in enumerate(self.clocks) if r not in self.done]
        return min(live) if live else math.inf

    def behind(self, clock: int) -> list[str]:
        return [
            f"participant {r} at clock {c} on {self.where.get(r, '?')}"
            for r, c in enumerate(self.clocks)
            if r not in self.done and c < clock
        ]


def _num(x: float):
    """Clock values cross the wire as msgpack; ``inf`` means "no one left"."""
    return None if math.isinf(x) else int(x)


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
        self.runs: dict[str, RunState] = {}
        self._table_locks: dict[str, asyncio.Lock] = {}
        self._servers_changed = None
        self._background: set[asyncio.Task] = set()
        self._retiring: set[str] = set()
        self._evacuations: dict[str, asyncio.Task] = {}
        self._resync_pending: set[str] = set()  # tables with a _resync scheduled, not started
        self.liveness = Liveness()
        self.totals: Counter = Counter()  # metrics summed over finished participants

    def __repr__(self):
        return f"<PSSchedulerPlugin servers={len(self.members)} tables={sorted(self.tables)} runs={len(self.runs)}>"

    async def start(self, scheduler):
        self.scheduler = scheduler
        self._servers_changed = asyncio.Condition()
        scheduler.handlers.update({op: reply_errors(getattr(self, op[3:])) for op in HANDLERS})
        scheduler.extensions[PLUGIN_NAME] = self
        from dask_ps import _prometheus

        _prometheus.register(self)
        await scheduler.register_worker_plugin(
            None, dumps(PSWorkerPlugin()), name=PLUGIN_NAME, idempotent=True
        )

    async def close(self):
        from dask_ps import _prometheus

        _prometheus.unregister(self)
        for run in self.runs.values():
            run.aborted = "the scheduler is closing"
        self.runs.clear()
        self.tables.clear()

    def restart(self, scheduler):
        # Workers come back empty after a restart: every table is gone.
        self.tables.clear()
        self.members.clear()
        for run in self.runs.values():
            run.aborted = "the cluster was restarted"
        self.runs.clear()

    def remove_worker(self, scheduler, worker, *, stimulus_id=None, **kwargs):
        """A worker left (killed, retired, or the cluster is closing): take it
        out of every placement and repair in the background (promote a
        replica, add a new one, or restore from a checkpoint)."""
        evacuation = self._evacuations.get(worker)
        if evacuation is not None and not evacuation.done() and scheduler.status.name == "running":
            # retire_workers removes a worker as soon as it asked it to close;
            # the worker still serves while it hands its blocks over. Let that
            # finish, then repair whatever is left.
            self._in_background(self._after_evacuation(worker, evacuation, stimulus_id))
            return
        self._worker_gone(worker, stimulus_id)

    async def _after_evacuation(self, worker, evacuation, stimulus_id):
        await asyncio.gather(evacuation, return_exceptions=True)
        self._worker_gone(worker, stimulus_id)

    def _worker_gone(self, worker, stimulus_id):
        self._retiring.discard(worker)
        self._evacuations.pop(worker, None)
        self.liveness.mark_dead(worker)
        self.members.discard(worker)
        if self.scheduler.status.name != "running":
            return  # shutting down: nothing to repair
        # Everyone stops waiting on it now (a connect to a dead address would
        # retry for distributed.comm.timeouts.connect).
        self.scheduler.log_event("ps-worker-left", {"address": worker})
        self._in_background(self._broadcast("ps_worker_left", address=worker))
        for t in list(self.tables.values()):
            if worker in t.holders():
                self._in_background(self._repair(t.spec.name, gone={worker}, reason=f"{worker} left ({stimulus_id})"))

    def _in_background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- membership -------------------------------------------------------------
    async def register_server(self, address: str) -> None:
        """Handler (worker plugin setup): this worker can host shards. Tables
        rebalance onto it in the background (consistent hashing: about 1/N
        of the blocks move)."""
        new = address not in self.members
        self.members.add(address)
        if address in self.liveness.dead:  # back at the same address: reachable again
            self.liveness.dead.discard(address)
            self.scheduler.log_event("ps-worker-joined", {"address": address})
            self._in_background(self._broadcast("ps_worker_joined", address=address))
        async with self._servers_changed:
            self._servers_changed.notify_all()
        if new and self.tables:
            for name in list(self.tables):
                self._in_background(self._rebalance(name))

    async def evacuate(self, address: str) -> None:
        """Handler (worker plugin teardown, e.g. ``retire_workers``): wait until
        the worker's blocks have moved away (it still serves them meanwhile)."""
        task = self._evacuations.get(address)
        if task is not None:
            await asyncio.shield(task)

    def log_event(self, topic, msg):
        # retire_workers marks a worker closing_gracefully before closing it:
        # start moving its blocks away while it still serves them.
        if isinstance(msg, dict) and msg.get("action") == "worker-status-change" and topic in self.members:
            if msg.get("status") == "closing_gracefully" and topic not in self._evacuations:
                self._retiring.add(topic)
                task = asyncio.ensure_future(self._evacuate(topic))
                self._evacuations[topic] = task
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            elif msg.get("status") == "running":
                self._retiring.discard(topic)

    async def _evacuate(self, address: str) -> None:
        self.members.discard(address)
        if not self._running_members():
            return  # the whole cluster is shutting down (scale(0) retires everyone)
        names = [n for n, t in self.tables.items() if address in t.holders()]
        # All tables at once: the worker may not wait long once it closes.
        await asyncio.gather(*(
            self._repair(n, gone=set(), leaving={address}, reason=f"{address} retired") for n in names
        ))

    async def placement_settled(self) -> None:
        """Handler: wait for background placement changes (tests, benchmarks)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def active_runs(self, tables=None) -> list[str]:
        """Handler: runs in progress (that used any of ``tables``, if given)."""
        if tables is None:
            return sorted(self.runs)
        return sorted(r for r, run in self.runs.items() if run.tables & set(tables))

    def run_uses(self, run_id: str, table: str) -> None:
        """Handler: a participant of ``run_id`` uses ``table``."""
        run = self.runs.get(run_id)
        if run is not None:
            run.tables.add(table)

    def note_checkpoint(self, path: str, data: str, tables: list[str]) -> None:
        """Handler: ``tables`` were saved to ``path`` (used to restore lost blocks)."""
        for name in tables:
            if name in self.tables:
                self.tables[name].checkpoint = (path, data)

    # --- placement changes -------------------------------------------------------------
    def _running_members(self) -> set[str]:
        """Members that can take blocks: not closing or being retired."""
        ws = self.scheduler.workers
        return {w for w in self.members if w in ws and ws[w].status.name == "running"}

    def _ideal(self, t: SchedulerTableState, members) -> list[list[str]]:
        return place_blocks(
            t.spec.name, t.spec.n_blocks, members,
            vnodes=int(_config.get("vnodes")),
            load_factor=float(_config.get("load-factor")),
            replication=min(t.spec.replication, max(1, len(members))),
        )

    async def _rebalance(self, name: str) -> None:
        lock = self._table_locks.setdefault(name, asyncio.Lock())
        async with lock:
            t = self.tables.get(name)
            if t is None or not self.members or t.lost:
                return
            await self._change_placement(t, self._ideal(t, self.members), sources=self.members)

    async def _repair(self, name: str, gone: set[str], reason: str, leaving: set[str] = frozenset()) -> None:
        """Placement without the ``gone`` (dead) and ``leaving`` (alive, retiring)
        workers: survivors keep their blocks, a surviving replica becomes
        primary, missing copies are added; blocks with no copy left are
        restored from the latest checkpoint or reported lost."""
        lock = self._table_locks.setdefault(name, asyncio.Lock())
        async with lock:
            t = self.tables.get(name)
            if t is None:
                return
            members = self._running_members() - gone - leaving
            if not members:
                for b in range(len(t.owners)):
                    t.lost.setdefault(b, reason)
                return
            ideal = self._ideal(t, members)
            k = min(t.spec.replication, len(members))
            new_owners, lost = [], []
            for b, old in enumerate(t.owners):
                # Up-to-date survivors first (one becomes primary); a stale
                # copy stays as a replica and is copied again.
                bad = t.stale.get(b, set())
                keep = sorted((w for w in old if w in members), key=lambda w: w in bad)
                if not any(w not in bad and (w in members or w in leaving) for w in old):
                    lost.append(b)
                for w in ideal[b]:
                    if len(keep) >= k:
                        break
                    if w not in keep:
                        keep.append(w)
                new_owners.append(keep)
            if lost and t.checkpoint is None:
                # Refuse the table from now on: never serve zeros for lost rows.
                for b in lost:
                    t.lost[b] = reason
                logger.error("dask_ps: table %r lost block(s) %s (%s) and has no checkpoint",
                             t.spec.name, lost, reason)

            async def restore(t=t, lost=lost):
                if lost and t.checkpoint is not None:
                    await self._restore_blocks(t, lost, reason)

            await self._change_placement(t, new_owners, sources=members | set(leaving), skip=set(lost),
                                         before_adopt=restore)

    async def replica_missed(self, table: str, table_id: str, replica: str, blocks) -> None:
        """Handler (a block's primary): ``replica`` failed to apply a forwarded
        push to ``blocks`` (an error or a timeout, while not removed). Mark
        those copies stale, fence them (they refuse reads), and copy the
        blocks to it again in the background. Returns once the fence holds;
        raises if it could not be set on a worker that is still in the
        cluster (the primary then does not acknowledge the push)."""
        if not (isinstance(table, str) and isinstance(replica, str) and isinstance(blocks, (list, tuple))
                and all(isinstance(b, int) and not isinstance(b, bool) for b in blocks)):
            raise PSValueError("replica_missed needs a table, a replica address and block numbers")
        t = self.tables.get(table)
        if t is None or t.spec.table_id != table_id:
            return  # dropped or created again: nothing to protect
        # Also copies the current placement no longer lists (a change in
        # progress): until it adopts, such a copy must not be a source.
        blocks = sorted({b for b in blocks if 0 <= b < len(t.owners)})
        new = [b for b in blocks if replica not in t.stale.get(b, ())]
        # Record first: a placement change from now on neither copies from
        # these copies nor promotes them.
        for b in blocks:
            t.stale.setdefault(b, set()).add(replica)
        if new:
            logger.warning("dask_ps: table %r: replica %s missed a push to block(s) %s; copying them again",
                           table, replica, new)
        # Even if the fence fails below: the primary has applied the push, so
        # the copy differs from it whether or not the push is acknowledged.
        if table not in self._resync_pending:
            self._resync_pending.add(table)
            self._in_background(self._resync(table))
        try:
            await asyncio.wait_for(
                self._call(replica, "ps_fence", table=table, table_id=table_id, blocks=blocks),
                _config.get_seconds("timeouts.rpc"),
            )
        except Exception as e:
            if replica in self.scheduler.workers and replica not in self.liveness.dead:
                raise PSError(f"table {table!r}: could not fence replica {replica}: {e!r}") from e
            # Removed meanwhile: the repair of its removal drops the copy.

    async def _resync(self, name: str, attempt: int = 0) -> None:
        """Copy stale replicas again from an up-to-date copy (same owners,
        a new placement version), retrying a few times if a copy fails."""
        lock = self._table_locks.setdefault(name, asyncio.Lock())
        async with lock:
            # Misses reported from now on need another resync.
            self._resync_pending.discard(name)
            t = self.tables.get(name)
            if t is None or t.lost or not t.stale_owned():
                return
            await self._change_placement(t, [list(o) for o in t.owners], sources=self.members)
            left = bool(t.stale_owned())
        if left and attempt < 4:
            await asyncio.sleep(0.2 * 2 ** attempt)
            await self._resync(name, attempt + 1)
        elif left:
            # The copies stay fenced (reads go to other copies) until the next
            # placement change of this table copies them again.
            logger.warning("dask_ps: table %r: could not copy stale replica(s) %s again after %d tries",
                           name, t.stale_owned(), attempt + 1)

    async def _change_placement(self, t: SchedulerTableState, new_owners, sources, skip=frozenset(),
                                before_adopt=None) -> None:
        """Move to ``new_owners`` in two phases, so no block ever has two primaries:

        1. every live holder *freezes* the table (waits for pushes in
           progress, then refuses client pushes and pulls, which retry); then
           each block moving to new owners is copied from an old owner (a
           staying one if possible, the next one if a copy fails);
        2. every holder adopts the new placement and serves again.

        Forwarded pushes (primary to replica) are applied even while frozen,
        and replicas hold their copies before any primary of the new placement
        serves, so no acknowledged push misses a copy. Numbered pushes make
        the retries count once.
        """
        if new_owners == t.owners and not t.stale_owned():
            return
        version = t.version + 1
        staying = set(self.members)
        holders = {w for w in t.holders() | {w for ws in new_owners for w in ws} if w in self.members | set(sources)}
        old_owners = t.owners
        t.owners, t.version = new_owners, version  # handles now give the new placement
        self._announce(t)
        msg = dict(table=t.spec.name, table_id=t.spec.table_id)
        # 1a. Freeze every holder. One that cannot be reached is left out.
        results = await asyncio.gather(*(self._call(w, "ps_freeze", **msg) for w in holders),
                                       return_exceptions=True)
        frozen = {w for w, r in zip(holders, results) if not isinstance(r, Exception)}
        # 1b. Copy blocks to their new owners. Sources: the block's old owners,
        # staying workers before a retiring one; on failure, the next source.
        wanted: dict[int, list[str]] = {}
        candidates: dict[int, list[str]] = {}
        for b, (old, new) in enumerate(zip(old_owners, new_owners)):
            if b in skip:
                continue
            # New replicas first, the new primary last: a block is never
            # primary somewhere before its replicas have it. A stale copy (it
            # missed a push; read after the freeze, so no push is still
            # reporting one) is copied again and never used as a source.
            bad = t.stale.get(b, set())
            targets = ([w for w in new[1:] if w not in old or w in bad]
                       + [w for w in new[:1] if w not in old or w in bad])
            if targets:
                wanted[b] = targets
                candidates[b] = sorted((w for w in old if w in frozen and w not in bad),
                                       key=lambda w: w not in staying)
        copies = 0
        copied: dict[int, list[str]] = {}
        while wanted:
            by_source: dict[str, list[tuple[int, str]]] = {}
            for b in list(wanted):
                if not candidates[b]:
                    logger.error("dask_ps: table %r: no copy of block %d could be read", t.spec.name, b)
                    t.lost[b] = "no live copy could be read during a placement change"
                    del wanted[b]
                    continue
                by_source.setdefault(candidates[b][0], []).extend((b, w) for w in wanted[b])
            results = await asyncio.gather(
                *(self._call(src, "ps_copy_blocks", **msg, moves=mv) for src, mv in by_source.items()),
                return_exceptions=True,
            )
            for (src, mv), r in zip(by_source.items(), results):
                for b in {b for b, _ in mv}:
                    if not isinstance(r, Exception):
                        copied[b] = wanted.pop(b, [])
                        copies += len(copied[b])
                        continue
                    logger.warning("dask_ps: copying block %d of %r from %s failed: %r", b, t.spec.name, src, r)
                    alive = [w for w in wanted[b] if w not in self.liveness.dead]
                    if len(alive) < len(wanted[b]):  # a target died: the next repair replaces it
                        wanted[b] = alive
                        if not alive:
                            del wanted[b]
                    else:
                        candidates[b].pop(0)
        # Blocks with no copy left: empty shards on their new owners (a
        # checkpoint restore fills them next).
        fresh: dict[str, list[int]] = {}
        for b in skip:
            for w in new_owners[b]:
                fresh.setdefault(w, []).append(b)
        await asyncio.gather(*(
            self._call(w, "ps_create_shards", spec=t.spec_msg, version=None, blocks=bs)
            for w, bs in fresh.items()
        ), return_exceptions=True)
        # Copies made now are up to date; copies not kept are gone. Every
        # holder is still frozen, so no new miss can have been reported.
        for b in list(t.stale):
            ws = t.stale[b] - set(copied.get(b, ()))
            ws &= set(new_owners[b]) if b < len(new_owners) and b not in skip else set()
            if ws:
                t.stale[b] = ws
            else:
                del t.stale[b]
        if before_adopt is not None:
            await before_adopt()  # e.g. fill those blocks from a checkpoint while nobody serves them
        # 2. Adopt. A retiring worker (not a member any more) need not.
        await asyncio.gather(
            *(self._call(w, "ps_set_placement", **msg, version=version, owners=new_owners)
              for w in holders if w in self.members),
            return_exceptions=True,
        )
        logger.info("dask_ps: table %r placement v%d (%d block copies)", t.spec.name, version, copies)

    def _announce(self, t: SchedulerTableState) -> None:
        """Tell every client and worker that ``t``'s placement changed, so
        cached handles are refreshed before the next message instead of after
        a failed one (a connect to a dead worker can take ``timeouts.connect``).
        Clients hear it as a Dask event; workers through a handler."""
        self.scheduler.log_event("ps-placement", {"table": t.spec.name, "version": t.version})
        self._in_background(
            self._broadcast("ps_placement_changed", table=t.spec.name, version=t.version)
        )

    async def _restore_blocks(self, t: SchedulerTableState, blocks: list[int], reason: str) -> None:
        """Fill lost blocks on their new (still frozen) owners from the latest checkpoint."""
        from dask_ps._checkpoint import table_dir

        path, data = t.checkpoint
        directory = table_dir(path, data, t.spec.name)
        by_worker: dict[str, list[int]] = {}
        for b in blocks:
            for w in t.owners[b]:
                by_worker.setdefault(w, []).append(b)
        results = await asyncio.gather(*(
            self._call(w, "ps_load_blocks", table=t.spec.name, table_id=t.spec.table_id,
                       directory=directory, blocks=bs)
            for w, bs in by_worker.items()
        ), return_exceptions=True)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:  # never serve zeros in place of lost rows
            for b in blocks:
                t.lost[b] = f"{reason}; restoring from {path} failed: {failed[0]!r}"
            logger.error("dask_ps: table %r: restoring block(s) %s from %s failed: %r",
                         t.spec.name, blocks, path, failed[0])
            return
        t.restored += len(blocks)
        logger.warning(
            "dask_ps: table %r: block(s) %s were lost (%s) and restored from the checkpoint at %s; "
            "updates made since that checkpoint are lost",
            t.spec.name, blocks, reason, path,
        )

    async def servers(self, n: int = 0, timeout: float = 0) -> list[str]:
        """Handler: current shard servers; with ``n``, wait up to ``timeout``
        seconds until at least ``n`` have registered."""
        if n and len(self.members) < n:
            async with self._servers_changed:
                try:
                    await asyncio.wait_for(
                        self._servers_changed.wait_for(lambda: len(self.members) >= n), timeout
                    )
                except asyncio.TimeoutError:
                    pass
        return list(sorted(self.members))

    # --- tables -------------------------------------------------------------------
    async def create_table(self, spec: dict) -> dict:
        """Handler: create a table (idempotent for an identical spec)."""
        new = TableSpec.from_msg(spec)
        lock = self._table_locks.setdefault(new.name, asyncio.Lock())
        async with lock:
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
            await asyncio.gather(
                *(
                    self.scheduler.rpc(w).ps_create_shards(spec=spec, version=version, blocks=bs, owners=owners)
                    for w, bs in by_worker.items()
                )
            )
            state = SchedulerTableState(new, spec, version, owners)
            self.tables[new.name] = state
            logger.info("dask_ps: created table %r (%s) on %d workers", new.name, new.describe(), len(by_worker))
            return state.handle_msg()

    def _check_memory(self, spec: TableSpec) -> None:
        """Refuse a table that cannot fit: its bytes (times replication, plus
        optimizer state) above ``ps.max-memory-fraction`` of the memory limit
        of the workers that would host it."""
        limits = [self.scheduler.workers[w].memory_limit for w in self.members if w in self.scheduler.workers]
        if not limits or not all(limits):
            return  # unlimited workers: nothing to check against
        need = spec.nbytes * spec.replication * _bytes_per_value(spec)
        budget = float(_config.get("max-memory-fraction")) * sum(limits)
        if spec.device == "cpu" and need > budget:
            raise PSValueError(
                f"table {spec.name!r} needs {format_bytes(need)} ({spec.describe()}) but the "
                f"{len(limits)} workers' memory limits allow {format_bytes(budget)} for tables "
                f"(ps.max-memory-fraction of {format_bytes(sum(limits))}). Use a smaller table, "
                "a smaller dtype, or more workers.",
                spec.name,
            )

    async def _gpus(self, workers) -> dict:
        """Each worker's GPU (``_backend.gpu_info``), None where it has none."""
        workers = sorted(workers)
        infos = await asyncio.gather(*(self._call(w, "ps_gpu_info") for w in workers), return_exceptions=True)
        return {w: (None if isinstance(i, BaseException) else i) for w, i in zip(workers, infos)}

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
        block_bytes = spec.nbytes / max(1, spec.n_blocks) * _bytes_per_value(spec)
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

    def get_table(self, name: str) -> dict:
        """Handler: spec, version and placement of a table."""
        return self._table(name).handle_msg()

    def list_tables(self) -> list[str]:
        return sorted(self.tables)

    async def drop_table(self, name: str) -> None:
        t = self.tables.get(name)
        if t is None:
            self._table(name)  # raises UnknownTableError
        del self.tables[name]
        workers = {w for ws in t.owners for w in ws if w in self.members}
        await asyncio.gather(
            *(self.scheduler.rpc(w).ps_drop_table(name=name, table_id=t.spec.table_id) for w in workers),
            return_exceptions=True,
        )

    # --- runs and clocks ------------------------------------------------------------
    def run_start(self, run_id: str, n: int) -> None:
        self.runs[run_id] = RunState(run_id, n, [0] * n)

    def _run(self, run_id) -> RunState:
        run = self.runs.get(run_id)
        if run is None:
            raise RunAbortedError(f"run {run_id} has ended or was aborted")
        if run.aborted:
            raise RunAbortedError(f"run {run_id} was aborted: {run.aborted}")
        return run

    async def run_join(self, run_id: str, rank: int, address: str) -> int:
        """Handler: a participant starts (or restarts); returns its clock so a
        retried task resumes at the clock the run recorded for it."""
        run = self._run(run_id)
        run.where[rank] = address
        run.attempts[rank] = run.attempts.get(rank, 0) + 1
        if rank in run.done:  # a retried task that had already left
            run.done.discard(rank)
        return run.clocks[rank]

    def run_notify(self, run_id: str) -> None:
        """Handler: a participant uses a table whose servers must hear of clock
        advances (ESSP pushes, per-clock aggregation)."""
        self._run(run_id).notify = True

    def _clock_changed(self, run: RunState) -> None:
        m = run.min_clock
        if run.notify and m > run.notified:
            run.notified = m
            # In the background: the participant's clock call does not wait
            # for servers to push fresh rows.
            task = asyncio.ensure_future(self._broadcast("ps_clock_advance", run_id=run.run_id, min_clock=_num(m)))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _call_once(self, worker: str, op: str, **msg):
        """An RPC to a worker that fails fast if the worker is removed meanwhile."""
        return self.liveness.call(worker, lambda: getattr(self.scheduler.rpc(worker), op)(**msg))

    async def _call(self, worker: str, op: str, attempts: int = 4, **msg):
        """An RPC to a worker (:meth:`_call_once`), retried on a closed
        connection while ``worker`` is retiring: Dask's scheduler drops its
        connections to a worker when it removes it, while the worker still
        serves its blocks (its teardown waits for the evacuation), so a new
        connection gets through."""
        for attempt in range(attempts):
            try:
                return await self._call_once(worker, op, **msg)
            except (CommClosedError, OSError):
                if worker not in self._retiring or worker in self.liveness.dead or attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)

    async def _broadcast(self, op: str, **msg) -> None:
        results = await asyncio.gather(
            *(self._call(w, op, **msg) for w in sorted(self.members)),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, Exception):
                logger.debug("dask_ps: %s failed on a worker: %r", op, r)

    async def clock(self, run_id: str, rank: int, clock: int, wait_for=None, timeout=None):
        """Handler: ``rank`` completed ``clock`` clocks; returns the run's min
        clock, after waiting (as :meth:`wait_clock`) until it is at least
        ``wait_for`` if given. Taking the max makes a repeated report (a
        retried task) count once."""
        run = self._run(run_id)
        if clock > run.clocks[rank]:
            run.clocks[rank] = clock
            self._clock_changed(run)
            async with run.cond:
                run.cond.notify_all()
        if wait_for is not None:
            return await self.wait_clock(run_id, wait_for, timeout)
        return _num(run.min_clock)

    async def wait_clock(self, run_id: str, clock: int, timeout: float | None = None):
        """Handler: wait until every live participant completed ``clock``
        clocks; returns the min clock. Awaited, so the loop stays free."""
        run = self._run(run_id)
        if run.min_clock >= clock:
            return _num(run.min_clock)
        t0 = time.monotonic()
        async with run.cond:
            try:
                await asyncio.wait_for(
                    run.cond.wait_for(lambda: run.aborted or run.min_clock >= clock), timeout
                )
            except asyncio.TimeoutError:
                raise ClockTimeoutError(
                    f"run {run_id}: waited {time.monotonic() - t0:.1f}s for every participant to "
                    f"reach clock {clock}; behind: {'; '.join(run.behind(clock))}"
                ) from None
        self._run(run_id)  # raises if aborted meanwhile
        return _num(run.min_clock)

    async def run_leave(self, run_id: str, rank: int, metrics: dict | None = None) -> None:
        """Handler: a participant returned or raised; it no longer holds others."""
        run = self.runs.get(run_id)
        if run is None:
            return
        run.done.add(rank)
        if metrics is not None:
            run.metrics[rank] = metrics
            self.totals["wait_seconds"] += metrics.get("clock_wait_seconds", 0.0)
            for t in metrics.get("tables", {}).values():
                for key in ("reads", "cache_hits", "wait_seconds", "bytes_pushed", "bytes_pulled"):
                    self.totals[key] += t.get(key, 0)
            logger.debug("dask_ps: run %s participant %d metrics %s", run_id, rank, metrics)
        self._clock_changed(run)
        async with run.cond:
            run.cond.notify_all()

    async def run_abort(self, run_id: str, reason: str) -> None:
        run = self.runs.get(run_id)
        if run is None:
            return
        run.aborted = reason or "aborted"
        async with run.cond:
            run.cond.notify_all()

    async def run_end(self, run_id: str) -> dict | None:
        """Handler: forget a run; returns its per-participant metrics. Servers
        apply what the run left (per-clock sums) before this returns."""
        run = self.runs.pop(run_id, None)
        if run is None:
            return None
        if run.notify:
            await self._broadcast("ps_run_end", run_id=run_id)
        return {
            "run_id": run_id,
            "clocks": list(run.clocks),
            "attempts": dict(run.attempts),
            "seconds": time.time() - run.started,
            "participants": {int(k): v for k, v in run.metrics.items()},
        }
