"""Bösen's process cache: blocks read by one participant serve the others of
its process.

Bösen keeps one cache per client process ("process storage"), shared by
the application threads of the process. Here the participants of one run
that are threads of one worker process (``dask worker --nthreads N``) share
a :class:`ProcessCache`: each server reply from **another process** a
participant's read fetched is kept as it came from the servers (a
:class:`SharedBlock`: no own write of anyone added), and a read of another
participant of the process takes it into its own
:class:`~dask_ps._cache.ReadCache` when it is legal *for that reader*.
Blocks served in the process itself (its own worker's shards; every worker
of an in-process cluster) are not shared: a direct call reads them as
cheaply as a cache would. Legal for a reader means:

* **the bound**: the block's tag (the run's minimum clock known when it was
  fetched: every update of the clocks below is in it, whoever fetched it)
  meets the reader's ``clock - s``;
* **the reader's own writes** (read-my-writes), which its own cache keeps
  and the shared block does not:

  - ``aggregate="clock"`` sum tables: the servers sum clock ``k``'s pushes
    only once ``k`` is complete, and a reply says up to which clock it holds
    sums (``summed_below``); the reader adds its own sent pushes of the
    clocks from there (``ReadCache.own_unsummed``), as for its own reads,
    unless it has forgotten some of them already (``ReadCache.forgotten``);
  - other tables: the servers' sequence number of the block when it was read
    is at least the one after the reader's last acknowledged push to it (so
    every one of them is in it); its buffered pushes are added at assembly
    as for any read;
* ``refresh=True``: the block was read after the reader's clock began (a
  server read in the reader's clock, as its own would have to be);
* not under ASP or ESSP (whose entries are the reader's own reads, or
  filled by the servers per reader), not for value-bounded tables (never
  cached), and not in the clock a retried participant repeats (its reads
  go to the servers).

A block that holds only some of the rows a read needs is taken as an own
entry would be: the read fetches the missing rows and merges them in.

The arrays of a shared block are read-only views: no participant writes into
them (its write-through, ``ReadCache.write_through``, copies first). The
cache is per run and per process (:func:`acquire`), lives as long as a
participant of the run holds it in the process, and keeps the
latest block read per table and block. ``ps.process-cache`` turns it on.

Thread-safe: the participants of a process are threads.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SharedBlock:
    """A block (or some of its rows) as the servers returned it to a read of
    some participant of the process."""

    table_id: str
    version: int
    tag: float  # every update of the clocks < tag is in it
    sent: float  # when the read was sent (now())
    seq: int  # the server's sequence number of the block when read
    summed_below: float | None  # aggregate="clock": per-clock sums of clocks < this are in it
    rows: np.ndarray | None  # local rows held (sorted), None = whole block
    values: np.ndarray  # read-only


def now() -> float:
    """The clock of :attr:`SharedBlock.sent` and of a session's start of
    its current clock (``refresh=True``: a block read after the reader's
    clock began is a read in its clock)."""
    return time.monotonic()


def read_only(values):
    """A read-only view of ``values`` (numpy; its own flags, so a server's
    array handed out shared in-process is not changed), or None where the
    array cannot be shared (not numpy: cupy arrays have no such flag)."""
    if type(values) is not np.ndarray:
        return None
    if not values.flags.writeable:
        return values
    view = values.view()
    view.flags.writeable = False
    return view


class ProcessCache:
    """The blocks read by the participants of one run in this process (see
    the module docstring): ``blocks[table][block]``, the latest read."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._lock = threading.Lock()
        self._blocks: dict[str, dict[int, SharedBlock]] = {}

    def __repr__(self):
        return f"<ProcessCache run={self.run_id} tables={sorted(self._blocks)}>"

    def get(self, name: str, table_id: str, version: int, b: int) -> SharedBlock | None:
        e = self._blocks.get(name, {}).get(b)
        if e is None or e.table_id != table_id or e.version != version:
            return None
        return e

    def put(self, name: str, b: int, e: SharedBlock) -> None:
        """Keep ``e`` unless the block held is of the same table and version
        and fresher (a higher tag)."""
        with self._lock:
            table = self._blocks.setdefault(name, {})
            old = table.get(b)
            if (old is not None and old.table_id == e.table_id and old.version == e.version
                    and old.tag > e.tag):
                return
            table[b] = e


# The participants hold their run's cache; it goes when the last one drops it
# (a participant that never leaves, e.g. a task cancelled mid-run, holds
# nothing beyond its own session's life).
_registry: weakref.WeakValueDictionary[str, ProcessCache] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


def acquire(run_id: str) -> ProcessCache:
    """The process cache of run ``run_id`` (created at its first participant
    in the process). A participant holds it until it ends."""
    with _registry_lock:
        cache = _registry.get(run_id)
        if cache is None:
            cache = _registry[run_id] = ProcessCache(run_id)
        return cache
