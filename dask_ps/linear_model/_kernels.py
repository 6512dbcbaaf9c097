"""The SGD rule as plain functions of arrays: losses, learning rates,
penalties, the array-API minibatch kernel (numpy or cupy), lazy
regularization, and the loss / penalty / learning-rate ids -- defined here
once; the compiled kernels (``_sgd_numba``) import them.

Values and formulas as in scikit-learn's ``_stochastic_gradient.py`` and
``_sgd_fast.pyx.tp``. Nothing here knows the client, the estimator or the
parameter server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

from dask_ps._estimators import arrays

# Values as in scikit-learn's _stochastic_gradient.py / _sgd_fast.pyx.tp.
PENALTY_TYPES = {"none": 0, "l1": 1, "l2": 2, "elasticnet": 3}
LEARNING_RATE_TYPES = {"constant": 1, "optimal": 2, "invscaling": 3, "adaptive": 4, "pa1": 5, "pa2": 6}
L1, L2, ELASTICNET = 1, 2, 3
CONSTANT, OPTIMAL, INVSCALING, ADAPTIVE, PA1, PA2 = 1, 2, 3, 4, 5, 6
# Loss ids of the compiled kernel; its ``thr`` is the hinge threshold or the epsilon.
LOSS_IDS = {
    "hinge": 0, "perceptron": 0, "squared_hinge": 1, "log_loss": 2, "modified_huber": 3,
    "squared_error": 4, "huber": 5, "epsilon_insensitive": 6, "squared_epsilon_insensitive": 7,
}
HINGE_THRESHOLDS = {"hinge": 1.0, "perceptron": 0.0, "squared_hinge": 1.0}
MAX_DLOSS = 1e12
SPARSE_INTERCEPT_DECAY = 0.01
MAX_INT = np.iinfo(np.int32).max
EPSILON_LOSSES = ("huber", "epsilon_insensitive", "squared_epsilon_insensitive")


# --- losses (y encoded as scikit-learn does: {0, 1} for log_loss, {-1, +1} for the
# other classification losses) ------------------------------------------------------------


def _expit(p, xp):
    e = xp.exp(-xp.abs(p))
    return xp.where(p >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _loss_value(loss, y, p, epsilon, xp):
    """Per-sample loss ``L(y, p)`` as scikit-learn's ``cy_loss``."""
    if loss in ("hinge", "perceptron"):
        thr = 1.0 if loss == "hinge" else 0.0
        return xp.maximum(thr - p * y, 0.0)
    if loss == "squared_hinge":
        z = xp.maximum(1.0 - p * y, 0.0)
        return z * z
    if loss == "log_loss":
        return xp.logaddexp(0.0, p) - y * p
    if loss == "modified_huber":
        z = p * y
        return xp.where(z >= 1.0, 0.0, xp.where(z >= -1.0, (1.0 - z) ** 2, -4.0 * z))
    if loss == "squared_error":
        return 0.5 * (y - p) ** 2
    if loss == "huber":
        r = xp.abs(y - p)
        return xp.where(r <= epsilon, 0.5 * r * r, epsilon * (r - 0.5 * epsilon))
    if loss == "epsilon_insensitive":
        return xp.maximum(xp.abs(y - p) - epsilon, 0.0)
    if loss == "squared_epsilon_insensitive":
        return xp.maximum(xp.abs(y - p) - epsilon, 0.0) ** 2
    raise ValueError(f"unknown loss {loss!r}")


def _loss_gradient(loss, y, p, epsilon, xp):
    """``dL/dp`` as scikit-learn's ``cy_gradient``."""
    if loss in ("hinge", "perceptron"):
        thr = 1.0 if loss == "hinge" else 0.0
        return xp.where(p * y <= thr, -y, 0.0)
    if loss == "squared_hinge":
        z = 1.0 - p * y
        return xp.where(z > 0, -2.0 * y * z, 0.0)
    if loss == "log_loss":
        return _expit(p, xp) - y
    if loss == "modified_huber":
        z = p * y
        return xp.where(z >= 1.0, 0.0, xp.where(z >= -1.0, 2.0 * (1.0 - z) * -y, -4.0 * y))
    if loss == "squared_error":
        return p - y
    if loss == "huber":
        r = p - y
        return xp.where(xp.abs(r) <= epsilon, r, xp.where(r >= 0, epsilon, -epsilon))
    if loss == "epsilon_insensitive":
        return xp.where(y - p > epsilon, -1.0, xp.where(p - y > epsilon, 1.0, 0.0))
    if loss == "squared_epsilon_insensitive":
        z = y - p
        return xp.where(z > epsilon, -2.0 * (z - epsilon), xp.where(z < -epsilon, 2.0 * (-z - epsilon), 0.0))
    raise ValueError(f"unknown loss {loss!r}")


# --- hyper-parameters as plain values (what the kernels and participants receive) ---------


@dataclass(frozen=True)
class _Hyper:
    loss: str
    epsilon: float
    penalty: int
    alpha: float
    l1_ratio: float  # effective: 0 for l2/none, 1 for l1
    learning_rate: int
    eta0: float
    power_t: float
    fit_intercept: bool
    average: int  # 0: off; else averaging starts at sample t >= average
    n_outputs: int  # K one-vs-rest problems (1 for binary and regression)
    tol: float  # -inf: never stop on no improvement
    n_iter_no_change: int
    early_stopping: bool
    validation_fraction: float
    shuffle: bool
    classifier: bool
    # The most a sample's learning rate is scaled by: ``P`` with ``P``
    # participants (``sample_scale``), 1 alone.
    eta_scale: float = 1.0

    @property
    def log_encoded(self) -> bool:
        return self.loss == "log_loss"

    def optimal_init(self) -> float:
        """scikit-learn's ``optimal_init`` (``_plain_sgd``): ``eta`` at the first
        sample is ``typw / max(1, dloss(1, -typw))``, ``typw = sqrt(1/sqrt(alpha))``."""
        typw = math.sqrt(1.0 / math.sqrt(self.alpha))
        g = float(_loss_gradient(self.loss, np.float64(1.0), np.float64(-typw), self.epsilon, np))
        initial_eta0 = typw / max(1.0, g)
        return 1.0 / (initial_eta0 * self.alpha)


def _learning_rates(hp: _Hyper, ts, eta_k, xp):
    """scikit-learn's per-sample, per-output learning rates at global sample
    counts ``ts``: (n, K)."""
    n = ts.shape[0]
    if hp.learning_rate == OPTIMAL:
        eta = 1.0 / (hp.alpha * (hp.optimal_init() + ts - 1.0))
    elif hp.learning_rate == INVSCALING:
        eta = hp.eta0 / ts**hp.power_t
    elif hp.learning_rate == ADAPTIVE:
        return xp.broadcast_to(xp.asarray(eta_k)[None, :], (n, hp.n_outputs))
    else:  # constant; pa1, pa2: eta0 is C, not a rate
        eta = xp.full(n, hp.eta0)
    return xp.broadcast_to(eta[:, None], (n, hp.n_outputs))


def sample_scale(own_step, max_scale, xp=np):
    """The factor of a sample's learning rate with ``max_scale = P``
    participants whose table is the mean of their models (docs/architecture.rst,
    "Estimators: SGD"): ``f = min(P, max(1, 1 / s))``, ``s`` the sample's own
    step at scikit-learn's rate: the part of the way to its own loss's
    minimum that it moves its margin (``own_step``; ``eta * cw * sw * |x|^2``
    where the gradient is the residual).

    A sample whose step moves its margin little (``P s <= 1``) makes, in
    the mean of ``P`` models, ``1/P`` of its step: it trains at ``P`` times
    scikit-learn's rate, so that the mean moves by its full step (to first
    order, a sequential pass). A sample whose own step already fits it
    (``s >= 1``) trains at scikit-learn's rate: a larger one overshoots its
    margin and diverges. Between, ``1/s``: the local step on the margin is
    at most 1 (never more than scikit-learn's own). Per sample, so a long
    row in a set of short ones is bounded by its own norm, not the mean's."""
    s = xp.asarray(own_step, dtype=np.float64)
    return xp.where(s * max_scale <= 1.0, max_scale, xp.where(s >= 1.0, 1.0, 1.0 / xp.maximum(s, 1e-300)))


def own_step(hp: _Hyper, step, Y, p, xp=np):
    """The part of the way to the minimum of its own loss that a sample's
    step at scikit-learn's rate moves its margin ``p``, from ``step = eta *
    cw * sw * |x|^2`` (what it moves ``p`` per unit of gradient): ``step``
    where the gradient is the residual (squared_error, huber within
    epsilon, the classification losses as they are); huber beyond epsilon,
    whose gradient is bounded by epsilon, ``step * epsilon / |y - p|``;
    epsilon_insensitive, a unit gradient with ``|y - p| - epsilon`` to go,
    ``step / (|y - p| - epsilon)``; squared_epsilon_insensitive, gradient
    ``2 (|y - p| - epsilon)``, ``2 step``. A step-limited loss's sample far
    from its target is thus not held to a rate its bounded gradient could
    never overshoot with (compiled: ``_sgd_numba._own_step``)."""
    step = xp.asarray(step, dtype=np.float64)
    if hp.loss == "squared_epsilon_insensitive":
        return 2.0 * step
    if hp.loss not in ("huber", "epsilon_insensitive"):
        return step
    r = xp.abs(Y - p)
    if hp.loss == "huber":
        return xp.where(r > hp.epsilon, step * hp.epsilon / xp.maximum(r, 1e-300), step)
    go = r - hp.epsilon
    return xp.where(go > 0.0, step / xp.where(go > 0.0, go, 1.0), step)


def rate_sum(hp: _Hyper, t0, n, step, eta):
    """scikit-learn's learning rates summed over ``n`` samples from the
    global count ``t0`` on, ``step`` apart (``eta``: the constant or
    adaptive rate): what a round's rates sum to unscaled."""
    if n <= 0:
        return 0.0
    if hp.learning_rate not in (OPTIMAL, INVSCALING):
        return float(n * eta)
    ts = t0 + np.arange(n, dtype=np.float64) * step
    if hp.learning_rate == OPTIMAL:
        return float(np.sum(1.0 / (hp.alpha * (hp.optimal_init() + ts - 1.0))))
    return float(np.sum(hp.eta0 / ts**hp.power_t))


def _row_sq_norms(X, xp):
    if sp.issparse(X) or hasattr(X, "multiply"):
        return xp.asarray(X.multiply(X).sum(axis=1)).ravel()
    return xp.sum(X * X, axis=1)


def sample_etas(hp: _Hyper, ts, eta_k, X, Y, sw, cw_pos, cw_neg, xp, p):
    """The learning rates a minibatch trains with: scikit-learn's, each
    sample's times its ``sample_scale`` (with several participants) of its
    ``own_step`` at its decision value ``p``: (n, K)."""
    etas = _learning_rates(hp, ts, eta_k, xp)
    if hp.eta_scale <= 1.0 or hp.learning_rate in (PA1, PA2):
        return etas
    cw = xp.where(Y > 0, xp.asarray(cw_pos)[None, :], xp.asarray(cw_neg)[None, :])
    own = own_step(hp, etas * cw * (sw * _row_sq_norms(X, xp))[:, None], Y, p, xp)
    return etas * sample_scale(own, float(hp.eta_scale), xp)


def _l2_decay(hp: _Hyper, etas, xp):
    """Product over the minibatch of scikit-learn's per-sample weight decay
    ``max(0, 1 - (1 - l1_ratio) * eta * alpha)``: shape (K,)."""
    if hp.penalty < L2:
        return xp.ones(etas.shape[1])
    f = xp.maximum(0.0, 1.0 - (1.0 - hp.l1_ratio) * etas * hp.alpha)
    return xp.prod(f, axis=0)


# --- the minibatch kernel: one minibatch, a pure function of arrays ------------------------
#
# W: (d + 1, K) weights of the minibatch's features (last row: intercepts),
# A: the same for the averaged weights (or None), X: (b, d) dense or CSR with
# column j meaning row j of W, Y: (b, K) encoded targets, sw: (b,) sample
# weights, cw_pos/cw_neg: (K,) class weights, ts: (b,) global sample counts,
# eta_k: (K,) current adaptive learning rates, active: (K,) bool.
# It returns new (W, A) arrays; the caller pushes the differences.


def _decision(W, X, xp):
    d = W.shape[0] - 1
    return X @ W[:d] + W[d]


def _batch_loss(hp: _Hyper, W, X, Y, xp):
    """Sum over the minibatch of the (unweighted) loss at the pulled weights: (K,).
    scikit-learn's stopping rule uses the same unweighted per-sample loss."""
    p = _decision(W, X, xp)
    return xp.sum(_loss_value(hp.loss, Y, p, hp.epsilon, xp), axis=0)


# A regressor's cut minibatch (``_minibatch_kernel``) is trained again in at
# most this many chunks: 16 gave the quick sweep's regressors their
# scikit-learn scores at P = 1 (4 and 8 left 1-2 cells bad), at most 17
# steps a cut minibatch.
MAX_CHUNKS = 16
# Regressors only: a regressor's cut sum lost 0.05-0.10 of R^2 where its
# samples' own steps are not small. A classifier's cut sum scored at or above
# scikit-learn's worst seed in every cell, and in chunks its fits cost up to
# 17x the steps and scored lower, nearer scikit-learn's (dense hinge at the
# optimal rate: every minibatch cut; 0.739 -> 0.685, scikit-learn 0.60-0.70;
# text classifiers with squared_error or huber losses 7x the time).


def _minibatch_kernel(hp: _Hyper, W, A, X, Y, sw, cw_pos, cw_neg, ts, eta_k, active, intercept_decay,
                      etas=None, step=1.0):
    """Array-API minibatch step (numpy or cupy): the sum of scikit-learn's
    per-sample updates evaluated at ``W``, at the rates ``etas``
    (``sample_etas``; default: scikit-learn's); each sample stands for
    ``step`` global samples (the average's weights).

    Where a regressor's sum had to be cut (``_without_overshoot``: a
    fraction ``c`` < 1 of it, the samples' own steps not small), the
    minibatch is trained again from ``W`` as consecutive chunks of
    ``c x its size`` samples (at least 1 and a ``MAX_CHUNKS``-th of it),
    each a step of its own: nearer scikit-learn's sequential pass than the
    cut sum, which made a fraction of one step's progress (raw word counts
    at ``constant`` 0.01: R^2 0.50 against scikit-learn's 0.55-0.60 on 4
    participants, issue 33). A step taken whole, and a classifier's, is
    returned as it was, bit for bit."""
    xp = arrays.namespace(W)
    if etas is None:
        p = _decision(W, X, xp)
        etas = sample_etas(hp, ts, eta_k, X, Y, sw, cw_pos, cw_neg, xp, p)
    new, new_a, c = _minibatch_once(hp, W, A, X, Y, sw, cw_pos, cw_neg, ts, eta_k, active, intercept_decay, etas,
                                    step)
    B = X.shape[0]
    if c >= 1.0 or B == 1 or hp.classifier:
        return new, new_a
    size = max(1, int(B * c), -(-B // MAX_CHUNKS))
    new, new_a = W, A
    for a in range(0, B, size):
        b = min(B, a + size)
        new, new_a, _ = _minibatch_once(hp, new, new_a, X[a:b], Y[a:b], sw[a:b], cw_pos, cw_neg, ts[a:b], eta_k,
                                        active, intercept_decay, etas[a:b], step)
    return new, new_a


def _minibatch_once(hp: _Hyper, W, A, X, Y, sw, cw_pos, cw_neg, ts, eta_k, active, intercept_decay, etas, step):
    """One step of the minibatch (``_minibatch_kernel``): the new weights,
    the new averages and the fraction of the summed step taken (the least
    over the active outputs)."""
    xp = arrays.namespace(W)
    d = W.shape[0] - 1
    act = xp.asarray(active)
    p = _decision(W, X, xp)
    if hp.learning_rate in (PA1, PA2):
        sq = _row_sq_norms(X, xp)
        lv = _loss_value(hp.loss, Y, p, hp.epsilon, xp)
        if hp.learning_rate == PA1:
            safe = xp.where(sq == 0, 1.0, sq)[:, None]
            upd = xp.where(sq[:, None] == 0, 0.0, xp.minimum(hp.eta0, lv / safe))
        else:
            upd = lv / (sq[:, None] + 0.5 / hp.eta0)
        if hp.loss in ("hinge", "perceptron"):
            upd = upd * Y
        else:
            upd = xp.where(Y - p < 0, -upd, upd)
    else:
        g = xp.clip(_loss_gradient(hp.loss, Y, p, hp.epsilon, xp), -MAX_DLOSS, MAX_DLOSS)
        upd = -etas * g
    cw = xp.where(Y > 0, xp.asarray(cw_pos)[None, :], xp.asarray(cw_neg)[None, :])
    upd = upd * cw * sw[:, None] * act[None, :]
    decay = xp.where(act, _l2_decay(hp, etas, xp), 1.0)
    coef = W[:d] * decay[None, :] + X.T @ upd
    if hp.penalty in (L1, ELASTICNET):
        # Proximal step for the L1 part of the penalty accrued over the minibatch.
        u = hp.l1_ratio * hp.alpha * xp.sum(etas, axis=0) * act
        coef = xp.sign(coef) * xp.maximum(xp.abs(coef) - u[None, :], 0.0)
    new = xp.empty_like(W)
    new[:d] = coef
    new[d] = W[d] + (xp.sum(upd, axis=0) * intercept_decay if hp.fit_intercept else 0.0)
    c = 1.0
    if hp.loss != "perceptron":  # its objective is least at w = 0: no minimum along a step to go past
        new, c = _without_overshoot(hp, W, new, X, Y, sw, cw, p, act, xp)
    new_a = None
    if A is not None:
        # Averaging from sample t >= average: avg += (w - avg) * step / num_iter
        # per sample (num_iter = t - average + step: the sample stands for
        # ``step`` of all participants'), with w taken at the end of the minibatch.
        num = ts - hp.average + step
        keep = xp.prod(xp.where(num >= 1.0, 1.0 - step / xp.maximum(num, step), 1.0))
        frac = (1.0 - keep) * act
        new_a = A + (new - A) * frac[None, :]
    return new, new_a, c


# The fractions of a minibatch's step tried (_without_overshoot): 1, 1/2, ..., 2^-29; none passing: no step.
FRACTIONS = 0.5 ** np.arange(30)


def _penalty_along(hp: _Hyper, W, step, c, xp):
    """scikit-learn's penalty at ``W + c step`` for each fraction of ``c``: (len(c), K).
    Its L2 part is a quadratic in ``c`` (three sums over the weights)."""
    if hp.penalty == 0:
        return xp.zeros((c.shape[0], W.shape[1]))
    d = W.shape[0] - 1
    w, dw = W[:d], step[:d]
    cc = c[:, None]
    l2 = 0.5 * (xp.sum(w * w, axis=0) + 2.0 * cc * xp.sum(w * dw, axis=0) + cc * cc * xp.sum(dw * dw, axis=0))
    out = (1.0 - hp.l1_ratio) * l2
    if hp.l1_ratio > 0:
        out = out + hp.l1_ratio * xp.sum(xp.abs(w[None] + c[:, None, None] * dw[None]), axis=1)
    return hp.alpha * out


def _penalty_slope(hp: _Hyper, W, step, xp):
    """The directional derivative of scikit-learn's penalty at ``W`` along ``step``: (K,)."""
    if hp.penalty == 0:
        return xp.zeros(W.shape[1])
    d = W.shape[0] - 1
    w, dw = W[:d], step[:d]
    l1 = xp.where(w != 0, xp.sign(w) * dw, xp.abs(dw))
    return hp.alpha * ((1.0 - hp.l1_ratio) * xp.sum(w * dw, axis=0) + hp.l1_ratio * xp.sum(l1, axis=0))


def _without_overshoot(hp: _Hyper, W, new, X, Y, sw, cw, p, active, xp):
    """``new`` or, per output, the largest ``2^-k`` of the step ``new - W``
    that does not go past the minimum of the minibatch's objective along it.

    The minibatch step sums its samples' updates evaluated at ``W``. Where
    each sample's step is small that is a sequential pass to first order;
    where the samples' rows point the same way and their own steps are not
    small (dense rows with a common offset, raw word counts at a constant
    rate) the sum moves the margins up to ``batch_size`` times past where a
    sequential pass would: on 8,000 text rows at ``constant`` 0.01 the fit
    diverged (R^2 -6.6e23 where scikit-learn gets 0.55; issue 33). So the
    step's fraction is the largest of :data:`FRACTIONS` at which the
    objective (the samples' weighted losses plus the penalty each) falls by
    at least half of what the step's slope promises (Armijo's rule with
    1/2: on a quadratic, the fractions that stop at or before the minimum
    along the step). A step whose whole passes is taken as it was, bit for
    bit. Cost: the margins' change (one more product with the minibatch's
    rows; the margins move linearly with the fraction), the losses at the
    whole step and one flag to the host; where that fails, the losses at
    every fraction at once."""
    B = X.shape[0]
    wts = cw * sw[:, None]
    step = new - W
    dp = _decision(new, X, xp) - p
    c = xp.asarray(FRACTIONS)
    slope = (xp.sum(_loss_gradient(hp.loss, Y, p, hp.epsilon, xp) * wts * dp, axis=0)
             + B * _penalty_slope(hp, W, step, xp))
    base = xp.sum(_loss_value(hp.loss, Y, p, hp.epsilon, xp) * wts, axis=0) + B * _penalty_value(hp, W, xp)
    tol = 1e-12 * xp.abs(base)
    act = xp.asarray(active, dtype=bool)
    whole = xp.sum(_loss_value(hp.loss, Y, p + dp, hp.epsilon, xp) * wts, axis=0) + B * _penalty_value(hp, new, xp)
    if not bool(xp.any((whole > base + 0.5 * slope + tol) & act)):
        return new, 1.0  # the common case (small steps): one look, then the step as it was
    moved = p[None] + c[:, None, None] * dp[None]
    obj = xp.sum(_loss_value(hp.loss, Y[None], moved, hp.epsilon, xp) * wts[None], axis=1) \
        + B * _penalty_along(hp, W, step, c, xp)
    ok = (obj <= base + 0.5 * c[:, None] * slope + tol) | ~act[None, :]  # (fractions, K)
    scale = xp.where(xp.any(ok, axis=0), c[xp.argmax(ok, axis=0)], 0.0)  # the first (largest) that passes
    least = float(xp.min(xp.where(act, scale, 1.0)))
    return xp.where(scale[None, :] == 1.0, new, W + step * scale[None, :]), least


def _penalty_value(hp: _Hyper, W, xp):
    """scikit-learn's per-sample penalty term of the objective: (K,)."""
    if hp.penalty == 0:
        return xp.zeros(hp.n_outputs)
    d = W.shape[0] - 1
    w = W[:d, : hp.n_outputs]
    return hp.alpha * ((1.0 - hp.l1_ratio) * 0.5 * xp.sum(w * w, axis=0) + hp.l1_ratio * xp.sum(xp.abs(w), axis=0))


# --- lazy regularization of sparse rows ----------------------------------------------------


def _lazy_inv_q(counts, n, m):
    """``1/q`` per feature for lazy regularization (1 where ``q = 0``):
    ``q`` = the probability that a group of ``m`` of the ``n`` samples (the
    groups of an epoch partition a shuffle of the samples) holds one of the
    ``counts[f]`` samples that have feature ``f``; hypergeometric, so a
    group of all samples touches every feature it has (``q = 1``: no
    correction -- one group per epoch *is* scikit-learn's regularization)."""
    counts = np.asarray(counts, dtype=np.float64)
    if n <= 0:
        return np.ones_like(counts)
    m = min(max(float(m), 1.0), float(n))
    rest = n - counts  # samples without the feature
    with np.errstate(invalid="ignore"):
        log_miss = gammaln(rest + 1) - gammaln(rest - m + 1) - gammaln(n + 1) + gammaln(n - m + 1)
    miss = np.where(rest >= m, np.exp(np.minimum(log_miss, 0.0)), 0.0)
    q = 1.0 - miss
    return np.where(q > 0, 1.0 / np.maximum(q, 1e-300), 1.0)


def _unique_inverse(idx, stamp, lookup, xp):
    """``np.unique(idx, return_inverse=True)`` without the sort, in O(len(idx)),
    the unique values in order of first appearance; ``stamp``/``lookup`` are
    scratch arrays indexed by the values (never cleared: every slot read was
    written for these ``idx``)."""
    if xp is not np:  # a GPU scatter has no "last write wins" order: sort
        uniq, inv = xp.unique(idx, return_inverse=True)
        return uniq, inv.astype(np.int32).ravel()
    pos = xp.arange(idx.shape[0], dtype=np.int64)
    stamp[idx[::-1]] = pos[::-1]  # the first occurrence wins
    first = stamp[idx] == pos
    uniq = idx[first]
    lookup[uniq] = xp.arange(uniq.shape[0], dtype=np.int32)
    return uniq, lookup[idx]


def _lazy_regularization(hp, new, inv_q, etas, active, xp):
    """Give the rows a sparse minibatch touched the regularization of the
    minibatches that did not touch them (see ``_sgd_participant``), at the
    minibatch's rates ``etas`` (``sample_etas``)."""
    d = new.shape[0] - 1
    extra = xp.asarray(inv_q - 1.0)[:, None]  # (d, 1), >= 0
    act = xp.asarray(active)[None, :]
    coef = new[:d]
    if hp.penalty >= L2:
        decay = _l2_decay(hp, etas, xp)[None, :]  # (1, K)
        coef = coef * xp.where(act, decay**extra, 1.0)
    if hp.penalty in (L1, ELASTICNET):
        u = (hp.l1_ratio * hp.alpha * xp.sum(etas, axis=0))[None, :] * extra * act
        coef = xp.sign(coef) * xp.maximum(xp.abs(coef) - u, 0.0)
    out = new.copy()
    out[:d] = coef
    return out


def compact_rows_xp(Xg, d, xp):
    """``_sgd_numba.compact_rows`` for any array module (numpy or cupy
    CSR): the features that the rows ``Xg`` touch (sorted, as int64 numpy),
    and the rows with their columns renumbered to positions in that list --
    a mark and a lookup table over the ``d`` features: O(nnz + d), no sort;
    a table of more than 4 features per non-zero (hashed features: 2^28
    columns) sorts the non-zeros' features instead (O(nnz log nnz), no
    memory per feature of the table)."""
    if d > 4 * Xg.indices.shape[0]:
        cols, inverse = xp.unique(Xg.indices, return_inverse=True)
        cols_np = arrays.to_numpy(cols).astype(np.int64)
        compact = type(Xg)((Xg.data, inverse.reshape(-1).astype(np.int32), Xg.indptr),
                           shape=(Xg.shape[0], cols_np.shape[0]))
        return cols_np, compact
    touched = xp.zeros(d, dtype=bool)
    touched[Xg.indices] = True
    cols = xp.flatnonzero(touched)
    lookup = xp.empty(d, dtype=np.int32)
    lookup[cols] = xp.arange(cols.shape[0], dtype=np.int32)
    cols_np = arrays.to_numpy(cols).astype(np.int64)
    compact = type(Xg)((Xg.data, lookup[Xg.indices], Xg.indptr), shape=(Xg.shape[0], cols_np.shape[0]))
    return cols_np, compact


def stop_decision(k, value, best, no_improvement, eta, active, early_stopping, tol, n_iter_no_change,
                  adaptive) -> None:
    """scikit-learn's stopping rule (``_plain_sgd``) after an epoch of
    problem ``k`` whose objective (or, with ``early_stopping``, validation
    score) is ``value``: no improvement by ``tol`` for ``n_iter_no_change``
    epochs stops the problem (``active[k] = False``), or with the
    'adaptive' rate first divides its ``eta`` by 5. Updates ``best``,
    ``no_improvement``, ``eta`` and ``active`` in place.

    Plain Python, used as it is by ``StopRule`` and compiled into
    a lone participant's loop over its epochs (``_sgd_numba.lone_epochs``):
    one rule."""
    if early_stopping:
        worse = tol > -math.inf and value < best[k] + tol
        if value > best[k]:
            best[k] = value
    else:
        worse = tol > -math.inf and value > best[k] - tol
        if value < best[k]:
            best[k] = value
    if worse:
        no_improvement[k] += 1
    else:
        no_improvement[k] = 0
    if no_improvement[k] >= n_iter_no_change:
        if adaptive and eta[k] > 1e-6:
            eta[k] = eta[k] / 5.0
            no_improvement[k] = 0
        else:
            active[k] = False


def check_finite(W, epoch) -> None:
    """Raise scikit-learn's error when training produced NaN or Inf weights."""
    if not arrays.all_finite(W):
        raise ValueError(
            "Floating-point under-/overflow occurred at epoch #%d. Scaling input data "
            "with StandardScaler or MinMaxScaler might help." % (epoch + 1)
        )


class StopRule:
    """scikit-learn's stopping rule, per one-vs-rest problem: no improvement of
    the objective (or validation score) by ``tol`` for ``n_iter_no_change``
    epochs stops the problem ('adaptive' first divides eta by 5)."""

    def __init__(self, hp: _Hyper, eta_init):
        K = hp.n_outputs
        self.hp = hp
        self.best = np.full(K, np.inf if not hp.early_stopping else -np.inf)
        self.no_improvement = np.zeros(K, dtype=int)
        self.eta = np.array(eta_init, dtype=float)
        self.active = np.ones(K, dtype=bool)
        self.n_iter = np.zeros(K, dtype=int)  # epochs trained, per problem
        self.last_decided = -1  # the last epoch whose objective was accounted

    def get_state(self) -> dict:
        """Plain (JSON-able) state: carried between the runs of a chunked fit
        and stored in checkpoints. Infinite values as strings."""
        return {
            "best": [float(v) if np.isfinite(v) else str(float(v)) for v in self.best],
            "no_improvement": [int(v) for v in self.no_improvement],
            "eta": [float(v) for v in self.eta],
            "active": [bool(v) for v in self.active],
            "n_iter": [int(v) for v in self.n_iter],
            "last_decided": int(self.last_decided),
        }

    def set_state(self, state: dict) -> None:
        self.best = np.array([float(v) for v in state["best"]], dtype=float)
        self.no_improvement = np.array(state["no_improvement"], dtype=int)
        self.eta = np.array(state["eta"], dtype=float)
        self.active = np.array(state["active"], dtype=bool)
        self.n_iter = np.array(state["n_iter"], dtype=int)
        self.last_decided = int(state["last_decided"])

    def update(self, objective, score) -> None:
        """Account one epoch's objective (or validation score) per problem."""
        hp = self.hp
        values = score if hp.early_stopping else objective
        for k in np.flatnonzero(self.active):
            stop_decision(k, values[k], self.best, self.no_improvement, self.eta, self.active, hp.early_stopping,
                          hp.tol, hp.n_iter_no_change, hp.learning_rate == ADAPTIVE)
