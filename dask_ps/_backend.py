"""Array-backend helpers: the same code runs on numpy and cupy arrays.

Storage and update code calls :func:`namespace` on its arrays and uses only
functions that numpy and cupy share, so a ``device="cuda"`` table runs the
same code on the GPU.
"""

from __future__ import annotations

import numpy as np

try:  # cupy is an optional extra (``pip install dask-ps[cuda]``)
    import cupy  # type: ignore[import-not-found]
except Exception:  # pragma: no cover - depends on the machine
    cupy = None


DEVICES = ("cpu", "cuda")


def is_cupy(x) -> bool:
    return cupy is not None and isinstance(x, cupy.ndarray)


def namespace(*arrays):
    """The array module (numpy or cupy) of ``arrays``."""
    for a in arrays:
        if is_cupy(a):
            return cupy
    return np


def is_array(x) -> bool:
    return isinstance(x, np.ndarray) or is_cupy(x)


def zeros(shape, dtype, device: str):
    if device == "cuda":
        if cupy is None:
            raise RuntimeError("device='cuda' needs cupy on the worker (pip install dask-ps[cuda])")
        return cupy.zeros(shape, dtype=dtype)
    return np.zeros(shape, dtype=dtype)


def gpu_info() -> dict | None:
    """This process's current GPU: ``{"device": PCI bus id, "free": bytes,
    "total": bytes}``, or None without cupy or a usable device (the table
    placement check uses it for ``device="cuda"`` and ``"auto"``)."""
    if cupy is None:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        dev = cupy.cuda.Device()
        free, total = cupy.cuda.runtime.memGetInfo()
        return {"device": str(dev.pci_bus_id), "free": int(free), "total": int(total)}
    except Exception:  # pragma: no cover - no driver, or a broken one
        return None


def to_device(x, device: str):
    """Move ``x`` to ``device`` ("cpu" -> numpy, "cuda" -> cupy); no copy if already there."""
    if device == "cuda":
        if is_cupy(x):
            return x
        if cupy is None:
            raise RuntimeError("device='cuda' needs cupy on the worker")
        return cupy.asarray(x)
    if is_cupy(x):
        return cupy.asnumpy(x)
    return x


def read_only(x):
    """A view of ``x`` that cannot be written through (numpy); a cupy array
    as it is (cupy has no read-only flag). Replies that share a server's
    stored block (an in-process cluster passes them without a copy) are
    handed out this way, so a reader cannot change the server's values."""
    if isinstance(x, np.ndarray):
        v = x.view()
        v.flags.writeable = False
        return v
    return x


def writable(x):
    """``x`` itself if it may be written in place, else a copy."""
    flags = getattr(x, "flags", None)
    if flags is not None and not flags.writeable:
        return x.copy()
    return x


def to_numpy(x):
    return cupy.asnumpy(x) if is_cupy(x) else np.asarray(x)


def all_finite(x) -> bool:
    """True when ``x`` has no NaN or Inf.

    The sum is one cheap pass and is non-finite whenever an element is; only
    when it is (an element is non-finite, or the sum overflowed) do we pay
    for the element-wise check.
    """
    xp = namespace(x)
    if x.size == 0 or x.dtype.kind not in "fc":
        return True
    if x.size <= 4096:  # small: the direct check is cheaper than errstate
        return bool(xp.isfinite(x).all())
    with np.errstate(over="ignore", invalid="ignore"):
        s = xp.sum(x)
    if bool(xp.isfinite(s)):
        return True
    return bool(xp.all(xp.isfinite(x)))


def scatter_add(out, idx, vals) -> None:
    """``out[idx] += vals`` with repeated indices accumulated."""
    if is_cupy(out):
        import cupyx  # type: ignore[import-not-found]

        cupyx.scatter_add(out, idx, vals)
    else:
        np.add.at(out, idx, vals)
