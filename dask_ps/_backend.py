"""Array-backend helpers: the same code runs on numpy and cupy arrays.

Storage and update code calls :func:`namespace` on its arrays and uses only
functions that numpy and cupy share, so a ``device="cuda"`` table runs the
same code on the GPU.

What ``device="cuda"`` means is one module, :func:`device_module`: cupy
where it imports. The tests replace it (:func:`set_device_module`) with a
CPU stand-in that behaves like cupy where it matters (its own array type,
no implicit host conversion, no mixing with numpy operands:
``tests/gpu/cupy_standin.py``), so every device path runs in the default
test run; in-process clusters share the replacement with their workers.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from dask_ps import _compiled

try:  # cupy is an optional extra (``pip install dask-ps[cuda]``)
    import cupy  # type: ignore[import-not-found]
except Exception:  # pragma: no cover - depends on the machine
    cupy = None


logger = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda")

_device_module = cupy  # the array module of device="cuda" (see device_module)


def device_module():
    """The array module of ``device="cuda"``: cupy (None where it does not
    import), or the stand-in a test installed with :func:`set_device_module`."""
    return _device_module


def set_device_module(module):
    """Make ``module`` (cupy-like: ``ndarray``, ``asarray``, ``asnumpy``,
    ``zeros``, ``add.at``, ``cuda.runtime``) the array module of
    ``device="cuda"`` in this process; returns the previous one. For tests:
    a CPU stand-in for cupy (``tests/gpu/cupy_standin.py``)."""
    global _device_module
    previous, _device_module = _device_module, module
    return previous


def is_cupy(x) -> bool:
    """Whether ``x`` is a device array (of :func:`device_module`)."""
    xp = _device_module
    return xp is not None and isinstance(x, xp.ndarray)


def namespace(*arrays):
    """The array module (numpy or the device module) of ``arrays``."""
    for a in arrays:
        if is_cupy(a):
            return _device_module
    return np


def is_array(x) -> bool:
    return isinstance(x, np.ndarray) or is_cupy(x)


def zeros(shape, dtype, device: str):
    if device == "cuda":
        xp = _device_module
        if xp is None:
            raise RuntimeError("device='cuda' needs cupy on the worker (pip install dask-ps[cuda])")
        return xp.zeros(shape, dtype=dtype)
    return np.zeros(shape, dtype=dtype)


def gpu_info() -> dict | None:
    """This process's current GPU: ``{"device": PCI bus id, "free": bytes,
    "total": bytes}``, or None without cupy or a usable device (the table
    placement check uses it for ``device="cuda"`` and ``"auto"``)."""
    xp = _device_module
    if xp is None:
        return None
    try:
        if xp.cuda.runtime.getDeviceCount() < 1:
            return None
        dev = xp.cuda.Device()
        free, total = xp.cuda.runtime.memGetInfo()
        return {"device": str(dev.pci_bus_id), "free": int(free), "total": int(total)}
    except Exception:  # pragma: no cover - no driver, or a broken one
        return None


def to_device(x, device: str):
    """Move ``x`` to ``device`` ("cpu" -> numpy, "cuda" -> cupy); no copy if already there."""
    if device == "cuda":
        if is_cupy(x):
            return x
        if _device_module is None:
            raise RuntimeError("device='cuda' needs cupy on the worker")
        return _device_module.asarray(x)
    if is_cupy(x):
        return _device_module.asnumpy(x)
    return x


def read_only(x):
    """``x`` for a reader that must not change it: a read-only view of a
    numpy array; a copy of a device array (cupy has no read-only arrays; the
    copy runs at device memory speed). Replies that share a server's stored
    block (an in-process cluster passes them without a copy) are handed out
    this way, so a reader cannot change the server's values (a session adds
    its own writes to what it read: on a cuda table that changed the server's
    block, counting own pushes twice)."""
    if isinstance(x, np.ndarray):
        v = x.view()
        v.flags.writeable = False
        return v
    if is_cupy(x):
        return x.copy()
    return x


def received(x):
    """An array deserialized from a network comm (TCP, TLS, UCX: a buffer
    nobody else holds), writable again. A server hands out a stored block
    read-only (readers in its process share it) and Dask's serialization
    carries the flag, so a reader in another process got a read-only array
    and copied it (a 4 MiB pull: 0.8 ms of its 3 ms). Never for an
    in-process comm's reply: that is the server's own block."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        try:
            x.flags.writeable = True
        except ValueError:  # the buffer itself is read-only (bytes)
            pass
    return x


def writable(x):
    """``x`` itself if it may be written in place, else a copy (cupy arrays
    always may: their ``flags`` have no ``writeable``)."""
    flags = getattr(x, "flags", None)
    if flags is not None and not getattr(flags, "writeable", True):
        return x.copy()
    return x


def to_numpy(x):
    return _device_module.asnumpy(x) if is_cupy(x) else np.asarray(x)


# Up to this many elements a direct NaN/Inf check (``isfinite().all()``) is
# cheaper than a BLAS reduction under ``errstate``.
SMALL = 4096


def all_finite(x) -> bool:
    """True when ``x`` has no NaN or Inf.

    One cheap reduction is non-finite whenever an element is; only when it
    is (an element is non-finite, or the reduction overflowed) do we pay
    for the element-wise check. On the CPU the reduction is the sum of
    squares by BLAS (``dot(x, x)``: 0.05 ms for 4 MiB of float32, where
    ``sum`` takes 0.15 ms with its pairwise summation); ``sum`` elsewhere.
    """
    xp = namespace(x)
    if x.size == 0 or x.dtype.kind not in "fc":
        return True
    if x.size <= SMALL:  # small: the direct check is cheaper than errstate
        return bool(xp.isfinite(x).all())
    with np.errstate(over="ignore", invalid="ignore"):
        if xp is np and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous:
            flat = x.reshape(-1)
            s = np.dot(flat, flat)
        else:
            s = xp.sum(x)
    if bool(xp.isfinite(s)):
        return True
    return bool(xp.all(xp.isfinite(x)))


def abs_bound(x) -> float:
    """An upper bound of ``max(|x|)`` for a finite float array (0 for an
    empty one), cheap where it can be: on the CPU the square root of the
    sum of squares by BLAS (the pass ``all_finite`` makes), else, or when
    that sum overflows, the exact maximum. The overflow checks of sums add
    such bounds (``ShardStore``): a sum whose terms' bounds stay below half
    the dtype's largest value cannot overflow. The result is not finite
    exactly when ``x`` holds a NaN or an Inf (one pass checks both)."""
    if x.size == 0:
        return 0.0
    xp = namespace(x)
    with np.errstate(over="ignore", invalid="ignore"):
        if xp is np and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous:
            flat = x.reshape(-1)
            s = float(np.dot(flat, flat))
            if math.isfinite(s):
                return math.sqrt(s) * (1 + 1e-6)  # the dot's rounding, generously
        return float(xp.max(xp.abs(x)))


def _copy_sum_squares_py(src, dst):
    # Compiled at first use (copy_abs_bound); float64 squares and sum: float32
    # values never overflow them, so the sum is finite exactly when the
    # values are. ``reassoc`` lets the reduction vectorize; a NaN or an Inf
    # still reaches the sum in any order (no nnan/ninf flags).
    s = 0.0
    for i in range(src.size):
        a = src[i]
        dst[i] = a
        d = np.float64(a)
        s += d * d
    return s


_copy_sum_squares = _compiled.lazy(_copy_sum_squares_py, nogil=True, fastmath={"reassoc", "contract"})




def copy_abs_bound(src, dst) -> float | None:
    """Copy ``src`` into ``dst`` and return :func:`abs_bound` of the values
    from the same pass: the default push's copy and its NaN/Inf check read
    the caller's array once (4 MiB of float32: 0.29 ms, where the copy and
    the BLAS check take 0.29 + 0.14 ms; 64 MiB: 8.0 vs 11.3 ms).

    Both are C-contiguous numpy arrays of one shape and dtype. Returns None,
    leaving ``dst`` alone, where no such pass applies (not float32/float64,
    small): the caller checks and copies as before. The first call in a
    process imports numba and loads (or, once per install, compiles) the
    loop: 0.4 s with numba imported already, as the estimators' kernels
    have it; 0.8 s in a process without it (1.3 s the first time)."""
    if (src.dtype not in (np.float32, np.float64) or src.size <= SMALL or dst.dtype != src.dtype
            or not (src.flags.c_contiguous and dst.flags.c_contiguous) or src.shape != dst.shape):
        return None
    s = _copy_sum_squares(src.reshape(-1), dst.reshape(-1))
    if math.isfinite(s):
        return math.sqrt(s) * (1 + 1e-6)
    if src.dtype == np.float32 or not np.isfinite(dst).all():
        return math.inf  # a NaN or an Inf (float32 squares cannot overflow float64)
    return float(np.max(np.abs(dst)))  # float64 squares overflowed: the exact maximum


def overflow_limit(dtype) -> float:
    """Bounds of a sum's terms that add up to at most this cannot overflow ``dtype``."""
    return float(np.finfo(dtype).max) / 2


def _gather_py(src, idx, out):
    # Compiled at first use (take_rows). Stops at the first index out of
    # range and says where: a server's read of a session's rows trusts the
    # session's checks, and an index out of range must still be refused.
    n = src.size
    for i in range(idx.size):
        j = idx[i]
        if j < 0 or j >= n:
            return i
        out[i] = src[j]
    return idx.size


_gather = _compiled.lazy(_gather_py, nogil=True)


def take_rows(data, idx):
    """``data[idx]`` for a 1-D integer array ``idx`` (rows along the first axis).

    Rows of several elements: ``take`` gathers them whole (~2-6x fancy
    indexing at 16 floats a row). Rows of one element, at least ``SMALL``
    of them: a compiled loop (100k rows of a 1M x 1 float32 block: 0.16 ms,
    where fancy indexing with the int32 rows a session sends took 0.23 and
    ``take`` with int64 ones 0.21; 300k of 4M: 0.66 vs 0.89); fewer, with
    int64 indices: ``take`` on the flat array; else fancy indexing, which
    converts int32 indices as it goes (``take`` first copies them whole to
    int64). An index out of range raises ``IndexError``. The loop is
    loaded at the first such gather of a process (numba, as
    :func:`copy_abs_bound`: 0.4 s where numba is imported already)."""
    if data.ndim > 1 and data.size > data.shape[0]:
        return namespace(data).take(data, idx, axis=0)
    if (isinstance(data, np.ndarray) and data.flags.c_contiguous and isinstance(idx, np.ndarray)
            and data.size):
        shape = (idx.shape[0], *data.shape[1:])
        if (idx.size >= SMALL and idx.dtype in (np.int32, np.int64)
                and (data.dtype.kind in "iu" or data.dtype in (np.float32, np.float64))):
            out = np.empty(shape, dtype=data.dtype)
            done = _gather(data.reshape(-1), idx, out.reshape(-1))
            if done < idx.size:
                raise IndexError(f"index {int(idx[done])} is out of bounds for axis 0 with size {data.shape[0]}")
            return out
        if idx.dtype == np.intp:
            return np.take(data.reshape(-1), idx).reshape(shape)
    return data[idx]


def add_rows(out, idx, vals) -> None:
    """``out[idx] += vals`` for distinct row indices ``idx`` (a 1-D integer
    array) along the first axis: the same values, bit for bit.

    numpy's fancy ``+=`` gathers into a temporary, adds and scatters back
    through its general indexing machinery. Rows of one element take
    ``add.at`` on the flat array instead (its 1-D fast path: 0.5-0.8 ms
    for 300k rows of a 4M-row float32 block where ``+=`` took 2.9-3.5 ms);
    wider rows are gathered by ``take`` and written back as opaque
    records of a row's bytes (4.3 ms for 100k rows of 16 float32 where
    ``+=`` took 12 ms; equal at 200 bytes a row and wider).

    A read-only ``out`` raises, as ``+=`` does (numpy 2.4's ``add.at``
    writes into read-only arrays without a word)."""
    if (not isinstance(out, np.ndarray) or not isinstance(vals, np.ndarray) or vals.dtype != out.dtype
            or out.ndim == 0 or not out.flags.c_contiguous or not out.flags.writeable or out.dtype.hasobject
            or not isinstance(idx, np.ndarray) or idx.ndim != 1):
        out[idx] += vals
        return
    n = out.shape[0]
    width = out.size // n if n else 0
    if width == 1:
        np.add.at(out.reshape(-1), idx, vals.reshape(-1))
        return
    if width == 0 or idx.size == 0:
        return
    rows = out.reshape(n, width)
    gathered = np.take(rows, idx, axis=0)
    gathered += vals.reshape(gathered.shape)
    record = np.dtype((np.void, out.itemsize * width))
    rows.view(record).reshape(-1)[idx] = gathered.view(record).reshape(-1)


# The dtypes cupy.add.at accumulates (CUDA atomicAdd); others go through a wider one.
_DEVICE_ADD_AT = frozenset(np.dtype(t) for t in ("int32", "int64", "float16", "float32", "float64", "uint32",
                                                  "uint64"))


def scatter_add(out, idx, vals) -> None:
    """``out[idx] += vals`` with repeated indices accumulated (``numpy.add.at``).

    On the device ``add.at`` of cupy (``cupyx.scatter_add`` is deprecated
    for it) takes int32/64, uint32/64 and float16/32/64 only; other table
    dtypes accumulate in a wider one (int64 for small integers and bool,
    float64 pairs for complex) and are cast back, as numpy's wrap-around
    and truth value would give."""
    if not is_cupy(out):
        np.add.at(out, idx, vals)
        return
    xp = _device_module
    if out.dtype in _DEVICE_ADD_AT:
        xp.add.at(out, idx, vals.astype(out.dtype, copy=False))
        return
    if out.dtype.kind == "c":
        real = xp.zeros(out.shape, dtype=np.float64)
        imag = xp.zeros(out.shape, dtype=np.float64)
        xp.add.at(real, idx, vals.real.astype(np.float64))
        xp.add.at(imag, idx, vals.imag.astype(np.float64))
        out += (real + 1j * imag).astype(out.dtype)
        return
    wide = out.astype(np.int64)
    xp.add.at(wide, idx, vals.astype(np.int64))
    out[...] = wide.astype(out.dtype) if out.dtype.kind != "b" else wide != 0


# rmm pool made in this process (ps.rmm-pool-size), so a second plugin setup keeps it.
_rmm_pool_size: int | None = None


def setup_device_memory(pool_size) -> bool:
    """Make an rmm memory pool of ``pool_size`` (bytes or a string such as
    ``"20 GiB"``; ``ps.rmm-pool-size``) on this process's GPU and have cupy
    allocate from it; the worker plugin's setup calls this. Returns whether a
    pool is in place. None: nothing to do (dask-cuda workers make their own
    with ``rmm_pool_size``). Without rmm or a device module it logs a warning.
    """
    global _rmm_pool_size
    if pool_size is None:
        return False
    from dask.utils import parse_bytes

    size = parse_bytes(pool_size) if isinstance(pool_size, str) else int(pool_size)
    if _rmm_pool_size == size:
        return True
    try:
        import rmm  # type: ignore[import-not-found]
        from rmm.allocators.cupy import rmm_cupy_allocator  # type: ignore[import-not-found]
    except ImportError:
        logger.warning("dask_ps: ps.rmm-pool-size is set but rmm does not import here; cupy keeps its allocator")
        return False
    if _device_module is None:
        logger.warning("dask_ps: ps.rmm-pool-size is set but cupy does not import here")
        return False
    rmm.reinitialize(pool_allocator=True, initial_pool_size=size)
    _device_module.cuda.set_allocator(rmm_cupy_allocator)
    _rmm_pool_size = size
    return True
