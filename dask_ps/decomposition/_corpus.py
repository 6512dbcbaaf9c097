"""The corpus of an LDA fit: document-term counts checked, split into
partitions, and turned into the token arrays a Gibbs participant samples."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_non_negative

from dask_ps._estimators import arrays


def _check_counts(X, whom: str, integer: bool = True):
    """Non-negative (and, with ``integer``, whole-number) counts; NaN/Inf are
    caught earlier by ``validate_data``."""
    check_non_negative(X, whom)
    if integer:
        data = X.data if sp.issparse(X) else np.asarray(X)
        if data.dtype.kind == "f" and data.size and not np.all(np.floor(data) == data):
            raise ValueError(
                f"{whom}: X must hold whole-number counts (document-term counts); "
                "got non-integer values. Round or scale them to counts first."
            )
        if data.dtype.kind == "b":
            return
        if data.dtype.kind not in "iuf":
            raise ValueError(f"{whom}: X must be numeric counts, got dtype {data.dtype}")


def _as_count_csr(X) -> sp.csr_matrix:
    """A private int64 CSR copy with duplicates summed and zeros removed."""
    X = sp.csr_matrix(X, copy=True)
    X.sum_duplicates()
    X.eliminate_zeros()
    if X.data.dtype != np.int64:
        X = sp.csr_matrix((X.data.astype(np.int64), X.indices, X.indptr), shape=X.shape)
    return X


def _prepare_part(block, n_features: int, check: bool):
    """One partition of the corpus as token arrays (runs on the worker that holds it).

    Returns ``vocab`` (global ids of the words it holds, sorted), ``words``
    (local word id per token, grouped by document) and ``doc_ptr``
    (token offsets of each document; empty documents have empty ranges).
    """
    block = arrays.to_host(block)
    if not sp.issparse(block):
        block = np.asarray(block)
        if block.ndim != 2:
            raise ValueError(f"LatentDirichletAllocation.fit: chunks must be 2-D, got shape {block.shape}")
    if block.shape[1] != n_features:
        raise ValueError(
            f"LatentDirichletAllocation.fit: a chunk has {block.shape[1]} columns, expected {n_features}"
        )
    if check:
        data = block.data if sp.issparse(block) else block
        if data.dtype.kind == "f" and not np.all(np.isfinite(data)):
            raise ValueError("LatentDirichletAllocation.fit: Input X contains NaN or infinity.")
        _check_counts(block, "LatentDirichletAllocation.fit")
    X = _as_count_csr(block)
    vocab, local = np.unique(X.indices, return_inverse=True)
    words = np.repeat(local.astype(np.int32), X.data)
    doc_len = np.asarray(X.sum(axis=1)).ravel().astype(np.int64)
    doc_ptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(doc_len, out=doc_ptr[1:])
    return {"vocab": vocab.astype(np.int64), "words": words, "doc_ptr": doc_ptr}


def _part_stats(part):
    return part["doc_ptr"].size - 1, int(part["words"].size), part["vocab"]


def _split_rows(X: sp.csr_matrix, n_parts: int) -> list[sp.csr_matrix]:
    """Contiguous row ranges with about the same number of tokens each."""
    doc_len = np.asarray(X.sum(axis=1)).ravel()
    cum = np.cumsum(doc_len)
    total = cum[-1] if cum.size else 0
    cuts = np.searchsorted(cum, total * np.arange(1, n_parts) / n_parts, side="left") + 1
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 0, X.shape[0]), [X.shape[0]]]))
    return [X[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
