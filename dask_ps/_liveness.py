"""Fail fast on dead workers.

Dask's connection pool retries a connect to a dead address until
``distributed.comm.timeouts.connect`` (30 s by default). dask_ps learns of a
dead worker from the scheduler at once (a handler on workers, an event on
clients); ``Liveness`` then cancels the calls in flight to it and refuses new
ones with ``OSError``, which the failover logic retries elsewhere.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict


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


def _retrieve(task: asyncio.Task) -> None:
    # The caller may have been cancelled first: mark the result as seen so
    # asyncio does not log "Task exception was never retrieved".
    if not task.cancelled():
        task.exception()
