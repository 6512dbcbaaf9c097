"""An in-process cluster (``LocalCluster(processes=False)``, the embedded
default) passes reply arrays without copying them: a reader must never be
able to change a server's stored values through one."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps


def _participant(ctx, _):
    seen = []
    for _ in range(3):
        seen.append(float(ctx.pull("inproc-t").sum()))
        ctx.push("inproc-t", np.ones(4))  # the write-through updates the cached block
        ctx.clock()
    return seen


@pytest.mark.parametrize("aggregate", ["push", "clock"])
def test_readers_cannot_change_the_servers_values(aggregate):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("inproc-t", shape=(4,), aggregate=aggregate, consistency=dask_ps.SSP(1))
        seen = ps.run(_participant, [0, 1])
        # SSP(1): a read at clock c holds the reader's own c pushes, the other
        # one's pushes of clocks < c - 1, and at most all 3 of the other's
        for clock, values in enumerate(zip(*seen)):
            for v in values:
                assert 4 * clock + 4 * max(0, clock - 1) <= v <= 4 * clock + 12
        w = ps.pull("inproc-t")
        w += 100  # the caller's copy
        np.testing.assert_array_equal(ps.pull("inproc-t"), np.full(4, 6.0))  # 2 participants x 3 clocks
        ps.drop_table("inproc-t")


def _read_other_workers_rows(ctx, _, host):
    from distributed import get_worker

    if get_worker().address == host:
        return None
    ctx.push_rows("inproc-rows", [1], [[100.0, 100.0]])
    ctx.flush()
    rows = ctx.pull_rows("inproc-rows", [1, 5, 7])
    try:  # a reply shared with the server (as the in-process comm hands them) is read-only
        rows[0] = -1.0
    except ValueError:
        pass
    return rows, ctx.pull_rows("inproc-rows", [5])


def test_workers_of_one_process_read_each_others_shards_without_comm():
    """In an in-process cluster a session reads and writes another worker's
    shards by a direct call on the shared event loop (issue 12): with that
    worker's ps_pull and ps_push comm handlers broken, pushes and reads still
    work, and the server's values cannot be changed through a reply."""
    from dask_ps._worker_plugin import in_process_peer

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("inproc-rows", shape=(8, 2), consistency=dask_ps.VAP(1e30),
                        init=np.arange(16.0).reshape(8, 2))
        host = ps.placement("inproc-rows")[0].worker
        server = next(w for w in cluster.workers.values() if w.address == host)

        def broken(**msg):
            raise AssertionError("the in-process peer was called through Dask's comm")

        real = {op: server.handlers[op] for op in ("ps_pull", "ps_push")}
        server.handlers.update({op: broken for op in real})
        try:
            out = [r for r in ps.run(_read_other_workers_rows, [0, 1], host=host) if r is not None]
        finally:
            server.handlers.update(real)
        assert out, "no participant ran on the other worker"
        for rows, again in out:
            np.testing.assert_array_equal(rows[1:], [[10.0, 11.0], [14.0, 15.0]])
            np.testing.assert_array_equal(again, [[10.0, 11.0]])
        expected = np.arange(16.0).reshape(8, 2)
        expected[1] += 100.0 * len(out)
        np.testing.assert_array_equal(ps.pull("inproc-rows"), expected)
        assert in_process_peer(host) is None  # not from outside the workers' event loop
        ps.drop_table("inproc-rows")


def _uncached_reads(ctx, _):
    rng = np.random.default_rng(ctx.rank)
    out = []
    for _ in range(5):
        a, b, c = (np.sort(rng.choice(1000, size, replace=False)) for size in (400, 300, 500))
        first = ctx.pull_rows("scratch-t", a)
        ahead = ctx.prefetch_rows("scratch-t", b)  # read at result(): must not share the scratch rows
        second = ctx.pull_rows("scratch-t", c)
        later = ctx.pull_rows("scratch-t", np.array([0, 1, 2, 999]))
        out.append((a, first, b, ahead.result(), c, second, later))
    return out, len(ctx._router.transport._row_scratch)


@pytest.mark.parametrize("processes", [False, True])
def test_uncached_row_reads_reuse_no_array_they_return(processes):
    """Uncached reads (VAP) send block 0's rows to a server in another
    process as int32 from scratch arrays the transport reuses: every read, a
    read started ahead and read later, and every earlier result keep their
    own rows' values; the same with the servers on other workers of the
    process (arrays passed by reference, no scratch); blocks of 300 rows
    (block 0 and others)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        values = np.stack([np.arange(1000.0), -np.arange(1000.0)], axis=1)
        ps.create_table("scratch-t", shape=(1000, 2), block_rows=300, consistency=dask_ps.VAP(1e30), init=values)
        results = ps.run(_uncached_reads, [0, 1])
        # The scratch path ran where block 0's server is in another process
        # (in worker processes: for the participant whose worker does not hold it).
        assert sum(scratch > 0 for _, scratch in results) == (1 if processes else 0)
        for reads, _ in results:
            for a, first, b, ahead, c, second, later in reads:
                np.testing.assert_array_equal(first, values[a])
                np.testing.assert_array_equal(ahead, values[b])
                np.testing.assert_array_equal(second, values[c])
                np.testing.assert_array_equal(later, values[[0, 1, 2, 999]])
        ps.drop_table("scratch-t")


def _handed_over_pushes(ctx, _, names):
    rng = np.random.default_rng(100 + ctx.rank)
    sent = {name: [] for name in names}
    handles = []
    for i in range(12):
        for name in sent:  # both tables' flushes go out at once
            # int64, 4000 in each block: the same size each time, so a scratch fits every push
            rows = np.concatenate([np.sort(rng.choice(10_000, 4_000, replace=False)) + b for b in (0, 10_000)])
            vals = rng.integers(-50, 50, size=(rows.size, 2)).astype(np.float64)
            ctx.push_rows(name, rows, vals, copy=False)
            sent[name].append((rows.copy(), vals.copy()))
        if i % 3 == 2:
            ctx.flush()
        else:
            handles.append(ctx.flush(wait=False))  # several pushes in flight at once
    ctx.flush()
    for hd in handles:
        hd.wait()
    return sent, len(ctx._router.transport._row_scratch)


@pytest.mark.parametrize("processes", [False, True])
def test_handed_over_int64_rows_travel_as_int32_and_sum_exactly(processes):
    """Rows handed over with ``copy=False`` go to a server in another
    process as int32 copies in the transport's scratch arrays, reused
    once a push was answered: with pushes of two tables in flight at once,
    every value lands on its own row (each table is exactly the sum of its
    pushes) and the callers' arrays are not changed."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        kw = dict(shape=(20_000, 2), block_rows=10_000, consistency=dask_ps.ASP())
        ps.create_table("wire-a", **kw)
        # Block 0 of both tables on one worker: the other participant's pushes
        # to the two are in flight at once (placement hashes the name).
        for i in range(64):
            other = f"wire-b{i}"
            ps.create_table(other, **kw)
            if ps.placement(other)[0].worker == ps.placement("wire-a")[0].worker:
                break
            ps.drop_table(other)
        names = ("wire-a", other)
        results = ps.run(_handed_over_pushes, [0, 1], names=names)
        for name in names:
            expect = np.zeros((20_000, 2))
            for sent, _ in results:
                for rows, vals in sent[name]:
                    np.add.at(expect, rows, vals)
            np.testing.assert_array_equal(ps.pull(name), expect)
            ps.drop_table(name)
        # The scratch path ran in worker processes, for block 0 of a table
        # whose server is the other worker (other blocks' rows are int32 already).
        assert any(scratch > 0 for _, scratch in results) == processes


def _record_alignment(dask_worker):
    """Wrap this worker's ShardStore.apply: record whether each pushed array arrived aligned."""
    from dask_ps._shard import ShardStore

    seen = dask_worker._align_seen = []
    if not hasattr(ShardStore, "_unwrapped_apply"):
        ShardStore._unwrapped_apply = ShardStore.apply

        def apply(t, items, **kw):
            for _, rows, vals in items:
                for a in (rows, vals):
                    if isinstance(a, np.ndarray):
                        dask_worker._align_seen.append(bool(a.flags.aligned))
            return ShardStore._unwrapped_apply(t, items, **kw)

        ShardStore.apply = staticmethod(apply)
    return len(seen)


def _alignment_seen(dask_worker):
    return dask_worker._align_seen


def _pushes_and_pulls(ctx, _):
    rng = np.random.default_rng(ctx.rank)
    unaligned = 0
    for i in range(300):  # sequence numbers past 127 and 255 lengthen a message's header
        rows = np.sort(rng.choice(4096, 500, replace=False))
        ctx.push_rows("align-t", rows, np.ones((rows.size, 3), np.float32))
        ctx.push("align-d", np.ones(1001, np.float32))
        ctx.flush()
        got = [ctx.pull_rows("align-t", rows), ctx.pull("align-d")]
        unaligned += sum(not a.flags.aligned for a in got)
    return unaligned


def test_arrays_of_every_message_arrive_aligned():
    """Dask's comm reads a message's first array at an offset its header's
    length gives; a pad array takes that place (``_worker_plugin.aligned``),
    so pushed values and rows reach the servers aligned, and pulled values
    reach the participants aligned, whatever the header's length."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("align-t", shape=(4096, 3), dtype="float32", consistency=dask_ps.VAP(1e30))
        ps.create_table("align-d", shape=(1001,), dtype="float32", consistency=dask_ps.VAP(1e30))
        client.run(_record_alignment)
        assert ps.run(_pushes_and_pulls, [0, 1]) == [0, 0]
        seen = [a for per_worker in client.run(_alignment_seen).values() for a in per_worker]
        assert len(seen) > 600 and all(seen)
        assert ps.pull("align-d").flags.aligned
        np.testing.assert_array_equal(ps.pull("align-d"), np.full(1001, 600.0))


def _remote_reads(ctx, _):
    h = ctx._handle("recv-t")
    transport = ctx._router.transport
    where = ("another process" if transport.serialized(h.primary(0))
             else "this worker" if h.primary(0) == transport.local_address else "a peer in this process")
    part = ctx._read(h, {0: None}, {})[0]
    mine = ctx.pull("recv-t")
    mine[:] = -1.0  # the caller's own array
    return where, bool(part.flags.writeable), ctx.pull("recv-t").tolist()


@pytest.mark.parametrize("processes", [False, True])
def test_replies_from_another_process_are_the_readers_own(processes):
    """A whole block is handed out read-only by its server (readers in its
    process share it) and Dask's serialization carries the flag; a reply
    that came from another process is a buffer only the reader holds, so it
    is made writable and given to the caller without a copy. Writing into
    it changes nothing stored; in one process the shared block stays
    read-only."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("recv-t", shape=(5,), consistency=dask_ps.VAP(1e30), init=np.arange(5.0))
        results = ps.run(_remote_reads, [0, 1])
        expect = {"another process": True, "this worker": True, "a peer in this process": False}
        for where, writeable, again in results:
            assert again == [0.0, 1.0, 2.0, 3.0, 4.0]
            assert writeable == expect[where], where
        assert ("another process" in {w for w, _, _ in results}) == processes
        assert ps.pull("recv-t").tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        ps.drop_table("recv-t")


def test_in_process_workers_count_the_process_against_their_summed_memory_limit():
    """Dask compares the whole process's memory with each in-process
    worker's own limit: four workers given a limit each of what the process
    already uses were all paused, and a fit failed with Dask's "No valid
    workers found" after 30 s (issue 35, with ``n_workers=16`` and
    ``"auto"`` limits). Once dask_ps is on them, the limits are their sum:
    they resume and the fit runs."""
    import psutil

    from distributed.core import Status
    from distributed.system import MEMORY_LIMIT

    from dask_ps._host_memory import pool_in_process_memory_limits
    from dask_ps.linear_model import SGDClassifier

    rng = np.random.RandomState(0)
    X = rng.randn(2000, 5)
    y = (X[:, 0] > 0).astype(int)
    each = psutil.Process().memory_info().rss  # above Dask's pause fraction (0.8) of one limit, far below 4
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=False, memory_limit=each,
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
        est = SGDClassifier(max_iter=2, tol=None, random_state=0, client=client).fit(X, y)
        assert est.score(X, y) > 0.9
        # the sum of the four (plus other in-process workers of this test
        # process: the shared threads cluster's), at most the machine's memory
        limits = {w.memory_manager.memory_limit for w in cluster.workers.values()}
        assert len(limits) == 1 and min(4 * each, MEMORY_LIMIT) <= limits.pop() <= MEMORY_LIMIT
        w0 = next(iter(cluster.workers.values()))
        assert pool_in_process_memory_limits(w0) == w0.memory_manager.memory_limit  # pooled once
        assert all(w.status == Status.running for w in cluster.workers.values())


def test_a_nanny_worker_or_one_without_a_limit_keeps_its_limit():
    from types import SimpleNamespace

    from dask_ps._host_memory import pool_in_process_memory_limits

    assert pool_in_process_memory_limits(SimpleNamespace(nanny="tcp://127.0.0.1:1",
                                                         memory_manager=SimpleNamespace(memory_limit=100))) is None
    assert pool_in_process_memory_limits(SimpleNamespace(nanny=None,
                                                         memory_manager=SimpleNamespace(memory_limit=None))) is None
