"""Row lists named by a key, so that a list a participant sends again goes
as its key only (issue 36; pure code, no Dask).

A participant's row-sparse messages repeat their row lists: an SGD round's
rows are read one clock and pushed the next, and again every epoch; an LDA
participant reads and pushes its vocabulary's rows every iteration. A
block's list goes in full the first time, with a key the second
(``{"key", "rows"}``: lists that never repeat cost no copy), and once the
server acknowledged that, as ``{"key"}`` only. ps-lite's key caching
filter does the same (``KeyCachingFilter``: a signature of the key list,
the list sent once).

Correctness never depends on the cache. A key names one list of one block
of one table (the server checks both), keys are unique to a participant's
transport (a random prefix: a retried participant's keys are new), and a
server that does not hold a key (restarted, failed over, a new primary,
the entry evicted, the run ended) refuses the whole message before
anything is applied (:class:`~dask_ps._exceptions.RowListMissingError`);
the participant then sends it again with every list in full.

:class:`RowListKeys` is the participant's side: it finds a list it sent
before by an exact comparison (no hash of the list: hashing 400 KB costs
0.2-0.4 ms, fifty times a copy), a few of its elements picking the
candidate. :class:`RowListCache` is a server's, bounded by bytes (least
recently used first) and dropped per run at the run's end.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

import numpy as np

from dask_ps._exceptions import PSValueError, RowListMissingError

# Lists shorter than this go in full: their key and its bookkeeping cost
# about what their bytes do.
MIN_ROWS = 64
# Lists seen once, by fingerprint: a list is keyed (copied, and sent with
# its key) the second time it is sent. Keying every list cost 13-26% more
# CPU per operation where no list repeats (bench_rows --cpu --fresh, 300k
# rows: the copies, and the servers keeping the received buffers, which
# then are not reused).
SEEN_KEPT = 4096


def _fingerprint(table_id, block: int, rows: np.ndarray) -> tuple:
    n = rows.size
    return (table_id, block, n, int(rows[0]), int(rows[n // 2]), int(rows[-1]))


class RowListKeys:
    """A participant's row lists by key, and which server holds which key.

    ``max_bytes``: the lists kept (copies, to compare against; least
    recently used dropped first). Runs on one event loop.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._prefix = secrets.token_hex(6)
        self._n = 0
        # key -> (fingerprint, copy of the list, servers that acknowledged it)
        self._lists: OrderedDict[str, tuple[tuple, np.ndarray, set[str]]] = OrderedDict()
        self._by_print: dict[tuple, str] = {}
        self._seen: OrderedDict[tuple, None] = OrderedDict()  # sent once, not keyed
        self.nbytes = 0

    def __repr__(self):
        return f"<RowListKeys {len(self._lists)} lists, {self.nbytes} bytes>"

    def key_of(self, table_id, block: int, rows) -> str | None:
        """The key of ``rows`` (a block's local rows, as an index array), a
        new one if this list was sent once before (or its key was dropped);
        None where the list goes in full (seen for the first time, short,
        not an array, or larger than the cache)."""
        if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.size < MIN_ROWS:
            return None
        if rows.nbytes > self.max_bytes:
            return None
        fp = _fingerprint(table_id, block, rows)
        key = self._by_print.get(fp)
        if key is not None:
            entry = self._lists[key]
            if entry[1].size == rows.size and np.array_equal(entry[1], rows):
                self._lists.move_to_end(key)
                return key
            self._drop(key)
        elif fp not in self._seen:  # the first time: in full (most lists that do not repeat stop here)
            self._seen[fp] = None
            if len(self._seen) > SEEN_KEPT:
                self._seen.popitem(last=False)
            return None
        self._seen.pop(fp, None)
        key = f"{self._prefix}.{self._n}"
        self._n += 1
        copy = np.array(rows, copy=True)
        copy.flags.writeable = False
        self._lists[key] = (fp, copy, set())
        self._by_print[fp] = key
        self.nbytes += copy.nbytes
        while self.nbytes > self.max_bytes and self._lists:
            self._drop(next(iter(self._lists)))
        return key

    def _drop(self, key: str) -> None:
        fp, copy, _ = self._lists.pop(key)
        if self._by_print.get(fp) == key:
            del self._by_print[fp]
        self.nbytes -= copy.nbytes

    def held_at(self, key: str, addr: str) -> bool:
        """Whether server ``addr`` acknowledged a message that carried ``key``'s list."""
        entry = self._lists.get(key)
        return entry is not None and addr in entry[2]

    def acknowledged(self, addr: str, keys) -> None:
        """``addr`` answered a message that carried these keys' lists: it holds them."""
        for key in keys:
            entry = self._lists.get(key)
            if entry is not None:
                entry[2].add(addr)

    def forget_server(self, addr: str) -> None:
        """``addr`` refused a key (restarted, evicted it): send it every list again."""
        for _, _, servers in self._lists.values():
            servers.discard(addr)


class RowListCache:
    """A server's row lists by key: ``key -> (table id, block, rows, run)``,
    at most ``max_bytes()`` bytes of lists (least recently used dropped
    first). Runs on the worker's event loop."""

    def __init__(self, max_bytes):
        self._max_bytes = max_bytes  # a callable: dask.config read when it is used
        self._lists: OrderedDict[str, tuple] = OrderedDict()
        self.nbytes = 0
        self.stats = {"hits": 0, "stored": 0, "missed": 0, "evicted": 0}

    def __repr__(self):
        return f"<RowListCache {len(self._lists)} lists, {self.nbytes} bytes>"

    def __len__(self):
        return len(self._lists)

    def resolve(self, table_id, blocks, rows, run_id=None):
        """A message's ``rows`` (one entry per block) with every keyed list
        replaced by its rows: a list that came with its key is kept under
        it (``run_id``: dropped at that run's end). Raises
        :class:`RowListMissingError` naming every key not held here
        (nothing is kept from the message then either: it comes again in full)."""
        if not isinstance(rows, (list, tuple)) or not any(isinstance(r, dict) for r in rows):
            return rows
        if not isinstance(blocks, (list, tuple)) or len(blocks) != len(rows):
            raise PSValueError(f"a message's keyed rows need one block each, got {len(rows)} rows")
        out, fresh, missing = [], [], []
        for b, r in zip(blocks, rows):
            if not isinstance(r, dict):
                out.append(r)
                continue
            key = r.get("key")
            if not isinstance(key, str) or set(r) - {"key", "rows"}:
                raise PSValueError(f"a keyed row list must be {{'key': str[, 'rows': array]}}, got {sorted(r)}")
            if "rows" in r:
                arr = r["rows"]
                if not (isinstance(arr, np.ndarray) and arr.ndim == 1 and arr.dtype.kind in "iu"):
                    raise PSValueError(f"row list {key!r}: its rows must be a 1-d integer array")
                view = arr.view()
                view.flags.writeable = False  # kept: no one writes into it
                fresh.append((key, b, view))
                out.append(view)
                continue
            entry = self._lists.get(key)
            if entry is None or entry[0] != table_id or entry[1] != b:
                missing.append(key)
                continue
            self._lists.move_to_end(key)
            out.append(entry[2])
        if missing:
            self.stats["missed"] += len(missing)
            raise RowListMissingError(
                f"row list(s) {missing[:3]}{'...' if len(missing) > 3 else ''} are not held here; "
                "send the message again with its rows", missing)
        self.stats["hits"] += sum(1 for r in rows if isinstance(r, dict) and "rows" not in r)
        for key, b, view in fresh:
            self._put(key, table_id, b, view, run_id)
        return out

    def _put(self, key, table_id, block, rows, run_id) -> None:
        old = self._lists.pop(key, None)
        if old is not None:
            self.nbytes -= old[2].nbytes
        limit = int(self._max_bytes())
        if rows.nbytes > limit:
            return
        self._lists[key] = (table_id, block, rows, run_id)
        self.nbytes += rows.nbytes
        self.stats["stored"] += 1
        while self.nbytes > limit:
            _, (_, _, dropped, _) = self._lists.popitem(last=False)
            self.nbytes -= dropped.nbytes
            self.stats["evicted"] += 1

    def forget_run(self, run_id: str) -> None:
        """A run ended: its participants' lists go."""
        for key in [k for k, e in self._lists.items() if e[3] == run_id]:
            self.nbytes -= self._lists.pop(key)[2].nbytes

    def forget_table(self, table_id) -> None:
        """A table was dropped (its lists name blocks of it only)."""
        for key in [k for k, e in self._lists.items() if e[0] == table_id]:
            self.nbytes -= self._lists.pop(key)[2].nbytes
