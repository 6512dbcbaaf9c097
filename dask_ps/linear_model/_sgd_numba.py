"""scikit-learn's per-sample SGD (``_plain_sgd``) compiled with numba, over
a *round* of samples given by their indices into the participant's local
data, so that a round needs no copy of its rows; and the helpers that build
a round (``compact_rows``, ``round_features``, ``gather_rows``).

Same rule, in the same order, as scikit-learn's Cython kernel (weight vector
with a scale factor for the L2 decay, Tsuruoka's cumulative L1 penalty,
averaging with scikit-learn's ``average_a``/``average_b``, the
passive-aggressive rules), with two additions the parameter server needs:

- the global sample counter ``t`` advances by ``step`` per sample (all
  participants' samples; ``step = 1`` for one participant, as scikit-learn);
- sparse data is trained as the round's compact problem (``compact_rows``):
  its rows over the round's touched features, the rows of the pulled block.

It also returns the round's loss sum (scikit-learn's ``sumloss``: the loss of
each sample at the weights it is trained from), and the product of the L2
decays and the sum of the learning rates over the round, from which the
caller regularizes lazily the rows the round did not touch. The loss,
penalty and learning-rate ids are ``_kernels``'s (numba reads module-level
ints as constants).
"""

from __future__ import annotations

import math

import numpy as np

from dask_ps._estimators import Specializations, njit  # numba.njit(cache=True) caching outside the package
from dask_ps.linear_model._kernels import (  # noqa: F401  (LOSS_IDS: the ids sgd_round takes)
    ELASTICNET,
    INVSCALING,
    L1,
    L2,
    LOSS_IDS,
    MAX_DLOSS,
    OPTIMAL,
    PA1,
    PA2,
)


def readonly(a):
    """A read-only view of ``a`` (``a`` itself if it is read-only): the
    kernels take their samples so, whatever the input's flag, since numba
    compiles a kernel once per argument type and an array's type includes
    its read-only flag (a read-only input, e.g. a memory map, compiled each
    kernel a second time: 4 specializations of the SGD kernels in
    ``check_estimator`` instead of 2)."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


@njit(inline="always", error_model="numpy")
def _log1pexp(x):
    if x <= -37.0:
        return math.exp(x)
    if x <= -2.0:
        return math.log1p(math.exp(x))
    if x <= 18.0:
        return math.log(1.0 + math.exp(x))
    if x <= 33.3:
        return x + math.exp(-x)
    return x


# The loss and its gradient for the constant ``loss_id`` of their copies
# (``_LOSSES``, ``_GRADIENTS``, inlined into ``_sgd_round``'s copies): each
# copy compiles one branch. An inlined function's code is copied into its
# caller before the caller's constants prune it, and copying all eight
# branches twice cost a third of the round kernel's compile.
def _loss(thr, y, p):
    if loss_id == 0:
        z = p * y
        return thr - z if z <= thr else 0.0
    if loss_id == 1:
        z = thr - p * y
        return z * z if z > 0.0 else 0.0
    if loss_id == 2:
        return _log1pexp(p) - y * p
    if loss_id == 3:
        z = p * y
        if z >= 1.0:
            return 0.0
        if z >= -1.0:
            return (1.0 - z) * (1.0 - z)
        return -4.0 * z
    if loss_id == 4:
        return 0.5 * (p - y) * (p - y)
    if loss_id == 5:
        a = abs(y - p)
        return 0.5 * a * a if a <= thr else thr * (a - 0.5 * thr)
    r = abs(y - p) - thr
    if loss_id == 6:
        return r if r > 0.0 else 0.0
    return r * r if r > 0.0 else 0.0


def _gradient(thr, y, p):
    if loss_id == 0:
        return -y if p * y <= thr else 0.0
    if loss_id == 1:
        z = thr - p * y
        return -2.0 * y * z if z > 0.0 else 0.0
    if loss_id == 2:
        if p > -37.0:
            e = math.exp(-p)
            return ((1.0 - y) - y * e) / (1.0 + e)
        return math.exp(p) - y
    if loss_id == 3:
        z = p * y
        if z >= 1.0:
            return 0.0
        if z >= -1.0:
            return 2.0 * (1.0 - z) * -y
        return -4.0 * y
    if loss_id == 4:
        return p - y
    if loss_id == 5:
        r = p - y
        if abs(r) <= thr:
            return r
        return thr if r >= 0.0 else -thr
    z = y - p
    if loss_id == 6:
        if z > thr:
            return -1.0
        if -z > thr:
            return 1.0
        return 0.0
    if z > thr:
        return -2.0 * (z - thr)
    if z < -thr:
        return 2.0 * (-z - thr)
    return 0.0


def _sgd_round(X, data, ind, ptr, rows, y, sw, w, aw, intercept, aintercept,
               thr, alpha, l1_ratio, eta, eta0, power_t, optimal_init,
               fit_intercept, intercept_decay, cw_pos, cw_neg, average, t, step, wscale_min, q, u, max_scale,
               state, touched):
    """Train ``w`` (and ``aw`` if ``average > 0``) in place on the samples
    ``rows``, in that order; returns ``(intercept, aintercept, sumloss,
    decay, eta_sum, u)``. Compiled per specialization (``sgd_round``): the
    names ``dense``, ``loss_id``, ``penalty``, ``learning_rate``,
    ``averaged`` (``average > 0``), ``keep``, ``scaled``, ``use_l1`` and
    ``penalized`` are its constants (``_round_constants``), so that a fit
    compiles only the branches its parameters take.

    ``q``, ``u``: Tsuruoka's cumulative L1 penalty state (per weight, and
    the total so far), carried by the caller across calls over one round's
    chunks (``q`` may be a dummy without an L1 penalty). ``max_scale``
    (``P`` with ``P`` participants, 1 alone): sample ``i``'s learning rate
    is ``f_i`` times scikit-learn's, ``f_i = min(P, max(1, 1 / s_i))``,
    ``s_i`` its own step: ``eta * cw * sw * |x_i|^2`` against the way to
    its own loss's minimum (``_own_step``, ``_kernels.own_step``;
    ``_kernels.sample_scale``; the passive-aggressive steps are not
    scaled); ``step``: the global samples each sample stands for (the
    schedule's ``t`` and the average's weight advance by it: ``n / n_p``).
    ``keep``: the weight vector's scale and
    averaging state (``wscale``, ``average_a``, ``average_b``) start from
    ``state`` and are left there, ``w``/``aw`` unscaled, as scikit-learn's
    ``WeightVector`` over a whole fit (a lone participant's rounds);
    otherwise they start fresh and are applied to ``w``/``aw`` at the end.
    With ``keep`` the round also sums scikit-learn's objective (returned
    last, 0 otherwise): each sample's loss plus the penalty of the weights
    it is trained from, from the norms scikit-learn's ``WeightVector``
    keeps (``state[3]``, ``state[4]``: its ``sq_norm`` and ``l1_norm``,
    updated as it does, by ``scale`` and ``add`` only, ``add`` over the
    sample's features).

    Dense: sample ``r`` is ``X[r]`` and ``w`` has one entry per column.
    Sparse: sample ``r`` is row ``r`` of the CSR (``data``, ``ind``, ``ptr``),
    whose columns index ``w`` (the round's compact problem, ``compact_rows``,
    or the whole table). ``touched``: the only entries of ``w``/``aw`` the
    samples can reach (a round's features over the whole table: the
    rescaling at the end, and at a reset of the scale, visits those only);
    empty: all of them."""
    n_w = w.shape[0]
    n_t = touched.shape[0]
    n_scaled = n_t if n_t > 0 else n_w  # the entries rescaled (see ``touched``)
    wscale = 1.0
    avg_a = 0.0
    avg_b = 1.0
    sq_norm = 0.0
    l1_norm = 0.0
    if keep:
        wscale = state[0]
        avg_a = state[1]
        avg_b = state[2]
        sq_norm = state[3]
        l1_norm = state[4]
    sumloss = 0.0
    objective = 0.0
    decay_prod = 1.0
    eta_sum = 0.0
    for i in range(rows.shape[0]):
        r = rows[i]
        # p = w . x + intercept
        acc = 0.0
        sqx = 0.0  # |x|^2, for the sample's own step (max_scale > 1 only)
        if dense:
            if scaled:
                for j in range(n_w):
                    z = float(X[r, j])
                    acc += w[j] * z
                    sqx += z * z
            else:
                for j in range(n_w):
                    acc += w[j] * X[r, j]
        else:
            if scaled:
                for jj in range(ptr[r], ptr[r + 1]):
                    z = float(data[jj])
                    acc += w[ind[jj]] * z
                    sqx += z * z
            else:
                for jj in range(ptr[r], ptr[r + 1]):
                    acc += w[ind[jj]] * data[jj]
        p = acc * wscale + intercept
        if learning_rate == OPTIMAL:
            eta = 1.0 / (alpha * (optimal_init + t - 1.0))
        elif learning_rate == INVSCALING:
            eta = eta0 / t**power_t
        yi = y[r]
        cw = cw_pos if yi > 0.0 else cw_neg
        eta_i = eta
        if scaled:
            eta_i = eta * _sample_scale(_own_step(thr, yi, p, eta * cw * sw[r] * sqx), max_scale)
        loss_value = _loss(thr, yi, p)
        sumloss += loss_value
        if keep:
            objective += loss_value
            if penalized:
                norm = math.sqrt(sq_norm)
                objective += alpha * ((1.0 - l1_ratio) * 0.5 * (norm * norm) + l1_ratio * l1_norm)
        if learning_rate == PA1 or learning_rate == PA2:
            sq = 0.0  # the sample's squared norm
            if dense:
                for j in range(n_w):
                    z = float(X[r, j])
                    sq += z * z
            else:
                for jj in range(ptr[r], ptr[r + 1]):
                    z = float(data[jj])
                    sq += z * z
            if learning_rate == PA1:
                if sq == 0.0:
                    continue  # as scikit-learn: skipped, t does not advance
                update = min(eta0, loss_value / sq)
            else:
                update = loss_value / (sq + 0.5 / eta0)
            if loss_id == 0:  # hinge or perceptron: classification
                update *= yi
            elif yi - p < 0.0:  # regression
                update *= -1.0
        else:
            dloss = _gradient(thr, yi, p)
            if dloss < -MAX_DLOSS:
                dloss = -MAX_DLOSS
            elif dloss > MAX_DLOSS:
                dloss = MAX_DLOSS
            update = -eta_i * dloss
        update *= cw * sw[r]
        eta_sum += eta_i
        if penalty >= L2:
            c = max(0.0, 1.0 - ((1.0 - l1_ratio) * eta_i * alpha))
            decay_prod *= c
            wscale *= c
            sq_norm *= c * c
            l1_norm *= abs(c)
            if wscale < wscale_min:  # reset_wscale
                if averaged:
                    for jt in range(n_scaled):  # scikit-learn's axpy, then scal by 1 / average_b
                        j = touched[jt] if n_t > 0 else jt
                        aw[j] = (aw[j] + avg_a * w[j]) * (1.0 / avg_b)
                    avg_a = 0.0
                    avg_b = 1.0
                for jt in range(n_scaled):
                    j = touched[jt] if n_t > 0 else jt
                    w[j] *= wscale
                wscale = 1.0
        if update != 0.0:
            cu = update / wscale
            acc2 = 0.0
            acc1 = 0.0
            if dense:
                for j in range(n_w):
                    w[j] += X[r, j] * cu
                    if keep:
                        acc2 += w[j] * w[j]
                        acc1 += abs(w[j])
            else:
                for jj in range(ptr[r], ptr[r + 1]):
                    w[ind[jj]] += data[jj] * cu
                    if keep:
                        acc2 += w[ind[jj]] * w[ind[jj]]
                        acc1 += abs(w[ind[jj]])
            if keep:  # WeightVector.add: the norms of the sample's features only
                sq_norm = acc2 * (wscale * wscale)
                l1_norm = acc1 * wscale
        if fit_intercept and update != 0.0:
            intercept += update * intercept_decay
        if averaged and 0 < average <= t + step - 1.0:
            # The average over the pass's iterates of all participants: this
            # sample's iterate stands for the ``step`` samples (of every
            # participant) around it. Alone (step 1): scikit-learn's 1 / num_iter.
            num_iter = t - average + step
            mu = step / num_iter if num_iter > step else 1.0
            if mu == 1.0 and not keep:
                # The average starts here: whatever a participant read (another's
                # start) is replaced by this iterate, as a lone fit's zeros are.
                for jt in range(n_scaled):
                    aw[touched[jt] if n_t > 0 else jt] = 0.0
                avg_a = 0.0
                avg_b = 1.0
                aintercept = 0.0
            ca = -update / wscale  # scikit-learn's order: (average_a * x) * (-c / wscale)
            if dense:
                for j in range(n_w):
                    aw[j] += avg_a * X[r, j] * ca
            else:
                for jj in range(ptr[r], ptr[r + 1]):
                    aw[ind[jj]] += avg_a * data[jj] * ca
            if num_iter > step:
                avg_b /= 1.0 - mu
            avg_a += mu * avg_b * wscale
            if num_iter > step:
                aintercept += (intercept - aintercept) * step / num_iter
            else:
                aintercept += intercept - aintercept
        if use_l1:
            u += l1_ratio * eta_i * alpha
            if dense:
                for j in range(n_w):
                    _l1(w, q, j, wscale, u)
            else:
                for jj in range(ptr[r], ptr[r + 1]):
                    _l1(w, q, ind[jj], wscale, u)
        t += step
    if keep:
        state[0] = wscale
        state[1] = avg_a
        state[2] = avg_b
        state[3] = sq_norm
        state[4] = l1_norm
        return intercept, aintercept, sumloss, decay_prod, eta_sum, u, objective
    if averaged:
        for jt in range(n_scaled):
            j = touched[jt] if n_t > 0 else jt
            aw[j] = (aw[j] + avg_a * w[j]) * (1.0 / avg_b)
    for jt in range(n_scaled):
        j = touched[jt] if n_t > 0 else jt
        w[j] *= wscale
    return intercept, aintercept, sumloss, decay_prod, eta_sum, u, objective


def _own_step(thr, y, p, step):
    """``_kernels.own_step``, compiled (``loss_id`` a constant of each
    copy, ``_OWN_STEPS``): the part of the way to the minimum of its own
    loss that a sample's step ``step = eta * cw * sw * |x|^2`` at
    scikit-learn's rate moves its margin ``p``."""
    if loss_id == 5:  # huber beyond epsilon: the gradient is bounded by it
        r = abs(y - p)
        if r > thr:
            return step * thr / r
    elif loss_id == 6:  # epsilon_insensitive: a unit gradient, |r| - epsilon to go
        r = abs(y - p) - thr
        if r > 0.0:
            return step / r
    elif loss_id == 7:  # squared_epsilon_insensitive: gradient 2 (|r| - epsilon)
        return 2.0 * step
    return step


_LOSSES = Specializations(_loss, cache=False, inline="always", error_model="numpy")
_GRADIENTS = Specializations(_gradient, cache=False, inline="always", error_model="numpy")
_OWN_STEPS = Specializations(_own_step, cache=False, inline="always", error_model="numpy")


def _round_constants(c):
    """The names of ``_sgd_round`` that follow from a specialization's
    constants: flags, and the loss and its gradient."""
    pa = c["learning_rate"] in (PA1, PA2)
    return {
        "_loss": _LOSSES.make(loss_id=c["loss_id"]),
        "_gradient": _GRADIENTS.make(loss_id=c["loss_id"]),
        "_own_step": _OWN_STEPS.make(loss_id=c["loss_id"]),
        "use_l1": c["penalty"] in (L1, ELASTICNET),
        # the passive-aggressive steps are not scaled
        "scaled": c["scaled"] and not pa,
        # scikit-learn adds the penalty to the objective except for the passive-aggressive rules
        "penalized": c["keep"] and c["penalty"] > 0 and not pa,
    }


_ROUND_KERNELS = {}  # sgd_round's by its arguments' case: a round of a few samples pays a lookup only
_ROUNDS = Specializations(_sgd_round, derive=_round_constants, name="sgd_round", nogil=True, error_model="numpy")


def round_kernel(dense, loss_id, penalty, learning_rate, averaged, keep, scaled):
    """The compiled ``_sgd_round`` of these constants (see ``sgd_round``)."""
    return _ROUNDS.make(dense=bool(dense), loss_id=int(loss_id), penalty=int(penalty),
                        learning_rate=int(learning_rate), averaged=bool(averaged), keep=bool(keep),
                        scaled=bool(scaled))


def sgd_round(dense, X, data, ind, ptr, rows, y, sw, w, aw, intercept, aintercept,
              loss_id, thr, penalty, alpha, l1_ratio, learning_rate, eta, eta0, power_t, optimal_init,
              fit_intercept, intercept_decay, cw_pos, cw_neg, average, t, step, wscale_min, q, u, max_scale,
              state, keep, touched):
    """``_sgd_round`` (see there), compiled for the case its arguments
    select: the data's layout (``dense``), ``loss_id``, ``penalty``,
    ``learning_rate``, averaging (``average > 0``), ``keep`` and the
    per-sample scaling (``max_scale > 1``), each case a kernel of its own
    (``round_kernel``; the types of the arrays, e.g. float32 or float64,
    select among its numba signatures as usual). One fit takes one case:
    its first call compiles that case only (issue 35), a third of the
    code."""
    key = (dense, loss_id, penalty, learning_rate, average > 0, keep, max_scale > 1.0)
    kernel = _ROUND_KERNELS.get(key)
    if kernel is None:
        kernel = _ROUND_KERNELS[key] = round_kernel(*key)
    return kernel(X, data, ind, ptr, rows, y, sw, w, aw, intercept, aintercept, thr, alpha, l1_ratio, eta, eta0,
                  power_t, optimal_init, fit_intercept, intercept_decay, cw_pos, cw_neg, average, t, step,
                  wscale_min, q, u, max_scale, state, touched)


@njit(inline="always", error_model="numpy")
def _sample_scale(own_step, max_scale):
    """``_kernels.sample_scale``, compiled: the factor of a sample's
    learning rate whose own step on its margin is ``own_step``."""
    if own_step * max_scale <= 1.0:
        return max_scale
    if own_step >= 1.0:
        return 1.0
    return 1.0 / own_step


@njit(inline="always", error_model="numpy")
def _l1(w, q, idx, wscale, u):
    z = w[idx]
    if wscale * z > 0.0:
        w[idx] = max(0.0, w[idx] - ((u + q[idx]) / wscale))
    elif wscale * z < 0.0:
        w[idx] = min(0.0, w[idx] + ((u - q[idx]) / wscale))
    q[idx] += wscale * (w[idx] - z)


@njit(inline="always")
def _popcount(x):
    """Set bits of a uint64 (the SWAR count: no popcount intrinsic in numba)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


def compact_rows(rows, data, ind, ptr, bits, rank, slot, out=None):
    """The round's compact problem: the features that the CSR rows ``rows``
    (distinct) touch (sorted), and those rows, in the order of ``rows``, as a CSR over
    these features only (``data``, ``indices``, ``indptr``), so that the
    kernel's accesses to the weights stay in the round's block.

    ``bits``: a zeroed uint64 bitmap over the features (``n_features // 64 +
    1`` words, left zeroed again), ``rank``: int32 scratch of the same
    length, ``slot``: int32 scratch over the CSR's rows, all -1 (left so).
    ``out``: ``(data, indices)`` arrays to write the CSR into where they are
    long enough (the results are then views of them).

    The row pointers are numpy's running sum of the rows' lengths, and every
    array is allocated here, by numpy, not in the kernel: numba compiles its
    own ``np.empty`` at a kernel's first compile in a process (0.1-0.15 s
    of CPU each, on a first fit's critical path: issue 35), and numpy asks
    for transparent huge pages for large arrays (``madvise``) where numba's
    allocator does not: a fit's rounds are first written here (about the
    size of the training CSR); with 4 KiB pages the first writes of 224 MB
    took 0.08 s of page faults (54k faults), with numpy's 0.015 s (522)."""
    n = rows.shape[0]
    cptr = np.empty(n + 1, dtype=np.int32)
    cptr[0] = 0
    np.cumsum(ptr[rows + 1] - ptr[rows], out=cptr[1:])
    nnz = int(cptr[-1])
    if out is not None and out[0].shape[0] >= nnz and out[0].dtype == data.dtype:
        cdata, cind = out[0][:nnz], out[1][:nnz]
    else:
        cdata = np.empty(nnz, dtype=data.dtype)
        cind = np.empty(nnz, dtype=np.int32)
    cols = _features_buffer(nnz, bits)
    m = _compact_fill(rows, data, ind, ptr, bits, rank, slot, cptr, cdata, cind, cols)
    return cols[:m].copy(), cdata, cind, cptr


def _features_buffer(nnz, bits):
    """Room for the touched features of ``nnz`` non-zeros over the bitmap
    ``bits``' features (``_set_bits`` writes them; the caller keeps a copy
    of those found: a round's features are kept with it)."""
    return np.empty(min(nnz, 64 * bits.shape[0]), dtype=np.int64)


@njit(nogil=True)
def _compact_fill(rows, data, ind, ptr, bits, rank, slot, cptr, cdata, cind, cols):
    """Fill ``compact_rows``' ``cdata``/``cind`` (row pointers ``cptr``) and
    write the sorted touched features into ``cols``; returns their number.

    The rows are read in storage order (each copied to its place in the
    output: ``slot[r]``, the place of CSR row ``r`` in ``rows``): read in
    the order of ``rows``, a random subset in random order, every row was a
    cache miss, and the copy took 25-40% longer. A row's features are
    marked in the bitmap as it is copied; a feature's new number is then
    the count of marked features before it, from ``rank`` (per word) and a
    popcount. The bitmap and the ranks are 1/32 of the features' size, so
    they stay in cache (a per-feature lookup table of 4-8 bytes misses the
    cache on every non-zero)."""
    first = ptr.shape[0] - 1
    last = -1
    for k in range(rows.shape[0]):
        r = rows[k]
        slot[r] = k
        if r < first:  # (not min/max: numba compiles its own on their first use, 0.03 s each)
            first = r
        if r > last:
            last = r
    for r in range(first, last + 1):  # the CSR's rows in storage order
        k = slot[r]
        if k < 0:
            continue
        slot[r] = -1
        o = cptr[k]
        for jj in range(ptr[r], ptr[r + 1]):
            c = ind[jj]
            bits[c >> 6] |= np.uint64(1) << np.uint64(c & 63)
            cdata[o] = data[jj]
            cind[o] = c
            o += 1
    m = 0
    for w in range(bits.shape[0]):
        rank[w] = m
        m += _popcount(bits[w])
    _set_bits(bits, cols)
    for o in range(cind.shape[0]):
        c = cind[o]
        w = c >> 6
        cind[o] = rank[w] + _popcount(bits[w] & ((np.uint64(1) << np.uint64(c & 63)) - np.uint64(1)))
    bits[:] = 0
    return m


@njit(nogil=True)
def _set_bits(bits, cols):
    """Write the positions of the set bits of the bitmap ``bits`` into
    ``cols`` (sorted); returns their number."""
    k = 0
    for w in range(bits.shape[0]):
        x = bits[w]
        while x != 0:
            low = x & (~x + np.uint64(1))  # the lowest set bit
            cols[k] = (w << 6) + _popcount(low - np.uint64(1))
            k += 1
            x ^= low
    return k


def round_features(rows, ind, ptr, bits, counts):
    """The features (sorted, int64) of the CSR rows ``rows``: a round's
    touched rows of the table, for a round trained in place over the whole
    table (``_round_prep``). ``bits``: a zeroed uint64 bitmap over the
    features, left zeroed. One read of the rows' indices, no copy of the
    rows (``compact_rows`` writes them out and renumbers them: 3x the CPU
    on the click-through benchmark's rounds). ``counts`` (one per feature,
    or empty): each feature found is counted there once (the lazy
    regularization's count of the rounds touching it; a numpy ``counts[f]
    += 1`` per round cost 12% of the count's CPU). The features are
    written into numpy's array (see ``compact_rows``), of room for the
    rows' non-zeros, and copied out."""
    cols = _features_buffer(int(ptr[rows + 1].sum() - ptr[rows].sum()), bits)
    m = _round_features(rows, ind, ptr, bits, counts, cols)
    return cols[:m].copy()


@njit(nogil=True)
def _round_features(rows, ind, ptr, bits, counts, cols):
    """``round_features``' marks and count: the features written into
    ``cols``, their number returned."""
    for i in range(rows.shape[0]):
        r = rows[i]
        for jj in range(ptr[r], ptr[r + 1]):
            c = ind[jj]
            bits[c >> 6] |= np.uint64(1) << np.uint64(c & 63)
    m = _set_bits(bits, cols)
    if counts.shape[0] > 0:
        for k in range(m):
            counts[cols[k]] += 1
    bits[:] = 0
    return m


@njit(nogil=True)
def scatter_rows(W, rows, values):
    """``W[rows] = values`` (a round's rows into the participant's copy of
    the whole table, ``_rounds._compiled_round``)."""
    for j in range(W.shape[1]):
        for i in range(rows.shape[0]):
            W[rows[i], j] = values[i, j]


@njit(nogil=True)
def gather_decayed(W, rows, counts, factors, scaled, out):
    """``out = W[rows]``, the rows but the last (the intercept's) of each
    column ``j`` where ``scaled[j]`` times ``factors[j, counts[i]]``: the
    lazy regularization of a round trained in place (``counts[i]``: the
    rounds touching row ``rows[i]``; ``_rounds._finish_in_place``). One
    pass instead of numpy's gather, ``1/q - 1``, power and product (0.44
    ms against 1.35 ms a round of 155k rows)."""
    n = rows.shape[0] - 1
    for j in range(W.shape[1]):
        if scaled[j]:
            for i in range(n):
                out[i, j] = W[rows[i], j] * factors[j, counts[i]]
        else:
            for i in range(n):
                out[i, j] = W[rows[i], j]
        out[n, j] = W[rows[n], j]
    return out


@njit(nogil=True)
def gather_rows(X, rows, out):
    """``out[i] = X[rows[i]]`` (``np.take`` with ``out`` may copy all of a
    read-only ``X`` first)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(X.shape[1]):
            out[i, j] = X[r, j]
    return out


@njit(nogil=True)
def sklearn_shuffle(ind, seed):
    """scikit-learn's ``SequentialDataset.shuffle(seed)`` of ``ind`` in
    place: a Fisher-Yates shuffle drawing from its 32-bit xorshift
    (``our_rand_r``; a zero seed is 1), the same permutation of ``ind``
    at each call with the same seed, as ``_plain_sgd`` shuffles its
    samples each epoch."""
    mask = 0xFFFFFFFF
    s = seed & mask
    if s == 0:
        s = 1
    n = ind.shape[0]
    for i in range(n - 1):
        s ^= (s << 13) & mask
        s ^= s >> 17
        s ^= (s << 5) & mask
        j = i + (s & 0x7FFFFFFF) % (n - i)
        tmp = ind[i]
        ind[i] = ind[j]
        ind[j] = tmp


def compiled_kernels() -> dict:
    """The specializations of ``sgd_round`` made so far in this process
    (their numba dispatchers), by name."""
    return {"sgd_round": _ROUNDS.dispatchers()}
