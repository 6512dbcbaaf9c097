"""A collapsed Gibbs sweep for LDA whose cost per token does not grow with K:
alias-table Metropolis-Hastings (LightLDA: Yuan et al. 2015, "LightLDA: Big
Topic Models on Modest Computer Clusters").

Same contract as the sweeps of :mod:`._lda_kernels` (plain arrays in, updated
in place; counts read through ``max(count, 0)``, the deltas exact), so the
participant calls it as it calls ``gibbs_sweep_sparse``. Notation as there:
the target of one token, its own assignment removed, is

    p(k) ∝ (ndk + alpha) (nwk + beta) / (nk + vbeta).

Per token, ``mh_steps`` cycles of two proposals, each accepted or rejected
by Metropolis-Hastings against ``p`` (so the chain's stationary distribution
is the exact conditional, whatever the proposals):

- **word proposal** ``q_w(k) ∝ (nwk' + beta) / (nk' + vbeta)``, the counts
  ``'`` as they were at the start of the sweep. Drawn in O(1) from a
  two-part mixture: an alias table over the word's nonzero topics
  (``nwk' / (nk' + vbeta)``, built once per sweep, total size the number of
  nonzero word-topic counts) and one alias table over all topics
  (``beta / (nk' + vbeta)``) shared by every word. The acceptance ratio uses
  the snapshot ``nwk'`` for ``q_w``, so stale tables cost mixing, not
  correctness.
- **document proposal** ``q_d(k) ∝ ndk + alpha`` (the token removed): the
  topic of another token of the document picked uniformly, or with
  probability ``K alpha / (n_d - 1 + K alpha)`` a uniform topic. No table at
  all; the ratio needs only the word and total counts.

Building the tables costs O(V_p K) to find the nonzero counts (one pass, as
SparseLDA's start does) plus O(nonzeros); sampling costs O(mh_steps) per
token. MH mixes less per sweep than exact Gibbs, so it needs a few more
sweeps to reach the same log-likelihood (measured in ``docs/benchmarks.md``,
"LDA at large K"); it wins where the exact samplers' per-token cost, which
grows with K, dominates.
"""

from __future__ import annotations

import numpy as np

from dask_ps._estimators import njit

#: Cycles (word proposal + document proposal) per token: LightLDA's default
#: of 2 (measured: 1 loses about 1% log-likelihood after 30 sweeps at
#: K=1000, 4 gains little over 2).
MH_STEPS = 2


@njit(nogil=True, cache=True)
def _alias_build(weights, n, labels, prob, alias, small, large):
    """Vose's alias method over ``weights[:n]`` (all > 0). Writes
    ``prob[:n]`` (probability of keeping slot j) and ``alias[:n]`` (the label
    taken otherwise); slot j's own label is ``labels[j]``. ``small`` and
    ``large`` are scratch of length >= n."""
    total = 0.0
    for j in range(n):
        total += weights[j]
    scale = n / total
    ns = 0
    nl = 0
    for j in range(n):
        p = weights[j] * scale
        prob[j] = p
        if p < 1.0:
            small[ns] = j
            ns += 1
        else:
            large[nl] = j
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        s = small[ns]
        l = large[nl - 1]
        alias[s] = labels[l]
        prob[l] = prob[l] + prob[s] - 1.0
        if prob[l] < 1.0:
            nl -= 1
            small[ns] = l
            ns += 1
    for j in range(nl):
        prob[large[j]] = 1.0
        alias[large[j]] = labels[large[j]]
    for j in range(ns):  # rounding leftovers
        prob[small[j]] = 1.0
        alias[small[j]] = labels[small[j]]
    return total


@njit(inline="always")
def _alias_draw(lo, n, labels, prob, alias):
    x = np.random.random() * n
    j = int(x)
    if j >= n:
        j = n - 1
    if x - j < prob[lo + j]:
        return labels[lo + j]
    return alias[lo + j]


@njit(inline="always")
def _word_factor(nwk, nk, w, k, beta, vbeta):
    """``(nwk + beta) / (nk + vbeta)`` of topic k (counts clamped at 0); the
    full conditional is ``(ndk + alpha)`` times it."""
    c = nwk[w, k]
    n = nk[k]
    return ((c if c > 0 else 0) + beta) / ((n if n > 0 else 0) + vbeta)


@njit(nogil=True, cache=True)
def _proposal_tables(nwk, nk, beta, vbeta):
    """The word proposal's tables, from the counts at the start of the sweep:
    the snapshot ``nwk'``, ``1 / (nk' + vbeta)``, the shared alias table over
    all topics and its mass, and per word (CSR ``w_ptr``) the alias table of
    its nonzero topics and its mass."""
    Vp, K = nwk.shape
    nwk_old = nwk.copy()
    inv_old = np.empty(K)
    for k in range(K):
        n = nk[k]
        inv_old[k] = 1.0 / ((n if n > 0 else 0) + vbeta)
    small = np.empty(K, dtype=np.int32)
    large = np.empty(K, dtype=np.int32)
    # shared part: beta / (nk' + vbeta) over all topics
    all_topics = np.arange(K).astype(np.int32)
    d_prob = np.empty(K)
    d_alias = np.empty(K, dtype=np.int32)
    dense_mass = beta * _alias_build(inv_old, K, all_topics, d_prob, d_alias, small, large)
    # per word: nwk' / (nk' + vbeta) over its nonzero topics (CSR)
    w_ptr = np.zeros(Vp + 1, dtype=np.int64)
    for w in range(Vp):
        c = 0
        for k in range(K):
            if nwk_old[w, k] > 0:
                c += 1
        w_ptr[w + 1] = w_ptr[w] + c
    nnz = w_ptr[Vp]
    w_topic = np.empty(nnz, dtype=np.int32)
    w_prob = np.empty(nnz)
    w_alias = np.empty(nnz, dtype=np.int32)
    w_mass = np.zeros(Vp)
    weights = np.empty(K)
    for w in range(Vp):
        lo = w_ptr[w]
        c = 0
        for k in range(K):
            v = nwk_old[w, k]
            if v > 0:
                w_topic[lo + c] = k
                weights[c] = v * inv_old[k]
                c += 1
        if c > 0:
            w_mass[w] = _alias_build(weights, c, w_topic[lo:lo + c], w_prob[lo:lo + c], w_alias[lo:lo + c],
                                     small, large)
    return nwk_old, inv_old, all_topics, d_prob, d_alias, dense_mass, w_ptr, w_topic, w_prob, w_alias, w_mass


@njit(nogil=True, cache=True)
def gibbs_sweep_mh(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed, mh_steps=MH_STEPS):
    """One sweep over every token by alias-table Metropolis-Hastings
    (module docstring). Updates ``z``, ``ndk``, ``nwk`` and ``nk`` in place."""
    np.random.seed(seed)
    Vp, K = nwk.shape
    nwk_old, inv_old, all_topics, d_prob, d_alias, dense_mass, w_ptr, w_topic, w_prob, w_alias, w_mass = \
        _proposal_tables(nwk, nk, beta, vbeta)
    k_alpha = K * alpha
    # --- the sweep
    for d in range(doc_ptr.shape[0] - 1):
        start = doc_ptr[d]
        stop = doc_ptr[d + 1]
        others = stop - start - 1
        for i in range(start, stop):
            w = words[i]
            s = z[i]
            ndk[d, s] -= 1
            nwk[w, s] -= 1
            nk[s] -= 1
            lo = w_ptr[w]
            n_w = w_ptr[w + 1] - lo
            mass_w = w_mass[w]
            # the current state's target and word factor, recomputed only when a move is accepted
            f_s = _word_factor(nwk, nk, w, s, beta, vbeta)
            p_s = (ndk[d, s] + alpha) * f_s
            co = nwk_old[w, s]
            q_s = ((co if co > 0 else 0) + beta) * inv_old[s]
            for _ in range(mh_steps):
                # word proposal: q_w(k) ∝ (nwk' + beta) / (nk' + vbeta)
                if np.random.random() * (mass_w + dense_mass) < mass_w:
                    t = _alias_draw(lo, n_w, w_topic, w_prob, w_alias)
                else:
                    t = _alias_draw(0, K, all_topics, d_prob, d_alias)
                if t != s:
                    co = nwk_old[w, t]
                    q_t = ((co if co > 0 else 0) + beta) * inv_old[t]
                    f_t = _word_factor(nwk, nk, w, t, beta, vbeta)
                    p_t = (ndk[d, t] + alpha) * f_t
                    if np.random.random() * p_s * q_t < p_t * q_s:
                        s, f_s, p_s, q_s = t, f_t, p_t, q_t
                # document proposal: q_d(k) ∝ ndk + alpha, the token removed
                u = np.random.random() * (others + k_alpha)
                if u < others:
                    j = start + int(u)
                    if j >= i:
                        j += 1
                    if j >= stop:
                        j = stop - 1
                    t = z[j]
                else:
                    t = int((u - others) / alpha)
                    if t >= K:
                        t = K - 1
                if t != s:
                    f_t = _word_factor(nwk, nk, w, t, beta, vbeta)
                    if np.random.random() * f_s < f_t:
                        s, f_s = t, f_t
                        p_s = (ndk[d, s] + alpha) * f_s
                        co = nwk_old[w, s]
                        q_s = ((co if co > 0 else 0) + beta) * inv_old[s]
            z[i] = s
            ndk[d, s] += 1
            nwk[w, s] += 1
            nk[s] += 1
