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
