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
