"""A participant's buffer of pushes not yet sent (pure code).

Pushes are validated when made and kept here until ``flush``/``clock``. For
an additive rule (sum) they are merged as they arrive: dense pushes into one
array, row pushes concatenated and coalesced at flush, so many small pushes
become one message per server. For other rules (optimizer steps, assign)
every push is one step, so pushes are kept in order and still batched into
one message per server.

Ownership (ps-lite's ``ZPush``): the buffer copies what it is given unless
the caller hands its arrays over (``copy=False`` of ``ctx.push``/
``push_rows``, or arrays the validation already made fresh). It then keeps
them as they are until they are sent and acknowledged (``borrowed``): the
caller must not write to them before that, and nothing here writes to them
(a second push into a borrowed sum first copies it).
"""

from __future__ import annotations

import numpy as np

from dask_ps import _backend, _routing
from dask_ps._exceptions import PSValueError
from dask_ps._routing import TableHandle
from dask_ps._spec import TableSpec


def _wide(x):
    """Integers as a dtype their sums cannot leave (int64 for up to 32 bits, else Python ints)."""
    return x.astype(np.int64 if x.dtype.itemsize < 8 or _backend.namespace(x) is not np else object)


def _range_error(spec: TableSpec, lo, hi) -> PSValueError:
    info = np.iinfo(spec.dtype)
    return PSValueError(
        f"table {spec.name!r}: this push and the pushes buffered since the last flush sum to values in "
        f"[{lo}, {hi}], out of the range of {spec.dtype} [{info.min}, {info.max}] (the sum would wrap "
        "around); the push was not buffered, the ones before it are kept", spec.name)


class PushBuffer:
    def __init__(self, spec: TableSpec, spare=None, int32_rows: bool = False):
        self.spec = spec
        # Copies of the callers' rows as int32 (where the table's rows fit):
        # for servers in other processes, half the bytes to copy and send.
        self.int32_rows = int32_rows and spec.shape[0] <= np.iinfo(np.int32).max
        # An array of the table's shape from an earlier, already sent buffer:
        # reusing it avoids allocating (and page-faulting) a fresh one per flush.
        self.spare = spare
        self.additive = spec.rule.additive
        self.dense = None  # additive: sum of dense pushes (a private array)
        self.row_parts: list[tuple[np.ndarray, object]] = []  # additive row pushes
        self.ops: list[tuple[np.ndarray | None, object]] = []  # non-additive, in order
        self.nbytes = 0
        # Arrays the caller handed over (copy=False) are kept: such a buffer
        # is never reused as a spare, and its arrays never written.
        self.borrowed = False
        self._dense_borrowed = False
        # Values summed here (pushes merged, duplicate rows coalesced): a sum
        # of finite values can overflow, so they are checked again at flush.
        self.summed = False
        # An upper bound of the magnitude of every value ``messages`` sends
        # (from the pushes' NaN/Inf checks), which the servers' overflow
        # checks then take instead of a pass of their own; None: not known
        # (row pushes, small pushes).
        self.bound: float | None = None

    def __repr__(self):
        return f"<PushBuffer {self.spec.name!r} {self.nbytes} bytes>"

    def __bool__(self):
        return self.dense is not None or bool(self.row_parts) or bool(self.ops)

    def copy_target(self):
        """The array a copy of the next dense push goes into, so that
        ``add_dense`` keeps it as it is (None: that push is summed into the
        buffer, no copy): the spare where there is one."""
        if self.additive and self.dense is not None:
            return None
        if self.additive and self.spare is not None and self.spare.shape == self.spec.shape \
                and self.spare.dtype == self.spec.dtype and isinstance(self.spare, np.ndarray):
            return self.spare
        return np.empty(self.spec.shape, self.spec.dtype)

    def add_dense(self, values, keep: bool = False, borrowed: bool = False, bound: float | None = None) -> None:
        """Buffer a push of the whole table. ``keep``: ``values`` may be kept
        as it is, no copy (fresh from validation, or handed over);
        ``borrowed``: it is the caller's array (see the module docstring);
        ``bound``: of its magnitudes (``check_values``), if known."""
        first = not self
        exact = None if first else self._int_total(bound, dense=values)
        self.borrowed |= borrowed
        if not self.additive:
            self.ops.append((None, values if keep else values.copy()))
            self.nbytes += values.nbytes
        elif self.dense is None:
            if keep:
                self.dense, self._dense_borrowed = values, borrowed
                if values is self.spare:  # the copy went into it (copy_target)
                    self.spare = None
            elif self.spare is not None and self.spare.shape == values.shape and self.spare.dtype == values.dtype:
                # A copy into an array of an earlier flush: the caller may reuse its array.
                self.dense, self.spare = self.spare, None
                self.dense[...] = values
            else:
                self.dense = values.copy()
            self.nbytes += values.nbytes
        elif self._dense_borrowed:
            self.dense, self._dense_borrowed = self.dense + values, False  # never into the caller's array
            self.summed = True
        else:
            self.dense += values
            self.summed = True
        self._add_bound(first, bound if exact is None else exact)

    def _int_total(self, bound, dense=None, rows=None, values=None) -> float | None:
        """Integers only: whether what the buffer holds plus a push stays in
        the dtype's range. Settled by the bounds where it can be (no pass);
        else the sum is made exactly, wide, and a push that would take it
        out of range raises here, at the caller, before anything changes.
        Returns the exact total's largest magnitude (the buffer's new, tight
        bound), or None where the bounds settled it. In range, the dtype's
        own (wrapping) sums then give the exact result."""
        if self.spec.dtype.kind not in "iu" or not self.additive:
            return None
        if bound is not None and self.bound is not None and self.bound + bound <= np.iinfo(self.spec.dtype).max:
            return None
        xp = _backend.namespace(*(x for x in (self.dense, dense, values) if x is not None))
        total = xp.zeros(self.spec.shape, np.int64 if self.spec.dtype.itemsize < 8 else object) \
            if xp is np or self.spec.dtype.itemsize < 8 else xp.zeros(self.spec.shape, np.int64)
        for part in (self.dense, dense):
            if part is not None:
                total += _wide(part)
        for r, v in [*self.row_parts, *([(rows, values)] if rows is not None else [])]:
            if xp is np:
                np.add.at(total, r, _wide(v))
            else:
                _backend.scatter_add(total, xp.asarray(r), _wide(v))
        info = np.iinfo(self.spec.dtype)
        lo, hi = (int(total.min()), int(total.max())) if total.size else (0, 0)
        if lo < info.min or hi > info.max:
            raise _range_error(self.spec, lo, hi)
        return float(max(-lo, hi))

    def _add_bound(self, first: bool, bound: float | None) -> None:
        """The bound of what the buffer will send, with a push's added."""
        if bound is None or (not first and self.bound is None):
            self.bound = None
        elif first:
            self.bound = bound
        elif self.additive:
            self.bound += bound  # |a + b| <= |a| + |b| (also rows of two pushes that overlap)
        else:
            self.bound = max(self.bound, bound)  # one step per push: each is sent as it is

    def add_rows(self, rows: np.ndarray, values, keep_rows: bool = False, keep_values: bool = False,
                 borrowed: bool = False, increasing: bool | None = None, bound: float | None = None) -> None:
        """Buffer a row push. ``keep_rows``/``keep_values``: that array may
        be kept as it is, no copy (fresh from validation, or handed over);
        ``borrowed``: one of them is the caller's (see the module docstring).
        Rows that need coalescing come out as fresh arrays anyway;
        ``increasing``: whether the rows are known to be sorted and unique;
        ``bound``: of the values' magnitudes (``check_values``), if known
        (not kept where duplicate rows were summed: their sum may exceed it)."""
        # Duplicate rows of one push are summed for every rule but assign
        # (last wins), as ParameterServer.push_rows does: a step rule gets
        # the summed gradient (np.add.at semantics), not the last sample's.
        sums_duplicates = self.spec.rule.name != "assign"
        first = not self
        merged_rows, merged_values = _routing.coalesce_rows(rows, values, sums_duplicates, increasing)
        if merged_rows is not rows:  # coalesced: fresh arrays, the buffer's own
            keep_rows = keep_values = True
            borrowed = False
            if sums_duplicates and merged_rows.size < rows.size:
                self.summed = True
                bound = None  # a row's sum may exceed the bound of the values
                if self.spec.dtype.kind in "iu":  # summed wide (numpy's reduceat): in range, or refused
                    lo, hi = (int(merged_values.min()), int(merged_values.max())) if merged_values.size else (0, 0)
                    info = np.iinfo(self.spec.dtype)
                    if lo < info.min or hi > info.max:
                        raise _range_error(self.spec, lo, hi)
                    merged_values, bound = merged_values.astype(self.spec.dtype, copy=False), float(max(-lo, hi))
        exact = None if first else self._int_total(bound, rows=merged_rows, values=merged_values)
        self._add_bound(first, bound if exact is None else exact)
        self.borrowed |= borrowed
        part = (merged_rows if keep_rows else self._own_rows(merged_rows),
                merged_values if keep_values else merged_values.copy())
        (self.row_parts if self.additive else self.ops).append(part)
        self.nbytes += merged_values.nbytes + merged_rows.nbytes

    def _own_rows(self, rows: np.ndarray) -> np.ndarray:
        """The buffer's copy of the caller's rows: int32 for servers in other
        processes (``int32_rows``; a 100k-row message's fresh arrays
        page-fault in a Dask worker process); a server in this process
        indexes with int64 faster."""
        if self.int32_rows and rows.dtype == np.int64:
            return rows.astype(np.int32)
        return rows.copy()

    @property
    def spare_after_send(self):
        """The dense array to reuse for the next buffer once this one was
        sent and acknowledged (None: none, or it is the caller's). A spare
        this buffer did not use (a ``copy=False`` push) is still free."""
        if self.dense is None or self._dense_borrowed:
            return self.spare
        return self.dense

    def max_abs(self) -> float:
        """Largest magnitude of any element's pending update, summed over all
        buffered pushes (the VAP norm)."""
        if not self:
            return 0.0
        if self.additive and self.dense is None:
            _, pv = self._merged_rows()
            return float(abs(pv).max()) if pv.size else 0.0
        if self.additive:
            total = self.dense
            if self.row_parts:
                rows, vals = self._merged_rows()
                total = total.copy()
                _backend.add_rows(total, _backend.namespace(total).asarray(rows), vals)
        else:  # optimizer steps pending in order: their summed update, exactly
            xp = _backend.namespace(*(v for _, v in self.ops))
            total = xp.zeros(self.spec.shape, dtype=self.spec.dtype)
            for rows, vals in self.ops:
                if rows is None:
                    total += vals
                else:
                    _backend.scatter_add(total, xp.asarray(rows), vals)
        return float(abs(total).max())

    def messages(self, h: TableHandle) -> _routing.Messages:
        """The buffer as one list of items per server (does not clear it)."""
        if self.additive:
            if self.dense is not None:
                if self.row_parts:
                    rows, vals = self._merged_rows()
                    dense = self.dense.copy()
                    xp = _backend.namespace(dense)
                    _backend.add_rows(dense, xp.asarray(rows), vals)  # rows are unique after merging
                    self.summed = True
                else:
                    dense = self.dense
                return _routing.split_dense(h, dense)
            if self.row_parts:
                return _routing.split_rows(h, *self._merged_rows())
            return {}
        msgs: _routing.Messages = {}
        for rows, vals in self.ops:
            part = _routing.split_dense(h, vals) if rows is None else _routing.split_rows(h, rows, vals)
            for addr, items in part.items():
                msgs.setdefault(addr, []).extend(items)
        return msgs

    def _merged_rows(self):
        if len(self.row_parts) == 1:
            return self.row_parts[0]
        xp = _backend.namespace(*(v for _, v in self.row_parts))
        rows = np.concatenate([r for r, _ in self.row_parts])
        vals = xp.concatenate([v for _, v in self.row_parts], axis=0)
        merged = _routing.coalesce_rows(rows, vals, additive=True)
        self.row_parts = [merged]  # keep the merged form (overlays reuse it)
        self.summed |= merged[0].size < rows.size  # duplicate rows were summed
        return merged

    # --- read-my-writes: own pending updates, added to what a read returns ----------
    def overlay_dense(self, out, owned: bool = False):
        """``out`` plus the pending updates (additive tables only); added in
        place when ``out`` is the caller's own (``owned``)."""
        if self.dense is not None:
            if owned:
                out += self.dense
            else:
                out, owned = out + self.dense, True
        if self.row_parts:
            rows, vals = self._merged_rows()
            out = out if owned else out.copy()
            xp = _backend.namespace(out)
            _backend.add_rows(out, xp.asarray(rows), vals)
        return out

    def overlay_rows(self, rows: np.ndarray, out, owned: bool = False):
        """``out`` (the values of ``rows``) plus the pending updates of those
        rows; added in place when ``out`` is the caller's own (``owned``)."""
        xp = _backend.namespace(out)
        if self.dense is not None:
            if owned:
                out += self.dense[xp.asarray(rows)]
            else:
                out, owned = out + self.dense[xp.asarray(rows)], True
        if self.row_parts:
            prow, pvals = self._merged_rows()
            pos = np.searchsorted(prow, rows)
            pos_c = np.minimum(pos, max(prow.size - 1, 0))
            hit = (pos < prow.size) & (prow[pos_c] == rows) if prow.size else np.zeros(rows.size, bool)
            if hit.any():
                out = out if owned else out.copy()
                idx = np.flatnonzero(hit)
                _backend.add_rows(out, xp.asarray(idx), pvals[xp.asarray(pos_c[idx])])
        return out
