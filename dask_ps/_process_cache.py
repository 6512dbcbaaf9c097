"""Bösen's process cache, the part kept: the reads of the
participants of one run that are threads of one worker process (``dask
worker --nthreads N``) are combined before they leave the process.

With ``ps.process-read-window`` a participant's plain read of a server in
another process waits that long on the worker's event loop for the reads of
the other participants to the same server and table, and they go as one
message (:class:`PullCombiner`, through the participant's
:class:`CombiningTransport`; Bösen's batched row requests). Blocks served in
the process itself (its own worker's shards; every worker of an in-process
cluster) are read by a direct call and not combined.

The other half of Bösen's process storage, a block one participant read
serving the reads of the others, was built and measured (issue 23) and
removed: the estimators' participants read in lockstep (every BSP read of a
clock is sent when the barrier opens, SGD prefetches the next round, LDA's
``refresh=True`` needs a block read after the reader's clock began), so a
peer's reply was almost never there when a read was sent (0-0.28 blocks a
clock) and no layout gained (docs/benchmarks.md, "Bösen's process cache").

The combiner runs on the worker's event loop only.
"""

from __future__ import annotations

import asyncio
import threading
import weakref

import numpy as np

from dask_ps import _backend, _config
from dask_ps._transport import Transport, _within
from dask_ps._wire import aligned


# The participants hold their run's combiner; it goes when the last one drops
# it (a participant that never leaves, e.g. a task cancelled mid-run, holds
# nothing beyond its own session's life).
_registry: weakref.WeakValueDictionary[str, "PullCombiner"] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


def acquire(run_id: str) -> "PullCombiner":
    """The read combiner of run ``run_id`` in this process (created at its
    first participant here). A participant holds it until it ends."""
    with _registry_lock:
        combiner = _registry.get(run_id)
        if combiner is None:
            combiner = _registry[run_id] = PullCombiner()
        return combiner


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
        return _backend.read_only(vals) if shared else vals  # several readers: none writes into it
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
    :class:`PullCombiner` once the session set ``combiner``, and whose
    clock messages to them through its run's
    :class:`~dask_ps._clock_combiner.ClockCombiner` once it set
    ``clock_combiner``."""

    combiner: PullCombiner | None = None
    clock_combiner = None
    clock_window = None  # () -> how long a section may wait for its siblings (the session's)

    async def send_clock(self, addr: str, seconds: float, msg: dict):
        if self.clock_combiner is None:
            return await super().send_clock(addr, seconds, msg)
        self.sent["clock_combined"] += 1  # a section of a message of the process (counted in "clock" too)
        return await self.clock_combiner.clock(self._send_sections, addr, msg["clock"], msg["rank"], msg, seconds,
                                               self.clock_window() if self.clock_window is not None else None)

    def clock_passed(self, rank: int, clock: int) -> None:
        if self.clock_combiner is not None:
            self.clock_combiner.passed(rank, clock)

    async def _send_sections(self, addr: str, sections: list, seconds: float) -> list:
        """One ``ps_run_clock`` carrying ``sections`` (built clock messages);
        the token once, for all of them; aligned if one has a frame."""
        pad = any("pad" in s for s in sections)
        msg = {"sections": [{k: v for k, v in s.items() if k not in ("pad", "token")} for s in sections],
               **self._trusted}
        msg = aligned(msg) if pad else msg
        reply = await self.liveness.call(addr, lambda: _within(seconds, self.rpc(addr).ps_run_clock(**msg)))
        return reply.get("sections") if isinstance(reply, dict) else reply

    async def pull(self, addr: str, h, reqs, **extra) -> dict:
        if self.combiner is None or set(extra) != {"run"} or not self.serialized(addr):
            return await super().pull(addr, h, reqs, **extra)
        return await self.combiner.pull(super().pull, addr, h, list(reqs), extra["run"])
