"""Rows as their nonzeros on the wire (``dask_ps._sparse_rows``, tables with
``sparse_wire=True``), pure: every numeric dtype round-trips bit for bit,
rows that would not shrink enough stay dense, and a malformed message is
refused before anything is allocated."""

from __future__ import annotations

import numpy as np
import pytest

from dask_ps import PSValueError
from dask_ps import _sparse_rows as sr
from dask_ps._spec import TableSpec

DTYPES = ["int32", "int64", "uint8", "int16", "bool", "float16", "float32", "float64", "complex64", "complex128"]


def encode(values):
    return sr.encode(values, min_bytes=0)  # small arrays here; the size rule has its own test


def _sparse(shape, dtype, density, seed=0):
    rng = np.random.default_rng(seed)
    a = np.zeros(shape, dtype=dtype)
    hit = rng.random(shape) < density
    a[hit] = rng.integers(-5, 6, size=int(hit.sum())).astype(dtype) if dtype != "bool" else True
    return a


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(40, 300), (7, 5, 11), (1, 1000), (0, 50)])
def test_round_trip_is_exact(dtype, shape):
    a = _sparse(shape, dtype, 0.03)
    if np.dtype(dtype).kind in "fc" and a.size:
        a.reshape(-1)[:3] = np.array([-0.0, np.nan, np.inf]).astype(dtype)  # bits kept, not values compared
    enc = encode(a)
    if a.size == 0:
        assert enc is None
        return
    assert enc is not None and sr.encoded_nbytes(enc) <= sr.MAX_FRACTION * a.nbytes
    out = sr.decode(enc)
    assert out.dtype == a.dtype and out.shape == a.shape and out.flags.writeable
    assert out.tobytes() == a.tobytes()


def test_dense_rows_stay_dense_and_views_encode_their_own_values():
    assert encode(np.ones((100, 50), dtype=np.int32)) is None  # nothing to save
    assert encode(_sparse((100, 50), "int32", 0.4)) is None  # 40% nonzero: 6 bytes each, not half of 4
    assert encode(np.zeros(100, dtype=np.int32)) is None  # not rows
    a = _sparse((60, 400), "int32", 0.01)
    view = a[10:50:2]  # not contiguous
    assert sr.decode(encode(view)).tobytes() == np.ascontiguousarray(view).tobytes()


def test_rows_under_min_bytes_stay_dense():
    a = _sparse((300, 1000), "int32", 0.01)  # 1.2 MB; 200 rows: 0.8 MB
    assert sr.encode(a[:200]) is None and sr.encode(a, min_bytes=a.nbytes + 1) is None
    assert sr.decode(sr.encode(a)).tobytes() == a.tobytes()


def test_counts_and_positions_are_per_row():
    a = np.zeros((3, 70000), dtype=np.int32)  # positions past 2**16: int32 columns
    a[0, 5], a[2, 69999], a[2, 0] = 7, -1, 3
    enc = encode(a)
    assert enc["counts"].tolist() == [1, 0, 2] and enc["cols"].dtype == np.int32
    assert enc["cols"].tolist() == [5, 0, 69999]
    assert sr.decode(enc).tobytes() == a.tobytes()


def _good():
    return encode(_sparse((20, 100), "int32", 0.02, seed=3))


@pytest.mark.parametrize("corrupt, match", [
    (lambda e: e.update(cols=e["cols"] + 200), "outside rows"),
    (lambda e: e.update(counts=e["counts"] + 1), "add up"),
    (lambda e: e["counts"].__setitem__(0, -1), "add up"),
    (lambda e: e.update(vals=e["vals"][:-1]), "do not match"),
    (lambda e: e.update(vals=e["vals"].astype(np.uint64)), "do not match"),
    (lambda e: e.update(counts=e["counts"][:-1]), "do not match"),
    (lambda e: e.update(dtype="O"), "numeric"),
    (lambda e: e.update(sparse_rows=[20]), "numeric"),
    (lambda e: e.update(sparse_rows=[10**9, 10**6]), "exceed"),
    (lambda e: e.pop("cols"), "malformed"),
])
def test_malformed_messages_are_refused(corrupt, match):
    enc = _good()
    corrupt(enc)
    with pytest.raises(PSValueError, match=match):
        sr.decode(enc, max_bytes=1 << 30)


def test_spec_carries_the_option():
    s = TableSpec.create("t", (10, 4), "int32", sparse_wire=True)
    assert s.sparse_wire and TableSpec.from_msg(s.to_msg()) == s
    old = s.to_msg()
    del old["sparse_wire"]  # a spec saved before the option
    assert not TableSpec.from_msg(old).sparse_wire
    with pytest.raises(TypeError, match="sparse_wire"):
        TableSpec.create("t", (10, 4), sparse_wire="yes")


# --- pushed rows added as their nonzeros (EncodedRows) -----------------------------------------


def _received(values):
    """What a server's push handler holds after ``_wire.unwire_values(decode=False)``."""
    return sr.checked(encode(values))


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint16", "int8"])
@pytest.mark.parametrize("rows", [None, slice(3, 43), np.array([0, 5, 6, 17, 44, 45, 46, 59] * 5)[:40]])
def test_encoded_rows_add_as_the_dense_sum_bit_for_bit(dtype, rows):
    rng = np.random.default_rng(1)
    out = _sparse((60, 7, 30), dtype, 0.05, seed=2)  # rows of more than one axis
    n = 60 if rows is None else 40
    if isinstance(rows, np.ndarray):
        rows = np.unique(rows)
        n = rows.size
    vals = _sparse((n, 7, 30), dtype, 0.02, seed=int(rng.integers(100)))
    vals.reshape(-1)[:2] = np.iinfo(dtype).max  # wraps as the dense sum does
    enc = _received(vals)
    assert enc.addable_to(out) and enc.nbytes < vals.nbytes and enc.dense_nbytes == vals.nbytes
    want = out.copy()
    with np.errstate(over="ignore"):
        want[slice(None) if rows is None else rows] += vals
    enc.add_to(out, rows)
    assert out.tobytes() == want.tobytes()


def test_encoded_rows_of_floats_or_another_dtype_are_not_added_as_they_are():
    f = _received(_sparse((20, 100), "float32", 0.02))
    assert not f.addable_to(np.zeros((20, 100), np.float32))  # -0.0 + 0.0 is not -0.0: dense add
    i = _received(_sparse((20, 100), "int32", 0.02))
    assert not i.addable_to(np.zeros((20, 100), np.int64))
    assert not i.addable_to(np.zeros((20, 50), np.int32))
    assert i.addable_to(np.zeros((25, 100), np.int32))
    assert not sr.DenseRows(np.ones((3, 4), ">i4")).addable_to(np.zeros((3, 4), ">i4"))  # not native: numpy adds
    assert i.message()["counts"] is i.counts and sr.decode(i.message()).tobytes() == i.toarray().tobytes()


def _store_with(dtype, rule="sum", aggregate="push", sparse_wire=False):
    from dask_ps._shard import ShardStore

    s = TableSpec.create("t", (120, 100), dtype, block_rows=50, rule=rule, aggregate=aggregate,
                         sparse_wire=sparse_wire)
    st = ShardStore()
    st.create(s, 1, list(range(s.n_blocks)))
    return st


@pytest.mark.parametrize("dtype, rule, added_as_they_are", [
    ("int32", "sum", True), ("int64", "sum", True), ("float64", "sum", False), ("int32", "assign", False)])
def test_a_store_adds_pushed_nonzeros_without_decoding_them(monkeypatch, dtype, rule, added_as_they_are):
    """A sum table of integers adds the pushed rows' nonzeros as they came
    (no dense array of the rows is made); any other table gets the decoded
    rows. Either way the table ends as with the dense push."""
    rng = np.random.default_rng(0)
    pushes = []
    for _ in range(3):
        rows = np.sort(rng.choice(50, 30, replace=False))
        pushes.append(((0, rows), (1, None), (2, [2, 12])))  # a range: [start, stop]
    values = [[_sparse((r.size if isinstance(r, np.ndarray) else 50 if r is None else 10, 100), dtype, 0.03,
                       seed=int(rng.integers(1000))) for _, r in p] for p in pushes]
    dense, sparse = _store_with(dtype, rule), _store_with(dtype, rule)
    decoded = []
    plain_toarray = sr.EncodedRows.toarray
    monkeypatch.setattr(sr.EncodedRows, "toarray", lambda self: decoded.append(self) or plain_toarray(self))
    for p, vals in zip(pushes, values):
        for st, vs in ((dense, vals), (sparse, [_received(v) for v in vals])):
            t, items = st.validate_push("t", 1, [b for b, _ in p], [r for _, r in p], vs)
            st.commit(t, st.apply(t, items))
    assert (not decoded) == added_as_they_are
    for b in range(3):
        assert sparse.tables["t"].blocks[b].data.tobytes() == dense.tables["t"].blocks[b].data.tobytes()


def test_a_store_checks_encoded_rows_and_sums_them_per_clock():
    st = _store_with("int32", aggregate="clock")
    t = st.tables["t"]
    with pytest.raises(PSValueError, match="expects values of shape"):
        st.validate_push("t", 1, [0], [None], [_received(_sparse((40, 100), "int32", 0.03))])
    a, b = _sparse((50, 100), "int32", 0.03, seed=1), _sparse((50, 100), "int32", 0.03, seed=2)
    for sender, v in (("run-1", b), ("run-0", a)):
        _, items = st.validate_push("t", 1, [0], [None], [_received(v)])
        st.accumulate(t, "run", 0, items, sender)
    for items in st.due(t, "run", 1):
        st.commit(t, st.apply(t, items))
    assert t.blocks[0].data.tobytes() == (a + b).tobytes()


def test_rows_by_index_encode_straight_from_the_block():
    a = _sparse((300, 1000), "int32", 0.01)
    rows = np.array([3, 7, 8, 120, 299] * 60)  # any order, repeats: 1.2 MB of rows
    assert sr.decode(sr.encode(a, rows=rows)).tobytes() == a[rows].tobytes()
    assert sr.encode(a, rows=rows[:200]) is None  # 0.8 MB of rows: under MIN_BYTES
    assert sr.encode(np.ones((300, 1000), np.int32), rows=rows) is None


def test_a_store_reads_rows_by_index_as_their_nonzeros_for_a_sparse_reader():
    from dask_ps._shard import ShardStore

    s = TableSpec.create("t", (600, 1000), "int32", block_rows=300)
    st = ShardStore()
    st.create(s, 1, [0, 1])
    t = st.tables["t"]
    t.blocks[0].data[...] = _sparse((300, 1000), "int32", 0.01)
    rows = np.arange(0, 300, 1)[::-1].copy()
    reqs = [(0, rows), (1, None), (0, slice(0, 300))]
    _, dense = st.read(t, reqs, copy=True)
    _, sparse = st.read(t, reqs, copy=True, sparse=True)
    assert sr.is_encoded(sparse[0]) and not any(sr.is_encoded(v) for v in sparse[1:])  # whole blocks, ranges: as before
    assert sr.decode(sparse[0]).tobytes() == dense[0].tobytes()


@pytest.mark.parametrize("dtype, rule, sparse_wire, wrapped", [
    ("int32", "sum", True, True), ("int32", "sum", False, False), ("float32", "sum", True, False),
    ("int64", "assign", True, False)])
def test_dense_pushes_to_a_sparse_wire_table_write_only_their_nonzeros(dtype, rule, sparse_wire, wrapped):
    """An array pushed to a ``sparse_wire`` sum table of integers (from a
    session in the server's process) is added by the compiled pass over
    its nonzeros (``DenseRows``), with the same result as numpy's add."""
    rng = np.random.default_rng(5)
    plain, store = _store_with(dtype, rule), _store_with(dtype, rule, sparse_wire=sparse_wire)
    for _ in range(3):
        rows = np.sort(rng.choice(50, 30, replace=False))
        p = [(0, rows), (1, None), (2, [2, 12])]
        vals = [_sparse((30, 100), dtype, 0.03, seed=int(rng.integers(1000))), _sparse((50, 100), dtype, 0.03),
                _sparse((10, 100), dtype, 0.5)]
        _, items = store.validate_push("t", 1, [b for b, _ in p], [r for _, r in p], vals)
        assert all(isinstance(v, sr.DenseRows) == wrapped for _, _, v in items)
        for st in (plain, store):
            t, items = st.validate_push("t", 1, [b for b, _ in p], [r for _, r in p], vals)
            st.commit(t, st.apply(t, items))
    for b in range(3):
        assert store.tables["t"].blocks[b].data.tobytes() == plain.tables["t"].blocks[b].data.tobytes()
