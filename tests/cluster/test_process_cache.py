"""Bösen's process cache, the part kept (dask_ps._process_cache): the reads
of the participants of one worker process to a server in another process,
combined into one message within ``ps.process-read-window``.

The participants of each run are placed on one worker (their parts are
scattered there) and the tables' blocks on the other, so that on worker
processes every read leaves the process. In the in-process cluster every
read is a direct call and nothing is combined (asserted too). The order of
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


def _in_processes(client) -> bool:
    return any(pid != os.getpid() for pid in client.run(os.getpid).values())


def _away_from(ps, client, table, n):
    """``n`` parts on the worker that holds none of ``table``'s first block
    (the other one when only one worker holds blocks)."""
    holder = ps.placement(table)[0].worker
    addr = [w for w in sorted(client.scheduler_info()["workers"]) if w != holder][0]
    return client.scatter(list(range(n)), workers=[addr], broadcast=False, hash=False)


def test_the_participants_of_a_run_in_a_process_share_one_combiner():
    first = _process_cache.acquire("run-x")
    assert _process_cache.acquire("run-x") is first
    assert _process_cache.acquire("run-y") is not first


def _set_everywhere(client, key, value):
    def set_to(v):
        dask.config.set({key: v})

    client.run(set_to, value)
    set_to(value)


def _set_window(client, value):
    _set_everywhere(client, "ps.process-read-window", value)


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
    """The exact audit with the reads of the process combined: every read still has exactly what its bound and read-my-writes
    require, nothing is lost or counted twice."""
    read_window("20ms")
    # the clock messages' own combining folds the prefetched reads into them
    # (tests/cluster/test_clock_combiner_cluster.py audits that path): off
    # here, so that the reads this test counts go through the read window
    combine = dask.config.get("ps.clock.combine-per-process")
    _set_everywhere(client, "ps.clock.combine-per-process", False)
    try:
        ps.create_table("audit", shape=(P * C,), block_rows=7, consistency=model)
        before = _combined(client)
        lags = ps.run(audit_participant, _away_from(ps, client, "audit", P), delays=[0.001, 0.002, 0.001, 0.03],
                      staleness=staleness, use_rows=use_rows)
        after = _combined(client)
    finally:
        _set_everywhere(client, "ps.clock.combine-per-process", combine)
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
