"""A server that joins in the middle of a BSP run, and reads parked there.

The scheduler tells the workers of a new server in two announcements that
race: the run's record (its list of servers, which a participant reports
its clocks to) and the tables' new placement (which a participant routes
by). A participant whose worker had the placement first read the blocks
moved to the new server there, parked until every participant's clock
reached it, while nobody reported a clock there: every participant waited,
until ``ps.timeouts.clock`` (300 s; the LDA redo after a worker kill hung
once, the restarted worker joining mid-run). These tests build that order
on purpose: the original workers never take the record that names the new
server while the run goes on, and the rebalance onto it waits (its table
lock held) until the new server's clocks of the run are behind.

And a worker that dies as it joins: removed by Dask before the scheduler
handled its registration as a server, it must not become one.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from ps_fixtures import wait_until

import dask_ps
from tests.cluster.test_reliability import run_in_thread

SHAPE = (48, 2)
# The clock at which rank 0 first routed by the new placement, set by the
# participant (an in-process cluster: one interpreter) for the test's wait.
FIRST_ROUTED: dict[str, int] = {}


def _withhold_new_servers(dask_worker, known):
    """This worker keeps no run record that names a server outside
    ``known`` and no participant has left yet (the record that announced
    the new server, as if it came late); counts them in ``withheld``."""
    runs = dask_worker.extensions["ps"].runs
    original = runs.update
    runs.withheld = 0

    def update(msg):
        if set(msg.get("servers") or ()) - set(known) and not msg.get("done"):
            runs.withheld += 1
            return runs.records.get(msg.get("run_id"))
        return original(msg)

    runs.update = update


def _train_until_stopped(ctx, _, tables):
    """BSP reads and pushes of this rank's table until the one-element
    ``stop`` table (VAP: read at the servers) holds 1; returns the first
    clock at which it routed by a newer placement (None: never) and each
    read's sum."""
    table = tables[ctx.rank]
    seen, totals = None, []
    while ctx.pull("stop")[0] < 1:
        totals.append(float(ctx.pull(table).sum()))
        if seen is None and ctx._router.handles[table].version >= 2:
            seen = ctx.current_clock
            if ctx.rank == 0:
                FIRST_ROUTED[table] = seen
        ctx.push(table, np.ones(SHAPE))
        ctx.clock()
    return seen, totals


async def _hold(dask_scheduler, names):
    for name in names:
        await dask_scheduler.extensions["ps"].table_lock(name).acquire()


def _release(dask_scheduler, names):
    for name in names:
        dask_scheduler.extensions["ps"].table_lock(name).release()


def _moved(dask_scheduler, name, to):
    """Whether table ``name`` was rebalanced: ``to`` is a primary, the change ended."""
    t = dask_scheduler.extensions["ps"].tables[name]
    return t.changing_from is None and any(o[0] == to for o in t.owners)


def _clocks_at(client, worker):
    """``worker``'s run-wide clocks of the one run it knows (None: none yet)."""
    def clocks(dask_worker):
        records = list(dask_worker.extensions["ps"].runs.records.values())
        return list(records[0].clocks) if records else None

    return client.run(clocks, workers=[worker])[worker]


@pytest.mark.parametrize("case", [
    # Both read the table that moves, and the servers never ask each other
    # (clock-resync 0): the participants report to the servers they route
    # to, also before their worker's record lists them.
    "both-read-it",
    # Rank 1 reads only a table that stays where it was: it never routes to
    # the new server, so only the servers' resync brings its clocks there.
    "one-reads-it",
])
def test_reads_parked_at_a_server_that_joined_mid_run_are_answered(case):
    tables = ["moving", "moving"] if case == "both-read-it" else ["moving", "staying"]
    FIRST_ROUTED.clear()
    config = {"ps.timeouts.clock": "20s", "ps.timeouts.failover": "20s",
              "ps.timeouts.clock-resync": "0s" if case == "both-read-it" else "0.2s"}
    with dask.config.set(config), \
            LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        first = ps.wait_for_servers(2)
        ps.create_table("moving", shape=SHAPE, block_rows=4, consistency=dask_ps.BSP())
        ps.create_table("staying", shape=SHAPE, consistency=dask_ps.BSP())
        ps.create_table("stop", shape=(1,), consistency=dask_ps.VAP(1.0))
        client.run(_withhold_new_servers, known=first)
        # Only "moving" is rebalanced onto the new server (once released).
        client.run_on_scheduler(_hold, names=["moving", "staying", "stop"])
        thread, out = run_in_thread(ps, _train_until_stopped, range(2), tables=tables)
        try:
            wait_until(lambda: (_clocks_at(client, first[0]) or [0])[0] >= 2 or not thread.is_alive(), "clock 2")
            cluster.scale(3)
            (new,) = set(ps._servers(n=3, timeout=60)) - set(first)
            # The new server took its clocks of the run from a peer; the run goes on past them.
            adopted = min(wait_until(lambda: (c := _clocks_at(client, new)) and min(c) > 0 and c, "the adopt"))
            wait_until(lambda: min(_clocks_at(client, first[0])) >= adopted + 3 or not thread.is_alive(),
                       "three clocks more")
            client.run_on_scheduler(_release, names=["moving"])
            wait_until(lambda: client.run_on_scheduler(_moved, name="moving", to=new), "the rebalance")
            # Rank 0's worker may take the new placement clocks after the scheduler made it.
            routed = wait_until(lambda: FIRST_ROUTED.get("moving") or not thread.is_alive(), "rank 0 routes there")
            # Reads of the blocks on the new server were answered for 3 clocks: its clocks of both
            # participants passed them (the old code: parked until ps.timeouts.clock, then raised).
            wait_until(lambda: min(_clocks_at(client, new)) >= routed + 3 or not thread.is_alive(),
                       "the new server's clocks", timeout=60)
            assert thread.is_alive(), out
        finally:
            ps.push("stop", np.ones(1))
            client.run_on_scheduler(_release, names=["staying", "stop"])
            thread.join(120)
        if "error" in out:
            raise out["error"]
        withheld = client.run(lambda dask_worker: dask_worker.extensions["ps"].runs.withheld, workers=list(first))
        assert all(n >= 1 for n in withheld.values()), withheld  # the record naming it never came
        assert any(o.worker == new for o in ps.placement("moving"))
        (seen, totals), (_, other) = out["result"]
        assert seen == routed and len(totals) >= seen + 3  # rank 0 read the moved blocks there, 3 clocks
        writers, size = tables.count("moving"), SHAPE[0] * SHAPE[1]
        for c, total in enumerate(totals):  # BSP: every writer's pushes of the clocks before, and no more
            assert writers * size * c <= total <= size * (writers * c + writers - 1), (c, totals)
        assert ps.pull("moving").sum() == size * (len(totals) + (len(other) if writers == 2 else 0))


def _hold_next_registration(dask_scheduler):
    """The scheduler handles the next ``ps_register_server`` only once
    ``release`` is set (as if its message were read late); ``held`` gets
    its address, ``handled`` is set after it ran."""
    import asyncio

    plugin = dask_scheduler.extensions["ps"]
    original = dask_scheduler.handlers["ps_register_server"]
    plugin.release, plugin.handled, plugin.held = asyncio.Event(), asyncio.Event(), []

    async def late(**msg):
        first = not plugin.held
        if first:
            plugin.held.append(msg.get("address"))
            await plugin.release.wait()
        try:
            reply = original(**msg)
            return (await reply) if asyncio.iscoroutine(reply) else reply
        finally:
            if first:
                plugin.handled.set()

    dask_scheduler.handlers["ps_register_server"] = late


def _clock_until_stopped(ctx, _):
    """Clock pushes of ones (per-clock sums) until ``stop`` holds 1 (return
    the clocks) or 2 (rank 0 raises: the run is aborted)."""
    while (stop := ctx.pull("stop")[0]) < 1:
        ctx.push("t", np.ones(SHAPE))
        ctx.clock()
    if stop >= 2 and ctx.rank == 0:
        raise RuntimeError("rank 0 stops the run")
    return ctx.current_clock


@pytest.mark.parametrize("ending", [
    "abort",
    pytest.param("end", marks=pytest.mark.slow),  # the same fix, through the run's end (~5 s)
])
def test_a_worker_removed_before_its_registration_is_handled_is_no_server(ending):
    """A worker that dies as it starts (killed after Dask registered it,
    before the scheduler handled its ``ps_register_server``) is not taken
    as a shard server: Dask removes a worker once, so the old code kept it
    a member for good, and every run's start, abort and end, every
    broadcast and rebalance onto it waited on connects to its dead address
    (a run's end hung for minutes behind rebalances onto it). The run
    under way ends (aborted, or with exact per-clock sums), and no
    placement lists the dead address."""
    import contextlib
    import os
    import signal
    import subprocess

    from tests.cluster.test_deployment import dask_cli
    from tests.cluster.test_reliability import cluster

    with cluster(n=2) as lc, Client(lc) as client:
        ps = dask_ps.ParameterServer(client)
        first = ps.wait_for_servers(2)
        ps.create_table("t", shape=SHAPE, aggregate="clock", consistency=dask_ps.BSP())
        ps.create_table("stop", shape=(1,), consistency=dask_ps.VAP(1.0))
        client.run_on_scheduler(_hold_next_registration)
        thread, out = run_in_thread(ps, _clock_until_stopped, range(2))
        held = lambda: client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.extensions["ps"].held))
        worker = dask_cli("worker", lc.scheduler_address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                          log=subprocess.DEVNULL)
        try:
            wait_until(lambda: (_clocks_at(client, first[0]) or [0])[0] >= 2, "clock 2")
            (dead,) = wait_until(held, "the new worker's registration")
            pid = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers[dead].pid)
            os.kill(pid, signal.SIGKILL)
            worker.wait(60)
            wait_until(lambda: dead not in client.scheduler_info(n_workers=-1)["workers"], "Dask removes it")
            client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.extensions["ps"].release.set())
            wait_until(lambda: client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.extensions["ps"].handled.is_set()), "its registration")
            assert dead not in ps.servers
            assert (_clocks_at(client, first[0]) or [0])[0] >= 2 and thread.is_alive(), out
        finally:
            # (On the old code this push could wait on the dead address and fail: the assertion says why.)
            with contextlib.suppress(OSError):
                ps.push("stop", np.full(1, 2.0 if ending == "abort" else 1.0))
            thread.join(120)
            if worker.poll() is None:
                worker.kill()
        assert not thread.is_alive(), "the run did not end"
        if ending == "abort":
            assert isinstance(out.get("error"), RuntimeError), out
        else:
            if "error" in out:
                raise out["error"]
            clocks = out["result"]
            assert ps.pull("t").sum() == SHAPE[0] * SHAPE[1] * sum(clocks)
        assert dead not in ps.servers
        assert all(o.worker != dead for o in ps.placement("t"))
