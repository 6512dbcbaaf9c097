"""Pure-core tests: placement, update rules, shard storage, routing, oplog — no cluster."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest

from dask_ps import PSValueError, StaleVersionError, UnknownTableError
from dask_ps._oplog import PushBuffer
from dask_ps._placement import HashRing, place_blocks
from dask_ps._routing import (
    TableHandle,
    assemble_blocks,
    assemble_rows,
    coalesce_rows,
    dense_requests,
    row_requests,
    split_dense,
    split_rows,
)
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec, check_rows, check_values
from dask_ps.consistency import ASP, BSP, CVAP, ESSP, SSP, VAP, Consistency, as_consistency
from dask_ps.rules import Adam, Assign, Custom, Sum, as_rule, rule_from_msg


# --- placement -------------------------------------------------------------------------


def owners(p):
    return [o[0] for o in p]


def test_placement_deterministic_and_spread():
    ws = [f"tcp://10.0.0.{i}:1" for i in range(4)]
    a = place_blocks("w", 64, ws)
    assert a == place_blocks("w", 64, list(reversed(ws)))
    loads = Counter(owners(a))
    assert set(loads) == set(ws)
    assert max(loads.values()) <= np.ceil(1.1 * 64 / 4)


def test_small_table_spreads_over_workers():
    # Bounded loads: 2 blocks on 2 workers never both land on one.
    for name in "abcdefghij":
        p = place_blocks(name, 2, ["x", "y"])
        assert sorted(owners(p)) == ["x", "y"]


@pytest.mark.parametrize("n_blocks", [64, 1000])
def test_membership_change_moves_about_one_nth(n_blocks):
    ws = [f"w{i}" for i in range(4)]
    before = owners(place_blocks("t", n_blocks, ws))
    added = owners(place_blocks("t", n_blocks, ws + ["w4"]))
    removed = owners(place_blocks("t", n_blocks, ws[:3]))
    moved_add = np.mean([a != b for a, b in zip(before, added)])
    moved_remove = np.mean([a != b for a, b in zip(before, removed)])
    # Ideal: 1/5 move to the new worker; 1/4 (the removed worker's) move away.
    assert 0.15 <= moved_add <= 0.3
    assert 0.2 <= moved_remove <= 0.35
    # Blocks that move on removal are mostly the removed worker's own.
    assert all(b in ws[:3] for b in removed)


def test_replicas_are_distinct():
    p = place_blocks("t", 50, ["a", "b", "c"], replication=2)
    assert all(len(set(o)) == 2 for o in p)
    with pytest.raises(ValueError):
        place_blocks("t", 5, ["a"], replication=2)
    with pytest.raises(RuntimeError, match="no parameter-server workers"):
        place_blocks("t", 5, [])


def test_ring_walk_visits_each_worker_once():
    ring = HashRing(["a", "b", "c"], vnodes=16)
    assert sorted(ring.walk("k")) == ["a", "b", "c"]


# --- update rules: numpy reference, step by step ---------------------------------------


def ref_steps(name, p0, grads, **hp):
    """Plain numpy reference implementations (PyTorch definitions)."""
    p = p0.copy()
    if name == "sgd":
        for g in grads:
            p -= hp["lr"] * g
    elif name == "momentum":
        v = np.zeros_like(p)
        for g in grads:
            v = hp["momentum"] * v + g
            p -= hp["lr"] * v
    elif name == "adagrad":
        s = np.zeros_like(p)
        for g in grads:
            s = s + g * g
            p -= hp["lr"] * g / (np.sqrt(s) + 1e-10)
    elif name == "adam":
        m = np.zeros_like(p)
        v = np.zeros_like(p)
        for t, g in enumerate(grads, 1):
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            mh = m / (1 - 0.9**t)
            vh = v / (1 - 0.999**t)
            p -= hp["lr"] * mh / (np.sqrt(vh) + 1e-8)
    return p


@pytest.mark.parametrize(
    "name,hp",
    [("sgd", {"lr": 0.1}), ("momentum", {"lr": 0.05, "momentum": 0.9}),
     ("adagrad", {"lr": 0.3}), ("adam", {"lr": 0.01})],
)
def test_optimizer_rules_match_reference(name, hp):
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=(6, 3))
    grads = [rng.normal(size=(6, 3)) for _ in range(5)]
    rule = as_rule(name, **hp)
    p = p0.copy()
    state = rule.init_state(p)
    for g in grads:
        rule.apply(p, g, state)
    np.testing.assert_allclose(p, ref_steps(name, p0, grads, **hp), rtol=1e-12)


def test_row_sparse_adam_is_lazy_per_row():
    rng = np.random.default_rng(1)
    p0 = rng.normal(size=(4, 2))
    rule = Adam(lr=0.01)
    p = p0.copy()
    state = rule.init_state(p)
    g1, g2 = rng.normal(size=(2, 2)), rng.normal(size=(1, 2))
    rule.apply(p, g1, state, rows=np.array([0, 2]))
    rule.apply(p, g2, state, rows=np.array([2]))
    np.testing.assert_allclose(p[0], ref_steps("adam", p0[:1], [g1[:1]], lr=0.01)[0])
    np.testing.assert_allclose(p[2], ref_steps("adam", p0[2:3], [g1[1:], g2], lr=0.01)[0])
    np.testing.assert_array_equal(p[[1, 3]], p0[[1, 3]])
    assert state["step"].tolist() == [1, 0, 2, 0]


def test_sum_assign_custom_rules():
    p = np.zeros((3, 2))
    Sum().apply(p, np.ones((2, 2)), {}, rows=np.array([0, 2]))
    assert p.sum() == 4
    Assign().apply(p, np.full((1, 2), 7.0), {}, rows=np.array([1]))
    assert p[1].tolist() == [7, 7]

    def halve_then_add(param, update, state):
        state["calls"] = state.get("calls", 0) + 1
        return param / 2 + update

    rule = Custom(halve_then_add)
    state = {}
    rule.apply(p, np.ones((3, 2)), state)
    assert p[:, 0].tolist() == [1.5, 4.5, 1.5] and state["calls"] == 1
    # Custom rules survive the wire format (cloudpickle).
    back = rule_from_msg(pickle.loads(pickle.dumps(rule.to_msg())))
    q = np.zeros((1, 2))
    back.apply(q, np.ones((1, 2)), {})
    assert q.tolist() == [[1, 1]]


def test_rule_and_consistency_validation():
    with pytest.raises(ValueError, match="unknown update rule"):
        as_rule("rmsprop")
    with pytest.raises(TypeError, match="hyper-parameters"):
        as_rule("sgd", learning_rate=1)
    with pytest.raises(TypeError):
        as_rule(3)
    with pytest.raises(ValueError):
        SSP(staleness=-1)
    with pytest.raises(ValueError):
        VAP(bound=0)
    with pytest.raises(TypeError):
        as_consistency("eventually")
    for c in (BSP(), SSP(3), ESSP(1), VAP(0.5), CVAP(2, 0.5), ASP(), SSP(3, refresh=True), ESSP(1, refresh=True)):
        assert Consistency.from_msg(c.to_msg()) == c


def test_refresh_option_of_the_clock_bounded_models():
    """``refresh`` round-trips, defaults to False, is validated; messages
    written before the field existed still parse (to refresh=False)."""
    import dask

    from dask_ps.consistency import default_consistency

    assert SSP(2).refresh is False and not SSP(2).refreshes and not ASP().refreshes and not CVAP(2, 1.0).refreshes
    c = SSP(2, refresh=True)
    assert c.refreshes and c.staleness == 2 and c.to_msg() == {"model": "ssp", "staleness": 2, "refresh": True}
    assert c != SSP(2) and hash(c) != hash(SSP(2))
    assert Consistency.from_msg({"model": "ssp", "staleness": 4}) == SSP(4, refresh=False)
    assert Consistency.from_msg({"model": "essp", "staleness": 1}) == ESSP(1)
    assert Consistency.from_msg(ESSP(1, refresh=True).to_msg()).refreshes
    with pytest.raises(ValueError, match="refresh"):
        SSP(2, refresh="yes")
    with pytest.raises(TypeError):
        CVAP(2, 1.0, refresh=True)  # CVAP reads always go to the servers already
    with dask.config.set({"ps.consistency": "ssp", "ps.staleness": 3, "ps.refresh": True}):
        assert default_consistency() == SSP(3, refresh=True)
    with dask.config.set({"ps.consistency": "essp", "ps.refresh": "false"}):
        assert default_consistency() == ESSP(2, refresh=False)
    assert default_consistency() == SSP(2)


# --- spec and validation -----------------------------------------------------------------


def spec(shape=(10, 3), dtype="float64", **kw):
    return TableSpec.create("t", shape, dtype, **kw)


def test_spec_roundtrip_and_blocks():
    s = spec((10, 3), block_rows=4, rule="adam", lr=0.1, consistency=SSP(1))
    assert s.n_blocks == 3 and s.block_bounds(2) == (8, 10) and s.block_shape(2) == (2, 3)
    back = TableSpec.from_msg(pickle.loads(pickle.dumps(s.to_msg())))
    assert back == s and back.rule.lr == 0.1


def test_spec_validation():
    with pytest.raises(TypeError):
        TableSpec.create("t", (3, 2), "U5")
    with pytest.raises(ValueError):
        TableSpec.create("t", (0, 2))
    with pytest.raises(ValueError):
        TableSpec.create("t", (3,), device="tpu")
    with pytest.raises(TypeError):
        TableSpec.create("", (3,))


def test_check_rows():
    s = spec()
    assert check_rows(s, [1, 2, 2]).dtype == np.int64
    for bad, msg in [([10], "row 10 is out of range"), ([-1], "row -1 is out of range"),
                     ([1.0], "integers"), ([[1]], "1-D"), ("ab", "array of integers"),
                     (np.array([True]), "integers")]:
        with pytest.raises(PSValueError, match=msg) as ei:
            check_rows(s, bad)
        assert "'t'" in str(ei.value)


def test_check_values():
    s = spec((2, 2), "float32")
    out = check_values(s, np.ones((2, 2)), (2, 2))  # float64 -> float32: same kind
    assert out.dtype == np.float32
    check_values(s, np.ones((2, 2), "int64"), (2, 2))  # int -> float
    with pytest.raises(PSValueError, match="shape"):
        check_values(s, np.ones((3, 2)), (2, 2))
    with pytest.raises(PSValueError, match="cannot cast"):
        check_values(spec((2,), "int32"), np.ones(2), (2,))
    with pytest.raises(PSValueError, match="cannot cast"):
        check_values(s, np.ones((2, 2), complex), (2, 2))
    with pytest.raises(PSValueError, match="NaN or Inf"):
        check_values(s, np.array([[1, np.nan], [0, 0]]), (2, 2))
    with pytest.raises(PSValueError, match="NaN or Inf"):
        check_values(s, np.array([[1, np.inf], [0, 0]]), (2, 2))
    # Overflowing sum of finite values is not mistaken for Inf.
    big = np.full((2, 2), 3e38, "float32")
    check_values(s, big, (2, 2))
    check_values(spec((2,), allow_nonfinite=True), np.array([np.nan, 1]), (2,))
    for bad in ["hello", {"a": 1}, None, [[1, 2], [3]]]:
        with pytest.raises(PSValueError):
            check_values(s, bad, (2, 2))


# --- shard store ---------------------------------------------------------------------------


def make_store(s, blocks=None):
    st = ShardStore()
    st.create(s, 1, list(range(s.n_blocks)) if blocks is None else blocks)
    return st


def test_store_push_pull_and_version():
    s = spec((10, 2), block_rows=4)
    st = make_store(s)
    t, items = st.validate_push("t", 1, [0, 2], [None, np.array([1])], [np.ones((4, 2)), np.full((1, 2), 5.0)])
    st.commit(t, st.apply(t, items))
    seqs, vals = st.read(t, [(0, None), (2, np.array([0, 1]))])
    assert vals[0].sum() == 8 and vals[1].tolist() == [[0, 0], [5, 5]] and seqs == [1, 1]
    with pytest.raises(StaleVersionError):
        st.validate_push("t", 2, [0], [None], [np.ones((4, 2))])
    with pytest.raises(UnknownTableError):
        st.get("nope")


@pytest.mark.parametrize(
    "blocks,rows,values,msg",
    [
        ([7], [None], [np.ones((4, 2))], "not hosted"),
        ([0], [None], [np.ones((3, 2))], "expects values of shape"),
        ([0], [np.array([5])], [np.ones((1, 2))], "out of range"),
        ([0], [np.array([1, 1])], [np.ones((2, 2))], "sorted and unique"),
        ([0], [np.array([0.5])], [np.ones((1, 2))], "integer"),
        ([0], [None], ["junk"], "must be arrays"),
        ([0], [None], [np.full((4, 2), np.nan)], "NaN"),
        ([0, 1], [None], [np.ones((4, 2))], "equally long"),
        ("0", [None], [np.ones((4, 2))], "not hosted"),
        ([0], [None], [np.ones((4, 2), complex)], "dtype"),
    ],
)
def test_store_rejects_bad_messages_without_change(blocks, rows, values, msg):
    s = spec((10, 2), block_rows=4)
    st = make_store(s)
    t = st.get("t")
    before = {b: blk.data.copy() for b, blk in t.blocks.items()}
    with pytest.raises(PSValueError, match=msg):
        # A valid first item must not be applied when a later one is bad.
        st.validate_push("t", 1, [1, *blocks], [None, *rows], [np.ones((4, 2)), *values])
    for b, blk in t.blocks.items():
        np.testing.assert_array_equal(blk.data, before[b])


def test_copy_on_write_after_zero_copy_read():
    s = spec((4, 2), block_rows=4)
    st = make_store(s)
    t = st.get("t")
    _, (snapshot,) = st.read(t, [(0, None)])  # zero-copy: a read-only view of the stored array
    assert np.shares_memory(snapshot, t.blocks[0].data) and not snapshot.flags.writeable
    _, items = st.validate_push("t", 1, [0], [None], [np.ones((4, 2))])
    st.commit(t, st.apply(t, items))
    assert snapshot.sum() == 0  # the reply being sent is unchanged
    assert t.blocks[0].data.sum() == 8 and not t.blocks[0].shared
    # Out-of-place apply (offload thread) never writes the visible array.
    visible = t.blocks[0].data
    _, items = st.validate_push("t", 1, [0], [None], [np.ones((4, 2))])
    fresh = st.apply(t, items, in_place=False)
    assert visible.sum() == 8 and fresh[0].sum() == 16
    st.commit(t, fresh)
    assert t.blocks[0].data.sum() == 16


def test_create_is_idempotent_and_drop():
    s = spec()
    st = make_store(s)
    st.create(s, 1, [0])
    assert st.drop("t", "other-id") is False
    assert st.drop("t", s.table_id) is True
    assert st.tables == {}


# --- routing and oplog -------------------------------------------------------------------------


def handle(s, workers=("a", "b")):
    return TableHandle(s, 1, tuple(tuple(o) for o in place_blocks(s.name, s.n_blocks, workers)))


def test_coalesce_rows():
    rows = np.array([5, 1, 5, 3, 1])
    vals = np.arange(10.0).reshape(5, 2)
    r, v = coalesce_rows(rows, vals, additive=True)
    assert r.tolist() == [1, 3, 5]
    assert v.tolist() == [[10, 12], [6, 7], [4, 6]]
    r, v = coalesce_rows(rows, vals, additive=False)  # last write wins
    assert v.tolist() == [[8, 9], [6, 7], [4, 5]]


def test_split_and_assemble_roundtrip():
    s = spec((10, 2), block_rows=3)
    h = handle(s)
    x = np.arange(20.0).reshape(10, 2)
    msgs = split_dense(h, x)
    assert sum(len(v) for v in msgs.values()) == 4
    reqs = dense_requests(h)
    parts = {b: x[slice(*s.block_bounds(b))] for items in reqs.values() for b, _ in items}
    np.testing.assert_array_equal(assemble_blocks(h, parts), x)

    rows = np.array([9, 0, 4, 4])
    reqs, uniq, inverse = row_requests(h, rows)
    parts = {b: x[b * 3 + r] for items in reqs.values() for b, r in items}
    np.testing.assert_array_equal(assemble_rows(h, parts, uniq, inverse), x[rows])

    msgs = split_rows(h, np.array([0, 4, 9]), x[[0, 4, 9]])
    got = sorted((b, r.tolist()) for items in msgs.values() for b, r, _ in items)
    assert got == [(0, [0]), (1, [1]), (3, [0])]


def test_push_buffer_coalesces_and_overlays():
    s = spec((10, 2), block_rows=3)
    h = handle(s)
    buf = PushBuffer(s)
    for i in range(100):  # many small pushes ...
        buf.add_rows(np.array([i % 4]), np.ones((1, 2)))
    msgs = buf.messages(h)
    items = [it for v in msgs.values() for it in v]
    assert len(items) == 2  # ... become one item per touched block
    assert sum(float(v.sum()) for _, _, v in items) == 200
    assert buf.max_abs() == 25
    np.testing.assert_array_equal(buf.overlay_rows(np.array([0, 5]), np.zeros((2, 2))), [[25, 25], [0, 0]])
    buf.add_dense(np.ones((10, 2)))
    dense = buf.overlay_dense(np.zeros((10, 2)))
    assert dense[:4, 0].tolist() == [26] * 4 and dense[4:, 0].tolist() == [1] * 6
    assert buf.max_abs() == 26


def test_push_buffer_keeps_optimizer_steps_in_order():
    s = spec((4,), block_rows=4, rule="sgd", lr=1.0)
    buf = PushBuffer(s)
    buf.add_dense(np.ones(4))
    buf.add_rows(np.array([1]), np.array([2.0]))
    items = [it for v in buf.messages(handle(s)).values() for it in v]
    assert [(b, None if r is None else r.tolist()) for b, r, _ in items] == [(0, None), (0, [1])]


def test_value_bound_norm_sums_pending_optimizer_steps():
    s = spec((4,), rule="sgd", lr=1.0, consistency=VAP(1.0))
    buf = PushBuffer(s)
    buf.add_dense(np.full(4, 0.6))
    buf.add_dense(np.full(4, 0.6))
    buf.add_rows(np.array([1]), np.array([-2.0]))
    assert buf.max_abs() == pytest.approx(1.2)


def test_cache_entry_row_lookups_match_numpy_set_operations():
    """A cached block of some rows finds rows through a lookup table:
    which of the asked rows it holds (a read fetches the others), where the
    rows a push writes are in it (write-through), merging freshly read rows
    in order with their values. Checked against numpy's set operations,
    with rows beyond the largest held; entries holding many of their
    block's row numbers (a lookup table) and few (binary search)."""
    from dask_ps._cache import CacheEntry, _same_rows

    rng = np.random.default_rng(1)
    for span in [80] * 300 + [100_000] * 100:
        held = np.unique(rng.integers(0, span, rng.integers(0, 40)))
        want = np.unique(rng.integers(0, span + span // 4, rng.integers(0, 40)))
        e = CacheEntry(3.0, 7, 2, held, np.stack([held * 10.0, -held * 1.0], axis=1))
        new = e.missing(want)
        np.testing.assert_array_equal(new, np.setdiff1d(want, held, assume_unique=True))
        assert e.covers(want) == (new.size == 0)
        _, ia, ib = np.intersect1d(held, want, assume_unique=True, return_indices=True)
        ja, jb = e.common(want)
        np.testing.assert_array_equal(ja, ia)
        np.testing.assert_array_equal(jb, ib)
        assert _same_rows(held, want) == (held.size == want.size and bool((held == want).all()))
        m = e.merged(new, 5, np.stack([new * 10.0, -new * 1.0], axis=1))
        np.testing.assert_array_equal(m.rows, np.union1d(held, want))
        np.testing.assert_array_equal(m.values, np.stack([m.rows * 10.0, -m.rows * 1.0], axis=1))
        assert (m.tag, m.seq, m.clock) == (3.0, 5, 2)
        # the merged entry's lookup table (made by the merge) agrees with a fresh one
        some = np.unique(rng.integers(0, span + span // 2, 30))
        fresh = CacheEntry(m.tag, m.seq, m.clock, m.rows, m.values)
        np.testing.assert_array_equal(m.positions(some), fresh.positions(some))
        np.testing.assert_array_equal(m.take(m.rows[::2]), m.values[::2])
