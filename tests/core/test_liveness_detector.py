"""The scheduler's detector of stopped workers (``_liveness.HungWorkers``)
and a worker's beacon (``_liveness.Beacon``), without a cluster: slow is
not dead (issue 22)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import dask
from distributed.metrics import time as dask_time

from dask_ps._liveness import Beacon, HungWorkers
from dask_ps._scheduler_plugin import SchedulerTableState


def fake_plugin(members, last_seen):
    """What ``HungWorkers`` is handed, as attributes (``watch`` builds it)."""
    workers = {w: SimpleNamespace(last_seen=last_seen[w]) for w in members}
    scheduler = SimpleNamespace(workers=workers, status=SimpleNamespace(name="running"))
    return SimpleNamespace(scheduler=scheduler, members=set(members), retiring=set(), tables={}, creating={},
                           retire=SimpleNamespace(left=lambda w, why: None))


def watch(plugin) -> HungWorkers:
    """A ``HungWorkers`` given the fake's parts; the actions it takes on
    other parts (a call, a repair, a rejoin) are not reached by ``check``
    once ``_fence_out`` is replaced."""
    def unused(*args, **kwargs):
        raise AssertionError("not reached in these tests")

    return HungWorkers(
        scheduler=plugin.scheduler, members=plugin.members, retiring=plugin.retiring, tables=plugin.tables,
        creating=plugin.creating, liveness=None, calls=None, worker_rpc=unused, in_background=unused,
        repair=unused, retiree_left=lambda w, why: plugin.retire.left(w, why), rejoin=unused,
    )


def checked(plugin, beats=None):
    hung = watch(plugin)
    fenced = []
    hung._fence_out = lambda w, reason: fenced.append(w)
    hung.beats.update(beats or {})
    hung.check()
    return fenced


def test_a_worker_whose_event_loop_is_busy_but_whose_beacon_beats_is_not_fenced():
    """Dask's heartbeat of ``a`` is 20 s old (its event loop is busy: a
    compile, an import, a sync handler) but its beacon thread beat just
    now: alive. Before (issue 22) the heartbeat alone decided, and a cold
    first fit fenced healthy workers out after 3 s."""
    now = dask_time()
    plugin = fake_plugin(["a", "b", "c"], {"a": now - 20, "b": now, "c": now})
    assert checked(plugin, beats={"a": now, "b": now, "c": now}) == []


def test_a_stopped_worker_is_fenced_after_the_limit():
    """Neither beacon nor heartbeat for longer than ``ps.timeouts.hung``
    (6 s by default): fenced, where its blocks have other copies."""
    now = dask_time()
    plugin = fake_plugin(["a", "b", "c"], {"a": now - 7, "b": now, "c": now})
    assert checked(plugin, beats={"a": now - 7, "b": now, "c": now}) == ["a"]
    plugin = fake_plugin(["a", "b", "c"], {"a": now - 4, "b": now, "c": now})
    assert checked(plugin, beats={"a": now - 4, "b": now, "c": now}) == []  # 3 s fenced it before
    with dask.config.set({"ps.timeouts.hung": 0}):
        plugin = fake_plugin(["a", "b", "c"], {"a": now - 70, "b": now, "c": now})
        assert checked(plugin, beats={"a": now - 70}) == []


def test_a_copy_being_made_does_not_count_as_another_copy():
    """During a placement change the new owners' copies are not made yet:
    the old holder ``b`` of a block whose other old holder ``a`` was fenced
    out is its last up-to-date copy, and is not fenced out even though the
    new placement lists ``c`` (issue 22: two workers stopped together lost
    blocks)."""
    now = dask_time()
    plugin = fake_plugin(["b", "c", "d"], {"b": now - 10, "c": now, "d": now})
    t = SchedulerTableState(spec=SimpleNamespace(name="w"), spec_msg={}, version=2, owners=[["b", "c"]])
    t.changing_from = [["a", "b"]]
    plugin.tables = {"w": t}
    hung = watch(plugin)
    assert "only up-to-date copy of block 0" in hung._sole_copies("b", silent={"b"})
    assert checked(plugin, beats={"b": now - 10, "c": now, "d": now}) == []
    t.changing_from = None  # adopted: c holds it now
    assert hung._sole_copies("b", silent={"b"}) is None


def test_the_beacon_keeps_beating_while_another_thread_holds_the_event_loop():
    """The beacon's thread runs while another thread is busy in Python
    (the GIL is handed over every few ms): its gaps stay short."""
    beacon = Beacon(period=0.05)
    beacon._stop.clear()
    import threading

    sent = []

    async def fake_beat():  # the thread's tick loop without a scheduler to send to
        import asyncio

        while not beacon._stop.is_set():
            beacon._tick()
            sent.append(1)
            await asyncio.sleep(0.01)

    def run():
        import asyncio

        asyncio.run(fake_beat())

    th = threading.Thread(target=run, daemon=True)
    th.start()
    beacon._thread = th
    beacon.take_gap()
    t0 = time.monotonic()
    x = 0
    while time.monotonic() - t0 < 1.0:  # a pure-Python busy loop in this thread
        x += 1
    gap = beacon.take_gap()
    beacon.stop()
    th.join(2)
    assert len(sent) > 10 and gap < 0.5, (len(sent), gap)


class _GapBeacon:
    """A beacon whose thread went ``gap`` seconds without running, once."""

    running = True

    def __init__(self, gap):
        self._gaps = [gap]

    def take_gap(self):
        return self._gaps.pop() if self._gaps else 0.0


def _pause_guard_after_a_gap(fenced, caplog):
    """A PauseGuard whose beacon missed 5.4 s (more than half the 6 s hung
    limit) and whose scheduler answers ``fenced``; returns (refused at first,
    refused after the answer, the WARNING records)."""
    import asyncio
    import logging

    from dask_ps._exceptions import StaleVersionError
    from dask_ps._liveness import PauseGuard

    async def fenced_out():
        return fenced

    async def main():
        guard = PauseGuard(fenced_out, _GapBeacon(5.4))
        guard.start(period=3600)  # observed by check() only
        refused = []
        for _ in range(2):
            try:
                guard.check()
                refused.append(False)
            except StaleVersionError:
                refused.append(True)
            await asyncio.sleep(0.05)  # the scheduler's answer
        guard.stop()
        return refused

    with caplog.at_level(logging.DEBUG, logger="dask_ps"):
        refused = asyncio.run(main())
    return refused, [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_healthy_worker_that_did_not_run_for_a_while_says_nothing(caplog):
    """A worker unscheduled for 5.4 s on a busy machine but not fenced out
    (the scheduler heard it): it refuses while it asks, then serves again,
    with no warning (issue 35: one appeared during ordinary fits)."""
    refused, warnings_ = _pause_guard_after_a_gap(False, caplog)
    assert refused == [True, False]
    assert warnings_ == []
    assert "did not run for 5.4 s" in caplog.text  # at debug level


def test_a_fenced_out_worker_warns_and_keeps_refusing(caplog):
    refused, warnings_ = _pause_guard_after_a_gap(True, caplog)
    assert refused == [True, True]
    [w] = warnings_
    assert "did not run for 5.4 s and was fenced out" in w.getMessage()


def test_a_retiring_worker_whose_beacon_went_silent_after_its_removal_is_gone():
    """``r`` retires: Dask removed it (not in ``scheduler.workers``) while
    its teardown waits for its evacuation. Its beacon silent past the limit
    means it was killed or stopped: it is gone (``retire.left``), so no
    placement change waits on it (issue 34). Still beating, or not removed
    by Dask yet: nothing happens."""
    now = dask_time()
    for beat, removed, want in [(now - 7, True, ["r"]), (now - 1, True, []), (now - 7, False, [])]:
        plugin = fake_plugin(["a", "b", "c"], {"a": now, "b": now, "c": now})
        plugin.retiring.add("r")
        if not removed:
            plugin.scheduler.workers["r"] = SimpleNamespace(last_seen=beat)
        left = []
        plugin.retire = SimpleNamespace(left=lambda w, why: left.append(w))
        assert checked(plugin, beats={"a": now, "b": now, "c": now, "r": beat}) == []
        assert left == want, (beat, removed)
