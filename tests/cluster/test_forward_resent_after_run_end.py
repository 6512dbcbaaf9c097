"""A push forwarded to a replica, sent again after the run ended there.

A primary forwards a participant's push to the block's replica and, when
the connection closes under the call, sends it again on a new one
(``Replicator.call_replica``): the replica's exactly-once window of that
participant (``Block.applied``) makes the second copy a no-op. But a
run's end frees its participants' windows on every worker
(``ShardStore.forget_run``), and a forwarded push skipped the check that
its run is still active (the primary made it): when the replica applied
the first copy, its reply was lost, and the run's end reached the replica
before the copy sent again, the replica applied the push twice. Its copy
then held another value than its primary's, and reads may go to replicas.
The run-end comparison of the copies' update counts did not see it either
(the replica's count was read before the second copy landed).

An aborted run's participants go on until their next clock, so a push of
theirs may be between its primary and a replica when the run ends. This
test builds that order on purpose: the replica applies the first copy,
waits until the run's end reached it, then fails the call as a closed
connection would.

The same holds at a block's primary: a push sent again (its sender's call
timed out while the first copy was being forwarded) passed the check that
its run is active, then waited for the table's lock; when the run's end
came in between, the primary applied it twice (and forwarded it, so both
copies agreed on the wrong value). The second test builds that order.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from ps_fixtures import replicated_pair
from distributed.comm import CommClosedError

from dask_ps._worker_plugin import _IN_PROCESS

N_ROWS = 8
# Shared with the hooks and the participants (an in-process cluster: one interpreter).
STATE: dict = {}


def _lose_first_forward_reply(replica: str) -> None:
    """``replica`` applies the first push forwarded to it, waits until the
    run's end has reached it, and then fails the call as a closed
    connection (its primary sends the push again); later forwards as they
    are, counted in ``STATE["forwards"]``; ``STATE["again"]``: what the
    copy sent again came to ("applied" or the error it raised)."""
    plugin = _IN_PROCESS[replica]
    push = plugin._push
    STATE.update(applied=False, forwards=0, ended_first=None, again=None)

    async def lossy_push(*args, **kwargs):
        if not args[9]:  # replica=False: not a forward
            return await push(*args, **kwargs)
        STATE["forwards"] += 1
        if STATE["applied"]:
            try:
                out = await push(*args, **kwargs)
            except Exception as e:
                STATE["again"] = repr(e)
                raise
            STATE["again"] = "applied"
            return out
        await push(*args, **kwargs)
        STATE["applied"] = True
        run_id = args[6][0]
        deadline = time.monotonic() + 60  # a bound on a wait, not a timing assertion
        while run_id not in plugin.run_manager.ended and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        STATE["ended_first"] = run_id in plugin.run_manager.ended
        raise CommClosedError("the reply of a forwarded push was lost (test hook)")

    plugin._push = lossy_push


def _one_push_then_abort(ctx, _):
    if ctx.rank == 1:
        ctx.push("w", np.ones(N_ROWS))
        ctx.flush()  # waits for the forward to the replica
        ctx.clock()
        return ctx.current_clock
    deadline = time.monotonic() + 60
    while not STATE.get("applied") and time.monotonic() < deadline:
        time.sleep(0.01)
    raise RuntimeError("rank 0 stops the run")


def test_a_forward_sent_again_after_the_run_ended_at_the_replica_is_not_applied_twice():
    with replicated_pair(N_ROWS) as (ps, primary, replica):
        _lose_first_forward_reply(replica)
        with pytest.raises(RuntimeError, match="rank 0 stops the run"):
            ps.run(_one_push_then_abort, range(2))
        assert STATE["applied"] and STATE["ended_first"], STATE
        deadline = time.monotonic() + 60
        while STATE["forwards"] < 2 and time.monotonic() < deadline:  # the copy sent again
            time.sleep(0.01)
        assert STATE["forwards"] == 2, STATE
        while STATE["again"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert STATE["again"] != "applied", STATE
        ps.wait_for_placement()
        # Both copies hold the push once: the replica either dropped the
        # second copy or was fenced and copied again from its primary.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            blocks = {w: _IN_PROCESS[w].store.tables["w"].blocks.get(0) for w in (primary, replica)}
            if all(b is not None and not _IN_PROCESS[w].store.tables["w"].missed for w, b in blocks.items()):
                break
            time.sleep(0.05)
        for w, blk in blocks.items():
            np.testing.assert_array_equal(blk.data, np.ones(N_ROWS), err_msg=w)
            assert blk.seq == 1, (w, blk.seq)
        np.testing.assert_array_equal(ps.pull("w"), np.ones(N_ROWS))


def _resend_waiting_for_the_lock(primary: str):
    """Called in the participant's thread after its push was applied: on
    ``primary``'s loop, hold the table's lock, send the participant's push
    again (as its session would after a timeout) until it waits for that
    lock, and release the lock once the run's end reached ``primary``;
    what the copy sent again came to goes to ``STATE["again"]``."""
    plugin = _IN_PROCESS[primary]
    args, kwargs = STATE["first"]
    run_id = args[6][0]

    async def release_after_end(lock, task):
        deadline = time.monotonic() + 60  # a bound on a wait, not a timing assertion
        while run_id not in plugin.run_manager.ended and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        STATE["ended_first"] = run_id in plugin.run_manager.ended
        lock.release()
        try:
            await task
            STATE["again"] = "applied"
        except Exception as e:  # noqa: BLE001 - what it came to is the test's finding
            STATE["again"] = repr(e)

    async def stage():
        lock = plugin._locks["w"]
        await lock.acquire()
        task = asyncio.ensure_future(plugin._push(*args, **kwargs))
        deadline = time.monotonic() + 60
        while not getattr(lock, "_waiters", None) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        STATE["waiting"] = bool(getattr(lock, "_waiters", None))
        STATE["release"] = asyncio.ensure_future(release_after_end(lock, task))

    asyncio.run_coroutine_threadsafe(stage(), plugin.worker.loop.asyncio_loop).result(60)


def _push_then_resend(ctx, _, primary):
    ctx.push("w", np.ones(N_ROWS))
    ctx.flush()
    _resend_waiting_for_the_lock(primary)
    return ctx.current_clock


def test_a_push_sent_again_that_waited_for_the_lock_across_the_runs_end_is_not_applied_twice():
    with replicated_pair(N_ROWS) as (ps, primary, replica):
        plugin = _IN_PROCESS[primary]
        push = plugin._push
        STATE.clear()
        STATE.update(again=None)

        async def recorded_push(*args, **kwargs):  # the participant's push, to send it again
            if not args[9] and args[6] is not None and "first" not in STATE:
                STATE["first"] = (args, kwargs)
            return await push(*args, **kwargs)

        plugin._push = recorded_push
        ps.run(_push_then_resend, range(1), primary=primary)
        assert STATE["waiting"], STATE
        deadline = time.monotonic() + 60
        while STATE["again"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert STATE["ended_first"] and STATE["again"] != "applied", STATE
        ps.wait_for_placement()
        for w in (primary, replica):
            blk = _IN_PROCESS[w].store.tables["w"].blocks[0]
            np.testing.assert_array_equal(blk.data, np.ones(N_ROWS), err_msg=w)
            assert blk.seq == 1, (w, blk.seq)
