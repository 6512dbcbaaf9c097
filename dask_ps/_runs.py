"""The scheduler's runs: membership, nothing per clock (issue 36).

The participants' clocks are counted by the servers (:mod:`dask_ps._runclocks`);
the scheduler keeps what changes rarely: which participants a run has, which
finished, where they run, how often each was started, the servers they
report to, and whether the run was aborted. Every change is sent to the
workers as a numbered record (``ps_run_update``, the newest epoch wins).
The clocks it shows (the dashboard, Prometheus, a run's metrics) are
sampled from the servers (``ps_info``) and taken from each participant's
metrics when it leaves.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

from dask_ps import _config
from dask_ps._exceptions import PSValueError, RunAbortedError, RunEndedError

logger = logging.getLogger(__name__)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class RunState:
    """One ``ParameterServer.run`` as the scheduler knows it. ``clocks[rank]``:
    that participant's clocks as last sampled from the servers (or reported
    when it left); the servers hold the live ones."""

    run_id: str
    n: int
    clocks: list[int]
    done: set[int] = field(default_factory=set)
    where: dict[int, str] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    aborted: str | None = None
    by_caller: bool = False  # aborted by ParameterServer.run (run_abort): its caller no longer waits
    metrics: dict[int, dict] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    notify: bool = False  # servers hold per-clock sums or ESSP readers: its end waits for them
    tables: set[str] = field(default_factory=set)  # tables its participants used
    rollbacks: list[dict] = field(default_factory=list)  # restores from a checkpoint while it ran
    name: str = ""  # the participant function's name (the dashboard)
    info: dict = field(default_factory=dict)  # run_info: name, params, planned_clocks (the dashboard)
    waiting: int = 0  # reads and clocks parked at the servers (sampled)
    wait_seconds: float = 0.0  # seconds they spent parked (sampled: the servers' sum)
    epoch: int = 0  # membership version sent to the workers
    owner: str | None = field(default=None, repr=False)  # the starting client's secret (issue 34)

    def __repr__(self):
        return f"<RunState {self.run_id} clocks={self.clocks} done={sorted(self.done)}>"

    @property
    def min_clock(self) -> float:
        live = [c for r, c in enumerate(self.clocks) if r not in self.done]
        return min(live) if live else math.inf

    def check_rank(self, rank) -> None:
        """Only the run's participants join and leave: a rank outside
        ``[0, n)`` is refused, and nothing changes."""
        if not (_is_int(rank) and 0 <= rank < self.n):
            raise PSValueError(f"run {self.run_id}: rank {rank!r} is not one of its participants 0..{self.n - 1}")


class Runs:
    """The scheduler's runs (``runs``: run id -> :class:`RunState`).

    ``calls``: the scheduler's :class:`~dask_ps._liveness.WorkerCalls`
    (``broadcast`` to every member, ``call``); ``members``: the servers (a
    set read at each use); ``in_background(coro)``: runs a task the plugin
    waits for when it settles.
    """

    def __init__(self, calls, members: set[str], in_background):
        self.runs: dict[str, RunState] = {}
        self.calls = calls
        self.members = members
        self.in_background = in_background

    def __repr__(self):
        return f"<Runs {sorted(self.runs)}>"

    def get(self, run_id) -> RunState:
        run = self.runs.get(run_id)
        if run is None:
            raise RunEndedError(f"run {run_id} has ended or was aborted")
        if run.aborted:
            raise (RunEndedError if run.by_caller else RunAbortedError)(f"run {run_id} was aborted: {run.aborted}")
        return run

    def record(self, run: RunState, new: bool = False) -> dict:
        """The membership record the workers keep (``_runclocks.RunClocks.update``)."""
        return {"run_id": run.run_id, "n": run.n, "epoch": run.epoch, "done": sorted(run.done),
                "where": {str(r): a for r, a in run.where.items()}, "servers": sorted(self.members),
                "aborted": run.aborted, "by_caller": run.by_caller, "new": new}

    async def announce(self, run: RunState, new: bool = False) -> None:
        """Send ``run``'s membership to every server (a newer epoch each time)."""
        run.epoch += 1
        sent = asyncio.ensure_future(self.calls.broadcast("ps_run_update", record=self.record(run, new)))
        try:  # a hung server (fenced out later) does not hold a join or leave: it goes on in the background
            await asyncio.wait_for(asyncio.shield(sent), _config.get_seconds("timeouts.rpc"))
        except asyncio.TimeoutError:
            logger.info("dask_ps: run %s: a server has not taken its membership record yet", run.run_id)

    def check_new(self, run_id, n, owner) -> None:
        """Refuse a run that cannot start (nothing changes)."""
        if not (isinstance(run_id, str) and _is_int(n) and n >= 1 and isinstance(owner, (str, type(None)))):
            raise PSValueError(f"a run needs a str id and n >= 1 participants, got {run_id!r}, {n!r}")
        if run_id in self.runs:  # another client's, or a re-run cell: it must not take that run over
            raise PSValueError(f"run {run_id} is active already; a run id is started once")

    async def start(self, run_id: str, n: int, name: str, info: dict, owner: str | None = None) -> None:
        """A run of ``n`` participants starts (``ps_run_start``); an id is started once."""
        self.check_new(run_id, n, owner)
        run = self.runs[run_id] = RunState(run_id, n, [0] * n, name=str(name)[:200], info=info, owner=owner)
        # Before any participant starts: every server counts its clocks.
        await self.announce(run, new=True)

    async def join(self, run_id: str, rank: int, address: str) -> tuple[int, int]:
        """A participant starts (or restarts): ``(clock, attempt)``; a retried
        one resumes at the highest clock a server has of it."""
        run = self.get(run_id)
        run.check_rank(rank)
        run.where[rank] = address
        attempt = run.attempts[rank] = run.attempts.get(rank, 0) + 1
        if attempt > 1:
            run.clocks[rank] = max(run.clocks[rank], (await self.clocks_of(run))[rank])
        if rank in run.done:  # a retried task that had left: the servers count it again before it runs
            run.done.discard(rank)
            await self.announce(run)
        else:  # where it runs: for the servers' "who is behind" errors only
            self.in_background(self.announce(run))
        return run.clocks[rank], attempt

    async def leave(self, run_id: str, rank: int, metrics: dict | None, totals) -> None:
        """A participant returned or raised: it no longer holds the others
        (the servers hear it before this returns)."""
        run = self.runs.get(run_id)
        if run is None:
            return
        run.check_rank(rank)
        run.done.add(rank)
        if metrics is not None:
            run.metrics[rank] = metrics
            if _is_int(metrics.get("clock")):
                run.clocks[rank] = max(run.clocks[rank], metrics["clock"])
            totals["wait_seconds"] += metrics.get("clock_wait_seconds", 0.0)
            for t in metrics.get("tables", {}).values():
                for key in ("reads", "cache_hits", "wait_seconds", "bytes_pushed", "bytes_pulled"):
                    totals[key] += t.get(key, 0)
            logger.debug("dask_ps: run %s participant %d metrics %s", run_id, rank, metrics)
        await self.announce(run)

    async def abort(self, run_id: str, reason: str) -> None:
        run = self.runs.get(run_id)
        if run is None:
            return
        run.aborted, run.by_caller = reason or "aborted", True
        await self.announce(run)  # waits parked at the servers raise

    def active(self, tables=None) -> list[str]:
        """Runs in progress (that used any of ``tables``, if given)."""
        if tables is None:
            return sorted(self.runs)
        return sorted(r for r, run in self.runs.items() if run.tables & set(tables))

    def uses(self, run_id: str, table: str) -> None:
        """A participant of ``run_id`` uses ``table`` (its end compares that table's copies)."""
        run = self.runs.get(run_id)
        if run is not None:
            run.tables.add(table)

    def notify_at_end(self, run_id: str) -> None:
        """A participant uses a table whose servers act on clock advances:
        the run's end waits for the servers to apply what it left."""
        self.get(run_id).notify = True

    def abort_all(self, reason: str) -> None:
        """Every run ends at once (the scheduler closes, the cluster restarts)."""
        for run in self.runs.values():
            run.aborted = reason
        self.runs.clear()

    def rolled_back(self, record: dict) -> None:
        """Blocks were restored from a checkpoint: every active run reports it at its end."""
        for run in self.runs.values():
            run.rollbacks.append({**record, "clocks": list(run.clocks), "run_started": run.started})

    async def end(self, run: RunState) -> None:
        """Forget ``run``. Servers free its exactly-once windows (and refuse
        its late pushes from now on); they apply what it left (per-clock
        sums) before this returns; without such sums the end does not wait
        for every worker to answer."""
        self.runs.pop(run.run_id, None)
        if run.notify:
            await self.calls.broadcast("ps_run_end", run_id=run.run_id)
        else:
            self.in_background(self.calls.broadcast("ps_run_end", run_id=run.run_id))

    @staticmethod
    def summary(run: RunState, copies_disagree: list) -> dict:
        """What ``ps_run_end`` returns to the client."""
        return {
            "run_id": run.run_id,
            "copies_disagree": copies_disagree,
            "clocks": list(run.clocks),
            "attempts": dict(run.attempts),
            "seconds": time.time() - run.started,
            "participants": {int(k): v for k, v in run.metrics.items()},
            "rolled_back": [r for r in run.rollbacks if r["table"] in run.tables],
        }

    def servers_changed(self) -> None:
        """A server joined or left: every run's servers are sent again (a new
        one takes the clocks from a peer, ``RunClocks.adopt``)."""
        for run in list(self.runs.values()):
            self.in_background(self.announce(run))

    async def clocks_of(self, run: RunState) -> list[int]:
        """Per participant, the highest clock any server has of it (rare: a
        retried participant's join)."""
        out = list(run.clocks)
        rpc_timeout = _config.get_seconds("timeouts.rpc")  # a hung server does not hold the join
        got = await asyncio.gather(*(asyncio.wait_for(self.calls.call_once(w, "ps_run_clocks", run_id=run.run_id),
                                                      rpc_timeout)
                                     for w in sorted(self.members)), return_exceptions=True)
        for g in got:
            if isinstance(g, dict) and isinstance(g.get("clocks"), (list, tuple)) and len(g["clocks"]) == run.n:
                out = [max(a, int(b)) for a, b in zip(out, g["clocks"])]
        return out

    def sampled(self, served: dict) -> None:
        """The servers' ``ps_info(served=True)`` (the dashboard's periodic
        sample): the runs' clocks (the highest a server has), the reads and
        clocks parked at them and the seconds they spent there."""
        seen: dict[str, list] = {}
        for info in served.values():
            for run_id, r in (info.get("runs") or {}).items() if isinstance(info, dict) else ():
                run = self.runs.get(run_id)
                if run is None or not isinstance(r, dict) or len(r.get("clocks") or ()) != run.n:
                    continue
                run.clocks = [max(a, int(b)) for a, b in zip(run.clocks, r["clocks"])]
                acc = seen.setdefault(run_id, [0, 0.0])
                acc[0] += int(r.get("waiting", 0))
                acc[1] += float(r.get("wait_seconds", 0.0))
        for run_id, (waiting, seconds) in seen.items():
            self.runs[run_id].waiting, self.runs[run_id].wait_seconds = waiting, seconds
