"""A participant's cache of the blocks it read, and what keeps it honest.

Every read a session makes leaves a :class:`CacheEntry`: a block (or some of
its rows) tagged with the clock its values reflect (``tag``: every update of
the clocks below is in it), the server's sequence number of the block when
it was read and the reader's clock when it was fetched. :class:`ReadCache`
holds them per table and is the one place they change:

* **use**: :meth:`ReadCache.usable` says whether an entry may serve a read
  under a table's bound (the consistency rules are in
  :mod:`dask_ps._session`, which computes the bound);
* **invalidation**: entries no read at a clock may use are retired before
  that clock's flush (:meth:`ReadCache.retire_unusable`); a table dropped
  and created again is forgotten (:meth:`ReadCache.forget`);
* **own writes**: acknowledged pushes are written through into the entries
  (read-my-writes), or the entries are dropped where the servers compute
  the result (:meth:`ReadCache.write_through`); pushes to ``aggregate="clock"``
  sum tables that the servers hold back until their clock is complete are
  kept and added to what is read (:meth:`ReadCache.own_unsummed`);
* **server fills** (ESSP): rows the servers push after an advance of the
  run's minimum clock replace older entries (:meth:`ReadCache.fill`).

Not thread-safe: one participant, one thread. Nothing here talks to the
network; the session reads, the cache keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dask_ps import _backend


def _same_rows(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two sorted row lists are the same (a loop that reads and
    pushes the rows it read: no binary search needed)."""
    return a is b or (a.size == b.size and bool(np.array_equal(a, b)))


# A cached entry of some rows uses a lookup table over its row numbers when
# it holds at least 1 in this many of them; sparser ones binary-search.
_DENSE_ROWS = 32


@dataclass
class CacheEntry:
    """A cached block (or some of its rows).

    ``positions`` finds rows of an entry that holds many of its block's rows
    through a lookup table over the row numbers (4 bytes per row number up
    to the largest held, built at first use): a table of a million rows read
    in rounds of ~170k touched rows (sparse SGD) spent most of its pull time
    in binary searches of sorted row lists, each step a cache miss. An entry
    of a few rows of a large block binary-searches: a table there would cost
    more to build (per row number) than the searches it saves."""

    tag: float  # the values contain every update made at clocks < tag
    seq: int  # server sequence number of the block when read
    clock: int  # the reader's own clock when it was fetched from the servers (-1: pushed by them)
    rows: np.ndarray | None  # local rows held (sorted), None = whole block
    values: object
    _index: np.ndarray | None = field(default=None, repr=False, compare=False)
    # No read at the owner's current clock or later may use it: own pushes
    # are not written through into it any more (ReadCache.retire_unusable).
    retired: bool = field(default=False, compare=False)

    def _dense(self) -> bool:
        return self.rows.size * _DENSE_ROWS >= (int(self.rows[-1]) + 1 if self.rows.size else 0)

    def positions(self, local_rows: np.ndarray) -> np.ndarray:
        """Where each of ``local_rows`` is in ``rows`` (-1: not held)."""
        if self._index is None and not self._dense():
            if self.rows.size == 0:
                return np.full(local_rows.shape, -1, dtype=np.intp)
            pos = np.minimum(np.searchsorted(self.rows, local_rows), self.rows.size - 1)
            return np.where(self.rows[pos] == local_rows, pos, -1)
        if self._index is None:
            size = int(self.rows[-1]) + 1 if self.rows.size else 0
            index = np.full(size, -1, dtype=np.int64 if self.rows.size >= 2**31 else np.int32)
            index[self.rows] = np.arange(self.rows.size, dtype=index.dtype)
            self._index = index
        if local_rows.size and int(local_rows.max()) < self._index.size:
            return self._index[local_rows]
        out = np.full(local_rows.shape, -1, dtype=self._index.dtype)
        inside = local_rows < self._index.size
        out[inside] = self._index[local_rows[inside]]
        return out

    def covers(self, local_rows: np.ndarray | None) -> bool:
        if self.rows is None:
            return True
        if local_rows is None:
            return False
        if _same_rows(self.rows, local_rows):
            return True
        return bool(np.all(self.positions(local_rows) >= 0))

    def missing(self, local_rows: np.ndarray) -> np.ndarray:
        """Those of ``local_rows`` not held."""
        return local_rows[self.positions(local_rows) < 0]

    def merged(self, rows: np.ndarray, seq: int, values) -> "CacheEntry":
        """This entry plus freshly read ``rows`` (sorted, none held yet). The
        older tag and sequence number stay: the merged entry satisfies both."""
        xp = _backend.namespace(self.values)
        # A row's place in the merged list is the number of rows held or read
        # below it: for many rows of the block, a mark per row number and a
        # running count (which is also the merged entry's lookup table); for
        # few, each list binary-searched in the other. No sort either way.
        n = self.rows.size + rows.size
        size = max(int(self.rows[-1]) + 1 if self.rows.size else 0, int(rows[-1]) + 1 if rows.size else 0)
        rank = None
        if n * _DENSE_ROWS >= size:
            held = np.zeros(size, dtype=bool)
            held[self.rows] = True
            held[rows] = True
            rank = np.cumsum(held, dtype=np.int64 if size >= 2**31 else np.int32) - 1
            pos_old, pos_new = rank[self.rows], rank[rows]
            rank[~held] = -1
        else:
            pos_old = np.searchsorted(rows, self.rows) + np.arange(self.rows.size)
            pos_new = np.searchsorted(self.rows, rows) + np.arange(rows.size)
        all_rows = np.empty(n, dtype=np.result_type(self.rows, rows))
        all_rows[pos_old] = self.rows
        all_rows[pos_new] = rows
        vals = xp.empty((n, *self.values.shape[1:]), dtype=self.values.dtype)
        vals[xp.asarray(pos_old)] = self.values
        vals[xp.asarray(pos_new)] = values
        return CacheEntry(self.tag, min(self.seq, seq), self.clock, all_rows, vals, _index=rank)

    def common(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions in this entry and in ``rows`` of the rows both hold."""
        pos = self.positions(rows)
        hit = np.flatnonzero(pos >= 0)
        return pos[hit], hit

    def take(self, local_rows: np.ndarray | None):
        if self.rows is None:
            if local_rows is None:
                return self.values
            xp = _backend.namespace(self.values)
            return self.values[xp.asarray(local_rows)]
        if _same_rows(self.rows, local_rows):
            return self.values  # as for a whole block: the callers copy
        xp = _backend.namespace(self.values)
        return self.values[xp.asarray(self.positions(local_rows))]


def add_into(out, rows, prow, pvals) -> None:
    """``out`` (the values of local ``rows`` of a block, None: all of it) +=
    a push of local rows ``prow`` (None: the whole block) with ``pvals``."""
    xp = _backend.namespace(out)
    if rows is None:
        if prow is None:
            out += pvals
        else:
            _backend.add_rows(out, xp.asarray(prow), pvals)
    elif prow is None:
        out += pvals[xp.asarray(rows)]
    else:
        pos = np.searchsorted(prow, rows)
        pos_c = np.minimum(pos, max(prow.size - 1, 0))
        hit = np.flatnonzero((pos < prow.size) & (prow[pos_c] == rows)) if prow.size else pos[:0]
        if hit.size:
            _backend.add_rows(out, xp.asarray(hit), pvals[xp.asarray(pos_c[hit])])


class ReadCache:
    """One session's cached blocks per table, and the own writes that must
    show in them (see the module docstring).

    Attributes
    ----------
    blocks : dict
        ``blocks[table][block]``: the table's :class:`CacheEntry` objects.
    """

    def __init__(self):
        self.blocks: dict[str, dict[int, CacheEntry]] = {}
        self._own_seq: dict[tuple[str, int], int] = {}  # (table, block) -> seq after our last push
        # aggregate="clock" sum tables: own pushes sent but perhaps not yet
        # summed into the servers' values, as (clock, {block: [(rows, values)]})
        # per table; dropped once the run's min clock passes their clock.
        self._sent: dict[str, list[tuple[int, dict[int, list]]]] = {}
        self._sent_floor: dict[str, float] = {}  # clocks below this were dropped from _sent

    def table(self, name: str) -> dict[int, CacheEntry]:
        """``name``'s entries (created empty), by block."""
        return self.blocks.setdefault(name, {})

    def get(self, name: str, b: int) -> CacheEntry | None:
        return self.blocks.get(name, {}).get(b)

    def forget(self, name: str) -> None:
        """The table was dropped and created again: nothing cached holds."""
        self.blocks.pop(name, None)

    def held_bytes(self, name: str) -> int:
        """Bytes of ``name``'s cached entries and own sent pushes kept."""
        entries = sum(e.values.nbytes + (0 if e.rows is None else e.rows.nbytes)
                      for e in self.blocks.get(name, {}).values())
        sent = sum(v.nbytes + r.nbytes for _, by_block in self._sent.get(name, ())
                   for items in by_block.values() for r, v in items)
        return int(entries + sent)

    def holds(self, name: str, b: int, values) -> bool:
        """Whether ``values`` is the cached entry's own array (a read handed it
        out shared: the caller copies before changing it)."""
        e = self.get(name, b)
        return e is not None and values is e.values

    # --- use and invalidation ---------------------------------------------------------------
    @staticmethod
    def usable(e: CacheEntry | None, need: float | None, refresh: bool, clock: int) -> bool:
        """Whether entry ``e`` may serve a read at the reader's ``clock`` that
        needs tag ``need``.

        ASP (``need is None``) and ``refresh=True`` tables re-read once per
        clock: the entry must have been fetched in the reader's clock. Bounded
        models need ``tag >= need``."""
        if e is None:
            return False
        if need is None:
            return e.clock == clock
        return e.tag >= need and (not refresh or e.clock == clock)

    def retire_unusable(self, name: str, need: float | None, refresh: bool, clock: int) -> None:
        """Mark ``name``'s entries no read at ``clock`` (needing ``need``) may
        use: own pushes are not written through into them any more. Tags and
        fetch clocks never grow, so no later read may use them either; they
        stay until replaced, so that a re-read still counts as a refetch."""
        for e in self.blocks.get(name, {}).values():
            if not self.usable(e, need, refresh, clock):
                e.retired = True

    # --- own writes ---------------------------------------------------------------------------
    def write_through(self, name: str, msgs, seqs: dict[int, int], visible: bool) -> None:
        """Keep own acknowledged writes ``msgs`` (``{address: [(block, rows,
        values)]}``; the servers' sequence numbers after them in ``seqs``)
        visible in the cache (read-my-writes). ``visible=False``: the
        server's result is not this session's to compute (an optimizer step,
        or a sum in a repeated clock): the written blocks are dropped and
        read again."""
        cache = self.blocks.get(name, {})
        for b, s in seqs.items():
            self._own_seq[(name, b)] = s
        if not cache:
            return
        if not visible:
            for b in seqs:
                cache.pop(b, None)
            return
        for items in msgs.values():
            for b, rows, vals in items:
                e = cache.get(b)
                if e is None or e.retired:
                    continue
                # A reply can share the server's array (in-process): copy first.
                e.values = _backend.writable(e.values)
                xp = _backend.namespace(e.values)
                if e.rows is None:
                    if rows is None:
                        e.values += vals
                    else:
                        _backend.add_rows(e.values, xp.asarray(rows), vals)
                elif rows is None:
                    e.values += vals[xp.asarray(e.rows)]
                elif _same_rows(e.rows, rows):
                    e.values += vals  # pushed the rows it read (the usual loop)
                else:
                    ie, iv = e.common(rows)
                    if ie.size:
                        _backend.add_rows(e.values, xp.asarray(ie), vals[xp.asarray(iv)])

    def record_sent(self, name: str, clock: int, msgs, borrowed: bool) -> None:
        """Keep own pushes of ``clock`` to an ``aggregate="clock"`` sum table
        until the servers summed them everywhere (``borrowed``: the values are
        the caller's arrays, ``copy=False``: kept as copies)."""
        by_block: dict[int, list] = {}
        for items in msgs.values():
            for b, rows, vals in items:
                by_block.setdefault(b, []).append((rows, vals.copy() if borrowed else vals))
        self._sent.setdefault(name, []).append((clock, by_block))

    def own_unsummed(self, name: str, b: int, rows, vals, summed_below):
        """``vals`` (block ``b``'s ``rows`` as a server returned them, with
        every per-clock sum of clocks ``< summed_below``) plus this session's
        own sent pushes of later clocks, which the server holds back until
        their clock is complete (aggregate="clock" sum tables)."""
        below = float("inf") if summed_below is None else summed_below
        out = vals
        for clock, by_block in self._sent.get(name, ()):
            if clock < below:
                continue
            for prow, pvals in by_block.get(b, ()):
                if out is vals:
                    out = vals.copy()  # never write into a reply's buffer
                add_into(out, rows, prow, pvals)
        return out

    def drop_summed(self, name: str, floor: float) -> None:
        """Forget own sent pushes of clocks ``< floor``: every server value
        fetched from now on (the run's min clock is ``>= floor``) has them."""
        sent = self._sent.get(name)
        if sent is None or floor <= self._sent_floor.get(name, 0):
            return
        self._sent_floor[name] = floor
        self._sent[name] = [e for e in sent if e[0] >= floor]

    def forgotten(self, name: str, summed_below: float | None) -> bool:
        """Whether values summed below ``summed_below`` lack own pushes this
        cache no longer keeps (:meth:`drop_summed`): they must be read again."""
        return summed_below is not None and summed_below < self._sent_floor.get(name, 0)

    # --- server fills (ESSP) ------------------------------------------------------------------
    def fill(self, name: str, b: int, tag: float, seq: int, rows, values, summed_below, summed_per_clock: bool,
             refresh: bool, clock: int) -> bool:
        """Take block ``b``'s rows the servers pushed at an advance of the
        run's min clock to ``tag`` (ESSP) when they are fresher than the
        entry and hold every own sent write; ``clock``: the reader's.
        Returns whether the entry was replaced."""
        cache = self.blocks[name]
        e = cache.get(b)
        if seq < self._own_seq.get((name, b), 0) or (e is not None and tag <= e.tag):
            return False
        if summed_per_clock:
            if self.forgotten(name, summed_below):
                return False  # own pushes it lacks were dropped already: skip it
            values = self.own_unsummed(name, b, rows, values, summed_below)
        if e is not None and seq >= e.seq:
            fetched = e.clock  # at least as new as the copy it replaces
        elif refresh and e is not None and e.clock == clock:
            return False  # older than this clock's server read: keep that
        else:
            fetched = -1  # not a server read of this reader's: refresh=True re-reads it
        cache[b] = CacheEntry(tag, seq, fetched, rows, values)
        return True
