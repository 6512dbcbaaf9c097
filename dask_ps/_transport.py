"""Moving table data over Dask's comm (the one seam between pure code and the network).

``Router`` turns a push or pull of a whole table or of rows into one message
per server (``_routing``), sends them concurrently through ``Transport``,
and merges the replies. ``Transport`` is Dask's RPC connection pool; when
the caller runs inside a worker that hosts blocks itself, those blocks are
read and written in-process, without a comm or serialization.
"""

from __future__ import annotations

import asyncio

from distributed.protocol.serialize import to_serialize

from dask_ps import _config, _routing
from dask_ps._exceptions import StaleVersionError
from dask_ps._routing import TableHandle


def _wrap(x):
    return None if x is None else to_serialize(x)


class Transport:
    """Send ``ps_*`` messages: ``rpc`` is a Dask ``ConnectionPool`` (the
    client's or a worker's); ``local`` the worker plugin of this process, if any."""

    def __init__(self, rpc, scheduler, local=None):
        self.rpc = rpc
        self.scheduler = scheduler
        self.local = local
        self.local_address = local.worker.address if local is not None and local.worker else None

    def __repr__(self):
        return f"<Transport local={self.local_address}>"

    async def push(self, addr: str, h: TableHandle, items, raw: bool = False, run=None) -> list[int]:
        """Apply ``items`` on ``addr``; returns each block's sequence number after it."""
        if addr == self.local_address:
            return await self.local.local_push(h.spec.name, h.version, items, raw=raw, run=run)
        return await asyncio.wait_for(
            self.rpc(addr).ps_push(
                table=h.spec.name,
                version=h.version,
                blocks=[b for b, _, _ in items],
                rows=[_wrap(r) for _, r, _ in items],
                values=[to_serialize(v) for _, _, v in items],
                raw=raw,
                run=run,
            ),
            _config.get_seconds("timeouts.rpc"),
        )

    async def pull(self, addr: str, h: TableHandle, reqs, **extra) -> dict:
        """``{"seqs": [...], "values": [...]}`` for ``(block, rows)`` requests.
        ``extra``: ``run``/``subscribe`` of a participant (see ``ps_pull``)."""
        blocks = [b for b, _ in reqs]
        rows = [r for _, r in reqs]
        if addr == self.local_address:
            return await self.local.local_pull(h.spec.name, h.version, blocks, rows, **extra)
        return await asyncio.wait_for(
            self.rpc(addr).ps_pull(
                table=h.spec.name, version=h.version, blocks=blocks, rows=[_wrap(r) for r in rows], **extra
            ),
            _config.get_seconds("timeouts.rpc"),
        )


class Router:
    """Table-level push/pull on top of a :class:`Transport`, with a cache of
    table handles (spec + placement) fetched from the scheduler."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.handles: dict[str, TableHandle] = {}

    async def handle(self, name: str, refresh: bool = False) -> TableHandle:
        h = self.handles.get(name)
        if h is None or refresh:
            msg = await self.transport.scheduler.ps_get_table(name=name)
            h = self.handles[name] = TableHandle.from_msg(msg)
        return h

    def forget(self, name: str) -> None:
        self.handles.pop(name, None)

    async def send(self, h: TableHandle, msgs: _routing.Messages, raw: bool = False, run=None) -> dict[int, int]:
        """One message per server, all in flight at once; returns the sequence
        number of every block after this push."""
        addrs = list(msgs)
        replies = await asyncio.gather(*(self.transport.push(a, h, msgs[a], raw, run) for a in addrs))
        seqs: dict[int, int] = {}
        for a, reply in zip(addrs, replies):
            for (b, *_), s in zip(msgs[a], reply):
                seqs[b] = max(seqs.get(b, 0), s)
        return seqs

    async def fetch(self, h: TableHandle, reqs: dict, **extra) -> dict[str, dict]:
        """Pull ``reqs[addr] = [(block, rows), ...]`` from every server at once."""
        addrs = list(reqs)
        replies = await asyncio.gather(*(self.transport.pull(a, h, reqs[a], **extra) for a in addrs))
        return dict(zip(addrs, replies))

    async def retrying(self, name, op):
        """``op(handle)``; a placement change bumps the table version, so on a
        stale version refresh the handle once and retry."""
        h = await self.handle(name)
        try:
            return await op(h)
        except StaleVersionError:
            return await op(await self.handle(name, refresh=True))

    async def push_dense(self, name: str, values, raw: bool = False):
        return await self.retrying(name, lambda h: self.send(h, _routing.split_dense(h, values), raw))

    async def push_rows(self, name: str, rows, values):
        """``rows`` sorted and unique (see ``_routing.coalesce_rows``)."""
        return await self.retrying(name, lambda h: self.send(h, _routing.split_rows(h, rows, values)))

    async def pull_dense(self, name: str):
        async def op(h):
            reqs = _routing.dense_requests(h)
            replies = await self.fetch(h, reqs)
            return _routing.assemble_dense(h, {a: r["values"] for a, r in replies.items()}, reqs)

        return await self.retrying(name, op)

    async def pull_rows(self, name: str, rows):
        async def op(h):
            reqs, _, inverse, order = _routing.row_requests(h, rows)
            replies = await self.fetch(h, reqs)
            values = {a: r["values"] for a, r in replies.items()}
            return _routing.assemble_rows(h, values, order, inverse, len(rows))

        return await self.retrying(name, op)
