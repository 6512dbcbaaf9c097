"""Two-phase pushes' holds and senders' leases (issue 34; pure code).

A push over several servers is checked and held at each one before any
applies it (:func:`hold`; the commit takes it out, :func:`take_hold`), so
the check a held push passed stays true until its commit: its bound is
reserved in its blocks (``Block.held``) and counted by every later check
of a sum (``_sums``). After a sender's first such push a server leases it a
bound it may push unchecked (:func:`top_up`); a push within it goes in one
phase (:func:`spend`), and others' pushes keep room for what leases may
still add (``Block.leased``).

The state lives in the table (``TableShards.holds``, ``.leases``) and its
blocks; these functions are the only ones that change it, besides
``ShardStore.set_placement`` and ``forget_run``, which drop it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dask_ps import _config
from dask_ps._exceptions import PSValueError, StaleVersionError
from dask_ps._sums import _bound_of, _check_pending_sums, _check_sums, _checks_results, _headroom
from dask_ps.rules import Sum


@dataclass
class Hold:
    """A push checked by phase 1 of a two-phase push, not applied: its
    items (None: the commit brings the values again), ``id(values) ->
    bound`` of them, and the bound it reserves per block (``Block.held``)."""

    expires: float
    items: list | None
    bounds: dict
    reserved: dict[int, float]
    checked: bool  # the check apply/accumulate would make was made (the commit skips it)


@dataclass
class Lease:
    """Bounds a sender may push to blocks unchecked (:func:`spend`):
    reserved in their ``Block.leased`` until spent or expired."""

    expires: float
    left: dict[int, float]


def hold(t: "TableShards", hold_id: str, items: list, bounds: dict, run=None, keep: bool = True) -> None:
    """Phase 1 of a push over several servers: check ``items`` as
    ``ShardStore.apply`` (or ``ShardStore.accumulate``, ``run = (run_id, clock)``)
    would, raising :class:`PSValueError` if they would be refused, but
    apply nothing: the push is held, and its bound reserved in every
    later check (``Block.held``), until :func:`release` (the commit
    applies it unchecked, or an abort drops it). ``keep=False``: the
    commit brings the values again (a push in several rounds)."""
    now = time.monotonic()
    for k in [k for k, h in t.holds.items() if h.expires < now]:  # a sender that never came back
        release(t, k)
    if hold_id in t.holds:  # phase 1 sent again
        return
    checks = _checks_results(t.spec, t.spec.rule)
    checked = checks and (run is not None and t.spec.aggregate == "clock" or isinstance(t.spec.rule, Sum))
    if not checked:  # no check, or one only the result can settle (another rule): at the commit
        reserved = {}
    elif run is not None and t.spec.aggregate == "clock":
        reserved = _check_pending_sums(t, (run[0], int(run[1])), items)
    else:
        reserved = _check_sums(t, items, bounds, grow=False)
    for b, x in reserved.items():
        t.blocks[b].held += x
    ttl = _config.get_seconds("timeouts.failover")
    t.holds[hold_id] = Hold(now + ttl, items if keep else None, bounds, reserved, checked)


def take_hold(store, name, version, table_id, commit) -> Hold | None:
    """The push that ``commit = (hold id, apply)`` names, taken out of
    its table (None: not a commit). One not held here (a placement
    change dropped it) raises a retryable error: the sender then sends
    the push again, whole."""
    if commit is None:
        return None
    if not (isinstance(commit, (list, tuple)) and len(commit) == 2 and isinstance(commit[0], str)):
        raise PSValueError(f"a push's commit must be [hold id, apply], got {commit!r}")
    t = store.get(name, None if not commit[1] else version, table_id, frozen_ok=not commit[1])
    held = release(t, commit[0])
    if held is None and commit[1]:
        raise StaleVersionError(f"table {t.spec.name!r}: the push to commit is not held here; send it again")
    return held


def spend(t: "TableShards", sender, items: list, bounds: dict, per_clock: bool) -> dict[int, float] | None:
    """One phase for a push over several servers (issue 34): if
    ``sender``'s lease covers every item's bound, draw on it and return
    the bounds per block (the push is then applied without a check: the
    lease's reservation proves its sum fits); else None (checked as
    usual). Only for sums (``per_clock``: summed per clock)."""
    lease = t.leases.get(sender) if isinstance(sender, str) else None
    if (lease is None or lease.expires < time.monotonic() or not _checks_results(t.spec, t.spec.rule)
            or not (per_clock or isinstance(t.spec.rule, Sum))):
        return None
    need: dict[int, float] = {}
    for b, _, v in items:
        x = _bound_of(v, bounds)
        if bounds is not None:
            bounds[id(v)] = x  # kept for apply: one pass over the values here
        need[b] = need.get(b, 0.0) + x
    if any(lease.left.get(b, 0.0) < x for b, x in need.items()):
        return None
    for b, x in need.items():
        lease.left[b] -= x
        t.blocks[b].leased = max(0.0, t.blocks[b].leased - x)
    return need


def top_up(t: "TableShards", sender, blocks) -> list:
    """Renew ``sender``'s lease on ``blocks`` (a sixteenth of what no
    bound, hold or lease of the block takes, when below half of that),
    dropping expired leases; returns ``[[block, bound it may push
    unchecked], ...]`` for the sender's next push (``Router.send``)."""
    now = time.monotonic()
    for k in [k for k, x in t.leases.items() if x.expires < now]:
        drop_lease(t, k)
    if not (isinstance(sender, str) and _checks_results(t.spec, t.spec.rule)):
        return []
    lease = t.leases.setdefault(sender, Lease(0.0, {}))
    lease.expires = now + _config.get_seconds("timeouts.failover")
    for b in set(blocks):
        have = lease.left.get(b, 0.0)
        free = _headroom(t, b)
        if have < (free + have) / 32:
            lease.left[b] = (free + have) / 16
            t.blocks[b].leased += lease.left[b] - have
    return [[b, lease.left[b]] for b in sorted(set(blocks)) if b in lease.left]


def drop_lease(t: "TableShards", sender: str) -> None:
    lease = t.leases.pop(sender, None)
    for b, x in (lease.left.items() if lease is not None else ()):
        if b in t.blocks:
            t.blocks[b].leased = max(0.0, t.blocks[b].leased - x)


def release(t: "TableShards", hold_id) -> Hold | None:
    """Take a held push out (None if it is not held here: dropped by a
    placement change, or expired); its reservation ends."""
    h = t.holds.pop(hold_id, None) if isinstance(hold_id, str) else None
    for b, x in (h.reserved if h is not None else {}).items():
        if b in t.blocks:
            t.blocks[b].held = max(0.0, t.blocks[b].held - x)
    return h
