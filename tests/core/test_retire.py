"""``_retire.Retirements`` without a cluster: a retiring worker is marked
gone when its teardown's wait ends or its bound passes, never only after
its evacuation, which may be waiting on it (issue 34: a placement change
waited for ever on a retiree whose teardown had given up)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import dask
import pytest

from dask_ps._liveness import Liveness, WorkerGone
from dask_ps._retire import Retirements

R, V = "tcp://retiree:1", "tcp://victim:2"


class FakePlugin:
    """What ``Retirements`` uses of the scheduler plugin. The evacuation
    waits on a call to the retiree that is never answered (its process
    ended after its teardown gave up), through ``Liveness`` as the real one."""

    def __init__(self):
        self.liveness = Liveness()
        self.scheduler = SimpleNamespace(workers={}, status=SimpleNamespace(name="running"))
        self.hung = SimpleNamespace(forget=lambda w: None)
        self.gone: list[tuple[str, str]] = []
        self.tasks: list[asyncio.Task] = []
        self.evacuation_error = None
        self.placement = SimpleNamespace(evacuate=self._evacuate)
        self.retire = Retirements(self)

    async def _evacuate(self, worker):
        try:
            await self.liveness.call(worker, lambda: asyncio.sleep(3600))
        except WorkerGone as e:  # the change then fails over or reports the block lost
            self.evacuation_error = e

    def worker_gone(self, worker, why):
        self.gone.append((worker, why))
        self.liveness.mark_dead(worker)
        self.retire.forget(worker)

    def in_background(self, coro):
        self.tasks.append(asyncio.ensure_future(coro))


@pytest.mark.parametrize("teardown_calls", [True, False])
def test_a_retiree_is_gone_at_its_bound_and_the_evacuation_stops_waiting_on_it(teardown_calls):
    """Dask removed the retiree (retire stimulus) while its evacuation waits
    on a call to it. Its teardown's ``ps_evacuate`` (or, when that never
    comes, the fallback after the bound and the margin) marks it gone: the
    call fails with ``WorkerGone`` and the evacuation ends. Before, the
    retiree was marked gone only after its evacuation had ended."""
    async def main():
        p = FakePlugin()
        p.retire.status_changed(R, "closing_gracefully")
        await asyncio.sleep(0)
        assert p.retire.removed(R, "retire-workers-1.0")  # deferred: it still serves
        assert p.gone == []
        if teardown_calls:
            await asyncio.wait_for(p.retire.wait_evacuated(R), 5)
            assert [w for w, _ in p.gone] == [R]  # before the handler answered
        await asyncio.wait_for(asyncio.gather(*p.tasks), 5)
        assert [w for w, _ in p.gone] == [R]  # once
        assert isinstance(p.evacuation_error, WorkerGone)
        assert R not in p.retire.retiring and R not in p.retire.evacuations

    with dask.config.set({"ps.timeouts.failover": "0.3s"}), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr("dask_ps._retire.RETIRE_MARGIN", 0.2)
        asyncio.run(main())


def test_a_retiree_that_died_is_gone_at_once():
    """A stream that broke (``handle-worker-cleanup``): no teardown will come."""
    async def main():
        p = FakePlugin()
        p.retire.status_changed(R, "closing_gracefully")
        await asyncio.sleep(0)
        assert not p.retire.removed(R, "handle-worker-cleanup-1.0")  # the plugin's worker_gone, at once
        assert not p.retire.removed(V, "retire-workers-1.0")  # not retiring: a worker that left
        for t in p.tasks:
            t.cancel()
        await asyncio.gather(*p.tasks, return_exceptions=True)

    asyncio.run(main())


def test_a_teardown_before_dask_removed_the_worker_makes_its_removal_a_no_op():
    async def main():
        p = FakePlugin()
        p.scheduler.workers[R] = object()
        p.retire.status_changed(R, "closing_gracefully")
        with dask.config.set({"ps.timeouts.failover": "0.1s"}):
            await asyncio.wait_for(p.retire.wait_evacuated(R), 5)
        assert [w for w, _ in p.gone] == [R] and R in p.retire.departed
        del p.scheduler.workers[R]
        assert p.retire.removed(R, "retire-workers-1.0")  # handled: not gone twice
        assert [w for w, _ in p.gone] == [R] and not p.retire.departed
        await asyncio.gather(*p.tasks)

    asyncio.run(main())


@pytest.mark.parametrize("numbered", [True, False])
def test_a_forward_whose_connection_dask_closed_is_sent_again_if_numbered(numbered):
    """Dask closes every pooled connection to a worker it removes, also to a
    retiring one that still serves ("Address removed."): a numbered forward
    is sent again on a new connection (the replica applies it once), so the
    retiring copy is not fenced for nothing (issue 34: a kill of the primary
    then lost the block). An unnumbered one could be applied twice: it
    fails as before."""
    from distributed.comm import CommClosedError

    from dask_ps._worker_plugin import PSWorkerPlugin

    plugin = PSWorkerPlugin()
    sent = []

    async def forward():
        sent.append(1)
        if len(sent) == 1:
            raise CommClosedError("Address removed.")
        return "applied"

    async def main():
        return await plugin.replicator.call_replica(R, numbered, forward)

    if numbered:
        assert asyncio.run(main()) == "applied" and len(sent) == 2
    else:
        with pytest.raises(CommClosedError):
            asyncio.run(main())
        assert len(sent) == 1
