"""The clock combiner's core (dask_ps._clock_combiner), without a cluster:
sections handed in by the participants of a process, one send per
(server, clock), handed a fake ``send``."""

from __future__ import annotations

import asyncio

import pytest

from dask_ps import _clock_combiner
from dask_ps._clock_combiner import ClockCombiner, answer_sections
from dask_ps._exceptions import PSValueError, RunEndedError


class FakeServer:
    """Records every combined message; answers each section with its rank
    and clock, or fails the whole message / one section."""

    def __init__(self, fail=None, refuse_rank=None):
        self.sent: list[tuple[str, list]] = []
        self.fail, self.refuse_rank = fail, refuse_rank

    async def send(self, addr, sections, seconds):
        self.sent.append((addr, [(s["rank"], s["clock"]) for s in sections]))
        if self.fail is not None:
            raise self.fail

        async def one(rank, clock):
            if rank == self.refuse_rank:
                raise RunEndedError(f"refused {rank}")
            return {"rank": rank, "clock": clock}

        return await answer_sections(sections, one)


def _hand(c, server, addr, clock, rank):
    return asyncio.ensure_future(c.clock(server.send, addr, clock, rank, {"rank": rank, "clock": clock}, 1.0))


def test_siblings_in_the_same_clock_go_as_one_message_per_server():
    async def main():
        c, server = ClockCombiner(window=60), FakeServer()
        for r in range(3):
            c.join(r, 0)
        tasks = [_hand(c, server, a, 1, r) for r in range(3) for a in ("x", "y")]
        await asyncio.sleep(0)
        assert server.sent == [] or len(server.sent) < 2  # not before the last sibling handed in
        replies = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert sorted(server.sent) == [("x", [(0, 1), (1, 1), (2, 1)]), ("y", [(0, 1), (1, 1), (2, 1)])]
        assert [(r["rank"], r["clock"]) for r in replies] == [(r, 1) for r in range(3) for _ in "xy"]

    asyncio.run(main())


def test_a_sibling_ahead_or_behind_is_not_waited_for():
    async def main():
        c, server = ClockCombiner(window=60), FakeServer()
        c.join(0, 4)  # at clock 4: its next section is clock 5
        c.join(1, 2)  # two clocks behind (SSP lets it lag)
        c.join(2, 5)  # handed in clock 5 already
        assert await asyncio.wait_for(_hand(c, server, "x", 5, 0), 5) == {"rank": 0, "clock": 5}
        assert server.sent == [("x", [(0, 5)])]

    asyncio.run(main())


def test_the_window_bounds_the_wait_for_a_slow_sibling():
    async def main():
        c, server = ClockCombiner(window=0.05), FakeServer()
        c.join(0, 0)
        c.join(1, 0)  # in the same clock, never hands in
        assert await asyncio.wait_for(_hand(c, server, "x", 1, 0), 5) == {"rank": 0, "clock": 1}
        assert server.sent == [("x", [(0, 1)])]

    asyncio.run(main())


def test_a_sibling_that_leaves_or_passes_its_clock_releases_the_others():
    async def main():
        c, server = ClockCombiner(window=600), FakeServer()
        for r in range(3):
            c.join(r, 0)
        t0 = _hand(c, server, "x", 1, 0)
        await asyncio.sleep(0.01)
        assert not t0.done()
        c.leave(1)  # ended or failed
        await asyncio.sleep(0.01)
        assert not t0.done()  # still waits for 2
        c.passed(2, 1)  # sent its clock 1 as pushes: no section of it comes
        assert await asyncio.wait_for(t0, 5) == {"rank": 0, "clock": 1}
        assert server.sent == [("x", [(0, 1)])]

    asyncio.run(main())


def test_a_refused_section_fails_its_participant_only_and_a_failed_message_all():
    async def main():
        c, server = ClockCombiner(window=60), FakeServer(refuse_rank=1)
        c.join(0, 0)
        c.join(1, 0)
        t0, t1 = _hand(c, server, "x", 1, 0), _hand(c, server, "x", 1, 1)
        assert await asyncio.wait_for(t0, 5) == {"rank": 0, "clock": 1}
        with pytest.raises(RunEndedError, match="refused 1"):
            await t1
        server2 = FakeServer(fail=OSError("connection lost"))
        t0, t1 = _hand(c, server2, "x", 2, 0), _hand(c, server2, "x", 2, 1)
        for t in (t0, t1):
            with pytest.raises(OSError, match="connection lost"):
                await asyncio.wait_for(t, 5)
        assert server2.sent == [("x", [(0, 2), (1, 2)])]

    asyncio.run(main())


def test_a_cancelled_section_is_not_sent():
    async def main():
        c, server = ClockCombiner(window=600), FakeServer()
        c.join(0, 0)
        c.join(1, 0)
        t0 = _hand(c, server, "x", 1, 0)
        await asyncio.sleep(0.01)
        t0.cancel()  # its participant failed (InFlight.abandon)
        await asyncio.sleep(0.01)
        assert await asyncio.wait_for(_hand(c, server, "x", 1, 1), 5) == {"rank": 1, "clock": 1}
        assert server.sent == [("x", [(1, 1)])]

    asyncio.run(main())


def test_answer_sections_refuses_what_is_not_a_list_of_messages():
    async def one(**_):
        return None

    with pytest.raises(PSValueError, match="sections must be a list"):
        asyncio.run(answer_sections("nope", one))
    with pytest.raises(PSValueError, match="sections must be a list"):
        asyncio.run(answer_sections([1, 2], one))


def test_the_participants_of_a_run_in_a_process_share_one_combiner():
    first = _clock_combiner.acquire("run-cc-x", 0.01)
    assert _clock_combiner.acquire("run-cc-x", 0.01) is first
    assert _clock_combiner.acquire("run-cc-y", 0.01) is not first


def test_the_most_impatient_section_sets_when_the_message_goes():
    """A section under BSP may wait long (its next read waits for every
    sibling anyway); one of a sibling SSP lets lag may not: the message
    goes at the earliest deadline of its sections."""
    assert _clock_combiner.window_for(0, 0.02, 300) == 300
    assert _clock_combiner.window_for(2, 0.02, 300) == 0.02
    assert _clock_combiner.window_for(None, 0.02, 300) == 0.02

    async def main():
        c, server = ClockCombiner(window=600), FakeServer()
        for r in range(3):
            c.join(r, 0)
        t0 = asyncio.ensure_future(c.clock(server.send, "x", 1, 0, {"rank": 0, "clock": 1}, 1.0, window=600))
        t1 = asyncio.ensure_future(c.clock(server.send, "x", 1, 1, {"rank": 1, "clock": 1}, 1.0, window=0.05))
        await asyncio.wait_for(asyncio.gather(t0, t1), 5)  # rank 2 never hands in
        assert server.sent == [("x", [(0, 1), (1, 1)])]

    asyncio.run(main())


def test_the_schedulers_record_releases_sections_of_done_and_aborted_runs():
    """A participant the run's record says is done (left, failed, perhaps
    without reaching its session's leave) is waited for no more; once the
    run is aborted every section goes at once (its server refuses it)."""

    async def main():
        c = _clock_combiner.acquire("run-cc-abort", 600)
        server = FakeServer()
        for r in range(3):
            c.join(r, 0)
        t0 = _hand(c, server, "x", 1, 0)
        await asyncio.sleep(0.01)
        _clock_combiner.run_changed("run-cc-abort", done=[1], aborted=False)
        await asyncio.sleep(0.01)
        assert not t0.done()  # still waits for 2
        _clock_combiner.run_changed("run-cc-abort", done=[1], aborted=True)
        assert await asyncio.wait_for(t0, 5) == {"rank": 0, "clock": 1}
        assert server.sent == [("x", [(0, 1)])]
        _clock_combiner.run_changed("run-not-here", done=[0], aborted=True)  # no combiner: nothing to do

    asyncio.run(main())
