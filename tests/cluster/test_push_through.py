"""A participant's large default dense push where nothing of its table is
buffered is written through: sent uncopied and acknowledged before ``push``
returns (``ps.push-through-bytes``), so the caller may write to its array at
once. Smaller pushes, and one that finds the table's buffer in use, are
copied and buffered as before.

Runs on worker processes and in-process workers (``conftest.py``)."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import dask_ps

N = 300_000  # float64: 2.4 MB, over the default threshold (1 MiB)
BLOCK_ROWS = 100_000


def _flushes(ctx, name):
    return ctx.metrics()["tables"].get(name, {}).get("flushes", 0)


def _push_then_overwrite(ctx, _):
    x = np.arange(N, dtype=float)
    ctx.push("w", x)
    sent_at_push = _flushes(ctx, "w")  # acknowledged before push returned
    x[...] = 10**6  # the caller reuses its array at once
    bad = np.ones(N)
    bad[N // 2] = np.nan
    with pytest.raises(dask_ps.PSValueError, match="NaN or Inf"):
        ctx.push("w", bad)  # refused at the call: nothing sent
    refused = _flushes(ctx, "w") - sent_at_push
    # A row push is buffered; the next large push finds the buffer in use: copied, summed.
    ctx.push_rows("w", [0], [5.0])
    y = np.full(N, 2.0)
    ctx.push("w", y)
    buffered = _flushes(ctx, "w") - sent_at_push
    y[...] = -(10**6)
    ctx.clock()
    return sent_at_push, refused, buffered


def test_a_large_default_push_is_sent_before_it_returns(ps):
    ps.create_table("w", shape=(N,), block_rows=BLOCK_ROWS, consistency=dask_ps.ASP())
    ((sent_at_push, refused, buffered),) = ps.run(_push_then_overwrite, [None])
    assert sent_at_push == 1  # was 0: the push waited in the buffer (a copy) until the clock
    assert refused == 0 and buffered == 0
    expected = np.arange(N) + 2.0
    expected[0] += 5.0
    np.testing.assert_array_equal(ps.pull("w"), expected)


def _small_push(ctx, _):
    x = np.arange(N, dtype=float)
    with dask.config.set({"ps.push-through-bytes": "1GiB"}):
        ctx.push("s", x)
    sent = _flushes(ctx, "s")
    x[...] = 10**6
    ctx.clock()
    return sent


def test_under_the_threshold_a_push_is_copied_and_buffered(ps):
    ps.create_table("s", shape=(N,), block_rows=BLOCK_ROWS, consistency=dask_ps.ASP())
    assert ps.run(_small_push, [None]) == [0]
    np.testing.assert_array_equal(ps.pull("s"), np.arange(N, dtype=float))


def _clock_sum_pushes(ctx, _):
    x = np.arange(N, dtype=float)
    ctx.push("c", x)
    sent = _flushes(ctx, "c")
    x[...] = 10**6
    ctx.flush()
    ctx.push("c", np.arange(N) * 10.0)
    ctx.flush()
    got = ctx.pull("c")  # own sent pushes of this clock, which the servers hold back
    ctx.clock()
    return sent, got


@pytest.mark.parametrize("aggregate", ["clock", "push"])
def test_read_my_writes_with_written_through_pushes(ps, aggregate):
    """aggregate="clock" keeps a copy of each sent push until its clock is
    summed everywhere: such a push is buffered (its copy kept), not written
    through; aggregate="push" reads the written-through values."""
    ps.create_table("c", shape=(N,), block_rows=BLOCK_ROWS, aggregate=aggregate, consistency=dask_ps.SSP(0))
    ((sent, got),) = ps.run(_clock_sum_pushes, [None])
    assert sent == (0 if aggregate == "clock" else 1)
    np.testing.assert_array_equal(got, np.arange(N) * 11.0)
    np.testing.assert_array_equal(ps.pull("c"), np.arange(N) * 11.0)
