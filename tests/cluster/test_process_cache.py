"""Bösen's process cache (dask_ps._process_cache): a block one participant
read from another process serves another participant of its process only
where that reader's bound and its own writes allow it.

The participants of each run are placed on one worker (their parts are
scattered there) and the tables' blocks on the other, so that on worker
processes every read leaves the process. In the in-process cluster every
read is a direct call and nothing is shared (asserted too). The order of
the participants' steps is set with ``distributed.Event``, never by sleeping.
"""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
from distributed import Client, Event
from ps_fixtures import shared_cluster

import dask_ps
from dask_ps import _process_cache
from tests.cluster.test_consistency import C, P, audit_participant


@pytest.fixture(scope="module", params=["processes", "threads"])
def cluster(request):
    """A cluster of this module's own: where the shared one had run other
    modules' participants, Dask placed one of two participants of tiny
    parts on the other worker (another process: nothing to share)."""
    with shared_cluster(processes=request.param == "processes") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as client:
        yield client


@pytest.fixture(autouse=True)
def process_cache_on(client):
    """``ps.process-cache`` on in the workers (and here) for the test."""
    def set_to(value):
        dask.config.set({"ps.process-cache": value})

    before = dask.config.get("ps.process-cache")
    client.run(set_to, True)
    set_to(True)
    yield
    client.run(set_to, before)
    set_to(before)


def _in_processes(client) -> bool:
    return any(pid != os.getpid() for pid in client.run(os.getpid).values())


def _away_from(ps, client, table, n):
    """``n`` parts on the worker that holds none of ``table``'s first block
    (the other one when only one worker holds blocks)."""
    holder = ps.placement(table)[0].worker
    addr = [w for w in sorted(client.scheduler_info()["workers"]) if w != holder][0]
    return client.scatter(list(range(n)), workers=[addr], broadcast=False, hash=False)


def _table_metrics(ctx, name):
    return dict(ctx.metrics()["tables"][name])


def test_a_read_serves_the_other_participant_with_its_own_unsummed_pushes(ps, client):
    """aggregate="clock" (BSP): rank 1 takes the block rank 0 read at the
    same clock (no bytes pulled) and adds its own push of the clock, which
    the servers hold back until the clock is complete; rank 0's push of the
    clock is not in it."""
    ps.create_table("t", shape=(4,), consistency=dask_ps.BSP(), aggregate="clock")
    prefix = f"pc-clock-{np.random.randint(1 << 30)}"

    def train(ctx, part):
        r = ctx.rank
        ctx.push("t", np.array([1.0, 10.0, 0, 0]) * (r == 0) + np.array([0, 10.0, 0, 0]) * (r == 1))
        ctx.clock()
        if r == 0:
            # Rank 1's clock began before this read was sent (BSP refreshes:
            # an older read may not serve it), whatever the load.
            Event(prefix + "-clocked").wait(timeout=60)
            v = ctx.pull("t")
            ctx.push("t", np.array([0, 0, 0, 1000.0]))
            ctx.flush()
            Event(prefix).set()
        else:
            Event(prefix + "-clocked").set()
            ctx.push("t", np.array([0, 0, 100.0, 0]))
            ctx.flush()  # sent: the servers hold it until clock 1 is complete
            Event(prefix).wait(timeout=60)
            before = _table_metrics(ctx, "t")
            v = ctx.pull("t")
            after = _table_metrics(ctx, "t")
            if shared:
                assert after["shared_hits"] - before["shared_hits"] == 1
                assert after["bytes_pulled"] == before["bytes_pulled"]  # nothing fetched
            else:  # in-process: a direct read of the server, nothing shared
                assert after["shared_hits"] == 0 and after["bytes_pulled"] > before["bytes_pulled"]
        ctx.clock()
        return v.tolist(), ctx.pull("t").tolist()

    shared = _in_processes(client)
    (v0, end0), (v1, end1) = ps.run(train, _away_from(ps, client, "t", 2))
    assert v0 == [1.0, 20.0, 0.0, 0.0]
    assert v1 == [1.0, 20.0, 100.0, 0.0]  # read-my-writes; rank 0's clock-1 push not yet
    assert end0 == end1 == [1.0, 20.0, 100.0, 1000.0]


def test_a_block_read_before_an_own_push_is_not_taken(ps, client):
    """aggregate="push": rank 0's read is older than rank 1's acknowledged
    push (the servers' sequence number says so): rank 1 reads the servers
    and sees its push."""
    ps.create_table("p", shape=(3,), consistency=dask_ps.SSP(staleness=2))
    prefix = f"pc-seq-{np.random.randint(1 << 30)}"

    def train(ctx, part):
        if ctx.rank == 0:
            v = ctx.pull("p")
            Event(prefix).set()
            Event(prefix + "-done").wait(timeout=60)  # its read stays in the process cache
            return v.tolist(), 0
        Event(prefix).wait(timeout=60)
        ctx.push("p", np.array([0, 5.0, 0]))
        ctx.flush()  # applied: the block's sequence number is past rank 0's read
        v = ctx.pull("p")
        Event(prefix + "-done").set()
        return v.tolist(), _table_metrics(ctx, "p")["shared_hits"]

    (v0, _), (v1, hits) = ps.run(train, _away_from(ps, client, "p", 2))
    assert v0 == [0.0, 0.0, 0.0]
    assert v1 == [0.0, 5.0, 0.0] and hits == 0


def test_a_block_below_the_readers_bound_is_not_taken(ps, client):
    """SSP(1): rank 0's read at clock 0 (tag 0) cannot serve rank 1's read at
    clock 2, which must see rank 0's push of clock 0."""
    ps.create_table("s", shape=(2,), consistency=dask_ps.SSP(staleness=1))
    prefix = f"pc-bound-{np.random.randint(1 << 30)}"

    def train(ctx, part):
        if ctx.rank == 0:
            v = ctx.pull("s")  # tag 0: before anyone's push
            Event(prefix + "-read").set()
            ctx.push("s", np.array([1.0, 0]))
            ctx.clock()
            Event(prefix + "-done").wait(timeout=60)
            return v.tolist(), 0
        Event(prefix + "-read").wait(timeout=60)
        ctx.clock()
        ctx.clock()  # clock 2: a read needs every push of clock 0
        v = ctx.pull("s")
        Event(prefix + "-done").set()
        return v.tolist(), _table_metrics(ctx, "s")["shared_hits"]

    (v0, _), (v1, hits) = ps.run(train, _away_from(ps, client, "s", 2))
    assert v0 == [0.0, 0.0]
    assert v1 == [1.0, 0.0] and hits == 0


@pytest.mark.parametrize("use_rows", [False, True], ids=["dense", "rows"])
@pytest.mark.parametrize("model,staleness", [(dask_ps.BSP(), 0), (dask_ps.SSP(staleness=1), 1),
                                             (dask_ps.SSP(staleness=3), 3)], ids=repr)
def test_audit_holds_with_reads_shared_in_the_process(ps, client, model, staleness, use_rows):
    """The exact audit of tests/cluster/test_consistency.py with every
    participant in one process: blocks are shared, and every read still has
    exactly what its own bound and read-my-writes require."""
    ps.create_table("audit", shape=(P * C,), block_rows=7, consistency=model)
    delays = [0.001, 0.002, 0.001, 0.03]
    lags = ps.run(audit_participant, _away_from(ps, client, "audit", P), delays=delays, staleness=staleness,
                  use_rows=use_rows)
    assert ps.pull("audit").tolist() == [1.0] * (P * C)
    assert max(max(lag) for lag in lags[:3]) <= staleness
    run = list(ps.metrics().values())[-1]
    hits = sum(p["tables"]["audit"]["shared_hits"] for p in run["participants"].values())
    assert hits > 0 if _in_processes(client) else hits == 0


def test_refresh_takes_only_blocks_read_in_the_readers_clock(ps, client):
    """SSP(2, refresh=True): a block rank 0 read after rank 1's clock began
    serves rank 1; in rank 1's next clock it does not (read again)."""
    ps.create_table("f", shape=(3,), consistency=dask_ps.SSP(staleness=2, refresh=True))
    prefix = f"pc-refresh-{np.random.randint(1 << 30)}"

    def train(ctx, part):
        if ctx.rank == 0:
            Event(prefix + "-entered").wait(timeout=60)
            v = ctx.pull("f")
            Event(prefix + "-read").set()
            Event(prefix + "-done").wait(timeout=60)
            return v.tolist(), None, None
        ctx.clock()
        Event(prefix + "-entered").set()
        Event(prefix + "-read").wait(timeout=60)
        first = ctx.pull("f")
        taken = _table_metrics(ctx, "f")
        ctx.clock()
        ctx.pull("f")  # a new clock: the block rank 0 read is of the one before
        again = _table_metrics(ctx, "f")
        Event(prefix + "-done").set()
        return first.tolist(), taken, again

    (v0, _, _), (v1, taken, again) = ps.run(train, _away_from(ps, client, "f", 2))
    assert v0 == v1 == [0.0, 0.0, 0.0]
    if _in_processes(client):
        assert taken["shared_hits"] == 1 and taken["bytes_pulled"] == 0
    else:
        assert taken["shared_hits"] == 0
    assert again["shared_hits"] == taken["shared_hits"] and again["bytes_pulled"] > taken["bytes_pulled"]


def test_process_cache_keeps_the_fresher_block_and_never_writes_a_source():
    cache = _process_cache.ProcessCache("r")
    src = np.arange(4.0)
    ro = _process_cache.read_only(src)
    assert src.flags.writeable and not ro.flags.writeable and np.shares_memory(src, ro)
    new = _process_cache.SharedBlock("id", 1, 3, 0.0, 7, None, None, ro)
    old = _process_cache.SharedBlock("id", 1, 2, 0.0, 9, None, None, ro)
    cache.put("t", 0, new)
    cache.put("t", 0, old)  # staler: not kept
    assert cache.get("t", "id", 1, 0) is new
    assert cache.get("t", "id", 2, 0) is None  # another version of the table: not served
    assert _process_cache.acquire("run-x") is _process_cache.acquire("run-x")


def _set_window(client, value):
    def set_to(v):
        dask.config.set({"ps.process-read-window": v})

    client.run(set_to, value)
    set_to(value)


def _combined(client):
    return client.run(lambda: dict(_process_cache.combined))


@pytest.fixture
def read_window(client):
    """``ps.process-read-window`` in the workers for the test (the fixture
    sets it back to 0)."""
    yield lambda value: _set_window(client, value)
    _set_window(client, "0ms")


def test_reads_of_one_process_become_one_message(ps, client, read_window):
    """Two participants' reads of overlapping rows in one window: one message
    to the server (processes), and each reader gets exactly its rows, with
    its own flushed and buffered pushes and not the other's buffered ones."""
    read_window("2s")  # long: the second read surely joins the first one's
    ps.create_table("c", shape=(10, 2), consistency=dask_ps.SSP(staleness=1))
    ps.push("c", np.arange(20.0).reshape(10, 2))
    prefix = f"pc-combine-{np.random.randint(1 << 30)}"

    def train(ctx, part):
        if ctx.rank == 0:
            ctx.push_rows("c", [5], [[100.0, 100.0]])  # buffered: only rank 0 sees it
            Event(prefix).set()
            v = ctx.pull_rows("c", [5, 1, 3]).tolist()
            Event(prefix + "-done").wait(timeout=60)  # its push is flushed when it leaves
            return v
        ctx.push_rows("c", [9], [[1000.0, 0]])
        ctx.flush()  # at the server before the read
        ctx.push_rows("c", [4], [[0, 7.0]])  # buffered
        Event(prefix).wait(timeout=60)
        v = ctx.pull_rows("c", [3, 4, 5, 9, 3]).tolist()
        Event(prefix + "-done").set()
        return v

    before = _combined(client)
    r0, r1 = ps.run(train, _away_from(ps, client, "c", 2))
    after = _combined(client)
    base = np.arange(20.0).reshape(10, 2)
    assert r0 == (base[[5, 1, 3]] + [[100, 100], [0, 0], [0, 0]]).tolist()
    assert r1 == (base[[3, 4, 5, 9, 3]] + [[0, 0], [0, 7], [0, 0], [1000, 0], [0, 0]]).tolist()
    requests = sum(a["requests"] - before[w]["requests"] for w, a in after.items())
    messages = sum(a["messages"] - before[w]["messages"] for w, a in after.items())
    if _in_processes(client):
        assert (requests, messages) == (2, 1)
    else:  # every server is in the process: nothing to combine
        assert requests == messages == 0


@pytest.mark.parametrize("use_rows", [False, True], ids=["dense", "rows"])
@pytest.mark.parametrize("model,staleness", [(dask_ps.BSP(), 0), (dask_ps.SSP(staleness=2, refresh=True), 2)],
                         ids=repr)
def test_audit_holds_with_reads_combined_in_the_process(ps, client, read_window, model, staleness, use_rows):
    """The exact audit with the reads of the process combined (and its cache
    on): every read still has exactly what its bound and read-my-writes
    require, nothing is lost or counted twice."""
    read_window("20ms")
    ps.create_table("audit", shape=(P * C,), block_rows=7, consistency=model)
    before = _combined(client)
    lags = ps.run(audit_participant, _away_from(ps, client, "audit", P), delays=[0.001, 0.002, 0.001, 0.03],
                  staleness=staleness, use_rows=use_rows)
    after = _combined(client)
    assert ps.pull("audit").tolist() == [1.0] * (P * C)
    assert max(max(lag) for lag in lags[:3]) <= staleness
    requests = sum(a["requests"] - before[w]["requests"] for w, a in after.items())
    messages = sum(a["messages"] - before[w]["messages"] for w, a in after.items())
    if _in_processes(client):
        assert messages < requests


def test_bsp_lda_is_the_same_bit_for_bit_with_reads_combined(client, read_window):
    """A BSP fit reads exactly the clocks below its own at every read, so
    combined reads (each at the highest tag of the message, never above the
    readers' clock) leave the chain as it is."""
    from dask_ps.decomposition import LatentDirichletAllocation

    X = np.random.default_rng(0).poisson(0.3, size=(200, 300))

    def fit():
        return LatentDirichletAllocation(5, max_iter=5, consistency=dask_ps.BSP(), n_partitions=4, client=client,
                                         random_state=0).fit(X).components_

    alone = fit()
    read_window("20ms")
    before = _combined(client)
    combined_fit = fit()
    after = _combined(client)
    np.testing.assert_array_equal(combined_fit, alone)
    if _in_processes(client):
        assert sum(a["messages"] - before[w]["messages"] for w, a in after.items()) < \
            sum(a["requests"] - before[w]["requests"] for w, a in after.items())
