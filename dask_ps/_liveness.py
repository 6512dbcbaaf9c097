"""Fail fast on dead workers.

Dask's connection pool retries a connect to a dead address until
``distributed.comm.timeouts.connect`` (30 s by default). dask_ps learns of a
dead worker from the scheduler at once (a handler on workers, an event on
clients); ``Liveness`` then cancels the calls in flight to it and refuses new
ones with ``OSError``, which the failover logic retries elsewhere.

Also here: the scheduler's calls to workers (``WorkerCalls``), its watch for
workers that hang instead of dying (``HungWorkers``: fenced out like dead
ones), and a worker's own check that it was not stopped long enough to have
been fenced out (``PauseGuard``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

from distributed.comm import CommClosedError

logger = logging.getLogger(__name__)


class WorkerGone(OSError):
    """The worker was removed from the cluster."""


class Liveness:
    def __init__(self):
        self.dead: set[str] = set()
        self._inflight: dict[str, set[asyncio.Task]] = defaultdict(set)

    def mark_dead(self, addr: str) -> None:
        """Called on the event loop that runs the calls."""
        self.dead.add(addr)
        for task in self._inflight.pop(addr, ()):
            task.cancel()

    async def call(self, addr: str, make_call):
        """Await ``make_call()`` (a call to ``addr``) unless ``addr`` is or
        becomes dead. A factory, so that nothing is created for a dead address."""
        if addr in self.dead:
            raise WorkerGone(f"worker {addr} has left the cluster")
        task = asyncio.ensure_future(make_call())
        task.add_done_callback(_retrieve)
        self._inflight[addr].add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if addr in self.dead and task.cancelled():
                raise WorkerGone(f"worker {addr} left the cluster during the call") from None
            raise
        finally:
            tasks = self._inflight.get(addr)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    self._inflight.pop(addr, None)


class WorkerCalls:
    """The scheduler's RPCs to workers, through :class:`Liveness`.

    ``rpc(address)`` gives the scheduler's rpc to a worker; ``retiring`` and
    ``members`` are the plugin's sets (read at each call).
    """

    def __init__(self, rpc, liveness: Liveness, retiring: set[str], members: set[str]):
        self.rpc = rpc
        self.liveness = liveness
        self.retiring = retiring
        self.members = members

    def __repr__(self):
        return f"<WorkerCalls members={len(self.members)} retiring={sorted(self.retiring)}>"

    def call_once(self, worker: str, op: str, **msg):
        """An RPC to a worker that fails fast if the worker is removed meanwhile."""
        return self.liveness.call(worker, lambda: getattr(self.rpc(worker), op)(**msg))

    async def call(self, worker: str, op: str, attempts: int = 4, **msg):
        """An RPC to a worker (:meth:`call_once`), retried on a closed
        connection while ``worker`` is retiring: Dask's scheduler drops its
        connections to a worker when it removes it, while the worker still
        serves its blocks (its teardown waits for the evacuation), so a new
        connection gets through."""
        for attempt in range(attempts):
            try:
                return await self.call_once(worker, op, **msg)
            except (CommClosedError, OSError):
                if worker not in self.retiring or worker in self.liveness.dead or attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)

    async def broadcast(self, op: str, **msg) -> None:
        """``op`` on every member; failures are logged (debug), not raised."""
        results = await asyncio.gather(
            *(self.call(w, op, **msg) for w in sorted(self.members)),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, Exception):
                logger.debug("dask_ps: %s failed on a worker: %r", op, r)


def _retrieve(task: asyncio.Task) -> None:
    # The caller may have been cancelled first: mark the result as seen so
    # asyncio does not log "Task exception was never retrieved".
    if not task.cancelled():
        task.exception()


class HungWorkers:
    """The scheduler's watch for shard servers that hang (SIGSTOP, a frozen
    VM, a stuck event loop) instead of dying.

    Dask removes such a worker only after ``distributed.scheduler.worker-ttl``
    (minutes); until then every push forwarded to it, and every read or push
    of a block it is primary of, waits up to ``ps.timeouts.rpc``. Its
    heartbeats stop at once, though: a member whose last heartbeat is older
    than ``ps.timeouts.hung`` (and three heartbeat intervals) is *fenced out*
    as a dead worker is: the other workers and the clients cancel their calls
    to it (``ps_worker_left``, event ``"ps-worker-left"``) and refuse its
    forwards, and every table it holds is repaired without it (a replica is
    promoted, a new copy made). Calls fail over within seconds.

    It is done only where nothing is lost by it: every block the worker holds
    must have another up-to-date copy on a responsive member (otherwise the
    callers wait for it, as before, and a WARNING says why). When the worker
    answers again, it drops every copy it still has (``ps_evicted``: they
    missed pushes) and is taken back as a new member, so tables rebalance
    onto it with fresh copies.
    """

    def __init__(self, plugin):
        self.plugin = plugin
        self.fenced: dict[str, str] = {}  # worker -> eviction id, until it is taken back
        self._warned: set[str] = set()  # hung workers not fenced (sole copies), warned once
        self._last_check: float | None = None
        self._callback = None
        self._waiting: set[asyncio.Task] = set()  # ps_evicted calls waiting for a hung worker

    def __repr__(self):
        return f"<HungWorkers fenced={sorted(self.fenced)}>"

    def start(self, period: float = 0.25) -> None:
        from tornado.ioloop import PeriodicCallback

        self._callback = PeriodicCallback(self.check, period * 1000)
        self._callback.start()

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
        for task in self._waiting:
            task.cancel()

    def forget(self, worker: str) -> None:
        """``worker`` left the cluster (Dask removed it)."""
        self.fenced.pop(worker, None)
        self._warned.discard(worker)

    def limit(self) -> float:
        """Seconds without a heartbeat after which a member counts as hung (0: never)."""
        from distributed.scheduler import heartbeat_interval

        from dask_ps import _config

        hung = _config.get_seconds("timeouts.hung")
        if not hung:
            return 0.0
        return max(hung, 3 * heartbeat_interval(len(self.plugin.scheduler.workers)))

    def check(self) -> None:
        """Periodic (scheduler's event loop): fence out members that hang."""
        from distributed.metrics import time

        plugin = self.plugin
        now = time()
        last, self._last_check = self._last_check, now
        limit = self.limit()
        if not limit or plugin.scheduler is None or plugin.scheduler.status.name != "running":
            return
        if last is not None and now - last > limit / 2:
            return  # this loop stalled itself: heartbeats may be waiting to be read
        workers = plugin.scheduler.workers
        silent = {w for w in plugin.members
                  if w in workers and w not in plugin._retiring and now - workers[w].last_seen > limit}
        for w in list(self._warned):
            if w not in silent:
                self._warned.discard(w)
        if not silent or len(silent) >= len(plugin.members):
            return  # nobody answers: more likely the scheduler's problem than theirs
        for w in sorted(silent):
            why_not = self._sole_copies(w, silent)
            if why_not:
                if w not in self._warned:
                    self._warned.add(w)
                    logger.warning("dask_ps: worker %s has sent no heartbeat for %.1f s but is not fenced: %s; "
                                   "calls to it wait until it answers or Dask removes it",
                                   w, now - workers[w].last_seen, why_not)
                continue
            self._fence_out(w, f"{w} hung (no heartbeat for {now - workers[w].last_seen:.1f} s)")

    def _sole_copies(self, worker: str, silent: set[str]) -> str | None:
        """Why fencing ``worker`` out would lose data (a block whose only
        up-to-date copy it holds), or None."""
        plugin = self.plugin
        for name, owners in list(getattr(plugin, "creating", {}).items()):
            if any(worker in ws and len(ws) == 1 for ws in owners):
                return f"it holds the only copy of a block of table {name!r}, being created"
        for t in plugin.tables.values():
            if t.lost or worker not in t.holders():
                continue
            for b, owners in enumerate(t.owners):
                if worker in owners and not any(
                    w != worker and w in plugin.members and w not in silent and w not in t.stale.get(b, ())
                    for w in owners
                ):
                    return f"it holds the only up-to-date copy of block {b} of table {t.spec.name!r}"
        return None

    def _fence_out(self, worker: str, reason: str) -> None:
        import uuid

        plugin = self.plugin
        logger.warning("dask_ps: %s: fencing it out (its copies leave every placement)", reason)
        self.fenced[worker] = uuid.uuid4().hex
        plugin.members.discard(worker)
        plugin.liveness.mark_dead(worker)  # the scheduler's own calls to it fail over
        plugin.scheduler.log_event("ps-worker-left", {"address": worker, "reason": reason})
        plugin._in_background(self._repair_without(worker, reason))
        task = asyncio.ensure_future(self._take_back(worker, self.fenced[worker]))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _repair_without(self, worker: str, reason: str) -> None:
        """Tell the other workers first (they then refuse its forwards: it
        may still think it is a primary when it runs again), then repair."""
        from dask_ps import _config

        plugin = self.plugin
        bound = max(1.0, _config.get_seconds("timeouts.hung"))
        await asyncio.gather(*(
            asyncio.wait_for(plugin.calls.call(w, "ps_worker_left", address=worker), bound)
            for w in sorted(plugin.members)
        ), return_exceptions=True)
        for t in list(plugin.tables.values()):
            if worker in t.holders():
                plugin._in_background(plugin.placement.repair(t.spec.name, gone={worker}, reason=reason))

    async def _take_back(self, worker: str, eviction: str) -> None:
        """Wait until ``worker`` answers again; it drops its copies
        (``ps_evicted``); then it joins as a new member."""
        plugin = self.plugin
        while self.fenced.get(worker) == eviction and worker in plugin.scheduler.workers:
            try:
                # Not through Liveness: the worker is marked dead there.
                await asyncio.wait_for(plugin.worker_rpc(worker).ps_evicted(eviction=eviction), 60)
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a connect that timed out while it hangs: again
                logger.debug("dask_ps: ps_evicted to %s: %r", worker, e)
                await asyncio.sleep(0.5)
        if self.fenced.get(worker) != eviction or worker not in plugin.scheduler.workers:
            return
        del self.fenced[worker]
        logger.warning("dask_ps: worker %s answers again; it dropped its old copies and joins again", worker)
        await plugin.register_server(worker)


class PauseGuard:
    """A worker's check that it has not been stopped (SIGSTOP, a frozen VM)
    long enough to have been fenced out as hung (:class:`HungWorkers`).

    When the process runs again, its event loop may serve a read or a push
    before it reads the scheduler's ``ps_evicted`` that drops its old
    copies; they missed every push made meanwhile. So a gap of more than
    half ``ps.timeouts.hung`` between two of this loop's ticks (or checks)
    makes :meth:`check` refuse (``StaleVersionError``: callers retry) until
    ``fenced_out()`` (an RPC to the scheduler) says this worker was not
    fenced out, or :meth:`clear` is called after the copies were dropped.
    """

    def __init__(self, fenced_out):
        self._fenced_out = fenced_out  # async () -> bool
        self._last = time.monotonic()
        self._confirming: asyncio.Task | None = None
        self._gap = 0.0
        self._callback = None

    def __repr__(self):
        return f"<PauseGuard suspect={self._confirming is not None}>"

    def start(self, period: float = 0.1) -> None:
        """Tick on the running event loop (until then nothing is refused)."""
        from tornado.ioloop import PeriodicCallback

        self._last = time.monotonic()
        self._callback = PeriodicCallback(self._observe, period * 1000)
        self._callback.start()

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        if self._confirming is not None:
            self._confirming.cancel()
            self._confirming = None

    def _observe(self) -> None:
        from dask_ps import _config

        if self._callback is None:
            return  # not started (a plugin used without a worker) or stopped
        now = time.monotonic()
        gap, self._last = now - self._last, now
        limit = _config.get_seconds("timeouts.hung") / 2
        if limit and gap > limit and self._confirming is None:
            self._gap = gap
            logger.warning("dask_ps: this worker did not run for %.1f s; its copies serve nothing until the "
                           "scheduler says whether it was fenced out", gap)
            self._confirming = asyncio.ensure_future(self._confirm())

    async def _confirm(self) -> None:
        while True:
            try:
                if not await self._fenced_out():
                    self._confirming = None
                # else: ps_evicted will come (the scheduler resends it) and clear()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the scheduler is busy or away: ask again
                logger.debug("dask_ps: asking whether this worker was fenced out: %r", e)
                await asyncio.sleep(0.5)

    def clear(self) -> None:
        """The old copies are gone (``ps_evicted``): serving is safe again."""
        if self._confirming is not None:
            self._confirming.cancel()
        self._confirming = None
        self._last = time.monotonic()

    def check(self) -> None:
        """Raise ``StaleVersionError`` while this worker may have been fenced out."""
        self._observe()
        if self._confirming is not None:
            from dask_ps._exceptions import StaleVersionError

            raise StaleVersionError(
                f"this worker did not run for {self._gap:.1f} s (stopped or hung); its copies serve "
                "nothing until the scheduler confirms its placement: retry"
            )
