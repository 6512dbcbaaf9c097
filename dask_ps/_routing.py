"""Splitting pushes and pulls into one message per server, and merging the
replies (pure code, no Dask).

A ``TableHandle`` is what a caller knows about a table: its spec, placement
version and the owner of every block. Everything here works on numpy and
cupy values alike; row indices are always host (numpy) int64 arrays.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dask_ps import _backend
from dask_ps._spec import TableSpec, strictly_increasing

# addr -> list of (block, local rows or None, values)
Messages = dict[str, list[tuple[int, "np.ndarray | None", object]]]


@dataclass(frozen=True)
class TableHandle:
    spec: TableSpec
    version: int
    owners: tuple[tuple[str, ...], ...]  # owners[b] = workers holding block b, primary first
    # block -> replicas known (when fetched) to have missed a push: never read
    stale: tuple[tuple[int, tuple[str, ...]], ...] = ()
    rollbacks: int = 0  # restores from a checkpoint the table had when fetched

    @classmethod
    def from_msg(cls, msg: dict) -> "TableHandle":
        return cls(
            TableSpec.from_msg(msg["spec"]),
            msg["version"],
            tuple(tuple(o) for o in msg["owners"]),
            tuple((int(b), tuple(ws)) for b, ws in msg.get("stale") or ()),
            int(msg.get("rollbacks") or 0),
        )

    def primary(self, block: int) -> str:
        return self.owners[block][0]

    @functools.cached_property
    def holders(self) -> tuple[str, ...]:
        """Every worker holding a copy of a block of the table (sorted)."""
        return tuple(sorted({w for o in self.owners for w in o}))

    def readable(self, block: int) -> tuple[str, ...]:
        """Copies of ``block`` a read may use: the owners less known-stale ones."""
        if not self.stale:
            return self.owners[block]
        bad = dict(self.stale).get(block, ())
        return tuple(w for w in self.owners[block] if w not in bad) or self.owners[block][:1]

    def read_from(self, block: int, local: str | None = None, key: int = 0) -> str:
        """Where to read ``block``: this process's worker if it holds a copy
        (no comm), else one copy chosen by ``key`` (stable per reader, so one
        reader's reads of a block are monotonic; readers spread over copies).
        Any copy is up to date for acknowledged pushes: a replica that missed
        one is fenced and refuses, and the read retries at the primary."""
        ws = self.readable(block)
        if local is not None and local in ws:
            return local
        return ws[(key + block) % len(ws)]

    def __repr__(self):
        return f"<TableHandle {self.spec.name!r} v{self.version} {self.spec.n_blocks} blocks>"


def coalesce_rows(rows: np.ndarray, values, additive: bool = True, increasing: bool | None = None):
    """Sorted unique rows and their values: duplicates summed (``additive``)
    or, for last-write-wins rules, the last occurrence kept. ``increasing``:
    whether ``rows`` are known to be sorted and unique already (None: check)."""
    if increasing or (increasing is None and strictly_increasing(rows)):
        return rows, values
    xp = _backend.namespace(values)
    order = np.argsort(rows, kind="stable")
    srows = rows[order]
    new = np.empty(srows.size, dtype=bool)
    new[0] = True
    np.not_equal(srows[1:], srows[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    svals = values[xp.asarray(order)]
    if additive:
        if xp is np and svals.dtype == bool:
            merged = np.logical_or.reduceat(svals, starts, axis=0)  # numpy's bool sum: True + True is True
        elif xp is np:
            merged = np.add.reduceat(svals, starts, axis=0)  # int8-int32 summed wide (int64)
            if merged.dtype.kind in "iu" and merged.dtype.itemsize == 8 and starts.size < srows.size:
                merged = _exact_where_wrapped(svals, starts, merged)
        else:  # cupy: reduce by segment with a scatter-add
            seg = xp.asarray(np.cumsum(new) - 1)
            merged = xp.zeros((starts.size, *values.shape[1:]), dtype=values.dtype)
            _backend.scatter_add(merged, seg, svals)
    else:
        ends = np.append(starts[1:], srows.size) - 1  # last of each run (stable sort)
        merged = svals[xp.asarray(ends)]
    return srows[starts], merged


def _exact_where_wrapped(svals: np.ndarray, starts: np.ndarray, merged: np.ndarray) -> np.ndarray:
    """64-bit integer sums of duplicate rows, or their exact values (Python
    ints, dtype object) where one may not fit: int64/uint64 sums wrap
    around silently (2**62 + 2**62 -> -2**63), and wrapped sums pass any
    later range check. Modular sums are exact whenever the true sum fits,
    so the float64 sums (off by far less than 2**61 here) tell which case
    holds; the callers check the exact ones against the table's range."""
    approx = np.add.reduceat(svals.astype(np.float64), starts, axis=0)
    limit = 2.0**62 if merged.dtype.kind == "i" else 2.0**63
    if approx.size == 0 or float(np.abs(approx).max()) < limit:
        return merged
    return np.add.reduceat(svals.astype(object), starts, axis=0)


def block_slices(spec: TableSpec, sorted_rows: np.ndarray):
    """``(block, lo, hi)`` for each block touched by sorted rows.

    Binary searches for the blocks' first rows: no temporary per row (a
    ``rows // block_rows`` of a 100k-row request cost more than the search
    in a Dask worker, where every large fresh array page-faults)."""
    if sorted_rows.size == 0:
        return []
    br = spec.block_rows
    first, last = int(sorted_rows[0]) // br, int(sorted_rows[-1]) // br
    if first == last:
        return [(first, 0, int(sorted_rows.size))]
    cuts = np.searchsorted(sorted_rows, np.arange(first + 1, last + 1, dtype=np.int64) * br)
    bounds = [0, *cuts.tolist(), int(sorted_rows.size)]
    return [(first + i, bounds[i], bounds[i + 1]) for i in range(last - first + 1) if bounds[i + 1] > bounds[i]]


def local_rows(spec: TableSpec, block: int, rows: np.ndarray) -> np.ndarray:
    """Global ``rows`` of ``block`` (sorted) as rows within the block. Block
    0's are the rows themselves (no copy); others are int32 when the block
    fits, which halves what the subtraction writes and the message carries."""
    start = block * spec.block_rows
    if start == 0:
        return rows
    if spec.block_rows <= np.iinfo(np.int32).max:
        return np.subtract(rows, start, dtype=np.int32, casting="unsafe")
    return rows - start


def contiguous(rows: np.ndarray) -> bool:
    """Whether sorted unique ``rows`` are one range (a constant-time test)."""
    return rows.size > 0 and int(rows[-1]) - int(rows[0]) + 1 == rows.size


def wire_rows(rows):
    """How a block's local rows travel: None (the whole block), ``[start,
    stop]`` for a range of rows (no index array at all), else the array."""
    if rows is None or not isinstance(rows, np.ndarray):
        return rows
    if contiguous(rows):
        return [int(rows[0]), int(rows[-1]) + 1]
    return rows


def split_dense(h: TableHandle, values) -> Messages:
    """One item per block: views of ``values``, grouped by primary owner."""
    msgs: Messages = defaultdict(list)
    for b in range(h.spec.n_blocks):
        start, stop = h.spec.block_bounds(b)
        msgs[h.primary(b)].append((b, None, values[start:stop]))
    return msgs


def in_rounds(msgs: Messages, max_bytes: int) -> list[Messages]:
    """``msgs`` cut into rounds, sent one after the other, in which no
    server gets more than ``max_bytes`` of values (or one item, where it
    alone is larger), each server's items in their order: a worker then
    needs that much memory to receive a message beyond its blocks, not its
    whole share of a large push (a 2^28-row table over 768 MiB workers)."""
    rounds: list[Messages] = []
    for addr, items in msgs.items():
        k, size = 0, 0
        for item in items:
            n = int(getattr(item[2], "nbytes", 0))
            if size and size + n > max_bytes:
                k, size = k + 1, 0
            if k == len(rounds):
                rounds.append(defaultdict(list))
            rounds[k][addr].append(item)
            size += n
    return rounds


def split_rows(h: TableHandle, rows: np.ndarray, values) -> Messages:
    """Sorted unique ``rows`` and their ``values`` grouped by block and owner."""
    msgs: Messages = defaultdict(list)
    for b, lo, hi in block_slices(h.spec, rows):
        msgs[h.primary(b)].append((b, local_rows(h.spec, b, rows[lo:hi]), values[lo:hi]))
    return msgs


def dense_requests(h: TableHandle) -> dict[str, list[tuple[int, None]]]:
    """``(block, None)`` for every block, grouped by the block's primary."""
    reqs = defaultdict(list)
    for b in range(h.spec.n_blocks):
        reqs[h.primary(b)].append((b, None))
    return reqs


def assemble_blocks(h: TableHandle, parts: dict[int, object]):
    """Whole-block values ``parts[block]`` as one array of the table's shape."""
    if h.spec.n_blocks == 1:
        return _backend.writable(parts[0])  # the caller's to change, not the server's
    xp = _backend.namespace(*parts.values())
    out = xp.empty(h.spec.shape, dtype=h.spec.dtype)
    for b, arr in parts.items():
        start, stop = h.spec.block_bounds(b)
        out[start:stop] = arr
    return out


def row_requests(h: TableHandle, rows: np.ndarray):
    """Requests for arbitrary ``rows``: ``(reqs, uniq, inverse)`` where
    ``reqs[addr]`` lists ``(block, local_rows)`` of the sorted unique rows
    ``uniq``, grouped by the block's primary, and
    ``uniq[inverse] == rows`` (``inverse`` None if rows were already sorted
    and unique)."""
    if strictly_increasing(rows):
        uniq, inverse = rows, None
    else:
        uniq, inverse = np.unique(rows, return_inverse=True)
    reqs = defaultdict(list)
    for b, lo, hi in block_slices(h.spec, uniq):
        reqs[h.primary(b)].append((b, local_rows(h.spec, b, uniq[lo:hi])))
    return reqs, uniq, inverse


def assemble_rows(h: TableHandle, parts: dict[int, object], uniq: np.ndarray, inverse):
    """Values of the requested rows from per-block replies ``parts[block]``."""
    spec = h.spec
    if not parts:  # no rows: an empty array of the table's device
        return _backend.zeros((uniq.size, *spec.row_shape), spec.dtype, spec.device)
    chunks = [parts[b] for b in sorted(parts)]
    xp = _backend.namespace(*chunks)
    out = chunks[0] if len(chunks) == 1 else xp.concatenate(chunks, axis=0)
    if inverse is not None:
        out = out[xp.asarray(inverse)]
    return out


def row_clocks(spec: TableSpec, per_block: dict, reqs: dict, whole: bool, inverse) -> np.ndarray:
    """A read's clock per row (``with_clocks=True``) from its blocks' clocks
    ``per_block``: every row of the table (``whole``) or the rows of
    ``reqs`` (block -> its local rows, blocks in row order) in the caller's
    order (``inverse``). With ``aggregate="clock"`` a block's clock is
    exact (the clocks below and none after: the servers apply a clock's
    sum once every participant completed it); otherwise a lower bound. A
    cached entry merged with rows read later keeps its older tag."""
    if whole:
        out = np.empty(spec.shape[0], dtype=np.int64)
        for b, c in per_block.items():
            start, stop = spec.block_bounds(b)
            out[start:stop] = c
        return out
    sizes = [reqs[b].shape[0] for b in reqs]
    out = np.repeat(np.array([per_block[b] for b in reqs], dtype=np.int64), sizes)
    return out if inverse is None else out[np.asarray(inverse)]
