"""Issue 23: a dense push is read once for its NaN/Inf check and its
overflow check together.

A session checks its push for NaN/Inf and, in the same pass, finds a bound
of its magnitudes, which it sends with the internal token; the servers'
overflow check of the sum (issue 22) takes it instead of a pass of its own,
and a primary forwards it to the replicas. A client's push is checked
again by the server (it is not trusted), in one pass that finds the bound
too. Overflows are still refused with nothing changed, on every copy."""

from __future__ import annotations

import os

import numpy as np
import pytest

import dask_ps
from dask_ps import _backend
from dask_ps._exceptions import InternalOnlyError

BIG = 1e308
N, BLOCK_ROWS = 15_000, 5_000  # three blocks, each larger than _backend.SMALL (4096)


# --- counting the passes over pushed values, in every process of the cluster -------------
def _install_counter(dask_worker=None):
    if getattr(_backend, "_test_passes", None) is not None:
        return  # in-process workers share this module
    # copy_abs_bound: a default push's copy that checks as it copies (one pass)
    originals = (_backend.abs_bound, _backend.all_finite, _backend.copy_abs_bound)
    _backend._test_passes = {"n": 0, "originals": originals}

    def counted(f):
        def g(x, *more):
            if getattr(x, "size", 0) >= BLOCK_ROWS:  # a block or more: pushed values
                _backend._test_passes["n"] += 1
            return f(x, *more)
        return g

    _backend.abs_bound, _backend.all_finite, _backend.copy_abs_bound = (counted(f) for f in originals)


def _take_count(dask_worker=None):
    state = _backend._test_passes
    n, state["n"] = state["n"], 0
    return os.getpid(), n


def _uninstall_counter(dask_worker=None):
    state = getattr(_backend, "_test_passes", None)
    if state is not None:
        _backend.abs_bound, _backend.all_finite, _backend.copy_abs_bound = state["originals"]
        _backend._test_passes = None


def _passes(client) -> int:
    """Passes over pushed values since the last call, in the client's
    process and every worker's (in-process workers are one process)."""
    # Each call takes what its process counted (in-process workers: the first takes it all).
    return sum(n for _, n in client.run(_take_count).values()) + _take_count()[1]


@pytest.fixture
def passes(client):
    _install_counter()
    client.run(_install_counter)
    try:
        yield lambda: _passes(client)
    finally:
        client.run(_uninstall_counter)
        _uninstall_counter()


def _push_once(ctx, _):
    ctx.push("p", np.full(N, 1.0))
    ctx.flush()


def test_a_participants_dense_push_is_read_once_by_all_checks(ps, client, passes):
    """Before: the session's NaN/Inf check, then each block's overflow check
    on the primary and again on its replica (1 + 3 + 3 passes)."""
    ps.create_table("p", shape=(N,), block_rows=BLOCK_ROWS, replication=2, allow_nonfinite=False)
    ps.run(_push_once, [None])  # the blocks' own bounds are measured once, at the first push
    passes()
    ps.run(_push_once, [None])
    assert passes() == 1
    np.testing.assert_array_equal(ps.pull("p"), np.full(N, 2.0))


@pytest.mark.parametrize("block_rows", [N, BLOCK_ROWS], ids=["one-block", "three-blocks"])
def test_a_client_dense_push_is_read_once_by_the_servers_checks(ps, client, passes, block_rows):
    """Before: the client's check, then the server's NaN/Inf check and its
    overflow check of each block, and the replicas' overflow checks (1 +
    3 x 3 passes for three blocks, 1 + 3 for one). Now one pass per block on
    its primary, plus the client's own check when the blocks may go to
    several servers (one block: the server refuses a NaN whole, see below)."""
    ps.create_table("p", shape=(N,), block_rows=block_rows, replication=2, allow_nonfinite=False)
    ps.push("p", np.full(N, 1.0))
    passes()
    ps.push("p", np.full(N, 2.0))
    n_blocks = N // block_rows
    assert passes() == (1 if n_blocks == 1 else 1 + n_blocks)
    np.testing.assert_array_equal(ps.pull("p"), np.full(N, 3.0))


def _push_big(ctx, _, flushes):
    """``flushes`` pushes of BIG, flushed as told; the errors raised."""
    errors = []
    for flush in flushes:
        try:
            ctx.push("o", np.full(N, BIG))
            if flush:
                ctx.flush()
        except dask_ps.PSValueError as e:
            errors.append(str(e))
    ctx.clock()
    return errors


def _copies(name, dask_worker=None):
    t = dask_worker.extensions["ps"].store.tables.get(name)
    return {} if t is None else {b: blk.data.copy() for b, blk in t.blocks.items()}


@pytest.mark.parametrize("flushes", [(True, True), (False, True)], ids=["two-flushes", "summed-in-the-buffer"])
def test_a_large_participant_push_whose_sum_overflows_is_refused(ps, client, flushes):
    """The bound a session sends still lets the servers (and the session's
    own check of pushes summed in its buffer) refuse a sum that overflows;
    every copy keeps its value."""
    ps.create_table("o", shape=(N,), block_rows=BLOCK_ROWS, replication=2, allow_nonfinite=False)
    (errors,) = ps.run(_push_big, [None], flushes=flushes)
    assert len(errors) == 1 and "'o'" in errors[0] and ("overflow" in errors[0]), errors
    expected = np.full(N, BIG) if flushes == (True, True) else np.zeros(N)
    np.testing.assert_array_equal(ps.pull("o"), expected)
    for copies in client.run(_copies, "o").values():
        for b, data in copies.items():
            np.testing.assert_array_equal(data, expected[BLOCK_ROWS * b:BLOCK_ROWS * (b + 1)])


def test_a_bound_from_outside_the_cluster_is_refused(ps, client):
    """A bound below the values' would let a sum overflow past the check:
    only the cluster's own callers (with the internal token) may send one."""
    ps.create_table("p", shape=(N,), block_rows=N, allow_nonfinite=False)
    h = ps._handle("p")
    from distributed.protocol.serialize import to_serialize

    with pytest.raises(InternalOnlyError, match="bound"):
        client.sync(client.rpc(h.primary(0)).ps_push, table="p", version=h.version, table_id=h.spec.table_id,
                    blocks=[0], rows=[None], values=[to_serialize(np.full(N, BIG))], bound=0.0)
    np.testing.assert_array_equal(ps.pull("p"), np.zeros(N))


@pytest.mark.parametrize("block_rows", [N, BLOCK_ROWS], ids=["one-block", "three-blocks"])
def test_a_client_push_with_nan_is_refused_whole(ps, client, passes, block_rows):
    """One block: the client leaves the NaN/Inf check to its server, which
    refuses the message whole (one pass, there; was two: the client's and
    the server's). Several blocks: the client checks before sending any.
    Either way the caller gets the error and no copy changes."""
    ps.create_table("p", shape=(N,), block_rows=block_rows, replication=2, allow_nonfinite=False)
    ps.push("p", np.full(N, 1.0))
    passes()
    bad = np.full(N, 2.0)
    bad[-1] = np.nan
    with pytest.raises(dask_ps.PSValueError, match="'p'.*NaN or Inf"):
        ps.push("p", bad)
    assert passes() == 1
    np.testing.assert_array_equal(ps.pull("p"), np.ones(N))
    for copies in client.run(_copies, "p").values():
        for b, data in copies.items():
            np.testing.assert_array_equal(data, np.ones(block_rows))
