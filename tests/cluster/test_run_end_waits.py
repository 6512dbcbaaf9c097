"""Whom a run's abort and end wait for, and until when.

A run with per-clock sums (``aggregate="clock"``) ends only once the
servers applied what it left (``Runs.end``): the scheduler's broadcast of
``ps_run_end`` has no time limit of its own, on purpose, since a holder that
is only slow must not be skipped (a read after the end would miss sums).
A holder that dies while the end waits for it stops holding it when Dask
removes it (``Liveness.mark_dead`` cancels the call), however long it
would have taken to answer; a killed one at once (its connections close).
A run's abort waits for every server likewise, at most ``ps.timeouts.rpc``. A worker that joins mid-run answers at once
(it holds nothing of the run). See docs/architecture.rst, "Runs".
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from distributed import Client
from ps_fixtures import wait_until

import dask_ps
from tests.cluster.test_reliability import cluster, run_in_thread

SHAPE = (6, 2)


def _clock_until_stopped(ctx, _):
    """Clock pushes of ones into ``t`` until ``stop`` holds 1; returns the clocks."""
    while ctx.pull("stop")[0] < 1:
        ctx.push("t", np.ones(SHAPE))
        ctx.clock()
    return ctx.current_clock


def _never_end(dask_worker):
    """This worker takes ``ps_run_end`` and never answers it (a holder whose
    answer does not come); ``ends`` counts them."""
    import asyncio

    plugin = dask_worker.extensions["ps"]
    plugin.ends = 0

    async def never(**msg):
        plugin.ends += 1
        await asyncio.Event().wait()

    dask_worker.handlers["ps_run_end"] = never


def _pushed_to_t(dask_scheduler):
    """Whether the run's participants use a table with per-clock sums (its
    end then waits for the servers: ``Runs.notify_at_end``)."""
    return any(run.notify for run in dask_scheduler.extensions["ps"].runs.values())


def _holders(dask_scheduler, name):
    return sorted(dask_scheduler.extensions["ps"].tables[name].listed())


async def _remove(dask_scheduler, address):
    """Dask removes ``address`` as its worker-ttl check does, its process and
    connections left as they are (a host cut off by the network)."""
    await dask_scheduler.remove_worker(address=address, stimulus_id="check-worker-ttl-test", close=False)


def _tables_and_a_victim(client):
    """The parameter server of a 3-worker cluster with a per-clock BSP table "t" and a "stop"
    flag (both with 2 copies), and the third server, on which ``ps.run`` places no participant
    (rank r goes to servers[r])."""
    ps = dask_ps.ParameterServer(client)
    victim = ps.wait_for_servers(3)[2]
    ps.create_table("t", shape=SHAPE, block_rows=1, aggregate="clock", consistency=dask_ps.BSP(), replication=2)
    ps.create_table("stop", shape=(1,), consistency=dask_ps.VAP(1.0), replication=2)
    return ps, victim


def _stop_until_the_victim_holds(client, ps, victim, participant, held):
    """A run of ``participant`` (two participants, in a thread) that pushed
    to ``t`` and was told to stop, once the victim has received the call it
    never answers (its plugin's count ``held``: ``ends`` or ``aborts``).
    Returns the thread, its output and a function of the scheduler's runs."""
    thread, out = run_in_thread(ps, participant, range(2))
    wait_until(lambda: client.run_on_scheduler(_pushed_to_t), "a participant's first push to t")
    ps.push("stop", np.ones(1))
    wait_until(lambda: client.run(lambda dask_worker: getattr(dask_worker.extensions["ps"], held),
                                  workers=[victim])[victim], f"the victim's {held}")
    return thread, out, lambda: client.run_on_scheduler(
        lambda dask_scheduler: sorted(dask_scheduler.extensions["ps"].runs))


def _leave(client, victim, how):
    """``victim`` leaves: killed (its connections close with it) or removed by Dask with its
    connection left open (as worker-ttl does: only Dask's membership can end a wait on it)."""
    if how == "killed":
        os.kill(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers[victim].pid), signal.SIGKILL)
    else:
        client.run_on_scheduler(_remove, address=victim)


@pytest.mark.parametrize("how", [
    # Its connections close with it: the call fails at once (a 3-worker cluster, ~4 s: -m slow).
    pytest.param("killed", marks=pytest.mark.slow),
    "removed",
])
def test_a_holder_that_leaves_during_a_runs_end_stops_holding_it(how):
    with cluster(n=3) as lc, Client(lc) as client:
        ps, victim = _tables_and_a_victim(client)
        assert victim in client.run_on_scheduler(_holders, name="t")
        client.run(_never_end, workers=[victim])
        # The end is under way (the scheduler forgot the run) and waits for the victim's answer.
        thread, out, runs = _stop_until_the_victim_holds(client, ps, victim, _clock_until_stopped, "ends")
        assert not runs() and thread.is_alive(), out
        _leave(client, victim, how)
        thread.join(120)
        assert not thread.is_alive(), "the run's end still waits for a worker Dask removed"
        if "error" in out:
            raise out["error"]
        client.sync(ps._scheduler.ps_placement_settled)
        assert ps.pull("t").sum() == SHAPE[0] * SHAPE[1] * sum(out["result"])  # the survivors applied theirs


def _never_take_aborts(dask_worker):
    """This worker never answers a run record that says the run was aborted
    (``ps_run_update``); ``aborts`` counts them."""
    import asyncio

    plugin = dask_worker.extensions["ps"]
    plugin.aborts = 0
    original = dask_worker.handlers["ps_run_update"]

    async def update(**msg):
        if (msg.get("record") or {}).get("aborted"):
            plugin.aborts += 1
            await asyncio.Event().wait()
        return original(**msg)

    dask_worker.handlers["ps_run_update"] = update


def _raise_when_stopped(ctx, _):
    """Clock until ``stop`` holds 1, then rank 0 raises (the run is aborted)."""
    _clock_until_stopped(ctx, _)
    if ctx.rank == 0:
        raise RuntimeError("rank 0 stops the run")
    return ctx.current_clock


@pytest.mark.parametrize("how", [
    # Its connections close with it: the call fails at once (a 3-worker cluster, ~4 s: -m slow).
    pytest.param("killed", marks=pytest.mark.slow),
    "removed",
])
def test_a_server_that_leaves_during_a_runs_abort_stops_holding_it(how):
    """The abort (``ps_run_abort``) waits for every server's answer, at
    most ``ps.timeouts.rpc``: one that leaves the cluster meanwhile stops
    holding it at once (here ``ps.timeouts.rpc`` is 10 minutes, past the
    test's own limit)."""
    import dask

    with dask.config.set({"ps.timeouts.rpc": "600s"}), cluster(n=3) as lc, Client(lc) as client:
        ps, victim = _tables_and_a_victim(client)
        client.run(_never_take_aborts, workers=[victim])
        thread, out, runs = _stop_until_the_victim_holds(client, ps, victim, _raise_when_stopped, "aborts")
        assert runs() and thread.is_alive()  # the abort waits for the victim's answer
        _leave(client, victim, how)
        thread.join(120)
        assert not thread.is_alive(), "the run's abort still waits for a worker Dask removed"
        assert isinstance(out.get("error"), RuntimeError), out
        assert not runs()
