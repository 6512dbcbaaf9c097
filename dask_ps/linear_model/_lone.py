"""A lone participant trained as scikit-learn's ``_plain_sgd`` (issue 24).

A participant alone on its data that holds the whole table *is*
scikit-learn's fit, bit for bit: the caller draws scikit-learn's
validation split and shuffle seeds from ``random_state`` in scikit-learn's
order (``lone_sklearn_draws``); each output trains in the order of
scikit-learn's shuffle (``SklearnOrders``); its rounds are whole and the
kernel keeps its weight vector's scale and averages over the fit, the
weights unscaled until a copy is scaled as scikit-learn's
``reset_wscale`` does (``scaled``). Its epochs and stopping rule run in
one compiled loop (``_sgd_numba.lone_epochs``, called by
``_rounds._CompiledRounds.lone_epochs``).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.blas import get_blas_funcs
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit

from dask_ps.linear_model._kernels import MAX_INT


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
        try:
            idx_train, idx_val = next(splitter(test_size=hp.validation_fraction, random_state=est.random_state)
                                      .split(np.zeros((n, 1)), y))
        except ValueError:
            idx_val = None
        if idx_val is not None:
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
    as ``_plain_sgd`` iterates its dataset (``_sgd_numba.lone_epochs``
    shuffles ``ind`` in place each epoch and skips the samples outside
    ``keep``). Starts at epoch ``epoch0``."""

    def __init__(self, mod, seeds, n, train_idx, shuffle, epoch0=0):
        self.mod, self.seeds, self.shuffle = mod, [int(s) for s in seeds], bool(shuffle)
        self.keep = np.zeros(n, dtype=bool)
        self.keep[train_idx] = True
        self.ind = np.tile(np.arange(n, dtype=np.int64), (len(self.seeds), 1))  # one order per output
        for _ in range(epoch0 if self.shuffle else 0):
            self._shuffle()

    def _shuffle(self):
        for ind, seed in zip(self.ind, self.seeds):
            self.mod.sklearn_shuffle(ind, seed)


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
