"""Compiled and vectorized kernels of the collapsed Gibbs sampler for LDA.

Everything here takes plain arrays and scalars, never the estimator
(STYLE.md §2): the estimator's participant function pulls counts from the
parameter server, calls one sweep, and pushes the change.

Notation (Griffiths & Steyvers 2004; Yao, Mimno & McCallum 2009, "SparseLDA"):

- ``ndk[d, k]``: tokens of document ``d`` assigned to topic ``k`` (local);
- ``nwk[w, k]``: tokens of word ``w`` assigned to topic ``k`` (a participant's
  copy of the rows of the words it holds, pulled from the server);
- ``nk[k]``: tokens assigned to topic ``k`` (the topic-totals row);
- ``alpha`` = doc_topic_prior, ``beta`` = topic_word_prior, ``vbeta`` = V * beta.

The full conditional of one token (its own assignment removed) is

    p(z = k | rest) ∝ (ndk + alpha) (nwk + beta) / (nk + vbeta).

Every kernel reads counts through ``max(count, 0)`` when it computes
probabilities (why: "Clamping" in the "Estimators: LDA" section of
``docs/architecture.rst``); the counts themselves stay exact.
"""

from __future__ import annotations

import math

import numpy as np

from dask_ps._estimators import njit  # numba.njit, caching outside the package

# --- CPU: sequential collapsed Gibbs (exact within a participant) -----------------


@njit(nogil=True, cache=True)
def _inverse_totals(nk, vbeta):
    """``1 / (nk + vbeta)`` per topic, the totals clamped at 0."""
    K = nk.shape[0]
    inv = np.empty(K)
    for k in range(K):
        n = nk[k]
        inv[k] = 1.0 / ((n if n > 0 else 0) + vbeta)
    return inv


@njit(cache=False, inline="always")
def _doc_coefficients(ndk, d, alpha, inv, coef):
    """Fill ``coef`` with document ``d``'s ``(ndk + alpha) / (nk + vbeta)``
    per topic; returns their sum."""
    total = 0.0
    for k in range(coef.shape[0]):
        coef[k] = (ndk[d, k] + alpha) * inv[k]
        total += coef[k]
    return total


@njit(cache=False, inline="always")
def _move_token(ndk, nwk, nk, inv, coef, d, w, k, step, alpha, vbeta):
    """Add (``step=1``) or remove (``step=-1``) a token of document ``d`` and
    word ``w`` in topic ``k``, keeping the topic's ``inv`` and ``coef``
    (``(ndk + alpha) / (nk + vbeta)``) current. Inlined into the sweeps
    (compiled with their flags), so it costs no call per token."""
    ndk[d, k] += step
    nwk[w, k] += step
    nk[k] += step
    n = nk[k]
    inv[k] = 1.0 / ((n if n > 0 else 0) + vbeta)
    coef[k] = (ndk[d, k] + alpha) * inv[k]


@njit(nogil=True, cache=True, fastmath=True)
def gibbs_sweep_dense(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed):
    """One sweep over every token, O(K) per token, SIMD-friendly.

    Updates ``z``, ``ndk``, ``nwk`` and ``nk`` in place, as it samples (the
    participant's local copy: AD-LDA). Per document the factor
    ``(ndk + alpha) / (nk + vbeta)`` is kept in ``coef`` and only the two
    topics a token leaves and joins are recomputed. Per token the K
    unnormalized probabilities are one vectorizable multiply-add loop; the
    draw walks sums of blocks of 8 topics, then one block, instead of a
    serial prefix sum over all K.
    """
    np.random.seed(seed)
    K = nk.shape[0]
    B = 8
    nb = (K + B - 1) // B
    inv = _inverse_totals(nk, vbeta)
    coef = np.empty(K)
    p = np.zeros(nb * B)  # padded: the last block's tail stays 0
    bs = np.empty(nb)
    for d in range(doc_ptr.shape[0] - 1):
        if doc_ptr[d] == doc_ptr[d + 1]:
            continue
        _doc_coefficients(ndk, d, alpha, inv, coef)
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            w = words[i]
            old = z[i]
            _move_token(ndk, nwk, nk, inv, coef, d, w, old, -1, alpha, vbeta)
            for k in range(K):
                c = nwk[w, k]
                p[k] = coef[k] * ((c if c > 0 else 0) + beta)  # clamped at 0
            total = 0.0
            for b in range(nb):
                s = 0.0
                for j in range(B):
                    s += p[b * B + j]
                bs[b] = s
                total += s
            u = np.random.random() * total
            b = 0
            while b < nb - 1 and u >= bs[b]:
                u -= bs[b]
                b += 1
            new = b * B
            last = min(new + B, K) - 1
            while new < last and u >= p[new]:
                u -= p[new]
                new += 1
            z[i] = new
            _move_token(ndk, nwk, nk, inv, coef, d, w, new, 1, alpha, vbeta)


@njit(nogil=True, cache=True)
def gibbs_sweep_sparse(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed):
    """One sweep with SparseLDA's bucket decomposition (Yao et al. 2009).

    Same conditional as :func:`gibbs_sweep_dense`, split as

        (ndk + alpha)(nwk + beta)/(nk + vbeta)
          = beta (ndk + alpha)/(nk + vbeta)        "smoothing + document" bucket, s
          + nwk (ndk + alpha)/(nk + vbeta)         "topic-word" bucket, q

    ``s`` is kept up to date incrementally (two topics change per token), and
    ``q`` needs only the topics in which the word has tokens: per local word
    the nonzero topics are kept in an unordered list with O(1) insert and
    delete (``nz_list``/``nz_pos``). Most of the mass is in ``q`` for
    ``beta`` << 1, so a draw rarely walks all K topics.
    """
    np.random.seed(seed)
    K = nk.shape[0]
    Vp = nwk.shape[0]
    nz_list = np.empty((Vp, K), dtype=np.int32)
    nz_pos = np.full((Vp, K), -1, dtype=np.int32)
    nz_cnt = np.zeros(Vp, dtype=np.int32)
    for w in range(Vp):
        c = 0
        for k in range(K):
            if nwk[w, k] > 0:
                nz_list[w, c] = k
                nz_pos[w, k] = c
                c += 1
        nz_cnt[w] = c
    inv = _inverse_totals(nk, vbeta)
    coef = np.empty(K)
    qv = np.empty(K)
    for d in range(doc_ptr.shape[0] - 1):
        if doc_ptr[d] == doc_ptr[d + 1]:
            continue
        s = _doc_coefficients(ndk, d, alpha, inv, coef)
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            w = words[i]
            old = z[i]
            # remove the token
            s -= coef[old]
            _move_token(ndk, nwk, nk, inv, coef, d, w, old, -1, alpha, vbeta)
            s += coef[old]
            if nwk[w, old] <= 0 and nz_pos[w, old] >= 0:  # leaves the word's list
                p = nz_pos[w, old]
                last = nz_list[w, nz_cnt[w] - 1]
                nz_list[w, p] = last
                nz_pos[w, last] = p
                nz_pos[w, old] = -1
                nz_cnt[w] -= 1
            # q bucket over the word's nonzero topics
            q = 0.0
            cnt = nz_cnt[w]
            for j in range(cnt):
                k = nz_list[w, j]
                v = coef[k] * nwk[w, k]
                qv[j] = v
                q += v
            u = np.random.random() * (q + beta * s)
            new = -1
            if u < q:
                for j in range(cnt):
                    u -= qv[j]
                    if u < 0.0:
                        new = nz_list[w, j]
                        break
                if new < 0:  # rounding: take the last nonzero topic
                    new = nz_list[w, cnt - 1]
            else:
                u = (u - q) / beta
                for k in range(K):
                    u -= coef[k]
                    if u < 0.0:
                        new = k
                        break
                if new < 0:
                    new = K - 1
            # add the token
            z[i] = new
            s -= coef[new]
            _move_token(ndk, nwk, nk, inv, coef, d, w, new, 1, alpha, vbeta)
            s += coef[new]
            if nwk[w, new] > 0 and nz_pos[w, new] < 0:
                c = nz_cnt[w]
                nz_list[w, c] = new
                nz_pos[w, new] = c
                nz_cnt[w] = c + 1


from dask_ps.decomposition._lda_mh import gibbs_sweep_mh  # noqa: E402  (alias-table MH, large K)

SWEEPS = {"dense": gibbs_sweep_dense, "sparse": gibbs_sweep_sparse, "mh": gibbs_sweep_mh}


@njit(nogil=True, cache=True)
def init_counts(doc_ptr, words, z, ndk, nwk, nk):
    """Counts of a fresh assignment ``z`` (added to the given arrays)."""
    n_docs = doc_ptr.shape[0] - 1
    for d in range(n_docs):
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            k = z[i]
            ndk[d, k] += 1
            nwk[words[i], k] += 1
            nk[k] += 1


# --- array API: batched, vectorized sampling (numpy or cupy) -------------------------


def _cumsum(xp, a):
    f = getattr(xp, "cumulative_sum", None)
    return f(a, axis=1) if f is not None else xp.cumsum(a, axis=1)


def gibbs_sweep_array(xp, doc_idx, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed, batch_size=None):
    """One sweep drawing ``batch_size`` tokens at a time, in parallel.

    The tokens of one batch are sampled from the counts as they were at the
    start of the batch (a "parallel Gibbs" step, as GPU LDA samplers do);
    counts are updated after each batch with ``bincount``. Written against
    the array API (``xp`` is numpy or cupy; ``bincount`` and ``RandomState``
    exist in both), so the same code is tested on the CPU with numpy and runs
    on the GPU with cupy. Counts are clamped at zero as in the CPU kernels.

    All arrays are ``xp`` arrays; ``doc_idx[i]`` is the (local) document of
    token ``i``. Updates ``z``, ``ndk``, ``nwk``, ``nk`` in place.
    ``batch_size=None`` takes 1/16 of the tokens, at least 4,096 and at most
    2**24 / K (a few (batch, K) float64 temporaries of 128 MiB each):
    drawing the whole corpus at once from the same counts mixes poorly.
    """
    K = nk.shape[0]
    n = words.shape[0]
    if batch_size is None:
        batch_size = int(max(min(n // 16, (1 << 24) // K), 4096))
    rs = xp.random.RandomState(seed)
    ndk_flat = ndk.reshape(-1)
    nwk_flat = nwk.reshape(-1)
    for lo in range(0, n, batch_size):
        hi = min(lo + batch_size, n)
        d = doc_idx[lo:hi]
        w = words[lo:hi]
        zo = z[lo:hi]
        m = hi - lo
        onehot = xp.zeros((m, K), dtype=xp.float64)
        ar = xp.arange(m)
        onehot[ar, zo] = 1.0
        a = ndk[d].astype(xp.float64) - onehot + alpha
        b = xp.maximum(nwk[w].astype(xp.float64) - onehot, 0.0) + beta
        c = xp.maximum(nk.astype(xp.float64)[None, :] - onehot, 0.0) + vbeta
        p = a * b / c
        cs = _cumsum(xp, p)
        u = rs.random_sample(m) * cs[:, -1]
        zn = xp.sum(cs <= u[:, None], axis=1)
        zn = xp.minimum(zn, K - 1).astype(z.dtype)
        moved = zn != zo
        if not bool(xp.any(moved)):
            continue
        dm, wm, om, nm = d[moved], w[moved], zo[moved].astype(xp.int64), zn[moved].astype(xp.int64)
        ndk_flat += (xp.bincount(dm * K + nm, minlength=ndk_flat.shape[0])
                     - xp.bincount(dm * K + om, minlength=ndk_flat.shape[0])).astype(ndk.dtype)
        nwk_flat += (xp.bincount(wm * K + nm, minlength=nwk_flat.shape[0])
                     - xp.bincount(wm * K + om, minlength=nwk_flat.shape[0])).astype(nwk.dtype)
        nk += (xp.bincount(nm, minlength=K) - xp.bincount(om, minlength=K)).astype(nk.dtype)
        z[lo:hi] = zn


# --- log-likelihood pieces (Griffiths & Steyvers' collapsed joint log p(w, z)) -------


def _lgamma_ratio(counts, prior):
    """``lgamma(counts + prior) - lgamma(prior)`` summed over the last axis
    (counts clamped at 0; zero counts add 0). Counts are small integers, so
    a lookup table beats calling ``gammaln`` on every entry."""
    from scipy.special import gammaln

    counts = np.maximum(counts, 0)
    top = int(counts.max()) if counts.size else 0
    if top <= 1 << 20:
        table = gammaln(np.arange(top + 1) + prior) - gammaln(prior)
        return table[counts].sum(axis=-1)
    return (gammaln(counts + prior) - gammaln(prior)).sum(axis=-1)


def doc_loglik(ndk, doc_len, alpha) -> float:
    """sum_d [lgamma(K alpha) - lgamma(n_d + K alpha) + sum_k lgamma(ndk + alpha) - lgamma(alpha)]
    over the documents with at least one token."""
    from scipy.special import gammaln

    K = ndk.shape[1]
    keep = doc_len > 0
    return float(
        keep.sum() * gammaln(K * alpha)
        - gammaln(doc_len[keep] + K * alpha).sum()
        + _lgamma_ratio(ndk[keep], alpha).sum()
    )


def word_loglik_rows(nwk, weights, beta) -> float:
    """sum over rows w (weighted) of sum_k lgamma(nwk + beta) - lgamma(beta).

    Rows held by several participants are counted once in total: each holder
    weighs them by 1 / (number of holders)."""
    return float(_lgamma_ratio(nwk, beta) @ weights)


def totals_loglik(nk, vbeta) -> float:
    """K lgamma(V beta) - sum_k lgamma(nk + V beta)."""
    from scipy.special import gammaln

    nk = np.maximum(nk, 0)
    return float(nk.shape[0] * gammaln(vbeta) - gammaln(nk + vbeta).sum())


# --- fold-in with the topics fixed (transform, document completion) -----------------


@njit(nogil=True, cache=True)
def fold_in(indptr, indices, data, phi_t, alpha, max_iter, tol, theta):
    """Doc-topic proportions with the topics fixed: the EM fixed point

        theta_k <- (sum_v x_v theta_k phi_kv / sum_j theta_j phi_jv + alpha) / (n_d + K alpha)

    from the uniform start, at most ``max_iter`` iterations per document,
    stopping early when the mean absolute change is below ``tol``. ``phi_t``
    is V x K (rows of the topic-word distributions); ``theta`` (D x K) is
    written. Documents without tokens get the uniform distribution.
    """
    n_docs = indptr.shape[0] - 1
    K = phi_t.shape[1]
    acc = np.empty(K)
    for d in range(n_docs):
        s = indptr[d]
        e = indptr[d + 1]
        nd = 0.0
        for j in range(s, e):
            nd += data[j]
        for k in range(K):
            theta[d, k] = 1.0 / K
        if nd <= 0:
            continue
        denom = nd + K * alpha
        for _ in range(max_iter):
            for k in range(K):
                acc[k] = 0.0
            for j in range(s, e):
                v = indices[j]
                tot = 0.0
                for k in range(K):
                    tot += theta[d, k] * phi_t[v, k]
                if tot <= 0.0:
                    continue
                f = data[j] / tot
                for k in range(K):
                    acc[k] += theta[d, k] * phi_t[v, k] * f
            change = 0.0
            for k in range(K):
                new = (acc[k] + alpha) / denom
                change += abs(new - theta[d, k])
                theta[d, k] = new
            if change / K < tol:
                break


@njit(nogil=True, cache=True)
def doc_logliks(indptr, indices, data, phi_t, theta, out):
    """Write ``out[d] = sum over entries x_dv of document d of
    x_dv log(sum_k theta_dk phi_kv)``."""
    n_docs = indptr.shape[0] - 1
    K = phi_t.shape[1]
    for d in range(n_docs):
        total = 0.0
        for j in range(indptr[d], indptr[d + 1]):
            v = indices[j]
            p = 0.0
            for k in range(K):
                p += theta[d, k] * phi_t[v, k]
            total += data[j] * math.log(p)
        out[d] = total


def heldout_loglik(indptr, indices, data, phi_t, theta) -> float:
    """sum over entries x_dv of x_dv log(sum_k theta_dk phi_kv)."""
    out = np.empty(indptr.shape[0] - 1)
    doc_logliks(indptr, indices, data, phi_t, theta, out)
    return float(out.sum())
