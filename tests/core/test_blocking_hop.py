"""The blocking hops to an event loop, without a cluster: a session's to
its worker's (``Session._sync``) and the client's to its own
(``_transport.blocking_call``, behind every ``ParameterServer`` call).

From another thread the coroutine runs on the loop's thread (the client's
without ``client.sync``), its result or its error comes back to the caller;
a closed loop is refused without leaving the coroutine unawaited; a
session's call from its loop's own thread is refused (it would wait on
itself), and the client leaves that case and asynchronous clients to
``client.sync``."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from dask_ps._participant_state import ParticipantClock
from dask_ps._session import Session
from dask_ps._transport import blocking_call


@pytest.fixture
def running_loop():
    """An asyncio loop running in a thread of its own (a worker's or a client's loop, without Dask)."""
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)
    loop.close()


class _Loop:
    def __init__(self, asyncio_loop):
        self.asyncio_loop = asyncio_loop


def _session_on(loop) -> Session:
    s = Session.__new__(Session)  # only what _sync uses
    s.worker = types.SimpleNamespace(loop=_Loop(loop))
    s._blocked_seconds = 0.0
    s.run_id, s.rank, s.n_participants, s._clk = "run", 0, 1, ParticipantClock()  # for its repr
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


class _Client:
    """What ``blocking_call`` uses of a ``distributed.Client``; ``sync`` records its calls."""

    def __init__(self, loop, asynchronous=False):
        self.loop = types.SimpleNamespace(asyncio_loop=loop)
        self.asynchronous = asynchronous
        self.synced = []

    def sync(self, fn, *args, **kwargs):
        self.synced.append(fn)
        return "client.sync"


def test_runs_on_the_loop_and_returns_or_raises_without_client_sync(running_loop):
    client = _Client(running_loop)

    async def where(x, y=0):
        await asyncio.sleep(0)
        return x + y, threading.get_ident(), asyncio.get_running_loop()

    value, thread, loop = blocking_call(client, where, 7, y=1)
    assert value == 8 and thread != threading.get_ident() and loop is running_loop

    class Refused(Exception):
        pass

    async def fails():
        raise Refused("at the caller")

    with pytest.raises(Refused, match="at the caller"):
        blocking_call(client, fails)

    # An awaitable that is not a coroutine (as some rpc calls return) is awaited too.
    class Awaitable:
        def __await__(self):
            yield from asyncio.sleep(0).__await__()
            return threading.get_ident()

    assert blocking_call(client, Awaitable) == thread
    assert client.synced == []


def test_the_loops_own_thread_and_asynchronous_clients_go_through_client_sync(running_loop):
    client = _Client(running_loop)

    async def inner():
        return 1

    async def from_the_loop():
        return blocking_call(client, inner)  # waiting here would deadlock: client.sync decides

    assert asyncio.run_coroutine_threadsafe(from_the_loop(), running_loop).result(5) == "client.sync"
    async_client = _Client(running_loop, asynchronous=True)
    assert blocking_call(async_client, inner) == "client.sync"
    assert client.synced == [inner] and async_client.synced == [inner]


@pytest.mark.parametrize("hop", ["session", "client"])
def test_a_closed_loop_raises_and_leaves_no_coroutine(hop):
    loop = asyncio.new_event_loop()
    loop.close()

    async def never():
        raise AssertionError("must not run")

    made = []

    def start():
        made.append(never())
        return made[-1]

    with pytest.raises(RuntimeError):
        if hop == "session":
            _session_on(loop)._sync(start)
        else:
            blocking_call(_Client(loop), start)
    assert made and made[0].cr_frame is None  # closed: no "coroutine was never awaited"
