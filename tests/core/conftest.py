"""Fixtures of the core tests."""

from __future__ import annotations

import asyncio
import threading

import pytest


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
