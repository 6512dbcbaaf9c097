"""The rounds of a participant trained minibatch by minibatch with the
array-API kernel (``_kernels._minibatch_kernel``): cupy data, or
``ps.sgd.kernel: minibatch``. ``_rounds.make_rounds`` picks these where
the compiled per-sample rounds (``_rounds._CompiledRounds``) do not
apply; both have the interface it describes."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import numpy as np

from dask_ps._estimators import arrays
from dask_ps.linear_model._kernels import (
    SPARSE_INTERCEPT_DECAY,
    _batch_loss,
    _decision,
    _lazy_inv_q,
    _lazy_regularization,
    _learning_rates,
    _minibatch_kernel,
    _unique_inverse,
    check_finite,
    compact_rows_xp,
    sample_etas,
)
from dask_ps.linear_model._round_prep import _DENSE_COUNTS_PER_NONZERO, _Round

if TYPE_CHECKING:
    from dask_ps.linear_model._rounds import _RunConfig


class MinibatchRounds:
    """Rounds trained minibatch by minibatch with the array-API kernel
    (``_minibatch_kernel``: cupy data, or ``ps.sgd.kernel: minibatch``):
    each minibatch's update is the sum of scikit-learn's per-sample updates
    at its starting weights. A sparse round's features are compacted when
    it is prepared, so its weights are not read ahead."""

    fixed = False
    mean_scale = 1.0  # as _rounds._CompiledRounds.mean_scale

    def __init__(self, cfg: _RunConfig, X, Y, sw, train_idx):
        self.cfg, self.X, self.Y, self.sw = cfg, X, Y, sw
        self.xp = xp = arrays.xp_of(X)
        self.sparse = arrays.is_sparse(X)
        self.d = cfg.n_features
        self.n_train = train_idx.shape[0]
        self.intercept_decay = SPARSE_INTERCEPT_DECAY if self.sparse else 1.0
        self.cw_pos = np.asarray(cfg.cw_pos, dtype=float)
        self.cw_neg = np.asarray(cfg.cw_neg, dtype=float)
        self.seconds = {"round_prep": 0.0, "kernel": 0.0}
        self.cpu_seconds = 0.0
        self.inv_q = None
        self.count_features = None  # the features of inv_q where it is per feature present
        if self.sparse and cfg.hp.penalty > 0:
            # A minibatch decays only the rows it touches: the other rows miss its
            # L2 decay (and L1 shrinkage). A touched row gets them scaled by 1/q,
            # q = the probability that a minibatch touches the feature -- "lazy"
            # regularization, unbiased in log-scale.
            n_train, S = self.n_train, cfg.steps_per_epoch
            Xt = X[train_idx] if n_train < X.shape[0] else X
            if self.d <= _DENSE_COUNTS_PER_NONZERO * Xt.nnz:
                counts = arrays.to_numpy(xp.bincount(Xt.indices, minlength=self.d)) if n_train else np.zeros(self.d)
            else:  # a wide hashed table: the features present only (see _round_prep._RoundPrep._count)
                present, counts = (arrays.to_numpy(a) for a in xp.unique(Xt.indices, return_counts=True))
                self.count_features = present.astype(np.int64)
            self.inv_q = _lazy_inv_q(counts, n_train, n_train / S)

    def plan(self, groups) -> None:
        pass

    def ready(self, group) -> bool:
        return False

    def rows(self, group):  # pragma: no cover - never ready
        raise NotImplementedError

    def prepare(self, groups, i) -> _Round:
        """The round's minibatches; sparse: the features it touches (its
        rows, the intercept's last) and its samples with their columns
        renumbered to rows of the weights read."""
        t = time.perf_counter()
        group = groups[i]
        rows = Xg = scratch = None
        if self.sparse:
            xp = self.xp
            cols_np, Xg = compact_rows_xp(self.X[np.concatenate(group)], self.d, xp)
            rows = np.append(cols_np, self.d)
            scratch = (xp.empty(Xg.shape[1], dtype=np.int64), xp.empty(Xg.shape[1], dtype=np.int32),
                       None if self.inv_q is None else self.inv_q[self._count_positions(cols_np)])
        self.seconds["round_prep"] += time.perf_counter() - t
        return _Round(rows, (group, Xg, scratch), sum(b.shape[0] for b in group))

    def _count_positions(self, cols):
        return cols if self.count_features is None else np.searchsorted(self.count_features, cols)

    def train(self, rnd: _Round, W0, epoch, seen, stop, active, loss_sum, eta_scale):
        t = time.perf_counter()
        group, Xg, scratch = rnd.chunks
        hp = dataclasses.replace(self.cfg.hp, eta_scale=eta_scale)
        W = W0.copy()
        off = n = 0
        self.rates = [0.0, 0.0]
        for idx in group:
            nb = idx.shape[0]
            if nb == 0:
                continue
            Xb = Xg[off:off + nb] if self.sparse else self.X[idx]
            off += nb
            self._step(hp, W, Xb, idx, epoch, seen + n, stop, active, loss_sum, scratch)
            n += nb
        self.seconds["kernel"] += time.perf_counter() - t
        self.mean_scale = self.rates[0] / self.rates[1] if self.rates[1] > 0 else 1.0
        return W

    def _step(self, hp, W, Xb, idx, epoch, seen, stop, active, loss_sum, scratch):
        """One minibatch (samples ``idx``, rows ``Xb``) trained on ``W`` in place."""
        cfg, xp, K = self.cfg, self.xp, hp.n_outputs
        nb = idx.shape[0]
        Yb, swb = self.Y[idx], self.sw[idx]
        if self.sparse:
            # The kernels touch every row they are given (decay, norms,
            # checks): give them the minibatch's rows only.
            stamp, lookup, iq = scratch
            ub, inv = _unique_inverse(Xb.indices, stamp, lookup, xp)
            sel = xp.append(ub, W.shape[0] - 1)  # + the intercept row
            Xb = type(Xb)((Xb.data, inv, Xb.indptr), shape=(nb, ub.shape[0]))
            Wb = W[sel]
        else:
            iq = None
            Wb = W
        # Global sample counter of this minibatch's samples: all participants
        # together advance t by N per epoch (with one participant, exactly
        # scikit-learn's t).
        N = cfg.n_total
        step = N / max(self.n_train, 1)
        ts = cfg.t0 + epoch * N + (seen + xp.arange(nb, dtype=np.float64)) * step
        Wk = Wb[:, :K]
        Ak = Wb[:, K:] if hp.average else None
        loss_sum += _batch_loss(hp, Wk, Xb, Yb, xp)
        p = _decision(Wk, Xb, xp) if hp.eta_scale > 1.0 else None  # for the samples' own steps
        etas = sample_etas(hp, ts, stop.eta, Xb, Yb, swb, self.cw_pos, self.cw_neg, xp, p)
        if p is not None and (cfg.staleness or 0) > 0:  # the round's rates against scikit-learn's (mean_scale)
            self.rates[0] += float(xp.sum(etas))
            self.rates[1] += float(xp.sum(_learning_rates(hp, ts, stop.eta, xp)))
        new, new_a = _minibatch_kernel(hp, Wk, Ak, Xb, Yb, swb, self.cw_pos, self.cw_neg, ts, stop.eta,
                                       active, self.intercept_decay, etas=etas, step=step)
        if self.sparse and iq is not None:
            new = _lazy_regularization(hp, new, iq[arrays.to_numpy(ub)], etas, active, xp)
        check_finite(new, epoch)
        where = sel if self.sparse else slice(None)
        W[where, :K] = new
        if hp.average:
            W[where, K:] = new_a

    def finish(self, rnd: _Round) -> None:
        pass

    def close(self) -> None:
        pass
