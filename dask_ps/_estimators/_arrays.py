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
           "xp_of", "nbytes", "to_host"]


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


def to_host(X):
    """cupy / cupyx.scipy.sparse -> numpy / scipy.sparse; others as they are."""
    if is_cupy(X) or is_cupy_sparse(X):
        return X.get()
    return X
