"""Issue 34, item 2: a push over several servers is held at each one
(checked, nothing applied) before any applies it (``_holds.hold``).
A held push reserves its bound: a push that only an exact sum could settle
waits (a retryable error) until the held one is applied or dropped, so the
check a held push passed stays true until its commit."""

from __future__ import annotations

import numpy as np
import pytest

import dask
from dask_ps import PSValueError, StaleVersionError
from dask_ps import _holds
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec

BIG = 1e308


def store():
    spec = TableSpec.create("t", (8,), "float64", block_rows=4, allow_nonfinite=False)
    st = ShardStore()
    st.create(spec, 1, [0, 1])
    return st, st.tables["t"]


def validated(st, blocks, rows, values):
    bounds: dict = {}
    _, items = st.validate_push("t", 1, blocks, rows, values, bounds=bounds)
    return items, bounds


def test_a_held_push_changes_nothing_and_reserves_its_bound():
    st, t = store()
    items, bounds = validated(st, [0], [None], [np.full(4, 2e307)])
    _holds.hold(t, "h1", items, bounds)
    assert (t.blocks[0].data == 0).all() and t.blocks[0].held >= 2e307
    # another push that only an exact sum could settle waits for the held one
    other, ob = validated(st, [0], [None], [np.full(4, BIG)])
    with pytest.raises(StaleVersionError, match="being committed"):
        st.apply(t, other, bounds=ob)
    assert (t.blocks[0].data == 0).all()
    # a small push is settled by the bounds, the held one counted
    small, sb = validated(st, [0], [None], [np.ones(4)])
    st.commit(t, st.apply(t, small, bounds=sb))
    held = _holds.release(t, "h1")
    assert held is not None and t.blocks[0].held == 0
    st.commit(t, st.apply(t, held.items, bounds=held.bounds, check=False))
    np.testing.assert_array_equal(t.blocks[0].data, np.full(4, 2e307 + 1))
    st.commit(t, st.apply(t, other, bounds=ob))  # settled by the exact sum now
    with pytest.raises(PSValueError, match="overflows"):
        st.apply(t, *validated(st, [0], [None], [np.full(4, BIG)])[:1])


def test_a_push_that_would_overflow_is_refused_when_held_and_nothing_is_reserved():
    st, t = store()
    items, bounds = validated(st, [1], [None], [np.full(4, BIG)])
    st.commit(t, st.apply(t, items, bounds=bounds))
    again, ab = validated(st, [0, 1], [None, None], [np.ones(4), np.full(4, BIG)])
    with pytest.raises(PSValueError, match="block 1.*overflows.*nothing was applied"):
        _holds.hold(t, "h2", again, ab)
    assert "h2" not in t.holds and t.blocks[0].held == 0 and t.blocks[1].held == 0


def test_holds_of_a_sender_that_never_commits_expire_and_a_placement_change_drops_them():
    st, t = store()
    items, bounds = validated(st, [0], [None], [np.full(4, BIG)])
    with dask.config.set({"ps.timeouts.failover": "0s"}):
        _holds.hold(t, "gone", items, bounds)
        _holds.hold(t, "next", *validated(st, [1], [None], [np.ones(4)]))
    assert "gone" not in t.holds and t.blocks[0].held == 0
    st.set_placement("t", t.spec.table_id, 2, [["a"], ["a"]], "a")
    assert not t.holds and t.blocks[1].held == 0


def test_a_lease_is_drawn_on_by_one_phase_pushes_and_keeps_room_for_them():
    """After a sender's first two-phase push, a server leases it a bound it
    may push unchecked (``top_up``); pushes within it go in one phase
    (``spend``). Others' pushes keep room for what leases may still add, so
    a push drawn from a lease can never overflow."""
    st, t = store()
    (b0, lease0), (b1, lease1) = _holds.top_up(t, "run-s3cret-0", [0, 1])
    assert (b0, b1) == (0, 1) and lease0 > 1e306 and t.blocks[0].leased == lease0
    items, bounds = validated(st, [0], [None], [np.ones(4)])
    need = _holds.spend(t, "run-s3cret-0", items, bounds, per_clock=False)
    assert need == {0: pytest.approx(2.0)} and t.blocks[0].leased == lease0 - need[0]  # |ones(4)|: 2
    assert _holds.spend(t, "another", items, bounds, per_clock=False) is None  # no lease: checked as usual
    too_big, tb = validated(st, [0], [None], [np.full(4, 1e308)])
    assert _holds.spend(t, "run-s3cret-0", too_big, tb, per_clock=False) is None
    # Another sender pushes near the range: refused where the lease's room would not be left.
    with pytest.raises(PSValueError, match="overflows"):
        st.apply(t, *validated(st, [0], [None], [np.full(4, 1.79e308)])[:1])
    st.commit(t, st.apply(t, *validated(st, [0], [None], [np.full(4, 1.5e308)])[:1]))
    assert np.isfinite(t.blocks[0].data + t.blocks[0].leased).all()
    st.forget_run("run")
    assert not t.leases and t.blocks[0].leased == 0 and t.blocks[1].leased == 0
