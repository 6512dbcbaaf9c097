"""Prediction and transform on dask collections, and what kind of input X is.

A fitted estimator is a plain object; on a dask collection its
``predict``/``transform`` maps a pure function of one block over the row
blocks, lazily (:func:`map_row_blocks`), after :func:`check_dask_X` checked
the collection as scikit-learn checks an array.
"""

from __future__ import annotations

import dask
import numpy as np
from sklearn.utils.validation import check_is_fitted, validate_data


def is_dask_collection(X) -> bool:
    return dask.is_dask_collection(X)


def is_dask_dataframe(X) -> bool:
    return is_dask_collection(X) and hasattr(X, "columns") and hasattr(X, "npartitions")


def is_dask_array(X) -> bool:
    """A 2-D dask array."""
    return is_dask_collection(X) and hasattr(X, "chunks") and getattr(X, "ndim", 0) == 2


def dask_meta(X):
    """The kind of chunks a dask collection holds (numpy/scipy/cupy/pandas)."""
    return getattr(X, "_meta", None)


def dask_feature_names(est, X, reset: bool) -> None:
    """``feature_names_in_`` for a dask DataFrame (scikit-learn's check reads
    pandas/narwhals frames only): set at fit (``reset``), checked after."""
    names = None
    if is_dask_dataframe(X):
        cols = np.asarray(list(X.columns), dtype=object)
        if len(cols) and all(isinstance(c, str) for c in cols):
            names = cols
    if reset:
        if names is not None:
            est.feature_names_in_ = names
        elif hasattr(est, "feature_names_in_"):
            del est.feature_names_in_
        return
    fitted = getattr(est, "feature_names_in_", None)
    if fitted is not None and names is not None and not np.array_equal(fitted, names):
        raise ValueError(
            "The feature names should match those that were passed during fit.\n"
            f"Feature names seen at fit time: {list(fitted)}; now: {list(names)}"
        )


def check_dask_X(est, X):
    """A dask collection to predict on, checked against the fitted ``est``
    (fitted, number of features and their names, 2-D); returns a dask array
    with one block per row chunk."""
    check_is_fitted(est)
    validate_data(est, X=X, skip_check_array=True, reset=False)
    dask_feature_names(est, X, reset=False)
    if is_dask_dataframe(X):
        X = X.to_dask_array()
    if X.ndim != 2:
        raise ValueError(f"Expected 2D array, got {X.ndim}D array instead")
    if X.numblocks[1] > 1:
        X = X.rechunk({1: -1})
    return X


def map_row_blocks(X, fn, *args, n_columns=None, dtype, meta=None):
    """``fn(block, *args)`` over the row blocks of the dask array ``X``,
    lazily: a 1-D result (``n_columns`` None) or ``n_columns`` columns."""
    kw = {} if meta is None else {"meta": meta}
    if n_columns is None:
        return X.map_blocks(fn, *args, drop_axis=1, dtype=dtype, **kw)
    return X.map_blocks(fn, *args, chunks=(X.chunks[0], (n_columns,)), dtype=dtype, **kw)
