"""Retiring workers: their blocks move away while they still serve, and
they are gone once their teardown ends, never later.

``retire_workers`` (and adaptive scale-down) sets a worker's status to
``closing_gracefully``, then Dask removes it and closes it; its worker
plugin's teardown waits (``ps_evacuate``) while the scheduler moves its
blocks (``PlacementChanger.evacuate``), then drops its copies. Until then it
is a source; from then on it is gone like a dead worker, so that nothing
waits on it: issue 34 saw a placement change wait for ever on a retiree
whose teardown had given up (it was to be marked gone only after that very
change), and a block whose copies had gone with it not reported lost.
docs/reliability.rst ("Workers that leave gracefully").
"""

from __future__ import annotations

import asyncio
import logging

from dask_ps import _config
from dask_ps._liveness import RETIRE_MARGIN

logger = logging.getLogger(__name__)

# Stimulus prefixes of Dask's remove_worker when the worker died (its stream
# broke, a send failed, no heartbeat): no teardown will come (DASK_NOTES §4).
DIED = ("handle-worker-cleanup", "worker-send-comm-fail", "check-worker-ttl")


def retire_bound() -> float:
    """Longest the scheduler keeps a retiring worker's copies as sources
    (``ps.timeouts.failover``); its teardown waits ``RETIRE_MARGIN`` longer."""
    return _config.get_seconds("timeouts.failover")


class Retirements:
    """The scheduler plugin's retiring workers.

    ``retiring``: being retired, still serving (the set ``WorkerCalls`` and
    ``PlacementChanger`` read); ``evacuations``: the task moving each one's
    blocks; ``departed``: marked gone before Dask removed them. Calls the
    plugin's ``worker_gone`` (a worker left: mark it dead, repair),
    ``placement.evacuate`` and ``in_background``.
    """

    def __init__(self, plugin):
        self.plugin = plugin
        self.retiring: set[str] = set()
        self.evacuations: dict[str, asyncio.Task] = {}
        self.departed: set[str] = set()

    def __repr__(self):
        return f"<Retirements retiring={sorted(self.retiring)} departed={sorted(self.departed)}>"

    def status_changed(self, worker: str, status: str) -> None:
        """Dask's ``worker-status-change`` of a member: ``closing_gracefully``
        starts moving its blocks away while it still serves them."""
        if status == "closing_gracefully" and worker not in self.evacuations:
            self.retiring.add(worker)
            task = asyncio.ensure_future(self.plugin.placement.evacuate(worker))
            self.evacuations[worker] = task
            self.plugin.in_background(task)
        elif status == "running":
            self.retiring.discard(worker)

    def removed(self, worker: str, stimulus_id) -> bool:
        """Dask removed ``worker``; True when that is handled here (a retiree
        already gone, or one whose evacuation goes on), False when the
        plugin treats it as a worker that left."""
        if worker in self.departed:  # its teardown ended before Dask removed it
            self.departed.discard(worker)
            self.plugin.hung.forget(worker)
            return True
        evacuation = self.evacuations.get(worker)
        if (evacuation is None or evacuation.done() or self.plugin.scheduler.status.name != "running"
                or str(stimulus_id).startswith(DIED)):
            return False
        # retire_workers removes a worker as soon as it asked it to close; the
        # worker still serves while it hands its blocks over (its teardown
        # waits, ``wait_evacuated``). Let that finish, then repair what is
        # left; never past the teardown's own bound (its copies are dropped).
        self.plugin.in_background(self._after_evacuation(worker, evacuation, stimulus_id))
        return True

    async def _after_evacuation(self, worker, evacuation, stimulus_id) -> None:
        await asyncio.wait([evacuation], timeout=retire_bound() + RETIRE_MARGIN)
        self.left(worker, f"retired ({stimulus_id})")

    def left(self, worker: str, why: str) -> None:
        """A retiring worker stops serving (its teardown ended, its bound
        passed, or it stopped beating): from now on it is gone like a dead
        worker, so calls to it are cancelled and a placement change in
        progress stops counting on its copies (a block with no other copy
        is then reported lost, never waited for). Once per worker."""
        plugin = self.plugin
        if worker in plugin.liveness.dead and worker not in self.retiring:
            return
        if worker in plugin.scheduler.workers:  # Dask has not removed it yet: then a no-op
            self.departed.add(worker)
        plugin.worker_gone(worker, why)

    def forget(self, worker: str) -> None:
        """``worker`` is gone (``worker_gone``)."""
        self.retiring.discard(worker)
        self.evacuations.pop(worker, None)

    async def wait_evacuated(self, address: str) -> None:
        """The ``ps_evacuate`` handler's body: wait for ``address``'s
        evacuation, at most ``retire_bound()``, and mark it gone before
        answering (it drops its copies as soon as this returns)."""
        task = self.evacuations.get(address)
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), retire_bound())
        except asyncio.TimeoutError:
            logger.error("dask_ps: the evacuation of %s did not finish in %.0f s; it leaves now, and blocks "
                         "with no other copy are reported lost", address, retire_bound())
        except Exception as e:  # noqa: BLE001 - the evacuation's own error, logged there
            logger.warning("dask_ps: the evacuation of %s failed: %r", address, e)
        finally:
            if address in self.retiring:
                self.left(address, f"{address} retired")
