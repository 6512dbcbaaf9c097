"""``SGDClassifier`` and ``SGDRegressor`` trained on the parameter server.

The estimators are written against the public :class:`dask_ps.ParameterServer`
API only -- ``create_table``, ``run``, ``pull``, ``drop_table`` on the client
and, inside a participant, ``ctx.pull``/``ctx.pull_rows``,
``ctx.push``/``ctx.push_rows`` and ``ctx.clock()`` -- which is the point of
them (DESIGN.md: "the estimators are the proof that the abstraction holds").

How a fit runs
--------------
One weights table of shape ``(n_features + 1, n_cols)`` holds every output:
row ``j < n_features`` is feature ``j``, the last row is the intercept, and
the columns are the ``K`` one-vs-rest problems (``K = 1`` for binary and
regression), followed by ``K`` columns of averaged weights when
``average`` is set. Rows are features so that a sparse minibatch pulls and
pushes only the rows of the features it touches (``pull_rows``/``push_rows``).

Each participant (one per worker holding data; one in all for inputs under
``ps.sgd.min-samples-per-participant`` samples) works in *rounds* of about
``ps.sgd.clock-samples`` samples: pull the weights the round needs (all rows
for dense data, the touched rows for sparse data), run the round's
minibatches on that local copy with scikit-learn's per-sample rule, push
``1/P`` of the round's change, ``clock()``. This is local SGD with model
averaging: once every participant pushed, the table holds the mean of their
models. Summing the full changes instead (the plain "sum of gradients" of
asynchronous SGD) over-corrects at scikit-learn's step sizes, where each
local run fits its own data: two participants syncing every 4096 samples
reached 0.60 test accuracy on make_classification where scikit-learn reaches
0.79; averaging reaches 0.80 at any sync interval. A lone participant keeps
the table local (one pull, one push).

The learning-rate schedules use a global sample counter ``t`` (as
scikit-learn's ``t_``), advanced by all participants' samples, so
``optimal``/``invscaling`` decay as in one process; with one participant and
``shuffle=False`` a fit *is* scikit-learn's (tested).

On numpy data (``ps.sgd.compiled``, where numba imports; not the
passive-aggressive rules) a round is one call of ``_sgd_numba.sgd_round``:
scikit-learn's per-sample rule compiled, over the round's rows (dense: gathered
in ~2 MiB chunks; sparse: the round compacted to a CSR over its touched
rows), with the loss of each sample at the weights it trains from; sparse
rows the round missed get its regularization lazily, per round. Sparse
rounds are fixed per fit (``_epoch_rounds``): later epochs reshuffle the
order of the rounds and of the samples inside each, not all samples, so a
round's compacted CSR is built once and kept (``ps.sgd.round-cache-bytes``;
about the size of the participant's CSR). Otherwise
two kernels compute a minibatch's update (pure functions of arrays):

- ``sequential`` (numpy data, the default on CPU): scikit-learn's own Cython
  kernel (``_plain_sgd``) over the minibatch, one sample at a time, starting
  from the local weights.
- ``minibatch`` (array-API code, numpy or cupy, the default for cupy data):
  the sum over the minibatch of scikit-learn's per-sample updates
  (``-eta_t * dloss * x``), all evaluated at the minibatch's starting
  weights, with the L2 decay of the same samples and a proximal L1 step.

Sparse data: a minibatch decays (L2) and shrinks (L1) only the rows it
touches; a touched row gets the regularization of the minibatches that
missed it, ``1/q`` times (``q`` = how often a minibatch touches the feature)
-- lazy regularization, unbiased in log-scale. The L1 cumulative penalty
(Tsuruoka et al.) restarts at each kernel call.

Stopping (``tol``/``n_iter_no_change``/``early_stopping``) is decided from
the objective summed over all participants: each pushes its epoch's sums to
a small stats table and reads the total once it is complete under the
table's staleness bound (``lag`` epochs later, see ``_end_epoch``), so all
participants take the same decision at the same clock without waiting for
each other. Under ASP/VAP (no staleness bound) each participant decides on
its own part.

Failures and checkpoints
------------------------
A participant that Dask retries (its worker died) resumes at
``ctx.current_clock``: clocks map to (epoch, round), the RNG replays the
shuffles of the epochs done, and the stopping decisions are re-read from the
stats table, to which every round pushes its loss sums (``_participant_loop``
says what is and is not exact). With ``replication=k`` the tables have ``k``
copies and an in-memory input is scattered to ``k`` workers
(``_memory_parts``), so the retried participant finds both. ``checkpoint``
makes ``fit`` train in runs of ``checkpoint_every`` epochs, carrying each
participant's stopping-rule and RNG state from one run to the next, and
``ParameterServer.save`` the tables after each run; a ``fit`` that finds a
compatible checkpoint resumes from it (``_BaseSGDPS._resume``). Without
``checkpoint`` a fit is one run, as before.

Tunables (``dask.config``, defaults in ``_CONFIG_DEFAULTS``):
``ps.sgd.compiled``, ``ps.sgd.kernel``, ``ps.sgd.clock-samples``,
``ps.sgd.min-samples-per-participant``, ``ps.sgd.scatter-bytes``,
``ps.sgd.round-cache-bytes``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import uuid
import warnings
from dataclasses import dataclass
from numbers import Integral

import dask
import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier as _SkSGDClassifier
from sklearn.linear_model import SGDRegressor as _SkSGDRegressor
from sklearn.linear_model._base import LinearClassifierMixin, SparseCoefMixin
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit
from sklearn.utils import check_random_state, compute_class_weight
from sklearn.utils._param_validation import Interval
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import (
    _check_partial_fit_first_call,
    check_classification_targets,
    type_of_target,
)
from sklearn.utils.validation import (
    _check_sample_weight,
    check_array,
    check_is_fitted,
    validate_data,
)

from dask_ps import ASP, SSP, Consistency, ParameterServer, checkpoint_metadata, get_parameter_server
from dask_ps import _backend

try:  # scikit-learn's per-sample kernel (private API; checked by _sequential_ok)
    from sklearn.linear_model._sgd_fast import _plain_sgd32, _plain_sgd64
    from sklearn.utils._seq_dataset import ArrayDataset32, ArrayDataset64, CSRDataset32, CSRDataset64
except Exception:  # pragma: no cover - depends on the scikit-learn version
    _plain_sgd32 = _plain_sgd64 = None

__all__ = ["SGDClassifier", "SGDRegressor"]

# Values as in scikit-learn's _stochastic_gradient.py / _sgd_fast.pyx.tp.
PENALTY_TYPES = {"none": 0, "l1": 1, "l2": 2, "elasticnet": 3}
LEARNING_RATE_TYPES = {"constant": 1, "optimal": 2, "invscaling": 3, "adaptive": 4, "pa1": 5, "pa2": 6}
L1, L2, ELASTICNET = 1, 2, 3
CONSTANT, OPTIMAL, INVSCALING, ADAPTIVE, PA1, PA2 = 1, 2, 3, 4, 5, 6
MAX_DLOSS = 1e12
SPARSE_INTERCEPT_DECAY = 0.01
MAX_INT = np.iinfo(np.int32).max
_EPSILON_LOSSES = ("huber", "epsilon_insensitive", "squared_epsilon_insensitive")

# Tunables (dask.config, namespace ``ps.sgd``; defaults here).
_CONFIG_DEFAULTS = {
    # "auto" (sequential for numpy data, minibatch for cupy), "sequential", "minibatch"
    "kernel": "auto",
    # Samples a participant trains on between two clock() calls.
    "clock-samples": 65536,
    # An in-memory input gets one participant per this many samples (at most
    # one per worker): tiny fits run on one participant.
    "min-samples-per-participant": 10000,
    # Train with the compiled (numba) round kernel where it applies (numpy
    # data, not passive-aggressive); False: scikit-learn's kernel per minibatch.
    "compiled": True,
    # In-memory parts smaller than this travel inside the task instead of
    # being scattered first.
    "scatter-bytes": 1 << 20,
    # Sparse data, compiled kernel: keep each round's compacted CSR (over its
    # touched features) from the first epoch of a run for the later ones
    # while the copies fit in this many bytes per participant (roughly the
    # participant's own CSR: 12 bytes per float64 non-zero); beyond it a
    # round is compacted again each epoch (the same result, slower).
    "round-cache-bytes": 2 << 30,
}


def _config(key):
    return dask.config.get(f"ps.sgd.{key}", default=_CONFIG_DEFAULTS[key])


# =====================================================================================
# Losses (array-API: numpy or cupy arrays; y encoded as scikit-learn does:
# {0, 1} for log_loss, {-1, +1} for the other classification losses)
# =====================================================================================


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


def _sk_loss_function(loss, epsilon):
    """scikit-learn's Cython loss object (for the sequential kernel)."""
    cls, *args = _SkSGDClassifier.loss_functions[loss]
    if loss in _EPSILON_LOSSES:
        args = (epsilon,)
    return cls(*args)


# =====================================================================================
# Hyper-parameters as plain values (what the kernels and participants receive)
# =====================================================================================


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
    """Per-sample, per-output learning rates at global sample counts ``ts``: (n, K)."""
    n = ts.shape[0]
    if hp.learning_rate == OPTIMAL:
        eta = 1.0 / (hp.alpha * (hp.optimal_init() + ts - 1.0))
    elif hp.learning_rate == INVSCALING:
        eta = hp.eta0 / ts**hp.power_t
    elif hp.learning_rate == ADAPTIVE:
        return xp.broadcast_to(xp.asarray(eta_k)[None, :], (n, hp.n_outputs))
    else:  # constant, pa1, pa2
        eta = xp.full(n, hp.eta0)
    return xp.broadcast_to(eta[:, None], (n, hp.n_outputs))


def _l2_decay(hp: _Hyper, etas, xp):
    """Product over the minibatch of scikit-learn's per-sample weight decay
    ``max(0, 1 - (1 - l1_ratio) * eta * alpha)``: shape (K,)."""
    if hp.penalty < L2:
        return xp.ones(etas.shape[1])
    f = xp.maximum(0.0, 1.0 - (1.0 - hp.l1_ratio) * etas * hp.alpha)
    return xp.prod(f, axis=0)


# =====================================================================================
# Kernels: one minibatch. Pure functions of arrays (no client, no estimator).
#
# W: (d + 1, K) weights of the minibatch's features (last row: intercepts),
# A: the same for the averaged weights (or None), X: (b, d) dense or CSR with
# column j meaning row j of W, Y: (b, K) encoded targets, sw: (b,) sample
# weights, cw_pos/cw_neg: (K,) class weights, ts: (b,) global sample counts,
# eta_k: (K,) current adaptive learning rates, active: (K,) bool.
# Both return new (W, A) arrays; the caller pushes the differences.
# =====================================================================================


def _decision(W, X, xp):
    d = W.shape[0] - 1
    return X @ W[:d] + W[d]


def _batch_loss(hp: _Hyper, W, X, Y, xp):
    """Sum over the minibatch of the (unweighted) loss at the pulled weights: (K,).
    scikit-learn's stopping rule uses the same unweighted per-sample loss."""
    p = _decision(W, X, xp)
    return xp.sum(_loss_value(hp.loss, Y, p, hp.epsilon, xp), axis=0)


def _minibatch_kernel(hp: _Hyper, W, A, X, Y, sw, cw_pos, cw_neg, ts, eta_k, active, intercept_decay):
    """Array-API minibatch step (numpy or cupy): the sum of scikit-learn's
    per-sample updates evaluated at ``W``."""
    xp = _backend.namespace(W)
    d = W.shape[0] - 1
    act = xp.asarray(active)
    etas = _learning_rates(hp, ts, eta_k, xp)
    p = _decision(W, X, xp)
    if hp.learning_rate in (PA1, PA2):
        if sp.issparse(X) or hasattr(X, "multiply"):
            sq = xp.asarray(X.multiply(X).sum(axis=1)).ravel()
        else:
            sq = xp.sum(X * X, axis=1)
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
    new_a = None
    if A is not None:
        # Averaging from sample t >= average: avg += (w - avg) / (t - average + 1)
        # per sample, with w taken at the end of the minibatch.
        steps = ts - hp.average + 1.0
        keep = xp.prod(xp.where(steps >= 1.0, 1.0 - 1.0 / xp.maximum(steps, 1.0), 1.0))
        frac = (1.0 - keep) * act
        new_a = A + (new - A) * frac[None, :]
    return new, new_a


def _sequential_kernel(hp: _Hyper, W, A, X, Y, sw, cw_pos, cw_neg, ts, eta_k, active, intercept_decay):
    """scikit-learn's per-sample SGD (``_plain_sgd``) over the minibatch, one
    output at a time (as its one-vs-rest does), starting from ``W``.

    ``t`` starts at the global sample count of the minibatch's first sample,
    so the learning rate and averaging follow the global schedule."""
    plain = _plain_sgd32 if W.dtype == np.float32 else _plain_sgd64
    d = W.shape[0] - 1
    new = W.copy()
    new_a = None if A is None else A.copy()
    n = X.shape[0]
    vmask = np.zeros(n, dtype=np.uint8)
    loss_fn = _sk_loss_function(hp.loss, hp.epsilon)
    t0 = float(ts[0])
    for k in np.flatnonzero(active):
        y = np.ascontiguousarray(Y[:, k])
        dataset = _dataset(X, y, sw)
        # Copies: the kernel writes into its weight arrays, and a column of a
        # (d + 1, 1) array is a contiguous view that ascontiguousarray would reuse.
        coef = np.array(W[:d, k], order="C", copy=True)
        avg = None if A is None else np.array(A[:d, k], order="C", copy=True)
        eta0 = float(eta_k[k]) if hp.learning_rate == ADAPTIVE else hp.eta0
        coef, icpt, avg, aicpt, _ = plain(
            coef, float(W[d, k]), avg, 0.0 if A is None else float(A[d, k]),
            loss_fn, hp.penalty, hp.alpha, hp.l1_ratio, dataset, vmask,
            False, None, 1, 1, -np.inf,  # early_stopping, cb, n_iter_no_change, max_iter, tol
            int(hp.fit_intercept), 0, 0, 1,  # fit_intercept, verbose, shuffle, seed
            float(cw_pos[k]), float(cw_neg[k]), hp.learning_rate, eta0, hp.power_t,
            0, t0, intercept_decay, hp.average,
        )
        new[:d, k] = coef
        new[d, k] = icpt
        if A is not None:
            new_a[:d, k] = avg
            new_a[d, k] = aicpt
    return new, new_a


def _dataset(X, y, sw):
    """scikit-learn's SequentialDataset of a minibatch (as ``make_dataset``,
    without its per-call RandomState: the kernel does not shuffle here)."""
    f32 = X.dtype == np.float32
    if sp.issparse(X):
        return (CSRDataset32 if f32 else CSRDataset64)(X.data, X.indptr, X.indices, y, sw, seed=1)
    return (ArrayDataset32 if f32 else ArrayDataset64)(X, y, sw, seed=1)


_SEQUENTIAL_OK = None


def _sequential_ok() -> bool:
    """Whether scikit-learn's private kernel has the signature we call."""
    global _SEQUENTIAL_OK
    if _SEQUENTIAL_OK is None:
        try:
            hp = _Hyper("hinge", 0.1, 2, 1e-4, 0.0, 2, 0.01, 0.5, True, 0, 1, -np.inf, 5, False, 0.1, True, True)
            W = np.zeros((3, 1))
            X = np.ones((2, 2))
            Y = np.array([[1.0], [-1.0]])
            _sequential_kernel(hp, W, None, X, Y, np.ones(2), np.ones(1), np.ones(1), np.array([1.0, 2.0]),
                               np.ones(1), np.ones(1, bool), 1.0)
            _SEQUENTIAL_OK = True
        except Exception:  # pragma: no cover - other scikit-learn versions
            _SEQUENTIAL_OK = False
    return _SEQUENTIAL_OK


def _choose_kernel(X):
    kind = _config("kernel")
    xp = _xp_of(X)
    if kind == "auto":
        kind = "sequential" if xp is np and _sequential_ok() else "minibatch"
    if kind == "sequential" and (xp is not np or not _sequential_ok()):
        kind = "minibatch"
    if kind not in ("sequential", "minibatch"):
        raise ValueError(f"ps.sgd.kernel must be 'auto', 'sequential' or 'minibatch', got {kind!r}")
    return _sequential_kernel if kind == "sequential" else _minibatch_kernel


def _is_cupy_sparse(X) -> bool:
    mod = type(X).__module__
    return mod.startswith("cupyx.scipy.sparse")


def _is_sparse(X) -> bool:
    return sp.issparse(X) or _is_cupy_sparse(X)


def _xp_of(X):
    if sp.issparse(X):
        return np
    if _is_cupy_sparse(X):
        return _backend.cupy
    return _backend.namespace(X)


def _penalty_value(hp: _Hyper, W, xp):
    """scikit-learn's per-sample penalty term of the objective: (K,)."""
    if hp.penalty == 0:
        return xp.zeros(hp.n_outputs)
    d = W.shape[0] - 1
    w = W[:d, : hp.n_outputs]
    return hp.alpha * ((1.0 - hp.l1_ratio) * 0.5 * xp.sum(w * w, axis=0) + hp.l1_ratio * xp.sum(xp.abs(w), axis=0))


# =====================================================================================
# Participant (runs on a worker, one per part, inside ParameterServer.run)
# =====================================================================================


class _PartData:
    """One participant's data: X (n, d), y (n,), sample weights (n,)."""

    def __init__(self, X, y, sw):
        self.X, self.y, self.sw = X, y, sw

    def __len__(self):
        return self.X.shape[0]

    def __repr__(self):
        return f"<_PartData n={self.X.shape[0]} d={self.X.shape[1]} {type(self.X).__name__}>"


@dataclass(frozen=True)
class _RunConfig:
    """Everything a participant needs (plain values; sent with the task)."""

    table: str
    stats_table: str | None
    hp: _Hyper
    n_features: int
    n_cols: int
    n_total: int  # training samples over all participants
    steps_per_epoch: int
    clock_every: int
    max_iter: int
    t0: float
    seeds: tuple
    staleness: int | None
    global_stop: bool
    decision_lag: int  # epochs between an epoch's end and the decision about it
    classes: object  # ndarray of labels (classifier) or None
    cw_pos: tuple
    cw_neg: tuple
    eta_init: tuple
    col_freq_needed: bool
    # Chunked fits (checkpoint_every) and resumed fits: this run trains the
    # epochs [epoch0, max_iter) (absolute numbers); ``states[rank]`` is the
    # participant's stopping rule and RNG state at epoch0 (None: fresh).
    epoch0: int = 0
    states: tuple | None = None
    # Rows of the stats table: epoch (global decision) or
    # rank * stats_stride + epoch (each participant decides alone).
    stats_stride: int = 0


class _StopRule:
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
        for k in np.flatnonzero(self.active):
            if hp.early_stopping:
                s = score[k]
                worse = hp.tol > -np.inf and s < self.best[k] + hp.tol
                self.best[k] = max(self.best[k], s)
            else:
                o = objective[k]
                worse = hp.tol > -np.inf and o > self.best[k] - hp.tol
                self.best[k] = min(self.best[k], o)
            self.no_improvement[k] = self.no_improvement[k] + 1 if worse else 0
            if self.no_improvement[k] >= hp.n_iter_no_change:
                if hp.learning_rate == ADAPTIVE and self.eta[k] > 1e-6:
                    self.eta[k] /= 5.0
                    self.no_improvement[k] = 0
                else:
                    self.active[k] = False


def _encode_targets(cfg: _RunConfig, y, dtype, xp):
    """(n, K) targets of the K binary problems, as scikit-learn encodes them."""
    hp = cfg.hp
    if not hp.classifier:
        return xp.asarray(y, dtype=dtype).reshape(-1, 1)
    classes = np.asarray(cfg.classes)
    y_np = _backend.to_numpy(y)
    unseen = ~np.isin(y_np, classes)
    if unseen.any():
        raise ValueError("classes should include all valid labels that can be in y")
    if len(classes) == 2:
        onehot = (y_np == classes[1])[:, None]
    else:
        onehot = y_np[:, None] == classes[None, :]
    neg = 0.0 if hp.log_encoded else -1.0
    return xp.asarray(np.where(onehot, 1.0, neg).astype(dtype))


def _validation_split(cfg: _RunConfig, y, rng):
    hp = cfg.hp
    n = y.shape[0]
    mask = np.zeros(n, dtype=bool)
    if not hp.early_stopping:
        return mask
    y_np = _backend.to_numpy(y)
    seed = rng.randint(MAX_INT)
    try:
        if hp.classifier:
            splitter = StratifiedShuffleSplit(test_size=hp.validation_fraction, random_state=seed)
        else:
            splitter = ShuffleSplit(test_size=hp.validation_fraction, random_state=seed)
        idx_train, idx_val = next(splitter.split(np.zeros((n, 1)), y_np))
    except ValueError:
        idx_train, idx_val = next(
            ShuffleSplit(test_size=hp.validation_fraction, random_state=seed).split(np.zeros((n, 1)))
        )
    if idx_train.shape[0] == 0 or idx_val.shape[0] == 0:
        raise ValueError(
            "Splitting %d samples into a train set and a validation set with "
            "validation_fraction=%r led to an empty set (%d and %d samples). Please "
            "either change validation_fraction, increase number of samples, or "
            "disable early_stopping." % (n, hp.validation_fraction, idx_train.shape[0], idx_val.shape[0])
        )
    mask[idx_val] = True
    return mask


def _validation_stats(cfg: _RunConfig, W, X, Y, sw, xp):
    """Sums from which the validation score is computed: classifier accuracy
    of each binary problem (weighted), or R² of the regression."""
    hp = cfg.hp
    K = hp.n_outputs
    if X.shape[0] == 0:
        return np.zeros(K + 3)
    p = _decision(W[:, :K], X, xp)
    if hp.classifier:
        correct = (p > 0) == (Y > 0)
        num = xp.sum(correct * sw[:, None], axis=0)
        return np.concatenate([_backend.to_numpy(num), [float(xp.sum(sw)), 0.0, 0.0]])
    y = Y[:, 0]
    ss_res = xp.sum(sw * (y - p[:, 0]) ** 2)
    return np.array([float(ss_res), float(xp.sum(sw)), float(xp.sum(sw * y)), float(xp.sum(sw * y * y))])


def _validation_score(cfg: _RunConfig, v):
    K = cfg.hp.n_outputs
    if cfg.hp.classifier:
        return v[:K] / max(v[K], 1e-300)
    ss_res, s_w, s_wy, s_wy2 = v[:4]
    ss_tot = s_wy2 - s_wy * s_wy / max(s_w, 1e-300)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return np.array([r2])


def _sgd_participant(ctx, part, *, cfg: _RunConfig):
    """Task: one participant of a fit (see ``_participant_loop``).

    Called by ``ParameterServer.run`` on a worker. One BLAS thread: the
    parallelism is the participants', and BLAS's own threads cost more than
    they bring on the small vectors of a minibatch (sklearn's kernel goes from
    0.1 to 7 ms a call at 60k features on a loaded 2-core machine)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _participant_loop(ctx, part, cfg)


def _rng_state_to_json(rng) -> list:
    name, keys, pos, has_gauss, cached = rng.get_state()
    return [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def _rng_state_from_json(state) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return (name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached))


def _stats_row(cfg: _RunConfig, rank: int, epoch: int) -> int:
    """Row of the stats table that holds ``epoch``'s sums of this participant
    (global decision: all participants' sums in one row per epoch)."""
    return epoch if cfg.global_stop else rank * cfg.stats_stride + epoch


class _TimedCtx:
    """The participant's session, with the seconds spent in its calls
    (``pull*``, ``push*``, ``clock``) counted: the fit's communication and
    waiting time, reported per participant (``_participant_loop``)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.seconds = 0.0
        self.by_call: dict[str, float] = {}

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def _call(self, name, *args):
        t = time.perf_counter()
        try:
            return getattr(self._ctx, name)(*args)
        finally:
            dt = time.perf_counter() - t
            self.seconds += dt
            self.by_call[name] = self.by_call.get(name, 0.0) + dt

    def pull(self, *args):
        return self._call("pull", *args)

    def pull_rows(self, *args):
        return self._call("pull_rows", *args)

    def push(self, *args):
        return self._call("push", *args)

    def push_rows(self, *args):
        return self._call("push_rows", *args)

    def clock(self):
        return self._call("clock")


def _participant_loop(ctx, part, cfg: _RunConfig):
    """One participant: ``pull -> update -> push -> clock()``; returns
    per-problem epoch counts, a per-epoch history (for ``verbose``) and its
    state at the end (stopping rule and RNG, for the next run of a chunked
    fit).

    The minibatches between two clocks form a *round*: one pull of the
    weights the round needs (all rows for dense data; for sparse data the
    rows of the features its samples touch), the round's minibatches run on
    that local copy, and one push of the round's update. Local SGD with model
    averaging: a participant trains its local copy with its full updates and
    pushes 1/P of them, so that once every participant pushed, the table holds
    the mean of their models. (Summing the full updates instead over-corrects:
    at scikit-learn's step sizes each local run fits its own data, and two
    such runs added from the same start overshoot -- 0.60 instead of 0.79 test
    accuracy on make_classification with two participants syncing every 4096
    samples.)

    Resuming (a participant that Dask retried after its worker died)
    ------------------------------------------------------------------
    Clock ``c`` of a run is round ``c % R`` of epoch ``epoch0 + c // R``
    (``R`` rounds per epoch), so the retried task starts at
    ``ctx.current_clock`` -- the clock the run recorded for it, whose pushes
    may or may not have been applied -- with the state it had there:

    - the RNG: a fresh ``RandomState(seed)`` makes the same validation split
      and, replaying the shuffles of the epochs already done, the same sample
      order, so the retried clock trains on the same minibatches at the same
      global sample counts ``t``;
    - the stopping rule: every clock pushes the round's loss sums to the
      stats table (the epoch's last clock adds the penalty and validation
      sums), so the decisions of the completed epochs are re-read from the
      table, and the epoch in progress needs no local sums;
    - the weights: pulled from the table as every round does.

    A clock makes the same flushes in the same order on a retry (one per
    table touched: weights, then stats), numbered (clock, n-th flush), so the
    ones the first attempt had applied are dropped and each clock's pushes
    count once. The *values* of a retried clock's push are not bitwise those
    of the first attempt: they are the change from the weights pulled at the
    retry, which include the other participants' progress since (as any read
    in an asynchronous run). Not exact: under VAP/CVAP a flush triggered by
    the value bound depends on the values, so a retried clock can make a
    different number of flushes (an update may then count twice or not at
    all); and a lone participant (one part) never clocks -- it keeps the
    table local and pushes once at the end -- so its retry redoes its whole
    run, and if the first attempt's push had been applied, that push stands
    and the retry's is dropped as a duplicate.
    """
    t_enter = time.perf_counter()
    ctx = _TimedCtx(ctx)
    cpu0 = time.thread_time()
    hp = cfg.hp
    K = hp.n_outputs
    d = cfg.n_features
    X, y, sw = part.X, part.y, part.sw
    xp = _xp_of(X)
    sparse = _is_sparse(X)
    dtype = np.dtype(X.dtype)
    Y = _encode_targets(cfg, y, dtype, xp)
    sw = xp.asarray(sw, dtype=dtype)
    rng = np.random.RandomState(cfg.seeds[ctx.rank])
    val_mask = _validation_split(cfg, y, rng)
    train_idx = np.flatnonzero(~val_mask)
    val_idx = np.flatnonzero(val_mask)
    n_train = train_idx.shape[0]
    kernel = _choose_kernel(X)
    compiled = _CompiledData.make(cfg, X, Y, sw, train_idx) if kernel is _sequential_kernel else None
    intercept_decay = SPARSE_INTERCEPT_DECAY if sparse else 1.0
    cw_pos = np.asarray(cfg.cw_pos, dtype=float)
    cw_neg = np.asarray(cfg.cw_neg, dtype=float)
    S = cfg.steps_per_epoch
    m = cfg.clock_every
    N = cfg.n_total
    scale = 1.0 / ctx.n_participants
    stop = _StopRule(hp, cfg.eta_init)
    state = cfg.states[ctx.rank] if cfg.states is not None else None
    if state is not None:  # a later run of a chunked or resumed fit
        stop.set_state(state["stop"])
        if state.get("rng") is not None:
            rng.set_state(_rng_state_from_json(state["rng"]))
    history = []
    inv_q = None
    if sparse and hp.penalty > 0 and compiled is None:
        # A minibatch decays only the rows it touches: the other rows miss its
        # L2 decay (and L1 shrinkage). A touched row gets them scaled by 1/q,
        # q = the probability that a minibatch touches the feature -- "lazy"
        # regularization, unbiased in log-scale.
        Xt = X[train_idx] if n_train < X.shape[0] else X
        counts = _backend.to_numpy(xp.bincount(Xt.indices, minlength=d)) if n_train else np.zeros(d)
        inv_q = _lazy_inv_q(counts, n_train, n_train / S)
    # Alone, a participant keeps the whole table local: one pull, one push.
    solo = ctx.n_participants == 1
    stats_pad = None if solo else np.zeros(1 + K + 3)  # a round's row: its loss sums only
    # Where a retried task resumes: a lone participant never clocks and
    # redoes its run; the others go on from the clock the run recorded.
    rounds = -(-S // m)
    # The rounds of an epoch (see ``_epoch_rounds``): lists of minibatches,
    # or, for compacted sparse rounds, (round id, order of its samples).
    fixed = compiled is not None and compiled.sparse
    run_rounds = []  # the rounds fixed at the run's first epoch

    def draw(epoch):
        return _epoch_rounds(rng, hp.shuffle, train_idx, S, m, fixed, run_rounds, epoch, cfg.seeds[ctx.rank])

    resume = 0 if solo else int(ctx.current_clock)
    done_epochs, resume_round = divmod(resume, rounds)
    t_start = time.perf_counter()
    setup_seconds = t_start - t_enter
    samples = 0
    first = cfg.epoch0
    for epoch in range(cfg.epoch0, min(cfg.epoch0 + done_epochs, cfg.max_iter)):
        if not stop.active.any():
            break
        draw(epoch)  # the draws the first attempt made
        samples += n_train
        _decide(ctx, cfg, stop, epoch, history, float("nan"), samples)
        first = epoch + 1
    W_all = ctx.pull(cfg.table) if solo else None
    W_start = W_all.copy() if solo else None
    W = None
    for epoch in range(first, cfg.max_iter):
        if not stop.active.any():
            break
        t_epoch = time.perf_counter()
        epoch_rounds = draw(epoch)
        loss_sum = xp.zeros(K)
        active = stop.active.copy()
        r_first = resume_round if epoch == first else 0
        seen = sum(_round_size(g, run_rounds) for g in epoch_rounds[:r_first])
        samples += seen
        for ri in range(r_first, len(epoch_rounds)):
            group = epoch_rounds[ri]
            if not solo:
                loss_sum = xp.zeros(K)  # pushed every round (see the docstring)
            if compiled is not None:
                rows, W0, W, n_round = _compiled_round(
                    ctx, cfg, compiled, group, run_rounds, epoch, seen, W_all, stop, active, loss_sum, solo)
                seen += n_round
                samples += n_round
            else:
                if sparse:
                    Xg = X[np.concatenate(group)]
                    # The features the round touches, and its samples with their
                    # columns renumbered to rows of the pulled block (a mark and a
                    # lookup table over the features: O(nnz + d), no sort).
                    touched = xp.zeros(d, dtype=bool)
                    touched[Xg.indices] = True
                    cols = xp.flatnonzero(touched)
                    lookup = xp.empty(d, dtype=np.int32)
                    lookup[cols] = xp.arange(cols.shape[0], dtype=np.int32)
                    cols_np = _backend.to_numpy(cols).astype(np.int64)
                    rows = np.append(cols_np, d)
                    Xg = type(Xg)((Xg.data, lookup[Xg.indices], Xg.indptr), shape=(Xg.shape[0], cols_np.shape[0]))
                    n_round = cols_np.shape[0]
                    stamp = xp.empty(n_round, dtype=np.int64)  # scratch for the minibatches' unique()
                    lookup = xp.empty(n_round, dtype=np.int32)
                    W0 = W_all[xp.asarray(rows)] if solo else ctx.pull_rows(cfg.table, rows)
                    iq = None if inv_q is None else inv_q[cols_np]
                else:
                    W0 = W_all if solo else ctx.pull(cfg.table)
                W = W0.copy()
                off = 0
                for j, idx in enumerate(group):
                    nb = idx.shape[0]
                    if nb == 0:
                        continue
                    Yb, swb = Y[idx], sw[idx]
                    if sparse:
                        # The kernels touch every row they are given (decay, norms,
                        # checks): give them the minibatch's rows only.
                        Xb = Xg[off:off + nb]
                        off += nb
                        ub, inv = _unique_inverse(Xb.indices, stamp, lookup, xp)
                        sel = xp.append(ub, Xg.shape[1])  # + the intercept row
                        Xb = type(Xb)((Xb.data, inv, Xb.indptr), shape=(nb, ub.shape[0]))
                        Wb = W[sel]
                    else:
                        Xb = X[idx]
                        Wb = W
                    # Global sample counter of this minibatch's samples: all
                    # participants together advance t by N per epoch (with one
                    # participant, exactly scikit-learn's t).
                    step = N / max(n_train, 1)
                    ts = cfg.t0 + epoch * N + (seen + xp.arange(nb, dtype=np.float64)) * step
                    seen += nb
                    Wk = Wb[:, :K]
                    Ak = Wb[:, K:] if hp.average else None
                    loss_sum += _batch_loss(hp, Wk, Xb, Yb, xp)
                    new, new_a = kernel(hp, Wk, Ak, Xb, Yb, swb, cw_pos, cw_neg, ts, stop.eta, active,
                                        intercept_decay)
                    if sparse and iq is not None:
                        new = _lazy_regularization(hp, new, iq[_backend.to_numpy(ub)], ts, stop.eta, active, xp)
                    if not _backend.all_finite(new):
                        raise ValueError(
                            "Floating-point under-/overflow occurred at epoch #%d. Scaling input data "
                            "with StandardScaler or MinMaxScaler might help." % (epoch + 1)
                        )
                    if sparse:
                        W[sel, :K] = new
                        if hp.average:
                            W[sel, K:] = new_a
                    else:
                        W[:, :K] = new
                        if hp.average:
                            W[:, K:] = new_a
                    samples += nb
            if solo:
                if sparse:
                    W_all[xp.asarray(rows)] = W
                else:
                    W_all = W
            else:
                delta = W - W0
                if scale < 1.0:
                    delta *= scale
                if sparse:
                    ctx.push_rows(cfg.table, rows, delta)
                else:
                    ctx.push(cfg.table, delta)
            if ri == len(epoch_rounds) - 1:
                _end_epoch(ctx, cfg, epoch, stop, loss_sum, n_train, X, Y, sw, val_idx, xp,
                           W_all if solo else (None if sparse else W), d, history,
                           time.perf_counter() - t_epoch, samples, clock=not solo)
            else:
                row = np.concatenate([_backend.to_numpy(loss_sum).astype(float), stats_pad])
                ctx.push_rows(cfg.stats_table, np.array([_stats_row(cfg, ctx.rank, epoch)]), row[None, :])
                ctx.clock()
    if solo:
        ctx.push(cfg.table, W_all - W_start)
    return {
        "n_iter": stop.n_iter.tolist(),
        "history": history,
        "samples": samples,
        "seconds": time.perf_counter() - t_start,
        "eta": stop.eta.tolist(),
        "state": {"stop": stop.get_state(), "rng": _rng_state_to_json(rng)},
        # Where the participant's time went: its calls to the parameter
        # server (communication and clock waits) and its thread's CPU time.
        "profile": {
            "ps_seconds": ctx.seconds,
            "ps_seconds_by_call": dict(ctx.by_call),
            "cpu_seconds": time.thread_time() - cpu0,
            "setup_seconds": setup_seconds,  # data preparation before the first epoch
            "metrics": ctx.metrics() if hasattr(ctx._ctx, "metrics") else None,
        },
    }



def _epoch_rounds(rng, shuffle, train_idx, S, m, fixed, run_rounds, epoch, seed):
    """The rounds of ``epoch``, in order, and the RNG draws that make them
    (replayed as they are by a retried participant).

    Default: scikit-learn's reshuffle of all samples each epoch (``shuffle``),
    cut into ``S`` minibatches and rounds of ``m`` of them; a round is its
    list of minibatches.

    ``fixed`` (sparse data with the compiled kernel): which samples form each
    round is drawn once per fit -- a shuffle of the training samples cut the
    same way, from its own stream (``seed``), so that every run of a chunked
    or resumed fit and every retry finds the same rounds (kept in
    ``run_rounds`` as index arrays) -- and each epoch after the first
    shuffles the order of the rounds and the order of the samples inside each
    round (from ``rng``). A round's compacted CSR over its touched features
    (``_compiled_round``) is then built once and re-read in a new order. A
    round is ``(round id, order of its samples or None)``."""
    if fixed:
        if not run_rounds:
            order = np.random.default_rng([int(seed), 1]).permutation(train_idx) if shuffle else train_idx
            batches = np.array_split(order, S)
            run_rounds.extend(np.concatenate(batches[r0:r0 + m]) if m > 1 else batches[r0]
                              for r0 in range(0, S, m))
        if not shuffle or epoch == 0:
            return [(i, None) for i in range(len(run_rounds))]
        return [(int(i), rng.permutation(run_rounds[i].shape[0])) for i in rng.permutation(len(run_rounds))]
    order = rng.permutation(train_idx) if shuffle else train_idx
    batches = np.array_split(order, S)
    return [batches[r0:r0 + m] for r0 in range(0, S, m)]


def _round_size(group, run_rounds) -> int:
    if isinstance(group, tuple):
        return int(run_rounds[group[0]].shape[0])
    return sum(b.shape[0] for b in group)


def _numba_module():
    """``_sgd_numba`` where numba imports (else None: scikit-learn's kernel)."""
    global _NUMBA
    if _NUMBA is None:
        try:
            from dask_ps.linear_model import _sgd_numba

            _NUMBA = _sgd_numba
        except Exception:  # pragma: no cover - numba missing or broken
            _NUMBA = False
    return _NUMBA or None


_NUMBA = None


class _CompiledData:
    """A participant's data prepared once per fit for the compiled round
    kernel (``_sgd_numba.sgd_round``): targets per output as contiguous
    vectors, the CSR's arrays, scratch arrays over the features, and for
    sparse data with a penalty the lazy-regularization factors per feature.

    The round kernel reads the samples of a round by index from the local
    data (no copy of the round's rows), runs scikit-learn's per-sample rule
    over the whole round in one call, and, for sparse data, on the block of
    the round's touched rows only."""

    _arange = np.arange(0, dtype=np.int64)

    def arange_n(self, n):
        if self._arange.shape[0] < n:
            self._arange = np.arange(max(n, 2 * self._arange.shape[0]), dtype=np.int64)
        return self._arange[:n]

    @classmethod
    def make(cls, cfg: _RunConfig, X, Y, sw, train_idx):
        hp = cfg.hp
        mod = _numba_module() if _config("compiled") else None
        if mod is None or hp.learning_rate in (PA1, PA2) or hp.loss not in mod.LOSS_IDS:
            return None
        self = cls()
        self.mod = mod
        self.sparse = sp.issparse(X)
        self.n_train = train_idx.shape[0]
        self.Y = [np.ascontiguousarray(Y[:, k]) for k in range(Y.shape[1])]
        self.sw = np.ascontiguousarray(sw)
        self.loss_id = mod.LOSS_IDS[hp.loss]
        self.thr = {"hinge": 1.0, "perceptron": 0.0, "squared_hinge": 1.0}.get(hp.loss, float(hp.epsilon))
        self.optimal_init = hp.optimal_init() if hp.learning_rate == OPTIMAL else 0.0
        self.wscale_min = 1e-6 if X.dtype == np.float32 else 1e-9
        self.dummy_w = np.zeros(1, dtype=X.dtype)
        self.dummy_q = np.zeros(1)  # the L1 state of a penalty without L1
        d = cfg.n_features
        self.inv_q = None
        if self.sparse:
            self.X = np.zeros((1, 1), dtype=X.dtype)
            self.data = X.data
            self.ind = X.indices.astype(np.int32, copy=False)
            self.ptr = X.indptr.astype(np.int32, copy=False)
            self.bits = np.zeros(d // 64 + 1, dtype=np.uint64)  # compact_rows' scratch
            self.rank = np.zeros(self.bits.shape[0], dtype=np.int64)
            n_train = train_idx.shape[0]
            # The rounds' compacted CSRs, kept across the epochs of a run
            # while they fit the budget (about the size of the training CSR).
            nnz_train = int(np.sum(np.diff(self.ptr)[train_idx])) if n_train else 0
            est = nnz_train * (X.data.dtype.itemsize + 4) + n_train * (8 * (Y.shape[1] + 2) + 4)
            self.cache = {} if est <= int(_config("round-cache-bytes")) else None
            if hp.penalty > 0 and n_train:
                # A round decays (L2) and shrinks (L1) the rows it touches
                # only; a touched row also gets the regularization of the
                # rounds that missed it, 1/q times, q = the probability that
                # a round touches the feature ("lazy" regularization).
                ind = X[train_idx].indices.astype(np.int32, copy=False) if n_train < X.shape[0] else self.ind
                counts = mod.feature_counts(ind, d)
                per_round = min(cfg.clock_every, cfg.steps_per_epoch) * n_train / cfg.steps_per_epoch
                self.inv_q = _lazy_inv_q(counts, n_train, per_round)
        else:
            self.X = np.ascontiguousarray(X)
            self.chunk = max(256, (1 << 21) // max(8 * X.shape[1], 1))  # rows per ~2 MiB chunk
            self.buf = np.empty((min(self.chunk, X.shape[0]), X.shape[1]), dtype=X.dtype)
            self.csr_dummy = (np.zeros(1, dtype=X.dtype), np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int32))
        return self


def _compiled_round(ctx, cfg: _RunConfig, c: _CompiledData, group, run_rounds, epoch, seen, W_all, stop, active,
                    loss_sum, solo):
    """One round with the compiled kernel: pull the weights the round needs
    (the touched rows for sparse data), train every active output over the
    round's samples in one call each, regularize the touched rows lazily;
    returns ``(rows, W0, W, n_samples)`` (``rows`` None for dense data).

    ``group``: the round's minibatches (dense data), or ``(round id, order)``
    of a round of ``run_rounds`` (sparse data, ``_epoch_rounds``), whose
    compacted CSR is built at its first use and kept in ``c.cache`` when the
    budget allows."""
    hp = cfg.hp
    K = hp.n_outputs
    d = cfg.n_features
    rows = None
    if c.sparse:
        rid, order = group
        entry = None if c.cache is None else c.cache.get(rid)
        if entry is None:
            idx = run_rounds[rid]
            cols, cdata, cind, cptr = c.mod.compact_rows(idx, c.data, c.ind, c.ptr, c.bits, c.rank)
            rows = np.append(cols, d)  # sorted and unique: pull_rows/push_rows do not sort them
            entry = (rows, (cdata, cind, cptr), [yk[idx] for yk in c.Y], c.sw[idx])
            if c.cache is not None:
                c.cache[rid] = entry
        rows = entry[0]
        n_round = entry[3].shape[0]
        W0 = W_all[rows] if solo else ctx.pull_rows(cfg.table, rows)
    else:
        idx = np.concatenate(group) if len(group) > 1 else group[0]
        n_round = idx.shape[0]
        W0 = W_all if solo else ctx.pull(cfg.table)
    W = np.array(W0, dtype=W0.dtype, order="F", copy=True)  # columns contiguous
    nw = W.shape[0] - 1
    n_train_step = cfg.n_total / max(c.n_train, 1)
    t = cfg.t0 + epoch * cfg.n_total + seen * n_train_step
    intercept_decay = SPARSE_INTERCEPT_DECAY if c.sparse else 1.0
    iq = None if c.inv_q is None else c.inv_q[rows[:-1]]
    if c.sparse:
        # The round's rows as a CSR over its touched features (the pulled
        # block): one pass of lookups, then the kernel reads it in order.
        # The sample order: the round's own (its first epoch) or ``order``,
        # read through the kernel's list of rows (no copy of the CSR).
        local = c.arange_n(n_round) if order is None else order
        whole = (local, entry[1], entry[2], entry[3], local)

        def chunks():
            yield whole
    else:
        # Dense rows are copied in chunks to a contiguous buffer first (one
        # buffer: each chunk is trained before the next is gathered): a
        # gather then a sequential pass is ~2x faster than the per-sample
        # kernel reading rows at random.
        def chunks():
            for a in range(0, idx.shape[0], c.chunk):
                part = idx[a:a + c.chunk]
                n = part.shape[0]
                buf = c.mod.gather_rows(c.X, part, c.buf[:n])
                yield part, buf, [yk[part] for yk in c.Y], c.sw[part], c.arange_n(n)
    # Chunks outside, outputs inside: each chunk is gathered once for all
    # outputs. Per output: intercepts, the decay and learning-rate sums (for
    # the lazy regularization) and the L1 penalty state, carried over chunks.
    outs = np.flatnonzero(active)
    use_l1 = hp.penalty in (L1, ELASTICNET)
    icpt = {k: float(W[nw, k]) for k in outs}
    aicpt = {k: float(W[nw, K + k]) if hp.average else 0.0 for k in outs}
    decay = dict.fromkeys(outs, 1.0)
    eta_sum = dict.fromkeys(outs, 0.0)
    l1_q = {k: np.zeros(nw) if use_l1 else c.dummy_q for k in outs}
    l1_u = dict.fromkeys(outs, 0.0)
    tk = t
    for part, Xc, Yc, swc, local in chunks():
        Xd, (xdata, xind, xptr) = (c.X, Xc) if c.sparse else (Xc, c.csr_dummy)
        for k in outs:
            eta = float(stop.eta[k]) if hp.learning_rate == ADAPTIVE else hp.eta0
            icpt[k], aicpt[k], sumloss, dec, es, l1_u[k] = c.mod.sgd_round(
                not c.sparse, Xd, xdata, xind, xptr, local, Yc[k], swc, W[:nw, k],
                W[:nw, K + k] if hp.average else c.dummy_w, icpt[k], aicpt[k],
                c.loss_id, c.thr, hp.penalty, hp.alpha, hp.l1_ratio, hp.learning_rate, eta, hp.eta0, hp.power_t,
                c.optimal_init, bool(hp.fit_intercept), intercept_decay, float(cfg.cw_pos[k]),
                float(cfg.cw_neg[k]), int(hp.average), tk, n_train_step, c.wscale_min, l1_q[k], l1_u[k])
            decay[k] *= dec
            eta_sum[k] += es
            loss_sum[k] += sumloss
        tk += part.shape[0] * n_train_step
    extra = None if iq is None else iq - 1.0
    for k in outs:
        wk = W[:nw, k]
        if extra is not None:
            if hp.penalty >= L2:
                wk *= decay[k] ** extra
            if use_l1:
                u = hp.l1_ratio * hp.alpha * eta_sum[k] * extra
                wk[:] = np.sign(wk) * np.maximum(np.abs(wk) - u, 0.0)
        W[nw, k] = icpt[k]
        if hp.average:
            W[nw, K + k] = aicpt[k]
    if not _backend.all_finite(W):
        raise ValueError(
            "Floating-point under-/overflow occurred at epoch #%d. Scaling input data "
            "with StandardScaler or MinMaxScaler might help." % (epoch + 1)
        )
    return rows, W0, np.ascontiguousarray(W), n_round


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


def _lazy_regularization(hp, new, inv_q, ts, eta_k, active, xp):
    """Give the rows a sparse minibatch touched the regularization of the
    minibatches that did not touch them (see ``_sgd_participant``)."""
    d = new.shape[0] - 1
    extra = xp.asarray(inv_q - 1.0)[:, None]  # (d, 1), >= 0
    etas = _learning_rates(hp, ts, eta_k, xp)
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


def _end_epoch(ctx, cfg, epoch, stop, loss_sum, n_train, X, Y, sw, val_idx, xp, W, d, history, seconds, samples,
               clock=True):
    """Epoch end: objective (and validation) sums, the epoch's last clock, and
    the stopping decision (``_decide``).

    ``loss_sum`` is the epoch's loss sum for a lone participant, and the last
    round's for the others, whose earlier rounds pushed theirs to the stats
    table already. With several participants the sums go to the stats table:
    to row ``epoch`` under a staleness bound, where they add up over the
    participants (see ``_decide``), else to the participant's own row."""
    hp = cfg.hp
    K = hp.n_outputs
    # The penalty term of the objective only matters to the stopping rule.
    with_penalty = hp.penalty > 0 and hp.tol > -np.inf and not hp.early_stopping
    Wf = None
    if with_penalty or hp.early_stopping:
        Wf = W if W is not None else ctx.pull(cfg.table)
    obj = _backend.to_numpy(loss_sum).astype(float)
    if with_penalty:
        obj = obj + n_train * _backend.to_numpy(_penalty_value(hp, Wf, _backend.namespace(Wf)))
    val = np.zeros(K + 3)
    if hp.early_stopping:
        val = _validation_stats(cfg, Wf, X[val_idx], Y[val_idx], sw[val_idx], xp)
    row = np.concatenate([obj, [float(n_train)], val])
    if cfg.stats_table is not None:
        ctx.push_rows(cfg.stats_table, np.array([_stats_row(cfg, ctx.rank, epoch)]), row[None, :])
    if clock:
        ctx.clock()
    _decide(ctx, cfg, stop, epoch, history, seconds, samples, row if cfg.stats_table is None else None)


def _decide(ctx, cfg, stop, epoch, history, seconds, samples, row=None):
    """The stopping decision at the end of ``epoch`` (after its last clock).

    With several participants under a staleness bound ``s`` the decision is
    global: every participant pushes its sums to row ``epoch`` of the stats
    table, and decides about epoch ``epoch - lag`` once that row is complete
    -- a read at clock ``c`` sees every update of clocks ``< c - s``, so the
    row of an epoch that ended ``lag = ceil(s / clocks_per_epoch)`` epochs ago
    is. Every participant reads the same row at the same clock and takes the
    same decision, without waiting for the others (the price: training goes
    on ``lag`` epochs past the point where scikit-learn would stop). Without
    a bound (ASP/VAP) each participant decides on its own row. A lone
    participant passes its ``row``.

    Reads only the table (and ``stop``), so a retried participant replays
    the decisions of the epochs it had completed (``_participant_loop``)."""
    hp = cfg.hp
    K = hp.n_outputs
    decided = epoch
    if cfg.stats_table is not None:
        if cfg.global_stop:
            decided = epoch - cfg.decision_lag
        row = None
        if decided >= 0:
            r = _stats_row(cfg, ctx.rank, decided)
            row = _backend.to_numpy(ctx.pull_rows(cfg.stats_table, np.array([r]))[0])
    # An epoch counts once (a chunked fit carries ``last_decided`` over), and
    # a row without samples was never written (a fit resumed in another mode).
    if row is not None and (decided <= stop.last_decided or row[K] <= 0):
        row = None
    if row is not None:
        count = row[K]
        objective = row[:K] / count
        score = _validation_score(cfg, row[K + 1:]) if hp.early_stopping else None
        stop.update(objective, score)
        stop.last_decided = decided
    else:
        objective, score = np.full(K, np.nan), None
    stop.n_iter[stop.active] = epoch + 1
    history.append({
        "epoch": epoch + 1,
        "decided": decided + 1,
        "objective": float(np.mean(objective)),
        "score": None if score is None else float(np.mean(score)),
        "seconds": seconds,
        "samples": samples,
        "active": int(stop.active.sum()),
    })


# =====================================================================================
# Driver side: the parameter server, the data, and the run
# =====================================================================================

def _is_dask_collection(X) -> bool:
    return dask.is_dask_collection(X)


def _is_dask_dataframe(X) -> bool:
    return _is_dask_collection(X) and hasattr(X, "columns") and hasattr(X, "npartitions")


def _dask_meta(X):
    """The kind of chunks a dask collection holds (numpy/scipy/cupy/pandas)."""
    return getattr(X, "_meta", None)


class _Input:
    """Validated training data: in memory (X, y, sw arrays) or dask collections."""

    def __init__(self, kind, X, y, sw, n_features, dtype, sparse, device):
        self.kind, self.X, self.y, self.sw = kind, X, y, sw
        self.n_features, self.dtype, self.sparse, self.device = n_features, np.dtype(dtype), sparse, device


def _assemble_part(blocks, spec):
    """Task (on the worker holding the blocks): concatenate one worker's
    blocks of a dask input and validate them the scikit-learn way."""
    Xs, ys, sws = [], [], []
    for xb, yb, swb in blocks:
        if hasattr(xb, "to_numpy") and not _is_sparse(xb):  # pandas
            xb = xb.to_numpy()
        if hasattr(yb, "to_numpy"):
            yb = yb.to_numpy()
        if yb is not None and getattr(yb, "ndim", 1) == 2 and yb.shape[1] == 1:
            yb = yb.ravel()
        Xs.append(xb)
        ys.append(yb)
        sws.append(swb if swb is None or not hasattr(swb, "to_numpy") else swb.to_numpy())
    if _is_sparse(Xs[0]):
        if sp.issparse(Xs[0]):
            X = sp.vstack(Xs, format="csr") if len(Xs) > 1 else sp.csr_matrix(Xs[0])
        else:  # cupyx sparse
            import cupyx.scipy.sparse as csp  # type: ignore[import-not-found]

            X = csp.vstack(Xs, format="csr") if len(Xs) > 1 else Xs[0].tocsr()
    else:
        xp = _backend.namespace(*Xs)
        X = xp.concatenate(Xs, axis=0) if len(Xs) > 1 else Xs[0]
    xp_y = _backend.namespace(*[v for v in ys if v is not None])
    y = xp_y.concatenate(ys) if len(ys) > 1 else ys[0]
    if X.shape[0] != y.shape[0]:
        raise ValueError(
            f"Found input variables with inconsistent numbers of samples: [{X.shape[0]}, {y.shape[0]}]"
        )
    if _backend.namespace(X) is np and not _is_cupy_sparse(X):
        X = check_array(X, accept_sparse="csr", dtype=[np.float64, np.float32], order="C",
                        accept_large_sparse=False, ensure_min_samples=0)
        if spec["classifier"]:
            y = np.asarray(y)
        else:
            y = check_array(y, ensure_2d=False, dtype=X.dtype, ensure_min_samples=0)
    else:
        if not _is_cupy_sparse(X) and not _backend.all_finite(X):
            raise ValueError("Input X contains NaN or infinity.")
    if X.shape[1] != spec["n_features"]:
        raise ValueError(f"X has {X.shape[1]} features, expected {spec['n_features']}")
    if any(s is not None for s in sws):
        sw = np.concatenate([_backend.to_numpy(s) for s in sws]) if len(sws) > 1 else _backend.to_numpy(sws[0])
        sw = check_array(sw, ensure_2d=False, dtype=X.dtype, ensure_min_samples=0)
        if sw.shape != (X.shape[0],):
            raise ValueError(f"sample_weight.shape == {sw.shape}, expected {(X.shape[0],)}!")
    else:
        sw = np.ones(X.shape[0], dtype=X.dtype)
    return _PartData(X, y, sw)


def _part_info(part, classifier):
    """Task: sizes and label counts of an assembled part."""
    if classifier:
        labels, counts = np.unique(_backend.to_numpy(part.y), return_counts=True)
    else:
        labels = counts = None
    return len(part), labels, counts


def _flat_keys(coll):
    keys = coll.__dask_keys__()
    out = []

    def walk(k):
        if isinstance(k, list):
            for x in k:
                walk(x)
        else:
            out.append(k)

    walk(keys)
    return out


def _dask_parts(ps: ParameterServer, data: _Input, classifier: bool):
    """Persist a dask input and build one part per worker that holds blocks
    of it: a future of the worker's blocks, concatenated and validated there.
    Nothing is gathered to the client."""
    from distributed import futures_of, wait

    client = ps.client
    X, y, sw = data.X, data.y, data.sw
    if not _is_dask_dataframe(X):
        X = X.rechunk({1: -1}) if X.numblocks[1] > 1 else X
    if not _is_dask_collection(y):
        raise TypeError("y must be a dask collection when X is one")
    if hasattr(y, "chunks") and hasattr(X, "chunks") and not any(np.isnan(X.chunks[0])):
        if y.chunks[0] != X.chunks[0]:
            y = y.rechunk({0: X.chunks[0]})
    if sw is not None and not _is_dask_collection(sw):
        import dask.array as da

        if hasattr(X, "chunks") and not any(np.isnan(X.chunks[0])):
            sw = da.from_array(np.asarray(sw), chunks=(X.chunks[0],))
        else:
            raise TypeError("sample_weight must be a dask collection aligned with X")
    colls = [X, y] + ([sw] if sw is not None else [])
    persisted = client.persist(colls)
    # The futures of each collection's blocks, in block order. A persisted
    # dask-expr collection's keys are aliases of its futures' keys, which
    # share the block index (the key's tail), so match on that.
    per_coll = []
    for c in persisted:
        by_index = {tuple(f.key[1:]): f for f in futures_of(c)}
        per_coll.append([by_index[tuple(k[1:])] for k in _flat_keys(c)])
    if len({len(b) for b in per_coll}) != 1:
        raise ValueError(
            "X, y (and sample_weight) must have the same number of blocks/partitions; got "
            + ", ".join(str(len(b)) for b in per_coll)
        )
    blocks = []
    for i in range(len(per_coll[0])):
        blocks.append(tuple(b[i] for b in per_coll) + ((None,) if sw is None else ()))
    # Where the blocks are once computed (who_has is empty for a block still
    # being computed: every such block would land in one part).
    wait([b[0] for b in blocks])
    who = client.who_has([b[0] for b in blocks])
    by_worker: dict[str, list] = {}
    for b in blocks:
        holders = who.get(b[0].key) or who.get(str(b[0].key)) or ()
        w = sorted(holders)[0] if holders else None
        by_worker.setdefault(w, []).append(b)
    spec = {"n_features": data.n_features, "classifier": classifier}
    parts = []
    for w, bl in by_worker.items():
        kw = {"workers": [w], "allow_other_workers": True} if w is not None else {}
        parts.append(client.submit(_assemble_part, bl, spec, pure=False, **kw))
    infos = client.gather([client.submit(_part_info, p, classifier, pure=False) for p in parts])
    sizes = [i[0] for i in infos]
    labels = None
    if classifier:
        lab = [i[1] for i in infos if i[1] is not None and len(i[1])]
        cnt = [i[2] for i in infos if i[2] is not None and len(i[2])]
        if lab:
            all_l = np.concatenate(lab)
            all_c = np.concatenate(cnt)
            labels, inv = np.unique(all_l, return_inverse=True)
            counts = np.bincount(inv, weights=all_c)
            labels = (labels, counts)
    keep = [i for i, n in enumerate(sizes) if n > 0]
    return [parts[i] for i in keep], [sizes[i] for i in keep], labels, persisted


@dataclass(frozen=True)
class _PartCopies:
    """The keys of the scattered copies of one in-memory part: on its
    participant's worker first, then the backups (see ``_memory_parts``)."""

    keys: tuple


def _load_part(copies: _PartCopies):
    """Task: one part of an in-memory input, from a copy on this worker (no
    transfer, no copy) or else from a surviving copy on another worker. It
    depends on no other task, so Dask can always run it again: that is how
    the retried participant of a dead worker gets its data back."""
    from distributed import get_worker
    from distributed.utils import sync
    from distributed.worker import get_data_from_worker

    worker = get_worker()
    for key in copies.keys:
        if key in worker.data:
            return worker.data[key]
    deadline = time.monotonic() + 60.0
    while True:
        who = sync(worker.loop, worker.scheduler.who_has, keys=list(copies.keys))
        holders = [(k, w) for k in copies.keys for w in (who.get(k) or ())]
        if not holders:
            raise RuntimeError(
                "every copy of a part of the training data was lost with its worker(s): more "
                "workers died at once than the estimator's replication - 1"
            )
        for key, holder in holders:
            try:
                got = sync(worker.loop, get_data_from_worker, worker.rpc, [key], holder, who=worker.address)
            except OSError:  # that holder died meanwhile: try the next
                continue
            if got.get("status") == "OK":
                return got["data"][key]
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not fetch a copy of a part of the training data from {holders}")
        time.sleep(0.1)  # holders busy


def _memory_parts(ps: ParameterServer, data: _Input, random_state, shuffle: bool, replication: int = 1):
    """Split an in-memory input into one part per worker (fewer for small
    inputs) and scatter each part once; returns (parts, sizes, keep) --
    ``keep``: futures to hold for as long as the parts are used.

    Data scattered to a worker that dies is gone: Dask cannot recompute it,
    and the participant that Dask retries would fail. So with
    ``replication >= 2`` a part is scattered to its participant's worker
    *and* to the next ``replication - 1`` workers (separate keys, so that
    Dask's memory manager never drops a copy as a redundant replica), and
    the participant's part is a small task, ``_load_part``, that takes the
    local copy: if that worker dies, Dask runs the task again elsewhere, it
    fetches a surviving copy, and the retried participant runs there. Each
    part then lives on ``replication`` workers (the memory cost). Parts small
    enough to travel inside the task (under ``ps.sgd.scatter-bytes``) and
    dask inputs are recomputable as they are."""
    X, y, sw = data.X, data.y, data.sw
    n = X.shape[0]
    servers = ps.servers
    n_parts = max(1, min(len(servers), n // max(1, int(_config("min-samples-per-participant")))))
    if n_parts == 1:
        parts = [_PartData(X, y, sw)]
    else:
        idx = random_state.permutation(n) if shuffle else np.arange(n)
        parts = []
        for chunk in np.array_split(idx, n_parts):
            chunk = np.sort(chunk)
            parts.append(_PartData(X[chunk], y[chunk], sw[chunk]))
    sizes = [len(p) for p in parts]
    nbytes = _nbytes(X)
    keep = []
    if nbytes >= int(_config("scatter-bytes")):
        client = ps.client
        k = min(int(replication), len(servers))
        if k > 1:
            loaders = []
            for i, p in enumerate(parts):
                copies = [client.scatter(p, workers=[servers[(i + j) % len(servers)]], hash=False)
                          for j in range(k)]
                keep.extend(copies)
                loaders.append(client.submit(_load_part, _PartCopies(tuple(f.key for f in copies)),
                                             workers=[servers[i % len(servers)]], allow_other_workers=True,
                                             pure=False))
            parts = loaders
        else:
            parts = [
                client.scatter(p, workers=[servers[i % len(servers)]], hash=False)
                for i, p in enumerate(parts)
            ]
    return parts, sizes, keep


def _jsonable(obj):
    """``obj`` as plain JSON values (checkpoint metadata), so that a value
    compares equal to itself after a save and a load."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return repr(obj)


def _nbytes(X) -> int:
    if sp.issparse(X):
        return X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
    return getattr(X, "nbytes", 0)


# =====================================================================================
# Estimators
# =====================================================================================


def _constraints(sk_cls):
    c = {k: v for k, v in sk_cls._parameter_constraints.items() if k != "n_jobs"}
    c.update(
        batch_size=[Interval(Integral, 1, None, closed="left")],
        consistency=[Consistency, None],
        client="no_validation",
        checkpoint=[str, os.PathLike, None],
        checkpoint_every=[Interval(Integral, 1, None, closed="left"), None],
        replication=[Interval(Integral, 1, None, closed="left")],
    )
    return c


class _BaseSGDPS(SparseCoefMixin, BaseEstimator):
    """Shared driver of the parameter-server SGD estimators."""

    def _more_validate_params(self, for_partial_fit=False):
        # As scikit-learn's BaseSGD._more_validate_params.
        if self.early_stopping and for_partial_fit:
            raise ValueError("early_stopping should be False with partial_fit")
        if self.learning_rate == "optimal" and self.alpha == 0:
            raise ValueError(
                "alpha must be > 0 since learning_rate is 'optimal'. alpha is used "
                "to compute the optimal learning rate."
            )
        if self.learning_rate in ("pa1", "pa2"):
            needed = "hinge" if self._is_classifier else "epsilon_insensitive"
            if self.loss != needed:
                raise ValueError(f"Learning rate '{self.learning_rate}' only works with loss '{needed}'.")
        if self.penalty == "elasticnet" and self.l1_ratio is None:
            raise ValueError("l1_ratio must be set when penalty is 'elasticnet'")
        if not for_partial_fit and self.checkpoint_every is not None and self.checkpoint is None:
            raise ValueError("checkpoint_every is set but checkpoint is None: pass a checkpoint path")

    def _checkpoint_path(self):
        return None if self.checkpoint is None else os.fspath(self.checkpoint)

    # --- pickling / cloning: the client is not part of a fitted model ------------------
    def __getstate__(self):
        state = super().__getstate__()
        client = state.get("client")
        if client is not None and not isinstance(client, (str, bytes)):
            # A distributed.Client cannot be pickled: a fitted model is a plain
            # object that predicts without a cluster. (client=None on load.)
            state = dict(state, client=None)
        return state

    def __sklearn_clone__(self):
        # clone() deep-copies parameters; a Client must be shared, not copied.
        params = self.get_params(deep=False)
        client = params.pop("client")
        new = type(self)(**{k: clone(v, safe=False) for k, v in params.items()})
        new.client = client
        return new

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    # --- input ---------------------------------------------------------------------------
    def _validate_input(self, X, y, sample_weight, reset):
        """Check X/y as scikit-learn does; dask collections are checked for
        shape and dtype here and for values on the workers."""
        if _is_dask_collection(X):
            meta = _dask_meta(X)
            if getattr(X, "ndim", 2) != 2:
                raise ValueError(f"Expected 2D array, got {getattr(X, 'ndim', '?')}D array instead")
            validate_data(self, X=X, skip_check_array=True, reset=reset)
            _dask_feature_names(self, X, reset)
            if _is_dask_dataframe(X):
                dtype = np.result_type(*[np.dtype(t) for t in X.dtypes]) if len(X.dtypes) else np.float64
                sparse = False
                device = "cpu"
            else:
                dtype = X.dtype
                sparse = _is_sparse(meta)
                device = "cuda" if _backend.is_cupy(meta) or _is_cupy_sparse(meta) else "cpu"
            dtype = np.dtype(dtype)
            if dtype not in (np.float32, np.float64):
                dtype = np.dtype(np.float64)
            if X.shape[1] is not None and not (isinstance(X.shape[1], float) and np.isnan(X.shape[1])):
                n_features = int(X.shape[1])
            else:
                n_features = len(X.columns)
            if y is None:
                raise ValueError("requires y to be passed, but the target y is None")
            return _Input("dask", X, y, sample_weight, n_features, dtype, sparse, device)
        X, y = validate_data(
            self, X, y, accept_sparse="csr", dtype=[np.float64, np.float32], order="C",
            accept_large_sparse=False, reset=reset,
        )
        if self._is_classifier:
            check_classification_targets(y)
        else:
            y = y.astype(X.dtype, copy=False)
        sw = _check_sample_weight(sample_weight, X, dtype=X.dtype, allow_all_zero_weights=self.early_stopping)
        return _Input("memory", X, y, sw, X.shape[1], X.dtype, sp.issparse(X), "cpu")

    # --- the run ---------------------------------------------------------------------------
    def _hyper(self, n_outputs, sparse) -> _Hyper:
        penalty = PENALTY_TYPES[str(self.penalty).lower()]
        l1_ratio = {0: 0.0, L2: 0.0, L1: 1.0}.get(penalty, self.l1_ratio)
        return _Hyper(
            loss=self.loss, epsilon=float(self.epsilon), penalty=penalty, alpha=float(self.alpha),
            l1_ratio=float(l1_ratio), learning_rate=LEARNING_RATE_TYPES[self.learning_rate],
            eta0=float(self.eta0), power_t=float(self.power_t), fit_intercept=bool(self.fit_intercept),
            average=int(self.average), n_outputs=int(n_outputs),
            tol=-np.inf if self.tol is None else float(self.tol), n_iter_no_change=int(self.n_iter_no_change),
            early_stopping=bool(self.early_stopping), validation_fraction=float(self.validation_fraction),
            shuffle=bool(self.shuffle), classifier=self._is_classifier,
        )

    def _train(self, data: _Input, max_iter, n_outputs, coef, intercept, avg_coef, avg_intercept,
               classes=None, cw_pos=None, cw_neg=None, checkpoint=None):
        """Fit on the parameter server from the given start; returns (W, n_iter, n_seen).

        Without ``checkpoint``: one run of ``max_iter`` epochs. With one
        (``fit`` only): a compatible checkpoint found there is resumed from,
        and the epochs run in runs of ``checkpoint_every`` (all in one run if
        None), each followed by a save."""
        ps = get_parameter_server(self.client)
        rs = check_random_state(self.random_state)
        hp = self._hyper(n_outputs, data.sparse)
        d, K = data.n_features, n_outputs
        replication = int(getattr(self, "replication", 1))
        persisted = None
        if data.kind == "dask":
            parts, sizes, _, persisted = _dask_parts(ps, data, self._is_classifier)
        else:
            parts, sizes, persisted = _memory_parts(ps, data, rs, hp.shuffle, replication)
        if not parts:
            raise ValueError("Found array with 0 sample(s) while a minimum of 1 is required.")
        P = len(parts)
        n_cols = 2 * K if hp.average else K
        W0 = np.zeros((d + 1, n_cols), dtype=data.dtype)
        W0[:d, :K] = np.asarray(coef).reshape(K, d).T
        W0[d, :K] = intercept
        if hp.average:
            W0[:d, K:] = np.asarray(avg_coef).reshape(K, d).T
            W0[d, K:] = avg_intercept
        seeds = tuple(int(s) for s in rs.randint(MAX_INT, size=P))
        n_total = int(sum(sizes) * (1.0 - hp.validation_fraction)) if hp.early_stopping else int(sum(sizes))
        n_seen = int(sum(sizes) if not hp.early_stopping else n_total)
        epoch, states, n_iter, saved_stats = 0, None, 0, None
        name = f"dask_ps-sgd-{uuid.uuid4().hex[:12]}"
        if checkpoint is not None:
            resumed = self._resume(ps, checkpoint, hp, d, K, n_cols, classes, P, sizes)
            if resumed is not None:
                W0 = resumed["W"].astype(data.dtype, copy=False)
                epoch, states, n_iter = resumed["epoch"], resumed["states"], resumed["n_iter"]
                seeds = resumed["seeds"] or seeds
                saved_stats = resumed["stats"]
                # The saved names: a save keeps the checkpoint's other tables,
                # so new names would pile up there.
                name = resumed["name"]
        stats = None
        created = []
        runs = []
        try:
            ps.create_table(name, shape=W0.shape, dtype=data.dtype, init=W0 if W0.any() else None,
                            consistency=self.consistency, device=data.device, replication=replication)
            created.append(name)
            staleness = ps.spec(name).consistency.staleness
            global_stop = P > 1 and staleness is not None
            n_stats = K + 1 + K + 3
            if P > 1:
                # Per-round loss sums and per-epoch stopping sums (see
                # _end_epoch): one row per epoch, summed over the participants
                # under a staleness bound (SSP(s) like the weights, without a
                # value bound: a flush must not depend on the values), else
                # one row per participant and epoch.
                stats = name + "-stats"
                n_rows = max_iter if global_stop else P * max_iter
                init = None
                if global_stop and saved_stats is not None and saved_stats.shape[1] == n_stats:
                    init = np.zeros((n_rows, n_stats))
                    k = min(n_rows, saved_stats.shape[0])
                    init[:k] = saved_stats[:k]
                    init = init if init.any() else None
                ps.create_table(stats, shape=(n_rows, n_stats), dtype="float64", init=init,
                                consistency=SSP(staleness) if global_stop else ASP(), replication=replication)
                created.append(stats)
            steps = max(1, math.ceil(max(sizes) / self.batch_size))
            b_local = max(1, max(sizes) // steps)
            clock_every = max(1, int(_config("clock-samples")) // b_local) if P > 1 else steps
            clock_every = min(clock_every, steps)
            clocks_per_epoch = math.ceil(steps / clock_every)
            lag = math.ceil(staleness / clocks_per_epoch) if global_stop else 0
            eta_init = getattr(self, "_adaptive_eta", None)
            if eta_init is None or len(eta_init) != K:
                eta_init = [float(self.eta0)] * K
            cfg = _RunConfig(
                table=name, stats_table=stats, hp=hp, n_features=d, n_cols=n_cols,
                n_total=max(1, n_total), steps_per_epoch=steps, clock_every=clock_every,
                max_iter=int(max_iter), t0=float(self.t_), seeds=seeds,
                staleness=staleness, global_stop=global_stop, decision_lag=lag, classes=classes,
                cw_pos=tuple(np.ones(K) if cw_pos is None else cw_pos),
                cw_neg=tuple(np.ones(K) if cw_neg is None else cw_neg),
                eta_init=tuple(eta_init), col_freq_needed=data.sparse, stats_stride=int(max_iter),
            )
            every = self.checkpoint_every if checkpoint is not None else None
            while epoch < max_iter and (states is None or any(any(s["stop"]["active"]) for s in states)):
                end = int(max_iter) if every is None else min(int(max_iter), epoch + int(every))
                run_cfg = cfg
                if epoch or states is not None or end != max_iter:
                    run_cfg = dataclasses.replace(cfg, epoch0=epoch, max_iter=end, states=states)
                results = ps.run(_sgd_participant, parts, cfg=run_cfg)
                runs.append(results)
                states = tuple(r["state"] for r in results)
                n_iter = int(max(max(s["stop"]["n_iter"]) for s in states))
                epoch = end
                if checkpoint is not None:
                    self._save_checkpoint(ps, checkpoint, [name] + ([stats] if global_stop else []), {
                        "estimator": self._checkpoint_kind(),
                        "n_features": d, "n_outputs": K, "n_cols": n_cols,
                        "classes": None if classes is None else _jsonable(np.asarray(classes).tolist()),
                        "params": self._checkpoint_params(hp),
                        "epoch": epoch, "n_iter": n_iter, "t0": cfg.t0, "t_": cfg.t0 + n_iter * n_seen,
                        "tables": {"weights": name, "stats": stats if global_stop else None},
                        "n_parts": P, "sizes": [int(s) for s in sizes], "seeds": list(seeds),
                        "states": list(states),
                    })
            W = _backend.to_numpy(ps.pull(name))
        finally:
            for t in created:
                try:
                    ps.drop_table(t)
                except Exception:  # pragma: no cover - best effort cleanup
                    pass
            del parts, persisted
        if hp.learning_rate == ADAPTIVE and states is not None:
            self._adaptive_eta = [float(v) for v in states[0]["stop"]["eta"]]
        if self.verbose:
            self._print_progress(runs, P)
        return W, n_iter, n_seen

    def _print_progress(self, runs, n_parts):
        total = secs = 0.0
        for results in runs:
            total += sum(r["samples"] for r in results)
            secs += max(r["seconds"] for r in results)
            prev = 0
            for h in results[0]["history"]:
                # Rank 0's epochs (the others' are alike); its rate times P.
                rate = (h["samples"] - prev) * n_parts / max(h["seconds"], 1e-9)
                prev = h["samples"]
                line = f"-- Epoch {h['epoch']}: avg. objective {h['objective']:.6f}"
                if h["decided"] != h["epoch"]:
                    line += f" (of epoch {h['decided']})"
                if h["score"] is not None:
                    line += f", validation score {h['score']:.6f}"
                if not math.isfinite(h["seconds"]):
                    print(line + " (replayed by a retried participant)")
                    continue
                print(line + f", {h['seconds']:.2f} s, {rate:.3g} samples/s, {n_parts} participant(s)")
        print(f"Total: {total:.0f} samples in {secs:.2f} s ({total / max(secs, 1e-9):.3g} samples/s)")

    # --- checkpoints ---------------------------------------------------------------------
    def _checkpoint_kind(self) -> str:
        return f"dask_ps.linear_model.{type(self).__name__}"

    def _checkpoint_params(self, hp: _Hyper) -> dict:
        """The parameters that define the problem and the schedule (effective
        values): a checkpoint resumes only a fit with the same ones. Not
        compared: max_iter, tol, n_iter_no_change (when to stop), batch_size,
        random_state, consistency, replication, verbose, client."""
        params = {k: getattr(hp, k) for k in (
            "loss", "epsilon", "penalty", "alpha", "l1_ratio", "learning_rate", "eta0", "power_t",
            "fit_intercept", "average", "early_stopping", "validation_fraction", "shuffle")}
        params["penalty"] = str(self.penalty).lower()
        params["learning_rate"] = self.learning_rate
        if not hp.early_stopping:
            params.pop("validation_fraction")
        if hp.loss not in _EPSILON_LOSSES:
            params.pop("epsilon")
        if self._is_classifier:
            params["class_weight"] = self.class_weight
        return _jsonable(params)

    def _resume(self, ps, path, hp, d, K, n_cols, classes, n_parts, sizes):
        """The state saved at ``path`` (None: no checkpoint there): loads its
        tables (``ps.load``), checks that it belongs to this fit, reads the
        weights and stopping sums, and drops the loaded tables again."""
        meta = checkpoint_metadata(path)
        if meta is None:
            return None
        where = f"the checkpoint at {path!r}"
        if meta.get("estimator") != self._checkpoint_kind():
            raise ValueError(
                f"{where} was not written by {type(self).__name__}.fit (it holds "
                f"{meta.get('estimator') or 'tables of something else'}); use another checkpoint path"
            )
        diffs = []
        if meta["n_features"] != d:
            diffs.append(f"n_features: {meta['n_features']} there, {d} here")
        mine = None if classes is None else _jsonable(np.asarray(classes).tolist())
        if meta.get("classes") != mine:
            diffs.append(f"classes: {meta.get('classes')} there, {mine} here")
        if meta["n_cols"] != n_cols and not diffs:
            diffs.append(f"weights columns: {meta['n_cols']} there, {n_cols} here")
        mine = self._checkpoint_params(hp)
        for k in sorted(set(mine) | set(meta["params"])):
            if meta["params"].get(k) != mine.get(k):
                diffs.append(f"{k}: {meta['params'].get(k)!r} there, {mine.get(k)!r} here")
        if diffs:
            raise ValueError(
                f"{where} belongs to another fit ({'; '.join(diffs)}): use another checkpoint "
                "path, or delete that checkpoint to start over"
            )
        tables = meta["tables"]
        names = [tables["weights"]] + ([tables["stats"]] if tables.get("stats") else [])
        ps.load(path, tables=names, overwrite=True)
        try:
            W = _backend.to_numpy(ps.pull(tables["weights"]))
            saved_stats = _backend.to_numpy(ps.pull(tables["stats"])) if tables.get("stats") else None
        finally:
            for t in names:
                try:
                    ps.drop_table(t)
                except Exception:  # pragma: no cover - best effort cleanup
                    pass
        if W.shape != (d + 1, n_cols):
            raise ValueError(f"{where}: weights of shape {W.shape}, expected {(d + 1, n_cols)}")
        states = [dict(s) for s in meta["states"]]
        same_parts = meta["n_parts"] == n_parts and list(meta["sizes"]) == [int(s) for s in sizes]
        if not same_parts:
            # Another split of the data (another number of workers, or sizes):
            # every participant goes on with the first one's stopping rule and
            # a fresh shuffling RNG.
            states = [{"stop": states[0]["stop"], "rng": None} for _ in range(n_parts)]
        return {
            "W": W, "stats": saved_stats, "name": tables["weights"],
            "epoch": int(meta["epoch"]), "n_iter": int(meta["n_iter"]),
            "states": tuple(states), "seeds": tuple(meta["seeds"]) if meta["n_parts"] == n_parts else None,
        }

    def _save_checkpoint(self, ps, path, tables, metadata) -> None:
        """``ps.save`` between two runs. It refuses while any run is in
        progress on the cluster (another fit, say): retry for a while, then
        warn and go on training (the next save may succeed)."""
        deadline = time.monotonic() + 30.0
        while True:
            try:
                ps.save(path, tables=tables, metadata=metadata)
                return
            except RuntimeError as e:
                if time.monotonic() > deadline:
                    warnings.warn(f"{type(self).__name__}: checkpoint after epoch {metadata['epoch']} "
                                  f"not saved: {e}", RuntimeWarning, stacklevel=3)
                    return
                time.sleep(0.5)

    def _store(self, W, K, d):
        """Set coef_/intercept_ (and the averaging state) from the final table."""
        coef = np.ascontiguousarray(W[:d, :K].T)
        intercept = np.array(W[d, :K])
        if self.average:
            self._standard_coef = coef
            self._standard_intercept = intercept
            self._average_coef = np.ascontiguousarray(W[:d, K:].T)
            self._average_intercept = np.array(W[d, K:])
            if self.average <= self.t_ - 1:
                coef, intercept = self._average_coef, self._average_intercept
        return coef, intercept

    # --- prediction on dask collections ---------------------------------------------------
    def _check_dask_X(self, X):
        check_is_fitted(self)
        validate_data(self, X=X, skip_check_array=True, reset=False)
        _dask_feature_names(self, X, reset=False)
        if _is_dask_dataframe(X):
            X = X.to_dask_array()
        if X.ndim != 2:
            raise ValueError(f"Expected 2D array, got {X.ndim}D array instead")
        if X.numblocks[1] > 1:
            X = X.rechunk({1: -1})
        return X


def _dask_feature_names(est, X, reset):
    """``feature_names_in_`` for a dask DataFrame (scikit-learn's check reads
    pandas/narwhals frames only)."""
    names = None
    if _is_dask_dataframe(X):
        cols = np.asarray(list(X.columns), dtype=object)
        if len(cols) and all(isinstance(c, str) for c in cols):
            names = cols
    if reset:
        if names is not None:
            est.feature_names_in_ = names
        elif hasattr(est, "feature_names_in_"):
            del est.feature_names_in_
        return
    fitted = getattr(est, "feature_names_in_", None)
    if fitted is not None and names is not None and not np.array_equal(fitted, names):
        raise ValueError(
            "The feature names should match those that were passed during fit.\n"
            f"Feature names seen at fit time: {list(fitted)}; now: {list(names)}"
        )


def _block_decision(X, coef, intercept):
    """Task: decision values of one block (numpy, scipy.sparse or cupy)."""
    if hasattr(X, "to_numpy"):
        X = X.to_numpy()
    xp = _xp_of(X)
    scores = X @ xp.asarray(coef.T) + xp.asarray(intercept)
    scores = xp.asarray(scores)
    return scores.ravel() if scores.shape[1] == 1 else scores


def _block_predict(X, coef, intercept, classes):
    s = _block_decision(X, coef, intercept)
    xp = _backend.namespace(s)
    idx = (s > 0).astype(int) if s.ndim == 1 else xp.argmax(s, axis=1)
    return classes[_backend.to_numpy(idx)]


def _block_proba(X, coef, intercept, loss, n_classes):
    s = _block_decision(X, coef, intercept)
    xp = _backend.namespace(s)
    if loss == "log_loss":
        p = _expit(s, xp)
        if s.ndim == 1:
            return xp.stack([1 - p, p], axis=1)
        return p / xp.sum(p, axis=1, keepdims=True)
    # modified_huber, as scikit-learn's SGDClassifier.predict_proba
    if s.ndim == 1:
        p1 = (xp.clip(s, -1, 1) + 1) / 2.0
        return xp.stack([1 - p1, p1], axis=1)
    p = (xp.clip(s, -1, 1) + 1) / 2.0
    norm = xp.sum(p, axis=1, keepdims=True)
    all_zero = norm[:, 0] == 0
    p = xp.where(all_zero[:, None], 1.0 / n_classes, p / xp.where(norm == 0, 1.0, norm))
    return p


class SGDClassifier(LinearClassifierMixin, _BaseSGDPS):
    """Linear classifiers (SVM, logistic regression, ...) trained by SGD on the
    parameter server.

    The parameters and fitted attributes are scikit-learn's
    :class:`sklearn.linear_model.SGDClassifier` (without ``n_jobs``), plus:

    Parameters
    ----------
    batch_size : int, default=256
        Samples per minibatch and participant: the unit of a pull and a push.
        Each participant clocks every ``ps.sgd.clock-samples`` samples.
    consistency : dask_ps.Consistency, optional
        Consistency model of the weights table (``dask_ps.SSP(2)``, ``BSP()``,
        ...); default from ``dask.config`` ``ps.consistency``.
    client : distributed.Client, optional
        The cluster to train on. ``None``: the current client, or a
        ``LocalCluster`` started once per process.
    checkpoint : str or path-like, default=None
        Where ``fit`` saves its state (``ParameterServer.save``: any fsspec
        URL that the client and every worker can reach, e.g. a shared
        directory or ``s3://...``). If it already holds a checkpoint of a
        compatible fit (same estimator, ``n_features``, classes and
        problem-defining parameters: loss, penalty, alpha, l1_ratio,
        learning_rate, eta0, power_t, epsilon, fit_intercept, average,
        shuffle, early_stopping, validation_fraction, class_weight), ``fit``
        resumes from it: it loads the weights and goes on from the saved
        epoch up to ``max_iter``, with the saved stopping-rule state. One
        that belongs to another fit raises ``ValueError``. ``max_iter``,
        ``tol``, ``n_iter_no_change``, ``batch_size``, ``consistency`` and
        ``replication`` may differ. A resume is exact (the same run as one
        that was never interrupted, up to the asynchrony of the participants)
        when the data is split the same way: the same data, number of workers
        and an int ``random_state``; otherwise the participants go on with
        fresh shuffling. A checkpoint at or past ``max_iter`` epochs (or
        of a fit that stopped) gives the saved model without training. A
        resumed fit ignores ``coef_init``, ``intercept_init`` and
        ``warm_start``; ``partial_fit`` ignores ``checkpoint``. Use one path
        per fit at a time.
    checkpoint_every : int, default=None
        Save every this many epochs: ``fit`` then trains in runs of
        ``checkpoint_every`` epochs (one ``ParameterServer.run`` each) and
        saves after each. ``None``: one save, at the end of ``fit``.
        Requires ``checkpoint``. The stopping rule (``tol``,
        ``early_stopping``) carries over from one run to the next.
    replication : int, default=1
        Copies of the weights on distinct workers (``create_table(...,
        replication=k)``). With 2 or more, a fit survives the loss of a
        worker: the weights have a copy elsewhere, Dask retries the
        participant that ran there, and the retried participant resumes at
        the clock it was in. An in-memory input (numpy, scipy.sparse) is then
        also kept on ``replication`` workers, so that Dask can rebuild the
        dead worker's part of the data (dask inputs are recomputed from their
        graph). With 1, a lost worker takes the only copy of some weights
        (and of scattered data) with it and the fit fails as the reliability
        docs describe; with ``checkpoint``, ``fit`` again resumes from the
        last save.

    All the scikit-learn parameters (``loss``, ``penalty``, ``alpha``,
    ``l1_ratio``, ``fit_intercept``, ``max_iter``, ``tol``, ``shuffle``,
    ``verbose``, ``epsilon``, ``random_state``, ``learning_rate``, ``eta0``,
    ``power_t``, ``early_stopping``, ``validation_fraction``,
    ``n_iter_no_change``, ``class_weight``, ``warm_start``, ``average``) mean
    what they mean there, except that ``shuffle`` shuffles per participant,
    and, for sparse numpy/scipy data trained with the compiled kernel (the
    default where numba is installed), per *round*: which samples form each
    round of ``ps.sgd.clock-samples`` samples is drawn once per fit, and each
    later epoch shuffles the order of the rounds and the order of the
    samples within each round (scikit-learn reshuffles all samples each
    epoch; dask-ml's ``Incremental`` shuffles whole blocks). This lets a
    participant compact each round to its touched features once per fit
    instead of once per epoch; the compacted rounds take about as much
    memory as the participant's own CSR (kept while within
    ``ps.sgd.round-cache-bytes``, default 2 GiB per participant; beyond it
    they are rebuilt each epoch, with the same result).

    Attributes
    ----------
    coef_, intercept_, classes_, n_iter_, t_, n_features_in_, feature_names_in_
        As scikit-learn's. After ``fit`` the model holds numpy arrays only: it
        pickles and predicts without a cluster.

    Notes
    -----
    ``X`` may be a numpy array, a scipy.sparse matrix (CSR), a dask array
    (numpy, scipy.sparse or cupy chunks) or a dask DataFrame (``y`` then a
    dask array or Series with the same partitions). Dask inputs are trained
    where their blocks are, by one participant per worker that holds blocks
    once they are computed; nothing is gathered to the client. A collection
    persisted with all its blocks on one worker therefore trains on one
    core: spread it first (``client.rebalance`` or ``persist`` with the
    blocks on several workers). ``predict``, ``decision_function`` and
    ``predict_proba`` return lazy dask arrays for dask inputs.
    """

    _is_classifier = True
    _parameter_constraints: dict = _constraints(_SkSGDClassifier)

    def __init__(
        self,
        loss="hinge",
        *,
        penalty="l2",
        alpha=0.0001,
        l1_ratio=0.15,
        fit_intercept=True,
        max_iter=1000,
        tol=1e-3,
        shuffle=True,
        verbose=0,
        epsilon=0.1,
        random_state=None,
        learning_rate="optimal",
        eta0=0.01,
        power_t=0.5,
        early_stopping=False,
        validation_fraction=0.1,
        n_iter_no_change=5,
        class_weight=None,
        warm_start=False,
        average=False,
        batch_size=256,
        consistency=None,
        client=None,
        checkpoint=None,
        checkpoint_every=None,
        replication=1,
    ):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.shuffle = shuffle
        self.verbose = verbose
        self.epsilon = epsilon
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.class_weight = class_weight
        self.warm_start = warm_start
        self.average = average
        self.batch_size = batch_size
        self.consistency = consistency
        self.client = client
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.replication = replication

    # --- fitting -------------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, coef_init=None, intercept_init=None, sample_weight=None):
        """Fit the linear model with SGD on the parameter server.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array, dask DataFrame} of shape (n_samples, n_features)
        y : array-like or dask collection of shape (n_samples,)
        coef_init : ndarray of shape (n_classes, n_features), default=None
        intercept_init : ndarray of shape (n_classes,), default=None
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        self._more_validate_params()
        if hasattr(self, "classes_"):
            del self.classes_
        if self.warm_start and getattr(self, "coef_", None) is not None:
            if coef_init is None:
                coef_init = self.coef_ if not self.average else self._standard_coef
            if intercept_init is None:
                intercept_init = self.intercept_ if not self.average else self._standard_intercept
            avg = (getattr(self, "_average_coef", None), getattr(self, "_average_intercept", None))
        else:
            self.coef_ = None
            self.intercept_ = None
            avg = (None, None)
            if hasattr(self, "_adaptive_eta"):
                del self._adaptive_eta
        self.t_ = 1.0
        self._partial_fit(X, y, self.max_iter, "infer", sample_weight, coef_init, intercept_init, avg, reset=True,
                          checkpoint=self._checkpoint_path())
        if self.tol is not None and self.tol > -np.inf and self.n_iter_ == self.max_iter:
            warnings.warn(
                "Maximum number of iteration reached before convergence. Consider increasing "
                "max_iter to improve the fit.",
                ConvergenceWarning,
            )
        if self.power_t < 0:
            warnings.warn(
                "Negative values for `power_t` are deprecated in version 1.8 and will raise an "
                "error in 1.10. Use values in the range [0.0, inf) instead.",
                FutureWarning,
            )
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch of SGD over the given samples (``max_iter=1``).

        ``classes`` is required on the first call, as in scikit-learn.
        """
        first = not hasattr(self, "classes_")
        if first:
            self._more_validate_params(for_partial_fit=True)
            if self.class_weight == "balanced":
                raise ValueError(
                    "class_weight '{0}' is not supported for partial_fit. In order to use "
                    "'balanced' weights, use compute_class_weight('{0}', classes=classes, y=y). "
                    "In place of y you can use a large enough sample of the full training set "
                    "target to properly estimate the class frequency distributions. Pass the "
                    "resulting weights as the class_weight parameter.".format(self.class_weight)
                )
        return self._partial_fit(X, y, 1, classes, sample_weight, None, None, None, reset=first)

    def _partial_fit(self, X, y, max_iter, classes, sample_weight, coef_init, intercept_init, avg, reset,
                     checkpoint=None):
        data = self._validate_input(X, y, sample_weight, reset=reset)
        if data.kind == "memory":
            if isinstance(classes, str) and classes == "infer":  # fit: the labels of y
                classes = np.unique(data.y)
            _check_partial_fit_first_call(self, classes)
            y_for_weights = data.y
        else:
            if isinstance(classes, str) and classes == "infer":
                classes = self._dask_classes(data.y)
            _check_partial_fit_first_call(self, classes)
            y_for_weights = None
        n_classes = self.classes_.shape[0]
        if n_classes < 2:
            raise ValueError(
                "The number of classes has to be greater than one; got %d class" % n_classes
            )
        if y_for_weights is None and self.class_weight == "balanced":
            y_for_weights = self._dask_balanced_y(data.y)
        if y_for_weights is not None:
            cw = compute_class_weight(self.class_weight, classes=self.classes_, y=y_for_weights)
        elif self.class_weight is None:
            cw = np.ones(n_classes, dtype=np.float64)
        else:  # a dict; labels of y are checked on the workers
            cw = compute_class_weight(self.class_weight, classes=self.classes_, y=self.classes_)
        self._expanded_class_weight = cw
        K = 1 if n_classes == 2 else n_classes
        d = data.n_features
        if getattr(self, "coef_", None) is None or coef_init is not None:
            coef, intercept = self._initial_params(K, d, data.dtype, coef_init, intercept_init)
            avg_coef = np.zeros((K, d), dtype=data.dtype)
            avg_intercept = np.zeros(K, dtype=data.dtype)
            if avg is not None and avg[0] is not None and self.average:
                avg_coef, avg_intercept = avg
        else:
            if d != self.coef_.shape[-1]:
                raise ValueError(
                    "Number of features %d does not match previous data %d." % (d, self.coef_.shape[-1])
                )
            if self.average and getattr(self, "_standard_coef", None) is not None:
                coef, intercept = self._standard_coef, self._standard_intercept
                avg_coef, avg_intercept = self._average_coef, self._average_intercept
            else:
                coef, intercept = self.coef_, self.intercept_
                avg_coef = np.zeros((K, d), dtype=data.dtype)
                avg_intercept = np.zeros(K, dtype=data.dtype)
        if not hasattr(self, "t_"):
            self.t_ = 1.0
        if n_classes == 2:
            cw_pos, cw_neg = [cw[1]], [cw[0]]
        else:
            cw_pos, cw_neg = list(cw), [1.0] * n_classes
        W, n_iter, n_seen = self._train(
            data, max_iter, K, coef, intercept, avg_coef, avg_intercept,
            classes=self.classes_, cw_pos=cw_pos, cw_neg=cw_neg, checkpoint=checkpoint,
        )
        self.n_iter_ = n_iter
        self.t_ += n_iter * n_seen
        self.coef_, self.intercept_ = self._store(W, K, d)
        return self

    def _initial_params(self, K, d, dtype, coef_init, intercept_init):
        if coef_init is not None:
            coef_init = np.asarray(coef_init, dtype=dtype)
            if K > 1 and coef_init.shape != (K, d):
                raise ValueError("Provided ``coef_`` does not match dataset. ")
            if K == 1:
                coef_init = coef_init.ravel()
                if coef_init.shape != (d,):
                    raise ValueError("Provided coef_init does not match dataset.")
            coef = coef_init.reshape(K, d)
        else:
            coef = np.zeros((K, d), dtype=dtype)
        if intercept_init is not None:
            intercept_init = np.asarray(intercept_init, dtype=dtype)
            if K > 1 and intercept_init.shape != (K,):
                raise ValueError("Provided intercept_init does not match dataset.")
            if K == 1 and intercept_init.shape not in ((1,), ()):
                raise ValueError("Provided intercept_init does not match dataset.")
            intercept = intercept_init.reshape(K)
        else:
            intercept = np.zeros(K, dtype=dtype)
        return coef, intercept

    def _dask_classes(self, y):
        """Unique labels of a dask y, computed on the workers."""
        import dask.array as da

        if hasattr(y, "unique") and not hasattr(y, "chunks"):  # dask Series
            classes = np.sort(np.asarray(y.unique().compute()))
        else:
            classes = np.asarray(da.unique(y).compute())
        check_classification_targets(classes)
        if type_of_target(classes) not in ("binary", "multiclass"):
            raise ValueError(f"Unknown label type: {type_of_target(classes)}")
        return classes

    def _dask_balanced_y(self, y):
        """A label array with the class frequencies of a dask y (for 'balanced')."""
        import dask.array as da

        if hasattr(y, "value_counts"):
            vc = y.value_counts().compute()
            labels, counts = np.asarray(vc.index), np.asarray(vc.values)
        else:
            labels, counts = da.unique(y, return_counts=True)
            labels, counts = dask.compute(labels, counts)
        return np.repeat(labels, counts.astype(int))

    # --- prediction -------------------------------------------------------------------------
    def decision_function(self, X):
        """Confidence scores; a lazy dask array for dask input."""
        if _is_dask_collection(X):
            X = self._check_dask_X(X)
            K = self.coef_.shape[0]
            if K == 1:
                return X.map_blocks(_block_decision, self.coef_, self.intercept_, drop_axis=1,
                                    dtype=self.coef_.dtype)
            return X.map_blocks(_block_decision, self.coef_, self.intercept_,
                                chunks=(X.chunks[0], (K,)), dtype=self.coef_.dtype)
        return super().decision_function(X)

    def predict(self, X):
        """Class labels; a lazy dask array for dask input."""
        if _is_dask_collection(X):
            X = self._check_dask_X(X)
            return X.map_blocks(_block_predict, self.coef_, self.intercept_, self.classes_, drop_axis=1,
                                dtype=self.classes_.dtype)
        return super().predict(X)

    def _check_proba(self):
        if self.loss not in ("log_loss", "modified_huber"):
            raise AttributeError("probability estimates are not available for loss=%r" % self.loss)
        return True

    @available_if(_check_proba)
    def predict_proba(self, X):
        """Probability estimates (``log_loss`` and ``modified_huber``), as
        scikit-learn's; a lazy dask array for dask input."""
        check_is_fitted(self)
        if _is_dask_collection(X):
            X = self._check_dask_X(X)
            n = len(self.classes_)
            return X.map_blocks(_block_proba, self.coef_, self.intercept_, self.loss, n,
                                chunks=(X.chunks[0], (n,)), dtype=self.coef_.dtype)
        if self.loss == "log_loss":
            return self._predict_proba_lr(X)
        scores = self.decision_function(X)
        return _block_proba_from_scores(scores, len(self.classes_))

    @available_if(_check_proba)
    def predict_log_proba(self, X):
        """Log of ``predict_proba``."""
        p = self.predict_proba(X)
        if _is_dask_collection(p):
            import dask.array as da

            return da.log(p)
        return np.log(p)


def _block_proba_from_scores(scores, n_classes):
    """scikit-learn's modified_huber probabilities from decision values."""
    binary = scores.ndim == 1
    if binary:
        prob2 = np.ones((scores.shape[0], 2))
        prob = prob2[:, 1]
    else:
        prob = scores
    np.clip(scores, -1, 1, prob)
    prob += 1.0
    prob /= 2.0
    if binary:
        prob2[:, 0] -= prob
        return prob2
    prob_sum = prob.sum(axis=1)
    all_zero = prob_sum == 0
    if np.any(all_zero):
        prob[all_zero, :] = 1
        prob_sum[all_zero] = len(prob[0])
    prob /= prob_sum.reshape((prob.shape[0], -1))
    return prob


class SGDRegressor(RegressorMixin, _BaseSGDPS):
    """Linear regression trained by SGD on the parameter server.

    The parameters and fitted attributes are scikit-learn's
    :class:`sklearn.linear_model.SGDRegressor`, plus ``batch_size``,
    ``consistency``, ``client``, ``checkpoint``, ``checkpoint_every`` and
    ``replication`` (see :class:`SGDClassifier`, also for what ``shuffle``
    does on sparse data: rounds fixed per fit, their order and the order of
    their samples reshuffled each epoch).
    ``predict`` returns a lazy dask array for dask input.
    """

    _is_classifier = False
    _parameter_constraints: dict = _constraints(_SkSGDRegressor)

    def __init__(
        self,
        loss="squared_error",
        *,
        penalty="l2",
        alpha=0.0001,
        l1_ratio=0.15,
        fit_intercept=True,
        max_iter=1000,
        tol=1e-3,
        shuffle=True,
        verbose=0,
        epsilon=0.1,
        random_state=None,
        learning_rate="invscaling",
        eta0=0.01,
        power_t=0.25,
        early_stopping=False,
        validation_fraction=0.1,
        n_iter_no_change=5,
        warm_start=False,
        average=False,
        batch_size=256,
        consistency=None,
        client=None,
        checkpoint=None,
        checkpoint_every=None,
        replication=1,
    ):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.shuffle = shuffle
        self.verbose = verbose
        self.epsilon = epsilon
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.average = average
        self.batch_size = batch_size
        self.consistency = consistency
        self.client = client
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.replication = replication

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, coef_init=None, intercept_init=None, sample_weight=None):
        """Fit the linear model with SGD on the parameter server.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array, dask DataFrame} of shape (n_samples, n_features)
        y : array-like or dask collection of shape (n_samples,)
        coef_init : ndarray of shape (n_features,), default=None
        intercept_init : ndarray of shape (1,), default=None
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        self._more_validate_params()
        if self.warm_start and getattr(self, "coef_", None) is not None:
            if coef_init is None:
                coef_init = self.coef_ if not self.average else self._standard_coef
            if intercept_init is None:
                intercept_init = self.intercept_ if not self.average else self._standard_intercept
            avg = (getattr(self, "_average_coef", None), getattr(self, "_average_intercept", None))
        else:
            self.coef_ = None
            self.intercept_ = None
            avg = (None, None)
            if hasattr(self, "_adaptive_eta"):
                del self._adaptive_eta
        self.t_ = 1.0
        self._partial_fit(X, y, self.max_iter, sample_weight, coef_init, intercept_init, avg,
                          reset=True, checkpoint=self._checkpoint_path())
        if self.tol is not None and self.tol > -np.inf and self.n_iter_ == self.max_iter:
            warnings.warn(
                "Maximum number of iteration reached before convergence. Consider increasing "
                "max_iter to improve the fit.",
                ConvergenceWarning,
            )
        if self.power_t < 0:
            warnings.warn(
                "Negative values for `power_t` are deprecated in version 1.8 and will raise an "
                "error in 1.10. Use values in the range [0.0, inf) instead.",
                FutureWarning,
            )
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, sample_weight=None):
        """One epoch of SGD over the given samples (``max_iter=1``)."""
        first = not hasattr(self, "coef_")
        if first:
            self._more_validate_params(for_partial_fit=True)
        return self._partial_fit(X, y, 1, sample_weight, None, None, None, reset=first)

    def _partial_fit(self, X, y, max_iter, sample_weight, coef_init, intercept_init, avg, reset, checkpoint=None):
        first_call = getattr(self, "coef_", None) is None
        data = self._validate_input(X, y, sample_weight, reset=reset or first_call)
        d = data.n_features
        if first_call or coef_init is not None:
            coef = np.zeros(d, dtype=data.dtype) if coef_init is None else np.asarray(coef_init, data.dtype).ravel()
            if coef.shape != (d,):
                raise ValueError("Provided coef_init does not match dataset.")
            if intercept_init is None:
                intercept = np.zeros(1, dtype=data.dtype)
            else:
                intercept = np.asarray(intercept_init, dtype=data.dtype).reshape(-1)
                if intercept.shape != (1,):
                    raise ValueError("Provided intercept_init does not match dataset.")
            avg_coef = np.zeros(d, dtype=data.dtype)
            avg_intercept = np.zeros(1, dtype=data.dtype)
            if avg is not None and avg[0] is not None and self.average:
                avg_coef, avg_intercept = avg
        else:
            if d != self.coef_.shape[-1]:
                raise ValueError(
                    "Number of features %d does not match previous data %d." % (d, self.coef_.shape[-1])
                )
            if self.average and getattr(self, "_standard_coef", None) is not None:
                coef, intercept = self._standard_coef, self._standard_intercept
                avg_coef, avg_intercept = self._average_coef, self._average_intercept
            else:
                coef, intercept = self.coef_, self.intercept_
                avg_coef = np.zeros(d, dtype=data.dtype)
                avg_intercept = np.zeros(1, dtype=data.dtype)
        if not hasattr(self, "t_"):
            self.t_ = 1.0
        W, n_iter, n_seen = self._train(data, max_iter, 1, coef, intercept, avg_coef, avg_intercept,
                                        checkpoint=checkpoint)
        self.n_iter_ = n_iter
        self.t_ += n_iter * n_seen
        coef, intercept = self._store(W, 1, d)
        self.coef_ = coef.ravel()
        self.intercept_ = np.atleast_1d(intercept)
        if self.average:
            self._standard_coef = self._standard_coef.ravel()
            self._average_coef = self._average_coef.ravel()
        return self

    def _decision_function(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", reset=False)
        return np.asarray(X @ self.coef_.T).ravel() + self.intercept_

    def predict(self, X):
        """Predicted targets; a lazy dask array for dask input."""
        if _is_dask_collection(X):
            X = self._check_dask_X(X)
            return X.map_blocks(_block_decision, self.coef_.reshape(1, -1), self.intercept_,
                                drop_axis=1, dtype=self.coef_.dtype)
        return self._decision_function(X)
