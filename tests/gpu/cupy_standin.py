"""A CPU stand-in for cupy: the device path of dask_ps in the default test run.

No GPU is needed to run the ``device="cuda"`` code: this module is a thin
cupy-like test double that ``dask_ps._backend`` takes in place of cupy
(``_backend.set_device_module(cupy_standin)``; the ``standin`` fixture of
``tests/gpu/conftest.py`` does it and undoes it). Its arrays live in host
memory, but they behave like cupy's where it matters for correctness:

* a separate array type (``cupy_standin.ndarray`` is no ``numpy.ndarray``);
* implicit conversion to numpy raises ``TypeError`` (``numpy.asarray(x)``,
  ``x.__array__()``), with cupy's message;
* mixing with numpy array operands raises ``TypeError`` (``x + host``,
  ``host += x``, ``x[rows] += host``, ``cupy_standin.concatenate([x, host])``)
  as cupy does; Python and numpy scalars mix as in cupy, and numpy integer
  arrays may index (cupy copies them to the device);
* host copies only through an explicit call: ``x.get()``, ``asnumpy(x)``
  (device -> host) and ``asarray(host)``/``array(host)``/``x.set(host)``
  (host -> device); ``transfers`` counts them (bytes and calls) so tests can
  say what crossed;
* what cupy lacks, the stand-in lacks: ``x.flags`` has no ``writeable``;
  ``add.at`` takes only the dtypes cupy's does (int32, int64, float16,
  float32, float64, uint32, uint64); a basic-slice assignment of a host
  array raises ``ValueError`` as in cupy;
* numpy functions called on stand-in arrays dispatch to the stand-in
  (``__array_function__``/``__array_ufunc__``), as cupy's do;
* ``cuda.runtime.getDeviceCount``/``memGetInfo``, ``cuda.Device`` and
  ``cuda.set_allocator`` answer for one fake GPU whose free memory tests set
  (``GPU``), so ``_backend.gpu_info`` and the placement checks run.

Not covered: kernels (``ElementwiseKernel``, ``RawKernel``), streams,
``cupyx.scipy.sparse`` inputs, real device memory limits, Dask's cupy
serializer (in-process clusters pass arrays without serializing them) and
speed. Those need a GPU: ``tests/gpu/test_gpu.py`` (``pytest -m gpu``).

Why not ``array-api-strict``: it is strict about the array API standard,
which the device code does not limit itself to (it uses cupy's numpy-like
API: integer-array assignment, ``add.at``, ``bincount``,
``random.RandomState``); it would fail code that runs on cupy, and it has no
``get``/``asnumpy``. This double refuses what cupy refuses instead.
"""

from __future__ import annotations

import sys
import types

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
            "array explicitly.")

# The fake GPU (``cuda.runtime.memGetInfo``, ``cuda.Device().pci_bus_id``); tests change ``free``.
GPU = {"device": "0000:5a:00.0", "free": 16 * 2**30, "total": 16 * 2**30, "count": 1}

# Host <-> device copies made through explicit calls (and the implicit ones
# cupy makes: numpy index arrays and values of integer-array assignments).
transfers = {"h2d_bytes": 0, "h2d_calls": 0, "d2h_bytes": 0, "d2h_calls": 0}


def reset_transfers() -> None:
    for k in transfers:
        transfers[k] = 0


def _h2d(a: np.ndarray) -> None:
    transfers["h2d_bytes"] += int(a.nbytes)
    transfers["h2d_calls"] += 1


def _d2h(a: np.ndarray) -> None:
    transfers["d2h_bytes"] += int(a.nbytes)
    transfers["d2h_calls"] += 1


def _refuse_host(x):
    raise TypeError(f"Unsupported type {type(x)}")  # cupy's message for a numpy operand


def _unwrap(x):
    """Stand-in arrays -> their host buffer; a numpy array operand raises as in cupy."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        _refuse_host(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    return x


def _unwrap_index(key):
    """An index: numpy integer/boolean arrays are allowed (cupy copies them to the device)."""
    if isinstance(key, ndarray):
        return key._a
    if isinstance(key, np.ndarray):
        _h2d(key)
        return key
    if isinstance(key, tuple):
        return tuple(_unwrap_index(k) for k in key)
    return key


def _has_array_index(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (ndarray, np.ndarray, list)) for k in keys)


def _wrap(r):
    if isinstance(r, np.ndarray):
        return ndarray(r)
    if isinstance(r, np.generic):  # cupy returns 0-d arrays, not numpy scalars
        return ndarray(np.asarray(r))
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    if isinstance(r, list):
        return [_wrap(v) for v in r]
    return r


def _call(fn, args, kwargs):
    return _wrap(fn(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))


class Flags:
    """cupy's ``ndarray.flags``: contiguity and ownership, no ``writeable``."""

    def __init__(self, a: np.ndarray):
        self.c_contiguous = a.flags.c_contiguous
        self.f_contiguous = a.flags.f_contiguous
        self.owndata = a.flags.owndata

    def __getitem__(self, name):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous, "OWNDATA": self.owndata}[name]


# cupy.ndarray's methods (cupy/_core/core.pyx); the stand-in offers no others.
_METHODS = frozenset("""
all any argmax argmin argpartition argsort astype byteswap choose clip compress conj conjugate copy cumprod cumsum
diagonal dot fill flatten item max mean min nonzero partition prod ptp put ravel repeat reshape round searchsorted
sort squeeze std sum swapaxes take tolist trace transpose var view
""".split())


class ndarray(NDArrayOperatorsMixin):  # noqa: N801 - cupy's name
    """An array "on the device": a numpy buffer that refuses implicit host use."""

    __slots__ = ("_a",)

    def __init__(self, a):
        if not isinstance(a, np.ndarray):
            raise TypeError("cupy_standin.ndarray wraps a numpy array; use cupy_standin.asarray")
        self._a = a

    # --- what cupy refuses --------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(IMPLICIT)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o) for o in out)
        compare = ufunc.__name__ in ("greater", "greater_equal", "less", "less_equal", "equal", "not_equal")
        args = []
        for x in inputs:
            if isinstance(x, ndarray):
                args.append(x._a)
            elif isinstance(x, np.ndarray):
                if compare and x.ndim == 0:
                    args.append(x.item())  # cupy's workaround (numpy/numpy#12142)
                elif method == "at" and x is not inputs[0]:
                    _h2d(x)  # cupy.add.at copies host indices and values to the device
                    args.append(x)
                else:
                    _refuse_host(x)
            elif isinstance(x, (bool, int, float, complex, np.generic)):
                args.append(x)
            else:
                return NotImplemented
        if method == "at":
            _check_scatter_dtype(ufunc, inputs[0])
            getattr(ufunc, method)(*args, **kwargs)
            return None
        r = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(r)

    def __array_function__(self, func, types_, args, kwargs):
        for t in types_:
            if not issubclass(t, (ndarray, np.ndarray)):
                return NotImplemented
        mine = getattr(_module_for(func), func.__name__, None)
        if mine is None:
            return NotImplemented
        return mine(*args, **kwargs)

    # --- explicit host copies -------------------------------------------------------------
    def get(self, stream=None, order="C", out=None, blocking=True):
        host = np.array(self._a, order=order)
        _d2h(host)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray) or arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError("set: a numpy array of the same shape and dtype is required")
        _h2d(arr)
        self._a[...] = arr

    # --- container protocol -----------------------------------------------------------------
    def __getitem__(self, key):
        return _wrap(self._a[_unwrap_index(key)])

    def __setitem__(self, key, value):
        if isinstance(value, ndarray):
            value = value._a
        elif isinstance(value, np.ndarray) and value.ndim > 0:
            if not _has_array_index(key):  # cupy: "fill" with a host array
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            _h2d(value)  # an integer-array assignment copies host values (cupy does)
        self._a[_unwrap_index(key)] = value

    def __len__(self):
        if self._a.ndim == 0:
            raise TypeError("len() of unsized object")
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self._a)))

    # --- scalars out (cupy synchronizes and copies one value) -------------------------------
    def __bool__(self):
        return bool(self._a)

    def __float__(self):
        return float(self._a)

    def __int__(self):
        return int(self._a)

    def __index__(self):
        return self._a.__index__()

    def __complex__(self):
        return complex(self._a)

    def __repr__(self):
        return "standin." + repr(self._a)

    __hash__ = None

    def __reduce__(self):
        return _from_host, (self._a,)

    def __copy__(self):
        return ndarray(self._a.copy())

    def __deepcopy__(self, memo):
        return ndarray(self._a.copy())

    # --- attributes ---------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    T = property(lambda self: ndarray(self._a.T))
    mT = property(lambda self: ndarray(self._a.mT))
    real = property(lambda self: ndarray(self._a.real))
    imag = property(lambda self: ndarray(self._a.imag))
    flags = property(lambda self: Flags(self._a))
    device = property(lambda self: cuda.Device())

    def __getattr__(self, name):
        if name in _METHODS:
            method = getattr(self._a, name)
            return lambda *args, **kwargs: _call(method, args, kwargs)
        raise AttributeError(f"'cupy_standin.ndarray' object has no attribute {name!r}")


def _from_host(a):
    return ndarray(a)


def _check_scatter_dtype(ufunc, target) -> None:
    if ufunc is np.add and isinstance(target, ndarray):
        if target.dtype.type not in (np.int32, np.int64, np.float16, np.float32, np.float64, np.uint32, np.uint64):
            raise TypeError("cupy.add.at only supports int32, int64, float16, float32, float64, uint32, uint64 "
                            "as data type")


# --- the module's functions -------------------------------------------------------------------


def asarray(a, dtype=None, order=None, *, blocking=False):
    """Host data -> device (a counted copy); a stand-in array as it is (cast if asked)."""
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == np.dtype(dtype) else ndarray(a._a.astype(dtype))
    host = np.asarray(a, dtype=dtype, order=order)
    if isinstance(a, np.ndarray):
        _h2d(host)
    return ndarray(np.array(host, copy=True))


def array(obj, dtype=None, copy=True, order="K", ndmin=0, *, blocking=False):
    if isinstance(obj, ndarray):
        return ndarray(np.array(obj._a, dtype=dtype, copy=copy, order=order, ndmin=ndmin))
    host = np.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin)
    if isinstance(obj, np.ndarray):
        _h2d(host)
    return ndarray(host)


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """Device -> host (a counted copy); anything else through numpy.asarray."""
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return np.asarray(a, order=order)


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


class _Ufunc:
    """A cupy ufunc: called on stand-in arrays; ``at`` with cupy's dtype limits."""

    def __init__(self, ufunc):
        self._u = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, **kwargs):
        out = kwargs.get("out")
        r = _call(self._u, args, kwargs)
        return out if out is not None else r

    def at(self, a, indices, b=None):
        if not isinstance(a, ndarray):
            raise TypeError(f"Unsupported type {type(a)}")
        _check_scatter_dtype(self._u, a)
        if isinstance(b, np.ndarray):
            _h2d(b)  # cupy copies host values to the device here
            vb = b
        else:
            vb = _unwrap(b)
        self._u.at(a._a, _unwrap_index(indices), *(() if b is None else (vb,)))

    def reduce(self, array_, *args, **kwargs):
        return _call(self._u.reduce, (array_, *args), kwargs)

    def __repr__(self):
        return f"<standin ufunc {self.__name__!r}>"


class _RandomState:
    """cupy.random.RandomState: numpy's generator, results on the device."""

    def __init__(self, seed=None):
        self._rs = np.random.RandomState(seed)

    def __getattr__(self, name):
        fn = getattr(self._rs, name)
        return lambda *args, **kwargs: _call(fn, args, kwargs)


random = types.SimpleNamespace(RandomState=_RandomState, seed=np.random.seed,
                               default_rng=lambda seed=None: _Generator(seed))


class _Generator:
    def __init__(self, seed=None):
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        fn = getattr(self._g, name)
        return lambda *args, **kwargs: _call(fn, args, kwargs)


class _Device:
    def __init__(self, device=None):
        self.id = 0 if device is None else int(device)

    @property
    def pci_bus_id(self):
        return GPU["device"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


_allocator = [None]


def _set_allocator(allocator=None):
    _allocator[0] = allocator


cuda = types.SimpleNamespace(
    runtime=types.SimpleNamespace(getDeviceCount=lambda: GPU["count"],
                                  memGetInfo=lambda: (GPU["free"], GPU["total"])),
    Device=_Device,
    set_allocator=_set_allocator,
    get_allocator=lambda: _allocator[0],
    is_available=lambda: GPU["count"] > 0,
)


def _module_for(func):
    """The stand-in (sub)module that implements numpy function ``func``."""
    mod = getattr(func, "__module__", "") or ""
    if mod.startswith("numpy.linalg"):
        return linalg
    return sys.modules[__name__]


linalg = types.SimpleNamespace(norm=lambda *a, **k: _call(np.linalg.norm, a, k))

# Names that are not numpy functions (kept out of the forwarding below).
_NOT_FORWARDED = frozenset({"errstate", "seterr", "geterr", "load", "save", "savez", "loadtxt", "savetxt",
                            "frombuffer", "fromfile", "ctypeslib", "memmap", "lib", "ma", "testing",
                            "asarray_chkfinite", "asanyarray", "asfortranarray"})


def __getattr__(name):
    """Every other numpy function, as cupy has it: stand-in arrays in and out,
    numpy array operands refused; dtypes and scalar types as numpy's."""
    if name.startswith("__") or name in _NOT_FORWARDED:
        raise AttributeError(name)
    obj = getattr(np, name)
    if isinstance(obj, np.ufunc):
        return _Ufunc(obj)
    if isinstance(obj, type) or isinstance(obj, np.dtype) or not callable(obj):
        return obj  # dtypes (float64 ...), scalar types, constants (pi, inf, newaxis)
    return lambda *args, **kwargs: _call(obj, args, kwargs)


def ascontiguousarray(a, dtype=None):
    if not isinstance(a, ndarray):
        _refuse_host(a)
    return ndarray(np.ascontiguousarray(a._a, dtype=dtype))


def _register_dask_sizeof() -> None:
    try:
        from dask.sizeof import sizeof
    except ImportError:  # pragma: no cover
        return
    sizeof.register(ndarray)(lambda x: int(x.nbytes))


_register_dask_sizeof()
