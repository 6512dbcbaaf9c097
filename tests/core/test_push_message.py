"""The message of a dense push, without a cluster: ``Transport.push`` leaves
the fields at the handler's defaults out (a client's dense push has at most
ten fields with Dask's ``op`` and ``reply``, which ``dask.sizeof`` walks
without sampling: the sampling cost more than the rest of the walk), and
the ``ps_push`` handler reads a message without ``rows`` as whole blocks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np

from dask_ps._routing import TableHandle
from dask_ps._spec import TableSpec
from dask_ps._transport import Transport
from dask_ps._worker_plugin import PSWorkerPlugin

ME = "tcp://10.0.0.1:1"
SERVER = "tcp://10.0.0.2:2"
DASK_FIELDS = ("op", "reply")  # what Dask's rpc adds to the message


class RecordingRPC:
    def __init__(self):
        self.sent = []

    def __call__(self, addr):
        return self

    async def ps_push(self, **msg):
        self.sent.append(msg)
        return [1]


def _handle(n_rows=8, block_rows=None):
    spec = TableSpec.create("t", (n_rows,), "float32", block_rows=block_rows)
    return TableHandle(spec, 1, tuple((SERVER,) for _ in range(spec.n_blocks)))


def test_a_clients_dense_push_has_at_most_ten_fields():
    rpc = RecordingRPC()
    h = _handle()
    asyncio.run(Transport(rpc, scheduler=None).push(SERVER, h, [(0, None, np.ones(8, np.float32))],
                                                    raw=False, run=None, sender="s", msg_seq=3))
    (msg,) = rpc.sent
    assert len(msg) + len(DASK_FIELDS) <= 10, sorted(msg)
    assert "rows" not in msg and "raw" not in msg and "run" not in msg
    assert msg["blocks"] == [0] and msg["sender"] == "s" and msg["msg_seq"] == 3
    assert next(iter(msg)) == "pad"  # still the first array (_wire.aligned)


def test_fields_away_from_the_defaults_are_sent():
    rpc = RecordingRPC()
    h = _handle()
    rows = np.array([1, 5])
    asyncio.run(Transport(rpc, scheduler=None).push(SERVER, h, [(0, rows, np.ones(2, np.float32))],
                                                    raw=True, run=("r", 0), sender="r-0", msg_seq=0))
    (msg,) = rpc.sent
    assert msg["raw"] is True and msg["run"] == ("r", 0)
    assert len(msg["rows"]) == 1 and np.array_equal(msg["rows"][0].data, rows)


def test_the_handler_reads_a_push_without_rows_as_whole_blocks():
    spec = TableSpec.create("t", (8,), "float32", block_rows=4)
    p = PSWorkerPlugin()
    p.worker = SimpleNamespace(address=ME, scheduler=None)
    p.create_shards(spec.to_msg(), 1, [0, 1], owners=[[ME], [ME]])
    seqs = asyncio.run(p.push(table="t", version=1, blocks=[0, 1],
                              values=[np.full(4, 2, np.float32), np.arange(4, dtype=np.float32)],
                              sender="c", msg_seq=0))
    assert seqs == [1, 1]
    t = p.store.tables["t"]
    assert np.array_equal(t.blocks[0].data, np.full(4, 2)) and np.array_equal(t.blocks[1].data, np.arange(4))
