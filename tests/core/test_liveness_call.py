"""``Liveness.call`` without a cluster: a call runs in its caller's task (no
task of its own: a task and two turns of the event loop less on every push
and pull), a worker that dies mid-call fails the call with ``WorkerGone``
and leaves the caller's task usable, and a cancellation of the caller from
elsewhere still cancels it."""

from __future__ import annotations

import asyncio

import pytest

from dask_ps._liveness import Liveness, WorkerGone


def _unanswered(started: asyncio.Event):
    """A call to a worker that does not answer; sets ``started`` once sent."""
    async def call():
        started.set()
        await asyncio.sleep(60)

    return call


def test_the_call_runs_in_the_callers_task():
    async def main():
        live = Liveness()
        caller = asyncio.current_task()
        n_tasks = len(asyncio.all_tasks())

        async def call():
            await asyncio.sleep(0)
            return asyncio.current_task(), len(asyncio.all_tasks())

        task, during = await live.call("tcp://a:1", call)
        assert task is caller and during == n_tasks
        assert not live._inflight and not live._cancelled

    asyncio.run(main())


def test_a_worker_that_dies_mid_call_fails_it_and_the_caller_goes_on():
    async def main():
        live = Liveness()
        started = asyncio.Event()
        call = _unanswered(started)

        async def caller():
            with pytest.raises(WorkerGone, match="during the call"):
                await live.call("tcp://a:1", call)
            assert asyncio.current_task().cancelling() == 0
            await asyncio.sleep(0)  # not cancelled: the task goes on
            with pytest.raises(WorkerGone, match="has left"):
                await live.call("tcp://a:1", call)  # refused at once now
            return "done"

        task = asyncio.ensure_future(caller())
        await started.wait()
        live.mark_dead("tcp://b:2")  # another worker: nothing happens
        await asyncio.sleep(0)
        assert not task.done()
        live.mark_dead("tcp://a:1")
        assert await asyncio.wait_for(task, 5) == "done"
        assert not live._inflight and not live._cancelled

    asyncio.run(main())


def test_calls_to_a_dead_worker_from_several_tasks_all_fail_over():
    async def main():
        live = Liveness()
        started = asyncio.Semaphore(0)

        async def call():
            started.release()
            await asyncio.sleep(60)

        async def one():
            try:
                await live.call("tcp://a:1", call)
            except WorkerGone:
                return "gone"

        results = asyncio.gather(*(one() for _ in range(3)))
        for _ in range(3):
            await started.acquire()
        live.mark_dead("tcp://a:1")
        assert await asyncio.wait_for(results, 5) == ["gone"] * 3

    asyncio.run(main())


@pytest.mark.parametrize("worker_dies_too", [False, True])
def test_a_cancellation_from_elsewhere_still_cancels_the_caller(worker_dies_too):
    async def main():
        live = Liveness()
        started = asyncio.Event()
        call = _unanswered(started)

        task = asyncio.ensure_future(live.call("tcp://a:1", call))
        await started.wait()
        task.cancel()
        if worker_dies_too:
            live.mark_dead("tcp://a:1")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert not live._inflight and not live._cancelled

    asyncio.run(main())


def test_a_call_that_swallows_the_cancellation_leaves_the_task_uncancelled():
    async def main():
        live = Liveness()
        started = asyncio.Event()

        async def call():
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                return "swallowed"

        async def caller():
            result = await live.call("tcp://a:1", call)
            return result, asyncio.current_task().cancelling()

        task = asyncio.ensure_future(caller())
        await started.wait()
        live.mark_dead("tcp://a:1")
        assert await asyncio.wait_for(task, 5) == ("swallowed", 0)
        assert not live._cancelled

    asyncio.run(main())


def test_a_worker_the_call_involves_that_dies_fails_it():
    """A copy from a retiring worker to a target: the scheduler hears that
    the target died, the source may not (issue 34: the copy then waited on
    a dead address and with it the placement change); the call fails with
    ``WorkerGone`` naming the target, and nothing stays registered."""
    async def main():
        live = Liveness()
        started = asyncio.Event()
        call = _unanswered(started)

        async def caller():
            with pytest.raises(WorkerGone, match="tcp://t:2 left"):
                await live.call("tcp://src:1", call, involves=("tcp://t:2",))
            with pytest.raises(WorkerGone, match="tcp://t:2 has left"):
                await live.call("tcp://src:1", call, involves=("tcp://t:2",))  # refused at once now
            return "done"

        task = asyncio.ensure_future(caller())
        await started.wait()
        live.mark_dead("tcp://t:2")
        assert await asyncio.wait_for(task, 5) == "done"
        assert not live._inflight and not live._cancelled

    asyncio.run(main())
