"""Worker-side shard storage (pure code: no Dask, no event loop).

A worker hosts some row blocks of each table. ``ShardStore`` validates every
message against the table spec *before* touching any block, so a bad message
changes nothing, then applies the update rule block by block.

Exactly once: a push carries its sender's id and a per-sender message number;
each block remembers the numbers of the last ``APPLIED_WINDOW`` messages it
applied from every sender, so a push that is re-sent after a failure (to a
replica that already got it) is not applied twice.

Torn reads: a whole-block pull replies with the stored array itself (no copy;
Dask sends it as a zero-copy frame) and marks the block ``shared``. The next
write to a shared block writes into a fresh array instead of in place, so a
reply still being sent always shows one consistent state (copy-on-write).
"""

from __future__ import annotations

import copy

import contextlib
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from dask_ps import _backend, _config
from dask_ps._exceptions import PSValueError, StaleVersionError, UnknownTableError
from dask_ps import _holds, _sparse_rows
from dask_ps._holds import Hold, Lease
from dask_ps._sparse_rows import DenseRows, EncodedRows, RowsToAdd
from dask_ps._spec import CASTING, TableSpec, check_int_range, refuse_masked, strictly_increasing
from dask_ps._sums import (_bound_of, _check_pending_sums, _check_results, _check_sums, _checks_results,
                           _in_sender_order, _pushes_in_sender_order, _snapshot, put_back)
from dask_ps.rules import Assign, Custom, Registered, Sum


@dataclass
class Block:
    data: object  # numpy or cupy array of shape (rows_in_block, *row_shape)
    state: dict = field(default_factory=dict)
    shared: bool = False  # handed out without a copy: copy before the next write
    seq: int = 0  # number of updates applied; lets caches order snapshots and own writes
    # sender -> numbers of its recent messages applied here (exactly-once on retry)
    applied: dict[str, deque] = field(default_factory=dict)
    # aggregate="clock", a block installed from another worker: run -> every
    # per-clock sum of that run's clocks below it is in ``data`` (its old
    # owner may have applied more clocks than this worker has yet)
    summed_below: dict[str, float] = field(default_factory=dict)
    # rule "sum" in a table that forbids NaN/Inf: an upper bound of
    # max|data| (None: not known), kept up to date by every sum applied, so
    # a push's overflow check reads only the push (``_check_sums``)
    bound: float | None = None
    # bounds of pushes held here by a two-phase push (``hold``), not applied
    # yet: every overflow check counts them
    held: float = 0.0
    leased: float = 0.0  # what senders' leases may still push here unchecked (``_holds.top_up``)

    def __repr__(self):
        return f"<Block {self.data.shape} {self.data.dtype} shared={self.shared}>"


@dataclass
class TableShards:
    spec: TableSpec
    version: int
    blocks: dict[int, Block]
    # aggregate="clock": summed pushes waiting for their clock to complete,
    # by (run_id, clock), block, then sender (each sender's own sum: they are
    # added in the senders' order when due, so the result does not depend on
    # the order the pushes arrived in).
    pending: dict[tuple[str, int], dict[int, dict[str, object]]] = field(default_factory=dict)
    # aggregate="clock": per (run_id, clock) and block, an upper bound of
    # max|sum| of its pending pushes (``_backend.abs_bound`` added up), so a
    # push's overflow check need not read every pending sum (``accumulate``)
    pending_bound: dict[tuple[str, int], dict[int, float]] = field(default_factory=dict)
    # run -> every per-clock sum of that run's clocks below it is applied to
    # every block here (``due`` pops all sums below a clock at once)
    summed_below: dict[str, float] = field(default_factory=dict)
    owners: list[list[str]] = field(default_factory=list)  # the table's placement, primary first
    # During a placement change every holder is frozen (refuses client pushes
    # and pulls, which retry) from before blocks are copied until it adopts
    # the new placement, so no block ever has two primaries.
    frozen: bool = False
    # Replica blocks that missed a forwarded push (fenced by the scheduler):
    # they refuse reads until a placement change copies them again.
    missed: set[int] = field(default_factory=set)
    # Reads answered here, by the role this worker had for the block
    # (tests and benchmarks check that replicas serve reads).
    reads: dict[str, int] = field(default_factory=lambda: {"primary": 0, "replica": 0})

    # Pushes checked and held by phase 1 of a two-phase push, by hold id,
    # until the sender commits (applies) or aborts them (``_holds.hold``).
    holds: dict[str, Hold] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)  # by sender (``_holds.top_up``)

    def __repr__(self):
        return f"<TableShards {self.spec.name!r} v{self.version} blocks={sorted(self.blocks)}>"

    def replicas(self, block: int, me: str) -> list[str]:
        """Workers this (primary) worker forwards ``block``'s pushes to."""
        if block < len(self.owners) and self.owners[block] and self.owners[block][0] == me:
            return list(self.owners[block][1:])
        return []

    @property
    def nbytes(self) -> int:
        return sum(b.data.nbytes for b in self.blocks.values())


# One validated update: (block, local rows or None, values).
PushItem = tuple[int, "np.ndarray | None", object]

_ASSIGN = Assign()
APPLIED_WINDOW = 256  # a retry comes within a few messages of the original


class ShardStore:
    """All shards one worker hosts, by table name."""

    def __init__(self):
        self.tables: dict[str, TableShards] = {}

    def __repr__(self):
        return f"<ShardStore {sorted(self.tables)}>"

    # --- table lifecycle ------------------------------------------------------
    def create(self, spec: TableSpec, version: int | None, blocks: list[int], owners=None) -> TableShards:
        """Allocate zero blocks. ``version=None``: blocks for a placement that
        is not adopted yet (a new table here starts frozen)."""
        if owners is not None:
            owners = check_owners(spec, owners)
        try:
            spec.rule.check_available()  # a rule registered by name must be registered here
        except LookupError as e:
            raise PSValueError(f"table {spec.name!r}: {e}", spec.name) from None
        have = self.tables.get(spec.name)
        if have is not None and have.spec.table_id == spec.table_id:
            # Idempotent re-send, or more blocks after a placement change.
            if version is not None and version >= have.version:
                have.version = version
                have.owners = [list(o) for o in owners] if owners is not None else have.owners
        else:
            have = self.tables[spec.name] = TableShards(
                spec, version or 0, {}, owners=[list(o) for o in owners or []], frozen=version is None
            )
        for b in blocks:
            if b not in have.blocks:
                data = _backend.zeros(spec.block_shape(b), spec.dtype, spec.device)
                have.blocks[b] = Block(data, spec.rule.init_state(data))
        return have

    def set_placement(self, name: str, table_id: str, version: int, owners, me: str) -> None:
        """A newer placement: adopt it and drop blocks this worker no longer owns."""
        t = self.tables.get(name)
        if not isinstance(version, int) or isinstance(version, bool):
            raise PSValueError(f"set_placement needs an int version, got {version!r}")
        if t is None or t.spec.table_id != table_id or version < t.version:
            return
        # A whole placement, checked before anything changes: a malformed one
        # (e.g. no owners at all) must not make this worker drop its blocks.
        owners = check_owners(t.spec, owners)
        for hold_id in list(t.holds):  # a commit after a placement change sends its push again
            _holds.release(t, hold_id)
        t.leases.clear()  # blocks move: a sender's next push is checked, and leased again
        for blk in t.blocks.values():
            blk.leased = 0.0
        t.version = version
        t.frozen = False
        t.owners = [list(o) for o in owners]
        for b in [b for b in t.blocks if b >= len(t.owners) or me not in t.owners[b]]:
            del t.blocks[b]
        t.missed &= set(t.blocks)

    def fence(self, name: str, table_id: str, blocks) -> list[int]:
        """Mark replica blocks that missed a forwarded push: reads of them are
        refused (readers retry at the primary) until a fresh copy is installed."""
        if not (isinstance(name, str) and isinstance(blocks, (list, tuple))
                and all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in blocks)):
            raise PSValueError("fence needs a table name and a list of block numbers")
        t = self.tables.get(name)
        if t is None or t.spec.table_id != table_id:
            return []
        fenced = sorted(int(b) for b in blocks if int(b) in t.blocks)
        t.missed.update(fenced)
        return fenced

    @staticmethod
    def export(t: TableShards, blocks) -> list[dict]:
        """Everything needed to recreate blocks elsewhere (values, rule state,
        sequence numbers, exactly-once bookkeeping). Copies, so a later write
        here cannot change what is being sent."""
        out = []
        for b in blocks:
            blk = t.blocks[b]
            out.append({
                "block": b,
                "data": blk.data.copy(),
                # a custom rule may keep numbers or objects too (an int has no .copy)
                "state": {k: v.copy() if _backend.is_array(v) else copy.deepcopy(v) for k, v in blk.state.items()},
                "seq": blk.seq,
                "applied": {k: list(v) for k, v in blk.applied.items()},
                # aggregate="clock": sums still waiting for their clock move
                # too, and how far this copy has applied them
                "pending": [[run, clock, _in_sender_order(acc[b], blk.data)] for (run, clock), acc in t.pending.items()
                            if b in acc],
                "summed_below": {run: _wire_clock(ShardStore.summed_below_of(t, b, run))
                                 for run in {*t.summed_below, *blk.summed_below}},
            })
        return out

    def install(self, spec: TableSpec, version: int | None, owners, exported: list[dict],
                min_clocks: dict[str, float] | None = None) -> None:
        """Receive blocks exported by another worker (migration, new replica,
        restore). ``version=None``: keep this worker's placement (the new one
        is adopted later, by ``set_placement``). ``min_clocks`` (run -> the
        run's min clock this worker heard of): per-clock sums the blocks
        carry for clocks below it are applied now, not at the next advance
        (a read that starts after the install must see them)."""
        t = self.create(spec, version, [], owners)
        for e in exported:
            b = int(e["block"])
            refuse_masked(spec.name, e["data"], "an installed block")
            data = _backend.to_device(e["data"], spec.device)
            if tuple(data.shape) != spec.block_shape(b) or data.dtype != spec.dtype:
                raise PSValueError(
                    f"table {spec.name!r}: block {b} must be {spec.block_shape(b)} {spec.dtype}, "
                    f"got {tuple(data.shape)} {data.dtype}",
                    spec.name,
                )
            state = {k: _backend.to_device(v, spec.device) for k, v in (e.get("state") or {}).items()}
            if not state:
                state = spec.rule.init_state(data)
            applied = {k: deque(v, maxlen=APPLIED_WINDOW) for k, v in (e.get("applied") or {}).items()}
            summed = {run: _unwire_clock(c) for run, c in (e.get("summed_below") or {}).items()}
            t.blocks[b] = Block(data, state, seq=int(e.get("seq", 0)), applied=applied, summed_below=summed)
            t.missed.discard(b)  # a fresh copy: up to date again
            for run, clock, acc in e.get("pending") or ():
                # One sum of the clock's pushes so far (summed in the senders' order).
                t.pending.setdefault((run, int(clock)), {})[b] = {"": [(None, _backend.to_device(acc, spec.device))]}
                t.pending_bound.get((run, int(clock)), {}).pop(b, None)  # recomputed when needed
        installed = [int(e["block"]) for e in exported]
        for run, m in (min_clocks or {}).items():
            # The blocks are this message's own fresh arrays: apply in place.
            for items in self.due(t, run, m, blocks=installed):
                self.commit(t, self.apply(t, items, check=False))  # checked when pushed

    @staticmethod
    def check_loaded(spec: TableSpec, e: dict) -> dict:
        """A block read from a checkpoint file, checked against ``spec``
        before any copy takes it (``ps_load_blocks``): its number, the exact
        shape and dtype of its values and of the rule's state (the keys a
        built-in rule keeps), a sequence number, and no NaN/Inf where the
        table forbids them. Raises :class:`PSValueError` naming the table
        and the block."""
        name = spec.name
        b = e.get("block")
        if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or not 0 <= b < spec.n_blocks:
            raise PSValueError(f"table {name!r}: checkpoint block {b!r} is not one of its {spec.n_blocks} blocks",
                               name)
        where = f"table {name!r}: block {b} of the checkpoint"
        data = e.get("data")
        if not _backend.is_array(data):
            raise PSValueError(f"{where} has no values array", name)
        refuse_masked(name, data, "a checkpoint block")
        if tuple(data.shape) != spec.block_shape(b) or data.dtype != spec.dtype:
            raise PSValueError(f"{where} holds {tuple(data.shape)} {data.dtype}, the table needs "
                               f"{spec.block_shape(b)} {spec.dtype}", name)
        state = e.get("state") or {}
        expected = spec.rule.init_state(data) if spec.rule.name not in ("custom", "registered") else None
        if expected is not None and set(state) - set(expected):
            raise PSValueError(f"{where} has rule state {sorted(state)}; rule {spec.rule.name!r} keeps "
                               f"{sorted(expected)}", name)
        for k, v in state.items():
            if not _backend.is_array(v):
                raise PSValueError(f"{where}: rule state {k!r} is not an array", name)
            refuse_masked(name, v, "a checkpoint block's rule state")
            want = expected.get(k) if expected is not None else None
            if want is not None and (tuple(v.shape) != tuple(want.shape) or v.dtype != want.dtype):
                raise PSValueError(f"{where}: rule state {k!r} is {tuple(v.shape)} {v.dtype}, the rule keeps "
                                   f"{tuple(want.shape)} {want.dtype}", name)
        seq = e.get("seq", 0)
        if not isinstance(seq, (int, np.integer)) or isinstance(seq, bool) or seq < 0:
            raise PSValueError(f"{where}: sequence number {seq!r} is not a count", name)
        if not spec.allow_nonfinite:
            bad = [k for k, v in (("values", data), *state.items()) if not _backend.all_finite(v)]
            if bad:
                raise PSValueError(f"{where} contains NaN or Inf ({', '.join(bad)}) and the table does not "
                                   "allow non-finite values", name)
        return e

    def forget_run(self, run_id: str) -> None:
        """A run ended: free what blocks keep for it (the exactly-once windows
        of its participants, ``f"{run_id}-{secret}-{rank}"``, their leases, and its per-clock sum
        bookkeeping). The worker refuses the run's pushes from now on, so no
        re-sent one can count twice."""
        prefix = f"{run_id}-"
        for t in self.tables.values():
            t.summed_below.pop(run_id, None)
            for k in [k for k in t.pending if k[0] == run_id]:
                del t.pending[k]
                t.pending_bound.pop(k, None)
            for blk in t.blocks.values():
                blk.summed_below.pop(run_id, None)
                for sender in [s for s in blk.applied if s.startswith(prefix)]:
                    del blk.applied[sender]
            for sender in [s for s in t.leases if s.startswith(prefix)]:
                _holds.drop_lease(t, sender)

    def drop(self, name: str, table_id: str | None = None) -> bool:
        t = self.tables.get(name)
        if t is None or (table_id is not None and t.spec.table_id != table_id):
            return False
        del self.tables[name]
        return True

    def get(self, name, version=None, table_id=None, frozen_ok=False) -> TableShards:
        if not isinstance(name, str):
            raise PSValueError(f"table name must be a str, got {type(name).__name__}")
        t = self.tables.get(name)
        if t is None:
            raise UnknownTableError(f"table {name!r} does not exist on this worker", name)
        if table_id is not None and table_id != t.spec.table_id:
            raise StaleVersionError(f"table {name!r} was dropped and created again")
        if t.frozen and not frozen_ok:
            raise StaleVersionError(f"table {name!r}: its placement is changing; retry")
        if version is not None and version != t.version:
            raise StaleVersionError(
                f"table {name!r}: message for version {version!r}, this worker has version {t.version}"
            )
        return t

    # --- validation of a message ----------------------------------------------
    def _check_block(self, t: TableShards, b) -> Block:
        if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or not 0 <= b < t.spec.n_blocks:
            raise PSValueError(
                f"table {t.spec.name!r}: block {b!r} is not hosted here (hosted: {sorted(t.blocks)})",
                t.spec.name,
            )
        if b not in t.blocks:  # a real block, elsewhere or still being copied here: retry
            raise StaleVersionError(f"table {t.spec.name!r}: block {b} is not hosted here (yet)")
        return t.blocks[int(b)]

    def _check_local_rows(self, t: TableShards, blk: Block, rows, trusted=False):
        """A message's rows of one block: None (the whole block), a ``slice``
        for ``[start, stop]`` (a range travels without an index array), or
        a sorted unique in-range integer array (checked in one pass)."""
        if rows is None:
            return None
        name = t.spec.name
        n = blk.data.shape[0]
        if isinstance(rows, (list, tuple)):
            if not (len(rows) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in rows)
                    and 0 <= rows[0] < rows[1] <= n):
                raise PSValueError(f"table {name!r}: a block row range must be [start, stop] within [0, {n}]",
                                   name)
            return slice(rows[0], rows[1])
        refuse_masked(name, rows, "block rows")
        if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise PSValueError(f"table {name!r}: block rows must be a 1-D integer array", name)
        if trusted:
            return rows
        if not strictly_increasing(rows):
            raise PSValueError(f"table {name!r}: block rows must be sorted and unique", name)
        # Sorted: the ends bound every row.
        if rows.size and (int(rows[0]) < 0 or int(rows[-1]) >= n):
            raise PSValueError(f"table {name!r}: block row index out of range [0, {n})", name)
        return rows

    def validate_push(self, name, version, blocks, rows, values, table_id=None,
                      frozen_ok=False, check_finite=True, bound=None,
                      bounds: dict | None = None) -> tuple[TableShards, list[PushItem]]:
        """Check a whole push message; return the table and its items. Raises
        before anything is applied. (``check_finite=False``: the sender, a
        dask_ps session or primary inside the cluster, checked the values
        for NaN/Inf already, and ``bound`` is what that check found: an
        upper bound of every value's magnitude; ``frozen_ok``: a push
        forwarded by a primary, applied even during a placement change.)

        ``bounds``: a dict filled with ``id(values) -> bound`` of the items
        whose bound is known (the one pass of the NaN/Inf check here finds
        it, or ``bound``), for :meth:`apply` while the items live."""
        if bound is not None and not (isinstance(bound, (int, float)) and not isinstance(bound, bool)
                                      and math.isfinite(bound) and bound >= 0):
            raise PSValueError(f"a push's bound must be a finite number >= 0, got {bound!r}")
        t = self.get(name, version, table_id, frozen_ok)
        spec = t.spec
        if not (isinstance(blocks, (list, tuple)) and isinstance(rows, (list, tuple))
                and isinstance(values, (list, tuple)) and len(blocks) == len(rows) == len(values)):
            raise PSValueError(
                f"table {spec.name!r}: a push needs equally long lists of blocks, rows and values",
                spec.name,
            )
        nbytes = sum(v.dense_nbytes if isinstance(v, EncodedRows) else getattr(v, "nbytes", 0) for v in values)
        if nbytes > _config.get_bytes("max-push-bytes"):
            raise PSValueError(
                f"table {spec.name!r}: a push of {nbytes} bytes exceeds ps.max-push-bytes", spec.name
            )
        items = []
        for b, r, v in zip(blocks, rows, values):
            blk = self._check_block(t, b)
            r = self._check_local_rows(t, blk, r)
            n_rows = blk.data.shape[0] if r is None else r.stop - r.start if isinstance(r, slice) else len(r)
            shape = (n_rows, *spec.row_shape)
            if isinstance(v, EncodedRows):
                if tuple(v.shape) != tuple(shape):
                    raise PSValueError(f"table {spec.name!r}: block {b} expects values of shape {shape}, got "
                                       f"{tuple(v.shape)}", spec.name)
                if type(spec.rule) is Sum and v.addable_to(blk.data):  # integers: no NaN/Inf to look for
                    items.append((int(b), r, v))
                    continue
                v = v.toarray()
            refuse_masked(spec.name, v, "push values")
            if not _backend.is_array(v):
                raise PSValueError(
                    f"table {spec.name!r}: push values must be arrays, got {type(v).__name__}", spec.name
                )
            if tuple(v.shape) != tuple(shape) or not np.can_cast(v.dtype, spec.dtype, CASTING):
                raise PSValueError(
                    f"table {spec.name!r}: block {b} expects values of shape {shape} and dtype "
                    f"{spec.dtype}, got {tuple(v.shape)} {v.dtype}",
                    spec.name,
                )
            found = bound
            if check_finite:
                check_int_range(spec, v)
            if check_finite and not spec.allow_nonfinite:
                if v.size > _backend.SMALL and v.dtype.kind in "fc":
                    found = _backend.abs_bound(v)  # not finite: a NaN/Inf is in the values
                    finite = math.isfinite(found)
                else:
                    finite = _backend.all_finite(v)
                if not finite:
                    raise PSValueError(f"table {spec.name!r}: push values contain NaN or Inf and the table was "
                                       "created with allow_nonfinite=False; nothing was applied", spec.name)
            v = _backend.to_device(v, spec.device)
            if isinstance(r, slice) and not isinstance(spec.rule, (Sum, Assign)):
                r = np.arange(r.start, r.stop)  # other rules (custom ones too) get index arrays
            if isinstance(r, np.ndarray):
                r = _backend.to_device(r, spec.device)
            v = v.astype(spec.dtype, copy=False)
            if spec.sparse_wire and type(spec.rule) is Sum and DenseRows(v).addable_to(blk.data):
                v = DenseRows(v)  # rows mostly zeros: only the nonzeros are written
            if found is not None and bounds is not None:
                bounds[id(v)] = float(found)
            items.append((int(b), r, v))
        return t, items

    # --- applying -----------------------------------------------------------
    @staticmethod
    def unapplied(t: TableShards, items: list[PushItem], sender=None, msg_seq=None) -> list[PushItem]:
        """The items whose block has not applied message ``msg_seq`` of
        ``sender`` yet (all items when the push is not numbered), and mark
        those blocks as having applied it."""
        if sender is None:
            return items
        fresh_blocks = {b for b, _, _ in items if msg_seq not in t.blocks[b].applied.get(sender, ())}
        for b in fresh_blocks:
            t.blocks[b].applied.setdefault(sender, deque(maxlen=APPLIED_WINDOW)).append(msg_seq)
        return [it for it in items if it[0] in fresh_blocks]

    @staticmethod
    def unmark(t: TableShards, items: list[PushItem], sender=None, msg_seq=None) -> None:
        """Undo :meth:`unapplied` for ``items`` (a push refused after it was
        marked: a re-sent one must not be skipped as applied)."""
        if sender is None:
            return
        for b in {b for b, _, _ in items}:
            window = t.blocks[b].applied.get(sender) if b in t.blocks else None
            if window and window[-1] == msg_seq:
                window.pop()

    @staticmethod
    def apply(t: TableShards, items: list[PushItem], *, raw: bool = False, in_place: bool = True,
              check: bool = True, bounds: dict | None = None) -> dict:
        """Apply validated items with the table's rule (``raw``: plain assignment,
        used for initial values). ``in_place=False`` (off the event loop) never
        writes a block that readers may see; the new arrays are returned and
        :meth:`commit` swaps them in.

        ``check``: in a float table that forbids NaN/Inf, a push whose
        result would be non-finite (finite values whose sum overflows; an
        optimizer step that does) raises :class:`PSValueError` and changes
        nothing. A sum is checked before it is made (bounds of the stored
        rows and of the push, ``_backend.abs_bound``; the exact sum only
        when they come near the dtype's range); another rule's result is
        checked on the rows it wrote, which are put back on failure.
        ``bounds``: ``id(values) -> bound`` of items whose bound is known
        (``validate_push``), so that no pass over them finds it again."""
        rule = _ASSIGN if raw else t.spec.rule
        undo = None
        if not raw and isinstance(rule, (Custom, Registered)):
            undo = []  # a user's function may raise midway: its steps on this server are put back
        if _checks_results(t.spec, rule):
            if not isinstance(rule, Sum):
                undo = [] if check or undo is not None else None
            elif check:
                _check_sums(t, items, bounds)  # raises before anything changes; keeps the blocks' bounds
            else:  # sums checked when they were pushed: the blocks' bounds still grow
                for b, _, vals in items:
                    blk = t.blocks[b]
                    blk.bound = None if blk.bound is None else blk.bound + _bound_of(vals, bounds)
        elif raw:
            for b, _, _ in items:
                t.blocks[b].bound = None  # values assigned: measured again when needed
        fresh: dict[int, object] = {}
        with np.errstate(over="ignore", invalid="ignore") if undo is not None else contextlib.nullcontext():
            try:
                ShardStore._apply_items(t, items, rule, in_place, fresh, undo)
            except BaseException:
                if undo is not None:
                    put_back(t, items, fresh, undo)
                raise
        if undo is not None and _checks_results(t.spec, rule) and not isinstance(rule, Sum):
            _check_results(t, items, fresh, undo)
        return fresh

    @staticmethod
    def _apply_items(t: TableShards, items, rule, in_place: bool, fresh: dict, undo) -> None:
        for b, rows, vals in items:
            blk = t.blocks[b]
            if isinstance(vals, RowsToAdd) and type(rule) is not Sum:  # only a sum adds them as they are
                vals = vals.toarray()
            if undo is not None:
                undo.append(_snapshot(t, b, rows, in_place and b not in fresh and not blk.shared))
            blk.seq += 1
            if b in fresh:  # already private to this message
                rule.apply(fresh[b], vals, blk.state, rows)
            elif in_place and not blk.shared:
                rule.apply(blk.data, vals, blk.state, rows)
            elif rows is None and rule.additive and not isinstance(vals, RowsToAdd):
                fresh[b] = blk.data + vals  # one pass instead of copy + add
            else:
                new = blk.data.copy()
                rule.apply(new, vals, blk.state, rows)
                fresh[b] = new

    @staticmethod
    def accumulate(t: TableShards, run_id: str, clock: int, items: list[PushItem], sender: str | None = None,
                   checked: dict | None = None) -> None:
        """aggregate="clock": add validated items to ``sender``'s sum of their clock.

        In a float table that forbids NaN/Inf, a push that would make a
        pending sum, or (rule "sum") the stored rows plus every pending sum,
        non-finite raises :class:`PSValueError` first and changes nothing:
        the sums are applied when their clock completes, long after the push
        was acknowledged (they are not checked again then). ``checked``: the
        push was checked when it was held (``hold``), these are its bounds."""
        key = (run_id, int(clock))
        bounds = checked
        if bounds is None and _checks_results(t.spec, t.spec.rule):
            bounds = _check_pending_sums(t, key, items)
        acc = t.pending.setdefault(key, {})
        if bounds is not None:
            have = t.pending_bound.setdefault(key, {})
            for b, bound in bounds.items():
                have[b] = have.get(b, 0.0) + bound
        for b, rows, vals in items:
            # Kept as pushed (a copy: the sender's array may be shared in one
            # process), per sender: applied in the senders' order when due.
            # Only the rows pushed are kept, not a block-sized sum per sender
            # (and dense: a block moved elsewhere takes its sums along, export).
            vals = vals.toarray() if isinstance(vals, RowsToAdd) else vals.copy()
            acc.setdefault(b, {}).setdefault(sender or "", []).append((rows, vals))

    @staticmethod
    def due(t: TableShards, run_id: str, min_clock: float, blocks=None) -> list[list[PushItem]]:
        """Pop the sums of ``run_id``'s clocks ``< min_clock``, oldest first,
        each as whole-block items ready for :meth:`apply` (the caller applies
        them before anyone reads). ``blocks``: only those blocks' sums."""
        keys = sorted(k for k in t.pending if k[0] == run_id and k[1] < min_clock)
        out = []
        for k in keys:
            if blocks is None:
                acc = t.pending.pop(k)
                t.pending_bound.pop(k, None)
            else:
                acc = {b: t.pending[k].pop(b) for b in blocks if b in t.pending[k]}
                for b in blocks:
                    t.pending_bound.get(k, {}).pop(b, None)
                if not t.pending[k]:
                    del t.pending[k]
                    t.pending_bound.pop(k, None)
            # Only blocks still hosted here (a block that moved took its sums along).
            if t.spec.rule.additive:  # the pushes themselves, in the senders' order
                items = [(b, rows, vals) for b, a in sorted(acc.items()) if b in t.blocks
                         for rows, vals in _pushes_in_sender_order(a)]
            else:  # one step of the rule on the clock's sum
                items = [(b, None, _in_sender_order(a, t.blocks[b].data)) for b, a in sorted(acc.items())
                         if b in t.blocks]
            if items:
                out.append(items)
        if blocks is None:
            t.summed_below[run_id] = max(t.summed_below.get(run_id, -1), min_clock)
        else:
            for b in blocks:
                if b in t.blocks:
                    s = t.blocks[b].summed_below
                    s[run_id] = max(s.get(run_id, -1), min_clock)
        return out

    @staticmethod
    def summed_below_of(t: TableShards, block: int, run_id: str) -> float:
        """Every per-clock sum of ``run_id``'s clocks below this is in ``block``
        (a read's reply says so: the reader adds its own later pushes)."""
        return max(t.summed_below.get(run_id, -1), t.blocks[block].summed_below.get(run_id, -1))

    @staticmethod
    def commit(t: TableShards, fresh: dict) -> None:
        for b, arr in fresh.items():
            blk = t.blocks[b]
            blk.data, blk.shared = arr, False

    def validate_pull(self, name, version, blocks, rows, table_id=None, trusted=False) -> tuple[TableShards, list]:
        """The table and the ``(block, rows)`` requests of a pull message.
        ``trusted``: the reader is a dask_ps session inside the cluster (its
        message carries the internal token), which checked its rows sorted,
        unique and in range already (``check_row_request``): they are not
        checked again, the pass the issue-12 row path left on the server
        (numpy still refuses an index out of range)."""
        t = self.get(name, version, table_id)
        if not (isinstance(blocks, (list, tuple)) and isinstance(rows, (list, tuple))
                and len(blocks) == len(rows)):
            raise PSValueError(
                f"table {t.spec.name!r}: a pull needs equally long lists of blocks and rows", t.spec.name
            )
        reqs = []
        for b, r in zip(blocks, rows):
            blk = self._check_block(t, b)
            if b in t.missed:  # retryable: the reader falls back to the primary
                raise StaleVersionError(
                    f"table {t.spec.name!r}: this replica of block {b} missed an update; read the primary"
                )
            r = self._check_local_rows(t, blk, r, trusted)
            reqs.append((int(b), _backend.to_device(r, t.spec.device) if isinstance(r, np.ndarray) else r))
        return t, reqs

    def recheck_pull(self, t: TableShards, name, version, blocks, table_id=None) -> TableShards:
        """The part of :meth:`validate_pull` that may change while a reader
        waits for the table's locks (version, frozen, hosted and fenced
        blocks); its rows were checked already and stay valid for the same
        table. A table dropped and created again meanwhile (another
        ``TableShards``) raises, so a caller validates it anew."""
        now = self.get(name, version, table_id)
        if now is not t:
            raise StaleVersionError(f"table {name!r} changed while a read waited for it; retry")
        for b in blocks:
            self._check_block(t, b)
            if b in t.missed:
                raise StaleVersionError(
                    f"table {t.spec.name!r}: this replica of block {b} missed an update; read the primary"
                )
        return t

    @staticmethod
    def read(t: TableShards, reqs: list, *, copy: bool = False, sparse: bool = False) -> tuple[list, list]:
        """``(seqs, values)`` of validated ``(block, rows)`` requests. Whole
        blocks, and ranges of at least half a block, are returned without a
        copy (and the block marked shared) unless ``copy``. ``sparse``: rows
        by index as their nonzeros (a dict, ``_sparse_rows.encode``) where
        that is smaller, read straight from the block (no gathered copy)."""
        seqs, out = [], []
        for b, rows in reqs:
            blk = t.blocks[b]
            seqs.append(blk.seq)
            if isinstance(rows, slice) and (copy or 2 * (rows.stop - rows.start) < blk.data.shape[0]):
                out.append(blk.data[rows].copy())
            elif rows is not None and not isinstance(rows, slice):
                enc = _sparse_rows.encode(blk.data, rows=rows) if sparse else None
                out.append(_backend.take_rows(blk.data, rows) if enc is None else enc)
            elif copy:
                out.append(blk.data.copy())
            else:
                blk.shared = True
                # read-only: in-process, the reader gets this very array
                out.append(_backend.read_only(blk.data if rows is None else blk.data[rows]))
        return seqs, out

    @staticmethod
    def seqs(t: TableShards, items) -> list[int]:
        return [t.blocks[b].seq for b, *_ in items]


def _wire_clock(c: float):
    """A clock bound as msgpack: ``inf`` (everything) as None."""
    return None if c == float("inf") else int(c)


def _unwire_clock(c) -> float:
    if c is None:
        return float("inf")
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        raise PSValueError(f"a clock must be a number or None, got {c!r}")
    return c


def check_owners(spec: TableSpec, owners) -> list[list[str]]:
    """A table's placement as sent by the scheduler: for every block, one or
    more distinct worker addresses, the primary first."""
    if not isinstance(owners, (list, tuple)) or len(owners) != spec.n_blocks:
        raise PSValueError(
            f"table {spec.name!r}: a placement lists the owners of all {spec.n_blocks} blocks, got "
            f"{len(owners) if isinstance(owners, (list, tuple)) else type(owners).__name__}",
            spec.name,
        )
    out = []
    for b, ws in enumerate(owners):
        if (not isinstance(ws, (list, tuple)) or not ws or len(set(map(str, ws))) != len(ws)
                or not all(isinstance(w, str) and w for w in ws)):
            raise PSValueError(
                f"table {spec.name!r}: block {b} needs one or more distinct worker addresses "
                f"(primary first), got {ws!r}",
                spec.name,
            )
        out.append(list(ws))
    return out
