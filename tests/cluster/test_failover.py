"""Failures that used to give a wrong answer without saying so (issue 14):
a table rolled back to its checkpoint during a run, a shard host that hangs
(SIGSTOP) instead of dying. Each test runs its own cluster."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps
from dask_ps import RolledBackError

N_ROWS, BLOCK_ROWS = 60, 10


def cluster(n=3, **kw):
    kw.setdefault("threads_per_worker", 1)
    return LocalCluster(n_workers=n, dashboard_address=None, **kw)


def wait_for_clock(ps, clock, timeout=120):
    deadline = time.monotonic() + timeout  # a wait loop, not a timing assertion
    while time.monotonic() < deadline:
        runs = ps.client.run_on_scheduler(
            lambda dask_scheduler: [list(r.clocks) for r in dask_scheduler.extensions["ps"].runs.values()]
        )
        if runs and min(runs[0]) >= clock:
            return
        time.sleep(0.05)
    raise TimeoutError(f"run did not reach clock {clock}")


def ones_pusher(ctx, _, clocks, delay):
    """Push ones into the whole table once per clock."""
    for _clock in range(ctx.current_clock, clocks):  # a retried task resumes here
        ctx.push("t", np.ones(N_ROWS))
        time.sleep(delay)
        ctx.clock()
    return ctx.current_clock


def test_run_raises_when_a_table_it_used_was_rolled_back_to_its_checkpoint(tmp_path):
    """replication=1 with a checkpoint: a shard host killed mid-run has its
    blocks restored from the checkpoint, so the run's acknowledged pushes to
    them are gone. ``ps.run`` must say so: it raises RolledBackError naming
    the table, the blocks and the clocks, carrying the results; the run's
    metrics and ``ps.rollbacks()`` record it too.

    Before the fix (checked by running this test on the previous commit) the
    run returned ``[12, 12]`` as if nothing had happened, and only a
    scheduler log WARNING said that updates were lost."""
    with cluster(3) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("t", shape=(N_ROWS,), block_rows=BLOCK_ROWS, init=1.0)
        path = str(tmp_path / "ckpt")
        ps.save(path)
        servers = ps.servers
        # Participants run on servers[0] and servers[1]; the victim only hosts blocks.
        victim = servers[2]
        victim_blocks = sorted(p.block for p in ps.placement("t") if p.worker == victim)
        assert victim_blocks
        pid = client.run(os.getpid, workers=[victim])[victim]
        result = {}

        def run():
            try:
                result["value"] = ps.run(ones_pusher, range(2), clocks=12, delay=0.1)
            except BaseException as e:  # noqa: BLE001 - checked below
                result["error"] = e

        runner = threading.Thread(target=run)
        runner.start()
        wait_for_clock(ps, 4)
        os.kill(pid, signal.SIGKILL)
        runner.join(timeout=300)
        assert not runner.is_alive()
        err = result.get("error")
        assert isinstance(err, RolledBackError), result
        assert err.table == "t" and err.results == [12, 12]
        [record] = err.rollbacks
        assert record["table"] == "t" and record["blocks"] == victim_blocks
        assert record["checkpoint"] == path
        assert min(record["clocks"]) >= 4  # the run's progress that was rolled back
        assert "'t'" in str(err) and str(victim_blocks) in str(err) and "checkpoint" in str(err)
        metrics = ps.metrics()[err.run_id]
        assert metrics["rolled_back"] == err.rollbacks
        assert [r["blocks"] for r in ps.rollbacks("t")] == [victim_blocks]
        # The restored blocks hold the checkpoint's values (1 + the pushes
        # made after the restore), the others every push (1 + 2 * 12).
        values = ps.pull("t")
        for p in ps.placement("t"):
            if p.block in victim_blocks:
                assert (values[p.start:p.stop] < 25).all()
            else:
                assert (values[p.start:p.stop] == 25).all()


def test_rollback_outside_a_run_is_listed_and_later_runs_do_not_raise(tmp_path):
    """A restore while no run is active is listed by ``ps.rollbacks()``; a
    run that starts after it lost nothing and returns normally."""
    with cluster(3) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("t", shape=(N_ROWS,), block_rows=BLOCK_ROWS, init=1.0)
        ps.save(str(tmp_path / "ckpt"))
        ps.push("t", np.ones(N_ROWS))  # acknowledged, then lost on the victim's blocks
        victim = ps.placement("t")[0].worker
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not ps.rollbacks("t") and time.monotonic() < deadline:
            time.sleep(0.1)
        ps.wait_for_placement()
        [record] = ps.rollbacks()
        assert record["table"] == "t" and record["blocks"] == sorted(record["blocks"])
        assert ps.run(ones_pusher, range(2), clocks=2, delay=0) == [2, 2]
