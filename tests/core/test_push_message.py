"""The message of a dense push, without a cluster: ``Transport.push`` leaves
the fields at the handler's defaults out (a client's dense push has at most
ten fields with Dask's ``op`` and ``reply``, which ``dask.sizeof`` walks
without sampling: the sampling cost more than the rest of the walk), and
the ``ps_push`` handler reads a message without ``rows`` as whole blocks;
small arrays go inline (``_wire.to_wire``) and come back as they were."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import dask
import numpy as np
import pytest
from distributed.protocol.serialize import Serialize

from dask_ps._exceptions import PSValueError
from dask_ps._routing import TableHandle
from dask_ps._spec import TableSpec
from dask_ps._transport import Transport
from dask_ps._wire import inlined, to_wire, unwrap, wired_nbytes
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
    # A small array goes inline (msgpack bytes): no frame, so no pad.
    assert "pad" not in msg and isinstance(msg["values"][0], bytes)
    assert np.array_equal(inlined(msg["values"][0]), np.ones(8, np.float32))


def test_a_push_above_the_inline_size_goes_as_a_frame_after_the_pad():
    rpc = RecordingRPC()
    h = _handle(n_rows=1024)
    with dask.config.set({"ps.wire-inline-bytes": "1KiB"}):
        asyncio.run(Transport(rpc, scheduler=None).push(SERVER, h, [(0, None, np.ones(1024, np.float32))],
                                                        raw=False, run=None, sender="s", msg_seq=3))
    (msg,) = rpc.sent
    assert isinstance(msg["values"][0], Serialize)
    assert next(iter(msg)) == "pad"  # still the first array (_wire.aligned)


def test_fields_away_from_the_defaults_are_sent():
    rpc = RecordingRPC()
    h = _handle()
    rows = np.array([1, 5])
    asyncio.run(Transport(rpc, scheduler=None).push(SERVER, h, [(0, rows, np.ones(2, np.float32))],
                                                    raw=True, run=("r", 0), sender="r-0", msg_seq=0))
    (msg,) = rpc.sent
    assert msg["raw"] is True and msg["run"] == ("r", 0)
    assert len(msg["rows"]) == 1 and np.array_equal(inlined(msg["rows"][0]), rows)


@pytest.mark.parametrize("a", [np.arange(17, dtype=np.int32), np.full((17, 1), 1e-6), np.zeros((0, 5), np.float32),
                               np.array(3.0), np.arange(12).reshape(3, 4)[:, ::2], np.ones((2, 3), np.complex64),
                               np.array([True, False])])
def test_an_inline_array_comes_back_equal_writable_and_aligned(a):
    b = to_wire(a)
    assert isinstance(b, bytes) and wired_nbytes(b) == a.nbytes
    c = unwrap(b)
    assert c.dtype == a.dtype and c.shape == a.shape and np.array_equal(c, a)
    assert c.flags.writeable and c.flags.aligned


def _inline_bytes(dtype: bytes, shape, data: bytes) -> bytes:
    return bytes([len(shape), len(dtype)]) + dtype + np.asarray(shape, "<i8").tobytes() + data


@pytest.mark.parametrize("bad", [b"", b"\x01", b"\x01\x03<f8", _inline_bytes(b"|O8", [1], bytes(8)),
                                 _inline_bytes(b"<f8", [2], bytes(8)), _inline_bytes(b"<f8", [-1], b""),
                                 _inline_bytes(b"V16", [1], bytes(16)), _inline_bytes(b"<f8", [2**62, 2**62], b""),
                                 b"\x01\x02\xff\xfe" + bytes(8)])
def test_a_malformed_inline_array_is_refused(bad):
    with pytest.raises(PSValueError, match="inline array is malformed"):
        unwrap(bad)


def test_the_push_handler_decodes_inline_arrays_and_refuses_a_malformed_one():
    spec = TableSpec.create("t", (8,), "float32", block_rows=8)
    p = PSWorkerPlugin()
    p.worker = SimpleNamespace(address=ME, scheduler=None)
    p.create_shards(spec.to_msg(), 1, [0], owners=[[ME]])
    assert asyncio.run(p.push(table="t", version=1, blocks=[0], rows=[to_wire(np.array([1, 5]))],
                              values=[to_wire(np.array([2.0, 3.0], np.float32))], sender="c", msg_seq=0)) == [1]
    with pytest.raises(PSValueError, match="inline array is malformed"):
        asyncio.run(p.push(table="t", version=1, blocks=[0], rows=[b"\x01\x03<i8"],
                           values=[to_wire(np.array([2.0], np.float32))], sender="c", msg_seq=1))
    assert np.array_equal(p.store.tables["t"].blocks[0].data, [0, 2, 0, 0, 0, 3, 0, 0])


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
