"""A lone participant trained as scikit-learn's ``_plain_sgd`` (issue 24).

A participant alone on its data that holds the whole table *is*
scikit-learn's fit, bit for bit: the caller draws scikit-learn's
validation split and shuffle seeds from ``random_state`` in scikit-learn's
order (``lone_sklearn_draws``); each output trains in the order of
scikit-learn's shuffle (``SklearnOrders``); its rounds are whole and the
kernel keeps its weight vector's scale and averages over the fit, the
weights unscaled until a copy is scaled as scikit-learn's
``reset_wscale`` does (``scaled``). Its epochs and stopping rule are a
Python loop around the compiled round kernel (``lone_epochs``, called by
``_rounds._CompiledRounds.lone_epochs``): one kernel call per epoch and
output, as scikit-learn's ``_plain_sgd`` is one call per output.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.blas import get_blas_funcs
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit

import math

from dask_ps.linear_model._kernels import MAX_INT, stop_decision


def lone_sklearn_draws(est, hp, y, sw, random_state):
    """scikit-learn's draws for the data of a lone participant, made in the
    caller's process from the estimator's ``random_state`` in scikit-learn's
    order: ``(validation_idx, seeds)``, the validation split
    (``_make_validation_split``; sorted, None without early stopping or
    where the classes cannot be stratified: the participant's split then)
    and per output the seed of ``_plain_sgd``'s shuffle.

    The splitter takes ``random_state`` itself (consuming a ``RandomState``
    instance); a binary classifier's ``make_dataset`` draws once before it
    (``fit_binary``); a multiclass one draws a seed per class, from which
    each class's ``fit_binary`` draws again; a regressor draws its seed
    after the split. With them a lone participant trains on
    scikit-learn's training samples in its order (``SklearnOrders``).
    ``y`` None (a dask input, not here): the seeds only, the participant
    draws its split."""
    K = hp.n_outputs
    int32_max = np.iinfo(np.int32).max
    if hp.classifier and K == 1:
        random_state.randint(1, int32_max)  # make_dataset's draw, before the split
    validation_idx = None
    if hp.early_stopping and y is not None:
        n = y.shape[0]
        splitter = StratifiedShuffleSplit if hp.classifier else ShuffleSplit
        # scikit-learn's split, and its error where it cannot be drawn (a
        # validation set smaller than the classes: it was drawn unstratified)
        idx_train, idx_val = next(splitter(test_size=hp.validation_fraction, random_state=est.random_state)
                                  .split(np.zeros((n, 1)), y))
        if idx_val.shape[0] and not np.any(np.asarray(sw)[idx_val] > 0):
            raise ValueError("The sample weights for validation set are all zero, consider using a "
                             "different random state.")
        validation_idx = np.sort(idx_val)
    if hp.classifier and K > 1:
        seeds = []
        for s in random_state.randint(MAX_INT, size=K):  # each class's fit_binary(random_state=s)
            rs = np.random.RandomState(s)
            rs.randint(1, int32_max)
            seeds.append(int(rs.randint(MAX_INT)))
    else:
        seeds = [int(random_state.randint(MAX_INT))]
        if not hp.classifier:
            random_state.randint(1, int32_max)  # make_dataset's draw, after the seed
    return validation_idx, tuple(seeds)


class SklearnOrders:
    """A lone participant's sample order per output, scikit-learn's: the
    samples shuffled in place each epoch by ``SequentialDataset.shuffle``
    with the output's seed (``_sgd_numba.sklearn_shuffle``: the same
    permutation applied again; ``seeds`` from
    ``_participant.lone_sklearn_draws``), the validation samples skipped,
    as ``_plain_sgd`` iterates its dataset (``lone_epochs`` shuffles
    ``ind`` in place each epoch and skips the samples outside ``keep``).
    Starts at epoch ``epoch0``."""

    def __init__(self, mod, seeds, n, train_idx, shuffle, epoch0=0):
        self.mod, self.seeds, self.shuffle = mod, [int(s) for s in seeds], bool(shuffle)
        self.keep = np.zeros(n, dtype=bool)
        self.keep[train_idx] = True
        self.ind = np.tile(np.arange(n, dtype=np.int64), (len(self.seeds), 1))  # one order per output
        self.all_kept = bool(self.keep.all())
        for _ in range(epoch0 if self.shuffle else 0):
            self._shuffle()

    def _shuffle(self):
        for ind, seed in zip(self.ind, self.seeds):
            self.mod.sklearn_shuffle(ind, seed)


def finite(intercept, w) -> bool:
    """Whether ``intercept`` and every weight of ``w`` are finite
    (scikit-learn's check after each epoch; weight by weight: a sum may
    overflow, and warns where it does)."""
    return math.isfinite(intercept) and bool(np.isfinite(w).all())


def lone_epochs(kernel, shuffle, Xs, orders, rows, Y, sw, Wt, averaged, state, q, u, rule, cw, consts, t0, n_total,
                epochs, decide, stop, sums):
    """The epochs ``[epoch0, epoch1)`` (``epochs``) of a lone participant,
    each output trained as scikit-learn's ``_plain_sgd`` trains it: its
    samples shuffled in place in ``orders.ind[k]`` (with ``shuffle``),
    those of ``orders.keep`` trained in that order by one call of the round
    kernel ``kernel`` (``_sgd_numba.round_kernel``'s of the fit's case,
    the weight vector's state ``state[k]`` kept: ``Wt[k]`` and, ``averaged``,
    the average ``Wt[K + k]`` stay unscaled, the intercept last), the
    weights checked finite, and with ``decide`` the stopping rule
    (``stop_decision``, the one scikit-learn's) applied to the epoch's
    objective; without, the caller decides, on a validation score.
    ``stop``: ``best``, ``no_improvement``, ``eta``, ``active`` and
    ``n_iter`` (the epochs output ``k`` trained) are updated in place;
    ``rule``: ``(tol, n_iter_no_change, adaptive)``; ``cw``: the class
    weights ``(cw_pos, cw_neg)`` per output; ``consts``: the kernel's
    arguments ``(thr, alpha, l1_ratio, eta0, power_t, optimal_init,
    fit_intercept, intercept_decay, average, wscale_min, dummy, every)``.

    A Python loop: the per-sample work is the kernel's; a compiled loop
    around it cost a first fit 0.65 s more compile (issue 35) for ~5 us
    less an epoch (``docs/benchmarks.md``). ``sums[e - epoch0, k]``: the
    epoch's loss sum, objective sum, and 1 if the output is still active
    after it. Returns ``(end, bad)``: the epoch after the last one trained,
    and the epoch whose weights were not finite (-1: none; it stops there)."""
    thr, alpha, l1_ratio, eta0, power_t, optimal_init, fit_intercept, intercept_decay, average, wscale_min, \
        dummy, every = consts
    tol, n_iter_no_change, adaptive = rule
    K = Wt.shape[0] // 2 if averaged else Wt.shape[0]
    nw = Wt.shape[1] - 1
    n_mean = int(np.count_nonzero(orders.keep)) or 1
    step = n_total / n_mean
    epoch0, epoch1 = epochs
    shuffle_order = orders.mod.sklearn_shuffle
    active, eta = stop.active, stop.eta
    # per output, the views its kernel call takes, made once (a few us an epoch)
    outputs = [(k, orders.ind[k], orders.seeds[k], Wt[k, :nw], Wt[K + k, :nw] if averaged else dummy, Y[k],
                cw[0][k], cw[1][k], q[k], state[k]) for k in range(K)]
    for e in range(epoch0, epoch1):
        live = [o for o in outputs if active[o[0]]]  # a decision changes its own output's flag only
        if not live:
            return e, -1
        t = t0 + e * n_total
        epoch_sums = sums[e - epoch0]
        for k, order, seed, w, aw, y, cw_pos, cw_neg, q_k, state_k in live:
            if shuffle:
                shuffle_order(order, seed)
            if orders.all_kept:
                train = order
            else:  # the validation samples skipped, in the order's
                train = order[orders.keep[order]]
                rows[:train.shape[0]] = train
                train = rows[:train.shape[0]]
            icpt, aicpt, sumloss, _, _, u[k], objective = kernel(
                *Xs, train, y, sw, w, aw, Wt[k, nw], Wt[K + k, nw] if averaged else 0.0, thr, alpha, l1_ratio,
                eta[k] if adaptive else eta0, eta0, power_t, optimal_init, fit_intercept, intercept_decay, cw_pos,
                cw_neg, average, t, step, wscale_min, q_k, u[k], 1.0, state_k, every)
            Wt[k, nw] = icpt
            if averaged:
                Wt[K + k, nw] = aicpt
            stop.n_iter[k] = e + 1
            epoch_sums[k, 0] = sumloss
            epoch_sums[k, 1] = objective
            if not finite(icpt, w):  # scikit-learn's check
                return e + 1, e
            if decide:
                stop_decision(k, objective / n_mean, stop.best, stop.no_improvement, eta, active, False, tol,
                              n_iter_no_change, adaptive)
            epoch_sums[k, 2] = 1.0 if active[k] else 0.0
    return epoch1, -1


def scaled(cfg, kstate, raw):
    """The weights of a lone participant's unscaled ``raw`` ones and its
    kernel state per output (``wscale``, ``average_a``, ``average_b``):
    scikit-learn's ``reset_wscale``, on a copy, with the same BLAS calls
    (``axpy`` then ``scal``: an ``axpy`` may fuse its multiply-add, so the
    averages match to the last bit only so)."""
    K = cfg.hp.n_outputs
    nw = raw.shape[0] - 1
    W = raw.copy(order="F")
    axpy, scal = get_blas_funcs(("axpy", "scal"), dtype=raw.dtype)
    for k in range(K):
        wscale, avg_a, avg_b = kstate[k][:3]
        if cfg.hp.average:
            aw = axpy(raw[:nw, k], np.array(raw[:nw, K + k]), a=avg_a)
            W[:nw, K + k] = scal(1.0 / avg_b, aw)
        W[:nw, k] = scal(wscale, np.array(raw[:nw, k]))
    return W
