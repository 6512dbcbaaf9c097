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

from distributed import SchedulerPlugin
from distributed.protocol.pickle import dumps

from dask_ps import _config
from dask_ps._exceptions import (
    ClockTimeoutError,
    RunAbortedError,
    TableExistsError,
    UnknownTableError,
)
from dask_ps._placement import place_blocks
from dask_ps._spec import TableSpec
from dask_ps._worker_plugin import PLUGIN_NAME, PSWorkerPlugin, reply_errors

logger = logging.getLogger(__name__)

HANDLERS = (
    "ps_register_server",
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
    "ps_run_abort",
    "ps_run_end",
)


@dataclass
class SchedulerTableState:
    spec: TableSpec
    spec_msg: dict
    version: int
    owners: list[list[str]]  # owners[block] = [primary, replicas...]

    def __repr__(self):
        return f"<SchedulerTableState {self.spec.name!r} v{self.version} {len(self.owners)} blocks>"

    def handle_msg(self) -> dict:
        return {"spec": self.spec_msg, "version": self.version, "owners": self.owners}


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
        self.lost: dict[str, set[int]] = {}
        self._table_locks: dict[str, asyncio.Lock] = {}
        self._servers_changed = None
        self._background: set[asyncio.Task] = set()
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
        if worker not in self.members:
            return
        self.members.discard(worker)
        for name, t in self.tables.items():
            lost = {b for b, owners in enumerate(t.owners) if owners and owners[0] == worker}
            if lost:
                self.lost.setdefault(name, set()).update(lost)
                # INFO, not WARNING: every cluster shutdown removes workers too.
                logger.info(
                    "dask_ps: worker %s left (%s) holding %d block(s) of table %r",
                    worker, stimulus_id, len(lost), name,
                )

    # --- membership -------------------------------------------------------------
    async def register_server(self, address: str) -> None:
        """Handler (worker plugin setup): this worker can host shards."""
        self.members.add(address)
        async with self._servers_changed:
            self._servers_changed.notify_all()

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
            owners = place_blocks(
                new.name,
                new.n_blocks,
                self.members,
                vnodes=int(_config.get("vnodes")),
                load_factor=float(_config.get("load-factor")),
            )
            version = 1
            by_worker: dict[str, list[int]] = {}
            for b, ws in enumerate(owners):
                for w in ws:
                    by_worker.setdefault(w, []).append(b)
            await asyncio.gather(
                *(
                    self.scheduler.rpc(w).ps_create_shards(spec=spec, version=version, blocks=bs)
                    for w, bs in by_worker.items()
                )
            )
            state = SchedulerTableState(new, spec, version, owners)
            self.tables[new.name] = state
            logger.info("dask_ps: created table %r (%s) on %d workers", new.name, new.describe(), len(by_worker))
            return state.handle_msg()

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
        t = self._table(name)
        del self.tables[name]
        self.lost.pop(name, None)
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

    async def _broadcast(self, op: str, **msg) -> None:
        results = await asyncio.gather(
            *(getattr(self.scheduler.rpc(w), op)(**msg) for w in sorted(self.members)),
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
