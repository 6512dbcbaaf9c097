"""A server's count of the runs' clocks (``_runclocks.RunClocks``, issue 36), without Dask."""

from __future__ import annotations

import asyncio
import math

import pytest

from dask_ps import ClockTimeoutError, PSValueError, RunAbortedError
from dask_ps._runclocks import RunClocks


def _clocks(peer=None, fetched=None, ended=None):
    advances = []

    async def fetch_record(run_id):
        return fetched

    async def fetch_peer(address, run_id):
        return peer

    return RunClocks(fetch_record, fetch_peer, lambda run_id, m: advances.append((run_id, m)), me=lambda: "me",
                     ended=ended), advances


def _record(epoch, done=(), aborted=None, new=True, n=3):
    return {"run_id": "r", "n": n, "epoch": epoch, "done": list(done), "where": {"1": "tcp://w1"},
            "servers": ["me", "peer"], "aborted": aborted, "new": new}


def test_the_minimum_counts_live_participants_and_repeated_reports_once():
    runs, advances = _clocks()
    rec = runs.update(_record(1))
    runs.clock(rec, 0, 2)
    runs.clock(rec, 1, 1)
    assert rec.min_clock == 0 and advances == []
    runs.clock(rec, 2, 1)
    assert rec.min_clock == 1 and advances == [("r", 1)]
    runs.clock(rec, 1, 1)  # a retried participant's repeated report
    runs.clock(rec, 0, 1)  # an older one: the max stays
    assert rec.clocks == [2, 1, 1]
    runs.update(_record(2, done=[1, 2]))  # they left: only rank 0 holds the minimum
    assert rec.min_clock == 2 and advances[-1] == ("r", 2)
    runs.update(_record(3, done=[0, 1, 2]))
    assert rec.min_clock == math.inf


def test_an_older_membership_record_does_not_undo_a_newer_one():
    runs, _ = _clocks()
    rec = runs.update(_record(2, done=[1]))
    runs.update(_record(1, done=[]))  # arrived late (sent in the background)
    assert rec.done == {1} and rec.epoch == 2


def test_reports_from_outside_the_run_change_nothing():
    runs, _ = _clocks()
    rec = runs.update(_record(1))
    for rank, clock in ((-1, 5), (3, 1), (True, 1), (0, -1), (0, 1.5)):
        with pytest.raises(PSValueError, match="run r"):
            runs.clock(rec, rank, clock)
    assert rec.clocks == [0, 0, 0]


def test_a_parked_wait_is_released_by_the_last_report_and_by_an_abort():
    async def main():
        runs, _ = _clocks()
        rec = runs.update(_record(1, n=2))
        waiting = asyncio.ensure_future(runs.wait(rec, 1, timeout=30))
        runs.clock(rec, 0, 1)
        await asyncio.sleep(0)
        assert not waiting.done()  # rank 1 is behind
        runs.clock(rec, 1, 3)
        assert await waiting == 1
        aborted = asyncio.ensure_future(runs.wait(rec, 5, timeout=30))
        await asyncio.sleep(0)
        runs.update(_record(2, n=2, aborted="a participant raised"))
        with pytest.raises(RunAbortedError, match="a participant raised"):
            await aborted
        with pytest.raises(RunAbortedError):  # and every participant's next clock hears of it
            runs.clock(rec, 0, 2)

    asyncio.run(main())


def test_a_wait_that_times_out_names_who_is_behind():
    async def main():
        runs, _ = _clocks()
        rec = runs.update(_record(1, n=2))
        runs.clock(rec, 0, 1)
        with pytest.raises(ClockTimeoutError, match="participant 1 at clock 0 on tcp://w1"):
            await runs.wait(rec, 1, timeout=0.05)
        assert rec.waiters == []

    asyncio.run(main())


def test_a_server_that_hears_of_a_run_late_takes_a_peers_clocks_and_a_readers_floor():
    async def main():
        ended = set()  # the plugin's list of runs ended here
        runs, advances = _clocks(peer={"clocks": [4, 3, 5], "min": 3}, fetched=_record(7, new=False), ended=ended)
        rec = await runs.get("r")  # unknown here: from the scheduler, then the peer's clocks
        for _ in range(10):
            await asyncio.sleep(0)
        assert rec.clocks == [4, 3, 5] and rec.min_clock == 3 and advances[-1] == ("r", 3)
        runs.note_floor("r", 4)  # a reader learnt 4 from another server
        assert rec.min_clock == 4
        ended.add("r")  # ps_run_end
        runs.end("r")
        assert runs.update(_record(8)) is None  # a late record does not bring it back
        with pytest.raises(RunAbortedError, match="has ended"):
            await runs.get("r")

    asyncio.run(main())


def test_a_clock_message_counts_here_for_this_servers_blocks_and_run_wide_one_clock_behind():
    """A combined message (pushes + clock ``c``) counts ``c`` for the blocks
    this server is the primary of, under the placement versions it was sent
    with, and ``c - 1`` run-wide (the message before was acknowledged
    everywhere); progress (an SSP participant's pace) counts ``c``."""
    runs, advances = _clocks()
    rec = runs.update(_record(1, n=2))
    runs.claim(rec, 0, 3, {"t": 5})
    runs.claim(rec, 1, 3, {"t": 5, "u": 1})
    assert rec.clocks == [2, 2] and rec.min_clock == 2  # run-wide: one behind
    assert rec.progress() == 3
    assert rec.bound("t", 5) == 3 and rec.bound("u", 1) == 3  # rank 0 holds no handle of "u": no pushes there
    assert rec.bound("t", 6) == 2  # a block moved since: its new primary counts the claims run-wide
    runs.claim(rec, 0, 2, {"t": 6})  # an older message: nothing changes
    assert rec.claims == [3, 3] and rec.claim_versions[0] == {"t": 5}
    runs.clock(rec, 0, 3)  # its clock reported run-wide (after a placement change): counts everywhere
    assert rec.bound("t", 6) == 2 and rec.min_clock == 2  # rank 1 still one behind run-wide
    runs.clock(rec, 1, 3)
    assert rec.bound("t", 6) == 3 and rec.min_clock == 3 and advances[-1] == ("r", 3)
    assert runs.info()["r"]["clocks"] == [3, 3] and runs.info()["r"]["run_wide"] == [3, 3]
    with pytest.raises(PSValueError, match="versions"):
        runs.claim(rec, 0, 4, None)


def test_reads_parked_on_a_servers_bound_wake_with_the_last_clock_message():
    async def go():
        runs, _ = _clocks()
        rec = runs.update(_record(1, n=2))
        read = asyncio.ensure_future(runs.wait(rec, 1, 5, measure=lambda r: r.bound("t", 1)))
        runs.claim(rec, 0, 1, {"t": 1})
        await asyncio.sleep(0)
        assert not read.done()
        runs.claim(rec, 1, 1, {"t": 1})
        assert await read == 1 and rec.min_clock == 0  # here, not run-wide yet
        with pytest.raises(ClockTimeoutError, match="participant 1 at clock 1"):
            await runs.wait(rec, 2, 0.05, measure=lambda r: r.progress())

    asyncio.run(go())


def test_a_parked_wait_takes_the_other_servers_run_wide_clocks_after_the_resync_period():
    """A read parked on a participant's clock this server never heard
    (its worker did not list this server yet) is answered from the clocks
    the other servers count run-wide (ps.timeouts.clock-resync), asked
    again each period; a peer that never answers holds no later round up,
    and a wait without the resync stays parked."""
    async def main():
        calls = []
        answers = [None, {"clocks": [1, 2], "min": 1}]  # the first round: the peer hangs

        async def fetch_peer(address, run_id):
            calls.append(address)
            got = answers.pop(0) if answers else {"clocks": [1, 2], "min": 1}
            if got is None:
                await asyncio.Event().wait()  # never answers
            return got

        runs = RunClocks(None, fetch_peer, lambda run_id, m: None, me=lambda: "me", resync=lambda: 0.02)
        rec = runs.update(_record(1, n=2))  # new: all clocks 0 here
        runs.claim(rec, 0, 2, {"t": 1})  # rank 0's messages came here; rank 1's never did
        assert await runs.wait(rec, 1, timeout=30, measure=lambda r: r.bound("t", 1)) == 2
        assert rec.clocks == [1, 2] and calls == ["peer", "peer"] and rec.waiters == []

        quiet = RunClocks(None, fetch_peer, lambda run_id, m: None, me=lambda: "me")  # resync 0: never asks
        rec = quiet.update(_record(1, n=2))
        with pytest.raises(ClockTimeoutError, match="participant 0 at clock 0"):
            await quiet.wait(rec, 1, timeout=0.2)
        assert calls == ["peer", "peer"]

    asyncio.run(main())


def test_a_clock_timeout_is_the_servers_answer_not_a_connection_to_retry():
    """ClockTimeoutError is a TimeoutError, hence an OSError, which the
    transport retried as a lost connection: a stalled run's clock message
    was sent again and waited ``ps.timeouts.clock`` a second time (6.0 s
    at 3 s, in both layouts) before it raised."""
    from dask_ps._exceptions import ClockTimeoutError, StaleVersionError
    from dask_ps._transport import _retryable

    assert isinstance(ClockTimeoutError("behind"), OSError)
    assert not _retryable(ClockTimeoutError("behind"))
    assert _retryable(OSError("connection refused")) and _retryable(StaleVersionError("t", "dropped"))
