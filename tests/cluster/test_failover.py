"""Failures that used to give a wrong answer without saying so (issue 14):
a table rolled back to its checkpoint during a run, a shard host that hangs
(SIGSTOP) instead of dying. Each test runs its own cluster."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps
from dask_ps import RolledBackError

N_ROWS, BLOCK_ROWS, WIDTH = 60, 10, 3


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


def ones_pusher(ctx, _, clocks, delay, hold_at=None, hold_file=None):
    """Push ones into the whole table once per clock; with ``hold_file``,
    wait at clock ``hold_at`` until that file exists (the test acted)."""
    for clock in range(ctx.current_clock, clocks):  # a retried task resumes here
        if hold_file is not None and clock == hold_at:
            deadline = time.monotonic() + 120  # a bound on a wait, not a timing assertion
            while not os.path.exists(hold_file) and time.monotonic() < deadline:
                time.sleep(0.01)
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
        result, killed = {}, str(tmp_path / "killed")

        def run():
            try:
                # Held at clock 5 until the kill: the run pushes to the killed blocks after it
                # (under load it could end first, and a restore after a run's end is not its rollback).
                result["value"] = ps.run(ones_pusher, range(2), clocks=12, delay=0.1, hold_at=5, hold_file=killed)
            except BaseException as e:  # noqa: BLE001 - checked below
                result["error"] = e

        runner = threading.Thread(target=run)
        runner.start()
        wait_for_clock(ps, 4)
        os.kill(pid, signal.SIGKILL)
        pathlib.Path(killed).touch()
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


@pytest.mark.parametrize("op", ["push_rows", "pull"])
def test_a_client_call_after_a_rollback_raises_once(tmp_path, op):
    """Issue 22: a client's ``push_rows`` rolled back to the checkpoint
    (``replication=1``, outside ``ps.run``) was silent to the caller. Now
    its next call on the table raises ``RolledBackError`` once, naming the
    restored blocks, and does nothing; the call after proceeds."""
    with cluster(3) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("t", shape=(N_ROWS,), block_rows=BLOCK_ROWS, init=1.0)
        ps.create_table("other", shape=(4,))
        path = str(tmp_path / "ckpt")
        ps.save(path)
        ps.push_rows("t", np.arange(N_ROWS), np.ones(N_ROWS))  # acknowledged, then lost on the victim's blocks
        victim = ps.placement("t")[0].worker
        victim_blocks = sorted(p.block for p in ps.placement("t") if p.worker == victim)
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        deadline = time.monotonic() + 60  # a wait loop, not a timing assertion
        while not ps.rollbacks("t") and time.monotonic() < deadline:
            time.sleep(0.1)
        ps.wait_for_placement()
        ps.push("other", np.ones(4))  # another table: nothing to report
        with pytest.raises(RolledBackError, match="'t'.*rolled back") as err:
            if op == "push_rows":
                ps.push_rows("t", [0], [100.0])
            else:
                ps.pull("t")
        assert err.value.table == "t"
        [record] = err.value.rollbacks
        assert record["blocks"] == victim_blocks and record["checkpoint"] == path
        values = ps.pull("t")  # raised once: this proceeds, and the raising call did nothing
        for p in ps.placement("t"):
            assert (values[p.start:p.stop] == (1.0 if p.block in victim_blocks else 2.0)).all(), values
        ps.push_rows("t", [0], [1.0])
        assert ps.pull_rows("t", [0])[0] == values[0] + 1.0


def workload(rank, clock):
    """One participant's pushes at one clock: integer-valued, duplicate rows included."""
    rng = np.random.default_rng(1000 * rank + clock)
    rows = rng.integers(0, N_ROWS, size=12)
    return rows, rng.integers(-3, 4, size=(12, WIDTH)).astype("float64")


def expected_sum(n, clocks):
    out = np.zeros((N_ROWS, WIDTH))
    for r in range(n):
        for c in range(clocks):
            rows, vals = workload(r, c)
            np.add.at(out, rows, vals)
    return out


def reading_pusher(ctx, _, clocks, delay, table="t"):
    """Push, flush, read the whole table (every copy serves reads), clock."""
    for clock in range(ctx.current_clock, clocks):
        rows, vals = workload(ctx.rank, clock)
        ctx.push_rows(table, rows, vals)
        ctx.flush()
        ctx.pull(table)
        time.sleep(delay)
        ctx.clock()
    return ctx.current_clock


def held_copies(client, table):
    """Every worker's copy of every block of ``table`` it holds."""
    def get(dask_worker):
        t = dask_worker.extensions["ps"].store.tables.get(table)
        return {} if t is None else {b: blk.data.copy() for b, blk in t.blocks.items()}
    return client.run(get)


def test_a_hung_shard_host_is_fenced_out_and_the_run_goes_on():
    """replication=2 on 3 workers: SIGSTOP of a shard host (primary of some
    blocks, replica of others; no participant) in the middle of a run. The
    scheduler sees its heartbeats stop and fences it out after
    ``ps.timeouts.hung`` (3 s): calls waiting on it fail over, a replica is
    promoted, and the run finishes while the host is still stopped. After
    SIGCONT the host drops its old copies and joins again; every copy on
    every worker is exact.

    Before the fix (checked by running this test on the previous commit) the
    run did not finish in the 120 s it was given with the host stopped: a
    forward or read waits for it up to ``ps.timeouts.rpc`` (300 s)."""
    clocks, block_rows = 40, 5  # 12 blocks: every worker is a primary and a replica
    with cluster(3) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        servers = ps.servers
        victim = servers[2]  # participants run on servers[0] and servers[1]
        # A table of which the victim is a primary of some blocks and a replica
        # of others (placement hashes the name and the workers' addresses, and
        # an unlucky ring gave one worker no primary of the 12 blocks).
        for i in range(64):
            table = f"t{i}"
            ps.create_table(table, shape=(N_ROWS, WIDTH), block_rows=block_rows, replication=2,
                            consistency=dask_ps.SSP(1))
            placement = ps._handle(table).owners
            if any(o[0] == victim for o in placement) and any(victim in o[1:] for o in placement):
                break
            ps.drop_table(table)
        assert any(o[0] == victim for o in placement) and any(victim in o[1:] for o in placement)
        pid = client.run(os.getpid, workers=[victim])[victim]
        result = {}

        def run():
            try:
                result["value"] = ps.run(reading_pusher, range(2), clocks=clocks, delay=0.05, table=table)
            except BaseException as e:  # noqa: BLE001 - checked below
                result["error"] = e

        runner = threading.Thread(target=run)
        runner.start()
        wait_for_clock(ps, 5)
        os.kill(pid, signal.SIGSTOP)
        try:
            runner.join(timeout=120)  # a bound far below the old stall, not a timing measurement
            finished_while_stopped = not runner.is_alive()
        finally:
            os.kill(pid, signal.SIGCONT)
        runner.join(timeout=300)
        assert finished_while_stopped, "the run waited for the stopped worker"
        assert result == {"value": [clocks, clocks]}, result
        want = expected_sum(2, clocks)
        np.testing.assert_array_equal(ps.pull(table), want)
        # Taken back after SIGCONT: it holds copies again, and every copy is exact.
        deadline = time.monotonic() + 120
        while victim not in {p.worker for p in ps.placement(table)} and time.monotonic() < deadline:
            time.sleep(0.2)
        ps.wait_for_placement()
        assert victim in ps.servers
        held = held_copies(client, table)
        assert held[victim], "the worker did not get copies back"
        for addr, blocks in held.items():
            for b, data in blocks.items():
                np.testing.assert_array_equal(data, want[b * block_rows:(b + 1) * block_rows],
                                              err_msg=f"{addr} block {b}")
        assert sum(len(blocks) for blocks in held.values()) == 2 * N_ROWS // block_rows


def test_scheduler_refuses_clock_reports_from_outside_the_run():
    """Clock reports (to the servers, which count them: issue 36), joins and
    leaves must come from one of the run's ranks ``0..n-1`` with a clock
    count. Before the fix (checked on the scheduler's old ``ps_clock``)
    ``rank=-1`` moved the last participant's clock to 50."""
    from dask_ps import PSValueError

    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as c, Client(c) as client:
        dask_ps.ParameterServer(client)
        # Clock reports, joins and leaves are internal (a participant's
        # session sends the cluster's token): sent here with it.
        from dask_ps._handlers import InternalRPC

        token = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.extensions["ps"].internal_token)
        scheduler = InternalRPC(client.scheduler, token)
        (worker,) = client.scheduler_info()["workers"]
        server = InternalRPC(client.rpc(worker), token)
        client.sync(scheduler.ps_run_start, run_id="r", n=2)
        clocks = lambda: client.run(  # noqa: E731
            lambda dask_worker: list(dask_worker.extensions["ps"].runs.records["r"].clocks))[worker]
        for bad in (dict(rank=-1, clock=50), dict(rank=2, clock=1), dict(rank=True, clock=1),
                    dict(rank=0, clock=-3), dict(rank=0, clock=1.5)):
            with pytest.raises(PSValueError, match="run r"):
                client.sync(server.ps_run_clock, run_id="r", **bad)
        with pytest.raises(PSValueError):
            client.sync(scheduler.ps_run_join, run_id="r", rank=-1, address="x")
        with pytest.raises(PSValueError):
            client.sync(scheduler.ps_run_leave, run_id="r", rank=5)
        with pytest.raises(PSValueError):
            client.sync(scheduler.ps_run_start, run_id="s", n=-1)
        assert clocks() == [0, 0]
        assert client.sync(server.ps_run_clock, run_id="r", rank=1, clock=1) == 0  # a real report still counts
        assert clocks() == [0, 1]
        client.sync(scheduler.ps_run_end, run_id="r")
