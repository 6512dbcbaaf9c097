"""The worker half of dask_ps: hosts shards and answers push/pull.

Installed on every worker by the scheduler plugin (``PSSchedulerPlugin.start``).
Its handlers are ordinary Dask RPC handlers (``ps_push``, ``ps_pull``, ...),
so data moves worker to worker over Dask's comm (TCP, TLS, UCX), and numpy
arrays travel as zero-copy frames via ``to_serialize``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from distributed import WorkerPlugin
from distributed.protocol.serialize import Serialized, to_serialize

from dask_ps import _config
from dask_ps._exceptions import PSValueError
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec

logger = logging.getLogger(__name__)

PLUGIN_NAME = "ps"


class PSWorkerPlugin(WorkerPlugin):
    """Worker extension: a :class:`ShardStore` plus the ``ps_*`` handlers.

    All store mutations happen on the worker's event loop; large updates are
    computed on Dask's offload thread into fresh arrays and swapped in on the
    loop, under a per-table lock so writes never interleave.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.store = ShardStore()
        self.worker = None
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def __repr__(self):
        addr = self.worker.address if self.worker is not None else None
        return f"<PSWorkerPlugin {addr} {self.store}>"

    async def setup(self, worker):
        self.worker = worker
        worker.handlers.update(
            {
                "ps_create_shards": self.create_shards,
                "ps_drop_table": self.drop_table,
                "ps_push": self.push,
                "ps_pull": self.pull,
                "ps_info": self.info,
            }
        )
        worker.extensions[PLUGIN_NAME] = self
        # Announce ourselves (never called from the scheduler's add_worker:
        # an RPC to a joining worker there deadlocks, see DASK_NOTES pitfall 1).
        await worker.scheduler.ps_register_server(address=worker.address)

    async def teardown(self, worker):
        for op in ("ps_create_shards", "ps_drop_table", "ps_push", "ps_pull", "ps_info"):
            worker.handlers.pop(op, None)
        worker.extensions.pop(PLUGIN_NAME, None)
        self.store.tables.clear()

    # --- handlers (called on the worker's event loop) -----------------------------
    def create_shards(self, spec: dict, version: int, blocks: list) -> None:
        """Handler: allocate the given blocks of a table (zeros)."""
        self.store.create(TableSpec.from_msg(spec), version, list(blocks))

    def drop_table(self, name: str, table_id: str | None = None) -> bool:
        """Handler: forget a table's shards."""
        self._locks.pop(name, None)
        return self.store.drop(name, table_id)

    async def push(self, table=None, version=None, blocks=(), rows=(), values=(), raw=False):
        """Handler: apply one message of updates (all blocks or none)."""
        rows = [_unwrap(r) for r in rows] if isinstance(rows, (list, tuple)) else rows
        values = [_unwrap(v) for v in values] if isinstance(values, (list, tuple)) else values
        async with self._locks[table if isinstance(table, str) else ""]:
            t, items = self.store.validate_push(table, version, blocks, rows, values)
            nbytes = sum(v.nbytes for _, _, v in items)
            if nbytes >= _config.get_bytes("offload-bytes"):
                from distributed.utils import offload

                fresh = await offload(self.store.apply, t, items, raw=bool(raw), in_place=False)
            else:
                fresh = self.store.apply(t, items, raw=bool(raw))
            self.store.commit(t, fresh)
            return self.store.seqs(t, items)

    def pull(self, table=None, version=None, blocks=(), rows=()):
        """Handler: values of whole blocks or of rows within blocks."""
        rows = [_unwrap(r) for r in rows] if isinstance(rows, (list, tuple)) else rows
        t, reqs = self.store.validate_pull(table, version, blocks, rows)
        seqs, values = self.store.read(t, reqs)
        return {"seqs": seqs, "values": [to_serialize(a) for a in values]}

    def info(self) -> dict:
        """Handler: which blocks of which tables live here, and their bytes."""
        return {
            name: {"version": t.version, "blocks": sorted(t.blocks), "nbytes": t.nbytes}
            for name, t in self.store.tables.items()
        }

    # --- same-process access (a participant on this worker) -------------------------
    async def local_push(self, table, version, items, raw=False):
        async with self._locks[table]:
            blocks, rows, values = zip(*items) if items else ((), (), ())
            t, items = self.store.validate_push(table, version, list(blocks), list(rows), list(values))
            fresh = self.store.apply(t, items, raw=raw)
            self.store.commit(t, fresh)
            return self.store.seqs(t, items)

    def local_pull(self, table, version, blocks, rows):
        t, reqs = self.store.validate_pull(table, version, blocks, rows)
        seqs, values = self.store.read(t, reqs, copy=True)
        return {"seqs": seqs, "values": values}


def _unwrap(x):
    """Arrays arrive deserialized; anything else that is still opaque is refused."""
    if isinstance(x, Serialized):
        raise PSValueError("payload could not be deserialized")
    return x
