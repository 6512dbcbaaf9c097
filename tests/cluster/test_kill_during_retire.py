"""A worker killed while another retires (issue 34, case 1).

Each test runs its own cluster of 4 worker processes (``replication=2``,
12 blocks) and injects the kill at the evacuation's copy from the retiring
worker, through a hook on the scheduler plugin's calls, not after a sleep.
The placement change must finish, and a block is either intact or
reported lost (``DataLostError``), never silently gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps
from dask_ps._exceptions import DataLostError
from dask_ps._scheduler_plugin import PSSchedulerPlugin

N_ROWS, BLOCK_ROWS = 60, 5  # 12 blocks
PUSHES = 3
# The retiring worker's teardown waits this long (plus a margin) for its
# evacuation; the scheduler, this long. Short, so that a change that waits
# past it shows within the test's guard below.
FAILOVER = "8s"
GUARD = 150  # seconds: a change not finished by then is stuck (the old code waited for ever)


def _plugin(cluster) -> PSSchedulerPlugin:
    return next(p for p in cluster.scheduler.plugins.values() if isinstance(p, PSSchedulerPlugin))


def _mark_stale(table, block, worker, dask_scheduler=None):
    """As if ``worker``'s copy of ``block`` missed a forwarded push (what the
    runs that hung had: the retiring worker then is the block's only source
    and the killed one a copy target)."""
    dask_scheduler.extensions["ps"].tables[table].stale.setdefault(block, set()).add(worker)


def _within(fn, timeout):
    """``fn()`` in a thread; (finished, result or exception)."""
    box = {}

    def target():
        try:
            box["r"] = fn()
        except BaseException as e:  # noqa: BLE001 - returned
            box["r"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    return not th.is_alive(), box.get("r")


def _wait_for(flag, timeout=GUARD):
    deadline = time.monotonic() + timeout
    while not flag and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(flag)


def _setup(client, cluster):
    """A table with known values, the retiring worker and the victim: the
    two holders of block 0, whose victim copy is marked stale."""
    ps = dask_ps.ParameterServer(client)
    ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2,
                    init=np.arange(N_ROWS, dtype=float))
    for _ in range(PUSHES):
        ps.push("w", np.ones(N_ROWS))
    retiree, victim = _plugin(cluster).tables["w"].owners[0]
    client.run_on_scheduler(_mark_stale, "w", 0, victim)
    pid = client.run(os.getpid, workers=[victim])[victim]
    return ps, retiree, victim, pid


def _hook_copies(plugin, retiree, victim, pid, hold_until=None):
    """The evacuation's first copy from ``retiree`` to ``victim`` kills the
    victim (SIGKILL) as it is sent. ``hold_until`` (an async predicate):
    every copy from the retiree is held until it is true. Returns the list
    the hook appends to when it fired."""
    call = plugin.calls.call_once
    fired = []

    def hooked(worker, op, **msg):
        if op != "ps_copy_blocks" or worker != retiree:
            return call(worker, op, **msg)
        if not fired and victim in {dst for _, dst in msg.get("moves", ())}:
            fired.append(time.monotonic())
            os.kill(pid, signal.SIGKILL)
        if hold_until is None:
            return call(worker, op, **msg)

        async def held():
            while not hold_until():
                await asyncio.sleep(0.1)
            return await call(worker, op, **msg)

        return held()

    plugin.calls.call_once = hooked
    return fired


@pytest.mark.slow
def test_a_kill_at_the_evacuation_finishes_and_loses_nothing():
    """The retiring worker copies block 0 to the victim (its stale copy) when
    the victim is killed. Before, the retiring worker was not told that the
    victim left (it was no member any more), so its copy waited on a dead
    address holding its table lock, and the evacuation waited on it, and
    the retiring worker was marked gone only once its evacuation ended:
    ``wait_for_placement`` did not return (issue 34: over 6 minutes).
    Now it finishes and every copy holds every acknowledged push."""
    with dask.config.set({"ps.timeouts.failover": FAILOVER}):
        with LocalCluster(n_workers=4, threads_per_worker=1, dashboard_address=None) as c, Client(c) as client:
            ps, retiree, victim, pid = _setup(client, c)
            fired = _hook_copies(_plugin(c), retiree, victim, pid)
            retired, _ = _within(lambda: client.retire_workers([retiree]), GUARD)
            assert _wait_for(fired), "the evacuation made no copy from the retiring worker to the victim"
            settled, err = _within(ps.wait_for_placement, GUARD)
            assert retired and settled, "the placement change did not finish"
            assert err is None, err
            np.testing.assert_array_equal(ps.pull("w"), np.arange(N_ROWS) + PUSHES)
            owners = _plugin(c).tables["w"].owners
            assert all(retiree not in ws and victim not in ws and len(ws) == 2 for ws in owners), owners


@pytest.mark.slow
def test_copies_gone_with_the_retiring_worker_are_reported_lost():
    """Block 0's copies are on the retiring worker and the victim only; the
    victim is killed and every copy from the retiring worker is held until
    that worker has given up waiting and dropped its copies (its process
    ended). The block is truly gone: the placement change finishes and the
    table raises DataLostError naming block 0, never serves it silently
    without the acknowledged pushes. Before, the retiring worker counted as
    a live source until its evacuation ended, which waited on it."""
    with dask.config.set({"ps.timeouts.failover": FAILOVER}):
        with LocalCluster(n_workers=4, threads_per_worker=1, dashboard_address=None) as c, Client(c) as client:
            ps, retiree, victim, pid = _setup(client, c)
            rpid = client.run(os.getpid, workers=[retiree])[retiree]

            def retiree_exited():
                try:
                    os.kill(rpid, 0)
                except ProcessLookupError:
                    return True
                return False

            fired = _hook_copies(_plugin(c), retiree, victim, pid, hold_until=retiree_exited)
            retire = threading.Thread(target=client.retire_workers, args=([retiree],), daemon=True)
            retire.start()
            assert _wait_for(fired), "the evacuation made no copy from the retiring worker to the victim"
            settled, err = _within(ps.wait_for_placement, GUARD)
            assert settled, "the placement change did not finish"
            assert retiree_exited()
            with pytest.raises(DataLostError, match=r"block\(s\) \[0"):
                ps.pull("w")
            lost = _plugin(c).tables["w"].lost
            assert 0 in lost, lost
