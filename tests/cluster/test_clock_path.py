"""The clock path (issue 36): the servers count the clocks, the scheduler
is on no clock's path.

Counted from each participant's ``metrics()["messages"]`` between two
clocks of a steady run (after its tables were looked up), on both layouts
(worker processes: requests through the comm; in-process: direct calls).
"""

from __future__ import annotations

import numpy as np
import pytest

import dask_ps

CLOCKS = 12
STEADY = (2, 10)  # clocks between which the requests are counted


def _counting(ctx, _, table, use_rows):
    snaps = {}
    rows = np.arange(ctx.rank, 40, ctx.n_participants)
    for c in range(CLOCKS):
        if c in STEADY:
            snaps[c] = dict(ctx.metrics()["messages"])
        if use_rows:
            ctx.pull_rows(table, rows)
            ctx.push_rows(table, rows, np.ones(rows.size))
        else:
            ctx.pull(table)
            ctx.push(table, np.ones(40))
        ctx.clock()
    before, after = snaps[STEADY[0]], snaps[STEADY[1]]
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}


@pytest.mark.parametrize("consistency", [dask_ps.BSP(), dask_ps.SSP(1), dask_ps.ESSP(1)], ids=repr)
@pytest.mark.parametrize("use_rows", [False, True])
def test_one_request_per_server_per_clock_and_none_to_the_scheduler(ps, client, consistency, use_rows):
    """Per steady clock a participant sends each server ONE message for its
    pushes and its clock (its own worker's as a direct call; no push of its
    own, no clock report after it), and at most one read, parked at the
    server where it must wait (no separate wait); nothing to the
    scheduler. Before issue 36's one message per server, a clock was a push
    per server, then a clock report per server (two round trips)."""
    ps.create_table("c", shape=(40,), block_rows=20, consistency=consistency)
    servers = {o.worker for o in ps.placement("c")}
    assert len(servers) == 2  # one block on each worker (consistent hashing of 2 blocks over 2)
    n = STEADY[1] - STEADY[0]
    for got in ps.run(_counting, range(2), table="c", use_rows=use_rows):
        assert got.get("scheduler", 0) == 0, got
        assert got.get("clock", 0) + got.get("clock_local", 0) == len(servers) * n, got
        assert got.get("push", 0) + got.get("push_local", 0) == 0, got  # carried by the clock's message
        assert got.get("pull", 0) + got.get("pull_local", 0) <= len(servers) * n, got
        assert got.get("wait", 0) + got.get("wait_local", 0) == 0, got  # a read parks at its server
        assert got.get("bytes_pushed", 0) == 40 * 8 * n // (1 if not use_rows else 2), got
    (run,) = [r for r in ps.metrics().values() if r["participants"]][-1:]
    per_clock = run["participants"][0]["messages_per_clock"]
    assert per_clock.get("clock", 0) + per_clock.get("clock_local", 0) == pytest.approx(len(servers))


def _prefetching(ctx, _, table, wait):
    snaps, seen = {}, []
    rows = np.arange(40)
    ahead = None
    for c in range(CLOCKS):
        got = ctx.pull_rows(table, rows) if ahead is None else ahead.result()
        if c in STEADY:  # after the read its clock's messages carried: every message of clocks <= c counted
            snaps[c] = dict(ctx.metrics()["messages"])
        seen.append(float(got.sum()))
        ctx.push_rows(table, rows[ctx.rank::2], np.ones(20))
        ahead = ctx.prefetch_rows(table, rows, for_clock=c + 1)  # the next clock's read
        ctx.clock(wait=wait)
    before, after = snaps[STEADY[0]], snaps[STEADY[1]]
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}, seen


@pytest.mark.parametrize("consistency", [dask_ps.BSP(), dask_ps.SSP(1)], ids=repr)
@pytest.mark.parametrize("wait", [True, False])
def test_a_read_prefetched_for_the_next_clock_goes_with_the_clock(ps, client, consistency, wait):
    """A participant that prefetches its next clock's read sends each server
    exactly ONE request per steady clock: its pushes there, its clock and
    that read, which the server makes once the clock's bound holds there
    (the reply is the acknowledgement). Each read holds every update of the
    clocks its bound requires and none from a clock nobody reached."""
    ps.create_table("pf", shape=(40,), block_rows=20, consistency=consistency)
    servers = {o.worker for o in ps.placement("pf")}
    assert len(servers) == 2
    n, s = STEADY[1] - STEADY[0], consistency.staleness
    for got, seen in ps.run(_prefetching, range(2), table="pf", wait=wait):
        # (clock_combined: of the clock messages, those combined per process)
        requests = {k: v for k, v in got.items() if not k.startswith("bytes") and k != "clock_combined" and v}
        # One per server per clock (its own worker's, and an in-process
        # cluster's, as direct calls), nothing else.
        assert set(requests) <= {"clock", "clock_local"}, got
        assert sum(requests.values()) == len(servers) * n, got
        for c, total in enumerate(seen):
            # 20 a clock from each: own exactly of the clocks < c (read before
            # its push), the other's at least of the clocks < c - s and at most
            # of the clocks <= c + s (it is never more than s clocks ahead).
            assert 20 * c + 20 * max(0, c - s) <= total <= 20 * c + 20 * (c + s + 1), (c, seen)


def test_a_server_that_joins_a_run_takes_the_clocks_from_a_peer(ps, client):
    """A worker that hears of a run late (not at its start) takes a peer's
    run-wide clocks: sound, since a participant sends a clock's message only
    after the one before was acknowledged everywhere (the clock before the
    last counts run-wide); never the peer's own bound (its claims), which
    covers that peer's blocks only."""
    ps.create_table("j", shape=(4,), consistency=dask_ps.BSP())

    def train(ctx, _):
        for _ in range(3):
            ctx.push("j", np.ones(4))
            ctx.clock()
        # Forget the run on this worker, then hear of it again (as a server
        # that joined mid-run does): its clocks come back from the peer.
        plugin = ctx._plugin
        record = plugin.runs.records.pop(ctx.run_id)
        rec = ctx._sync(plugin.runs.get, ctx.run_id)  # from the scheduler, then the peer's clocks
        import time

        deadline = time.monotonic() + 30  # a wait loop, not a timing assertion
        while min(rec.clocks) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return (record.clocks, record.claims), (rec.clocks, rec.claims)

    if len(client.scheduler_info()["workers"]) < 2:
        pytest.skip("needs two servers")
    for old, new in ps.run(train, range(1)):
        assert tuple(old) == ([2], [3]), old  # 3 clock messages: the last counts here only
        assert new[0] == [2] and not any(new[1]), new


def _bsp_loop(ctx, _, table, clocks):
    got = []
    for c in range(clocks):
        got.append(float(ctx.pull(table).sum()))
        ctx.push(table, np.ones(40))
        ctx.clock()
    return got


def test_bsp_reads_of_replicated_blocks_wait_at_the_primary(ps, client):
    """A read that must wait goes to its blocks' primaries: a replica's copy
    is covered by the run-wide clocks only (a clock message counts there one
    clock later), and under BSP every participant waits in its read for the
    others' clock, so a read parked at a replica would wait for messages
    nobody sends (until ps.timeouts.clock). Each read sees every
    participant's pushes of the clocks before, and at most the other's of
    its clock (own pushes come after the read)."""
    if len(client.scheduler_info()["workers"]) < 2:
        pytest.skip("needs two servers")
    ps.create_table("rb", shape=(40,), block_rows=10, replication=2, consistency=dask_ps.BSP())
    import dask

    with dask.config.set({"ps.timeouts.clock": "20s"}):
        for got in ps.run(_bsp_loop, range(2), table="rb", clocks=6):
            assert all(80.0 * c <= g <= 80.0 * c + 40 for c, g in enumerate(got)), got
