"""Issue 22: a push of finite values whose result overflows (1e308 pushed
twice) stored ``inf`` in an ``allow_nonfinite=False`` table: the inputs were
checked, the sum was not. ``ShardStore`` now refuses such a push like a
non-finite input, names the table, and changes nothing (values, rule state,
sequence numbers, pending per-clock sums)."""

from __future__ import annotations

import numpy as np
import pytest

from dask_ps import PSValueError
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec

BIG = 1e308


def store_with(n=8, block_rows=4, **kw):
    spec = TableSpec.create("t", (n,), "float64", block_rows=block_rows, allow_nonfinite=False, **kw)
    st = ShardStore()
    st.create(spec, 1, list(range(spec.n_blocks)))
    return st, st.tables["t"]


def push(st, t, blocks, rows, values, **kw):
    _, items = st.validate_push("t", 1, blocks, rows, values)
    st.commit(t, st.apply(t, items, **kw))


def snapshot(t):
    return {b: (blk.data.copy(), {k: v.copy() for k, v in blk.state.items()}, blk.seq) for b, blk in t.blocks.items()}


def assert_unchanged(t, before):
    for b, (data, state, seq) in before.items():
        blk = t.blocks[b]
        np.testing.assert_array_equal(blk.data, data)
        assert blk.seq == seq
        for k, v in state.items():
            np.testing.assert_array_equal(blk.state[k], v)


@pytest.mark.parametrize("rows", [None, [1, 3], np.array([0, 2])], ids=["dense", "range", "rows"])
def test_a_sum_that_overflows_is_refused_and_changes_nothing(rows):
    st, t = store_with()
    n = 4 if rows is None else 2
    push(st, t, [0, 1], [rows, None], [np.full(n, BIG), np.ones(4)])
    before = snapshot(t)
    # Block 1's part is fine, block 0's overflows: the whole message is refused.
    with pytest.raises(PSValueError, match="'t'.*block 0.*overflows"):
        push(st, t, [1, 0], [None, rows], [np.ones(4), np.full(n, BIG)])
    assert_unchanged(t, before)
    assert np.isfinite(t.blocks[0].data).all()
    push(st, t, [0], [rows], [np.full(n, -BIG)])  # away from the edge: applied
    assert (t.blocks[0].data == 0).all()


def test_a_sum_near_the_range_that_stays_finite_is_applied():
    st, t = store_with()
    push(st, t, [0], [None], [np.full(4, BIG)])
    push(st, t, [0], [None], [np.full(4, 7e307)])  # 1.7e308 < max: the bounds fail, the exact sum passes
    np.testing.assert_array_equal(t.blocks[0].data, np.full(4, 1.7e308))


def test_a_block_twice_in_one_message_is_checked_as_a_whole():
    st, t = store_with()
    before = snapshot(t)
    with pytest.raises(PSValueError, match="overflows"):
        push(st, t, [0, 0], [None, None], [np.full(4, BIG), np.full(4, BIG)])
    assert_unchanged(t, before)


@pytest.mark.parametrize("rows", [None, [0, 2]], ids=["dense", "rows"])
@pytest.mark.parametrize("rule,kw,grad", [
    ("sgd", {"lr": 1.0}, -BIG),  # the values overflow
    ("momentum", {"lr": 1.0, "momentum": 0.5}, -BIG),
    ("adagrad", {"lr": 1.0}, 1e154),  # the sum of squared gradients (the rule's state) overflows
])
def test_an_optimizer_step_that_overflows_is_refused_and_its_state_put_back(rule, kw, grad, rows):
    st, t = store_with(rule=rule, **kw)
    n = 4 if rows is None else 2
    push(st, t, [0], [rows], [np.full(n, grad)])
    before = snapshot(t)
    with pytest.raises(PSValueError, match="'t'.*NaN or Inf"):
        push(st, t, [0], [rows], [np.full(n, grad)])
    assert_unchanged(t, before)


def test_a_custom_rule_whose_result_overflows_is_refused():
    def double(param, update, state):
        state["calls"] = np.array([1.0])
        param *= 2
        param += update

    st, t = store_with(rule=double)
    push(st, t, [0], [None], [np.full(4, BIG)])
    before = snapshot(t)
    with pytest.raises(PSValueError, match="'t'"):
        push(st, t, [0], [None], [np.full(4, 1.0)])
    assert_unchanged(t, before)


def test_the_error_names_the_block_that_went_bad_and_says_other_servers_may_have_applied():
    """The put-back loop rebound the block: a bad block 1 was reported as
    block 0, and the message said "nothing was applied" where a rule
    other than sum is checked per server."""
    st, t = store_with(rule="sgd", lr=1.0)
    push(st, t, [1], [None], [np.full(4, -BIG)])
    before = snapshot(t)
    with pytest.raises(PSValueError, match=r"block 1's values NaN or Inf \(rule 'sgd'\).*other servers"):
        push(st, t, [0, 1], [None, None], [np.full(4, 1.0), np.full(4, -BIG)])
    assert_unchanged(t, before)


@pytest.mark.parametrize("allow_nonfinite", [False, True])
def test_a_custom_rule_that_raises_midway_is_put_back(allow_nonfinite):
    """A callable that raised on block 1 left block 0 applied on the same
    server (nothing was checked where the table allows NaN/Inf)."""
    def picky(param, update, state):
        if (update > 5).any():
            raise ValueError("too big")
        state["calls"] = state.get("calls", 0) + 1
        param += update

    spec = TableSpec.create("t", (8,), "float64", block_rows=4, allow_nonfinite=allow_nonfinite, rule=picky)
    st = ShardStore()
    st.create(spec, 1, [0, 1])
    t = st.tables["t"]
    before = snapshot(t)
    with pytest.raises(ValueError, match="too big"):
        push(st, t, [0, 1], [None, None], [np.full(4, 1.0), np.full(4, 10.0)])
    assert_unchanged(t, before)
    assert all("calls" not in blk.state for blk in t.blocks.values())
    push(st, t, [0, 1], [None, None], [np.full(4, 1.0), np.full(4, 2.0)])
    np.testing.assert_array_equal(np.concatenate([t.blocks[0].data, t.blocks[1].data]), [1.0] * 4 + [2.0] * 4)


def test_the_assign_rule_and_tables_that_allow_nonfinite_are_not_checked():
    st, t = store_with(rule="assign")
    push(st, t, [0], [None], [np.full(4, BIG)])
    push(st, t, [0], [None], [np.full(4, BIG)])
    spec = TableSpec.create("u", (4,), "float64", allow_nonfinite=True)
    st.create(spec, 1, [0])
    _, items = st.validate_push("u", 1, [0], [None], [np.full(4, BIG)])
    for _ in range(2):
        st.commit(st.tables["u"], st.apply(st.tables["u"], items))
    assert np.isinf(st.tables["u"].blocks[0].data).all()


@pytest.mark.parametrize("rule", ["sum", "sgd"])
def test_a_per_clock_sum_that_would_overflow_is_refused_when_pushed(rule):
    """aggregate="clock": the sums are applied when the clock completes, long
    after the push was acknowledged, so the push is refused at once if its
    clock's sum (with the stored rows, for rule "sum") would overflow."""
    st, t = store_with(aggregate="clock", rule=rule, **({"lr": 1.0} if rule == "sgd" else {}))
    _, items = st.validate_push("t", 1, [0], [None], [np.full(4, BIG)])
    st.accumulate(t, "r", 0, items, "r-0")
    # each sender's pushes as pushed: [(rows, values), ...]
    pending = {k: {b: {s: [(r, a.copy()) for r, a in pushes] for s, pushes in acc.items()} for b, acc in v.items()}
               for k, v in t.pending.items()}
    for clock, sender in ((0, "r-1"), (0, "r-0"), (1, "r-1")):  # another's, its own, a later clock's
        with pytest.raises(PSValueError, match="'t'.*clock"):
            st.accumulate(t, "r", clock, items, sender)
        assert set(t.pending) == set(pending)
        for k, v in pending.items():
            for b, acc in v.items():
                assert set(t.pending[k][b]) == set(acc)
                for s, pushes in acc.items():
                    assert len(t.pending[k][b][s]) == len(pushes)
                    for (r, a), (r0, a0) in zip(t.pending[k][b][s], pushes):
                        assert r is r0
                        np.testing.assert_array_equal(a, a0)
    _, small = st.validate_push("t", 1, [0], [None], [np.full(4, 1.0)])
    st.accumulate(t, "r", 1, small, "r-1")
    for items_due in st.due(t, "r", 2):
        st.commit(t, st.apply(t, items_due, check=False))
    assert np.isfinite(t.blocks[0].data).all()
    assert t.pending == {} and t.pending_bound == {}


def test_a_refused_push_is_unmarked_so_a_resend_is_not_skipped():
    st, t = store_with()
    push(st, t, [0], [None], [np.full(4, BIG)])
    _, items = st.validate_push("t", 1, [0], [None], [np.full(4, BIG)])
    todo = st.unapplied(t, items, "s", 7)
    with pytest.raises(PSValueError):
        st.apply(t, todo)
    st.unmark(t, todo, "s", 7)
    _, fine = st.validate_push("t", 1, [0], [None], [np.full(4, -1.0)])
    assert st.unapplied(t, fine, "s", 7) == fine  # not taken for a duplicate
