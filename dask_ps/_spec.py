"""Table specifications and the validation of push/pull input (pure code).

Everything a caller sends is checked here, before anything leaves the caller,
so a bad push raises at the call site and no server has applied any of it.
"""

from __future__ import annotations

import math
import operator
import uuid
from dataclasses import dataclass, field, replace

import numpy as np

from dask_ps import _backend, _config
from dask_ps._exceptions import PSValueError
from dask_ps.consistency import Consistency, as_consistency
from dask_ps.rules import UpdateRule, as_rule, rule_from_msg

# numpy's rule for in-place ufuncs (``a += b``): float64 into float32 is
# allowed, float into int, complex into float, or strings are not.
CASTING = "same_kind"

# How a participant's pushes meet the update rule: "push" applies the rule to
# every push as it arrives; "clock" sums all participants' pushes of one clock
# and applies the rule once when every participant has finished that clock
# (MXNet's synchronous mode: one optimizer step per iteration).
AGGREGATES = ("push", "clock")


@dataclass(frozen=True)
class TableSpec:
    """What a table is: immutable once created.

    ``shape`` is ``(n_rows, *row_shape)``; rows are the unit of row-sparse
    access and are grouped into blocks of ``block_rows`` rows for placement.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    device: str = "cpu"
    rule: UpdateRule = field(default_factory=lambda: as_rule("sum"))
    consistency: Consistency = field(default_factory=lambda: as_consistency(None))
    allow_nonfinite: bool = False
    aggregate: str = "push"  # "push": rule per push; "clock": once per clock on the sum
    replication: int = 1  # copies of every block, on distinct workers
    block_rows: int = 0
    table_id: str = ""
    sparse_wire: bool = False  # rows between processes as their nonzeros, where smaller (_sparse_rows)

    @classmethod
    def create(
        cls,
        name,
        shape,
        dtype="float64",
        *,
        device="cpu",
        rule="sum",
        consistency=None,
        allow_nonfinite=None,
        aggregate="push",
        replication=1,
        block_rows=None,
        sparse_wire=False,
        **rule_params,
    ) -> "TableSpec":
        """Validate user arguments and build a spec (``ParameterServer.create_table``)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"table name must be a non-empty str, got {name!r}")
        check_name(name)
        try:
            shape = (operator.index(shape),) if np.ndim(shape) == 0 else tuple(
                operator.index(s) for s in shape
            )
        except TypeError:
            raise TypeError(f"table {name!r}: shape must be an int or a tuple of ints, got {shape!r}") from None
        if not shape or any(s < 0 for s in shape) or shape[0] == 0:
            raise ValueError(f"table {name!r}: shape must be non-empty with positive rows, got {shape}")
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"table {name!r}: {dtype!r} is not a dtype") from None
        if dtype.kind not in "biufc":
            raise TypeError(f"table {name!r}: dtype must be numeric, got {dtype}")
        if device not in _backend.DEVICES:
            raise ValueError(f"table {name!r}: device must be one of {_backend.DEVICES}, got {device!r}")
        if aggregate not in AGGREGATES:
            raise ValueError(f"table {name!r}: aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        if not isinstance(replication, (int, np.integer)) or isinstance(replication, bool) or replication < 1:
            raise ValueError(f"table {name!r}: replication must be an int >= 1, got {replication!r}")
        if allow_nonfinite is None:
            allow_nonfinite = bool(_config.get("allow-nonfinite"))
        row_bytes = max(1, math.prod(shape[1:]) * dtype.itemsize)
        if block_rows is None:
            block_rows = max(1, _config.get_bytes("block-bytes") // row_bytes)
        block_rows = int(min(block_rows, shape[0]))
        if block_rows < 1:
            raise ValueError(f"table {name!r}: block_rows must be >= 1")
        if not isinstance(sparse_wire, (bool, np.bool_)):
            raise TypeError(f"table {name!r}: sparse_wire must be a bool, got {sparse_wire!r}")
        return cls(
            name=name,
            shape=shape,
            dtype=dtype,
            device=device,
            rule=as_rule(rule, **rule_params),
            consistency=as_consistency(consistency),
            allow_nonfinite=bool(allow_nonfinite),
            aggregate=aggregate,
            replication=int(replication),
            block_rows=block_rows,
            table_id=uuid.uuid4().hex,
            sparse_wire=bool(sparse_wire),
        )

    # --- derived ---------------------------------------------------------
    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def n_blocks(self) -> int:
        return -(-self.n_rows // self.block_rows)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def block_bounds(self, block: int) -> tuple[int, int]:
        start = block * self.block_rows
        return start, min(start + self.block_rows, self.n_rows)

    def block_shape(self, block: int) -> tuple[int, ...]:
        start, stop = self.block_bounds(block)
        return (stop - start, *self.row_shape)

    def same_as(self, other: "TableSpec") -> bool:
        """Equal up to the table id and block size (the user-visible spec)."""
        return replace(self, table_id="", block_rows=0) == replace(other, table_id="", block_rows=0)

    def describe(self) -> str:
        return (
            f"shape={self.shape}, dtype={self.dtype}, device={self.device!r}, "
            f"rule={self.rule.name!r}, aggregate={self.aggregate!r}, replication={self.replication}, "
            f"consistency={self.consistency}"
        )

    @property
    def needs_clock_events(self) -> bool:
        """Servers must hear when a run's clock advances (eager pushes or
        per-clock aggregation)."""
        return self.aggregate == "clock" or self.consistency.name == "essp"

    # --- wire format: plain msgpack-able dicts ----------------------------
    def to_msg(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype.str,
            "device": self.device,
            "rule": self.rule.to_msg(),
            "consistency": self.consistency.to_msg(),
            "allow_nonfinite": self.allow_nonfinite,
            "aggregate": self.aggregate,
            "replication": self.replication,
            "block_rows": self.block_rows,
            "table_id": self.table_id,
            "sparse_wire": self.sparse_wire,
        }

    @classmethod
    def from_msg(cls, msg: dict) -> "TableSpec":
        check_name(msg["name"])  # a message from any client
        try:
            rule = rule_from_msg(msg["rule"])
        except PSValueError as e:  # e.g. a pickled rule where they are refused
            raise PSValueError(f"table {msg['name']!r}: {e}", msg["name"]) from None
        return cls(
            name=msg["name"],
            shape=tuple(msg["shape"]),
            dtype=np.dtype(msg["dtype"]),
            device=msg["device"],
            rule=rule,
            consistency=Consistency.from_msg(msg["consistency"]),
            allow_nonfinite=msg["allow_nonfinite"],
            aggregate=msg["aggregate"],
            replication=msg.get("replication", 1),
            block_rows=msg["block_rows"],
            table_id=msg["table_id"],
            sparse_wire=bool(msg.get("sparse_wire", False)),
        )


# --- validation of caller input -----------------------------------------------


# Chunk of the vectorised checks below: its boolean temporary (64 KiB)
# stays on the heap. A temporary of a whole 100k-row request would be a
# fresh mmap in a Dask worker (the nanny's MALLOC_TRIM_THRESHOLD_ turns off
# glibc's adaptive mmap threshold) and page-fault on every use.
_CHUNK = 1 << 16


def strictly_increasing(a: np.ndarray) -> bool:
    """Whether the 1-D array ``a`` is sorted with no duplicates (one pass)."""
    n = a.size
    if n <= _CHUNK:
        return n < 2 or bool((a[1:] > a[:-1]).all())
    for lo in range(0, n - 1, _CHUNK):
        hi = min(lo + _CHUNK, n - 1)
        if not bool((a[lo + 1:hi + 1] > a[lo:hi]).all()):
            return False
    return True


def _row_array(spec: TableSpec, rows) -> np.ndarray:
    """``rows`` as a 1-D integer host array (not yet range-checked)."""
    refuse_masked(spec.name, rows, "rows")
    if _backend.is_cupy(rows):
        rows = _backend.to_numpy(rows)
    if not isinstance(rows, np.ndarray):
        if isinstance(rows, (str, bytes, dict)) or rows is None:
            raise PSValueError(
                f"table {spec.name!r}: rows must be a 1-D array of integers, got {type(rows).__name__}",
                spec.name,
            )
        rows = np.asarray(rows)
        if rows.size == 0:
            rows = rows.astype(np.int64)
    if rows.dtype.kind not in "iu":
        raise PSValueError(
            f"table {spec.name!r}: rows must be integers, got dtype {rows.dtype}", spec.name
        )
    if rows.ndim != 1:
        raise PSValueError(
            f"table {spec.name!r}: rows must be 1-D, got shape {rows.shape}", spec.name
        )
    return rows


def _check_row_range(spec: TableSpec, lo: int, hi: int) -> None:
    if lo < 0 or hi >= spec.n_rows:
        bad = lo if lo < 0 else hi
        raise PSValueError(
            f"table {spec.name!r}: row {bad} is out of range; the table has "
            f"{spec.n_rows} rows (valid rows are 0..{spec.n_rows - 1})",
            spec.name,
        )


def check_row_request(spec: TableSpec, rows) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate and coalesce the rows of a read in one pass: ``(uniq,
    inverse)``, the sorted unique rows (int64, within ``[0, n_rows)``) and
    ``inverse`` with ``uniq[inverse] == rows`` (None when ``rows`` already
    were sorted and unique: then ``uniq`` may be the caller's own array).

    Sorted unique rows (what a minibatch's touched features usually are)
    cost one vectorised pass, whose ends give the range check; others are
    sorted once by ``np.unique``, whose ends give it too."""
    rows = _row_array(spec, rows)
    if strictly_increasing(rows):
        uniq, inverse = rows, None
    else:
        uniq, inverse = np.unique(rows, return_inverse=True)
    if uniq.size:
        _check_row_range(spec, int(uniq[0]), int(uniq[-1]))
    return uniq.astype(np.int64, copy=False), inverse


def check_rows(spec: TableSpec, rows) -> np.ndarray:
    """Row indices as a 1-D int64 host array, all within ``[0, n_rows)``."""
    return check_rows_sorted(spec, rows)[0]


def check_rows_sorted(spec: TableSpec, rows) -> tuple[np.ndarray, bool]:
    """:func:`check_rows` and whether the rows are sorted and unique (found
    by the same pass: sorted rows' ends give the range)."""
    rows = _row_array(spec, rows)
    increasing = strictly_increasing(rows)
    if rows.size:
        if increasing:
            lo, hi = int(rows[0]), int(rows[-1])
        else:
            lo, hi = int(rows.min()), int(rows.max())
        _check_row_range(spec, lo, hi)
    return rows.astype(np.int64, copy=False), increasing


def check_values(spec: TableSpec, values, shape: tuple[int, ...], what: str = "push", bound: bool = False,
                 check_finite: bool = True, out=None):
    """An array of exactly ``shape`` that casts to the table dtype (numpy's
    ``same_kind`` rule) and, unless the table allows it, has no NaN/Inf.

    Returns the values cast to the table dtype, on the device they came on;
    with ``bound=True`` ``(values, bound)``: an upper bound of their
    magnitudes found by the NaN/Inf check's own pass over a large array
    (``_backend.abs_bound``), or None (small, or NaN/Inf allowed). A
    session sends it with its push, so that the server's overflow check
    of a sum (``_shard._check_sums``) makes no second pass over them.
    ``check_finite=False``: the NaN/Inf check is left to the one server
    that receives the values whole (it refuses them before changing anything).
    ``out``: a numpy array of ``shape`` and the table dtype that the values
    are copied into (the returned values are then ``out``): in the NaN/Inf
    check's pass where one pass can do both (``_backend.copy_abs_bound``).
    On an error its contents are undefined.
    """
    refuse_masked(spec.name, values, f"{what} values")
    if not _backend.is_array(values):
        if isinstance(values, (str, bytes, dict, set)) or values is None:
            raise PSValueError(
                f"table {spec.name!r}: {what} values must be an array of shape {shape}, "
                f"got {type(values).__name__}",
                spec.name,
            )
        try:
            values = np.asarray(values)
        except Exception as e:  # ragged lists and the like
            raise PSValueError(
                f"table {spec.name!r}: {what} values must be an array of shape {shape}: {e}",
                spec.name,
            ) from None
    if values.dtype.kind not in "biufc":
        raise PSValueError(
            f"table {spec.name!r}: {what} values must be numeric, got dtype {values.dtype}",
            spec.name,
        )
    if not np.can_cast(values.dtype, spec.dtype, casting=CASTING):
        raise PSValueError(
            f"table {spec.name!r}: cannot cast {what} values of dtype {values.dtype} to the "
            f"table dtype {spec.dtype} (numpy {CASTING!r} casting)",
            spec.name,
        )
    if tuple(values.shape) != tuple(shape):
        raise PSValueError(
            f"table {spec.name!r}: {what} values must have shape {tuple(shape)}, got {tuple(values.shape)}",
            spec.name,
        )
    check_int_range(spec, values, what)
    limit = _config.get_bytes("max-push-bytes")
    if values.size * spec.dtype.itemsize > limit:
        raise PSValueError(
            f"table {spec.name!r}: a {what} of {values.size * spec.dtype.itemsize} bytes exceeds "
            f"ps.max-push-bytes ({limit} bytes); split it (push_rows in parts) or raise the limit",
            spec.name,
        )
    found = None
    # A finite value may overflow the table's dtype in the cast (1e300 into
    # float32): numpy flags it, said here (a table that allows NaN/Inf takes the inf).
    given = values
    if (out is not None and check_finite and not spec.allow_nonfinite and bound and isinstance(values, np.ndarray)
            and values.dtype == spec.dtype):
        found = _backend.copy_abs_bound(values, out)  # no cast: one pass copies and bounds
    try:
        with np.errstate(over="ignore" if spec.allow_nonfinite else "raise"):  # the cast's only
            if out is not None:
                if found is None:
                    out[...] = values  # the check below reads the copy
                values = out
            if values.dtype != spec.dtype:
                values = values.astype(spec.dtype)
    except FloatingPointError:
        raise PSValueError(
            f"table {spec.name!r}: {what} values are finite but overflow the table dtype {spec.dtype} when cast "
            f"(largest magnitude {_backend.abs_bound(given):g}, the dtype's {float(np.finfo(spec.dtype).max):g}); "
            "nothing was applied",
            spec.name,
        ) from None
    if bound and found is None and values.dtype.kind in "iu" and spec.rule.name == "sum" and values.size:
        # an integer sum's overflow check (issue 34) takes this bound: one
        # pass here instead of one at the sender's leases and two at the server
        found = float(max(-int(values.min()), int(values.max())))
    if check_finite and not spec.allow_nonfinite:
        if found is not None:
            finite = math.isfinite(found)  # checked in the copy's pass
        elif bound and values.size > _backend.SMALL and values.dtype.kind in "fc":
            found = _backend.abs_bound(values)  # not finite: a NaN/Inf is in the values
            finite = math.isfinite(found)
        else:
            finite = _backend.all_finite(values)
        if not finite:
            raise PSValueError(
                f"table {spec.name!r}: {what} values contain NaN or Inf and the table was created "
                "with allow_nonfinite=False",
                spec.name,
            )
    return (values, found) if bound else values


def check_name(name) -> None:
    """A table name is also a directory name in a checkpoint (``ps.save``):
    no path separator, not ``.`` or ``..``, no control character, at most
    200 characters. Refused at ``create_table`` (issue 34: ``'../x'`` was
    accepted and refused only by a later save)."""
    if not isinstance(name, str) or not name:
        raise PSValueError(f"a table name must be a non-empty str, got {name!r}")
    if (name in (".", "..") or "/" in name or "\\" in name or len(name) > 200
            or any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise PSValueError(f"table name {name!r} is not allowed: names are also checkpoint directory names "
                           "(no '/' or '\\', not '.' or '..', no control characters, at most 200 characters)",
                           name)


def check_int_range(spec: TableSpec, values, what: str = "push") -> None:
    """Integer values for an integer table must fit its dtype: numpy's
    ``same_kind`` cast would wrap them (-1 into uint8 is 255). One pass
    (min and max) only where the values' dtype does not fit safely."""
    if spec.dtype.kind not in "iu" or values.dtype.kind not in "iu" or values.size == 0:
        return
    if np.can_cast(values.dtype, spec.dtype, casting="safe"):
        return
    _refuse_out_of_range(spec, values, f"{what} values")


def _refuse_out_of_range(spec: TableSpec, values, what: str) -> None:
    """A ``PSValueError`` where integer ``values`` (``what`` they are) do
    not fit the integer table's dtype."""
    info, lo, hi = np.iinfo(spec.dtype), int(values.min()), int(values.max())
    if lo < info.min or hi > info.max:
        raise PSValueError(
            f"table {spec.name!r}: {what} range over [{lo}, {hi}], which does not fit the table "
            f"dtype {spec.dtype} [{info.min}, {info.max}]; nothing was applied",
            spec.name,
        )


def summed_in_range(spec: TableSpec, values, what: str = "push_rows"):
    """An integer table's values after duplicate rows were summed
    (``_routing.coalesce_rows``: wide, or exact Python ints where a 64-bit
    sum could wrap) in the table's dtype, or a ``PSValueError`` where a sum
    does not fit it (nothing is sent)."""
    if spec.dtype.kind not in "iu" or values.dtype == spec.dtype or getattr(values, "size", 0) == 0:
        return values
    _refuse_out_of_range(spec, values, f"{what} values with their duplicate rows summed")
    return values.astype(spec.dtype)


def check_scalar(spec: TableSpec, x, what: str = "init"):
    """A scalar to fill a table with: a real number that the table dtype
    represents (an integer table: an integer in its range, not NaN/Inf or
    1e30, which numpy stores as INT_MIN; a float table: finite unless the
    table allows NaN/Inf, and finite where it was, not overflowed by the
    cast)."""
    if isinstance(x, (str, bytes)) or not np.isscalar(x) or np.iscomplexobj(x) and spec.dtype.kind != "c":
        raise PSValueError(f"table {spec.name!r}: {what} must be a real number or an array, got {x!r}",
                           spec.name)
    if spec.dtype.kind in "iu":
        info = np.iinfo(spec.dtype)
        ok = isinstance(x, (bool, int, np.bool_, np.integer)) or (math.isfinite(x) and float(x).is_integer())
        if not ok or not info.min <= int(x) <= info.max:
            raise PSValueError(f"table {spec.name!r}: {what}={x!r} cannot be stored in {spec.dtype} "
                               f"(an integer in [{info.min}, {info.max}] is needed)", spec.name)
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        stored = np.asarray(x).astype(spec.dtype)
    finite_in = bool(np.isfinite(x))
    if (not spec.allow_nonfinite or finite_in) and not np.isfinite(stored):
        raise PSValueError(f"table {spec.name!r}: {what}={x!r} cannot be stored in {spec.dtype} "
                           f"(a finite number within its range is needed)", spec.name)
    return x


def refuse_masked(name: str, x, what: str) -> None:
    """Refuse a ``numpy.ma.MaskedArray``: its masked cells have no value to
    store, and every finiteness check skips them, so a NaN under the mask
    would reach a table that forbids NaN (issue 14). The caller decides
    what a masked cell means."""
    if isinstance(x, np.ma.MaskedArray):
        raise PSValueError(
            f"table {name!r}: {what} must not be a numpy masked array (its masked cells have no value "
            "to store); pass x.filled(fill_value) or np.ma.getdata(x) to say what they mean",
            name,
        )
