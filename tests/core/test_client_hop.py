"""The client's blocking hop to its event loop (``_transport.blocking_call``,
behind every ``ParameterServer`` call), without a cluster: from another
thread the coroutine runs on the loop's thread without ``client.sync``, its
result or its error comes back to the caller; a closed loop is refused
without leaving the coroutine unawaited; on the loop's own thread and for an
asynchronous client the call is left to ``client.sync``."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from dask_ps._transport import blocking_call


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


def test_a_closed_loop_raises_and_leaves_no_coroutine():
    loop = asyncio.new_event_loop()
    loop.close()

    async def never():
        raise AssertionError("must not run")

    made = []

    def start():
        made.append(never())
        return made[-1]

    with pytest.raises(RuntimeError):
        blocking_call(_Client(loop), start)
    assert made and made[0].cr_frame is None  # closed: no "coroutine was never awaited"


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
