"""How arrays go into and come out of a message between processes: the
alignment pad, and rows as their nonzeros for ``sparse_wire`` tables
(:mod:`dask_ps._sparse_rows`). Used by the worker plugin's handlers and by
the transport that calls them."""

from __future__ import annotations

import math
import pickle
import struct

import numpy as np
from dask.sizeof import sizeof
from distributed.protocol.serialize import Pickled, Serialize, Serialized, to_serialize

from dask_ps import _backend, _config, _sparse_rows
from dask_ps._exceptions import PSValueError

# Dask's TCP comm reads a message's first array into the buffer of its
# header frames, at whatever offset the header's length gives, and every
# later array into a buffer of its own (distributed.comm.tcp's
# _add_frames_header). The first array of a push or a pull's reply then
# landed at odd addresses as its sequence numbers grew: numpy marks such an
# array unaligned, BLAS refuses it (the NaN/Inf check of a 4 MiB push took
# 2.5 ms instead of 0.13) and ufuncs take their buffered loops (a 4 MiB
# ``+=`` 0.44 ms instead of 0.25), and the reader got the unaligned array.
class _PickledPad(Pickled):
    """One byte as an out-of-band buffer of a pickle, pickled once: a buffer
    frame of its own (not ``bytes``), which takes that first place. Dask
    unpickles it on arrival (``pickle.loads`` of 4 bytes and the buffer),
    which costs less than an ndarray through Dask's serializers (loads of a
    push 34 -> 19 us, without a pad 18), and sends it as it is (``dumps``
    sets ``num-sub-frames`` to the value it already holds)."""

    def __init__(self):
        frames = []
        obj = pickle.dumps(pickle.PickleBuffer(bytearray(1)), protocol=5,
                           buffer_callback=lambda b: frames.append(memoryview(b.raw())))
        super().__init__({"pickled-obj": obj, "num-sub-frames": len(frames)}, frames)


@sizeof.register(_PickledPad)
def _sizeof_pad(obj) -> int:
    # Dask sizes every message it sends (to decide whether to serialize it
    # off the event loop).
    return 1


_PAD = _PickledPad()


def aligned(msg: dict) -> dict:
    """``msg`` with a one-byte buffer first, which takes that place: the
    message's own arrays each arrive in a buffer of their own, aligned.
    Handlers drop it (``_handlers.HandlerRegistry``), readers ignore it."""
    return {"pad": _PAD, **msg}


# A small array goes inside the message's msgpack body as bytes (one copy
# each way) rather than as a frame of its own through Dask's serializers:
# a frame costs the sender ~80 us (serialize, sub-frames, compression
# check) and the receiver ~40 us plus a read of its own, where a 17-row
# push's values are 136 bytes. Measured on 2 worker processes, one RPC
# with a push's two small arrays: 680-770 us of CPU as frames, 405-490 us
# inline (a bare RPC: 370-380). Above ``ps.wire-inline-bytes`` the frame's
# zero copy wins.
_INLINE = struct.Struct("<BB")  # ndim, length of the dtype's str; then the dtype str, the shape (int64), the data


def _inline(x: np.ndarray) -> bytes:
    d = x.dtype.str.encode()
    return b"".join((_INLINE.pack(x.ndim, len(d)), d, np.asarray(x.shape, "<i8").tobytes(),
                     np.ascontiguousarray(x).tobytes()))


def inlined(b: bytes) -> np.ndarray:
    """The array :func:`to_wire` put inline, as a fresh writable array.
    Raises :class:`PSValueError` where ``b`` is not one."""
    try:
        ndim, n = _INLINE.unpack_from(b)
        dtype = np.dtype(b[2:2 + n].decode("ascii"))
        start = 2 + n + 8 * ndim
        shape = tuple(int(s) for s in np.frombuffer(b, "<i8", ndim, 2 + n)) if ndim else ()
    except (struct.error, TypeError, ValueError, UnicodeDecodeError) as e:
        raise PSValueError(f"an inline array is malformed ({e!r})") from None
    if ndim > 32 or dtype.kind not in "biufc" or min(shape, default=0) < 0 \
            or math.prod(shape) * dtype.itemsize != len(b) - start:
        raise PSValueError(f"an inline array is malformed (shape {shape}, dtype {dtype}, {len(b) - start} bytes)")
    out = np.empty(shape, dtype)
    out.reshape(-1).view(np.uint8)[:] = np.frombuffer(b, np.uint8, len(b) - start, start)
    return out


def to_wire(x):
    """An array as it goes into a message: inline bytes where it is a small
    numpy array (at most ``ps.wire-inline-bytes``), else a zero-copy frame."""
    if type(x) is np.ndarray and x.nbytes <= _config.get_bytes("wire-inline-bytes"):
        return _inline(x)
    return to_serialize(x)


def _has_frame(x, depth: int) -> bool:
    if isinstance(x, Serialize):
        return True
    if depth and isinstance(x, (list, tuple)):
        return any(_has_frame(y, depth - 1) for y in x)
    if depth and isinstance(x, dict):
        return any(_has_frame(y, depth - 1) for y in x.values())
    return False


def framed(msg: dict) -> dict:
    """``msg``, :func:`aligned` where an array in it goes as a frame (a
    clock message's pushes' sparse values are 4 levels down): a message of
    inline arrays only needs no pad, which would be a frame of its own."""
    return aligned(msg) if any(_has_frame(v, 5) for v in msg.values()) else msg


def wire_values(values, sparse: bool):
    """Rows of a push or a pull's reply as they go into a message: a
    zero-copy frame, or (``sparse``) their nonzeros where that is smaller
    (``dask_ps._sparse_rows``, compiled on first use). Rows encoded
    already (a server's read, ``ShardStore.read``) or that arrived so (a
    primary forwarding a push) go as they are."""
    enc = values if isinstance(values, dict) else None
    if isinstance(values, _sparse_rows.EncodedRows):
        enc = values.message()
    elif isinstance(values, _sparse_rows.DenseRows):
        values = values.values
    if sparse and enc is None:
        enc = _sparse_rows.encode(values)
    if enc is not None:
        return {k: to_wire(x) if isinstance(x, np.ndarray) else x for k, x in enc.items()}
    return to_wire(values)


def unwire_values(values: list, max_bytes: int | None = None, decode: bool = True) -> list:
    """The rows of received values: sparse ones checked (at most
    ``max_bytes`` each) and decoded, or (not ``decode``: a push, which a
    ``sum`` table of integers adds as it came) kept as
    :class:`~dask_ps._sparse_rows.EncodedRows`; others as they are."""
    if not any(isinstance(v, (dict, bytes)) for v in values):
        return values
    out = []
    for v in values:
        if isinstance(v, bytes):
            v = inlined(v)
        elif isinstance(v, dict):
            v = _sparse_rows.checked({k: unwrap(x) for k, x in v.items()}, max_bytes)
            v = v.toarray() if decode else v
        out.append(v)
    return out


def wired_nbytes(w) -> int:
    if isinstance(w, dict):
        return sum(wired_nbytes(x) for x in w.values() if isinstance(x, (bytes, Serialize)))
    if isinstance(w, bytes):  # inline: its data, not its header
        ndim, n = _INLINE.unpack_from(w)
        return len(w) - (2 + n + 8 * ndim)
    return getattr(w.data, "nbytes", 0)


def unwrap(x):
    """Arrays arrive deserialized or inline (decoded here); anything else
    that is still opaque is refused."""
    if isinstance(x, bytes):
        return inlined(x)
    if isinstance(x, Serialized):
        raise PSValueError("payload could not be deserialized")
    return x


def wire_block(e: dict) -> dict:
    """An exported block as a message: arrays as zero-copy frames."""
    return {
        **e,
        "data": to_serialize(e["data"]),
        "state": {k: to_serialize(v) for k, v in e["state"].items()},
        "pending": [[run, clock, to_serialize(acc)] for run, clock, acc in e.get("pending", ())],
    }


def unwire_block(e: dict) -> dict:
    if not isinstance(e, dict) or not _backend.is_array(e.get("data")):
        raise PSValueError("an installed block must be a dict with a 'data' array")
    return e


def wire_local_rows(rows):
    """Validated rows of a forwarded push as a message: None, ``[start,
    stop]`` for a range, or a zero-copy frame."""
    if rows is None:
        return None
    if isinstance(rows, slice):
        return [rows.start, rows.stop]
    return to_wire(rows)
