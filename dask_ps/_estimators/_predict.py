"""Prediction and transform on dask collections, what kind of input X is,
and the checks of dask inputs to ``fit``.

A fitted estimator is a plain object; on a dask collection its
``predict``/``transform`` maps a pure function of one block over the row
blocks, lazily (:func:`map_row_blocks`), after :func:`check_dask_X` checked
the collection as scikit-learn checks an array.

A dask input to ``fit`` gets scikit-learn's own messages for what its
shapes and metadata tell without computing anything
(:func:`check_dask_fit_input`: inconsistent lengths, no samples or
features, a 2-D ``y``, a complex or string dtype), and the same message for
an input found empty once computed (:func:`raise_no_samples`). The
messages are made by scikit-learn's checks run on empty stand-in arrays of
the same shape, so they stay scikit-learn's. What only the values tell
(NaN, lengths of unknown chunks) is checked by the tasks that assemble the
parts, which return an :class:`InvalidPart` instead of failing; the caller
raises its error (:func:`raise_invalid_parts`), with totals for lengths.
"""

from __future__ import annotations

import math

import dask
import numpy as np
from sklearn.utils.validation import (
    _check_feature_names,
    _check_n_features,
    _check_sample_weight,
    check_array,
    check_consistent_length,
    check_is_fitted,
)


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
    """scikit-learn's ``feature_names_in_`` check of a dask collection, run
    on its metadata: a dask DataFrame's is an empty pandas DataFrame with
    its columns, so the names are set at fit (``reset``) and checked after
    exactly as scikit-learn does for pandas (its messages and warnings; no
    warning when predicting on the frame the model was fitted on); a dask
    array has no names."""
    meta = dask_meta(X) if is_dask_dataframe(X) else None
    _check_feature_names(est, meta if meta is not None else np.empty((0, 0)), reset=reset)


def _check_features(est, X, reset: bool) -> None:
    """scikit-learn's checks of a dask collection's number of features and
    feature names (``validate_data(..., skip_check_array=True)`` reads
    neither from a dask DataFrame: it warned that the frame a model was
    fitted on had no valid feature names)."""
    dask_feature_names(est, X, reset)
    _check_n_features(est, X, reset=reset)


def check_dask_X(est, X):
    """A dask collection to predict on, checked against the fitted ``est``
    (fitted, number of features and their names, 2-D); returns a dask array
    with one block per row chunk."""
    check_is_fitted(est)
    _check_features(est, X, reset=False)
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


# --- dask inputs to fit --------------------------------------------------------------------


def known_n_samples(X) -> int | None:
    """The rows of ``X`` when they are known without computing anything: a
    dask array with known chunks, or an in-memory array; else None (a dask
    DataFrame, a dask array of unknown chunk sizes)."""
    if X is None:
        return None
    if is_dask_collection(X):
        if not hasattr(X, "chunks") or not getattr(X, "ndim", 0):
            return None
        n = X.shape[0]
        return None if isinstance(n, float) and math.isnan(n) else int(n)
    shape = getattr(X, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else len(X)


class InvalidPart:
    """What a task that checks a part of the user's data returns when the
    data fails scikit-learn's checks: the error as a value (``stage``: the
    input it is about, in scikit-learn's order: 0 X, 1 y, 2
    sample_weight) and the part's lengths ``(X, y, sample_weight or
    None)``. The caller raises it (:func:`raise_invalid_parts`): a user's
    error is not a failed task, so no worker traceback and no Dask
    "Compute Failed" log come with it, and lengths are reported as totals
    over all the parts, not one part's (issue 24)."""

    def __init__(self, error: BaseException | None, lengths, stage: int = 0):
        self.error, self.lengths, self.stage = error, tuple(lengths), stage

    def __repr__(self):
        return f"<InvalidPart lengths={self.lengths} error={self.error!r}>"


def raise_invalid_parts(est, verdicts) -> None:
    """Raise scikit-learn's error for the parts' ``verdicts`` (an
    :class:`InvalidPart`, or a valid part's lengths ``(X, y, sample_weight
    or None)``), in scikit-learn's order: the first error about X, then y;
    then X and y of different total lengths; then sample_weight. Returns
    when every part is valid."""
    invalid = [v for v in verdicts if isinstance(v, InvalidPart)]
    if not invalid:
        return
    errors = sorted((v.stage, i, v.error) for i, v in enumerate(invalid) if v.error is not None)
    if errors and errors[0][0] < 2:
        raise errors[0][2]
    lengths = [v.lengths if isinstance(v, InvalidPart) else tuple(v) for v in verdicts]
    n_x, n_y = sum(n[0] for n in lengths), sum(n[1] for n in lengths)
    if n_x != n_y:
        check_consistent_length(np.empty((n_x, 0)), np.empty((n_y, 0)))
    if errors:
        raise errors[0][2]
    n_sw = sum(n[2] or 0 for n in lengths)
    if any(n[2] is not None for n in lengths) and n_sw != n_x:
        _check_sample_weight(np.ones(n_sw), np.empty((n_x, 0)))
    # The totals match, the blocks do not: a dask DataFrame and a y (or
    # weights) partitioned otherwise, with as many partitions.
    what = "sample_weight" if all(n[0] == n[1] for n in lengths) else "y"
    col = 2 if what == "sample_weight" else 1
    raise ValueError(
        f"X and {what} have the same number of rows ({n_x}) but their blocks do not line up (rows per block "
        f"group of X: {[n[0] for n in lengths]}, of {what}: {[n[col] for n in lengths]}): give them the same "
        "row partitions (dask arrays: the same chunks; dask DataFrames: the same divisions, e.g. "
        f"{what}.repartition(divisions=X.divisions))"
    )


def check_meta(est, X, input_name="X") -> None:
    """scikit-learn's check of the dtype of a dask collection's blocks, run
    on its metadata (an empty block of the same kind and dtype) in the
    caller's process: complex values, strings. Skipped for blocks other
    than numpy, scipy.sparse or pandas (cupy)."""
    meta = dask_meta(X)
    if meta is None or getattr(meta, "ndim", 2) != 2:
        return
    module = type(meta).__module__.split(".")[0]
    if module not in ("numpy", "scipy", "pandas"):
        return
    check_array(meta, accept_sparse=True, dtype=[np.float64, np.float32], ensure_min_samples=0,
                ensure_min_features=0, estimator=est, input_name=input_name, ensure_all_finite=False)


def raise_no_samples(est, n_features: int):
    """scikit-learn's error for an input without samples (``X`` found empty)."""
    check_array(np.empty((0, max(int(n_features), 1))), estimator=est, ensure_all_finite=False)
    raise AssertionError("check_array accepted an empty array")  # pragma: no cover


def check_dask_fit_input(est, X, y, sample_weight=None, n_features=None) -> None:
    """What scikit-learn checks on ``fit(X, y, sample_weight)`` that the
    shapes of dask collections tell without computing anything, with
    scikit-learn's messages: no samples or no features in ``X``, ``y`` not
    1-D, ``X``, ``y`` and ``sample_weight`` of different lengths.

    The blocks' dtype is checked on the collection's metadata
    (:func:`check_meta`). Unknown lengths (dask DataFrames) and values (NaN)
    are checked where the data is assembled, and come back as
    :class:`InvalidPart` values that :func:`raise_invalid_parts` raises in
    the caller; an input found empty raises :func:`raise_no_samples`.
    """
    check_meta(est, X)
    n = known_n_samples(X)
    if n == 0:
        raise_no_samples(est, n_features or 1)
    if n_features == 0:
        check_array(np.empty((n or 1, 0)), estimator=est, ensure_all_finite=False)
    if y is not None and getattr(y, "ndim", 1) == 2 and y.shape[1] != 1:
        raise ValueError(f"y should be a 1d array, got an array of shape {tuple(y.shape)} instead.")
    n_y = known_n_samples(y)
    if n is not None and n_y is not None and n != n_y:
        check_consistent_length(np.empty((n, 0)), np.empty((n_y, 0)))
    n_sw = known_n_samples(sample_weight)
    if n is not None and n_sw is not None and n != n_sw:
        shape = tuple(int(v) for v in sample_weight.shape)
        _check_sample_weight(np.ones(shape), np.empty((n, 0)))
