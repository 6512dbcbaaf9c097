"""The row path at the comm's speed (issue 12), pure: one-pass validation,
block slicing without per-row temporaries, ranges and whole blocks instead
of index arrays, and zero-copy pushes give the same values as the plain
paths they replace."""

from __future__ import annotations

import numpy as np
import pytest

from dask_ps import PSValueError
from dask_ps._oplog import PushBuffer
from dask_ps._cache import add_into
from dask_ps._routing import (
    TableHandle,
    block_slices,
    coalesce_rows,
    contiguous,
    local_rows,
    split_rows,
    wire_rows,
)
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec, _CHUNK, check_row_request, check_rows, check_rows_sorted, strictly_increasing


def spec(shape=(1000, 3), block_rows=100, **kw):
    return TableSpec.create("t", shape, "float64", block_rows=block_rows, **kw)


def handle(s):
    return TableHandle(s, 1, tuple(("a" if b % 2 else "b",) for b in range(s.n_blocks)))


def store_with(s, rng):
    st = ShardStore()
    t = st.create(s, 1, list(range(s.n_blocks)))
    for blk in t.blocks.values():
        blk.data[...] = rng.normal(size=blk.data.shape)
    return st, t


# --- one-pass validation ---------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, _CHUNK - 1, _CHUNK, _CHUNK + 1, 3 * _CHUNK + 7])
def test_strictly_increasing_matches_numpy_at_chunk_edges(n):
    a = np.arange(n, dtype=np.int64) * 3
    assert strictly_increasing(a)
    for i in {1, n // 2, n - 1, _CHUNK - 1, _CHUNK, _CHUNK + 1} & set(range(1, n)):
        b = a.copy()
        b[i] = b[i - 1]  # a duplicate exactly there
        assert not strictly_increasing(b), i
        c = a.copy()
        c[i] = b[i - 1] - 1  # a descent exactly there
        assert not strictly_increasing(c), i


def test_check_row_request_coalesces_like_unique():
    s = spec((5000, 2), block_rows=512)
    rng = np.random.default_rng(0)
    for _ in range(20):
        rows = rng.integers(0, 5000, size=rng.integers(0, 300))
        uniq, inverse = check_row_request(s, rows)
        ref_u, ref_inv = np.unique(rows.astype(np.int64), return_inverse=True)
        np.testing.assert_array_equal(uniq, ref_u)
        assert uniq.dtype == np.int64
        if inverse is None:
            np.testing.assert_array_equal(uniq, rows)
        else:
            np.testing.assert_array_equal(uniq[inverse], rows)
    sorted_rows = np.arange(10, 400, 3)
    uniq, inverse = check_row_request(s, sorted_rows)
    assert uniq is sorted_rows and inverse is None  # sorted and unique: no copy, no sort
    uniq, inverse = check_row_request(s, [3, 1, 3])
    assert uniq.tolist() == [1, 3] and uniq[inverse].tolist() == [3, 1, 3]


@pytest.mark.parametrize("rows,msg", [
    ([0, 5000], "row 5000 is out of range"),
    ([-1, 3], "row -1 is out of range"),
    ([4, -1, 3], "row -1 is out of range"),
    ([1.0, 2.0], "integers"),
    ([[1, 2]], "1-D"),
    ("12", "1-D array of integers"),
])
def test_check_row_request_errors_name_the_table(rows, msg):
    s = spec((5000, 2), block_rows=512)
    with pytest.raises(PSValueError, match=msg):
        check_row_request(s, rows)
    with pytest.raises(PSValueError, match=msg):
        check_rows(s, rows)


def test_check_rows_sorted_says_whether_sorted():
    s = spec()
    rows, inc = check_rows_sorted(s, np.array([1, 5, 9]))
    assert inc and rows.tolist() == [1, 5, 9]
    rows, inc = check_rows_sorted(s, [9, 1, 1])
    assert not inc and rows.tolist() == [9, 1, 1]
    with pytest.raises(PSValueError, match="out of range"):
        check_rows_sorted(s, np.array([1, 5, 1000]))


# --- block slicing and local rows ------------------------------------------------------


def _block_slices_reference(s, rows):
    blocks = rows // s.block_rows
    out = []
    for b in np.unique(blocks):
        idx = np.flatnonzero(blocks == b)
        out.append((int(b), int(idx[0]), int(idx[-1]) + 1))
    return out


def test_block_slices_match_the_reference():
    rng = np.random.default_rng(1)
    for block_rows in (1, 7, 100, 1000):
        s = spec((1000, 1), block_rows=block_rows)
        for k in (0, 1, 5, 200, 1000):
            rows = np.sort(rng.choice(1000, k, replace=False)).astype(np.int64)
            assert block_slices(s, rows) == _block_slices_reference(s, rows)


def test_local_rows_block_zero_is_a_view_others_int32():
    s = spec((1000, 1), block_rows=100)
    rows = np.array([3, 50, 99, 100, 150, 999], dtype=np.int64)
    got = {b: local_rows(s, b, rows[lo:hi]) for b, lo, hi in block_slices(s, rows)}
    assert np.shares_memory(got[0], rows)  # no copy for the first block
    assert got[1].dtype == np.int32 and got[1].tolist() == [0, 50]
    assert got[9].tolist() == [99]
    for b, lr in got.items():
        np.testing.assert_array_equal(lr + b * 100, rows[(rows // 100) == b])


def test_wire_rows_sends_ranges_without_an_index():
    assert wire_rows(None) is None
    assert wire_rows(np.arange(5, 9)) == [5, 9]
    assert wire_rows(np.array([7], dtype=np.int32)) == [7, 8]
    r = np.array([1, 2, 4])
    assert wire_rows(r) is r
    assert contiguous(np.arange(3)) and not contiguous(np.array([0, 2])) and not contiguous(np.array([], int))


# --- server: ranges and whole blocks give what an index array gives --------------------


def test_pull_of_a_range_equals_the_index_array():
    s = spec((1000, 3), block_rows=100)
    rng = np.random.default_rng(2)
    st, t = store_with(s, rng)
    for lo, hi in [(0, 1), (10, 20), (0, 100), (30, 99), (99, 100)]:
        _, reqs = st.validate_pull("t", 1, [4], [[lo, hi]])
        assert isinstance(reqs[0][1], slice)
        _, (by_range,) = st.read(t, reqs)
        _, reqs = st.validate_pull("t", 1, [4], [np.arange(lo, hi)])
        _, (by_index,) = st.read(t, reqs)
        np.testing.assert_array_equal(by_range, by_index)


def test_big_range_is_zero_copy_and_marks_the_block_shared_small_one_is_copied():
    s = spec((100, 3), block_rows=100)
    st, t = store_with(s, np.random.default_rng(3))
    _, (small,) = st.read(t, [(0, slice(0, 10))])
    assert not t.blocks[0].shared and not np.shares_memory(small, t.blocks[0].data)
    _, (big,) = st.read(t, [(0, slice(0, 60))])
    assert t.blocks[0].shared and np.shares_memory(big, t.blocks[0].data) and not big.flags.writeable
    before = big.copy()
    _, items = st.validate_push("t", 1, [0], [None], [np.ones((100, 3))])
    st.commit(t, st.apply(t, items))
    np.testing.assert_array_equal(big, before)  # copy-on-write: the reply being sent is unchanged
    _, (copied,) = st.read(t, [(0, slice(0, 60))], copy=True)
    assert not np.shares_memory(copied, t.blocks[0].data)


def test_whole_block_then_selection_equals_the_row_read():
    """A dense read (whole block, rows selected by the reader) returns what
    the row read returns."""
    s = spec((1000, 3), block_rows=200)
    st, t = store_with(s, np.random.default_rng(4))
    rows = np.sort(np.random.default_rng(5).choice(200, 150, replace=False))
    _, reqs = st.validate_pull("t", 1, [2, 2], [None, rows])
    _, (block, by_rows) = st.read(t, reqs)
    np.testing.assert_array_equal(block[rows], by_rows)


@pytest.mark.parametrize("rule,hp", [("sum", {}), ("assign", {}), ("adam", {"lr": 0.1}), ("sgd", {"lr": 0.5})])
def test_push_of_a_range_equals_the_index_array(rule, hp):
    s = spec((300, 2), block_rows=100, rule=rule, **hp)
    rng = np.random.default_rng(6)
    a, ta = store_with(s, np.random.default_rng(7))
    b, tb = store_with(s, np.random.default_rng(7))
    for lo, hi in [(0, 100), (5, 6), (40, 90)]:
        vals = rng.normal(size=(hi - lo, 2))
        _, items = a.validate_push("t", 1, [1], [[lo, hi]], [vals])
        kind = items[0][1]
        assert isinstance(kind, slice) == (rule in ("sum", "assign"))  # others get index arrays
        a.commit(ta, a.apply(ta, items))
        _, items = b.validate_push("t", 1, [1], [np.arange(lo, hi)], [vals])
        b.commit(tb, b.apply(tb, items))
        np.testing.assert_allclose(ta.blocks[1].data, tb.blocks[1].data, rtol=0, atol=0)


@pytest.mark.parametrize("rows", [[5, 5], [-1, 3], [3, 101], [0], [1, 2, 3], ["a", 3], [True, 3]])
def test_bad_ranges_are_refused_before_anything_changes(rows):
    s = spec((300, 2), block_rows=100)
    st, t = store_with(s, np.random.default_rng(8))
    before = t.blocks[0].data.copy()
    n = 1 if len(rows) != 2 else 2
    with pytest.raises(PSValueError):
        st.validate_push("t", 1, [1, 0], [None, rows], [np.ones((100, 2)), np.ones((n, 2))])
    with pytest.raises(PSValueError):
        st.validate_pull("t", 1, [0], [rows])
    np.testing.assert_array_equal(t.blocks[0].data, before)


def test_recheck_pull_refuses_what_changed_while_waiting():
    from dask_ps import StaleVersionError

    s = spec((300, 2), block_rows=100)
    st, t = store_with(s, np.random.default_rng(9))
    st.recheck_pull(t, "t", 1, [0, 1], s.table_id)
    t.missed.add(1)
    with pytest.raises(StaleVersionError, match="missed"):
        st.recheck_pull(t, "t", 1, [0, 1], s.table_id)
    st.drop("t")
    st.create(s, 1, [0])
    with pytest.raises(StaleVersionError):
        st.recheck_pull(t, "t", 1, [0], s.table_id)


# --- zero-copy pushes give the same messages --------------------------------------------


def _messages(buf, h):
    out = {}
    for items in buf.messages(h).values():
        for b, rows, vals in items:
            out[b] = (None if rows is None else np.asarray(rows).tolist(), np.asarray(vals).tolist())
    return out


@pytest.mark.parametrize("rule", ["sum", "assign"])
def test_zero_copy_row_push_keeps_the_arrays_and_sends_the_same(rule):
    s = spec((1000, 3), block_rows=100, rule=rule)
    h = handle(s)
    rng = np.random.default_rng(10)
    rows = np.sort(rng.choice(1000, 50, replace=False))
    vals = rng.normal(size=(50, 3))
    copying, zero = PushBuffer(s), PushBuffer(s)
    copying.add_rows(rows, vals)
    zero.add_rows(rows, vals, keep_rows=True, keep_values=True, borrowed=True)
    parts = zero.row_parts if s.rule.additive else zero.ops
    assert parts[0][0] is rows and parts[0][1] is vals and zero.borrowed
    parts = copying.row_parts if s.rule.additive else copying.ops
    assert parts[0][1] is not vals and not copying.borrowed
    assert _messages(zero, h) == _messages(copying, h)


@pytest.mark.parametrize("rule", ["sum", "assign"])
def test_int32_row_copies_send_the_same_rows_and_values(rule):
    """A buffer for servers in other processes keeps its copies of the
    callers' rows as int32: the messages carry the same rows and values as
    the int64 copies do, also merged with a handed-over (int64) push, and
    the caller's array is untouched."""
    s = spec((1000, 3), block_rows=100, rule=rule)
    h = handle(s)
    rng = np.random.default_rng(12)
    pushes = [(np.sort(rng.choice(1000, 60, replace=False)), rng.normal(size=(60, 3))) for _ in range(3)]
    narrow, wide = PushBuffer(s, int32_rows=True), PushBuffer(s)
    for i, (rows, vals) in enumerate(pushes):
        keep = i == 1  # the second one handed over (copy=False): kept as it is, int64
        for buf in (narrow, wide):
            buf.add_rows(rows, vals, keep_rows=keep, keep_values=keep, borrowed=keep)
    parts = narrow.row_parts if s.rule.additive else narrow.ops
    assert [p[0].dtype for p in parts] == [np.int32, np.int64, np.int32]
    assert _messages(narrow, h) == _messages(wide, h)
    assert pushes[0][0].dtype == np.int64


def test_zero_copy_with_duplicates_coalesces_into_fresh_arrays():
    s = spec()
    buf = PushBuffer(s)
    rows, vals = np.array([5, 1, 5]), np.ones((3, 3))
    buf.add_rows(rows, vals, keep_rows=True, keep_values=True, borrowed=True)
    (r, v), = buf.row_parts
    assert r.tolist() == [1, 5] and v[:, 0].tolist() == [1, 2] and not buf.borrowed
    assert vals.sum() == 9 and rows.tolist() == [5, 1, 5]  # the caller's arrays untouched


def test_zero_copy_dense_push_is_never_written_nor_reused():
    s = spec((10, 3), block_rows=4)
    mine = np.ones((10, 3))
    buf = PushBuffer(s)
    buf.add_dense(mine, keep=True, borrowed=True)
    assert buf.dense is mine and buf.spare_after_send is None  # not recycled as a spare
    buf.add_dense(np.ones((10, 3)))
    assert (mine == 1).all() and (buf.dense == 2).all()  # summed into a fresh array
    own = PushBuffer(s)
    own.add_dense(np.ones((10, 3)))
    assert own.spare_after_send is own.dense  # the buffer's own array is reused
    fresh = np.ones((10, 3))
    kept = PushBuffer(s)
    kept.add_dense(fresh, keep=True)  # fresh from validation (a cast): kept, and reusable
    assert kept.dense is fresh and kept.spare_after_send is fresh


def test_a_spare_a_zero_copy_push_did_not_use_stays_free():
    """A ``copy=False`` push between two default pushes left the next one
    without its spare array: a fresh one (page faults) for a 64 MiB push."""
    s = spec((10, 3), block_rows=4)
    spare = np.zeros((10, 3))
    borrowed = PushBuffer(s, spare=spare)
    borrowed.add_dense(np.ones((10, 3)), keep=True, borrowed=True)
    assert borrowed.spare_after_send is spare
    rows_only = PushBuffer(s, spare=spare)
    rows_only.add_rows(np.array([1]), np.ones((1, 3)))
    assert rows_only.spare_after_send is spare


def test_a_buffers_bound_covers_every_value_it_sends():
    """The bound a session sends with a flush (servers trust it for their
    overflow check): the pushes' bounds summed; unknown after a row push
    or a push without one."""
    s = spec((10, 3), block_rows=4)
    buf = PushBuffer(s)
    buf.add_dense(np.full((10, 3), 2.0), bound=2.5)
    buf.add_dense(np.full((10, 3), -1.0), bound=1.5)
    assert buf.bound == 4.0
    assert all(abs(v).max() <= buf.bound for items in buf.messages(handle(s)).values() for _, _, v in items)
    buf.add_rows(np.array([1]), np.ones((1, 3)))
    assert buf.bound is None
    unknown = PushBuffer(s)
    unknown.add_dense(np.ones((10, 3)))
    unknown.add_dense(np.ones((10, 3)), bound=1.0)
    assert unknown.bound is None


def test_coalesce_skips_the_check_when_known_sorted():
    rows, vals = np.array([1, 4, 9]), np.ones(3)
    assert coalesce_rows(rows, vals, increasing=True) == (rows, vals)
    r, v = coalesce_rows(np.array([4, 1, 4]), np.ones(3), increasing=False)
    assert r.tolist() == [1, 4] and v.tolist() == [1, 2]


@pytest.mark.parametrize("dense", [False, True])
def test_overlay_in_place_equals_the_copying_overlay(dense):
    s = spec((50, 2), block_rows=10)
    rng = np.random.default_rng(11)
    buf = PushBuffer(s)
    if dense:
        buf.add_dense(rng.normal(size=(50, 2)))
    buf.add_rows(np.array([3, 7, 20]), rng.normal(size=(3, 2)))
    rows = np.array([1, 3, 20, 49])
    base = rng.normal(size=(4, 2))
    ref = buf.overlay_rows(rows, base.copy())
    mine = base.copy()
    got = buf.overlay_rows(rows, mine, owned=True)
    np.testing.assert_allclose(got, ref)
    full = rng.normal(size=(50, 2))
    np.testing.assert_allclose(buf.overlay_dense(full.copy(), owned=True), buf.overlay_dense(full))


def test_split_rows_of_sorted_rows_matches_per_block_subtraction():
    s = spec((1000, 2), block_rows=128)
    h = handle(s)
    rows = np.sort(np.random.default_rng(12).choice(1000, 300, replace=False))
    vals = np.arange(600.0).reshape(300, 2)
    for items in split_rows(h, rows, vals).values():
        for b, lr, v in items:
            sel = (rows // 128) == b
            np.testing.assert_array_equal(np.asarray(lr) + b * 128, rows[sel])
            np.testing.assert_array_equal(v, vals[sel])


@pytest.mark.parametrize("rows,prow", [(None, None), (None, [1, 3]), ([0, 2, 3], None), ([0, 2, 3], [2, 3, 4])])
def test_add_into_adds_a_push_to_what_was_read(rows, prow):
    block = np.zeros((6, 2))
    pvals = np.arange(12.0).reshape(6, 2) if prow is None else np.arange(2.0 * len(prow)).reshape(-1, 2)
    ref = block.copy()
    if prow is None:
        ref += pvals
    else:
        ref[prow] += pvals
    out = block.copy() if rows is None else block[rows].copy()
    add_into(out, None if rows is None else np.array(rows), None if prow is None else np.array(prow), pvals)
    np.testing.assert_array_equal(out, ref if rows is None else ref[rows])


# --- one NaN/Inf pass per push -------------------------------------------------------------


def test_buffer_says_when_it_summed_values():
    s = spec((10, 3), block_rows=4)
    buf = PushBuffer(s)
    buf.add_dense(np.ones((10, 3)))
    assert not buf.summed  # one push: checked when it was made
    buf.add_dense(np.ones((10, 3)))
    assert buf.summed  # a sum of finite values may overflow: checked again at flush
    rows = PushBuffer(s)
    rows.add_rows(np.array([1, 4]), np.ones((2, 3)))
    rows.add_rows(np.array([2, 5]), np.ones((2, 3)))
    rows.messages(handle(s))
    assert not rows.summed  # merged parts with distinct rows: nothing summed
    rows.add_rows(np.array([1]), np.ones((1, 3)))
    rows.messages(handle(s))
    assert rows.summed
    dup = PushBuffer(s)
    dup.add_rows(np.array([3, 3]), np.ones((2, 3)))
    assert dup.summed


def test_server_skips_the_finite_check_only_for_trusted_senders():
    s = spec((8, 2), block_rows=8)
    st, t = store_with(s, np.random.default_rng(13))
    bad = np.full((8, 2), np.nan)
    with pytest.raises(PSValueError, match="NaN"):
        st.validate_push("t", 1, [0], [None], [bad])
    _, items = st.validate_push("t", 1, [0], [None], [bad], check_finite=False)  # a session checked it
    assert len(items) == 1


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64"])
def test_all_finite_finds_every_nonfinite_value(dtype):
    """``_backend.all_finite`` (the push check: one reduction, then the
    element-wise check only where the reduction is not finite) finds a
    NaN or an Inf anywhere, in any layout, and is not fooled by finite
    values whose squares or sum overflow."""
    from dask_ps import _backend

    rng = np.random.default_rng(0)
    x = rng.random(30_000).astype(dtype)
    assert _backend.all_finite(x) and _backend.all_finite(x.reshape(300, 100)) and _backend.all_finite(x[::3])
    for bad in (np.nan, np.inf, -np.inf):
        for where in (0, 12_345, 29_999):
            y = x.copy()
            y[where] = bad
            assert not _backend.all_finite(y), (bad, where)
            assert not _backend.all_finite(y.reshape(300, 100))
            assert _backend.all_finite(y[::3]) == (where % 3 != 0)  # a strided view: only its elements
    big = x.copy()
    big[:100] = np.finfo(big.real.dtype).max  # finite, but the reduction overflows
    assert _backend.all_finite(big)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "int64", "uint16", "bool", "complex64"])
@pytest.mark.parametrize("row_shape", [(), (1,), (3,), (2, 5), (1, 1), (0,)])
@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
def test_add_rows_equals_fancy_add_bit_for_bit(dtype, row_shape, idx_dtype):
    """``_backend.add_rows`` (flat ``add.at`` for one-element rows, gather and
    write-back of whole rows otherwise) gives exactly what ``out[idx] +=
    vals`` gives, NaN and Inf included, for any dtype and row shape; rows
    not in ``idx`` are untouched."""
    from dask_ps._backend import add_rows

    rng = np.random.default_rng(5)
    n = 300
    shape = (n, *row_shape)

    def draw(size):
        if np.dtype(dtype).kind == "c":
            return (rng.normal(size=size) + 1j * rng.normal(size=size)).astype(dtype)
        if np.dtype(dtype).kind == "f":
            x = rng.normal(size=size).astype(dtype)
            x.reshape(-1)[::17] = np.nan
            x.reshape(-1)[5::23] = np.inf
            return x
        return rng.integers(0, 100, size=size).astype(dtype)

    out = draw(shape)
    idx = np.sort(rng.choice(n, 120, replace=False)).astype(idx_dtype)
    vals = draw((idx.size, *row_shape))
    expect = out.copy()
    expect[idx] += vals
    add_rows(out, idx, vals)
    np.testing.assert_array_equal(out.view(np.uint8), expect.view(np.uint8))


def test_add_rows_falls_back_where_the_fast_paths_do_not_apply():
    from dask_ps._backend import add_rows

    base = np.arange(40.0).reshape(20, 2)
    strided = base[::2]  # not contiguous
    expect = strided.copy()
    expect[[1, 3]] += 1.0
    add_rows(strided, np.array([1, 3]), np.ones((2, 2)))
    np.testing.assert_array_equal(strided, expect)
    out = np.zeros(5, np.float32)
    add_rows(out, np.array([0, 4]), np.array([1.5, 2.5]))  # float64 values: numpy's cast, as +=
    assert out.tolist() == [1.5, 0, 0, 0, 2.5]
    add_rows(out, np.array([], dtype=np.int64), np.zeros(0, np.float32))
    assert out.tolist() == [1.5, 0, 0, 0, 2.5]
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        add_rows(frozen, np.array([1]), np.ones(1))


@pytest.mark.parametrize("row_shape", [(), (1,), (4,), (2, 3), (0,)])
@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
def test_take_rows_equals_fancy_indexing(row_shape, idx_dtype):
    from dask_ps._backend import take_rows

    rng = np.random.default_rng(6)
    data = rng.normal(size=(50, *row_shape)).astype(np.float32)
    idx = np.sort(rng.choice(50, 20, replace=False)).astype(idx_dtype)
    before = data.copy()
    got = take_rows(data, idx)
    np.testing.assert_array_equal(got, data[idx])
    assert got.shape == data[idx].shape and got.flags.c_contiguous
    got[...] = 7  # a copy: the block is unchanged
    np.testing.assert_array_equal(data, before)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8", "float16"])
@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
@pytest.mark.parametrize("row_shape", [(), (1,)])
def test_take_rows_compiled_gather_of_many_narrow_rows(dtype, idx_dtype, row_shape):
    """Rows of one element, at least ``SMALL`` of them, are gathered by a
    compiled loop (float16 by numpy): the values of ``data[idx]`` (any order, repeats) in a
    fresh array; an index out of range anywhere (a server trusts a
    session's rows unchecked) raises IndexError as numpy's indexing does."""
    from dask_ps import _backend

    rng = np.random.default_rng(7)
    n = 3 * _backend.SMALL
    data = (rng.random((n, *row_shape)) * 100).astype(dtype)
    idx = rng.integers(0, n, size=_backend.SMALL + 5).astype(idx_dtype)
    got = _backend.take_rows(data, idx)
    np.testing.assert_array_equal(got, data[idx])
    assert got.shape == data[idx].shape and got.dtype == data.dtype and not np.shares_memory(got, data)
    # float16: numpy's indexing (no compiled loop), where -1 is the last row
    for bad in (n, np.iinfo(idx_dtype).max) + (() if dtype == "float16" else (-1,)):
        wrong = idx.copy()
        wrong[_backend.SMALL // 2] = bad
        with pytest.raises(IndexError, match=str(bad)):
            _backend.take_rows(data, wrong)
