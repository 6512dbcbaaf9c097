"""Issue 34, item 5: integer tables stored what they cannot represent.
``init=nan``/``inf``/``1e30`` became INT_MIN, a uint8 ``-1`` became 255 and
int32 sums wrapped around, silently. Now each is refused with a
``PSValueError`` naming the table and what fits, and nothing stored changes
(as a float table that forbids NaN/Inf refuses them)."""

from __future__ import annotations

import numpy as np
import pytest

from dask_ps import PSValueError
from dask_ps import _sparse_rows
from dask_ps._shard import ShardStore
from dask_ps import _spec
from dask_ps._spec import TableSpec, check_values


def spec_of(dtype, **kw):
    return TableSpec.create("t", (8,), dtype, block_rows=4, **kw)


@pytest.mark.parametrize("x", [np.nan, np.inf, -np.inf, 1e30, 2.5, 2**31])
def test_an_init_an_int32_table_cannot_hold_is_refused(x):
    with pytest.raises(PSValueError, match=r"'t'.*int32.*-2147483648, 2147483647"):
        _spec.check_scalar(spec_of("int32"), x)


def test_an_init_that_fits_is_taken():
    assert _spec.check_scalar(spec_of("int32"), 3.0) == 3.0
    assert _spec.check_scalar(spec_of("uint8"), 255) == 255
    assert _spec.check_scalar(spec_of("float32"), 1e30) == 1e30
    for x in (-1, np.int64(-1), 256):  # np.full stores a numpy -1 in uint8 as 255
        with pytest.raises(PSValueError, match=r"'t'.*uint8"):
            _spec.check_scalar(spec_of("uint8"), x)
    with pytest.raises(PSValueError, match=r"'t'.*float32.*finite"):
        _spec.check_scalar(spec_of("float32"), 1e300)  # overflows to inf in float32
    with pytest.raises(PSValueError, match=r"'t'.*real number"):
        _spec.check_scalar(spec_of("int32"), "1")


@pytest.mark.parametrize("dtype,values", [("uint8", np.array([256], np.uint16)), ("int8", np.array([200])),
                                          ("int32", np.array([2**40])), ("int64", np.array([2**63], np.uint64))])
def test_push_values_out_of_the_dtype_range_are_refused(dtype, values):
    """numpy's same_kind cast takes these and wraps them (int64 200 to int8 is -56)."""
    spec = TableSpec.create("t", (1,), dtype)
    with pytest.raises(PSValueError, match=rf"'t'.*does not fit the table dtype {dtype}"):
        check_values(spec, values, (1,))
    # the same at a server that receives them from a client
    st = ShardStore()
    st.create(spec, 1, [0])
    with pytest.raises(PSValueError, match=rf"'t'.*does not fit the table dtype {dtype}"):
        st.validate_push("t", 1, [0], [None], [values])
    assert (st.tables["t"].blocks[0].data == 0).all()


def test_values_in_range_of_a_wider_dtype_are_taken():
    spec = TableSpec.create("t", (2,), "uint8")
    out = check_values(spec, np.array([0, 255], dtype=np.uint16), (2,))
    assert out.dtype == np.uint8 and list(out) == [0, 255]


def store(dtype, **kw):
    st = ShardStore()
    spec = spec_of(dtype, **kw)
    st.create(spec, 1, [0, 1])
    return st, st.tables["t"]


def push(st, t, blocks, rows, values):
    _, items = st.validate_push("t", 1, blocks, rows, values)
    st.commit(t, st.apply(t, items))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "uint64"])
def test_an_integer_sum_that_would_wrap_is_refused_and_changes_nothing(dtype):
    info = np.iinfo(dtype)
    st, t = store(dtype)
    push(st, t, [0, 1], [None, None], [np.full(4, info.max, dtype), np.ones(4, dtype)])
    before = {b: blk.data.copy() for b, blk in t.blocks.items()}
    with pytest.raises(PSValueError, match=rf"'t'.*block 0.*out of the range of {dtype}.*nothing was applied"):
        push(st, t, [1, 0], [None, np.array([2])], [np.ones(4, dtype), np.ones(1, dtype)])
    for b, data in before.items():
        np.testing.assert_array_equal(t.blocks[b].data, data)
    if info.min < 0:  # back from the edge: applied exactly
        push(st, t, [0], [None], [np.full(4, -1, dtype)])
        assert (t.blocks[0].data == info.max - 1).all()


def test_an_integer_sum_near_the_range_that_fits_is_applied_exactly():
    st, t = store("int32")
    push(st, t, [0], [None], [np.full(4, 2**31 - 2, np.int32)])
    push(st, t, [0], [np.array([1])], [np.ones(1, np.int32)])  # exactly the largest int32
    assert list(t.blocks[0].data) == [2**31 - 2, 2**31 - 1, 2**31 - 2, 2**31 - 2]
    push(st, t, [0], [None], [np.full(4, -(2**31) + 1, np.int32)])  # far down: still in range
    assert list(t.blocks[0].data) == [-1, 0, -1, -1]


def test_rows_as_nonzeros_that_would_wrap_are_refused():
    """A sparse_wire table's pushes arrive as their nonzeros and are added as they are."""
    st = ShardStore()
    spec = TableSpec.create("u", (8, 64), "int32", block_rows=4, sparse_wire=True)
    st.create(spec, 1, [0, 1])
    u = st.tables["u"]
    _, items = st.validate_push("u", 1, [0], [None], [np.full((4, 64), 2**31 - 1, np.int32)])
    st.commit(u, st.apply(u, items))
    one = np.zeros((4, 64), np.int32)
    one[2, 5] = 1
    rows = _sparse_rows.checked(_sparse_rows.encode(one, max_fraction=1.0, min_bytes=0))
    _, items = st.validate_push("u", 1, [0], [None], [rows])
    assert isinstance(items[0][2], _sparse_rows.EncodedRows)
    with pytest.raises(PSValueError, match="'u'.*block 0.*out of the range of int32"):
        st.apply(u, items)
    assert (u.blocks[0].data == 2**31 - 1).all()


def test_a_per_clock_integer_sum_that_would_wrap_is_refused_when_pushed():
    st, t = store("int32", aggregate="clock")
    _, items = st.validate_push("t", 1, [0], [None], [np.full(4, 2**30, np.int32)])
    st.accumulate(t, "r", 0, items, "r-0")
    _, items = st.validate_push("t", 1, [0], [None], [np.full(4, 2**30, np.int32)])
    with pytest.raises(PSValueError, match="'t'.*clock's other pushes.*int32"):
        st.accumulate(t, "r", 0, items, "r-1")
    for items in st.due(t, "r", 1):
        st.commit(t, st.apply(t, items, check=False))
    assert (t.blocks[0].data == 2**30).all()


# --- a participant's buffer sums its pushes before they are sent: in range or refused at the push ---


def _buffer(dtype="int32"):
    from dask_ps._oplog import PushBuffer

    return PushBuffer(TableSpec.create("t", (4,), dtype, block_rows=2))


def _total(buf):
    out = np.zeros(4, np.int64)
    if buf.dense is not None:
        out += buf.dense
    for r, v in buf.row_parts:
        np.add.at(out, r, v)
    return out


@pytest.mark.parametrize("how", ["dense", "rows", "rows of one push", "dense then rows"])
def test_buffered_integer_pushes_that_would_wrap_are_refused_at_the_push(how):
    """They used to wrap in the buffer: two pushes of 2**30 into int32 arrived at the servers as -2**31."""
    from dask_ps._spec import check_values

    big = np.full(4, 2**30, np.int32)
    buf = _buffer()

    def add(kind, rows=None, vals=big):
        v, bound = check_values(buf.spec, vals, vals.shape, bound=True)  # as the session checks a push
        if kind == "dense":
            buf.add_dense(v, bound=bound)
        else:
            buf.add_rows(np.asarray(rows), v, bound=bound)

    if how == "rows of one push":
        with pytest.raises(PSValueError, match=r"'t'.*\[2147483648, 2147483648\].*int32.*not buffered"):
            add("rows", [1, 1], np.full(2, 2**30, np.int32))
        assert not buf
        return
    first, second = {"dense": ("dense", "dense"), "rows": ("rows", "rows"),
                     "dense then rows": ("dense", "rows")}[how]
    add(first, [0, 1, 2, 3])
    before = _total(buf).copy()
    with pytest.raises(PSValueError, match=r"'t'.*out of the range of int32.*not buffered"):
        add(second, [0, 1, 2, 3])
    np.testing.assert_array_equal(_total(buf), before)  # the first push is kept, unchanged
    add(second, [0, 1, 2, 3], np.full(4, -(2**30), np.int32))  # back to zero: taken, exactly
    np.testing.assert_array_equal(_total(buf), 0)


def test_buffered_integer_sums_near_the_range_are_exact():
    """Bounds that do not settle it (2**30 + 2**30 - 1 may wrap) make the exact sum, which fits."""
    buf = _buffer()
    buf.add_dense(np.full(4, 2**30, np.int32), bound=float(2**30))
    buf.add_dense(np.full(4, 2**30 - 1, np.int32), bound=float(2**30 - 1))
    assert (buf.dense == 2**31 - 1).all() and buf.bound == 2**31 - 1  # the exact total's: tight
    buf.add_rows(np.array([2]), np.array([-5], np.int32), bound=5.0)
    np.testing.assert_array_equal(_total(buf), [2**31 - 1, 2**31 - 1, 2**31 - 6, 2**31 - 1])
