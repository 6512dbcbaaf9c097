"""What a participant's run is made of: its configuration (``_RunConfig``),
the rounds of an epoch
(``_epoch_rounds``), and the rounds themselves behind one interface
(``make_rounds``: ``prepare`` a round, ``train`` it from the weights read,
``finish`` it): ``_CompiledRounds`` (numba: ``_CompiledData``, ``_Round``,
sparse rounds built ahead in a background thread by ``_RoundPrep``,
trained by ``_compiled_round``) and ``MinibatchRounds`` (the array-API
minibatch kernel: cupy data; ``_minibatch_rounds``). Plain values and arrays; the participant
(``_participant``) only reads, pushes and clocks around them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.linalg.blas import get_blas_funcs

from dask_ps._estimators import arrays, setting, setting_bytes
from dask_ps.linear_model._kernels import (
    ADAPTIVE,
    ELASTICNET,
    HINGE_THRESHOLDS,
    L1,
    L2,
    OPTIMAL,
    SPARSE_INTERCEPT_DECAY,
    _Hyper,
    check_finite,
    rate_sum,
)
from dask_ps.linear_model._lone import SklearnOrders, lone_epochs, scaled
from dask_ps.linear_model._minibatch_rounds import MinibatchRounds
from dask_ps.linear_model._round_prep import (  # noqa: F401
    _DENSE_COUNTS_PER_NONZERO,
    NUMPY_PREP_NONZEROS,
    _Round,
    _RoundPrep,
)

logger = logging.getLogger(__name__)


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
    # verbose or a progress bar: the table of the participants' progress rows
    # (``_monitor``), a ring of ``progress_epochs`` epochs.
    progress_table: str | None = None
    progress_epochs: int = 0
    # Reads a round ahead and background clocks where the session has them
    # (ps.sgd.overlap).
    overlap: bool = True
    # Under a staleness bound: each round starts from its read plus what the
    # read missed of the others' rounds (_catch_up; ps.sgd.catch-up).
    catch_up: bool = False
    # The table holding the run's start (None: zeros), which nobody pushes
    # to: the participants' models before their first round
    # (_Participant.own_model).
    start_table: str | None = None
    # Whether a participant may hold the whole weights table (a lone
    # participant's local copy, the penalty term of the stopping rule):
    # dense data, or a table of at most ps.sgd.whole-table-bytes. A wider
    # (hashed) table is only ever read by rows: those of a round, of the
    # participant's own features (docs/architecture.rst, "Memory").
    whole_table: bool = True
    # A lone participant's validation samples (sorted), drawn as
    # scikit-learn's split in the caller's process
    # (_participant.lone_validation_split); None: each participant draws its own.
    validation_idx: object = None
    # A lone participant's seeds of scikit-learn's shuffle, per output
    # (_lone.lone_sklearn_draws, _lone.SklearnOrders); None: its own order.
    sklearn_seeds: tuple | None = None
    # The table's averaged columns hold offsets (_averages.uses_offsets).
    average_offsets: bool = False


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
    ``run_rounds`` as index arrays); the shuffle moves blocks of up to
    ``ORDER_BLOCK`` consecutive samples (``_composition_block``) -- and each epoch after the first
    shuffles the order of the rounds and the order of the samples inside each
    round (from ``rng``): the round's blocks of ``ORDER_BLOCK`` consecutive
    samples (of its first order, itself random) in a random order
    (``_block_order``). A round's compacted CSR over its touched features
    (``_RoundPrep``) is then built once and re-read in a new order. A
    round is ``(round id, order of its samples or None)``."""
    if fixed:
        if not run_rounds:
            order = train_idx
            if shuffle:
                block = _composition_block(train_idx.shape[0], -(-S // m))
                order = train_idx[_block_order(np.random.default_rng([int(seed), 1]), train_idx.shape[0], block)]
            # The rounds are runs of m of np.array_split's S minibatches:
            # slices of the order (no copies).
            size, extra = divmod(order.shape[0], S)
            bounds = np.minimum(np.arange(S + 1), extra) + np.arange(S + 1) * size
            run_rounds.extend(order[bounds[r0]:bounds[min(r0 + m, S)]] for r0 in range(0, S, m))
        if not shuffle or epoch == 0:
            return [(i, None) for i in range(len(run_rounds))]
        return [(int(i), _block_order(rng, run_rounds[i].shape[0])) for i in rng.permutation(len(run_rounds))]
    order = rng.permutation(train_idx) if shuffle else train_idx
    batches = np.array_split(order, S)
    return [batches[r0:r0 + m] for r0 in range(0, S, m)]


# Later epochs read a compacted round (~12 bytes a non-zero: tens of MB, far
# beyond the caches) in a new order. Sample by sample at random, the kernel
# waited on memory: one 450k-sample participant's epoch of the hashed 2^20
# benchmark, 0.30-0.35 s against 0.08-0.09 s in order; blocks of 64 samples in
# a random order, each in order: 0.10 s (16: 0.15 s; 256 or 2048: 0.08-0.09 s).
ORDER_BLOCK = 64


def _composition_block(n, rounds):
    """How many consecutive samples stay together when the samples of a fit
    are shuffled into its fixed sparse rounds: ``ORDER_BLOCK``, fewer where a
    round would have under ``ORDER_BLOCK`` blocks (1 on small inputs: a
    shuffle of single samples, scikit-learn's).

    A round's compaction (``compact_rows``) reads its rows from the CSR and
    writes them in the round's order: single samples at random made every
    row a cache miss on both sides, and a one-epoch fit (``max_iter=1``,
    ``partial_fit``) paid more for compacting its rounds than for training
    them (click-through benchmark, 450k rows per participant: 0.40-0.46 s of
    CPU for the 8 rounds against 0.16-0.25 s in blocks of 64; scikit-learn's
    epoch over the same rows: 0.38-0.58 s). The price: samples stored next
    to each other are trained one after the other, in runs of at most 64 of
    the round's tens of thousands: a participant's part is kept in a
    shuffled order where it can be (an in-memory input's parts,
    ``_data._memory_parts``; a dask input's parts of several blocks,
    ``_data._shuffled_concatenation``)."""
    return int(min(ORDER_BLOCK, max(1, n // (max(1, rounds) * ORDER_BLOCK))))


def _block_order(rng, n, block=ORDER_BLOCK):
    """A new order of a round's ``n`` samples: its blocks of ``block``
    consecutive samples in a random order, each read in order."""
    starts = rng.permutation(-(-n // block)) * block
    lengths = np.minimum(block, n - starts)
    offsets = np.cumsum(lengths) - lengths  # where each block goes in the new order
    return np.arange(n, dtype=np.int64) + np.repeat(starts - offsets, lengths)


def _round_size(group, run_rounds) -> int:
    if isinstance(group, tuple):
        return int(run_rounds[group[0]].shape[0])
    return sum(b.shape[0] for b in group)


def _numba_module():
    """``_sgd_numba`` (None where numba does not import: the minibatch
    kernel then trains, with a warning)."""
    global _NUMBA
    if _NUMBA is None:
        try:
            from dask_ps.linear_model import _sgd_numba

            _NUMBA = _sgd_numba
        except Exception:  # pragma: no cover - numba missing or broken
            logger.warning("numba does not import: SGD trains with the array-API minibatch kernel", exc_info=True)
            _NUMBA = False
    return _NUMBA or None


_NUMBA = None


def _kernel_for(X) -> str:
    """``"compiled"`` (numba: numpy and scipy.sparse data) or ``"minibatch"``
    (array API: cupy data, or ``ps.sgd.kernel: minibatch``)."""
    kind = setting("sgd", "kernel")
    if kind not in ("auto", "compiled", "minibatch"):
        raise ValueError(f"ps.sgd.kernel must be 'auto', 'compiled' or 'minibatch', got {kind!r}")
    if kind == "minibatch" or arrays.xp_of(X) is not np:
        return "minibatch"
    return "compiled"


class _CompiledData:
    """A participant's data prepared once per fit for the compiled round
    kernel (``_sgd_numba.sgd_round``): targets per output as contiguous
    vectors, the CSR's arrays and scratch arrays over the features (sparse
    data: its rounds are built by ``_RoundPrep``, in a background thread).

    The round kernel reads the samples of a round by index from the local
    data (no copy of the round's rows), runs scikit-learn's per-sample rule
    over the whole round in one call, and, for sparse data, on the block of
    the round's touched rows only."""

    _arange = np.arange(0, dtype=np.int64)
    in_place = False  # sparse rounds trained in place in the CSR (make)
    prep_in_numpy = False  # sparse rounds built by numpy, not the compiled kernels (make)
    whole = None

    def arange_n(self, n):
        if self._arange.shape[0] < n:
            self._arange = np.arange(max(n, 2 * self._arange.shape[0]), dtype=np.int64)
        return self._arange[:n]

    @classmethod
    def make(cls, cfg: _RunConfig, X, Y, sw, train_idx, solo=False):
        """``solo``: a lone participant holding the whole table, whose
        rounds are whole (see ``make_rounds``)."""
        hp = cfg.hp
        mod = _numba_module()
        if mod is None:
            return None
        self = cls()
        self.mod = mod
        self.sparse = sp.issparse(X)
        self.solo = bool(solo)
        self.l1_state = None  # the L1 penalty's state (q per weight, u) per output, over the fit (_train_chunks)
        self.fresh_state = np.array([1.0, 0.0, 1.0, 0.0, 0.0])  # sgd_round's state where not kept (unused)
        self.n_train = train_idx.shape[0]
        self.Y = [np.ascontiguousarray(Y[:, k]) for k in range(Y.shape[1])]
        self.sw = np.ascontiguousarray(sw)
        self.loss_id = mod.LOSS_IDS[hp.loss]
        self.thr = HINGE_THRESHOLDS.get(hp.loss, float(hp.epsilon))
        self.optimal_init = hp.optimal_init() if hp.learning_rate == OPTIMAL else 0.0
        self.wscale_min = 1e-6 if X.dtype == np.float32 else 1e-9
        self.dummy_w = np.zeros(1, dtype=X.dtype)
        self.dummy_q = np.zeros(1)  # the L1 state of a penalty without L1
        d = cfg.n_features
        if self.sparse:
            self.X = np.zeros((1, 1), dtype=X.dtype)
            self.data = X.data
            self.ind = X.indices.astype(np.int32, copy=False)
            self.ptr = X.indptr.astype(np.int32, copy=False)
            if self.solo:  # whole rounds on the CSR itself: no compaction, no lazy regularization
                self.cache, self.lazy = None, False
                return self
            # compact_rows' scratch (the prep thread's)
            self.bits = np.zeros(d // 64 + 1, dtype=np.uint64)
            # int32: a rank counts the features of one round (2^28 features:
            # 16 MiB instead of 32 of the participant's worker)
            self.rank = np.zeros(self.bits.shape[0], dtype=np.int32)
            self.slot = np.full(X.shape[0], -1, dtype=np.int32)
            n_train = train_idx.shape[0]
            # The rounds' compacted CSRs, kept across the epochs of a run
            # while they fit the budget (about the size of the training CSR).
            if n_train == X.shape[0]:
                nnz_train = int(self.ptr[-1] - self.ptr[0])
            else:
                nnz_train = int(np.sum(np.diff(self.ptr)[train_idx])) if n_train else 0
            self.prep_in_numpy = nnz_train <= NUMPY_PREP_NONZEROS  # (no compile of the prep's kernels)
            est = nnz_train * (X.data.dtype.itemsize + 4) + n_train * (8 * (Y.shape[1] + 2) + 4)
            # A run of one epoch (partial_fit, max_iter=1, a chunked fit's
            # last chunk of one) never reads a round twice: not kept, and its
            # buffers recycled (_RoundPrep.recycle), so the rounds need two
            # or three rounds' worth of fresh memory, not the whole CSR's.
            reused = cfg.max_iter - cfg.epoch0 > 1
            self.cache = {} if reused and est <= setting_bytes("sgd", "round-cache-bytes") else None
            # Rounds read once each (not kept), or a run of a few epochs
            # (``IN_PLACE_EPOCHS``), over a table the participant may hold
            # whole: trained in place in the CSR, over a local copy of the
            # table (``whole``) that each round's rows are written into,
            # instead of compacted first (the same arithmetic, bit for bit).
            # A kept in-place round is its touched rows and 1/q only. An L1
            # penalty keeps compacted rounds: its state is per weight of the
            # round.
            self.in_place = _trains_in_place(cfg, self.cache)
            self.whole = None  # the local copy of the table (d + 1, n_cols), made at the first round
            # A round decays (L2) and shrinks (L1) the rows it touches only; a
            # touched row also gets the regularization of the rounds that
            # missed it, 1/q times, q = the share of the epoch's rounds that
            # touch the feature ("lazy" regularization): counted by the prep
            # thread (_RoundPrep._count) before its first round.
            self.lazy = hp.penalty > 0 and n_train > 0
        else:
            self.X = np.ascontiguousarray(X)
            self.chunk = max(256, (1 << 21) // max(8 * X.shape[1], 1))  # rows per ~2 MiB chunk
            self.buf = np.empty((min(self.chunk, X.shape[0]), X.shape[1]), dtype=X.dtype)
            self.csr_dummy = (np.zeros(1, dtype=X.dtype), np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int32))
        return self


_EVERY_ROW = np.zeros(0, dtype=np.int64)  # sgd_round's ``touched``: every row of W


# A run of at most this many epochs trains its sparse rounds in place
# (``_trains_in_place``) even where it could keep them compacted: the
# compaction, paid once a run, costs more than the in-place kernel's slower
# reads of the whole table's copy over so few epochs. Both benchmark sets
# (1M rows, 2 x 1 threads, CPU seconds of the fit, medians of 3-6 fits,
# load 2.5-4): hashed 2^20 E=2 1.96 -> 1.25, E=3 2.37 -> 1.87, E=5 about
# equal (3.1 both); click-through 2^22 E=2 1.34 -> 1.05, E=3 1.99 -> 1.39.
# (In the threads layout the compacted arrays are fresh memory, paid in page
# faults; in worker processes, whose allocator keeps freed memory
# (ps.worker-mmap-threshold), hashed E=2 about equal: worker CPU 1.87 ->
# 1.84 s.)
IN_PLACE_EPOCHS = 3


def _trains_in_place(cfg: _RunConfig, cache) -> bool:
    """Whether a participant's sparse rounds train in place in its CSR
    (``_CompiledData.in_place``): rounds not kept or a run of at most
    ``IN_PLACE_EPOCHS`` epochs, a table it may hold whole
    (``cfg.whole_table``), no L1 penalty."""
    few = cache is None or cfg.max_iter - cfg.epoch0 <= IN_PLACE_EPOCHS
    return few and cfg.whole_table and cfg.hp.penalty not in (L1, ELASTICNET)


def _dense_round(c: _CompiledData, group) -> _Round:
    """Dense round ``group`` (its minibatches): its samples as chunks,
    copied to a contiguous buffer first (one buffer: each chunk is trained
    before the next is gathered): a gather then a sequential pass beats the
    per-sample kernel reading rows at random (docs/benchmarks.md).

    Sparse data of a lone participant (``c.solo``): one chunk, the samples
    read from the CSR in place, over the whole table (``rows`` None)."""
    idx = np.concatenate(group) if len(group) > 1 else group[0]
    if c.sparse:
        return _whole_round(c, idx)

    def chunks():
        for a in range(0, idx.shape[0], c.chunk):
            part = idx[a:a + c.chunk]
            n = part.shape[0]
            buf = c.mod.gather_rows(c.mod.readonly(c.X), part, c.buf[:n])
            yield part, buf, [yk[part] for yk in c.Y], c.sw[part], c.arange_n(n)

    return _Round(None, chunks(), idx.shape[0])


def _whole_round(c: _CompiledData, order) -> _Round:
    """A lone participant's round over its sparse data in place, the whole
    table's rows (``rows`` None): one chunk whose samples are read in the
    ``order`` given."""
    return _Round(None, [(order, (c.data, c.ind, c.ptr), c.Y, c.sw, order)], order.shape[0])


def _compiled_round(cfg: _RunConfig, c: _CompiledData, rnd: _Round, W0, epoch, seen, stop, active, loss_sum,
                    eta_scale=1.0):
    """Train round ``rnd`` with the compiled kernel from the weights ``W0``
    it read (sparse data: its touched rows): every active output over the
    round's samples in one call each, then the touched rows' lazy
    regularization, each sample's rate scaled as ``_kernels.sample_scale``
    says with ``eta_scale`` participants; returns the
    new weights and adds the round's loss sums to ``loss_sum``."""
    n_train_step = cfg.n_total / max(c.n_train, 1)
    t = cfg.t0 + epoch * cfg.n_total + seen * n_train_step
    outs = np.flatnonzero(active)
    c.rates = [0.0, 0.0]
    if rnd.in_place:  # the round's rows written into the whole table, trained there, read back
        if c.whole is None:
            c.whole = np.zeros((cfg.n_features + 1, W0.shape[1]), dtype=W0.dtype, order="F")
        c.mod.scatter_rows(c.whole, rnd.rows, W0)
        sums = _train_chunks(cfg, c, c.whole, rnd.chunks, outs, t, n_train_step, stop, loss_sum, eta_scale,
                             touched=rnd.rows[:-1])
        W = _finish_in_place(cfg, c, rnd, outs, *sums)
    else:
        W = np.array(W0, dtype=W0.dtype, order="F", copy=True)  # columns contiguous
        sums = _train_chunks(cfg, c, W, rnd.chunks, outs, t, n_train_step, stop, loss_sum, eta_scale,
                             rows=rnd.rows)
        _finish_round(cfg, W, rnd.inv_q, outs, *sums)
    check_finite(W, epoch)
    return np.ascontiguousarray(W)


def _train_chunks(cfg: _RunConfig, c: _CompiledData, W, chunks, outs, t, n_train_step, stop, loss_sum, eta_scale,
                 touched=_EVERY_ROW, rows=None):
    """``sgd_round`` over the chunks, for each output in ``outs``, on ``W``
    (in place); returns per output the intercepts, the products of the L2
    decays and the sums of the learning rates (for the lazy regularization).

    Chunks outside, outputs inside: each chunk is gathered once for all
    outputs. Per output the intercepts, the decay and learning-rate sums and
    the L1 penalty state carry over the chunks."""
    hp = cfg.hp
    K = hp.n_outputs
    nw = W.shape[0] - 1
    intercept_decay = SPARSE_INTERCEPT_DECAY if c.sparse else 1.0
    use_l1 = hp.penalty in (L1, ELASTICNET)
    icpt = {k: float(W[nw, k]) for k in outs}
    aicpt = {k: float(W[nw, K + k]) if hp.average else 0.0 for k in outs}
    decay = dict.fromkeys(outs, 1.0)
    eta_sum = dict.fromkeys(outs, 0.0)
    if use_l1:
        # Tsuruoka's state carries over the fit, as in scikit-learn's
        # _plain_sgd, for every participant: reset at each round, the penalty
        # a weight was owed when clipped to 0 was forgotten (weights L1
        # should zero ended near 1e-4), and so was the penalty a sparse
        # feature accrued from its last sample to the round's end (about half
        # of a once-an-epoch feature's: text L1 at 2 participants of 40k rows
        # 0.678-0.686 against scikit-learn's worst 0.7005). A compacted round
        # (``rows``: its rows' global ids, the intercept's last) trains on
        # its rows' share of the state.
        if c.l1_state is None:
            c.l1_state = ({k: np.zeros(int(cfg.n_features)) for k in range(K)}, dict.fromkeys(range(K), 0.0))
        q_all, l1_u = c.l1_state
        l1_q = q_all if rows is None else {k: q_all[k][rows[:-1]] for k in outs}
    else:
        l1_q = {k: c.dummy_q for k in outs}
        l1_u = dict.fromkeys(outs, 0.0)
    tk = t
    for part, Xc, Yc, swc, local in chunks:
        Xd, (xdata, xind, xptr) = (c.X, Xc) if c.sparse else (Xc, c.csr_dummy)
        for k in outs:
            eta = float(stop.eta[k]) if hp.learning_rate == ADAPTIVE else hp.eta0
            icpt[k], aicpt[k], sumloss, dec, es, l1_u[k], _ = c.mod.sgd_round(
                not c.sparse, c.mod.readonly(Xd), c.mod.readonly(xdata), xind, xptr, local, Yc[k], swc, W[:nw, k],
                W[:nw, K + k] if hp.average else c.dummy_w, icpt[k], aicpt[k],
                c.loss_id, c.thr, hp.penalty, hp.alpha, hp.l1_ratio, hp.learning_rate, eta, hp.eta0, hp.power_t,
                c.optimal_init, bool(hp.fit_intercept), intercept_decay, float(cfg.cw_pos[k]),
                float(cfg.cw_neg[k]), int(hp.average), tk, n_train_step, c.wscale_min, l1_q[k], l1_u[k],
                float(eta_scale), c.fresh_state, False, touched)
            decay[k] *= dec
            eta_sum[k] += es
            loss_sum[k] += sumloss
            if eta_scale > 1.0 and (cfg.staleness or 0) > 0:  # the round's rates against scikit-learn's (mean_scale)
                c.rates[0] += es
                c.rates[1] += rate_sum(hp, tk, part.shape[0], n_train_step, eta)
        tk += part.shape[0] * n_train_step
    if use_l1 and rows is not None:
        for k in outs:
            q_all[k][rows[:-1]] = l1_q[k]
    return icpt, aicpt, decay, eta_sum


def _finish_in_place(cfg: _RunConfig, c: _CompiledData, rnd: _Round, outs, icpt, aicpt, decay, eta_sum):
    """``_finish_round`` of a round trained in place: its rows read back
    from the whole table with the lazy regularization applied on the way
    (``_sgd_numba.gather_decayed``), by a factor per count: ``1/q = R /
    counts`` takes at most ``R`` values, so ``decay ** (1/q - 1)`` is
    computed for those only (the same powers, bit for bit). (No L1 here:
    ``_trains_in_place``.)"""
    hp = cfg.hp
    K = hp.n_outputs
    whole = c.whole
    n_cols = whole.shape[1]
    share = rnd.inv_q
    if share is not None and not isinstance(share, tuple):  # 1/q itself (_RoundPrep.round_share)
        W = np.ascontiguousarray(whole[rnd.rows])
        _finish_round(cfg, W, share, outs, icpt, aicpt, decay, eta_sum)
        return W
    scaled = np.zeros(n_cols, dtype=np.bool_)
    factors = np.ones((n_cols, 1))
    if share is not None and hp.penalty >= L2:
        R, counts = share
        factors = np.ones((n_cols, R + 1))
        extra = R / np.arange(1, R + 1) - 1.0  # 1/q - 1, as _finish_round computes it
        for k in outs:
            factors[k, 1:] = decay[k] ** extra
            scaled[k] = True
    else:
        counts = np.zeros(rnd.rows.shape[0], dtype=np.int32)
    W = np.empty((rnd.rows.shape[0], n_cols), dtype=whole.dtype)
    c.mod.gather_decayed(whole, rnd.rows, counts, factors, scaled, W)
    nw = W.shape[0] - 1
    for k in outs:
        W[nw, k] = icpt[k]
        if hp.average:
            W[nw, K + k] = aicpt[k]
    return W


def _finish_round(cfg: _RunConfig, W, iq, outs, icpt, aicpt, decay, eta_sum):
    """Write the intercepts into ``W`` and give the touched rows the
    regularization of the rounds that missed them (sparse data: ``iq`` =
    ``1/q`` of the round's feature rows)."""
    hp = cfg.hp
    K = hp.n_outputs
    nw = W.shape[0] - 1
    extra = None if iq is None else iq - 1.0
    for k in outs:
        wk = W[:nw, k]
        if extra is not None:
            if hp.penalty >= L2:
                wk *= decay[k] ** extra
            if hp.penalty in (L1, ELASTICNET):
                u = hp.l1_ratio * hp.alpha * eta_sum[k] * extra
                wk[:] = np.sign(wk) * np.maximum(np.abs(wk) - u, 0.0)
        W[nw, k] = icpt[k]
        if hp.average:
            W[nw, K + k] = aicpt[k]


# --- the round interface ----------------------------------------------------------------------


def make_rounds(cfg: _RunConfig, X, Y, sw, train_idx, run_rounds, solo=False):
    """The rounds of a participant's data: ``_CompiledRounds`` for numpy
    and scipy.sparse data (numba), else ``MinibatchRounds``
    (``_minibatch_rounds``: the array-API kernel).

    The interface: ``fixed`` (sparse rounds fixed per run: ``_epoch_rounds``),
    ``plan(groups)`` (the rounds an epoch will train, in order),
    ``ready(group)`` and ``rows(group)`` (its touched rows, for a read
    started ahead), ``prepare(groups, i)``, ``train(rnd, W0, epoch, seen,
    stop, active, loss_sum, eta_scale)`` (returns the new weights),
    ``finish(rnd)``, ``close()``, and ``seconds`` / ``cpu_seconds`` (where
    its time went).

    ``solo``: a lone participant holding the whole table. Its compiled
    rounds are whole, as scikit-learn's ``_plain_sgd``: sparse samples
    read from the CSR in the epoch's order (not fixed compacted rounds),
    every weight decayed and averaged at each sample (no lazy
    regularization), the L1 state kept over the fit; and where the caller
    drew scikit-learn's seeds (``cfg.sklearn_seeds``), in scikit-learn's
    order of each output (``_lone.SklearnOrders``): so that such a fit is
    scikit-learn's."""
    if _kernel_for(X) == "compiled":
        data = _CompiledData.make(cfg, X, Y, sw, train_idx, solo=solo)
        if data is not None:
            orders = None
            if solo and cfg.sklearn_seeds is not None and len(cfg.sklearn_seeds) == Y.shape[1]:
                orders = SklearnOrders(data.mod, cfg.sklearn_seeds, X.shape[0], train_idx, cfg.hp.shuffle,
                                        cfg.epoch0)
            return _CompiledRounds(cfg, data, run_rounds, orders)
    return MinibatchRounds(cfg, X, Y, sw, train_idx)


_EVERY_WEIGHT = np.zeros(0, dtype=np.int64)  # sgd_round's touched: every weight


class _CompiledRounds:
    """Rounds trained by the compiled kernel: a sparse round compacted ahead
    (``_RoundPrep``), a dense one gathered in chunks (``_dense_round``); or
    a lone participant's epochs in scikit-learn's order (``orders``), one
    kernel call per epoch and output (``_lone.lone_epochs``)."""

    # The last round's rates against scikit-learn's (the mean of the samples'
    # ``sample_scale``, weighted by their rates): ``_Participant.additive_share``.
    mean_scale = 1.0

    def __init__(self, cfg: _RunConfig, data: _CompiledData, run_rounds, orders=None):
        self.cfg, self.c = cfg, data
        self.orders = orders  # scikit-learn's orders of a lone participant (_lone.SklearnOrders)
        # Such a participant keeps its weights unscaled (``raw``) and the
        # weight vectors' state over the run (``lone_epochs``), as scikit-learn does.
        self.raw = self.kstate = None
        self.fixed = data.sparse and not data.solo
        self.prep = _RoundPrep(cfg, data, run_rounds) if self.fixed else None
        self.seconds = {"round_prep": 0.0, "kernel": 0.0}  # the participant thread's

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds of the thread that builds the sparse rounds ahead."""
        return 0.0 if self.prep is None else self.prep.cpu_seconds

    @property
    def lone(self) -> bool:
        """Whether the epochs run as scikit-learn's (``_lone.lone_epochs``)."""
        return self.orders is not None

    def lone_epochs(self, W0, epoch0, epoch1, stop, decide):
        """Train the epochs ``[epoch0, epoch1)`` of a lone participant as
        scikit-learn's ``_plain_sgd`` does, from the table ``W0`` at the
        run's first call (``_lone.lone_epochs``), with its stopping
        rule where ``decide`` (else the caller's, on a validation score).
        ``stop`` is updated in place (its ``n_iter``: epochs trained).
        Returns ``(sums, end)``: per epoch trained and output its loss sum,
        objective sum (scikit-learn's, with the penalty of each sample's
        weights) and whether still active; ``end`` the next epoch."""
        cfg, c, hp = self.cfg, self.c, self.cfg.hp
        K = hp.n_outputs
        if self.raw is None:
            self._start_lone(W0)
        t = time.perf_counter()
        sums = np.zeros((epoch1 - epoch0, K, 3))
        X = (c.X, c.data, c.ind, c.ptr) if c.sparse else (c.X, *c.csr_dummy)
        X = (c.mod.readonly(X[0]), c.mod.readonly(X[1]), *X[2:])  # one specialization (_sgd_numba.readonly)
        kernel = c.mod.round_kernel(not c.sparse, c.loss_id, hp.penalty, hp.learning_rate, bool(hp.average),
                                    True, False)  # the weight vector's state kept, unscaled
        consts = (c.thr, hp.alpha, hp.l1_ratio, hp.eta0, hp.power_t, c.optimal_init, bool(hp.fit_intercept),
                  SPARSE_INTERCEPT_DECAY if c.sparse else 1.0, int(hp.average), c.wscale_min,
                  np.zeros(1, dtype=self.raw.dtype), _EVERY_WEIGHT)
        end, bad = lone_epochs(
            kernel, bool(hp.shuffle), X, self.orders, self.rows_buf, self.Yt, c.sw, self.raw.T, bool(hp.average),
            self.kstate, self.l1_q, self.l1_u, (float(hp.tol), int(hp.n_iter_no_change), hp.learning_rate == ADAPTIVE),
            (self.cw_pos, self.cw_neg), consts, cfg.t0, float(cfg.n_total), (int(epoch0), int(epoch1)),
            bool(decide), stop, sums)
        self.seconds["kernel"] += time.perf_counter() - t
        if bad >= 0:
            check_finite(np.array([np.nan]), bad)  # scikit-learn's error
        return sums[:end - epoch0], end

    def _start_lone(self, W0):
        """``lone_epochs``' state at the run's first call: the unscaled
        weights, the weight vectors' state (scale, averaging, and the norms
        scikit-learn's ``WeightVector`` starts from, with its BLAS calls),
        the L1 penalty's."""
        cfg, c, hp = self.cfg, self.c, self.cfg.hp
        K = hp.n_outputs
        self.raw = np.array(W0, dtype=W0.dtype, order="F", copy=True)
        nw = self.raw.shape[0] - 1
        dot, asum = get_blas_funcs(("dot", "asum"), dtype=self.raw.dtype)
        self.kstate = np.array([[1.0, 0.0, 1.0, float(dot(self.raw[:nw, k], self.raw[:nw, k])),
                                 float(asum(self.raw[:nw, k]))] for k in range(K)]).reshape(K, 5)
        self.l1_q = np.zeros((K, nw if hp.penalty in (L1, ELASTICNET) else 1))
        self.l1_u = np.zeros(K)
        self.Yt = np.ascontiguousarray(np.array(c.Y).reshape(K, -1))
        self.rows_buf = np.empty(self.orders.ind.shape[1], dtype=np.int64)
        self.cw_pos = np.asarray(cfg.cw_pos, dtype=float)
        self.cw_neg = np.asarray(cfg.cw_neg, dtype=float)

    def weights(self):
        """A lone participant's weights (``lone_epochs``), scaled: a copy
        (``_lone.scaled``)."""
        return np.ascontiguousarray(scaled(self.cfg, self.kstate, self.raw))

    def plan(self, groups) -> None:
        if self.prep is not None and self.c.cache is not None:
            for group in groups:  # built in this order, each once per run
                self.prep.request(group[0])

    def ready(self, group) -> bool:
        return self.prep is None or self.prep.ready(group[0])

    def rows(self, group):
        return None if self.prep is None else self.prep.rows(group[0])

    def prepare(self, groups, i) -> _Round:
        t = time.perf_counter()
        if self.prep is not None:
            if self.c.cache is None:  # one round ahead: the rounds are not kept
                for group in groups[i:i + 2]:
                    self.prep.request(group[0])
            rnd = self.prep.take(groups[i])
        else:
            rnd = _dense_round(self.c, groups[i])
        self.seconds["round_prep"] += time.perf_counter() - t
        return rnd

    def train(self, rnd: _Round, W0, epoch, seen, stop, active, loss_sum, eta_scale):
        t = time.perf_counter()
        waited = 0.0 if self.prep is None else self.prep.waited
        W = _compiled_round(self.cfg, self.c, rnd, W0, epoch, seen, stop, active, loss_sum, eta_scale)
        self.mean_scale = self.c.rates[0] / self.c.rates[1] if self.c.rates[1] > 0 else 1.0
        if self.prep is not None:  # a wait for the counts (its 1/q) is the round's preparation
            waited = self.prep.waited - waited
            self.seconds["round_prep"] += waited
            t += waited
        self.seconds["kernel"] += time.perf_counter() - t
        return W

    def finish(self, rnd: _Round) -> None:
        if self.prep is not None:
            self.prep.recycle(rnd)

    def close(self) -> None:
        if self.prep is not None:
            self.prep.close()
