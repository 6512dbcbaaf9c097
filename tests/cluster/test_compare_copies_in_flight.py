"""The comparison of a table's copies at a run's end, while a push is
between a block's primary and its replica.

An aborted run's participants go on until their next clock: a push of
theirs may be applied at a block's primary and on its way to the replica
when the scheduler compares the copies' update counts (``Block.seq``). The
comparison asked three times over 0.6 s and counted such a replica as a
copy that missed updates (``copies_disagree`` in the run's metrics, an
error in the scheduler's log, the copy fenced and made again) when the
forward took longer (a loaded machine, a replica busy). A past experiment
reported ``copies_disagree`` after a worker was killed, restarted by its
nanny, and the run aborted; that did not reproduce (42 runs on a
LocalCluster of 3 worker processes: kill then abort, abort then kill,
kill without abort), and this is the mechanism found by reading that
fits it. This
test builds that order on purpose: the replica holds the forward until
the comparison has read it three times (the old comparison flagged it),
or until the comparison waits for the primary's pushes to reach the
replicas (what it does now: ``drained``).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from ps_fixtures import replicated_pair

from dask_ps._worker_plugin import _IN_PROCESS

N_ROWS = 8
# Shared with the hooks and the participants (an in-process cluster: one interpreter).
STATE: dict = {}


def _hold_first_forward(replica: str, primary: str) -> None:
    """``replica`` keeps the first push forwarded to it waiting, before it
    applies it, until the scheduler has read its update counts three times
    (every attempt of the old comparison) or something waits for the
    primary's table lock (which the primary holds while it forwards)."""
    plugin, primary_plugin = _IN_PROCESS[replica], _IN_PROCESS[primary]
    push, seqs = plugin._push, plugin.worker.handlers["ps_block_seqs"]
    STATE.update(held=False, reads=0, released_by=None)

    async def held_push(*args, **kwargs):
        if args[9] and not STATE["held"]:  # replica=True: forwarded by the primary
            STATE["held"] = True
            lock = primary_plugin._locks["w"]
            deadline = time.monotonic() + 60  # a bound on a wait, not a timing assertion
            while STATE["reads"] < 3 and not getattr(lock, "_waiters", None) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            STATE["released_by"] = "three reads" if STATE["reads"] >= 3 else "a wait for the lock"
        return await push(*args, **kwargs)

    async def counted_seqs(**msg):
        out = seqs(**msg)
        out = (await out) if asyncio.iscoroutine(out) else out
        if STATE["held"]:
            STATE["reads"] += 1
        return out

    plugin._push = held_push
    plugin.worker.handlers["ps_block_seqs"] = counted_seqs


def _one_push_then_abort(ctx, _):
    if ctx.rank == 1:
        ctx.push("w", np.ones(N_ROWS))
        ctx.flush()  # waits for the forward to the replica
        ctx.clock()
        return ctx.current_clock
    deadline = time.monotonic() + 60
    while not STATE.get("held") and time.monotonic() < deadline:
        time.sleep(0.01)
    raise RuntimeError("rank 0 stops the run")


def test_a_push_between_primary_and_replica_at_an_aborted_runs_end_is_not_a_missed_update():
    with replicated_pair(N_ROWS) as (ps, primary, replica):
        _hold_first_forward(replica, primary)
        with pytest.raises(RuntimeError, match="rank 0 stops the run"):
            ps.run(_one_push_then_abort, range(2))
        assert STATE["held"]
        (metrics,) = ps.metrics().values()
        assert not metrics["copies_disagree"], (metrics["copies_disagree"], STATE["released_by"])
        ps.wait_for_placement()
        # The push reached both copies (applied once each), which were never fenced.
        for w in (primary, replica):
            t = _IN_PROCESS[w].store.tables["w"]
            assert t.blocks[0].seq == 1 and not t.missed, w
            np.testing.assert_array_equal(t.blocks[0].data, np.ones(N_ROWS))
        assert [list(o) for o in ps._handle("w").owners] == [[primary, replica]]
