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


def test_the_pad_is_a_buffer_of_its_own_that_dask_does_not_deserialize(monkeypatch):
    """The pad takes the place of a message's first buffer (the values then
    arrive in one of their own, aligned), and is unpickled on arrival, not
    deserialized through Dask's serializers as an ndarray was (half the cost
    of decoding a push)."""
    from distributed.protocol import core
    from distributed.protocol.serialize import to_serialize

    from dask_ps._wire import aligned

    values = np.arange(1024, dtype=np.float32)
    frames = core.dumps({"op": "ps_push", **aligned({"table": "t", "values": [to_serialize(values)]})})
    buffers = [f for f in frames if isinstance(f, memoryview) and not isinstance(f.obj, bytes)]
    assert len(buffers) == 2 and buffers[0].nbytes == 1 and buffers[1].nbytes == values.nbytes
    assert struct_nosplit(frames) < values.nbytes  # the values are read into a buffer of their own

    calls = []
    real = core.merge_and_deserialize
    monkeypatch.setattr(core, "merge_and_deserialize", lambda *a, **k: calls.append(1) or real(*a, **k))
    msg = core.loads([bytes(f) if isinstance(f, bytes) else bytearray(f) for f in frames])
    assert len(calls) == 1  # the values only
    assert np.array_equal(msg["values"][0], values) and "pad" in msg


def struct_nosplit(frames) -> int:
    """The bytes Dask's TCP comm reads into the header's buffer (after its length field)."""
    import struct

    from distributed.comm.tcp import _add_frames_header

    out, _, _ = _add_frames_header(list(frames))
    return struct.unpack("Q", bytes(memoryview(out[0])[:8]))[0]
