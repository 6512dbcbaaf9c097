"""The SGD participant: one per part of the data, run by
``ParameterServer.run`` on a worker: ``pull -> train a round -> push ->
clock()``. See ``docs/architecture.rst``, "Estimators: SGD", for how a fit
runs (rounds, model averaging, the stopping rule, resuming a retried
participant).
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit

from dask_ps import ParticipantContext, report_progress
from dask_ps._estimators import arrays, participant_worker
from dask_ps.linear_model import _monitor
from dask_ps.linear_model._averages import from_offsets, round_count, to_offsets
from dask_ps.linear_model._catch_up import CatchUp
from dask_ps.linear_model._kernels import (
    MAX_INT,
    StopRule,
    _decision,
    _penalty_value,
    compact_rows_xp,
)
from dask_ps.linear_model._rounds import (
    _epoch_rounds,
    _rng_state_from_json,
    _rng_state_to_json,
    _round_size,
    _RunConfig,
    _stats_row,
    make_rounds,
)


class _PartData:
    """One participant's data: X (n, d), y (n,), sample weights (n,)."""

    def __init__(self, X, y, sw):
        self.X, self.y, self.sw = X, y, sw

    def __len__(self):
        return self.X.shape[0]

    def __repr__(self):
        return f"<_PartData n={self.X.shape[0]} d={self.X.shape[1]} {type(self.X).__name__}>"


def _encode_targets(cfg: _RunConfig, y, dtype, xp):
    """(n, K) targets of the K binary problems, as scikit-learn encodes them."""
    hp = cfg.hp
    if not hp.classifier:
        return xp.asarray(y, dtype=dtype).reshape(-1, 1)
    classes = np.asarray(cfg.classes)
    y_np = arrays.to_numpy(y)
    if len(classes) == 2:  # two comparisons, not isin's sort (8 ms of a 450k-sample participant's setup)
        onehot = y_np == classes[1]
        unseen = ~(onehot | (y_np == classes[0]))
        onehot = onehot[:, None]
    else:
        unseen = ~np.isin(y_np, classes)
        onehot = y_np[:, None] == classes[None, :]
    if unseen.any():
        raise ValueError("classes should include all valid labels that can be in y")
    dtype = np.dtype(dtype)
    neg = 0.0 if hp.log_encoded else -1.0
    return xp.asarray(np.where(onehot, dtype.type(1.0), dtype.type(neg)))


def _validation_split(cfg: _RunConfig, y, rng):
    hp = cfg.hp
    n = y.shape[0]
    mask = np.zeros(n, dtype=bool)
    if not hp.early_stopping:
        return mask
    y_np = arrays.to_numpy(y)
    seed = rng.randint(MAX_INT)
    if cfg.validation_idx is not None:  # a lone participant: scikit-learn's split (_lone.lone_sklearn_draws)
        mask[cfg.validation_idx] = True
        return mask
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
        return np.concatenate([arrays.to_numpy(num), [float(xp.sum(sw)), 0.0, 0.0]])
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


def _own_rows_of(indices, n_features):
    """A sparse participant's own rows (``_Participant.own_rows``): the
    distinct values of ``indices`` (features in ``[0, n_features)``), sorted,
    then the intercept's row ``n_features``, as int64; and, where it costs
    no more than the indices and values, each row's position among them
    (int32 over the table's rows, for ``own_positions``), else None.

    ``np.unique`` without its sort where a mask over the table's rows costs
    at most twice the indices' int32 bytes (0.03 s against 0.38 s for 7.8M
    indices of 2^22 features); a table far wider than the data (2^28)
    keeps the sort."""
    if n_features > 8 * indices.size:
        return np.append(np.unique(indices).astype(np.int64), n_features), None
    mask = np.zeros(n_features + 1, dtype=bool)
    mask[indices] = True
    mask[n_features] = True
    rows = np.flatnonzero(mask).astype(np.int64, copy=False)
    pos = np.cumsum(mask, dtype=np.int32) - 1 if n_features + 1 <= 2 * indices.size else None
    return rows, pos


def _sgd_participant(ctx: ParticipantContext, part, *, cfg: _RunConfig):
    """Task: one participant of a fit (see ``_participant_loop``).

    Called by ``ParameterServer.run`` on a worker (or in the caller's
    thread for a ``partial_fit`` of a small block, ``_in_process``). One
    BLAS thread: the parallelism is the participants', and BLAS's own
    threads cost more than they bring on the small vectors of a minibatch."""
    with _one_blas_thread():
        return _participant_loop(ctx, part, cfg)


_THREADPOOLS = None


def _one_blas_thread():
    """BLAS limited to one thread, by one ``ThreadpoolController`` per
    process: ``threadpool_limits`` inspects the loaded libraries at each
    call (~4 ms, a tenth of a small ``partial_fit``)."""
    global _THREADPOOLS
    if _THREADPOOLS is None:
        from threadpoolctl import ThreadpoolController

        _THREADPOOLS = ThreadpoolController()
    return _THREADPOOLS.limit(limits=1, user_api="blas")


class _TimedCtx:
    """The participant's session, with the seconds spent in its calls
    (``pull*``, ``push*``, ``clock``) counted: the fit's communication and
    waiting time, reported per participant (``_participant_loop``)."""

    def __init__(self, ctx: ParticipantContext):
        self._ctx = ctx
        self.seconds = 0.0
        self.by_call: dict[str, float] = {}

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    @property
    def overlaps(self) -> bool:
        """Whether the session reads ahead and clocks in the background
        (``prefetch_rows``, ``clock(wait=False)``: dask_ps's ``Session``)."""
        return hasattr(self._ctx, "prefetch_rows")

    def _call(self, name, *args, **kwargs):
        return self._call_fn(name, getattr(self._ctx, name), *args, **kwargs)

    def _call_fn(self, name, fn, *args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t
            self.seconds += dt
            self.by_call[name] = self.by_call.get(name, 0.0) + dt

    def pull(self, *args, **kwargs):
        return self._call("pull", *args, **kwargs)

    def pull_rows(self, *args, **kwargs):
        return self._call("pull_rows", *args, **kwargs)

    def push(self, *args, **kwargs):
        return self._call("push", *args, **kwargs)

    def push_rows(self, *args, **kwargs):
        return self._call("push_rows", *args, **kwargs)

    def clock(self, *args, **kwargs):
        return self._call("clock", *args, **kwargs)

    def prefetch(self, *args, **kwargs):
        return self._call("prefetch", *args, **kwargs)

    def prefetch_rows(self, *args, **kwargs):
        return self._call("prefetch_rows", *args, **kwargs)

    def result_of(self, handle, **kwargs):
        """``handle.result()`` of a prefetch, counted as ``prefetch_result``."""
        return self._call_fn("prefetch_result", handle.result, **kwargs)


def _participant_loop(ctx: ParticipantContext, part, cfg: _RunConfig):
    """One participant: ``pull -> update -> push -> clock()``; returns
    per-problem epoch counts, a per-epoch history (for ``verbose``), its
    state at the end (stopping rule and RNG, for the next run of a chunked
    fit) and a profile (where its time went).

    A participant that Dask retried (its worker died) starts at
    ``ctx.current_clock``: clock ``c`` of a run is round ``c % R`` of epoch
    ``epoch0 + c // R`` (``R`` rounds per epoch); the RNG replays the draws
    of the epochs done and the stopping decisions are re-read from the
    stats table (``_Participant.replay``). What is and is not exact:
    ``docs/architecture.rst``, "Estimators: SGD"."""
    t_enter = time.perf_counter()
    ctx = _TimedCtx(ctx)
    cpu0 = time.thread_time()
    run = _Participant(ctx, part, cfg)
    try:
        t_start = time.perf_counter()
        cpu_run = time.thread_time()  # the run's CPU, without the setup (_round_size.measured_costs)
        first, resume_round = run.replay()
        if run.solo:  # alone, a participant keeps the whole table local: one pull, one push (_Participant)
            run.W_all = ctx.pull(cfg.table)
            W_start = run.W_all.copy()
        if run.lone:
            run.lone_epochs(first)
        else:
            for epoch in range(first, cfg.max_iter):
                if not run.stop.active.any():
                    break
                run.epoch(epoch, resume_round if epoch == first else 0)
        if run.solo:
            ctx.push(cfg.table, run.W_all - W_start)
    finally:
        run.rounds.close()
    out = run.result(t_start, t_start - t_enter, cpu0)
    out["profile"]["run_cpu_seconds"] = time.thread_time() - cpu_run
    return out


class _Participant:
    """The state of one participant's run and its steps: setup
    (``__init__``), ``replay`` (the epochs a retried participant had done),
    ``epoch`` (its rounds: ``round``, prepared and trained by ``self.rounds``, then
    ``sync_round``), ``end_epoch`` and ``decide``."""

    def __init__(self, ctx: _TimedCtx, part, cfg: _RunConfig):
        self.ctx, self.cfg, self.hp = ctx, cfg, cfg.hp
        hp = cfg.hp
        self.K, self.d = hp.n_outputs, cfg.n_features
        X, y = part.X, part.y
        self.X = X
        self.xp = xp = arrays.xp_of(X)
        self.sparse = arrays.is_sparse(X)
        dtype = np.dtype(X.dtype)
        self.Y = _encode_targets(cfg, y, dtype, xp)
        self.sw = xp.asarray(part.sw, dtype=dtype)
        self.rng = np.random.RandomState(cfg.seeds[ctx.rank])
        val_mask = _validation_split(cfg, y, self.rng)
        self.train_idx = np.flatnonzero(~val_mask)
        self.val_idx = np.flatnonzero(val_mask)
        self.n_train = self.train_idx.shape[0]
        # Alone, a participant keeps the table local (one pull, one push),
        # unless it is too wide to hold (cfg.whole_table): then it reads
        # and pushes its rounds' rows as several participants do.
        self.solo = ctx.n_participants == 1 and cfg.whole_table
        # The rounds of an epoch (see ``_epoch_rounds``): lists of minibatches,
        # or, for compacted sparse rounds, (round id, order of its samples);
        # prepared and trained by ``self.rounds`` (``_rounds.make_rounds``).
        self.run_rounds = []  # the rounds fixed at the run's first epoch
        self.rounds = make_rounds(cfg, X, self.Y, self.sw, self.train_idx, self.run_rounds, solo=self.solo)
        # Alone in scikit-learn's order: scikit-learn's loop over the epochs, compiled (lone_epochs).
        self.lone = self.solo and getattr(self.rounds, "lone", False)
        self.stop = StopRule(hp, cfg.eta_init)
        state = cfg.states[ctx.rank] if cfg.states is not None else None
        if state is not None:  # a later run of a chunked or resumed fit
            self.stop.set_state(state["stop"])
            if state.get("rng") is not None:
                self.rng.set_state(_rng_state_from_json(state["rng"]))
        self.history = []
        # Sparse data: the participant's own features (sorted) and the
        # intercept's row, where it needs its rows of a wide table
        # (own_model, the objective's penalty term): built at first use.
        self._own_rows = None
        self._val_rows = None  # early stopping, sparse: (rows read, validation X over them)
        self.stats_pad = None if self.solo else np.zeros(1 + self.K + 3)  # a round's row: its loss sums only
        # The session's background reads and clocks (ps-lite's ZPull/Wait):
        # the next round's weights are read while this one trains, and a
        # round's push and clock go out while the next one starts. A plain
        # session (pull/push/clock only) works too, one call after the other.
        self.overlap = not self.solo and cfg.overlap and ctx.overlaps
        self.ahead = None  # (epoch, round index, PullHandle) of the read started a round ahead
        # This participant's model as the table counts it (exact model
        # averaging, see sync_round): the run's start until its first push.
        self.mine = None
        # Under a staleness bound: the own rounds' changes that make up for
        # the clocks a read missed (_catch_up; None: BSP, alone, or off).
        self.catch_up = CatchUp(cfg.staleness, ctx.n_participants) if cfg.catch_up and not self.solo else None
        self.samples = 0
        self.W_all = None
        self.stale_seen = {}  # the staleness histogram at the last progress row

    def draw(self, epoch):
        cfg = self.cfg
        return _epoch_rounds(self.rng, self.hp.shuffle, self.train_idx, cfg.steps_per_epoch, cfg.clock_every,
                             self.rounds.fixed, self.run_rounds, epoch, cfg.seeds[self.ctx.rank])

    def replay(self):
        """Where a retried task resumes: a lone participant never clocks and
        redoes its run; the others go on from the clock the run recorded,
        after replaying the draws and decisions of the epochs done. Returns
        ``(first epoch to train, its first round)``."""
        cfg = self.cfg
        rounds = -(-cfg.steps_per_epoch // cfg.clock_every)
        resume = 0 if self.solo else int(self.ctx.current_clock)
        done_epochs, resume_round = divmod(resume, rounds)
        first = cfg.epoch0
        for epoch in range(cfg.epoch0, min(cfg.epoch0 + done_epochs, cfg.max_iter)):
            if not self.stop.active.any():
                break
            self.draw(epoch)  # the draws the first attempt made
            self.samples += self.n_train
            self.decide(epoch, float("nan"))
            first = epoch + 1
        return first, resume_round

    def lone_epochs(self, first):
        """A lone participant in scikit-learn's order: its epochs from
        ``first`` and its stopping rule in one compiled loop, as
        scikit-learn's ``_plain_sgd`` (``_CompiledRounds.lone_epochs``),
        on the local table ``W_all``. One epoch per call where something is
        read after each: the validation score (early stopping, on the
        unscaled weights as scikit-learn scores them), a progress row
        (verbose) or a report to the dashboard (a run on a cluster)."""
        ctx, cfg, hp, stop, K = self.ctx, self.cfg, self.hp, self.stop, self.K
        per_epoch = hp.early_stopping or cfg.progress_table is not None or getattr(ctx, "run_id", None) is not None
        v = self.val_idx
        epoch = first
        while epoch < cfg.max_iter and stop.active.any():
            t_call = time.perf_counter()
            trained = stop.active.copy()
            sums, end = self.rounds.lone_epochs(self.W_all, epoch, epoch + 1 if per_epoch else cfg.max_iter, stop,
                                                decide=not hp.early_stopping)
            self.W_all = self.rounds.weights()
            seconds = (time.perf_counter() - t_call) / max(1, end - epoch)
            # Per epoch: the outputs it trained, their mean objective, the mean loss (per sample).
            was = np.vstack([trained[None, :], sums[:-1, :, 2] > 0])
            n = max(self.n_train, 1)
            objective = (sums[:, :, 1] * was).sum(axis=1) / np.maximum(was.sum(axis=1), 1) / n
            loss = sums[:, :, 0].mean(axis=1) / n
            for e in range(epoch, end):
                i = e - epoch
                self.samples += self.n_train
                val, score = np.zeros(K + 3), None
                if hp.early_stopping:
                    val = _validation_stats(cfg, self.rounds.raw, self.X[v], self.Y[v], self.sw[v], self.xp)
                    score = _validation_score(cfg, val)
                    stop.update(None, score)
                stop.last_decided = e
                self.history.append({
                    "epoch": e + 1,
                    "decided": e + 1,
                    "objective": float(objective[i]),
                    "score": None if score is None else float(np.mean(score)),
                    "seconds": seconds,
                    "samples": self.samples,
                    "active": int(stop.active.sum()) if e == end - 1 else int(np.count_nonzero(sums[i, :, 2])),
                })
                if per_epoch:
                    report_progress(ctx, loss=float(loss[i]), clock=e + 1 - cfg.epoch0)
                    if cfg.progress_table is not None:
                        self.report(e, sums[i, :, 0], val, seconds)
            if not per_epoch and end > epoch:  # the epochs of one call, at once (an in-process run's /ps row)
                report_progress(ctx, loss=float(loss[end - epoch - 1]), clock=end - cfg.epoch0)
            epoch = end

    def epoch(self, epoch, r_first):
        """Train ``epoch`` from its round ``r_first`` on."""
        t_epoch = time.perf_counter()
        ctx, cfg, xp, K = self.ctx, self.cfg, self.xp, self.K
        epoch_rounds = self.draw(epoch)
        loss_sum = xp.zeros(K)
        epoch_loss = None if self.solo else xp.zeros(K)  # the rounds' loss sums, for the progress row
        active = self.stop.active.copy()
        seen = sum(_round_size(g, self.run_rounds) for g in epoch_rounds[:r_first])
        self.samples += seen
        self.rounds.plan(epoch_rounds[r_first:])
        for ri in range(r_first, len(epoch_rounds)):
            if not self.solo:
                loss_sum = xp.zeros(K)  # pushed every round (see _participant_loop)
            rows, W0, W, n_round = self.round(epoch_rounds, ri, epoch, seen, active, loss_sum)
            seen += n_round
            self.samples += n_round
            if epoch_loss is not None:
                epoch_loss += loss_sum
            self.sync_round(rows, W0, W)
            if ri == len(epoch_rounds) - 1:
                W_end = self.W_all if self.solo else (None if self.sparse else W)
                seconds = time.perf_counter() - t_epoch
                val = self.end_epoch(epoch, loss_sum, W_end, seconds)
                whole = loss_sum if epoch_loss is None else epoch_loss
                # The dashboard's /ps page: the epoch's mean loss per sample (a
                # lone participant, which never clocks, also its rounds as clocks).
                report_progress(ctx, loss=float(np.mean(arrays.to_numpy(whole))) / max(self.n_train, 1),
                                **({"clock": (epoch + 1 - cfg.epoch0) * len(epoch_rounds)} if self.solo else {}))
                if cfg.progress_table is not None:
                    self.report(epoch, whole, val, seconds)
            else:
                row = np.concatenate([arrays.to_numpy(loss_sum).astype(float), self.stats_pad])
                ctx.push_rows(cfg.stats_table, np.array([_stats_row(cfg, ctx.rank, epoch)]), row[None, :])
                self.clock()

    def clock(self):
        """End of a round: the session's clock, reported in the background
        when it can (the next read waits as the table's bound requires)."""
        if self.overlap:
            self.ctx.clock(wait=False)
        else:
            self.ctx.clock()

    def round(self, epoch_rounds, ri, epoch, seen, active, loss_sum):
        """Round ``ri`` of the epoch: prepared (a sparse round compacted
        ahead), the weights it starts from read (a round ahead where the
        session can), the next round's read started, then trained; returns
        ``(rows, W0, W, n_samples)`` (``rows`` None for dense data)."""
        rnd = self.rounds.prepare(epoch_rounds, ri)
        W0, held = self.read(epoch, ri, rnd.rows)
        self.read_ahead(epoch, ri + 1, epoch_rounds)
        clock = None if self.catch_up is None else self.ctx.current_clock
        start = W0 if self.catch_up is None else self.catch_up.start(clock, rnd.rows, W0, held)
        offsets = self.cfg.average_offsets and not self.solo  # the table's averages as offsets (_averages)
        Wr = from_offsets(start.copy(), self.K, round_count(self.cfg, epoch, seen, self.n_train, active,
                                                            self.stop.n_iter)) if offsets else start
        W = self.rounds.train(rnd, Wr, epoch, seen, self.stop, active, loss_sum, self.eta_scale(epoch, seen))
        if offsets:
            to_offsets(W, self.K, round_count(self.cfg, epoch, seen + rnd.n, self.n_train, active, self.stop.n_iter))
        if self.catch_up is not None:
            self.catch_up.record(clock, rnd.rows, start, W)
        self.rounds.finish(rnd)
        if self.ahead is None:  # the next round was still being built: now, if it is ready
            self.read_ahead(epoch, ri + 1, epoch_rounds)
        return rnd.rows, W0, W, rnd.n

    def read(self, epoch, ri, rows):
        """The weights round ``ri`` of ``epoch`` reads: its touched ``rows``
        (None: the whole table), from the local table (alone), the read
        started a round ahead, or read now. Returns ``(values, clocks)``:
        per row the clock below which the others' rounds are in it, where
        the participant catches up (``self.catch_up``), else None."""
        ahead, self.ahead = self.ahead, None
        if self.solo:
            return (self.W_all if rows is None else self.W_all[self.xp.asarray(rows)]), None
        kw = {"with_clocks": True} if self.catch_up is not None else {}
        if ahead is not None and ahead[:2] == (epoch, ri):
            got = self.ctx.result_of(ahead[2], **kw)
        else:
            got = self.ctx.pull(self.cfg.table, **kw) if rows is None else self.ctx.pull_rows(self.cfg.table, rows,
                                                                                                **kw)
        return got if kw else (got, None)

    def read_ahead(self, epoch, ri, epoch_rounds):
        """Start the read of round ``ri``'s weights for the next clock (at
        which it is used: ``PullHandle.result`` checks it against that
        clock's bound and adds this participant's pushes made since),
        unless it is in the next epoch (whose order is drawn then) or not
        built yet (the read then waits for the round, at its start)."""
        if not self.overlap or ri >= len(epoch_rounds):
            return
        group = epoch_rounds[ri]
        if not self.rounds.ready(group):
            return
        rows = self.rounds.rows(group)
        nxt = self.ctx.current_clock + 1
        if rows is None:
            handle = self.ctx.prefetch(self.cfg.table, for_clock=nxt)
        else:
            handle = self.ctx.prefetch_rows(self.cfg.table, rows, for_clock=nxt)
        self.ahead = (epoch, ri, handle)

    def sync_round(self, rows, W0, W):
        """The round's model ``W`` (trained from the read ``W0``): into the
        local table (alone), or pushed so that the table stays the exact
        mean of the participants' latest models.

        The table starts at the run's start ``S`` and every push is
        ``(W - M) / P``, ``M`` this participant's previous model (``S`` before
        its first round; per row for sparse rounds): the pushes telescope,
        so once they are in the table is ``mean_p(M_p)`` whatever the reads
        held. A read that missed the others' last rounds makes this
        participant's next model start from an older mean (slower progress),
        never a table that drifts from the mean (docs/architecture.rst,
        "Estimators: SGD"). Under a bound the round started from the read
        plus what it missed (``self.catch_up``, ``round``); where it cannot
        (value-bounded models, ``ps.sgd.catch-up`` false) the push carries
        ``additive_share`` of the round's change from its read instead."""
        if self.solo:
            if rows is not None:  # a compacted round's rows (a lone participant's rounds are whole: make_rounds)
                self.W_all[self.xp.asarray(rows)] = W
            else:
                self.W_all = W
            return
        if self.cfg.staleness == 0:
            # BSP: the read is the table at this clock, the mean of the models
            # (aggregate="clock": every push of the clocks before, none after),
            # so (W - read) / P keeps the mean without the participant's own
            # model, and a retried participant or a chunked run pushes exactly
            # what the first attempt or one run would have.
            delta = W - W0
        else:
            mine = self.own_model()
            lam = 0.0 if self.catch_up is not None else self.additive_share()
            if rows is None:
                delta = W - mine
                if lam > 0.0:
                    delta += lam * (mine - W0)
                mine[...] = W
            else:  # the model's rows of this participant's features only (own_model)
                r = self.xp.asarray(self.own_positions(rows))
                delta = W - mine[r]
                if lam > 0.0:
                    delta += lam * (mine[r] - W0)
                mine[r] = W
        delta *= 1.0 / self.ctx.n_participants
        # Copied by the session (not copy=False, though the delta is never
        # written again): a read started a round ahead adds the session's own
        # copy of this push where the servers had not applied it yet, and
        # reads again what a handed-over array would have to come from.
        if self.sparse:
            self.ctx.push_rows(self.cfg.table, rows, delta)
        else:
            self.ctx.push(self.cfg.table, delta)

    def additive_share(self) -> float:
        """Under a staleness bound ``s``: the share ``a`` of the round's
        change from its read ``W0`` pushed on top of the exact mean's
        (``sync_round``: ``(W - M) / P + a (M - W0) / P``), ``a = x / s``,
        ``x = (f - 1) / (P - 1)`` the part of the round that trained in the
        small-step regime (``f``: its mean rate factor, ``_kernels.sample_scale``,
        1 where every sample's own step was large, ``P`` where all were small).

        The exact mean loses, every round, what a stale read missed of the
        others' last ``s`` rounds (its model starts from an older mean):
        where steps are small (bounded gradients far from their target:
        huber, epsilon_insensitive; small rates) that is up to ``s / (s + 1)``
        of the progress. There the additive delta ``(W - W0) / P`` of
        SSP-SGD (Ho et al. 2013) keeps it: the mean's update is every
        participant's gradient steps, at points at most ``s`` rounds old.
        Where a sample's own step is large a delayed additive update
        re-learns what the others already fitted and, delayed by ``s``
        rounds, diverges (R^2 -50 at SSP(3)): so the share shrinks with
        ``f`` and with ``s`` (docs/architecture.rst, "Estimators: SGD")."""
        P = float(self.ctx.n_participants)
        s = self.cfg.staleness
        if P <= 1 or not s or s <= 0:  # BSP; or no bound (ASP, VAP): no delay to bound the share by
            return 0.0
        f = float(getattr(self.rounds, "mean_scale", 1.0))
        return min(1.0, max(0.0, (f - 1.0) / (P - 1.0))) / s

    def own_model(self):
        """This participant's model as the table counts it (``sync_round``),
        created at the first push: the run's start, zeros or read from the
        start table (``_RunConfig.start_table``), which nobody pushes to.

        A retried participant (its worker died) cannot know the model its
        first attempt pushed last: it takes the table as it reads it now,
        so its earlier contribution stays in the mean as it was (the mean is
        off by that participant's distance from it, once; later rounds are
        exact again). Likewise every participant of a later run of a
        chunked fit starts from the mean. (Under BSP no own model is kept:
        ``sync_round``.)

        Sparse data: only the rows of the participant's own features and
        the intercept's (``own_rows``), the only rows it ever pushes; a
        model of the whole table would be the table's size in every
        participant's worker (1 GiB for 2^28 float32 weights)."""
        if self.mine is None:
            cfg = self.cfg
            rows = self.own_rows() if self.sparse else None
            if self.ctx.current_clock > 0 or cfg.start_table is not None:
                table = cfg.table if self.ctx.current_clock > 0 else cfg.start_table
                got = self.ctx.pull(table) if rows is None else self.ctx.pull_rows(table, rows)
                self.mine = arrays.to_numpy(got).copy()
            else:
                n = cfg.n_features + 1 if rows is None else rows.shape[0]
                self.mine = np.zeros((n, cfg.n_cols), dtype=np.dtype(self.X.dtype))
            self.mine = self.xp.asarray(self.mine)
        return self.mine

    def own_rows(self):
        """Sparse data: the rows of the weights table this participant's
        samples touch (its features, sorted) and the intercept's, last."""
        if self._own_rows is None:  # (rows, their positions or None)
            self._own_rows = _own_rows_of(arrays.to_numpy(self.X.indices), self.cfg.n_features)
        return self._own_rows[0]

    def own_positions(self, rows):
        """The positions of ``rows`` (sorted, among ``own_rows``) in
        ``own_rows``: a lookup where ``_own_rows_of`` built one (a binary
        search per row was 3-4 ms of every round under a bound on
        click-through data), else the search."""
        own = self.own_rows()
        pos = self._own_rows[1]
        return pos[rows] if pos is not None else np.searchsorted(own, rows)

    def eta_scale(self, epoch, seen) -> float:
        """The most a sample's learning rate is scaled by in a round
        (``_kernels.sample_scale``): ``P`` with ``P`` participants, 1 alone."""
        return 1.0 if self.solo else float(self.hp.eta_scale)

    def end_epoch(self, epoch, loss_sum, W, seconds):
        """Epoch end: objective (and validation) sums, the epoch's last clock,
        and the stopping decision (``decide``); returns the validation sums.

        ``loss_sum`` is the epoch's loss sum for a lone participant, and the
        last round's for the others, whose earlier rounds pushed theirs to the
        stats table already. With several participants the sums go to the
        stats table: to row ``epoch`` under a staleness bound, where they add
        up over the participants (see ``decide``), else to the participant's
        own row."""
        ctx, cfg, hp, K = self.ctx, self.cfg, self.hp, self.K
        # The penalty term of the objective only matters to the stopping rule.
        with_penalty = hp.penalty > 0 and hp.tol > -np.inf and not hp.early_stopping
        obj = arrays.to_numpy(loss_sum).astype(float)
        if with_penalty:
            Wp = W if W is not None else self.penalty_rows()
            obj = obj + self.n_train * arrays.to_numpy(_penalty_value(hp, Wp, arrays.namespace(Wp)))
        val = np.zeros(K + 3)
        if hp.early_stopping:
            v = self.val_idx
            if W is None and self.sparse:  # the rows of the validation samples' features only
                rows, Xv = self.validation_rows()
                val = _validation_stats(cfg, ctx.pull_rows(cfg.table, rows), Xv, self.Y[v], self.sw[v], self.xp)
            else:
                Wf = W if W is not None else ctx.pull(cfg.table)
                val = _validation_stats(cfg, Wf, self.X[v], self.Y[v], self.sw[v], self.xp)
        row = np.concatenate([obj, [float(self.n_train)], val])
        if cfg.stats_table is not None:
            ctx.push_rows(cfg.stats_table, np.array([_stats_row(cfg, ctx.rank, epoch)]), row[None, :])
        if not self.solo:
            self.clock()
        self.decide(epoch, seconds, row if cfg.stats_table is None else None)
        return val

    def penalty_rows(self):
        """The weights whose penalty term enters this participant's objective
        (``end_epoch``): the whole table (``cfg.whole_table``), else the
        rows of its own features and the intercept's, last: on a wide hashed
        table the stopping rule compares the penalty of the rows each
        participant's samples touch (summed over the participants with their
        sample counts) instead of the whole table's, which no participant
        holds (docs/architecture.rst, "Memory")."""
        if self.cfg.whole_table or not self.sparse:
            return self.ctx.pull(self.cfg.table)
        return self.ctx.pull_rows(self.cfg.table, self.own_rows())

    def validation_rows(self):
        """Sparse data, early stopping: ``(rows, Xv)``, the rows of the
        table that the validation samples touch (the intercept's last) and
        those samples with their columns renumbered to them (the same
        decision values as over the whole table)."""
        if self._val_rows is None:
            cols, Xv = compact_rows_xp(self.X[self.val_idx], self.cfg.n_features, self.xp)
            self._val_rows = (np.append(cols, self.cfg.n_features), Xv)
        return self._val_rows

    def report(self, epoch, epoch_loss, val, seconds):
        """Send this participant's progress row of ``epoch`` (verbose or a
        progress bar; read by the client's monitor, ``_monitor``) after the
        epoch's last clock: its loss sum, samples, seconds, the staleness of
        its reads of the weights in the epoch, its validation score, and the
        model's norm, non-zeros, bias and penalty term: a lone participant's
        own model, or on dense data rank 0's read of the table (the read
        the next round makes; sparse rounds read only their rows, so the
        monitor reads the table there)."""
        ctx, cfg, hp = self.ctx, self.cfg, self.hp
        row = np.full(_monitor.N_FIELDS, np.nan)
        row[_monitor.F_EPOCH] = epoch + 1
        row[_monitor.F_LOSS] = float(np.mean(arrays.to_numpy(epoch_loss)))
        row[_monitor.F_SAMPLES] = self.n_train
        row[_monitor.F_SECONDS] = seconds
        row[_monitor.F_END] = time.time()
        row[_monitor.F_READS:_monitor.F_STALE_MAX + 1] = self.staleness_since_last_report()
        if hp.early_stopping:
            row[_monitor.F_SCORE] = float(np.mean(_validation_score(cfg, val)))
        W = self.W_all if self.solo else (ctx.pull(cfg.table) if ctx.rank == 0 and not self.sparse else None)
        if W is not None:
            row[_monitor.F_NORM:_monitor.F_PENALTY + 1] = _monitor.model_summary(hp, W, self.d)
        where = np.array([_monitor.progress_row(cfg, ctx.n_participants, ctx.rank, epoch)])
        ctx.push_rows(cfg.progress_table, where, row[None, :])
        ctx.flush()  # only this row is buffered after the epoch's last clock

    def staleness_since_last_report(self):
        """``(reads, summed staleness, max staleness)`` of this participant's
        reads of the weights table since the last call (the session's
        staleness histogram, in clocks)."""
        metrics = self.ctx.metrics() if hasattr(self.ctx._ctx, "metrics") else {}
        hist = {int(k): int(v) for k, v in metrics.get("tables", {}).get(self.cfg.table, {}).get(
            "staleness", {}).items()}
        new = {k: v - self.stale_seen.get(k, 0) for k, v in hist.items() if v > self.stale_seen.get(k, 0)}
        self.stale_seen = hist
        return (sum(new.values()), sum(k * v for k, v in new.items()), max(new, default=0))

    def decide(self, epoch, seconds, row=None):
        """The stopping decision at the end of ``epoch`` (after its last clock).

        With several participants under a staleness bound ``s`` the decision
        is global: every participant pushes its sums to row ``epoch`` of the
        stats table, and decides about epoch ``epoch - lag`` once that row is
        complete (``lag = ceil(s / clocks_per_epoch)``), so every participant
        takes the same decision at the same clock without waiting for the
        others. Without a bound (ASP/VAP) each participant decides on its own
        row. A lone participant passes its ``row``. Reads only the table (and
        ``stop``), so a retried participant replays its decisions."""
        ctx, cfg, stop, K = self.ctx, self.cfg, self.stop, self.K
        decided = epoch
        if cfg.stats_table is not None:
            if cfg.global_stop:
                decided = epoch - cfg.decision_lag
            row = None
            if decided >= 0:
                r = _stats_row(cfg, ctx.rank, decided)
                row = arrays.to_numpy(ctx.pull_rows(cfg.stats_table, np.array([r]))[0])
        # An epoch counts once (a chunked fit carries ``last_decided`` over), and
        # a row without samples was never written (a fit resumed in another mode).
        if row is not None and (decided <= stop.last_decided or row[K] <= 0):
            row = None
        trained = stop.active.copy()  # a problem stopped now trained this epoch (scikit-learn counts it)
        if row is not None:
            objective = row[:K] / row[K]
            score = _validation_score(cfg, row[K + 1:]) if self.hp.early_stopping else None
            stop.update(objective, score)
            stop.last_decided = decided
        else:
            objective, score = np.full(K, np.nan), None
        stop.n_iter[trained] = epoch + 1
        self.history.append({
            "epoch": epoch + 1,
            "decided": decided + 1,
            "objective": float(np.mean(objective)),
            "score": None if score is None else float(np.mean(score)),
            "seconds": seconds,
            "samples": self.samples,
            "active": int(stop.active.sum()),
        })

    def result(self, t_start, setup_seconds, cpu0) -> dict:
        stop, ctx = self.stop, self.ctx
        return {
            "run_id": getattr(ctx, "run_id", None),  # the key of ParameterServer.metrics() (None: in process)
            "worker": participant_worker(ctx),  # where it ran (None: in process)
            "n_iter": stop.n_iter.tolist(),
            "history": self.history,
            "samples": self.samples,
            "seconds": time.perf_counter() - t_start,
            "eta": stop.eta.tolist(),
            "state": {"stop": stop.get_state(), "rng": _rng_state_to_json(self.rng)},
            # Where the participant's time went: its calls to the parameter
            # server (communication and clock waits) and its thread's CPU time.
            "profile": {
                "ps_seconds": ctx.seconds,
                "ps_seconds_by_call": dict(ctx.by_call),
                "cpu_seconds": time.thread_time() - cpu0,
                "setup_seconds": setup_seconds,  # data preparation before the first epoch
                # waiting for (or doing) a round's preparation: compaction, dense gathers
                "round_prep_seconds": self.rounds.seconds["round_prep"],
                "kernel_seconds": self.rounds.seconds["kernel"],  # the rounds' training
                # CPU seconds of the thread that builds the sparse rounds ahead
                "round_prep_cpu_seconds": self.rounds.cpu_seconds,
                "metrics": ctx.metrics() if hasattr(ctx._ctx, "metrics") else None,
            },
        }
