"""Slow is not dead (issue 22): a worker whose event loop is busy, or
whose tasks hold the GIL for seconds, keeps its copies; a stopped one is
still fenced out; and fencing never destroys the last up-to-date copy of a
block. Each test runs its own cluster of worker processes."""

from __future__ import annotations

import os
import signal
import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps

N_ROWS, BLOCK_ROWS = 60, 5  # 12 blocks


def cluster(n=3, **kw):
    kw.setdefault("threads_per_worker", 1)
    return LocalCluster(n_workers=n, dashboard_address=None, **kw)


def busy_event_loop(seconds):
    """Runs on the worker's event loop (``client.run``): pure Python, so the
    GIL is handed over every few ms, but the loop serves nothing meanwhile
    (as an import or a compile on the loop does): no Dask heartbeat."""
    t0 = time.monotonic()
    x = 0
    while time.monotonic() - t0 < seconds:
        x += 1
    return x


def hold_the_gil(seconds, stretches):
    """A task that holds the GIL in stretches of ``seconds`` each (a C call
    that does not release it, as parts of a compile or a long garbage
    collection do): nothing else in the process runs Python meanwhile, the
    beacon's thread included. libc's ``sleep`` through ``ctypes.PyDLL``
    (which keeps the GIL): exact, and no CPU used."""
    import ctypes
    import ctypes.util

    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    unslept = []
    for _ in range(stretches):
        unslept.append(libc.sleep(int(seconds)))  # seconds left if a signal cut it short
        time.sleep(0.05)
    return unslept


def pusher(ps, table, stop, counts):
    while not stop.is_set():
        try:
            ps.push(table, np.ones(N_ROWS))
            counts["acked"] += 1
        except Exception as e:  # noqa: BLE001 - counted, checked by the caller
            counts["failed"] += 1
            counts.setdefault("errors", []).append(repr(e))
        time.sleep(0.05)


def left_events(client):
    return [msg for _, msg in client.get_events("ps-worker-left")]


def check_exact(ps, table, counts):
    got = ps.pull(table)
    assert counts["acked"] <= got.min() and got.max() <= counts["acked"] + counts["failed"], (got, counts)
    assert np.all(got == got[0]), got  # every block saw the same pushes


def test_busy_workers_are_not_fenced_out():
    """replication=2 on 3 workers, a client pushing throughout. One
    worker's event loop is busy for 8 s (no Dask heartbeat), another's task
    holds the GIL in two stretches of 4 s: both are alive and keep their
    copies. Before (``ps.timeouts.hung`` 3 s on Dask's heartbeats) both were
    fenced out ("hung (no heartbeat for 3.0 s)")."""
    with cluster(3) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
        a, b, _ = ps.servers
        counts = {"acked": 0, "failed": 0}
        stop = threading.Event()
        th = threading.Thread(target=pusher, args=(ps, "w", stop, counts))
        th.start()
        try:
            gil = client.submit(hold_the_gil, 4, 2, workers=[b], pure=False)
            client.run(busy_event_loop, 8.0, workers=[a])
            unslept = gil.result(timeout=120)
            time.sleep(1.0)
        finally:
            stop.set()
            th.join(60)
        assert unslept == [0, 0], unslept  # each stretch held the GIL its full 4 s, past the old limit
        assert left_events(client) == []
        assert client.run_on_scheduler(lambda dask_scheduler: dict(dask_scheduler.extensions["ps"].hung.fenced)) == {}
        assert counts["acked"] > 0 and counts["failed"] == 0, counts
        check_exact(ps, "w", counts)


@pytest.mark.slow
def test_a_stopped_worker_is_still_fenced_out():
    """SIGSTOP of a shard host for 12 s: fenced out while it is stopped (the
    limit is 6 s of silence of its beacon thread; how soon, is measured by
    benchmarks/bench_chaos.py), the pushes go on, and after SIGCONT it drops
    its old copies, joins again and every copy is exact.

    ``-m slow`` (31 s alone at load 29, and it failed once in a run of this
    file there): the default run keeps the property with
    test_failover.py::test_a_hung_shard_host_is_fenced_out_and_the_run_goes_on
    (SIGSTOP mid-run: fenced out, the run finishes, after SIGCONT the host
    drops its copies and joins again, every copy exact) and
    tests/core/test_liveness_detector.py (a stopped beacon is fenced after
    the limit, a busy loop with a beating beacon is not)."""
    with cluster(3) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
        victim = ps.servers[2]
        pid = client.run(os.getpid, workers=[victim])[victim]
        counts = {"acked": 0, "failed": 0}
        stop = threading.Event()
        th = threading.Thread(target=pusher, args=(ps, "w", stop, counts))
        th.start()
        fenced_while_stopped = False
        try:
            time.sleep(0.5)
            os.kill(pid, signal.SIGSTOP)
            try:
                for _ in range(120):  # 12 s stopped
                    fenced_while_stopped = fenced_while_stopped or any(
                        m.get("address") == victim for m in left_events(client))
                    time.sleep(0.1)
            finally:
                os.kill(pid, signal.SIGCONT)
            time.sleep(1.0)
        finally:
            stop.set()
            th.join(60)
        assert fenced_while_stopped
        assert counts["failed"] == 0, counts
        deadline = time.monotonic() + 60
        while victim not in ps.servers and time.monotonic() < deadline:
            time.sleep(0.2)
        ps.wait_for_placement()
        check_exact(ps, "w", counts)


def _held(client, table):
    def get(dask_worker):
        t = dask_worker.extensions["ps"].store.tables.get(table)
        return {} if t is None else {b: blk.data.copy() for b, blk in t.blocks.items()}
    return client.run(get)


@pytest.mark.slow
def test_two_workers_stopped_together_lose_nothing():
    """replication=2, 4 workers, a 12-block table, a client pushing: two
    workers SIGSTOPped 1 s apart for 8 s each, then SIGCONT (with the
    issue's 3 s limit, so the first is fenced out while the second holds
    the other copy of some of its blocks). Before, the next pull raised
    DataLostError for 4-9 of the 12 blocks: the placement change gave up
    the stopped second worker as a source and declared its blocks lost."""
    with dask.config.set({"ps.timeouts.hung": "3s"}):
        with cluster(4) as c, Client(c) as client:
            ps = dask_ps.ParameterServer(client)
            ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
            a, b = ps.servers[:2]
            pids = client.run(os.getpid, workers=[a, b])
            counts = {"acked": 0, "failed": 0}
            stop = threading.Event()
            th = threading.Thread(target=pusher, args=(ps, "w", stop, counts))
            th.start()
            try:
                time.sleep(0.5)
                os.kill(pids[a], signal.SIGSTOP)
                time.sleep(1.0)
                os.kill(pids[b], signal.SIGSTOP)
                time.sleep(7.0)
                os.kill(pids[a], signal.SIGCONT)
                time.sleep(1.0)
                os.kill(pids[b], signal.SIGCONT)
                time.sleep(3.0)
            finally:
                for p in pids.values():
                    os.kill(p, signal.SIGCONT)
                stop.set()
                th.join(120)
            ps.wait_for_placement()
            check_exact(ps, "w", counts)
            want = ps.pull("w")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                held = _held(client, "w")
                if sum(len(v) for v in held.values()) == 2 * N_ROWS // BLOCK_ROWS:
                    break
                time.sleep(0.5)
            for addr, blocks in held.items():
                for blk, data in blocks.items():
                    np.testing.assert_array_equal(data, want[blk * BLOCK_ROWS:(blk + 1) * BLOCK_ROWS],
                                                  err_msg=f"{addr} block {blk}")


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(3))
def test_a_kill_during_a_retire_loses_nothing(attempt):
    """replication=2, 4 workers, a client pushing: one worker is retired
    while another is killed (SIGKILL) during the retire. Nothing is lost.
    The issue saw DataLostError in 2 of 6 such runs; this test did not
    reproduce it on the previous commit (6 of 6 passed, and 5 variants
    killing the retiring worker itself or another one 0.02-0.6 s into the
    retire passed too). It guards the repair rule found by reading: a
    repair of the killed worker computed while the retiring one had left
    the members counted the retiring worker's copies as gone and reported
    blocks whose other copy was on the killed worker lost; a retiring (or
    Dask-paused) holder that is alive is now a source."""
    with cluster(4) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
        leaving, killed = ps.servers[attempt % 4], ps.servers[(attempt + 1) % 4]
        pid = client.run(os.getpid, workers=[killed])[killed]
        counts = {"acked": 0, "failed": 0}
        stop = threading.Event()
        th = threading.Thread(target=pusher, args=(ps, "w", stop, counts))
        th.start()
        try:
            time.sleep(0.5)
            retire = threading.Thread(target=client.retire_workers, args=([leaving],))
            retire.start()
            time.sleep(0.05 * (1 + attempt))
            os.kill(pid, signal.SIGKILL)
            retire.join(120)
            time.sleep(1.0)
        finally:
            stop.set()
            th.join(120)
        ps.wait_for_placement()
        check_exact(ps, "w", counts)


def _burn(seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass


@pytest.mark.slow
def test_a_cold_first_fit_under_cpu_load_fences_no_worker(tmp_path):
    """A fresh cluster of 3 worker processes with an empty numba cache (every
    kernel compiles in every worker: a first fit after install), two
    processes burning CPU besides (a busy laptop on 2 cores), and
    ``SGDClassifier(replication=2).fit``: no worker is fenced out and the
    model is a model. Before, 2 workers were fenced out ("no heartbeat for
    3.0-3.2 s") in every try."""
    import multiprocessing as mp

    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    X, y = make_classification(20_000, 30, n_informative=10, random_state=0)
    ctx = mp.get_context("spawn")
    burners = [ctx.Process(target=_burn, args=(120,), daemon=True) for _ in range(2)]
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    with cluster(3, env=env) as c, Client(c) as client:
        for p in burners:
            p.start()
        try:
            est = SGDClassifier(replication=2, max_iter=5, tol=None, random_state=0).fit(X, y)
        finally:
            for p in burners:
                p.terminate()
        assert left_events(client) == []
        assert est.score(X, y) > 0.7


def test_a_worker_fenced_while_a_table_is_created_never_serves_a_copy_that_missed_pushes():
    """A candidate for the silent wrong answer behind "the fit after the
    failed one scored 0.50 with no error": a worker fenced out while a table's shards were
    created on it was not repaired out of that table (it was not registered
    yet, so the repair of the fence skipped it); the other workers skipped
    their forwards to it (it was "dead" to them), and after it was taken
    back it still held a listed copy that had missed those pushes: zeros,
    for a fit's new weights table. Now the table is repaired at once after
    its creation, and the worker drops its copies only after that; every
    copy the placement lists is exact. (A mechanism found by reading, not
    the reproduced cause: this test passes on the previous commit too, in
    3 of 3 runs; it guards the repair at creation.)"""
    with LocalCluster(n_workers=3, processes=False, threads_per_worker=1, dashboard_address=None) as c, \
            Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        victim = ps.servers[0]
        plugin = c.scheduler.extensions["ps"]
        real_rpc = plugin.worker_rpc

        class Rpc:
            def __init__(self, worker):
                self.worker, self.rpc = worker, real_rpc(worker)

            def __getattr__(self, op):
                call = getattr(self.rpc, op)
                if op != "ps_create_shards" or self.worker != victim or victim in plugin.hung.fenced:
                    return call

                async def fenced_first(**msg):
                    plugin.hung._fence_out(victim, f"{victim} hung (injected while creating)")
                    return await call(**msg)
                return fenced_first

        plugin.worker_rpc = Rpc
        try:
            ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
        finally:
            plugin.worker_rpc = real_rpc
        for _ in range(10):
            ps.push("w", np.ones(N_ROWS))
        deadline = time.monotonic() + 60
        while victim not in ps.servers and time.monotonic() < deadline:
            time.sleep(0.1)
        ps.wait_for_placement()
        for _ in range(5):
            ps.push("w", np.ones(N_ROWS))
        ps.wait_for_placement()
        np.testing.assert_array_equal(ps.pull("w"), np.full(N_ROWS, 15.0))
        owners = ps._handle("w").owners
        held = _held(client, "w")
        for b, ws in enumerate(owners):
            for w in ws:
                assert b in held[w], (b, w)
                np.testing.assert_array_equal(held[w][b], np.full(BLOCK_ROWS, 15.0), err_msg=f"{w} block {b}")


def _push_then_spoil(ctx, _, replica, clocks):
    for _clock in range(ctx.current_clock, clocks):
        ctx.push("w", np.ones(N_ROWS))
        ctx.clock()
    if ctx.rank == 0 and replica is not None:
        # A copy that missed updates (what a fenced worker's late copy was):
        # one update fewer, and its values those of an empty table.
        from dask_ps._worker_plugin import _IN_PROCESS

        blk = _IN_PROCESS[replica].store.tables["w"].blocks[0]
        blk.seq -= 1
        blk.data[:] = 0
    return ctx.current_clock


def test_a_run_whose_table_has_a_copy_that_missed_updates_raises():
    """Issue 22, item 3: "a fit that trained on lost, reset or partial
    tables raises". At a run's end the scheduler compares the update counts
    of every listed copy of the blocks of the tables it used; a copy behind
    the others (here: spoiled on purpose at the end of the run) makes
    ``ps.run`` raise ``CopiesDisagreeError`` instead of returning, and the
    copy is fenced and made again. Before, the run returned and the copy
    kept serving reads (a pull from it gave zeros)."""
    from dask_ps._exceptions import CopiesDisagreeError

    with LocalCluster(n_workers=3, processes=False, threads_per_worker=1, dashboard_address=None) as c, \
            Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("w", shape=(N_ROWS,), block_rows=BLOCK_ROWS, replication=2)
        assert ps.run(_push_then_spoil, range(2), replica=None, clocks=3) == [3, 3]  # no false alarm
        replica = ps._handle("w").owners[0][1]
        with pytest.raises(CopiesDisagreeError, match="block, worker, updates") as info:
            ps.run(_push_then_spoil, range(2), replica=replica, clocks=3)
        assert [row[:2] for row in info.value.copies["w"]] == [[0, replica]]
        ps.wait_for_placement()
        want = np.full(N_ROWS, 12.0)
        np.testing.assert_array_equal(ps.pull("w"), want)
        held = _held(client, "w")
        for b, ws in enumerate(ps._handle("w").owners):
            for w in ws:
                np.testing.assert_array_equal(held[w][b], want[b * BLOCK_ROWS:(b + 1) * BLOCK_ROWS],
                                              err_msg=f"{w} block {b}")
