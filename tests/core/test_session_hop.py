"""A session's blocking hop to the worker's event loop (``Session._sync``),
without a cluster: the coroutine runs on the loop's thread, its result or
its error comes back to the caller, and a closed loop is refused without
leaving the coroutine unawaited."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from dask_ps._session import Session


class _Loop:
    def __init__(self, asyncio_loop):
        self.asyncio_loop = asyncio_loop


def _session_on(loop) -> Session:
    s = Session.__new__(Session)  # only what _sync uses
    s.worker = types.SimpleNamespace(loop=_Loop(loop))
    s._blocked_seconds = 0.0
    s.run_id, s.rank, s.n_participants, s._clock = "run", 0, 1, 0  # for its repr
    return s


def test_sync_runs_on_the_loop_and_returns_or_raises(running_loop):
    s = _session_on(running_loop)

    async def where(x):
        await asyncio.sleep(0)
        return x, threading.get_ident(), asyncio.get_running_loop()

    value, thread, loop = s._sync(where, 7)
    assert value == 7 and thread != threading.get_ident() and loop is running_loop
    assert s._blocked_seconds > 0

    class Refused(Exception):
        pass

    async def fails():
        raise Refused("at the caller")

    with pytest.raises(Refused, match="at the caller"):
        s._sync(fails)


def test_sync_on_a_closed_loop_raises_and_leaves_no_coroutine():
    loop = asyncio.new_event_loop()
    loop.close()
    s = _session_on(loop)

    async def never():
        raise AssertionError("must not run")

    made = []

    def start():
        made.append(never())
        return made[-1]

    with pytest.raises(RuntimeError):
        s._sync(start)
    assert made and made[0].cr_frame is None  # closed: no "coroutine was never awaited"


def test_sync_from_the_loops_own_thread_is_refused_not_a_deadlock(running_loop):
    s = _session_on(running_loop)

    async def inner():
        return 1

    async def call_blocking_from_the_loop():
        with pytest.raises(RuntimeError, match="event loop thread"):
            s._sync(inner)
        return "refused"

    fut = asyncio.run_coroutine_threadsafe(call_blocking_from_the_loop(), running_loop)
    assert fut.result(timeout=5) == "refused"
