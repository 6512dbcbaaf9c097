"""The corpus of an LDA fit: document-term counts checked, split into
partitions, and turned into the token arrays a Gibbs participant samples."""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import DataConversionWarning
from sklearn.utils.validation import check_array, check_non_negative

from dask_ps._estimators import InvalidPart, arrays


# The rule for counts given as floats, in one place: what the docstrings,
# the warning and the tests say.
ROUNDING_RULE = "rounded to the nearest integer (numpy.rint, halves to even)"


# The largest count of a word in a document: the sampler keeps one topic per
# token and its counts as int32. 1e20 wrapped to a negative int64 and failed
# deep in ``np.repeat``; 3e9 asked for 12 GB of token arrays.
MAX_COUNT = 2**31 - 1


def _check_counts(X, whom: str):
    """Non-negative numbers (NaN/Inf are caught earlier by ``validate_data``),
    each at most ``MAX_COUNT``."""
    data = X.data if sp.issparse(X) else np.asarray(X)
    if data.dtype.kind not in "biuf":
        raise ValueError(f"{whom}: X must be numeric counts, got dtype {data.dtype}")
    if data.size:  # an empty block (a filtered dask collection's) has nothing to check
        check_non_negative(X, whom)
    if data.size and data.dtype.itemsize >= 4 and data.max() > MAX_COUNT:
        if sp.issparse(X):  # only on the error's path: where the count is
            coo = X.tocoo()
            i = int(np.argmax(coo.data))
            where = (coo.row[i], coo.col[i])
        else:
            where = np.unravel_index(int(np.argmax(data)), data.shape)
        at = f" at (row, column) {tuple(int(i) for i in where)}"
        raise ValueError(
            f"{whom}: X holds a count of {data.max():g}{at}; collapsed Gibbs sampling keeps one topic per "
            f"token, so a word's count in a document can be at most {MAX_COUNT} (2**31 - 1). Pass "
            "document-term counts (scale tf-idf or other weights down to counts first)."
        )


def _as_count_csr(X) -> tuple[sp.csr_matrix, bool]:
    """A private int64 CSR copy of checked counts, with duplicates summed,
    floats rounded (``ROUNDING_RULE``) and zeros removed; and whether the
    rounding changed a value."""
    X = sp.csr_matrix(X, copy=True)
    X.sum_duplicates()
    rounded = False
    if X.data.dtype.kind == "f":
        whole = np.rint(X.data)
        rounded = bool(np.any(whole != X.data))
        X.data = whole
    X.eliminate_zeros()
    if X.data.dtype != np.int64:
        X = sp.csr_matrix((X.data.astype(np.int64), X.indices, X.indptr), shape=X.shape)
    return X, rounded


def warn_rounded(whom: str) -> None:
    """The warning for counts that were not whole numbers."""
    warnings.warn(
        f"{whom}: X holds non-integer values; collapsed Gibbs sampling counts tokens, so each count was "
        f"{ROUNDING_RULE} (values below 0.5 count as 0). Pass document-term counts to silence this.",
        DataConversionWarning, stacklevel=3,
    )


def count_matrix(X, whom: str) -> sp.csr_matrix:
    """Checked counts as a private int64 CSR matrix (``_as_count_csr``),
    warning (``DataConversionWarning``) when floats had to be rounded."""
    _check_counts(X, whom)
    X, rounded = _as_count_csr(X)
    if rounded:
        warn_rounded(whom)
    return X


def _prepare_part(block, n_features: int, check: bool):
    """One partition of the corpus as token arrays (runs on the worker that holds it).

    Returns ``vocab`` (global ids of the words it holds, sorted), ``words``
    (local word id per token, grouped by document) and ``doc_ptr``
    (token offsets of each document; empty documents have empty ranges).
    A chunk of a dask array that fails scikit-learn's checks (``check``)
    gives an ``InvalidPart`` instead: the client raises its error (no
    failed task, no worker traceback; issue 24).
    """
    block = arrays.to_host(block)
    if check:
        try:
            _check_chunk(block, n_features)
        except (ValueError, TypeError) as e:
            return InvalidPart(e, (block.shape[0],) * 2 + (None,))
    X, rounded = _as_count_csr(block)
    vocab, local = np.unique(X.indices, return_inverse=True)
    words = np.repeat(local.astype(np.int32), X.data)
    doc_len = np.asarray(X.sum(axis=1)).ravel().astype(np.int64)
    doc_ptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(doc_len, out=doc_ptr[1:])
    # ``rounded``: whether floats were rounded (the client warns: a warning on a worker is lost)
    return {"vocab": vocab.astype(np.int64), "words": words, "doc_ptr": doc_ptr, "rounded": rounded}


def _check_chunk(block, n_features: int) -> None:
    """A chunk of a dask array checked as scikit-learn's LDA checks ``X``
    (its messages: ``check_array``, ``check_non_negative``)."""
    if not sp.issparse(block):
        block = np.asarray(block)
        if block.ndim != 2:
            raise ValueError(f"LatentDirichletAllocation.fit: chunks must be 2-D, got shape {block.shape}")
    if block.shape[1] != n_features:
        raise ValueError(
            f"LatentDirichletAllocation.fit: a chunk has {block.shape[1]} columns, expected {n_features}"
        )
    check_array(block, accept_sparse=True, dtype=None, ensure_min_samples=0, input_name="X",
                estimator="LatentDirichletAllocation")
    _check_counts(block, "LatentDirichletAllocation.fit")


def _part_stats(part):
    if isinstance(part, InvalidPart):
        return part
    return part["doc_ptr"].size - 1, int(part["words"].size), part["vocab"], part.get("rounded", False)


def _split_rows(X: sp.csr_matrix, n_parts: int) -> list[sp.csr_matrix]:
    """Contiguous row ranges with about the same number of tokens each."""
    return [piece for _, piece in _split_rows_at(X, n_parts)]


def _prepare_rows(piece, n_features: int):
    """``_prepare_part`` of a ``(first row, rows)`` piece of an in-memory
    matrix: the part also says where its rows are (``row0``), so that it can
    return the assignments of given rows (``_kept``)."""
    row0, block = piece
    part = _prepare_part(block, n_features, check=False)
    part["row0"] = int(row0)
    return part


def _split_rows_at(X: sp.csr_matrix, n_parts: int) -> list[tuple[int, sp.csr_matrix]]:
    """``(first row, rows)`` of contiguous row ranges with about the same number of tokens each."""
    doc_len = np.asarray(X.sum(axis=1)).ravel()
    cum = np.cumsum(doc_len)
    total = cum[-1] if cum.size else 0
    cuts = np.searchsorted(cum, total * np.arange(1, n_parts) / n_parts, side="left") + 1
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 0, X.shape[0]), [X.shape[0]]]))
    return [(int(a), X[a:b]) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
