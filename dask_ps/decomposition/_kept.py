"""The earlier documents ``partial_fit`` samples again (issue 35).

An incremental Gibbs sampler that never revisits a document keeps the
topics each was given when the model was young: ``partial_fit`` closed only
35-55% of the gap to a full fit. Canini, Shi and Griffiths ("Online
inference of topics with latent Dirichlet allocation", AISTATS 2009) call
the fix rejuvenation: resample some earlier documents with the new ones. A
fitted model keeps a uniform sample of the documents it was fitted on
(each document gets a random key when first seen; the documents of the
smallest keys are kept, up to ``ps.lda.partial-fit-kept-tokens`` tokens: a
bottom-k sample, so it stays uniform over all the calls), with their final
topic assignments. The next ``partial_fit`` takes their counts out of the
fitted counts, samples them again with its new documents, starting from
their kept assignments (the count tables start from the fitted counts
exactly, and their chain goes on), and keeps a new sample of both.

The assignments of one document are listed as a partition lists its tokens
(``_corpus._prepare_part``): its words in increasing column order, each
repeated by its count; so they do not depend on how the documents were
split.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp


@dataclasses.dataclass(eq=False)
class KeptDocuments:
    """Documents of a fitted model with their topic assignments."""

    X: sp.csr_matrix  # their counts (n_kept x V), canonical int64 CSR
    keys: np.ndarray  # each one's random key
    z: np.ndarray  # int32 assignments of their tokens, in document order

    def __repr__(self):
        return f"KeptDocuments({self.X.shape[0]} documents, {self.z.size} tokens)"

    @property
    def n_tokens(self) -> int:
        return int(self.z.size)

    def token_ptr(self) -> np.ndarray:
        """Each kept document's token offsets in ``z``."""
        ptr = np.zeros(self.X.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.asarray(self.X.sum(axis=1)).ravel(), out=ptr[1:])
        return ptr

    def counts(self, n_features: int, n_components: int) -> np.ndarray:
        """Their word-topic counts (V x K, int64): what they add to the model."""
        words = np.repeat(self.X.indices.astype(np.int64), self.X.data.astype(np.int64))
        flat = np.bincount(words * n_components + self.z, minlength=n_features * n_components)
        return flat.reshape(n_features, n_components)


def choose(keys: np.ndarray, doc_tokens: np.ndarray, budget: int) -> np.ndarray:
    """The documents (sorted row indices) of the smallest keys whose tokens
    fit in ``budget``; documents without tokens are never kept."""
    order = np.argsort(keys, kind="stable")
    order = order[doc_tokens[order] > 0]
    fits = np.cumsum(doc_tokens[order]) <= budget
    return np.sort(order[fits])


def kept_z(results) -> dict[int, np.ndarray]:
    """The assignments the participants returned (``_gibbs._finish``'s
    ``"kept"``), by row of the run's matrix."""
    out = {}
    for r in results:
        rows, ptr, z = r.get("kept", (np.empty(0, np.int64), np.zeros(1, np.int64), np.empty(0, np.int32)))
        for i, row in enumerate(rows):
            out[int(row)] = z[ptr[i]:ptr[i + 1]]
    return out


def collect(matrix: sp.csr_matrix, keys: np.ndarray, rows: np.ndarray, results) -> KeptDocuments | None:
    """The kept documents after a run: ``rows`` of the run's ``matrix``,
    their keys, and their final assignments from the participants."""
    if rows.size == 0:
        return None
    by_row = kept_z(results)
    missing = [int(r) for r in rows if int(r) not in by_row]
    if missing:  # a participant without its rows' offsets (cannot happen for an in-memory corpus)
        raise RuntimeError(f"LatentDirichletAllocation: no assignments came back for documents {missing[:5]}")
    return KeptDocuments(sp.csr_matrix(matrix[rows], dtype=np.int64), keys[rows].copy(),
                         np.concatenate([by_row[int(r)] for r in rows]).astype(np.int32))


def select_rows(row0, doc_ptr, z, keep_rows):
    """Participant side: of a partition whose first document is row
    ``row0`` of the run's matrix, the kept rows it holds, their token
    offsets and their assignments: ``(rows, ptr, z)``."""
    n_docs = doc_ptr.size - 1
    lo, hi = np.searchsorted(keep_rows, [row0, row0 + n_docs])
    rows = np.asarray(keep_rows[lo:hi], dtype=np.int64)
    local = rows - row0
    lengths = doc_ptr[local + 1] - doc_ptr[local]
    ptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    parts = [z[doc_ptr[d]:doc_ptr[d + 1]] for d in local]
    return rows, ptr, (np.concatenate(parts) if parts else np.empty(0, np.int32)).astype(np.int32)


def continue_kept(z, row0, doc_ptr, z_kept, kept_ptr) -> None:
    """Participant side: the starting assignments ``z`` of a partition
    whose first document is row ``row0``, with the kept documents among its
    rows (rows ``0 .. len(kept_ptr) - 2`` of the run's matrix) set to their
    kept assignments, so that their chain goes on."""
    n_kept = kept_ptr.size - 1
    m = min(doc_ptr.size - 1, n_kept - row0)
    if m <= 0:
        return
    src = z_kept[kept_ptr[row0]:kept_ptr[row0 + m]]
    if src.size != doc_ptr[m]:
        raise ValueError(f"LatentDirichletAllocation: kept assignments of rows {row0}..{row0 + m - 1} have "
                         f"{src.size} tokens, the documents {int(doc_ptr[m])}")
    z[:doc_ptr[m]] = src
