"""What kind of array an estimator's input is: numpy, scipy.sparse, cupy or
cupyx sparse, and the array module to compute on it with.

The estimators' door to ``dask_ps._backend`` (numpy/cupy helpers), which
they do not import themselves.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dask_ps._backend import all_finite, device_module, is_cupy, namespace, to_numpy

__all__ = ["all_finite", "device_module", "is_cupy", "namespace", "to_numpy", "is_cupy_sparse", "is_sparse",
           "xp_of", "nbytes", "to_host", "check_device_X"]


def is_cupy_sparse(X) -> bool:
    return type(X).__module__.startswith("cupyx.scipy.sparse")


def is_sparse(X) -> bool:
    """scipy.sparse or cupyx sparse."""
    return sp.issparse(X) or is_cupy_sparse(X)


def xp_of(X):
    """The array module (numpy or cupy) to compute on ``X`` with."""
    if sp.issparse(X):
        return np
    if is_cupy_sparse(X):
        return device_module()
    return namespace(X)


def nbytes(X) -> int:
    """Bytes of an array or of a scipy.sparse matrix's arrays."""
    if sp.issparse(X):
        return X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
    return getattr(X, "nbytes", 0)


def check_device_X(X, estimator, dtypes=(np.float64, np.float32)):
    """scikit-learn's ``check_array`` of a dense device (cupy) array, done on
    the device: scikit-learn's own converts to numpy, which cupy refuses.
    2-D, at least one sample and one feature, a dtype of ``dtypes`` (else
    cast to the first), C order, finite; the same messages."""
    name = type(estimator).__name__
    if X.ndim != 2:
        raise ValueError(
            f"Expected 2D array, got {X.ndim}D array instead. Reshape your data either using "
            "array.reshape(-1, 1) if your data has a single feature or array.reshape(1, -1) if it "
            "contains a single sample."
        )
    for axis, what in ((0, "sample"), (1, "feature")):
        if X.shape[axis] < 1:
            raise ValueError(
                f"Found array with {X.shape[axis]} {what}(s) (shape={tuple(X.shape)}) while a minimum of 1 "
                f"is required by {name}."
            )
    xp = namespace(X)
    if X.dtype not in [np.dtype(d) for d in dtypes]:
        X = X.astype(dtypes[0])
    X = xp.ascontiguousarray(X)
    if not all_finite(X):
        if bool(xp.isnan(X).any()):
            raise ValueError(f"Input X contains NaN. {name} does not accept missing values encoded as NaN.")
        raise ValueError(f"Input X contains infinity or a value too large for {X.dtype!r}.")
    return X


def to_host(X):
    """cupy / cupyx.scipy.sparse -> numpy / scipy.sparse; others as they are."""
    if is_cupy(X) or is_cupy_sparse(X):
        return X.get()
    return X
