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
def _inverse_totals(nk, vbeta, inv):
    """Write ``1 / (nk + vbeta)`` per topic into ``inv``, the totals clamped at 0."""
    for k in range(nk.shape[0]):
        n = nk[k]
        inv[k] = 1.0 / ((n if n > 0 else 0) + vbeta)


# SplitMix64 (Steele, Lea & Flood 2014; Java's SplittableRandom): a Weyl
# sequence through a 64-bit mixer, a few integer operations inlined per draw.
# numba's np.random.random() is a call per token (MT19937 state behind it);
# inlined, the sweeps took 7-8% less CPU a token at K=1000 (sparse) and
# 12-15% at K=50 (dense; ``bench_lda_sweep.py``, variants interleaved).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


@njit(cache=False, inline="always")
def _splitmix_unit(state):
    """The uniform in [0, 1) of SplitMix64's ``state`` (advanced by the
    caller by ``_GOLDEN`` before each draw): the top 53 bits of its mix."""
    x = (state ^ (state >> _S30)) * _MIX1
    x = (x ^ (x >> _S27)) * _MIX2
    x = x ^ (x >> _S31)
    return (x >> _S11) * (1.0 / 9007199254740992.0)


# The dense sweep's lanes (topics j, j + _LANES, j + 2 _LANES, ... in lane j).
_LANES = 8


def gibbs_sweep_dense(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed):
    """One sweep over every token, O(K) per token (:func:`_dense_sweep`,
    with its work arrays made here: a kernel that allocates none compiles
    without numba's array constructors, whose first use in a process costs
    a first fit 0.1-0.15 s of compile each)."""
    K = nk.shape[0]
    p = np.zeros(-(-K // _LANES) * _LANES)  # padded: the last row's tail stays 0
    _dense_sweep(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed,
                 np.empty(K), np.empty(K), p, np.empty(_LANES))


@njit(nogil=True, cache=True, fastmath=True)
def _dense_sweep(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed, inv, coef, p, lanes):
    """One sweep over every token, O(K) per token, SIMD-friendly
    (``inv``, ``coef``, ``lanes``: K, K and 8 floats to write; ``p``: the
    padded row of probabilities, zeros).

    Updates ``z``, ``ndk``, ``nwk`` and ``nk`` in place, as it samples (the
    participant's local copy: AD-LDA). Per document the factor
    ``(ndk + alpha) / (nk + vbeta)`` is kept in ``coef`` and only the two
    topics a token leaves and joins are recomputed. Per token the K
    unnormalized probabilities ``p`` are one vectorizable multiply-add loop.
    The draw is two-level over 8 lanes, lane ``j`` holding topics ``j, j +
    8, j + 16, ...``: it picks a lane by the lanes' sums, then a topic
    within the lane (any fixed partition of the topics draws from the same
    distribution). The lane sums are 8 accumulators that stay in registers
    through one pass over ``p``; sums of blocks of 8 consecutive topics
    took 7-14% longer a token at K=20-100 (``bench_lda_sweep.py``).

    A document's tokens of one word are consecutive (``_corpus``): the next
    one's ``p`` differs from the last's only at the topic the last joined
    and the one this token leaves, so a run patches those two entries and
    their lanes instead of recomputing all K (a third of the tokens of the
    benchmark corpus). Uniforms: SplitMix64 seeded with ``seed``.

    The kernel a first fit compiles (issue 35), so it calls nothing: its
    helpers (a token's move, a lane's sum, the draw) are written out, and
    ``min`` is a comparison. Called (``_inverse_totals``, ``min``) or
    inlined by numba (``inline="always"``: typed again at each site) they
    cost 0.17 s of its 0.84 s of compile CPU; LLVM emits the same
    arithmetic either way (the same draws, bit for bit).
    """
    K = nk.shape[0]
    B = _LANES
    n_rows = (K + B - 1) // B  # topics per lane, the last row padded
    last_lane = (B if B < K else K) - 1
    for k in range(K):
        n = nk[k]
        inv[k] = 1.0 / ((n if n > 0 else 0) + vbeta)  # clamped at 0
    state = np.uint64(seed)
    for d in range(doc_ptr.shape[0] - 1):
        if doc_ptr[d] == doc_ptr[d + 1]:
            continue
        for k in range(K):
            coef[k] = (ndk[d, k] + alpha) * inv[k]
        prev_w = -1
        prev_new = 0
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            w = words[i]
            old = z[i]
            # the token leaves topic old: its counts, inv and coef
            ndk[d, old] -= 1
            nwk[w, old] -= 1
            nk[old] -= 1
            n = nk[old]
            inv[old] = 1.0 / ((n if n > 0 else 0) + vbeta)
            coef[old] = (ndk[d, old] + alpha) * inv[old]
            if w == prev_w:  # the run goes on: patch the two topics that moved
                c = nwk[w, prev_new]
                p[prev_new] = coef[prev_new] * ((c if c > 0 else 0) + beta)
                c = nwk[w, old]
                p[old] = coef[old] * ((c if c > 0 else 0) + beta)
                j = prev_new % B  # the sums of their lanes (topics j, j + B, ...)
                s = p[j]
                for r in range(1, n_rows):
                    s += p[r * B + j]
                lanes[j] = s
                j = old % B
                s = p[j]
                for r in range(1, n_rows):
                    s += p[r * B + j]
                lanes[j] = s
            else:
                for k in range(K):
                    c = nwk[w, k]
                    p[k] = coef[k] * ((c if c > 0 else 0) + beta)  # clamped at 0
                for j in range(B):
                    lanes[j] = p[j]
                for b in range(1, n_rows):
                    for j in range(B):
                        lanes[j] += p[b * B + j]
            total = 0.0
            for j in range(B):
                total += lanes[j]
            state += _GOLDEN  # SplitMix64's next uniform (_splitmix_unit, written out)
            x = (state ^ (state >> _S30)) * _MIX1
            x = (x ^ (x >> _S27)) * _MIX2
            x = x ^ (x >> _S31)
            u = (x >> _S11) * (1.0 / 9007199254740992.0) * total
            j = 0
            while j < last_lane and u >= lanes[j]:
                u -= lanes[j]
                j += 1
            new = j
            while new + B < K and u >= p[new]:
                u -= p[new]
                new += B
            z[i] = new
            ndk[d, new] += 1  # the token joins topic new
            nwk[w, new] += 1
            nk[new] += 1
            n = nk[new]
            inv[new] = 1.0 / ((n if n > 0 else 0) + vbeta)
            coef[new] = (ndk[d, new] + alpha) * inv[new]
            prev_w, prev_new = w, new


@njit(nogil=True, cache=True)
def _word_topic_lists(words, nwk):
    """Per local word, the topics in which its row is positive, in one flat
    array: word ``w``'s are ``topics[start[w] : start[w] + count[w]]``,
    with room for every topic its local tokens could add in the sweep (at
    most ``min(K, nonzeros + tokens)``). O(rows x K) to scan, no per-topic
    index table (a (rows, K) position table costs as much memory as ``nwk``
    and a pass to fill)."""
    Vp, K = nwk.shape
    tokens = np.zeros(Vp, dtype=np.int64)
    for i in range(words.shape[0]):
        tokens[words[i]] += 1
    count = np.zeros(Vp, dtype=np.int64)
    for w in range(Vp):
        c = 0
        for k in range(K):
            if nwk[w, k] > 0:
                c += 1
        count[w] = c
    start = np.empty(Vp + 1, dtype=np.int64)
    start[0] = 0
    for w in range(Vp):
        start[w + 1] = start[w] + min(K, count[w] + tokens[w])
    topics = np.empty(start[Vp], dtype=np.int32)
    for w in range(Vp):
        c = start[w]
        for k in range(K):
            if nwk[w, k] > 0:
                topics[c] = k
                c += 1
    return topics, start, count


@njit(cache=False, inline="always")
def _drop_topic(topics, first, count, w, k):
    """Remove topic ``k`` from word ``w``'s list (swap with the last)."""
    last = first + count[w] - 1
    for j in range(first, last + 1):
        if topics[j] == k:
            topics[j] = topics[last]
            break
    count[w] -= 1


@njit(nogil=True, cache=True)
def gibbs_sweep_sparse(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed):
    """One sweep with SparseLDA's three buckets (Yao, Mimno & McCallum 2009).

    Same conditional as :func:`gibbs_sweep_dense`, split as

        (ndk + alpha)(nwk + beta)/(nk + vbeta)
          = nwk (ndk + alpha)/(nk + vbeta)      "topic-word" bucket q: the word's nonzero topics
          + beta ndk/(nk + vbeta)               "document" bucket r: the document's nonzero topics
          + alpha beta/(nk + vbeta)             "smoothing" bucket s: every topic, rarely drawn

    ``r`` and ``s`` are kept up to date as tokens move (two topics change
    per token), ``q`` is summed over the word's nonzero topics (kept in a
    list per word, :func:`_word_topic_lists`). Only a draw from ``s`` (mass
    ``alpha beta sum 1/(nk + vbeta)``, small) walks all K topics; a draw
    from ``r`` walks the document's topics, so the cost per token grows
    with the word's and the document's topics, not with K. Uniforms:
    SplitMix64 seeded with ``seed``, as in the dense sweep.
    """
    state = np.uint64(seed)
    K = nk.shape[0]
    topics, start, count = _word_topic_lists(words, nwk)
    inv = np.empty(K)
    _inverse_totals(nk, vbeta, inv)
    coef = np.empty(K)  # (ndk + alpha) / (nk + vbeta) of the current document
    qv = np.empty(K)
    doc_topics = np.empty(K, dtype=np.int32)  # the current document's topics with ndk > 0
    doc_pos = np.full(K, -1, dtype=np.int64)
    ab = alpha * beta
    for d in range(doc_ptr.shape[0] - 1):
        if doc_ptr[d] == doc_ptr[d + 1]:
            continue
        n_doc = 0
        smooth = 0.0
        r = 0.0
        for k in range(K):
            coef[k] = (ndk[d, k] + alpha) * inv[k]
            smooth += inv[k]
            if ndk[d, k] > 0:
                doc_topics[n_doc] = k
                doc_pos[k] = n_doc
                n_doc += 1
                r += ndk[d, k] * inv[k]
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            w = words[i]
            first = start[w]
            for step in (-1, 1):
                if step == -1:
                    k = z[i]
                else:  # draw the new topic from the three buckets
                    q = 0.0
                    cnt = count[w]
                    for j in range(cnt):
                        t = topics[first + j]
                        v = coef[t] * nwk[w, t]
                        qv[j] = v
                        q += v
                    state += _GOLDEN
                    u = _splitmix_unit(state) * (q + beta * r + ab * smooth)
                    k = -1
                    if u < q:
                        for j in range(cnt):
                            u -= qv[j]
                            if u < 0.0:
                                k = topics[first + j]
                                break
                        if k < 0:  # rounding: the last nonzero topic
                            k = topics[first + cnt - 1]
                    elif u < q + beta * r and n_doc > 0:
                        u = (u - q) / beta
                        for j in range(n_doc):
                            t = doc_topics[j]
                            u -= ndk[d, t] * inv[t]
                            if u < 0.0:
                                k = t
                                break
                        if k < 0:
                            k = doc_topics[n_doc - 1]
                    else:
                        u = max(u - q - beta * r, 0.0) / ab
                        for t in range(K):
                            u -= inv[t]
                            if u < 0.0:
                                k = t
                                break
                        if k < 0:
                            k = K - 1
                    z[i] = k
                # move the token out of (step -1) or into (step 1) topic k,
                # keeping the buckets' sums and the lists current
                before_w, before_d = nwk[w, k], ndk[d, k]
                smooth -= inv[k]
                r -= before_d * inv[k]
                ndk[d, k] = before_d + step
                nwk[w, k] = before_w + step
                nk[k] += step
                n = nk[k]
                inv[k] = 1.0 / ((n if n > 0 else 0) + vbeta)
                coef[k] = (ndk[d, k] + alpha) * inv[k]
                smooth += inv[k]
                r += ndk[d, k] * inv[k]
                if step == -1 and before_w == 1:
                    _drop_topic(topics, first, count, w, k)
                elif step == 1 and before_w == 0:
                    topics[first + count[w]] = k
                    count[w] += 1
                if step == -1 and before_d == 1:  # leaves the document's list
                    p = doc_pos[k]
                    last = doc_topics[n_doc - 1]
                    doc_topics[p] = last
                    doc_pos[last] = p
                    doc_pos[k] = -1
                    n_doc -= 1
                elif step == 1 and before_d == 0:
                    doc_topics[n_doc] = k
                    doc_pos[k] = n_doc
                    n_doc += 1
        for j in range(n_doc):
            doc_pos[doc_topics[j]] = -1


@njit(nogil=True, cache=True)
def row_deltas_into(words, z_before, z_after, out, clear):
    """The change a sweep made to a participant's word rows, from the
    assignments alone (``words`` its local row numbers), written into ``out``
    (rows x K, all zeros): returns ``changed``, the rows with a token that
    moved, and their change is ``out[:changed.size]``. Called again with ``clear=True`` once
    the push was sent, it zeroes those entries again: O(tokens) per
    iteration and no fresh (changed x K) array, whose first touch of every
    page cost more than the rest at K=1000."""
    n_rows = 0
    slot = np.full(out.shape[0], -1, dtype=np.int64)
    for i in range(words.shape[0]):
        if z_before[i] != z_after[i] and slot[words[i]] < 0:
            slot[words[i]] = 0
            n_rows += 1
    changed = np.empty(n_rows, dtype=np.int64)
    j = 0
    for w in range(slot.shape[0]):
        if slot[w] >= 0:
            changed[j] = w
            slot[w] = j
            j += 1
    for i in range(words.shape[0]):
        if z_before[i] != z_after[i]:
            r = slot[words[i]]
            if clear:
                out[r, z_before[i]] = 0
                out[r, z_after[i]] = 0
            else:
                out[r, z_before[i]] -= 1
                out[r, z_after[i]] += 1
    return changed


@njit(nogil=True, cache=True)
def changed_rows(after, before):
    """The rows where ``after`` differs from ``before`` and ``after - before``
    of those rows, in one pass (a CPU sweep's change at small K, where
    comparing the rows is cheaper than :func:`row_deltas_into`): numpy's
    subtract, ``any(axis=1)`` and gather took twice as long (1.05 ms
    against 0.55 ms a sweep at K=50 on the benchmark corpus)."""
    n, K = after.shape
    changed = np.empty(n, dtype=np.int64)
    c = 0
    for w in range(n):
        for k in range(K):
            if after[w, k] != before[w, k]:
                changed[c] = w
                c += 1
                break
    delta = np.empty((c, K), dtype=after.dtype)
    for j in range(c):
        w = changed[j]
        for k in range(K):
            delta[j, k] = after[w, k] - before[w, k]
    return changed[:c], delta


SWEEPS = {"dense": gibbs_sweep_dense, "sparse": gibbs_sweep_sparse}


def init_counts(doc_ptr, words, z, ndk, nwk, nk):
    """Counts of a fresh assignment ``z`` (added to the given arrays):
    numpy's bincounts where the tables are small (a first fit's: the same
    integers, without the kernel's compile, 0.1 s), else
    :func:`_init_counts` (no (rows x K) int64 temporaries)."""
    K = nk.shape[0]
    if max(ndk.size, nwk.size) > _GATHER_ENTRIES:
        _init_counts(doc_ptr, words, z, ndk, nwk, nk)
        return
    if doc_ptr.shape[0] < 2:
        return
    lo, hi = int(doc_ptr[0]), int(doc_ptr[-1])
    topic = z[lo:hi].astype(np.int64)
    doc = np.repeat(np.arange(ndk.shape[0], dtype=np.int64), np.diff(doc_ptr))
    ndk += np.bincount(doc * K + topic, minlength=ndk.size).reshape(ndk.shape).astype(ndk.dtype)
    word = words[lo:hi].astype(np.int64)
    nwk += np.bincount(word * K + topic, minlength=nwk.size).reshape(nwk.shape).astype(nwk.dtype)
    nk += np.bincount(topic, minlength=K).astype(nk.dtype)


@njit(nogil=True, cache=True)
def _init_counts(doc_ptr, words, z, ndk, nwk, nk):
    """:func:`init_counts`' loop."""
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


# The most entries of a count table whose lgamma sums are a numpy gather (one
# float64 temporary of its size); larger ones go to the compiled kernel.
_GATHER_ENTRIES = 1 << 20


@njit(nogil=True, cache=True)
def _table_row_sums(counts, table):
    """Per row of the 2-D ``counts``: the sum of ``table[c]`` over its
    positive entries (``table[0]`` is 0: zero counts add nothing, and most
    word-topic counts are zeros at large K)."""
    out = np.zeros(counts.shape[0])
    for i in range(counts.shape[0]):
        s = 0.0
        for j in range(counts.shape[1]):
            c = counts[i, j]
            if c > 0:
                s += table[c]
        out[i] = s
    return out


def _lgamma_ratio(counts, prior):
    """``lgamma(counts + prior) - lgamma(prior)`` summed over the last axis
    (counts clamped at 0; zero counts add 0). Counts are small integers, so
    a lookup table beats calling ``gammaln`` on every entry, and one pass
    that skips the zeros beats gathering every entry (a V x K table at
    K=5000: 73M entries, 4.7 s as a numpy gather, most of it zeros)."""
    from scipy.special import gammaln

    top = int(counts.max()) if counts.size else 0
    if counts.ndim == 2 and counts.dtype.kind == "i" and top <= 1 << 20:
        table = gammaln(np.arange(top + 1) + prior) - gammaln(prior)
        if counts.size <= _GATHER_ENTRIES:
            # a small table (a first fit's): numpy's gather and sequential
            # running sum give the kernel's sums bit for bit (table[0] is
            # exactly 0, and adding 0 changes no sum), without its compile
            # (0.2-0.3 s a fresh install's first fit waited for)
            return np.cumsum(table[np.maximum(counts, 0)], axis=1)[:, -1] if counts.shape[1] else (
                np.zeros(counts.shape[0]))
        return _table_row_sums(counts, table)
    counts = np.maximum(counts, 0)
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


# Reassociation lets the K-long dot products below use SIMD lanes (the
# reductions are sequential otherwise): at K=1000 on the benchmark corpus the
# fold-in and the scoring pass took 0.55 CPU-s instead of 1.03. No NaN or
# infinity assumptions ("nnan", "ninf"): a zero probability gives log(0).
_FOLD_MATH = {"reassoc", "contract", "arcp", "nsz"}

# ``topics``, ``offset``, ``scale`` below: row ``v`` of the topic-word
# distributions (V x K, transposed) is ``(topics[v] + offset) * scale``. The
# distributions themselves: ``phi_t``, 0, ones. The word-topic counts:
# ``nwk``, beta, 1 / (column totals + V beta), read as they are (4-byte
# integers: half the bytes of a float64 phi_t, and no V x K copy made).


@njit(nogil=True, cache=True, fastmath=_FOLD_MATH)
def fold_in(indptr, indices, data, topics, offset, scale, alpha, max_iter, tol, theta):
    """Doc-topic proportions with the topics fixed: the EM fixed point

        theta_k <- (sum_v x_v theta_k phi_kv / sum_j theta_j phi_jv + alpha) / (n_d + K alpha)

    from the uniform start, at most ``max_iter`` iterations per document,
    stopping early when the mean absolute change is below ``tol``; ``phi``
    is ``(topics + offset) * scale`` (see above). ``theta`` (D x K) is
    written. Documents without tokens get the uniform distribution.
    """
    n_docs = indptr.shape[0] - 1
    K = topics.shape[1]
    acc = np.empty(K)
    prod = np.empty(K)  # theta_k phi_kv of one entry: its row of the topics is read once per iteration
    for d in range(n_docs):
        s = indptr[d]
        e = indptr[d + 1]
        th = theta[d]
        nd = 0.0
        for j in range(s, e):
            nd += data[j]
        for k in range(K):
            th[k] = 1.0 / K
        if nd <= 0:
            continue
        denom = nd + K * alpha
        for _ in range(max_iter):
            for k in range(K):
                acc[k] = 0.0
            for j in range(s, e):
                row = topics[indices[j]]
                tot = 0.0
                for k in range(K):
                    p = th[k] * ((row[k] + offset) * scale[k])
                    prod[k] = p
                    tot += p
                if tot <= 0.0:
                    continue
                f = data[j] / tot
                for k in range(K):
                    acc[k] += prod[k] * f
            change = 0.0
            for k in range(K):
                new = (acc[k] + alpha) / denom
                change += abs(new - th[k])
                th[k] = new
            if change / K < tol:
                break


@njit(nogil=True, cache=True, fastmath=_FOLD_MATH)
def doc_logliks(indptr, indices, data, topics, offset, scale, theta, out):
    """Write ``out[d] = sum over entries x_dv of document d of
    x_dv log(sum_k theta_dk phi_kv)``, ``phi`` as in :func:`fold_in`."""
    n_docs = indptr.shape[0] - 1
    K = topics.shape[1]
    for d in range(n_docs):
        th = theta[d]
        total = 0.0
        for j in range(indptr[d], indptr[d + 1]):
            row = topics[indices[j]]
            p = 0.0
            for k in range(K):
                p += th[k] * ((row[k] + offset) * scale[k])
            total += data[j] * math.log(p)
        out[d] = total


def heldout_loglik(indptr, indices, data, phi_t, theta) -> float:
    """sum over entries x_dv of x_dv log(sum_k theta_dk phi_kv)."""
    out = np.empty(indptr.shape[0] - 1)
    doc_logliks(indptr, indices, data, phi_t, 0.0, np.ones(phi_t.shape[1]), theta, out)
    return float(out.sum())
