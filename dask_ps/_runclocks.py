"""The clocks of the runs, counted by the servers (issue 36).

Bösen's server vector clock (``server.cpp`` ``ClockUntil``): every worker
plugin keeps, per run, the clock each participant reported to it
(:class:`RunRecord`), and the run's minimum over its live participants.
The scheduler is on no clock's path: it keeps each run's membership
(participants, which of them finished, where they run, the servers they
report to) and sends it to the workers when it changes (``ps_run_update``:
start, join, leave, abort, a server joining or leaving; rare events).

Two clocks per participant (``docs/architecture.rst``, "Clocks"). Its
*claim* (:meth:`RunClocks.claim`) is the clock of its latest combined
message here (its pushes to this server and the clock, one message per
server per clock): its pushes to this server of the clocks below were
applied here, on every copy, before the claim counted, so a read of the
blocks this server is the primary of (under the placement the participant
routed by) may wait on the claims (:meth:`RunRecord.bound`). Its *run-wide*
clock (``clocks``) is one behind the claim, or what it reported after its
pushes were acknowledged everywhere (a message without pushes): a clock's
message goes out only after the one before was acknowledged by every
server, so every update of the clocks below the run-wide minimum is on
every server. That minimum, and only it, is shared: a read of another
server's copy waits on it, a server may take a peer's run-wide clocks as
its own (a server that joins a run late does: :meth:`RunClocks.adopt`),
and a reader's floor (the run-wide minimum it learnt) holds for every
server.

Runs on the worker's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

from dask_ps._exceptions import ClockTimeoutError, PSValueError, RunAbortedError, RunEndedError

logger = logging.getLogger(__name__)


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


@dataclass(eq=False)
class RunRecord:
    """One run as this worker knows it: membership from the scheduler,
    clocks from the participants (``clocks[rank]``: the clocks it completed
    and reported here), ``floor``: a minimum learnt from a reader or a peer."""

    run_id: str
    n: int
    clocks: list[int]
    epoch: int = -1  # the scheduler's membership version this record holds
    done: set[int] = field(default_factory=set)
    where: dict[int, str] = field(default_factory=dict)
    servers: tuple[str, ...] = ()
    aborted: str | None = None
    by_caller: bool = False  # its caller aborted or ended it: nobody waits for the participants
    floor: float = 0
    advanced: float = 0  # the last minimum handed to on_advance
    # [(clock, future, measure)] parked until measure(self) >= clock (None: min_clock)
    waiters: list = field(default_factory=list)
    # Combined clock messages (push + clock in one, ``claim``): per rank the
    # clock of its latest one here and its placement versions then.
    claims: list[int] = field(default_factory=list)
    claim_versions: list[dict] = field(default_factory=list)
    waiting_seconds: float = 0.0  # time reads and clocks spent parked here

    def __repr__(self):
        return f"<RunRecord {self.run_id} clocks={self.clocks} done={sorted(self.done)} min={self.min_clock}>"

    def aborted_error(self) -> RunAbortedError:
        # RunEndedError: the participant ends quietly (_session.participant)
        kind = RunEndedError if self.by_caller else RunAbortedError
        return kind(f"run {self.run_id} was aborted: {self.aborted}")

    @property
    def min_clock(self) -> float:
        """Every update of every live participant's clocks below this is on
        every copy of every block (the run-wide bound)."""
        live = [c for r, c in enumerate(self.clocks) if r not in self.done]
        return max(self.floor, min(live)) if live else math.inf

    def _claimed(self, r: int) -> int:
        return max(self.clocks[r], self.claims[r]) if self.claims else self.clocks[r]

    def progress(self) -> float:
        """The clocks every live participant reached (its clock messages
        here): what an SSP participant's clock waits for. No bound on data."""
        live = [self._claimed(r) for r in range(self.n) if r not in self.done]
        return max(self.floor, min(live)) if live else math.inf

    def bound(self, table: str, version: int) -> float:
        """A read of blocks this server is the primary of in placement
        ``version`` of ``table`` sees every update of the live participants'
        clocks below this: a participant's combined message for clock ``c``
        was counted here after its pushes to this server were applied (on
        every copy), and it routed them under the same placement (else its
        run-wide clock counts)."""
        live = [self._claimed(r) if self.claims and self.claim_versions[r].get(table, version) == version
                else self.clocks[r] for r in range(self.n) if r not in self.done]
        return max(self.floor, min(live)) if live else math.inf

    def behind(self, clock: int) -> list[str]:
        return [f"participant {r} at clock {self._claimed(r)} on {self.where.get(r, '?')}"
                for r in range(self.n) if r not in self.done and self._claimed(r) < clock]


class RunClocks:
    """This worker's :class:`RunRecord` of every run it serves.

    ``fetch_record(run_id)``: the scheduler's membership record of a run this
    worker has not heard of (None: ended or unknown); ``fetch_peer(address,
    run_id)``: another server's clocks of it; ``on_advance(run_id, min)``:
    called when a run's minimum grows (due per-clock sums, ESSP pushes);
    ``resync()``: seconds a wait stays parked before it asks the run's
    other servers for their run-wide clocks, and again each period while
    it waits (0: never; :meth:`wait`).
    """

    def __init__(self, fetch_record, fetch_peer, on_advance, me=lambda: None, ended=None, resync=lambda: 0.0):
        self.records: dict[str, RunRecord] = {}
        self._fetch_record = fetch_record
        self._fetch_peer = fetch_peer
        self._on_advance = on_advance
        self._me = me
        self._resync_seconds = resync
        self._resyncs: dict[str, asyncio.Future] = {}  # run_id -> peers asked, in flight
        self._lookups: dict[str, asyncio.Future] = {}
        # Runs ended here (the plugin's bounded list): never recreated by a late message.
        self.ended = ended if ended is not None else set()

    def __repr__(self):
        return f"<RunClocks {list(self.records.values())}>"

    # --- membership (the scheduler) ---------------------------------------------------------
    def update(self, msg: dict) -> RunRecord | None:
        """A membership record from the scheduler (newer epochs win). A run
        this worker did not know (other than one just started, all clocks
        0) takes its clocks from a peer, in the background."""
        run_id, n, epoch = msg.get("run_id"), msg.get("n"), msg.get("epoch")
        if not (isinstance(run_id, str) and _is_count(n) and n >= 1 and _is_count(epoch)):
            raise PSValueError(f"a run record needs run_id, n >= 1 and epoch, got {msg!r}")
        if run_id in self.ended:
            return None
        rec = self.records.get(run_id)
        fresh = rec is None
        if fresh:
            rec = self.records[run_id] = RunRecord(run_id, n, [0] * n)
        if epoch > rec.epoch:
            rec.epoch = epoch
            rec.done = {int(r) for r in msg.get("done", ())}
            rec.where = {int(r): str(a) for r, a in (msg.get("where") or {}).items()}
            rec.servers = tuple(msg.get("servers") or ())
            rec.aborted = msg.get("aborted")
            rec.by_caller = bool(msg.get("by_caller"))
        if fresh and not msg.get("new"):
            peers = [s for s in rec.servers if s != self._me()]
            if peers:
                asyncio.ensure_future(self.adopt(rec, peers))
        self._changed(rec)
        return rec

    async def adopt(self, rec: RunRecord, peers) -> None:
        """Take a peer's clocks of ``rec``'s run (sound: see the module's
        docstring); the first peer that answers."""
        for peer in peers:
            if await self._take_from(rec, peer):
                return

    async def _take_from(self, rec: RunRecord, peer: str) -> bool:
        """Take ``peer``'s run-wide clocks of ``rec``'s run where higher;
        whether it answered with them."""
        try:
            got = await self._fetch_peer(peer, rec.run_id)
        except Exception as e:  # noqa: BLE001 - another peer, or the participants' next clocks
            logger.debug("dask_ps: clocks of run %s from %s: %r", rec.run_id, peer, e)
            return False
        if not (isinstance(got, dict) and isinstance(got.get("clocks"), (list, tuple)) and len(got["clocks"]) == rec.n):
            return False
        rec.clocks = [max(a, int(b)) for a, b in zip(rec.clocks, got["clocks"])]
        if got.get("min") is not None:
            rec.floor = max(rec.floor, got["min"])
        self._changed(rec)
        return True

    def _resync(self, rec: RunRecord, period: float) -> None:
        """Take every other server's run-wide clocks of ``rec``'s run, in
        the background: one round at a time per run (the waits parked on it
        share it), and a peer that does not answer within ``period`` does
        not hold the next round up."""
        if rec.run_id in self._resyncs:
            return
        peers = [s for s in rec.servers if s != self._me()]
        if not peers:
            return

        async def one_round():
            await asyncio.wait([asyncio.ensure_future(self._take_from(rec, p)) for p in peers], timeout=period)

        task = self._resyncs[rec.run_id] = asyncio.ensure_future(one_round())
        task.add_done_callback(lambda _: self._resyncs.pop(rec.run_id, None))

    async def get(self, run_id: str) -> RunRecord:
        """The record of ``run_id``, asked of the scheduler once if unknown
        here (a worker that joined after the run started)."""
        rec = self.records.get(run_id)
        if rec is not None:
            return rec
        if not isinstance(run_id, str):
            raise PSValueError(f"a run id must be a str, got {run_id!r}")
        if run_id not in self.ended:
            lookup = self._lookups.get(run_id)
            if lookup is None:
                lookup = self._lookups[run_id] = asyncio.ensure_future(self._fetch_record(run_id))
                lookup.add_done_callback(lambda _: self._lookups.pop(run_id, None))
            msg = await asyncio.shield(lookup)
            rec = self.records.get(run_id)
            if rec is None and msg is not None:
                rec = self.update(msg)
            if rec is not None:
                return rec
        raise RunEndedError(f"run {run_id} has ended or was aborted")

    def end(self, run_id: str) -> None:
        """The run ended: waiters are released with an error, the record forgotten."""
        rec = self.records.pop(run_id, None)
        if rec is not None:
            rec.aborted, rec.by_caller = rec.aborted or "the run ended", True
            self._wake(rec)

    # --- clocks (the participants) -----------------------------------------------------------
    def clock(self, rec: RunRecord, rank, clock) -> None:
        """``rank`` completed ``clock`` clocks (every push before them acknowledged).
        The max: a repeated report (a retried task) counts once."""
        if not (isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < rec.n):
            raise PSValueError(f"run {rec.run_id}: rank {rank!r} is not one of its participants 0..{rec.n - 1}")
        if not _is_count(clock):
            raise PSValueError(f"run {rec.run_id}: rank {rank} reported clock {clock!r}, not a count >= 0")
        if rec.aborted:  # every participant learns of it at its next clock
            raise rec.aborted_error()
        if clock > rec.clocks[rank]:
            rec.clocks[rank] = clock
            self._changed(rec)

    def claim(self, rec: RunRecord, rank, clock, versions) -> None:
        """``rank``'s combined message for ``clock``: its pushes of the clock
        before (to this server) were applied here, on every copy. Its clock
        ``clock - 1`` counts run-wide: it sends a clock's message only after
        the one before was acknowledged by every server. ``versions``: the
        placement version of each table it holds a handle of."""
        self.clock(rec, rank, max(0, clock - 1))
        if not (isinstance(versions, dict) and all(isinstance(k, str) and _is_count(v) for k, v in versions.items())):
            raise PSValueError(f"run {rec.run_id}: a clock message's versions must be {{table: version}}, "
                               f"got {versions!r}")
        if not rec.claims:
            rec.claims, rec.claim_versions = [0] * rec.n, [{} for _ in range(rec.n)]
        if clock > rec.claims[rank]:
            rec.claims[rank], rec.claim_versions[rank] = clock, dict(versions)
            self._changed(rec)

    def note_floor(self, run_id: str, m) -> None:
        """A reader knows the run's minimum is at least ``m`` (learnt from a server)."""
        rec = self.records.get(run_id)
        if rec is not None and isinstance(m, (int, float)) and m > rec.floor:
            rec.floor = m
            self._changed(rec)

    async def wait(self, rec: RunRecord, clock: int, timeout: float | None = None, measure=None) -> float:
        """Park until every live participant completed ``clock`` clocks;
        returns the minimum. Raises if the run is aborted or ends, and
        :class:`ClockTimeoutError` (naming who is behind) after ``timeout``.
        ``measure(rec)``: the value waited on instead of ``min_clock``
        (``progress``, ``bound``)."""
        if rec.aborted:
            raise rec.aborted_error()
        measure = measure or _min_clock
        if measure(rec) >= clock:
            return measure(rec)
        future = asyncio.get_running_loop().create_future()
        rec.waiters.append((clock, future, measure))
        t0 = time.monotonic()
        try:
            return await asyncio.wait_for(self._parked(rec, future), timeout)
        except asyncio.TimeoutError:
            raise ClockTimeoutError(
                f"run {rec.run_id}: waited {time.monotonic() - t0:.1f}s for every participant to "
                f"reach clock {clock}; behind: {'; '.join(rec.behind(clock))}") from None
        finally:
            rec.waiting_seconds += time.monotonic() - t0
            if not future.done():
                future.cancel()
            rec.waiters = [w for w in rec.waiters if w[1] is not future]

    async def _parked(self, rec: RunRecord, future: asyncio.Future) -> float:
        """``future``'s result; while it waits, every ``resync()`` seconds
        the run-wide clocks of the run's other servers are taken here. A
        wait must not hang on one server's missing news: a participant
        reports its clocks to the servers its worker lists and those it
        routes to, and a server that joined mid-run may not be either for
        one that does not read from it (its worker has heard of neither the
        run's new record nor the new placement yet), while that
        participant's clocks reached the others; a peer's run-wide clocks
        are sound to take (the module's docstring)."""
        period = self._resync_seconds()
        while period > 0 and not future.done():
            await asyncio.wait([future], timeout=period)
            if not future.done():
                self._resync(rec, period)
        return await asyncio.shield(future)

    def info(self) -> dict:
        """Per run: clocks (each participant's latest here: its progress;
        ``run_wide``: what bounds the whole run), parked waits and seconds
        (the dashboard samples them)."""
        return {run_id: {"clocks": [r._claimed(k) for k in range(r.n)], "run_wide": list(r.clocks),
                         "done": sorted(r.done), "waiting": len(r.waiters), "wait_seconds": r.waiting_seconds,
                         "min": None if math.isinf(r.min_clock) else r.min_clock}
                for run_id, r in self.records.items()}

    # --- internals -------------------------------------------------------------------------------
    def _changed(self, rec: RunRecord) -> None:
        m = rec.min_clock
        if m > rec.advanced:
            rec.advanced = m
            self._on_advance(rec.run_id, m)
        self._wake(rec)

    @staticmethod
    def _wake(rec: RunRecord) -> None:
        if not rec.waiters:
            return
        keep = []
        for clock, future, measure in rec.waiters:
            if future.done():
                continue
            if rec.aborted:
                future.set_exception(rec.aborted_error())
            elif (m := measure(rec)) >= clock:
                future.set_result(m)
            else:
                keep.append((clock, future, measure))
        rec.waiters = keep


def _min_clock(rec: RunRecord) -> float:
    return rec.min_clock


async def push_fresh_rows(plugin, run_id: str, min_clock: float) -> None:
    """ESSP (Bösen's eager pushes): after run ``run_id``'s minimum here grew
    to ``min_clock``, send the rows each of its readers subscribed to (by
    reading them) into that reader's cache mailbox (``ps_cache_fill``).
    ``plugin``: the worker plugin whose store, locks and subscriptions
    these are (runs on its event loop)."""
    from distributed.protocol.serialize import to_serialize

    from dask_ps import _backend
    from dask_ps._shard import _wire_clock
    from dask_ps._wire import aligned

    store, me, sends = plugin.store, plugin.worker.address, []
    for session, (address, tables) in list(plugin.subscriptions.get(run_id, {}).items()):
        for name, blocks in tables.items():
            t = store.tables.get(name)
            if t is None:
                continue
            async with plugin._all_locks(name):
                if store.tables.get(name) is not t:
                    continue
                summed = None
                if t.spec.aggregate == "clock":  # as a read would (see PSWorkerPlugin._read)
                    await plugin._apply_due(t, run_id, max(min_clock, plugin._min_clock.get(run_id, -1)))
                # Not from a copy that missed a push (checked under the
                # lock: a fence may arrive while we wait for it).
                reqs = [(b, r) for b, r in blocks.items() if b in t.blocks and b not in t.missed]
                dev_reqs = [(b, None if r is None else _backend.to_device(r, t.spec.device)) for b, r in reqs]
                seqs, values = store.read(t, dev_reqs, copy=address == me)
                if t.spec.aggregate == "clock":
                    summed = [_wire_clock(store.summed_below_of(t, b, run_id)) for b, _ in reqs]
            fill = dict(
                run_id=run_id, session=session, table=name, version=t.version, tag=min_clock,
                summed_below=summed, blocks=[b for b, _ in reqs], seqs=seqs,
                rows=[None if r is None else to_serialize(r) for _, r in reqs],
                values=[to_serialize(v) for v in values],
            )
            if address == me:
                plugin.cache_fill(**{**fill, "rows": [r for _, r in reqs], "values": values})
            else:
                sends.append(plugin.worker.rpc(address).ps_cache_fill(**aligned(fill), token=plugin.internal_token))
    for r in await asyncio.gather(*sends, return_exceptions=True):
        if isinstance(r, Exception):
            logger.debug("dask_ps: ESSP push failed: %r", r)
