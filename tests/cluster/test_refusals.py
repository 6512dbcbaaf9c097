"""Issue 34: calls that would destroy a running fit, or store what a table
cannot represent, are refused and change nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from distributed import Event

import dask_ps


def _push_then_wait(ctx, _, event_name):
    ctx.push("w", np.ones(4))
    ctx.flush()
    ctx.clock()
    Event(event_name).wait(timeout=120)  # the test loads meanwhile
    ctx.push("w", np.ones(4))
    ctx.clock()
    return True


def test_load_overwrite_of_a_table_an_active_run_pushes_to_is_refused(ps, client, tmp_path):
    """It used to be accepted: the run failed with StaleVersionError and
    its acknowledged pushes were replaced by the checkpoint."""
    ps.create_table("w", shape=(4,))
    path = str(tmp_path / "ckpt")
    ps.save(path)
    go = Event("load-during-run", client=client)
    results, errors = [], []

    def run():
        try:
            results.extend(ps.run(_push_then_wait, [None], event_name="load-during-run"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        while not (ps.pull("w") == 1).all():  # the participant pushed; it waits for the event now
            assert thread.is_alive(), errors
            threading.Event().wait(0.05)
        (run_id,) = client.sync(ps._scheduler.ps_active_runs, tables=["w"])
        with pytest.raises(RuntimeError, match=rf"ps.load: table 'w' is in use by active run\(s\) \['{run_id}'\]"):
            ps.load(path, overwrite=True)
        np.testing.assert_array_equal(ps.pull("w"), np.ones(4))  # not replaced by the checkpoint's zeros
    finally:
        go.set()
        thread.join(120)
    assert errors == [] and results == [True]
    np.testing.assert_array_equal(ps.pull("w"), np.full(4, 2.0))
    ps.load(path, overwrite=True)  # between runs: loads
    np.testing.assert_array_equal(ps.pull("w"), np.zeros(4))


@pytest.mark.parametrize("init", [np.nan, np.inf, 1e30, -1])
def test_create_table_refuses_an_init_an_integer_table_cannot_hold(ps, init):
    dtype = "uint8" if init == -1 else "int32"
    with pytest.raises(dask_ps.PSValueError, match=f"'i'.*{dtype}"):
        ps.create_table("i", shape=(4,), dtype=dtype, init=init)
    assert "i" not in ps.tables()


def test_create_table_refuses_a_name_that_would_leave_a_checkpoint(ps):
    with pytest.raises(dask_ps.PSValueError, match="'../x' is not allowed"):
        ps.create_table("../x", shape=(4,))
    assert "../x" not in ps.tables()


def _pause(dask_worker):
    """What Dask's memory monitor does to a worker over its pause fraction."""
    mm = dask_worker.memory_manager
    mm.memory_spill_fraction = mm.memory_target_fraction = False
    mm.memory_pause_fraction = 1e-9


def test_a_fit_runs_on_the_running_workers_while_one_is_paused():
    """A worker paused by Dask's memory monitor before a fit made the fit
    fail after 31 s with Dask's "No valid workers found" (a part was
    scattered to it) although 2 of 3 workers ran."""
    import time

    import dask
    from distributed import Client, LocalCluster

    from dask_ps.linear_model import SGDClassifier

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        paused = sorted(client.scheduler_info()["workers"])[0]  # the first server: part 0's worker
        client.run(_pause, workers=[paused])
        while client.run(lambda dask_worker: dask_worker.status.name, workers=[paused])[paused] != "paused":
            time.sleep(0.05)
        rng = np.random.default_rng(0)
        X = rng.normal(size=(600, 5))
        y = (X[:, 0] > 0).astype(int)
        with dask.config.set({"ps.sgd.scatter-bytes": 0, "ps.sgd.min-samples-per-participant": 100}):
            est = SGDClassifier(client=client, max_iter=3, random_state=0).fit(X, y)
        assert est.score(X, y) > 0.9
        ps = dask_ps.get_parameter_server(client)
        assert paused in ps.servers and paused not in ps.wait_for_servers()


def _close_workers_and_log(caplog, n_close):
    """A 3-worker cluster with a replication-1 and a replication-2 table;
    ``n_close`` workers closed one after the other (as a closing
    LocalCluster's nannies do: no retirement, the scheduler still up, the
    first removal seen while the others still run), then the dask_ps log
    records of WARNING and above once ps.timeouts.lost-report has passed
    (5 s: the closes take well under that)."""
    import logging
    import time

    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"ps.timeouts.lost-report": "5s"}), \
            LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        for r in (1, 2):
            ps.create_table(f"t{r}", shape=(64,), block_rows=4, replication=r)
            ps.push(f"t{r}", np.ones(64))
        workers = sorted(cluster.workers.values(), key=lambda w: w.address)
        with caplog.at_level(logging.INFO, logger="dask_ps"):
            for w in workers[:n_close]:
                client.sync(w.close)
            time.sleep(7)  # past the 5 s the report waits
            records = [r for r in caplog.records if r.name.startswith("dask_ps") and r.levelno >= logging.WARNING]
        return records


def test_closing_every_worker_does_not_read_as_data_loss(caplog):
    """Closing a cluster logged ERROR "lost block(s) ... and has no
    checkpoint" and "no copy of block N could be read" (up to ~25 lines):
    the first worker to go looked lost while the others still ran."""
    import logging

    records = _close_workers_and_log(caplog, 3)
    assert [r.getMessage() for r in records if r.levelno >= logging.ERROR] == []
    assert "could be read" not in caplog.text


def test_a_worker_lost_while_the_others_run_still_reads_as_data_loss(caplog):
    import logging

    records = _close_workers_and_log(caplog, 1)
    errors = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "table 't1' lost block(s)" in errors[0] and "no checkpoint" in errors[0], errors
