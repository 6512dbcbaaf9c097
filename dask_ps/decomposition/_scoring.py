"""Scores of LDA topics: the training log-likelihood assembled from the
participants' parts, and the held-out log-likelihood by document
completion (``document_completion``: fold-in on half of each document).
scikit-learn's ``score``/``perplexity``/``bound_`` are ``_bound``'s."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma
from sklearn.utils import check_random_state

from dask_ps.decomposition import _lda_kernels as _k
from dask_ps._estimators import arrays
from dask_ps.decomposition._corpus import count_matrix

# --- training log-likelihood (Griffiths & Steyvers' collapsed joint log p(w, z)) ------


def participant_loglik(ndk, doc_len, nwk, weights, nk, alpha, beta, vbeta, n_participants) -> float:
    """One participant's part of the training log-likelihood, on its own view:
    its documents, the word rows it holds (each weighed by 1 / number of
    holders) and 1 / P of the totals term. The parts sum to the exact value
    when every participant sees the same tables (BSP)."""
    return (
        _k.doc_loglik(ndk, doc_len, alpha)
        + _k.word_loglik_rows(nwk, weights, beta)
        + _k.totals_loglik(nk, vbeta) / n_participants
    )


def final_loglik(doc_logliks, nwk, nk, beta) -> float:
    """The exact training log-likelihood from the final tables and each
    participant's document term."""
    V = nwk.shape[0]
    return (
        sum(doc_logliks)
        + _k.word_loglik_rows(nwk, np.ones(V), beta)
        + _k.totals_loglik(nk, V * beta)
    )


def _chunk_history(results, P):
    """Intermediate evaluations of one chunk: the sum of the participants' parts."""
    by_iter: dict[int, list] = {}
    for r in results:
        for it, sec, ll in r["history"]:
            by_iter.setdefault(it, []).append((sec, ll))
    return [
        (it, max(s for s, _ in v), float(sum(ll for _, ll in v)))
        for it, v in sorted(by_iter.items()) if len(v) == P
    ]


# --- fold-in and document completion ------------------------------------------------


def _topic_word(components) -> np.ndarray:
    """Rows of ``components`` normalized to distributions, transposed to V x K."""
    comp = np.asarray(components, dtype=np.float64)
    return np.ascontiguousarray((comp / comp.sum(axis=1, keepdims=True)).T)


def _fold_in(phi_t, X: sp.csr_matrix, alpha, max_iter, tol, offset=0.0, scale=None) -> np.ndarray:
    """Fold-in (``_lda_kernels.fold_in``) of ``X``'s documents; the topics
    are ``(phi_t + offset) * scale`` (``scale`` None: ones, ``phi_t`` the
    distributions themselves)."""
    theta = np.empty((X.shape[0], phi_t.shape[1]))
    _k.fold_in(
        X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data.astype(np.float64),
        phi_t, float(offset), _scale(scale, phi_t), float(alpha), int(max_iter), float(tol), theta,
    )
    return theta


def _scale(scale, phi_t):
    return np.ones(phi_t.shape[1]) if scale is None else np.asarray(scale, dtype=np.float64)


def components_dtype(dtype):
    """``components_``'s dtype for input of ``dtype``: float32 stays float32
    (as scikit-learn's), anything else gives float64."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float32 else np.dtype(np.float64)


def document_completion(components, X, doc_topic_prior, *, max_iter=100, tol=0.0, random_state=0):
    """Held-out log-likelihood by document completion.

    The metric for comparing models (ours, scikit-learn's, the ``lda``
    package's, tomotopy's, gensim's) on documents they were not trained on:
    theta is fitted on one half of each document and the other half is
    scored, so no token is scored by a theta fitted on itself.
    ``LatentDirichletAllocation.score``, scikit-learn's counterpart, folds
    theta in on the whole of each document and scores the same tokens:
    larger, and a measure of fit rather than of prediction.

    Each token of every document of ``X`` goes to half A or B with
    probability 1/2 (a binomial split of each count, drawn from
    ``random_state``, so two models scored with the same seed see the same
    split); the document's topic proportions are fitted on A with the topics
    fixed (:func:`fold-in <LatentDirichletAllocation.transform>`: the EM
    fixed point with ``doc_topic_prior``, ``max_iter`` iterations, early stop
    when the mean absolute change falls below ``tol``), and B is scored:
    ``sum over tokens of B of log sum_k theta_dk phi_kw``.

    Parameters
    ----------
    components : array of shape (n_components, n_features)
        Topic-word pseudo-counts or probabilities of any model (rows are
        normalized here), e.g. ``LatentDirichletAllocation.components_``,
        scikit-learn's ``components_`` or the ``lda`` package's ``topic_word_``.
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
        Held-out document-term counts (non-negative; floats are rounded to
        the nearest integer with a ``DataConversionWarning``, as in
        ``LatentDirichletAllocation.fit``).
    doc_topic_prior : float
    max_iter : int, default 100
    tol : float, default 0.0
    random_state : int, RandomState or None, default 0

    Returns
    -------
    loglik : float
        Total log-likelihood of the B halves (nats).
    n_tokens : int
        Number of tokens in the B halves; ``loglik / n_tokens`` is the
        held-out log-likelihood per token (BASELINES.md's metric).
    """
    X = arrays.to_host(X)
    if not sp.issparse(X):
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {X.shape}")
    if X.shape[1] != np.shape(components)[1]:
        raise ValueError(
            f"X has {X.shape[1]} features, but the topics have {np.shape(components)[1]}"
        )
    if not np.all(np.isfinite(X.data if sp.issparse(X) else X)):
        raise ValueError("document_completion: Input X contains NaN or infinity.")
    X = count_matrix(X, "document_completion")
    rng = check_random_state(random_state)
    a = rng.binomial(X.data, 0.5)
    A = sp.csr_matrix((a.astype(np.float64), X.indices, X.indptr), shape=X.shape)
    B = sp.csr_matrix(((X.data - a).astype(np.float64), X.indices, X.indptr), shape=X.shape)
    B.eliminate_zeros()
    phi_t = _topic_word(components)
    theta = _fold_in(phi_t, A, doc_topic_prior, max_iter, tol)
    ll = _k.heldout_loglik(B.indptr.astype(np.int64), B.indices.astype(np.int64), B.data, phi_t, theta)
    return float(ll), int(B.data.sum())


def topic_word_components(nwk, beta, dtype):
    """``(components_, exp_dirichlet_component_)`` of the word-topic counts
    ``nwk`` (V x K): counts + beta, and scikit-learn's
    ``exp(E[log beta])``, in ``dtype``."""
    comp = nwk.T.astype(np.float64) + beta
    # digamma(count + beta) per count value (the same float64 inputs, so the same numbers): the
    # counts are small integers, and digamma over all V x K was most of this function's time.
    top = int(nwk.max()) if nwk.size else 0
    if nwk.size and nwk.min() >= 0 and top <= 1 << 20:
        log_beta = digamma(np.arange(top + 1, dtype=np.float64) + beta)[nwk.T]
    else:
        log_beta = digamma(comp)
    log_beta -= digamma(comp.sum(axis=1))[:, np.newaxis]
    return comp.astype(dtype, copy=False), np.exp(log_beta, out=log_beta).astype(dtype, copy=False)
