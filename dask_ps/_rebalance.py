"""Placement changes: the two-phase freeze/copy/adopt protocol.

Every repair (a worker died), evacuation (a worker retires), rebalance (a
worker joined) and resync (a replica missed a forwarded push) ends in
:meth:`PlacementChanger.change`, under the scheduler's per-table lock. The
scheduler plugin decides *when* a table's placement changes (membership
hooks, handlers); this module decides *what* the new placement is and moves
the blocks there. ``docs/architecture.rst`` ("Placement changes and
failover") draws the protocol.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid

from dask_ps import _config
from dask_ps._exceptions import PSError, PSValueError
from dask_ps._lost_report import LostReports
from dask_ps._placement import place_blocks

logger = logging.getLogger(__name__)


class PlacementChanger:
    """Moves the blocks of the scheduler's tables between its members.

    Handed what it uses (the scheduler plugin builds it in ``start``; it
    never reaches back into the plugin):

    - ``tables``: the table registry (name -> ``SchedulerTableState``), and
      ``table_lock(name)``, the lock that orders a table's creation and
      placement changes;
    - ``members``: the shard servers, ``retiring``: those being retired
      (still serving), and ``running_members()``: the members that can take
      blocks (sets read at each use);
    - ``scheduler``: Dask's scheduler (which workers are in the cluster,
      its event log); ``liveness``: the workers known dead
      (:class:`~dask_ps._liveness.Liveness`); ``calls``: the RPCs to workers
      (:class:`~dask_ps._liveness.WorkerCalls`);
    - ``in_background(coro)``: runs a task that ``ps_placement_settled``
      waits for; ``note_rollback(t, blocks, reason)``: records blocks
      restored from a checkpoint (the runs report it).

    Settings (``ps.vnodes``, ``ps.timeouts.*``) are read at each use, so
    that ``dask.config.set`` applies to a running cluster.
    """

    def __init__(self, *, tables, table_lock, members, retiring, running_members, scheduler, liveness, calls,
                 in_background, note_rollback):
        self.tables = tables
        self.table_lock = table_lock
        self.members = members
        self.retiring = retiring
        self.running_members = running_members
        self.scheduler = scheduler
        self.liveness = liveness
        self.calls = calls
        self.in_background = in_background
        self.note_rollback = note_rollback
        self.resync_pending: set[str] = set()  # tables with a resync scheduled, not started

    def __repr__(self):
        return f"<PlacementChanger tables={sorted(self.tables)} resync_pending={sorted(self.resync_pending)}>"

    def report_lost(self, table: str, blocks, why: str) -> None:
        """Log lost blocks once the cluster's state says what they mean (``_lost_report``)."""
        if "_lost" not in self.__dict__:
            self._lost = LostReports(self.scheduler, self.running_members, logger)
        self._lost.add(table, blocks, why)

    def ideal(self, t, members) -> list[list[str]]:
        """The consistent-hash placement of ``t`` over ``members``."""
        return place_blocks(
            t.spec.name, t.spec.n_blocks, members,
            vnodes=int(_config.get("vnodes")),
            load_factor=float(_config.get("load-factor")),
            replication=min(t.spec.replication, max(1, len(members))),
        )

    # --- why a placement changes ------------------------------------------------------
    async def rebalance(self, name: str) -> None:
        """Move table ``name`` to its ideal placement over the members (a worker joined)."""
        async with self.table_lock(name):
            t = self.tables.get(name)
            if t is None or not self.members or t.lost:
                return
            await self.change(t, self.ideal(t, self.members), sources=self.members)

    async def evacuate(self, address: str) -> None:
        """Move every block off ``address`` (retiring, still serving)."""
        self.members.discard(address)
        if not self.running_members():
            return  # the whole cluster is shutting down (scale(0) retires everyone)
        names = [n for n, t in self.tables.items() if address in t.listed()]
        # All tables at once: the worker may not wait long once it closes.
        await asyncio.gather(*(
            self.repair(n, gone=set(), leaving={address}, reason=f"{address} retired") for n in names
        ))

    async def repair(self, name: str, gone: set[str], reason: str, leaving: set[str] = frozenset()) -> None:
        """Placement without the ``gone`` (dead) and ``leaving`` (alive, retiring)
        workers: survivors keep their blocks, a surviving replica becomes
        primary, missing copies are added; blocks with no copy left are
        restored from the latest checkpoint or reported lost."""
        async with self.table_lock(name):
            t = self.tables.get(name)
            if t is None:
                return
            members = self.running_members() - gone - leaving
            # Holders that take no new blocks but still serve theirs (another
            # worker retiring, one Dask paused): sources, never "lost" (a kill
            # during a retire reported the retiring worker's blocks lost).
            leaving = set(leaving) | {w for w in t.listed() - members - set(gone) if self._alive(w)}
            if not members:
                for b in range(len(t.owners)):
                    t.lost.setdefault(b, reason)
                return
            new_owners, lost = self._repaired_owners(t, members, leaving)
            if lost and t.checkpoint is None:
                # Refuse the table from now on: never serve zeros for lost rows.
                for b in lost:
                    t.lost[b] = reason
                self.report_lost(t.spec.name, lost, f"({reason}) and has no checkpoint")

            async def restore(t=t, lost=lost):
                if lost and t.checkpoint is not None:
                    await self.restore_blocks(t, lost, reason)

            await self.change(t, new_owners, sources=members | set(leaving), skip=set(lost),
                              before_adopt=restore)

    def _repaired_owners(self, t, members, leaving) -> tuple[list[list[str]], list[int]]:
        """New owners keeping each block's up-to-date survivors first (one
        becomes primary; a stale copy stays as a replica and is copied again),
        topped up from the ideal placement; and the blocks with no up-to-date
        copy left."""
        ideal = self.ideal(t, members)
        k = min(t.spec.replication, len(members))
        new_owners, lost = [], []
        for b, old in enumerate(t.owners):
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
        return new_owners, lost

    async def replica_missed(self, table: str, table_id: str, replica: str, blocks) -> None:
        """A block's primary reports that ``replica`` failed to apply a
        forwarded push to ``blocks`` (an error or a timeout, while not
        removed). Mark those copies stale, fence them (they refuse reads), and
        copy the blocks to it again in the background. Returns once the fence
        holds; raises if it could not be set on a worker that is still in the
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
        if table not in self.resync_pending:
            self.resync_pending.add(table)
            self.in_background(self.resync(table))
        try:
            await asyncio.wait_for(
                self.calls.call(replica, "ps_fence", table=table, table_id=table_id, blocks=blocks),
                _config.get_seconds("timeouts.rpc"),
            )
        except Exception as e:
            if replica in self.scheduler.workers and replica not in self.liveness.dead:
                raise PSError(f"table {table!r}: could not fence replica {replica}: {e!r}") from e
            # Removed meanwhile: the repair of its removal drops the copy.

    async def resync(self, name: str, attempt: int = 0) -> None:
        """Copy stale replicas again from an up-to-date copy (same owners,
        a new placement version), retrying a few times if a copy fails."""
        async with self.table_lock(name):
            # Misses reported from now on need another resync.
            self.resync_pending.discard(name)
            t = self.tables.get(name)
            if t is None or t.lost or not t.stale_owned():
                return
            await self.change(t, [list(o) for o in t.owners], sources=self.members)
            left = bool(t.stale_owned())
        if left and attempt < 4:
            await asyncio.sleep(0.2 * 2 ** attempt)
            await self.resync(name, attempt + 1)
        elif left:
            # The copies stay fenced (reads go to other copies) until the next
            # placement change of this table copies them again.
            logger.warning("dask_ps: table %r: could not copy stale replica(s) %s again after %d tries",
                           name, t.stale_owned(), attempt + 1)

    # --- the protocol ------------------------------------------------------------------
    async def change(self, t, new_owners, sources, skip=frozenset(), before_adopt=None) -> None:
        """Move to ``new_owners`` in two phases, so no block ever has two primaries:

        1. every live holder *freezes* the table (waits for pushes in
           progress, then refuses client pushes and pulls, which retry); then
           each block moving to new owners is copied from an old owner (a
           staying one if possible, the next one if a copy fails);
        2. every holder adopts the new placement and serves again.

        Forwarded pushes (primary to replica) are applied even while frozen,
        and replicas hold their copies before any primary of the new placement
        serves, so no acknowledged push misses a copy. Numbered pushes make
        the retries count once. ``skip``: blocks with no copy left (created
        empty; ``before_adopt`` may fill them while nobody serves them).
        """
        if new_owners == t.owners and not t.stale_owned():
            return
        version = t.version + 1
        staying = set(self.members)
        holders = {w for w in t.holders() | {w for ws in new_owners for w in ws} if w in self.members | set(sources)}
        old_owners = t.owners
        # Until every holder adopts, the up-to-date copies are the old
        # placement's (HungWorkers never fences out the last of them).
        t.changing_from = old_owners
        t.owners, t.version = new_owners, version  # handles now give the new placement
        try:
            self.announce(t)
            msg = dict(table=t.spec.name, table_id=t.spec.table_id)
            frozen = await self._freeze(holders, msg)
            wanted, candidates = self._plan_copies(t, old_owners, new_owners, frozen, staying, skip)
            given_up: dict[int, set[str]] = {}
            copied = await self._copy(t, wanted, candidates, msg, old_owners, given_up)
            if given_up:
                self._keep_where_it_is(t, old_owners, new_owners, given_up)
            await self._create_empty(t, new_owners, skip)
            self._forget_stale(t, new_owners, copied, skip)
            if before_adopt is not None:
                await before_adopt()  # e.g. fill those blocks from a checkpoint while nobody serves them
            await self._adopt(holders, msg, version, new_owners)
        finally:
            t.changing_from = None
        logger.info("dask_ps: table %r placement v%d (%d block copies)", t.spec.name, version,
                    sum(len(ws) for ws in copied.values()))

    async def _freeze(self, holders, msg) -> set[str]:
        """Phase 1a: freeze every holder; returns those that answered (one
        that cannot be reached is left out)."""
        results = await asyncio.gather(*(self.calls.call(w, "ps_freeze", **msg) for w in holders),
                                       return_exceptions=True)
        return {w for w, r in zip(holders, results) if not isinstance(r, Exception)}

    @staticmethod
    def _plan_copies(t, old_owners, new_owners, frozen, staying, skip):
        """Which new owners each block must be copied to (``wanted``) and
        from where (``candidates``: its frozen, up-to-date old owners,
        staying workers before a retiring one)."""
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
        return wanted, candidates

    async def _copy(self, t, wanted, candidates, msg, old_owners=None, given_up=None) -> dict[int, list[str]]:
        """Phase 1b: copy each wanted block from its first candidate source;
        on failure the next source (or, if a target died, without it: the
        next repair replaces it). Returns ``block -> targets`` copied.

        One call per (source, target): a source's call fails as a whole when
        any of its targets cannot be reached, and a target killed mid-copy
        must not cost the sources of other blocks (that reported a block with
        a good copy lost: the membership audit's kill variant). A failure
        with neither end known dead, other than the source's own refusal (a
        ``PSError``), is the target's or the source's: it is tried again
        until the scheduler hears which one left; after ``2 *
        ps.timeouts.hung`` another up-to-date source is tried first, if
        there is one, and when every source has failed that long the copy
        is given up (recorded in ``given_up``: ``change`` leaves the target
        out of the block's owners and keeps the block on its old holders),
        never the source.

        **A block is never declared lost while a holder of an up-to-date
        copy is alive** (in the cluster, not removed, not fenced out): a
        source that is alive but does not answer (stopped, starved) is
        reported "unreachable" (a WARNING) and tried again, and the change
        waits (the table stays frozen: callers retry) until it answers or
        Dask removes it. Only a block whose every up-to-date holder left
        is marked lost (issue 22: two workers stopped together lost blocks
        that a resumed worker still had)."""
        dead = self.liveness.dead
        copied: dict[int, list[str]] = {}
        first_failed: dict[tuple[int, str, str], float] = {}  # (block, source, target) -> loop time
        unreachable: set[tuple[int, str]] = set()  # (block, source) reported
        refused: dict[int, set[str]] = {}  # block -> sources that refused (no such copy)
        patience = max(2.0, 2 * _config.get_seconds("timeouts.hung"))
        delay = 0.05
        while wanted:
            by_pair: dict[tuple[str, str], list[int]] = {}
            waiting = False
            for b in list(wanted):
                if not candidates[b]:
                    found = await self._sources_again(t, b, old_owners, refused.get(b, ()), msg, unreachable)
                    if found is None:  # none alive: lost
                        del wanted[b]
                        continue
                    candidates[b] = found
                    if not found:  # alive, not answering: wait
                        waiting = True
                        continue
                for w in wanted[b]:
                    by_pair.setdefault((candidates[b][0], w), []).append(b)
            results = await asyncio.gather(
                *(self.calls.call(src, "ps_copy_blocks", **msg, moves=[(b, dst) for b in bs], involves=(dst,))
                  for (src, dst), bs in by_pair.items()),
                return_exceptions=True,
            )
            unclear = waiting
            for ((src, dst), bs), r in zip(by_pair.items(), results):
                for b in bs:
                    if b not in wanted or dst not in wanted[b]:
                        continue
                    if not isinstance(r, Exception):
                        copied.setdefault(b, []).append(dst)
                        wanted[b].remove(dst)
                        continue
                    # Once per copy: a retried one (see below) would repeat it.
                    now = asyncio.get_running_loop().time()
                    log = logger.debug if (b, src, dst) in first_failed else logger.warning
                    since = first_failed.setdefault((b, src, dst), now)
                    log("dask_ps: copying block %d of %r from %s to %s failed: %r", b, t.spec.name, src, dst, r)
                    if dst in dead:  # the next repair replaces this copy
                        wanted[b].remove(dst)
                    elif isinstance(r, PSError) or not self._alive(src):
                        if isinstance(r, PSError):
                            refused.setdefault(b, set()).add(src)
                        if candidates[b][:1] == [src]:
                            candidates[b].pop(0)
                    else:
                        # Neither end known dead: again once the scheduler
                        # may know. (A target's error reaches here as a plain
                        # Exception when it does not pickle.)
                        unclear = True
                        if now - since >= patience:
                            self._past_patience(t, b, src, dst, now, patience, first_failed, wanted, candidates,
                                                given_up)
            for b in [b for b, ws in wanted.items() if not ws]:
                del wanted[b]
            if unclear and wanted:
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.5)
        return copied

    async def _sources_again(self, t, b, old_owners, refused, msg, unreachable) -> list[str] | None:
        """Block ``b`` has no source left: its old up-to-date holders that
        are alive and did not refuse (a ``PSError``: no such copy), frozen
        again; ``[]`` when they are alive but do not answer (wait for them:
        the block is not lost); None when none is alive (it is marked lost)."""
        alive = [w for w in self._alive_holders(t, b, old_owners) if w not in refused]
        if not alive:
            self.report_lost(t.spec.name, [b], "(no copy could be read during a placement change)")
            t.lost[b] = "no live copy could be read during a placement change"
            return None
        refrozen = await self._freeze(set(alive), msg)
        found = [w for w in alive if w in refrozen]
        if not found and (b, "*") not in unreachable:
            unreachable.add((b, "*"))
            logger.warning("dask_ps: table %r: block %d: its holders %s are unreachable but alive; waiting "
                           "for them (it is not lost)", t.spec.name, b, alive)
        return found

    @staticmethod
    def _past_patience(t, b, src, dst, now, patience, first_failed, wanted, candidates, given_up) -> None:
        """The copy of ``b`` from ``src`` to ``dst`` failed for ``patience``
        with neither end known dead: another up-to-date source first if one
        has not failed that long; else give up this copy, never a source
        (that would lose the block): the placement keeps the block where it
        is (``change``), a later change adds it."""
        others = [w for w in candidates[b] if w != src and now - first_failed.get((b, w, dst), now) < patience]
        if others:
            candidates[b].remove(src)
            candidates[b].append(src)
            return
        logger.warning("dask_ps: table %r: block %d: no copy to %s for %.0f s (source %s, still in the "
                       "cluster: unreachable, not lost); the block stays on its old holders",
                       t.spec.name, b, dst, now - first_failed[(b, src, dst)], src)
        wanted[b].remove(dst)
        if given_up is not None:
            given_up.setdefault(b, set()).add(dst)

    def _keep_where_it_is(self, t, old_owners, new_owners, given_up) -> None:
        """Copies that could not be made: their targets leave the block's new
        owners, and its old up-to-date holders that are alive stay (their
        copies are kept at adoption), up to the table's replication. The
        table is rebalanced again afterwards (in the background)."""
        k = t.spec.replication
        for b, targets in given_up.items():
            owners = [w for w in new_owners[b] if w not in targets]
            for w in self._alive_holders(t, b, old_owners):
                if w not in owners and (len(owners) < k or not owners):
                    owners.append(w)
            new_owners[b][:] = owners
        logger.warning("dask_ps: table %r: copies to %s not made; blocks stay on their old holders",
                       t.spec.name, {b: sorted(ws) for b, ws in given_up.items()})
        self.in_background(self._later_rebalance(t.spec.name))

    async def _later_rebalance(self, name: str) -> None:
        await asyncio.sleep(1.0)
        await self.rebalance(name)

    def _alive_holders(self, t, b, old_owners) -> list[str]:
        """The old owners of block ``b`` with an up-to-date copy that are
        still in the cluster and not fenced out or removed."""
        if old_owners is None or b >= len(old_owners):
            return []
        bad = t.stale.get(b, set())
        return [w for w in old_owners[b] if w not in bad and self._alive(w)]

    def _alive(self, worker: str) -> bool:
        """Not removed, not fenced out: in the cluster, or retiring (Dask
        removes a retiring worker while it still serves its evacuation)."""
        if worker in self.liveness.dead:
            return False
        scheduler = self.scheduler  # None: a changer tested without one
        return scheduler is None or worker in scheduler.workers or worker in self.retiring

    async def _create_empty(self, t, new_owners, skip) -> None:
        """Blocks with no copy left: empty shards on their new owners (a
        checkpoint restore fills them next)."""
        fresh: dict[str, list[int]] = {}
        for b in skip:
            for w in new_owners[b]:
                fresh.setdefault(w, []).append(b)
        await asyncio.gather(*(
            self.calls.call(w, "ps_create_shards", spec=t.spec_msg, version=None, blocks=bs)
            for w, bs in fresh.items()
        ), return_exceptions=True)

    @staticmethod
    def _forget_stale(t, new_owners, copied, skip) -> None:
        """Copies made now are up to date; copies not kept are gone. Every
        holder is still frozen, so no new miss can have been reported."""
        for b in list(t.stale):
            ws = t.stale[b] - set(copied.get(b, ()))
            ws &= set(new_owners[b]) if b < len(new_owners) and b not in skip else set()
            if ws:
                t.stale[b] = ws
            else:
                del t.stale[b]

    async def _adopt(self, holders, msg, version, new_owners) -> None:
        """Phase 2: every holder adopts the new placement and serves again. A
        retiring worker (not a member any more) need not."""
        await asyncio.gather(
            *(self.calls.call(w, "ps_set_placement", **msg, version=version, owners=new_owners)
              for w in holders if w in self.members),
            return_exceptions=True,
        )

    def announce(self, t) -> None:
        """Tell every client and worker that ``t``'s placement changed, so
        cached handles are refreshed before the next message instead of after
        a failed one (a connect to a dead worker can take ``timeouts.connect``).
        Clients hear it as a Dask event; workers through a handler."""
        self.scheduler.log_event("ps-placement", {"table": t.spec.name, "version": t.version})
        self.in_background(
            self.calls.broadcast("ps_placement_changed", table=t.spec.name, version=t.version)
        )

    async def load_copies(self, t, directory: str, blocks) -> None:
        """Read ``blocks`` of ``t`` from the checkpoint files in ``directory``
        into every copy, or into none: each owner reads and checks its blocks
        first (``ps_load_blocks`` keeps them aside), and only once every
        owner has are they installed (``ps_install_loaded``). A block that
        fails its checks (shape, dtype, NaN/Inf where the table forbids them)
        raises its error and no copy takes anything."""
        by_worker: dict[str, list[int]] = {}
        for b in blocks:
            for w in t.owners[b]:
                by_worker.setdefault(w, []).append(b)
        msg = dict(table=t.spec.name, table_id=t.spec.table_id, load_id=uuid.uuid4().hex)
        read = await asyncio.gather(*(
            self.calls.call(w, "ps_load_blocks", **msg, directory=directory, blocks=bs)
            for w, bs in by_worker.items()
        ), return_exceptions=True)
        failed = [r for r in read if isinstance(r, BaseException)]
        installed = await asyncio.gather(*(
            self.calls.call(w, "ps_install_loaded", **msg, discard=bool(failed)) for w in by_worker
        ), return_exceptions=True)
        if failed:
            raise _as_table_error(t.spec.name, failed[0])
        failed = [(w, r) for w, r in zip(by_worker, installed) if isinstance(r, BaseException)]
        if failed:  # a worker lost between the phases: its copy goes with it
            raise PSError(f"table {t.spec.name!r}: checkpoint blocks were not installed on {failed[0][0]}: "
                          f"{failed[0][1]!r}") from failed[0][1]

    async def restore_blocks(self, t, blocks: list[int], reason: str) -> None:
        """Fill lost blocks on their new (still frozen) owners from the latest checkpoint."""
        from dask_ps._checkpoint import table_dir

        path, data = t.checkpoint
        try:
            await self.load_copies(t, table_dir(path, data, t.spec.name), blocks)
        except Exception as e:  # never serve zeros in place of lost rows
            for b in blocks:
                t.lost[b] = f"{reason}; restoring from {path} failed: {e!r}"
            logger.error("dask_ps: table %r: restoring block(s) %s from %s failed: %r",
                         t.spec.name, blocks, path, e)
            return
        t.restored += len(blocks)
        self.note_rollback(t, blocks, reason)
        logger.warning(
            "dask_ps: table %r: block(s) %s were lost (%s) and restored from the checkpoint at %s; "
            "updates made since that checkpoint are lost",
            t.spec.name, blocks, reason, path,
        )


def _as_table_error(name: str, e: BaseException) -> BaseException:
    """A worker's error as the scheduler received it: a dask_ps error keeps
    its type; one that reached the scheduler's rpc as a plain ``Exception``
    (it does not deserialize replies) becomes a ``PSValueError`` with the
    worker's message."""
    if isinstance(e, PSError) or type(e) is not Exception:
        return e
    text = str(e)
    m = re.fullmatch(r"\w+\((['\"])(.*)\1\)", text, re.S)
    return PSValueError(m.group(2) if m else f"table {name!r}: {text}", name)
