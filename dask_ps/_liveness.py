"""Fail fast on dead workers.

Dask's connection pool retries a connect to a dead address until
``distributed.comm.timeouts.connect`` (30 s by default). dask_ps learns of a
dead worker from the scheduler at once (a handler on workers, an event on
clients); ``Liveness`` then cancels the calls in flight to it and refuses new
ones with ``OSError``, which the failover logic retries elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
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
