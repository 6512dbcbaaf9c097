"""Issue 23: a default (copying) dense push copies the caller's array in the
pass of its NaN/Inf check, into the buffer's spare array when it has one;
what it stores is still what the array held when ``push`` returned.

Runs on worker processes and in-process workers (``conftest.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import dask_ps
from dask_ps import _backend

N = 15_000  # over _backend.SMALL: the one-pass copy applies
BLOCK_ROWS = 5_000


def _pushes_then_mutates(ctx, _, dtype):
    """Default pushes whose arrays the caller overwrites right after each
    push, before the flush; a NaN push refused in between. Returns the
    calls of the copy-and-check and of a separate check on the caller's
    arrays, in this participant's process."""
    seen = {"copy_abs_bound": 0, "abs_bound": 0}
    originals = _backend.copy_abs_bound, _backend.abs_bound
    mine = []

    def copy_abs_bound(src, dst):
        seen["copy_abs_bound"] += any(src is m for m in mine)
        return originals[0](src, dst)

    def abs_bound(x):
        seen["abs_bound"] += any(x is m for m in mine)
        return originals[1](x)

    _backend.copy_abs_bound, _backend.abs_bound = copy_abs_bound, abs_bound
    try:
        for k in range(1, 4):  # the first push copies into a fresh array, later ones into the spare
            x = np.arange(N, dtype=dtype) * k
            mine.append(x)
            ctx.push("t", x)
            x[...] = 10**6  # the caller reuses its array at once: the buffer's copy is what is sent
            if k == 2:
                bad = np.ones(N, dtype)
                bad[N - 1] = np.nan
                with pytest.raises(dask_ps.PSValueError, match="NaN or Inf"):
                    ctx.push("t", bad)  # summed into a buffer: refused, the pending push is kept
            ctx.flush()
            if k == 1:
                bad = np.ones(N, dtype)
                bad[0] = np.inf
                mine.append(bad)
                with pytest.raises(dask_ps.PSValueError, match="NaN or Inf"):
                    ctx.push("t", bad)  # empty buffer: refused after its copy into the spare
    finally:
        _backend.copy_abs_bound, _backend.abs_bound = originals
    ctx.clock()
    return seen


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_default_push_copies_in_its_check_and_stores_what_was_pushed(ps, dtype):
    ps.create_table("t", shape=(N,), dtype=dtype, block_rows=BLOCK_ROWS, consistency=dask_ps.ASP())
    (seen,) = ps.run(_pushes_then_mutates, [None], dtype=dtype)
    np.testing.assert_array_equal(ps.pull("t"), np.arange(N, dtype=dtype) * 6)
    # Each pushed array was read once, by the copy that checked it (was: a
    # BLAS check, then the copy); the refused push too.
    assert seen == {"copy_abs_bound": 4, "abs_bound": 0}


def _step_then_mutate(ctx, _):
    x = np.full(N, 2.0)
    ctx.push("s", x)
    x[...] = 10**6
    ctx.push("s", x)  # one step each (a non-additive rule): both copies kept
    x[...] = -1
    ctx.clock()


def test_a_step_rules_pushes_are_copies(ps):
    ps.create_table("s", shape=(N,), block_rows=BLOCK_ROWS, rule="sgd", lr=0.5)
    ps.run(_step_then_mutate, [None])
    np.testing.assert_array_equal(ps.pull("s"), np.full(N, -0.5 * (2.0 + 10**6)))


# --- the buffer's array is reused for the next push's copy only once nothing reads it ------
def _two_flushes_then_read(ctx, _):
    x = np.arange(N, dtype=float)
    ctx.push("c", x)
    ctx.flush()
    ctx.push("c", x * 10)  # copied into the first push's array, were it free again
    ctx.flush()
    got = ctx.pull("c")  # own pushes of this clock, which the servers hold back
    ctx.clock()
    return got


def test_own_pushes_of_a_clock_sum_survive_the_next_push(ps):
    """aggregate="clock": the servers hold a clock's pushes until every
    participant finished it, and the session adds its own sent ones to
    what it reads. Their arrays were reused for the next default push's
    copy, so the read gave 2 x 10x instead of x + 10x."""
    ps.create_table("c", shape=(N,), block_rows=BLOCK_ROWS, aggregate="clock", consistency=dask_ps.SSP(0))
    (got,) = ps.run(_two_flushes_then_read, [None])
    expected = np.arange(N) * 11.0
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(ps.pull("c"), expected)


def _prefetch_then_two_pushes(ctx, _):
    x = np.arange(N, dtype=float)
    handle = ctx.prefetch("p")
    ctx.push("p", x)
    ctx.flush()  # after the prefetch was issued: it may add this push (not applied when read)
    (flight,) = handle.flushes
    ctx.push("p", x * 10)  # must not be copied into the array that flight sent
    sent = np.concatenate([v for items in flight.msgs.values() for _, _, v in sorted(items, key=lambda i: i[0])])
    got = handle.result()
    ctx.flush()
    return sent, got


def test_a_prefetchs_own_pushes_survive_the_next_push(ps):
    ps.create_table("p", shape=(N,), block_rows=N, consistency=dask_ps.SSP(0))
    ((sent, got),) = ps.run(_prefetch_then_two_pushes, [None])
    np.testing.assert_array_equal(sent, np.arange(N))
    np.testing.assert_array_equal(got, np.arange(N) * 11.0)  # as a pull then: both own pushes, once each
    np.testing.assert_array_equal(ps.pull("p"), np.arange(N) * 11.0)
