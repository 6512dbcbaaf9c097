"""The one place where the estimators use ``distributed`` beyond its public API.

Each function says which public API is missing. Everything else in
``dask_ps._estimators`` and in the estimators goes through the public
``ParameterServer``/``ctx`` API and public ``distributed`` calls
(``Client.scatter``/``submit``/``persist``/``who_has``, ``futures_of``).
"""

from __future__ import annotations

import time


def flat_keys(collection) -> list:
    """The keys of a dask collection's blocks, in block order (row-major)."""
    out = []

    def walk(k):
        if isinstance(k, list):
            for x in k:
                walk(x)
        else:
            out.append(k)

    walk(collection.__dask_keys__())
    return out


def futures_in_block_order(persisted) -> list:
    """The futures of a persisted collection's blocks, in block order.

    Missing public API: a way to get "the future of block i" of a persisted
    collection. ``futures_of`` returns them unordered, and a persisted
    dask-expr collection's keys are aliases of its futures' keys that only
    share the block index (the key's tail), so they are matched on that.
    """
    from distributed import futures_of

    by_index = {tuple(f.key[1:]): f for f in futures_of(persisted)}
    return [by_index[tuple(k[1:])] for k in flat_keys(persisted)]


def holders(client, futures) -> dict:
    """``{future.key: sorted workers holding it}`` (empty for a block not in
    memory anywhere).

    ``Client.who_has`` is public, but its answer is keyed by the key or by
    its string form depending on the key's type; both are tried here.
    """
    who = client.who_has(futures)
    out = {}
    for f in futures:
        out[f.key] = sorted(who.get(f.key) or who.get(str(f.key)) or ())
    return out


def local_or_remote_copy(keys, timeout: float = 60.0):
    """Task helper: the value of the first of ``keys`` held by this worker
    (no transfer, no copy), else a copy fetched from a worker that still
    holds one of them.

    Missing public API: reading a key that this task does not depend on
    (``worker.data``), asking the scheduler who holds it
    (``worker.scheduler.who_has``) and fetching it from that worker
    (``distributed.worker.get_data_from_worker``). A task that depended on
    the copies would be lost with any of them; this one depends on none,
    so Dask can always run it again elsewhere.
    """
    from distributed import get_worker
    from distributed.utils import sync
    from distributed.worker import get_data_from_worker

    worker = get_worker()
    for key in keys:
        if key in worker.data:
            return worker.data[key]
    deadline = time.monotonic() + timeout
    while True:
        who = sync(worker.loop, worker.scheduler.who_has, keys=list(keys))
        found = [(k, w) for k in keys for w in (who.get(k) or ())]
        if not found:
            raise RuntimeError(
                "every copy of a part of the training data was lost with its worker(s): more "
                "workers died at once than the estimator's replication - 1"
            )
        for key, holder in found:
            try:
                got = sync(worker.loop, get_data_from_worker, worker.rpc, [key], holder, who=worker.address)
            except OSError:  # that holder died meanwhile: try the next
                continue
            if got.get("status") == "OK":
                return got["data"][key]
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not fetch a copy of a part of the training data from {found}")
        time.sleep(0.1)  # holders busy
