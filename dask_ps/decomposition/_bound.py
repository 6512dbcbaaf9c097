"""scikit-learn's variational bound of LDA, computed from topics: what
``LatentDirichletAllocation.score``, ``perplexity`` and ``bound_`` report.

scikit-learn's ``LatentDirichletAllocation.score(X)`` is
``_approx_bound(X, gamma)``, with ``gamma`` from its E-step on ``X``
(``_update_doc_distribution`` from the constant start, no random init) and
the topic-word Dirichlet parameters ``lambda = components_``:

    sum_d [ sum_w x_dw logsumexp_k(E[log theta_dk] + E[log beta_kw])
            + sum_k (alpha - gamma_dk) E[log theta_dk] + lgamma(gamma_dk) - lgamma(alpha)
            + lgamma(K alpha) - lgamma(sum_k gamma_dk) ]
    + sum_kw (eta - lambda_kw) E[log beta_kw] + lgamma(lambda_kw) - lgamma(eta)
    + sum_k lgamma(V eta) - lgamma(sum_w lambda_kw)

(``eta`` = topic_word_prior, ``E[log theta] = psi(gamma) - psi(sum gamma)``).
The first sum is a sum over documents, so a corpus in pieces (a dask
array's chunks, the fit's partitions) is scored piece by piece and the
topic term is added once. The kernels are compiled ports of
scikit-learn's (its ``psi``, AS 103, included), in float64: on the same
components and documents they give scikit-learn's number to ~1e-12
(float64 input; float32 input is scored by scikit-learn in float32, ~1e-6).

Everything here takes plain arrays (STYLE.md §2).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from dask_ps._estimators import njit

_EULER = 0.577215664901532860606512090082402431


@njit(nogil=True, cache=True)
def _psi(x):
    """scikit-learn's digamma (``_online_lda_fast.psi``, after AS 103):
    the same approximation, so the same numbers."""
    if x <= 1e-6:
        return -_EULER - 1.0 / x
    result = 0.0
    while x < 6:
        result -= 1.0 / x
        x += 1
    r = 1.0 / x
    result += math.log(x) - 0.5 * r
    r = r * r
    result -= r * ((1.0 / 12.0) - r * ((1.0 / 120.0) - r * (1.0 / 252.0)))
    return result


@njit(nogil=True, cache=True)
def dirichlet_expectation_t(lam, out):
    """``out[w, k] = E[log beta_kw]`` for rows ``k`` of ``lam`` (K x V):
    ``psi(lam[k, w]) - psi(sum_w lam[k, w])``, written transposed (V x K),
    the layout the E-step reads a word's topics in."""
    K, V = lam.shape
    for k in range(K):
        total = 0.0
        for w in range(V):
            total += lam[k, w]
        pt = _psi(total)
        for w in range(V):
            out[w, k] = _psi(lam[k, w]) - pt


# Reassociation lets the K-long dot products of the E-step use SIMD lanes
# (as _lda_kernels' fold-in): the sums differ from scikit-learn's BLAS dots
# in the last bits only, as BLAS's own order does.
_DOT_MATH = {"reassoc", "contract", "arcp", "nsz"}


@njit(nogil=True, cache=True, fastmath=_DOT_MATH)
def doc_bounds(indptr, indices, data, elog_t, exp_t, alpha, max_iter, tol, eps, gamma, e_step, out, work):
    """Per document of a CSR matrix: scikit-learn's E-step (``gamma`` from
    ones, ``max_iter`` updates at most, stop when the mean absolute change
    is below ``tol``; written to ``gamma``, D x K) when ``e_step``, else
    ``gamma`` as given; then the document's term of ``_approx_bound``,
    written to ``out[d]``. ``elog_t``/``exp_t``: ``E[log beta]`` and its
    exponential, V x K (rows: the columns of the matrix). ``work``: 4 x K
    floats to write (made by the caller: a kernel that allocates nothing
    compiles without numba's array constructors, 0.1 s a first fit)."""
    n_docs = indptr.shape[0] - 1
    K = elog_t.shape[1]
    last, acc, exp_doc, tmp = work[0], work[1], work[2], work[3]
    start = math.exp(_psi(1.0) - _psi(float(K)))
    lg_alpha = math.lgamma(alpha)
    lg_kalpha = math.lgamma(alpha * K)
    for d in range(n_docs):
        s = indptr[d]
        e = indptr[d + 1]
        g = gamma[d]
        if e_step:
            for k in range(K):
                g[k] = 1.0
                exp_doc[k] = start
        for _ in range(max_iter if e_step else 0):
            for k in range(K):
                last[k] = g[k]
                acc[k] = 0.0
            for j in range(s, e):
                row = exp_t[indices[j]]
                norm = 0.0
                for k in range(K):
                    norm += exp_doc[k] * row[k]
                f = data[j] / (norm + eps)
                for k in range(K):
                    acc[k] += f * row[k]
            total = 0.0
            for k in range(K):
                g[k] = exp_doc[k] * acc[k] + alpha
                total += g[k]
            pt = _psi(total)
            change = 0.0
            for k in range(K):
                exp_doc[k] = math.exp(_psi(g[k]) - pt)
                change += abs(last[k] - g[k])
            if change / K < tol:
                break
        # the document's term of the bound, with E[log theta] of the final gamma
        total = 0.0
        for k in range(K):
            total += g[k]
        pt = _psi(total)
        score = 0.0
        for k in range(K):
            tmp[k] = _psi(g[k]) - pt  # E[log theta_dk]
            score += (alpha - g[k]) * tmp[k] + math.lgamma(g[k]) - lg_alpha
        score += lg_kalpha - math.lgamma(total)
        for k in range(K):
            exp_doc[k] = math.exp(tmp[k])
        for j in range(s, e):
            # logsumexp_k(E[log theta_k] + E[log beta_kw]) as the log of a dot
            # product of the exponentials (no exp per topic: 3x less time at
            # K=1000); max-shifted where that sum underflows (tiny priors)
            p = 0.0
            erow = exp_t[indices[j]]
            for k in range(K):
                p += exp_doc[k] * erow[k]
            if p > 1e-250:
                score += data[j] * math.log(p)
                continue
            row = elog_t[indices[j]]
            top = -np.inf
            for k in range(K):
                top = max(top, tmp[k] + row[k])
            acc_sum = 0.0
            for k in range(K):
                acc_sum += math.exp(tmp[k] + row[k] - top)
            score += data[j] * (top + math.log(acc_sum))
        out[d] = score


@njit(nogil=True, cache=True)
def _topic_term(lam, elog_t, eta):
    K, V = lam.shape
    score = 0.0
    lg_eta = math.lgamma(eta)
    for k in range(K):
        total = 0.0
        for w in range(V):
            x = lam[k, w]
            total += x
            score += (eta - x) * elog_t[w, k] + math.lgamma(x) - lg_eta
        score += math.lgamma(eta * V) - math.lgamma(total)
    return score


def expectations(components):
    """``(E[log beta], exp(E[log beta]))`` of the topics ``components``
    (K x V pseudo-counts), both V x K float64."""
    lam = np.ascontiguousarray(components, dtype=np.float64)
    elog_t = np.empty((lam.shape[1], lam.shape[0]))
    dirichlet_expectation_t(lam, elog_t)
    return elog_t, np.exp(elog_t)


def topic_term(components, topic_word_prior, elog_t=None) -> float:
    """The topics' term of the bound: ``E[log p(beta | eta) - log q(beta | lambda)]``."""
    lam = np.ascontiguousarray(components, dtype=np.float64)
    if elog_t is None:
        elog_t = expectations(lam)[0]
    return float(_topic_term(lam, elog_t, float(topic_word_prior)))


def document_terms(X: sp.csr_matrix, elog_t, exp_t, doc_topic_prior, max_iter, tol, gamma=None):
    """Per document of ``X`` (float CSR whose columns are ``elog_t``'s
    rows): its term of the bound, after scikit-learn's E-step (``gamma``
    None), else with the given unnormalized doc-topic parameters
    ``gamma``; returns ``(terms, gamma)``."""
    out = np.empty(X.shape[0])
    e_step = gamma is None
    gamma = (np.empty((X.shape[0], elog_t.shape[1])) if e_step
             else np.array(gamma, dtype=np.float64, order="C", copy=True))
    doc_bounds(X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data.astype(np.float64),
               elog_t, exp_t, float(doc_topic_prior), int(max_iter), float(tol),
               float(np.finfo(np.float64).eps), gamma, e_step, out, np.empty((4, elog_t.shape[1])))
    return out, gamma


def part_document_terms(part, counts, beta, alpha, max_iter, tol) -> float:
    """Task: the summed document terms of one prepared partition
    (``_corpus._prepare_part``: its token arrays) under the topics
    ``counts.T + beta`` (``counts``: the word-topic count table, V x K).
    Only the rows of the partition's words are expanded (its ``vocab``),
    with the topics' totals from the whole table."""
    vocab, words, doc_ptr = part["vocab"], part["words"], part["doc_ptr"]
    n_docs = doc_ptr.size - 1
    rows = np.repeat(np.arange(n_docs), np.diff(doc_ptr))
    X = sp.csr_matrix((np.ones(words.size), (rows, words)), shape=(n_docs, vocab.size))
    X.sum_duplicates()
    elog_t, exp_t = count_expectations(counts, beta, vocab)
    return float(document_terms(X, elog_t, exp_t, alpha, max_iter, tol)[0].sum())


@njit(nogil=True, cache=True)
def _count_terms(counts, rows, beta, totals, table, psi_totals, out, topic):
    """Under the topics ``counts.T + beta`` (``totals``: the column sums of
    ``counts`` + V beta): ``out[i, k] = psi(counts[rows[i], k] + beta) -
    psi(totals[k])`` (``E[log beta]``), and with ``topic`` returns
    :func:`topic_term` (0 without). One kernel for both, so a first fit
    compiles one (each compiled entry point cost it 0.1-0.2 s); the psi of
    the totals (into ``psi_totals``) and ``table`` (``psi(c + beta)``, the
    psi of a count looked up there: the counts are small integers, and a
    psi per entry was most of the time at large K) are filled here too.

    The topic term visits the nonzero counts only: an entry of count 0
    adds exactly 0 (``eta - lambda`` and ``lgamma(lambda) - lgamma(eta)``
    both vanish)."""
    V, K = counts.shape
    n_table = table.shape[0]
    for k in range(K):
        psi_totals[k] = _psi(totals[k])
    for c in range(n_table):
        table[c] = _psi(c + beta)
    for i in range(rows.shape[0]):
        r = counts[rows[i]]
        for k in range(K):
            c = r[k]
            out[i, k] = (table[c] if 0 <= c < n_table else _psi(c + beta)) - psi_totals[k]
    score = 0.0
    if not topic:
        return score
    lg_eta = math.lgamma(beta)
    for w in range(V):
        for k in range(K):
            c = counts[w, k]
            if c != 0:
                lam = c + beta
                score += -c * (_psi(lam) - psi_totals[k]) + math.lgamma(lam) - lg_eta
    for k in range(K):
        score += math.lgamma(beta * V) - math.lgamma(totals[k])
    return score


def count_expectations(counts, beta, rows=None):
    """``E[log beta]`` (and its exponential) of the topics ``counts.T +
    beta`` for the words ``rows`` (all: None), V' x K."""
    V = counts.shape[0]
    totals = counts.sum(axis=0, dtype=np.int64) + V * beta
    rows = np.arange(V) if rows is None else np.asarray(rows, dtype=np.int64)
    elog_t = np.empty((rows.size, counts.shape[1]))
    top = int(counts.max()) if counts.size else 0
    _count_terms(counts, rows, float(beta), totals.astype(np.float64), np.empty(min(top + 1, 1 << 16)),
                 np.empty(counts.shape[1]), elog_t, False)
    return elog_t, np.exp(elog_t)


def count_topic_term(counts, eta) -> float:
    """The topics' term of the bound for ``components_ = counts.T + eta``
    (``counts``: V x K word-topic counts)."""
    V, K = counts.shape
    totals = counts.sum(axis=0, dtype=np.int64) + V * float(eta)
    return float(_count_terms(counts, np.empty(0, dtype=np.int64), float(eta), totals.astype(np.float64),
                              np.empty(0), np.empty(K), np.empty((0, K)), True))


def training_bound(parts, nwk, *, client, beta, alpha, max_iter, tol, matrix=None) -> float:
    """``GibbsRuns.run``'s ``score`` (``LatentDirichletAllocation.bound_``):
    scikit-learn's bound of the prepared partitions' documents under the
    final counts ``nwk`` (V x K; the topics are ``nwk.T + beta``), each
    partition's document terms computed where it is (the counts travel
    once per worker, as one scattered array) and the topic term here. An
    in-memory corpus (``matrix``: its counts, held here) of one partition
    is scored here: the same work without two round trips (a small fit's
    cost)."""
    if matrix is not None and len(parts.futures) <= 1:
        return local_bound(matrix, nwk, beta=beta, alpha=alpha, max_iter=max_iter, tol=tol)
    topics = count_topic_term(nwk, beta)
    [counts] = client.scatter([nwk], hash=False)
    try:
        return float(sum(parts.gather(part_document_terms, counts, beta, alpha, max_iter, tol))) + topics
    finally:
        counts.release()


def local_bound(matrix, nwk, *, beta, alpha, max_iter, tol) -> float:
    """:func:`training_bound` of an in-memory corpus of one partition
    (``matrix``: its document-term counts), computed here."""
    topics = count_topic_term(nwk, beta)
    X = sp.csr_matrix(matrix, dtype=np.float64)
    elog_t, exp_t = count_expectations(nwk, beta)
    return float(document_terms(X, elog_t, exp_t, alpha, max_iter, tol)[0].sum()) + topics


class PendingBound:
    """What a fit needs to compute its ``bound_`` later (:class:`DeferredBound`):
    the training counts ``matrix`` of a corpus of one partition held here,
    the final word-topic counts ``nwk`` and the fold-in's parameters. Holds
    them until it is computed (then dropped), pickled with the estimator.
    ``nwk`` is held by its nonzeros (at most one per token: a small corpus
    over a large vocabulary does not hold a second V x K table, and
    ``components_`` is the user's to change) and rebuilt as it was, dtype
    and layout, so the same kernels give the same bits."""

    def __init__(self, matrix, nwk, n_tokens, **params):
        self.matrix, self.n_tokens, self.params = matrix, int(n_tokens), params
        self.shape, self.dtype = nwk.shape, nwk.dtype
        self.where = np.flatnonzero(nwk)
        self.values = nwk.reshape(-1)[self.where]
        self.value = None

    def counts(self):
        """The word-topic counts, as the fit left them (C order)."""
        nwk = np.zeros(self.shape, dtype=self.dtype)
        nwk.reshape(-1)[self.where] = self.values
        return nwk

    def __call__(self) -> float:
        if self.value is None:  # once; the held data then dropped
            self.value = float(np.exp(-local_bound(self.matrix, self.counts(), **self.params) / self.n_tokens))
            self.matrix = self.where = self.values = None
        return self.value

    def __repr__(self):
        return f"PendingBound({self.n_tokens} tokens)"

    def __reduce__(self):
        # Pickled as its value: a pickled model does not carry the training
        # counts (a fit of millions of tokens would take tens of MB more).
        return ComputedBound, (self(),)


class ComputedBound:
    """A :class:`PendingBound` after a pickle round trip: its value."""

    def __init__(self, value: float):
        self.value = float(value)

    def __call__(self) -> float:
        return self.value


class DeferredBound:
    """The estimator's ``bound_`` where a fit left it pending (issue 35): a
    non-data descriptor, so a ``bound_`` the fit computed (an instance
    attribute) is read as usual; otherwise the first read computes it from
    the instance's ``_bound_pending`` (:class:`PendingBound`), stores it as
    an instance attribute and drops the pending data. The same numbers, bit
    for bit, as computing it at the end of the fit: a first fit that is
    never asked for ``bound_`` does not compile scikit-learn's E-step and
    bound (``doc_bounds``, ``_count_terms``: 1.1-1.2 s of CPU, more than
    the sampler's kernel). No fit yet: AttributeError, as for any fitted
    attribute."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        pending = obj.__dict__.get("_bound_pending")
        if pending is None:
            raise AttributeError(f"'{type(obj).__name__}' object has no attribute '{self.name}'")
        value = pending()
        obj.__dict__[self.name] = value
        obj.__dict__.pop("_bound_pending", None)
        return value
