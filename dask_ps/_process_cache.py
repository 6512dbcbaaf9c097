"""Bösen's process cache: blocks read by one participant serve the others of
its process, and their reads leave the process together.

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

Second, reads *combined* before they leave the process (Bösen's batched
row requests): with ``ps.process-read-window`` a participant's plain read of
a server in another process waits that long on the worker's event loop for
the reads of the other participants to the same server and table, and they
go as one message (:class:`PullCombiner`, through the participant's
:class:`CombiningTransport`).

Thread-safe: the participants of a process are threads; the combiner runs
on the worker's event loop only.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from dask_ps import _config
from dask_ps._transport import Transport


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
        self.combiner = PullCombiner()

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


# --- reads combined before they leave the process -------------------------------------------
# Reads that went through a combiner in this process, and the messages they
# became (benchmarks and tests read them with ``client.run``).
combined = {"requests": 0, "messages": 0}


class _Batch:
    __slots__ = ("requests",)

    def __init__(self):
        self.requests: list[tuple[list, int | None, asyncio.Future]] = []


def _union(rows_list):
    """The rows of a block several reads ask for: None (the whole block) if
    one asks for all of it, else the sorted union of their sorted rows."""
    if any(r is None for r in rows_list):
        return None
    if len(rows_list) == 1:
        return rows_list[0]
    return np.unique(np.concatenate(rows_list))


def _part(rows, union, vals, shared: bool):
    """The values of a read's ``rows`` in a reply of ``union`` rows."""
    if rows is union or (rows is not None and union is not None and rows.size == union.size):
        # every row of the reply (rows are unique and a subset of the union)
        return read_only(vals) if shared and read_only(vals) is not None else vals
    if union is None:
        return vals[rows]
    return vals[np.searchsorted(union, rows)]


class PullCombiner:
    """Reads of the participants of one run in this process that go to the
    same server for the same table within ``ps.process-read-window`` become
    one message: per block the union of their rows, read at the highest of
    their tags (each a run minimum clock already reached, so the server
    waits for nothing more; values at least as fresh as each reader's tag
    says), and each reader gets its own rows of the reply. Only plain
    reads (``Session._read``): not a prefetch (whose reply says which of
    *its* sender's pushes it holds) nor an ESSP read (which subscribes its
    reader). Runs on the worker's event loop only."""

    def __init__(self):
        self._batches: dict[tuple, _Batch] = {}

    async def pull(self, send, addr: str, h, entries: list, run: tuple):
        key = (addr, h.spec.table_id, h.version, run[0])
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = _Batch()
            asyncio.get_running_loop().create_task(self._send(key, batch, send, addr, h, run[0]))
        future = asyncio.get_running_loop().create_future()
        batch.requests.append((entries, run[1], future))
        combined["requests"] += 1
        return await future

    async def _send(self, key, batch: _Batch, send, addr, h, run_id):
        await asyncio.sleep(_config.get_seconds("process-read-window"))
        del self._batches[key]  # later reads start a new batch
        requests = batch.requests
        tags = [tag for _, tag, _ in requests]
        tag = None if any(t is None for t in tags) else max(tags)
        wanted: dict[int, list] = {}
        for entries, _, _ in requests:
            for b, rows in entries:
                wanted.setdefault(b, []).append(rows)
        union = {b: _union(rs) for b, rs in wanted.items()}
        blocks = list(union)
        combined["messages"] += 1
        try:
            reply = await send(addr, h, [(b, union[b]) for b in blocks], run=(run_id, tag))
        except BaseException as e:  # each reader's failover handles it (Router.fetch)
            for _, _, future in requests:
                if not future.done():
                    future.set_exception(e)
            return
        at = {b: i for i, b in enumerate(blocks)}
        summed = reply.get("summed_below")
        shared = len(requests) > 1
        for entries, _, future in requests:
            if future.done():
                continue
            idx = [at[b] for b, _ in entries]
            future.set_result({
                "seqs": [reply["seqs"][i] for i in idx],
                "values": [_part(rows, union[b], reply["values"][at[b]], shared) for b, rows in entries],
                "summed_below": None if summed is None else [summed[i] for i in idx],
                "applied": None,
            })


class CombiningTransport(Transport):
    """A participant's :class:`~dask_ps._transport.Transport` whose plain
    reads from servers in other processes go through its run's
    :class:`PullCombiner` once the session set ``combiner``."""

    combiner: PullCombiner | None = None

    async def pull(self, addr: str, h, reqs, **extra) -> dict:
        if self.combiner is None or set(extra) != {"run"} or not self.serialized(addr):
            return await super().pull(addr, h, reqs, **extra)
        return await self.combiner.pull(super().pull, addr, h, list(reqs), extra["run"])
