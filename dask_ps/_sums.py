"""Checks and orders of sums (pure code, used by ``_shard``).

A table that forbids NaN/Inf refuses a push whose result would be
non-finite (issue 22); an integer table refuses a push whose sum leaves its
dtype's range (issue 34: it used to wrap). Both are decided before anything
changes: bounds of the stored rows and of the push settle almost every push
(``Block.bound``), and only near the range is the sum made. A push held by
a two-phase push (``_holds.hold``) counts in every later check by its
bound (``Block.held``) until it is applied or dropped.

Per-clock sums are applied in the senders' order, so a BSP fit's result
does not depend on the order the pushes arrived in.
"""

from __future__ import annotations

import math

import numpy as np

from dask_ps import _backend
from dask_ps._exceptions import PSValueError, StaleVersionError
from dask_ps.rules import Assign, Sum

# --- sums and steps that would leave a table non-finite or out of range (issues 22, 34) -----

_BUILTIN_STATE_RULES = ("sgd", "momentum", "adagrad", "adam")  # state arrays shaped like the block


def _checks_results(spec, rule) -> bool:
    """Whether a push's result is checked: in a float table that forbids
    NaN/Inf, a rule that computes (``assign`` stores the pushed values,
    which are checked already); in an integer table, a sum (always: a sum
    out of range would wrap around)."""
    if spec.dtype.kind in "iu":
        return isinstance(rule, Sum)
    return not spec.allow_nonfinite and spec.dtype.kind in "fc" and not isinstance(rule, Assign)


def held_first(spec) -> bool:
    """Whether a push over several servers is held at every one of them
    (checked, nothing applied) before any applies it (``Router.send``): a
    server may refuse it for what it would make of its stored values (a
    sum that overflows). Another rule's result is known only once made:
    its servers check it when they apply."""
    return _checks_results(spec, spec.rule) and (isinstance(spec.rule, Sum) or spec.aggregate == "clock")


def _overflow_error(t, b: int, what: str = "the push") -> PSValueError:
    name, dtype = t.spec.name, t.spec.dtype
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        why = (f"would take block {b}'s values out of the range of {dtype} [{info.min}, {info.max}] "
               "(the sum overflows)")
    elif isinstance(t.spec.rule, Sum):
        why = (f"would make block {b}'s values NaN or Inf (the result overflows {dtype}) and the table "
               "does not allow non-finite values")
    else:  # checked after the step, by each server on its own blocks
        return PSValueError(
            f"table {name!r}: {what} would make block {b}'s values NaN or Inf (rule {t.spec.rule.name!r}) and "
            "the table does not allow non-finite values; the push's blocks on this server were put back, but a "
            "rule other than 'sum' is checked where it is applied: its blocks on other servers may have been "
            "applied", name)
    return PSValueError(f"table {name!r}: {what} {why}; nothing was applied", name)


def overflow_limit(dtype) -> float:
    """Bounds of a sum's terms that add up to at most this cannot overflow
    ``dtype`` (half its largest value: float bounds of 64-bit integers are
    rounded)."""
    dtype = np.dtype(dtype)
    return float(np.iinfo(dtype).max) / 2 if dtype.kind in "iu" else _backend.overflow_limit(dtype)


def push_bound(x) -> float:
    """An upper bound of ``max(|x|)``: ``_backend.abs_bound`` of a float
    array; of integers (also rows as their nonzeros, ``RowsToAdd``) their
    largest magnitude, exactly (no ``abs``: it wraps at the dtype's minimum)."""
    if getattr(x, "dtype", None) is None or x.dtype.kind not in "iub":
        return _backend.abs_bound(x)
    vals = getattr(x, "values", None)  # DenseRows
    if vals is None and hasattr(x, "counts"):  # EncodedRows: the nonzeros, as the dtype
        vals = x.vals.view(x.dtype)
    vals = x if vals is None else vals
    if vals.size == 0:
        return 0.0
    return float(max(-int(vals.min()), int(vals.max())))


def _dense(vals):
    return vals.toarray() if hasattr(vals, "toarray") and not _backend.is_array(vals) else vals


def _finite_sum(*terms, slack: float = 0.0) -> bool:
    """Whether ``terms[0] + terms[1] + ...`` is finite (float arrays, added
    in that order) or in range (integers: the exact sum; a sum that wraps
    and comes back is the exact one, so only the total matters), with room
    for ``slack`` more in magnitude (what leases may still push unchecked)."""
    terms = [_dense(x) for x in terms]
    kind = terms[0].dtype.kind
    if kind in "iu":
        info = np.iinfo(terms[0].dtype)
        wide = object if terms[0].dtype.itemsize >= 8 else np.int64  # 64 bits: near the range only
        total = np.asarray(terms[0]).astype(wide)
        for x in terms[1:]:
            total = total + np.asarray(x).astype(wide)
        if total.size == 0:
            return True
        lo, hi = int(total.min()), int(total.max())
        return info.min + math.ceil(slack) <= lo and hi + math.ceil(slack) <= info.max
    xp = _backend.namespace(*terms)
    with np.errstate(over="ignore", invalid="ignore"):
        total = terms[0].copy()
        for x in terms[1:]:
            total += x
        if not slack or total.size == 0:
            return bool(xp.isfinite(total).all())
        return float(xp.max(xp.abs(total))) + slack <= float(np.finfo(total.dtype).max)


def _headroom(t, b: int) -> float:
    """What no bound takes of block ``b``'s range yet: its values', its
    pending per-clock sums', held pushes' and leases'. Measured again
    where the values' bound is loose (it grows by every push's)."""
    blk, limit = t.blocks[b], overflow_limit(t.spec.dtype)
    pending = sum(_pending_bound(t, k, b) for k in t.pending if b in t.pending[k])
    taken = pending + blk.held + blk.leased
    if _data_bound(blk) + taken > limit / 2:
        blk.bound = push_bound(blk.data)
    return max(0.0, limit - blk.bound - taken)


def _data_bound(blk) -> float:
    """``blk.bound``, measured (one pass over the block) when not known."""
    if blk.bound is None:
        blk.bound = push_bound(blk.data)
    return blk.bound


def _bound_of(vals, bounds: dict | None) -> float:
    """The bound of a push's values: known (``bounds``), else measured."""
    known = bounds.get(id(vals)) if bounds else None
    return push_bound(vals) if known is None else known


def _near_held(t, b: int) -> None:
    """Near the range, a block with a held push (two-phase, not applied
    yet) cannot be settled by this push's exact sum: the held one may be
    applied after it. The caller retries once it is applied or dropped."""
    if t.blocks[b].held > 0:
        raise StaleVersionError(f"table {t.spec.name!r}: a push to block {b} is being committed; retry")


def _check_sums(t, items: list, bounds: dict | None = None, grow: bool = True) -> dict[int, float]:
    """Rule "sum": raise before anything changes if a stored row plus the
    push overflows. The block's bound (``Block.bound``), held pushes'
    (``Block.held``) and the push's (``push_bound``: one BLAS pass over a
    float push) settle it unless they come within half of the dtype's
    range; then the touched rows are measured, and only if that does not
    settle it either is the sum made. The block's bound grows by the push's
    (not if ``grow`` is false: a held push, see ``_holds.hold``).
    Returns the push's bound per block."""
    limit = overflow_limit(t.spec.dtype)
    by_block: dict[int, list] = {}
    for b, rows, vals in items:
        by_block.setdefault(b, []).append((rows, vals, _bound_of(vals, bounds)))
    out = {}
    for b, its in by_block.items():
        blk = t.blocks[b]
        pushed = out[b] = sum(bv for _, _, bv in its)
        if _data_bound(blk) + blk.held + blk.leased + pushed <= limit:
            blk.bound += pushed if grow else 0.0
            continue
        blk.bound = push_bound(blk.data)  # measured again: it may have been loose
        if blk.bound + blk.held + blk.leased + pushed <= limit:
            blk.bound += pushed if grow else 0.0
            continue
        _near_held(t, b)
        if len(its) == 1:
            rows, vals, _ = its[0]
            ok = _finite_sum(_rows_of(blk.data, rows), vals, slack=blk.leased)
        else:  # one block twice in a message: its sum, made whole
            wide = blk.data.dtype.kind in "iu"
            whole = blk.data.astype(object if blk.data.dtype.itemsize >= 8 else np.int64) if wide else blk.data.copy()
            with np.errstate(over="ignore", invalid="ignore"):
                for rows, vals, _ in its:
                    Sum().apply(whole, _dense(vals).astype(whole.dtype), {}, rows)
            ok = _finite_sum(np.zeros(whole.shape, blk.data.dtype), whole, slack=blk.leased)
        if not ok:
            raise _overflow_error(t, b)
        blk.bound = None  # near the range: measured again at the next push
    return out


def _rows_of(arr, rows):
    """The rows of a block a push touches (a copy for an index array)."""
    if rows is None:
        return arr
    if isinstance(rows, slice):
        return arr[rows]
    return _backend.take_rows(arr, rows)


def _snapshot(t, b: int, rows, in_place: bool) -> tuple:
    """What a rule's step may change in block ``b`` (its rows, or the whole
    block; the rule's state), to put back if the result is not finite.
    ``in_place=False``: the step writes a fresh array, the block stays."""
    blk = t.blocks[b]
    take = (lambda a: a.copy()) if rows is None else (lambda a: a[rows])  # index rows: a copy
    data = take(blk.data) if in_place else None
    if t.spec.rule.name in _BUILTIN_STATE_RULES:
        state = {k: take(v) for k, v in blk.state.items()}
    else:  # a custom rule may change any of its state
        state = {k: v.copy() if _backend.is_array(v) else v for k, v in blk.state.items()}
    return data, state


def _check_results(t, items: list, fresh: dict, undo: list) -> None:
    """After a rule's steps: the rows they wrote (and a built-in rule's
    state there) must be finite, else this server's steps are put back
    and the push raises."""
    builtin = t.spec.rule.name in _BUILTIN_STATE_RULES
    for b, rows, _ in items:
        blk = t.blocks[b]
        arrays = [fresh.get(b, blk.data)] + (list(blk.state.values()) if builtin else [])
        bad = [a for a in arrays if a.dtype.kind in "fc" and not _backend.all_finite(a if rows is None else a[rows])]
        if bad:
            put_back(t, items, fresh, undo)
            raise _overflow_error(t, b)


def put_back(t, items: list, fresh: dict, undo: list) -> None:
    """Undo the steps of ``items`` whose snapshots ``undo`` holds (the
    first ``len(undo)``: a rule that raised took fewer), last first."""
    builtin = t.spec.rule.name in _BUILTIN_STATE_RULES
    for (b, rows, _), (data, state) in reversed(list(zip(items, undo))):
        blk = t.blocks[b]
        blk.seq -= 1
        if data is not None:
            blk.data[... if rows is None else rows] = data
        if builtin:
            for k, v in state.items():
                blk.state[k][... if rows is None else rows] = v
        else:
            blk.state.clear()
            blk.state.update(state)
    fresh.clear()


def _pending_bound(t, key, b: int) -> float:
    bound = t.pending_bound.get(key, {}).get(b)
    if bound is None:  # installed from another worker: measured once
        bound = sum(push_bound(v) for _, v in _pushes_in_sender_order(t.pending[key][b]))
        t.pending_bound.setdefault(key, {})[b] = bound
    return bound


def _check_pending_sums(t, key, items: list) -> dict[int, float]:
    """aggregate="clock": raise if adding ``items`` to the pending sums could
    make a value non-finite when they are applied (rule "sum": the stored
    rows plus every pending sum of the block plus this push; another rule:
    the sums themselves). Bounds settle it (``pending_bound``); near the
    dtype's range the sums are made. Returns the push's bound per block."""
    limit = overflow_limit(t.spec.dtype)
    additive = isinstance(t.spec.rule, Sum)
    added: dict[int, float] = {}
    earlier: dict[int, list] = {}  # this push's earlier items, by block
    for b, rows, vals in items:
        pend = sorted(k for k in t.pending if b in t.pending[k])
        bound = push_bound(vals)
        total = (bound + added.get(b, 0.0) + sum(_pending_bound(t, k, b) for k in pend)
                 + (_data_bound(t.blocks[b]) + t.blocks[b].held + t.blocks[b].leased if additive else 0.0))
        added[b] = added.get(b, 0.0) + bound
        earlier.setdefault(b, []).append((rows, vals))
        if total <= limit:
            continue
        _near_held(t, b)
        # Near the range: the sums as they would be applied, made whole.
        base = t.blocks[b].data.copy() if additive else _backend.namespace(vals).zeros_like(t.blocks[b].data)
        terms = [base] + [_in_sender_order(t.pending[k][b], base) for k in pend]
        for r, v in earlier[b]:
            extra = _backend.namespace(v).zeros_like(base)
            Sum().apply(extra, _dense(v), {}, r)
            terms.append(extra)
        if not _finite_sum(*terms, slack=t.blocks[b].leased if additive else 0.0):
            raise _overflow_error(t, b, "the push, summed with its clock's other pushes,")
    return added


def _sender_key(sender: str):
    """Senders are ``f"{run_id}-{secret}-{rank}"``: by rank (a sum carried over from
    another worker, ``""``, first)."""
    tail = sender.rsplit("-", 1)[-1]
    return (0, int(tail), "") if tail.isdigit() else (-1, 0, sender)


def _pushes_in_sender_order(by_sender: dict) -> list:
    """One clock's pushes ``(rows, values)`` to one block, in the senders'
    order (each sender's in the order they came): applied so, the result has
    the same bits whatever order the pushes arrived in (BSP fits
    reproducible)."""
    return [p for k in sorted(by_sender, key=_sender_key) for p in by_sender[k]]


def _in_sender_order(by_sender: dict, like):
    """One clock's pushes to one block summed into a new array shaped as
    ``like`` (the block), in the senders' order."""
    total = _backend.namespace(like).zeros_like(like)
    for rows, vals in _pushes_in_sender_order(by_sender):
        if rows is None:
            total += vals
        else:
            _backend.add_rows(total, rows, vals)  # rows are unique within a push
    return total
