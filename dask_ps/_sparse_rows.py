"""Rows as their nonzeros on the wire (pure code; the loops compiled by numba).

A table created with ``sparse_wire=True`` moves the rows of its pushes and
reads between processes as the nonzeros of each row, where that is at most
``MAX_FRACTION`` of the rows' bytes; the arrays pushed and read are the
same as without it. For count tables such as LDA's word-topic rows (at
K=1000 on the benchmark corpus, 99% zeros late in a fit, and 57 MB of rows
read and pushed per participant and iteration).

The encoding of ``values`` (shape ``(n, *row_shape)``) is a dict::

    {"sparse_rows": [n, *row_shape], "dtype": str,
     "counts": int32[n],                 # nonzeros of each row
     "cols": uint16 or int32[nnz],       # their positions in the row, row by row
     "vals": uint{8,16,32,64}[nnz]}      # their bit patterns

A row is compared and carried as the unsigned integers of its values' bits
(floats: -0.0 and NaN payloads are kept; complex128 as two uint64), so a
round trip is exact for every numeric dtype. Nothing here allocates more
than the rows' dense bytes: :func:`checked` checks the message first.

A server adds pushed rows to an integer ``sum`` table as they arrived
(:class:`EncodedRows`, one write per nonzero), without decoding them. The
loops are compiled on first use (numba is imported then, not with this
module: the shard store refers to :class:`EncodedRows`).
"""

from __future__ import annotations

import math

import numpy as np

from dask_ps._compiled import lazy
from dask_ps._exceptions import PSValueError

KEY = "sparse_rows"
# Encoded only where it is at most this share of the dense bytes: decoding
# writes into fresh zeros (as a dense receive writes a fresh buffer), so a
# smaller saving would not pay for the encoding pass.
MAX_FRACTION = 0.5
# ... and only rows of at least this many bytes: below, the bytes cost less
# on the wire than the encoding's passes and three frames instead of one
# (LDA at K=50: blocks of 0.37 MB, 12% nonzero; a participant's iteration
# without the sweep took 28 ms of worker CPU encoded, 24 ms not; at K=1000,
# 4 MB blocks, encoding saved 5-15%).
MIN_BYTES = 1 << 20


def _unit(dtype: np.dtype) -> np.dtype:
    """The unsigned integer the values' bits are carried as."""
    return np.dtype(f"u{min(dtype.itemsize, 8)}")


def _col_dtype(row_size: int) -> np.dtype:
    return np.dtype(np.uint16) if row_size <= 1 << 16 else np.dtype(np.int32)


def is_encoded(x) -> bool:
    return isinstance(x, dict) and KEY in x


def _encode(a, rows, counts, cols, vals):  # pragma: no cover - compiled
    """The nonzeros of ``a``'s rows ``rows`` into ``cols``/``vals``, their
    number per row into ``counts``; -1 as soon as they do not fit."""
    j = 0
    cap = cols.size
    for i in range(rows.size):
        r = rows[i]
        start = j
        for k in range(a.shape[1]):
            v = a[r, k]
            if v != 0:
                if j == cap:
                    return -1
                cols[j] = k
                vals[j] = v
                j += 1
        counts[i] = j - start
    return j


def _decode(counts, cols, vals, out):  # pragma: no cover - compiled
    j = 0
    for i in range(counts.size):
        for _ in range(counts[i]):
            out[i, cols[j]] = vals[j]
            j += 1


def _add(out, rows, counts, cols, vals):  # pragma: no cover - compiled
    """``out[rows[i], cols[j]] += vals[j]`` for row ``i``'s nonzeros ``j``."""
    j = 0
    for i in range(counts.size):
        r = rows[i]
        for _ in range(counts[i]):
            out[r, cols[j]] += vals[j]
            j += 1


def _add_dense(out, rows, vals):  # pragma: no cover - compiled
    """``out[rows[i]] += vals[i]``, writing only where ``vals`` is nonzero."""
    for i in range(rows.size):
        r = rows[i]
        for k in range(vals.shape[1]):
            v = vals[i, k]
            if v != 0:
                out[r, k] += v


_encode, _decode, _add, _add_dense = (lazy(f, nogil=True) for f in (_encode, _decode, _add, _add_dense))


def encode(values: np.ndarray, max_fraction: float = MAX_FRACTION, min_bytes: int = MIN_BYTES,
           rows: np.ndarray | None = None) -> dict | None:
    """``values``' rows (``rows``: those rows of ``values``, as
    ``values[rows]`` without gathering them first) as their nonzeros, or
    None when that would be more than ``max_fraction`` of their bytes, or
    they are fewer than ``min_bytes`` (or not a host array with rows)."""
    if not isinstance(values, np.ndarray) or values.ndim < 2:
        return None
    shape = values.shape if rows is None else (len(rows), *values.shape[1:])
    nbytes = math.prod(shape) * values.dtype.itemsize
    if nbytes == 0 or nbytes < min_bytes:
        return None
    n = shape[0]
    unit = _unit(values.dtype)
    a = np.ascontiguousarray(values).view(unit).reshape(values.shape[0], -1)
    rows = np.arange(n) if rows is None else rows
    cols_dtype = _col_dtype(a.shape[1])
    cap = int(max_fraction * nbytes - 4 * n) // (unit.itemsize + cols_dtype.itemsize)
    if cap <= 0:
        return None
    counts = np.empty(n, dtype=np.int32)
    cols = np.empty(cap, dtype=cols_dtype)  # pages not written are never touched
    vals = np.empty(cap, dtype=unit)
    nnz = _encode(a, rows, counts, cols, vals)
    if nnz < 0:
        return None
    return {KEY: list(shape), "dtype": values.dtype.str, "counts": counts, "cols": cols[:nnz], "vals": vals[:nnz]}


def encoded_nbytes(enc: dict) -> int:
    return sum(getattr(enc.get(k), "nbytes", 0) for k in ("counts", "cols", "vals"))


class RowsToAdd:
    """Pushed rows that a server adds to a ``sum`` table of integers by
    writing only their nonzeros (:meth:`add_to`); anything else gets
    :meth:`toarray` (``ShardStore``). ``shape``/``dtype``: of the rows."""

    __slots__ = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dense_nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def addable_to(self, out) -> bool:
        """Whether :meth:`add_to` can add these rows to ``out``: a host
        array of integers of their dtype (an integer sum of the nonzeros
        alone is the dense sum, bit for bit; a float one is not: ``-0.0 +
        0.0``; the compiled loops take native byte order), whose rows are
        as wide as these."""
        return (isinstance(out, np.ndarray) and out.dtype == self.dtype and self.dtype.kind in "iu"
                and self.dtype.isnative and out.ndim >= 2 and out.shape[1:] == tuple(self.shape[1:])
                and out.flags.c_contiguous and out.flags.writeable)

    def add_to(self, out: np.ndarray, rows=None) -> None:
        """``out[rows] += self.toarray()`` (``rows``: an index array of
        distinct rows, a slice, or None for all of ``out``'s), one write per
        nonzero. Only where :meth:`addable_to`; the rows were checked to be
        in range (``ShardStore.validate_push``)."""
        if rows is None:
            rows = np.arange(out.shape[0])
        elif isinstance(rows, slice):
            rows = np.arange(*rows.indices(out.shape[0]))
        self._add(out.reshape(out.shape[0], -1), np.asarray(rows, dtype=np.int64))


class EncodedRows(RowsToAdd):
    """Rows received as their nonzeros and checked (:func:`checked`), not
    decoded; ``nbytes``: what they hold. Never written to (a copy is itself)."""

    __slots__ = ("shape", "dtype", "counts", "cols", "vals")

    def __init__(self, shape, dtype, counts, cols, vals):
        self.shape, self.dtype, self.counts, self.cols, self.vals = shape, dtype, counts, cols, vals

    def __repr__(self):
        return f"EncodedRows(shape={self.shape}, dtype={self.dtype}, nnz={self.vals.size})"

    @property
    def nbytes(self) -> int:
        return self.counts.nbytes + self.cols.nbytes + self.vals.nbytes

    def copy(self) -> EncodedRows:
        return self

    def message(self) -> dict:
        """As :func:`encode` made them (to send on)."""
        return {KEY: list(self.shape), "dtype": self.dtype.str, "counts": self.counts, "cols": self.cols,
                "vals": self.vals}

    def toarray(self) -> np.ndarray:
        """The rows as a fresh writable array."""
        unit = _unit(self.dtype)
        out = np.zeros((self.shape[0], math.prod(self.shape[1:]) * self.dtype.itemsize // unit.itemsize), dtype=unit)
        if self.cols.size:
            _decode(self.counts, self.cols, self.vals, out)
        return out.reshape(-1).view(self.dtype).reshape(self.shape)

    def _add(self, out2d, rows):
        if self.cols.size:
            _add(out2d, rows, self.counts, self.cols, self.vals.view(self.dtype))


class DenseRows(RowsToAdd):
    """Rows pushed as an array to a ``sparse_wire`` table (from this
    process, or sent dense): mostly zeros, so one compiled pass that
    writes only their nonzeros adds them (K=1000 LDA: 3.5 ms for a
    participant's half, numpy's gather, add and scatter 9.7)."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray):
        self.values = values

    def __repr__(self):
        return f"DenseRows(shape={self.shape}, dtype={self.dtype})"

    shape = property(lambda self: self.values.shape)
    dtype = property(lambda self: self.values.dtype)
    nbytes = property(lambda self: self.values.nbytes)

    def copy(self) -> DenseRows:
        return DenseRows(self.values.copy())

    def toarray(self) -> np.ndarray:
        """The rows as a fresh writable array."""
        return self.values.copy()

    def _add(self, out2d, rows):
        _add_dense(out2d, rows, np.ascontiguousarray(self.values).reshape(len(rows), -1))


def checked(enc: dict, max_bytes: int | None = None) -> EncodedRows:
    """The rows :func:`encode` encoded, checked and not decoded. Raises
    :class:`PSValueError` for a malformed message, or one whose rows would
    exceed ``max_bytes``."""
    try:
        shape = tuple(int(s) for s in enc[KEY])
        dtype = np.dtype(enc["dtype"])
        counts, cols, vals = enc["counts"], enc["cols"], enc["vals"]
    except (KeyError, TypeError, ValueError) as e:
        raise PSValueError(f"sparse rows: malformed message ({e!r})") from None
    if len(shape) < 2 or min(shape) < 0 or dtype.kind not in "biufc":
        raise PSValueError(f"sparse rows: shape {shape} / dtype {dtype} is not a numeric array of rows")
    n, unit = shape[0], _unit(dtype)
    row_size = math.prod(shape[1:]) * dtype.itemsize // unit.itemsize
    nbytes = n * row_size * unit.itemsize
    if max_bytes is not None and nbytes > max_bytes:
        raise PSValueError(f"sparse rows: {nbytes} bytes of rows exceed the limit of {max_bytes}")
    arrays_ok = all(isinstance(x, np.ndarray) and x.ndim == 1 for x in (counts, cols, vals))
    if not (arrays_ok and counts.dtype == np.int32 and counts.size == n and vals.dtype == unit
            and cols.dtype == _col_dtype(row_size) and cols.size == vals.size):
        raise PSValueError(f"sparse rows: counts/cols/vals do not match rows of shape {shape} and dtype {dtype}")
    if n and (int(counts.min()) < 0 or int(counts.sum(dtype=np.int64)) != cols.size):
        raise PSValueError("sparse rows: the counts per row do not add up to the nonzeros sent")
    if cols.size and (int(cols.max()) >= row_size or int(cols.min()) < 0):
        raise PSValueError(f"sparse rows: a position is outside rows of {row_size} elements")
    return EncodedRows(shape, dtype, counts, cols, vals)


def decode(enc: dict, max_bytes: int | None = None) -> np.ndarray:
    """The rows :func:`encode` encoded, as a fresh writable array (checked
    first, see :func:`checked`)."""
    return checked(enc, max_bytes).toarray()
