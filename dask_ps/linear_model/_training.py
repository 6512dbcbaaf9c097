"""One SGD training call on the parameter server (``_BaseSGDPS._train``):
the parts of the data, the weights and stats tables, the run configuration,
runs of ``checkpoint_every`` epochs each followed by a save, resuming from
a checkpoint, progress lines and ``metrics_``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import uuid
import warnings
from dataclasses import dataclass

import numpy as np
from dask.utils import parse_timedelta
from sklearn.utils import check_random_state

from dask_ps import ASP, BSP, SSP
from dask_ps._estimators._runs import table_consistency
from dask_ps._estimators import (
    CheckpointMismatchError,
    RolledBackError,
    Progress,
    arrays,
    checkpoint_record,
    chose_a_cluster,
    chunk_end,
    dashboard_run,
    find_checkpoint,
    may_be_worker_loss,
    participant_metrics,
    run_in_chunks,
    run_info,
    raise_no_samples,
    save_checkpoint,
    setting,
    setting_bytes,
    temporary_tables,
)
from dask_ps.linear_model import _participants
from dask_ps.linear_model._averages import average_count, from_offsets, to_offsets, uses_offsets
from dask_ps.linear_model._data import _dask_parts, _Input, _memory_parts, order_seed
from dask_ps.linear_model._in_process import InProcessSession
from dask_ps.linear_model._kernels import MAX_INT
from dask_ps.linear_model._monitor import N_FIELDS, RING_EPOCHS, EpochMonitor
from dask_ps.linear_model._lone import lone_sklearn_draws
from dask_ps.linear_model._participant import _PartData, _sgd_participant
from dask_ps.linear_model._round_size import RoundsByWork
from dask_ps.linear_model._rounds import _RunConfig

logger = logging.getLogger("dask_ps.linear_model")


@dataclass
class Trained:
    """What a training call returns; the estimator sets its fitted
    attributes from it (``_BaseSGDPS._partial_fit``)."""

    W: np.ndarray  # the final weights table
    n_iter: int
    n_seen: int  # what t_ counts an epoch: all the samples, the validation set's too, as scikit-learn's t_
    metrics: list  # metrics_
    run_ids: list  # run_ids_
    rollbacks: list  # rollbacks_
    profile: dict = dataclasses.field(default_factory=dict)  # where the call's time went (benchmarks)


@dataclass
class _Start:
    """Where a training call starts: the table's initial values, the epoch,
    the participants' states, and the names to use (a resumed checkpoint's)."""

    W0: np.ndarray
    seeds: tuple
    name: str
    epoch: int = 0
    states: tuple | None = None
    n_iter: int = 0
    saved_stats: np.ndarray | None = None
    # W0's averaged columns are offsets (_averages; a checkpoint's as saved)
    offsets: bool = False


def train(est, data: _Input, max_iter, n_outputs, coef, intercept, avg_coef, avg_intercept,
          classes=None, cw_pos=None, cw_neg=None, checkpoint=None, in_process=False):
    """Fit ``est`` on the parameter server from the given start; returns
    a ``Trained`` (the estimator sets its attributes from it).

    Without ``checkpoint``: one run of ``max_iter`` epochs. With one
    (``fit`` only): a compatible checkpoint found there is resumed from, and
    the epochs run in runs of ``checkpoint_every`` (all in one run if None),
    each followed by a save. ``in_process`` (``partial_fit``): an input
    the parameter server would train with one participant trains in this
    process instead (``_in_process``), with the same result."""
    rs = check_random_state(est.random_state)
    hp = est._hyper(n_outputs, data.sparse)
    start = (coef, intercept, avg_coef, avg_intercept)
    rollbacks = []  # chunks redone from the checkpoint (see _redo_from_checkpoint)
    if _trains_in_process(est, data, in_process, checkpoint):
        return _train_in_process(est, data, rs, hp, max_iter, n_outputs, start, classes, cw_pos, cw_neg)
    ps = est._parameter_server()
    d, K = data.n_features, n_outputs
    replication = int(getattr(est, "replication", 1))
    # Where the call's time went in this process (for the benchmarks).
    timing = dict.fromkeys(("parts_seconds", "tables_seconds", "run_seconds", "checkpoint_seconds", "pull_seconds",
                            "release_seconds"), 0.0)
    t = time.perf_counter()
    if data.kind == "dask":
        parts, sizes, _ = data.parts if data.parts is not None else _dask_parts(ps.client, data, est._is_classifier,
                                                                                     order_seed(est), est.verbose)
        data.parts = None  # released by this call, whatever happens
    else:
        parts, sizes = _memory_parts(ps.client, ps.wait_for_servers(), data, rs, hp.shuffle, replication)
    timing["parts_seconds"] = time.perf_counter() - t
    try:
        if not len(parts):
            raise_no_samples(est, d)
        P = len(parts)
        n_cols = 2 * K if hp.average else K
        # One participant on the whole input: scikit-learn's validation split and shuffle seeds, drawn here first.
        val_idx, sk_seeds = (lone_sklearn_draws(est, hp, data.y if data.kind == "memory" else None, data.sw, rs)
                             if P == 1 else (None, None))
        # (A lone participant's own seed is scikit-learn's first: no draw scikit-learn does not make.)
        seeds = sk_seeds[:1] if sk_seeds is not None else tuple(int(s) for s in rs.randint(MAX_INT, size=P))
        start = _Start(W0=_initial_table(data, hp, K, n_cols, coef, intercept, avg_coef, avg_intercept),
                       seeds=seeds, name=f"dask_ps-sgd-{uuid.uuid4().hex[:12]}")
        fingerprint = _fingerprint(est, hp, d, n_cols, classes, int(sum(sizes)))
        if checkpoint is not None:
            start = _resume(est, ps, checkpoint, fingerprint, start, d, n_cols, P, sizes, data.dtype)
        n_total = int(sum(sizes) * (1.0 - hp.validation_fraction)) if hp.early_stopping else int(sum(sizes))
        if val_idx is not None:
            n_total = sizes[0] - val_idx.shape[0]
        start = _averages_held(start, hp, K, uses_offsets(hp.average, P, _whole_table(data.sparse, start.W0)),
                               float(est.t_) + start.epoch * max(1, n_total))
        n_seen = int(sum(sizes))  # scikit-learn's t_ += n_iter_ * n_samples, its validation samples counted
        progress = Progress(est.verbose, logger, total=max_iter - start.epoch, unit="epoch", desc=type(est).__name__)
        with temporary_tables(ps) as tables, progress_closed(progress):
            t = time.perf_counter()
            stats, staleness = _create_tables(est, ps, tables, start, data, K, P, max_iter)
            timing["tables_seconds"] = time.perf_counter() - t
            compiled = data.device == "cpu" and setting("sgd", "kernel") != "minibatch"
            cfg = _run_config(est, hp, start, stats, staleness, d, n_cols, n_total, sizes, max_iter,
                              classes, cw_pos, cw_neg, data.sparse, compiled)
            cfg = dataclasses.replace(cfg, validation_idx=val_idx, sklearn_seeds=sk_seeds,
                                      average_offsets=start.offsets)
            record = dict(fingerprint=fingerprint, n_outputs=K, n_seen=n_seen, sizes=sizes)
            # The run's start: what the participants' own models are before
            # their first push (not kept under BSP: _Participant.sync_round).
            starts = _RunStarts(ps, tables, start, data.dtype) if P > 1 and staleness != 0 else None
            with _monitored(ps, tables, cfg, start, P, progress) as cfg:
                runs, states, n_iter = _run_chunks(est, ps, parts, cfg, start, checkpoint, record, timing, starts,
                                                   rollbacks)
            held = _table_bytes(ps, start.name)  # metrics_' table_bytes, while the tables exist
            t = time.perf_counter()
            W = arrays.to_numpy(ps.pull(start.name))
            if start.offsets:  # the averages at each output's last sample (_averages)
                epochs = np.max([s["stop"]["n_iter"] for s in states], axis=0) if states else np.full(K, n_iter)
                W = from_offsets(np.array(W), K, average_count(cfg.t0 + epochs * cfg.n_total, hp.average))
            timing["pull_seconds"] = time.perf_counter() - t
            t = time.perf_counter()
    finally:
        parts.release()
    timing["release_seconds"] = time.perf_counter() - t  # the tables dropped, the parts released
    return Trained(W, n_iter, n_seen, *_report(est, runs, held), rollbacks=rollbacks, profile=timing)


def _table_bytes(ps, name: str) -> dict[str, dict]:
    """Per shard server: the bytes of the fit's tables (``name`` and the
    tables named after it) it holds, with its memory limit and process
    memory (``ParameterServer.memory``): ``metrics_``'s ``table_bytes``."""
    out = {}
    for w, m in ps.memory().items():
        held = m.get("tables", {})
        out[w] = {"table_bytes": sum(b for n, b in held.items() if n == name or n.startswith(name + "-")),
                  "memory_limit": m.get("memory_limit"), "process_memory": m.get("process_memory")}
    return out


def _trains_in_process(est, data: _Input, partial: bool, checkpoint) -> bool:
    """Whether a call trains its lone participant in this process
    (``_in_process``): an input that gets one participant on any cluster
    (:func:`_one_participant_in_process`), in ``partial_fit``
    (``ps.sgd.partial-fit-in-process``), or in ``fit`` where no cluster was
    chosen (``client=None`` and no current Dask client: the parameter
    server would be the embedded cluster, started for this), nothing is
    checkpointed and ``replication`` is 1 (``ps.sgd.fit-in-process``).
    With a client, a ``fit`` runs on its cluster whatever its size."""
    if partial:
        return bool(setting("sgd", "partial-fit-in-process")) and _one_participant_in_process(data)
    return (bool(setting("sgd", "fit-in-process")) and checkpoint is None
            and int(getattr(est, "replication", 1)) == 1 and not chose_a_cluster(est.client)
            and _one_participant_in_process(data))


def _one_participant_in_process(data: _Input) -> bool:
    """Whether ``_memory_parts`` gives an input one participant on any
    cluster: in-memory numpy/scipy data whose work gets one
    (``_participants.participants``)."""
    if data.kind != "memory" or data.device != "cpu":
        return False
    if arrays.xp_of(data.X) is not np:
        return False
    return _participants.participants(data.X, cap=data.X.shape[0]) <= 1


def _train_in_process(est, data: _Input, rs, hp, max_iter, K, weights, classes, cw_pos, cw_neg):
    """``train`` of a lone participant in this process, on an
    ``InProcessSession``: what the parameter server's path does with one
    participant (one seed drawn, the same table and configuration, the same
    participant), without a cluster."""
    d, n = data.n_features, data.X.shape[0]
    n_cols = 2 * K if hp.average else K
    val_idx, sk_seeds = lone_sklearn_draws(est, hp, data.y, data.sw, rs)  # scikit-learn's, before the seed
    seeds = sk_seeds[:1]  # no draw scikit-learn does not make
    start = _Start(W0=_initial_table(data, hp, K, n_cols, *weights), seeds=seeds, name="weights")
    n_total = n if val_idx is None else n - val_idx.shape[0]
    if hp.early_stopping and val_idx is None:
        n_total = int(n * (1.0 - hp.validation_fraction))
    session = InProcessSession()
    session.create_table(start.name, start.W0)
    cfg = _run_config(est, hp, start, None, None, d, n_cols, n_total, [n], max_iter, classes, cw_pos, cw_neg,
                      data.sparse)
    cfg = dataclasses.replace(cfg, validation_idx=val_idx, sklearn_seeds=sk_seeds)
    progress = Progress(est.verbose, logger, total=max_iter, unit="epoch", desc=type(est).__name__)
    with progress_closed(progress), _monitored_in_process(session, cfg, start, progress) as cfg, \
            _shown_on_dashboard(est, session, cfg):
        result = _sgd_participant(session, _PartData(data.X, data.y, data.sw), cfg=cfg)
    return Trained(session.tables[start.name], int(max(result["state"]["stop"]["n_iter"])), n,
                   *_report(est, [[result]]), rollbacks=[])


def _whole_table(sparse: bool, W0) -> bool:
    """``_RunConfig.whole_table``: dense data, or a table of at most ``ps.sgd.whole-table-bytes``."""
    return not sparse or W0.nbytes <= setting_bytes("sgd", "whole-table-bytes")


def _averages_held(start: _Start, hp, K, offsets: bool, t: float) -> _Start:
    """``start`` with its table's averaged columns as offsets (``offsets``)
    or as averages, converted at global sample ``t`` where ``start`` holds
    them the other way (a checkpoint saved by another layout): ``_averages``."""
    if not hp.average or start.offsets == offsets:
        return dataclasses.replace(start, offsets=offsets)
    n = average_count(t, hp.average)
    W0 = np.array(start.W0, copy=True)
    return dataclasses.replace(start, W0=to_offsets(W0, K, n) if offsets else from_offsets(W0, K, n), offsets=offsets)


def _initial_table(data: _Input, hp, K, n_cols, coef, intercept, avg_coef, avg_intercept):
    """The weights table's start: rows are features (the last the intercept),
    columns the K outputs, then their averages."""
    d = data.n_features
    # Zeros are not written: a fit from scratch of a wide hashed table
    # leaves the client's pages of W0 untouched (np.zeros maps them lazily).
    W0 = np.zeros((d + 1, n_cols), dtype=data.dtype)
    if np.any(coef):
        W0[:d, :K] = np.asarray(coef).reshape(K, d).T
    W0[d, :K] = intercept
    if hp.average:
        if np.any(avg_coef):
            W0[:d, K:] = np.asarray(avg_coef).reshape(K, d).T
        W0[d, K:] = avg_intercept
    return W0


def _create_tables(est, ps, tables, start: _Start, data: _Input, K, P, max_iter):
    """The weights table, and with several participants the stats table:
    per-round loss sums and per-epoch stopping sums (see
    ``_Participant.end_epoch``), one row per epoch summed over the
    participants under a staleness bound (SSP(s) like the weights, without a
    value bound: a flush must not depend on the values), else one row per
    participant and epoch. Returns ``(stats table or None, staleness)``."""
    W0 = start.W0
    # consistency=None: BSP, the SGD estimators' own default (exact mean,
    # a sequential epoch's progress, reproducible); under SSP(s) stale reads
    # delay progress where steps are small (docs/user-guide.rst).
    consistency = BSP() if est.consistency is None else table_consistency(est.consistency)
    staleness = consistency.staleness
    # Under BSP the servers sum each clock's pushes in the participants'
    # order and apply the sum once the clock is complete: a read at clock c
    # holds exactly the clocks < c, so a fit is the same bit for bit from one
    # run to the next (count_aggregate: LDA does the same).
    # Under a bound the same, where participants catch up (ps.sgd.catch-up):
    # a read then holds exactly the clocks below its tag, which says what it
    # missed (_catch_up).
    aggregate = "clock" if (staleness == 0 or catches_up(consistency, P)) and P > 1 else "push"
    tables.create(start.name, shape=W0.shape, dtype=data.dtype, init=W0 if W0.any() else None,
                  consistency=consistency, device=data.device, replication=est.replication, aggregate=aggregate)
    if P == 1:
        return None, staleness
    global_stop = staleness is not None
    n_stats = K + 1 + K + 3
    n_rows = max_iter if global_stop else P * max_iter
    init = None
    saved = start.saved_stats
    if global_stop and saved is not None and saved.shape[1] == n_stats:
        init = np.zeros((n_rows, n_stats))
        k = min(n_rows, saved.shape[0])
        init[:k] = saved[:k]
        init = init if init.any() else None
    stats = tables.create(start.name + "-stats", shape=(n_rows, n_stats), dtype="float64", init=init,
                          consistency=SSP(staleness) if global_stop else ASP(), replication=est.replication,
                          aggregate=aggregate if global_stop else "push")
    return stats, staleness


@contextlib.contextmanager
def _monitored(ps, tables, cfg: _RunConfig, start: _Start, P, progress: Progress):
    """With ``verbose`` or a progress bar: the progress table in ``tables``
    and a monitor printing the epochs while the block runs; yields ``cfg``
    with the table (as given otherwise)."""
    if not progress.active:
        yield cfg
        return
    ring = max(1, min(cfg.max_iter - start.epoch, RING_EPOCHS))
    name = tables.create(start.name + "-progress", shape=(ring * P, N_FIELDS), dtype="float64", rule="assign",
                         consistency=ASP(), allow_nonfinite=True)  # NaN: a field a participant does not know
    monitor = EpochMonitor(
        lambda rows: ps.pull_rows(name, rows), lambda: ps.pull(cfg.table), n_participants=P, ring=ring,
        first_epoch=start.epoch, hp=cfg.hp, n_features=cfg.n_features, progress=progress, t_start=time.time(),
        period=parse_timedelta(setting("sgd", "progress-interval")))
    monitor.start()
    try:
        yield dataclasses.replace(cfg, progress_table=name, progress_epochs=ring)
    finally:
        monitor.stop()


@contextlib.contextmanager
def _monitored_in_process(session: InProcessSession, cfg: _RunConfig, start: _Start, progress: Progress):
    """``_monitored`` for a participant in this process: the progress table
    in ``session``, read at each of its flushes (one per epoch)."""
    if not progress.active:
        yield cfg
        return
    ring = max(1, min(cfg.max_iter - start.epoch, RING_EPOCHS))
    name = session.create_table("progress", np.zeros((ring, N_FIELDS)), assign=True)
    monitor = EpochMonitor(
        lambda rows: session.pull_rows(name, rows), lambda: session.pull(cfg.table), n_participants=1, ring=ring,
        first_epoch=start.epoch, hp=cfg.hp, n_features=cfg.n_features, progress=progress, t_start=time.time(),
        period=0)
    session.on_flush = monitor.poll_now
    try:
        yield dataclasses.replace(cfg, progress_table=name, progress_epochs=ring)
    finally:
        session.on_flush = None
        monitor.stop()


def _epochs(est, clocks_per_epoch, first, total) -> dict:
    """``run_info``'s units of an SGD run: epochs (``/ps`` counts them, not clocks)."""
    return {"unit": "epoch", "clocks_per_unit": max(1, int(clocks_per_epoch)), "first_unit": int(first),
            "total_units": int(total), "loss_name": f"mean {est.loss} loss per sample"}


@contextlib.contextmanager
def _shown_on_dashboard(est, session: InProcessSession, cfg: _RunConfig):
    """A fit trained in this process shows on the ``/ps`` page of the
    cluster this process already has a client of, for ``est.client``
    (the current client, or the embedded cluster if it was started;
    ``_estimators.dashboard_run``), as a run of one participant with the estimator's
    ``run_info``, clocks and loss (``_dashboard.LocalRun``: its messages
    never block the fit). Where there is none, nothing is reported: no
    cluster is started for the page."""
    per_epoch = -(-cfg.steps_per_epoch // cfg.clock_every)
    clocks = cfg.max_iter * per_epoch  # as _run_chunks plans a run's
    run = session.local_run = dashboard_run(est, clocks, _sgd_participant.__name__,
                                            **_epochs(est, per_epoch, 0, cfg.max_iter))
    if run is None:
        yield
        return
    try:
        yield
    except BaseException as e:
        run.end(f"failed: {type(e).__name__}: {e}")
        raise
    else:
        run.end()
    finally:
        session.local_run = None


@contextlib.contextmanager
def progress_closed(progress: Progress):
    """``progress``'s bar closed on leaving the block."""
    try:
        yield progress
    finally:
        progress.close()


# The fewest times a single-pass BSP fit of several participants averages
# their models (its rounds; _run_config).
MIN_AVERAGES = 4


def _run_config(est, hp, start: _Start, stats, staleness, d, n_cols, n_total, sizes, max_iter, classes, cw_pos,
                cw_neg, sparse, compiled=True) -> _RunConfig:
    """What every participant gets: the schedule (minibatches per epoch,
    rounds of ``ps.sgd.clock-samples`` samples, the stopping decision's lag)
    and the problem."""
    K = hp.n_outputs
    P = len(sizes)
    global_stop = P > 1 and staleness is not None
    steps = max(1, math.ceil(max(sizes) / est.batch_size))
    bsp = staleness == 0
    min_rounds = max(1, int(setting("sgd", "bsp-min-rounds-per-epoch" if bsp else "min-rounds-per-epoch")))
    if bsp and int(max_iter) <= 1:
        # A single pass (max_iter=1, partial_fit) still averages its
        # participants' models MIN_AVERAGES times: one average (one-shot
        # averaging) scored 0.729 on sorted text rows against scikit-learn's
        # 0.764-0.778, four 0.75-0.76. Only there: the rounds of a fit of
        # max_iter=2 stay those of max_iter=4, which resumes it.
        min_rounds = max(min_rounds, MIN_AVERAGES)
    if P > 1 and compiled:
        # The compiled kernel trains sample by sample (batch_size only cuts
        # the rounds): small inputs get their rounds too.
        steps = max(steps, min(min_rounds, min(sizes)))
    b_local = max(1, max(sizes) // steps)
    clock_every = max(1, int(setting("sgd", "clock-samples")) // b_local) if P > 1 else steps
    if P > 1:
        # At least ps.sgd.min-rounds-per-epoch rounds: a staleness bound of s
        # clocks must stay a small part of an epoch whatever the data's size
        # (with one round an epoch, SSP(2) let a participant train two epochs
        # without the others' work). Under BSP a read misses nothing: the
        # rounds only bound how far the models drift apart between averages,
        # and ps.sgd.bsp-min-rounds-per-epoch (1) lets a large input's rounds
        # grow to ps.sgd.clock-samples (fewer clocks, each ~3-9 ms of sync).
        clock_every = min(clock_every, max(1, steps // min_rounds))
    clock_every = min(clock_every, steps)
    clocks_per_epoch = math.ceil(steps / clock_every)
    lag = math.ceil(staleness / clocks_per_epoch) if global_stop else 0
    # Every call starts 'adaptive' at eta0, as scikit-learn's does (a
    # partial_fit or warm refit that started at the rate the last fit had
    # decayed to, ~1e-7, barely learned).
    eta_init = [float(est.eta0)] * K
    if P > 1:  # the most a sample's learning rate is scaled by (_kernels.sample_scale)
        hp = dataclasses.replace(hp, eta_scale=float(P))
    return _RunConfig(
        table=start.name, stats_table=stats, hp=hp, n_features=d, n_cols=n_cols,
        n_total=max(1, n_total), steps_per_epoch=steps, clock_every=clock_every,
        max_iter=int(max_iter), t0=float(est.t_), seeds=start.seeds,
        staleness=staleness, global_stop=global_stop, decision_lag=lag, classes=classes,
        cw_pos=tuple(np.ones(K) if cw_pos is None else cw_pos),
        cw_neg=tuple(np.ones(K) if cw_neg is None else cw_neg),
        eta_init=tuple(eta_init), col_freq_needed=sparse, stats_stride=int(max_iter),
        overlap=bool(setting("sgd", "overlap")),
        catch_up=catches_up(table_consistency(est.consistency) if est.consistency is not None else None, P),
        whole_table=_whole_table(sparse, start.W0),
    )


def catches_up(consistency, P: int) -> bool:
    """Whether the participants of a fit under ``consistency`` (None: BSP)
    make up for the clocks their reads missed (``_catch_up``): under a
    staleness bound of at least one clock and no value bound, with several
    participants, unless ``ps.sgd.catch-up`` is false."""
    s = None if consistency is None else consistency.staleness
    return (P > 1 and s is not None and s >= 1 and consistency.value_bound is None
            and bool(setting("sgd", "catch-up")))


class _RunStarts:
    """The table of a run's start (``_RunConfig.start_table``): what the
    weights table holds when a run begins, which the participants need to
    keep the table the exact mean of their models (``_Participant.own_model``).
    None where that is zeros (a fit from scratch: no table); otherwise an
    ``assign`` table, given the start of each run.

    (A mean per row over the participants whose samples have the feature,
    counted at each run's start, was measured on the hashed 2^20 set: the
    same accuracy, E=1 0.6340 against 0.6328, and 0.3 s more to count; not
    kept.)"""

    def __init__(self, ps, tables, start: _Start, dtype):
        self.ps, self.tables, self.dtype = ps, tables, dtype
        self.name = start.name + "-start"
        self.first = start.W0
        self.created = False

    def before_run(self, cfg: _RunConfig, first: bool) -> str | None:
        W = self.first if first else arrays.to_numpy(self.ps.pull(cfg.table))
        if not W.any():
            return None
        if not self.created:
            self.tables.create(self.name, shape=W.shape, dtype=self.dtype, rule="assign", consistency=ASP())
            self.created = True
        self.ps.push(self.name, W)
        return self.name


def _run_chunks(est, ps, parts, cfg: _RunConfig, start: _Start, checkpoint, record, timing=None, starts=None,
                rollbacks=None):
    """The runs of ``checkpoint_every`` epochs (one run without a
    checkpoint), each followed by a save (``run_in_chunks``); returns
    ``(runs' results, the participants' last states, n_iter)``; adds the
    seconds of the runs and saves to ``timing`` and the chunks trained again
    from the checkpoint to ``rollbacks`` (``_redo_from_checkpoint``)."""
    timing = {} if timing is None else timing
    rollbacks = [] if rollbacks is None else rollbacks
    every = est.checkpoint_every if checkpoint is not None else None
    max_iter = cfg.max_iter
    by_work = RoundsByWork(cfg, len(parts))  # the first epoch measured, the later rounds sized by it
    saved = [cfg.table] + ([cfg.stats_table] if cfg.global_stop else [])
    seen = dict.fromkeys(saved, 0)  # restores from the checkpoint accounted for, per table
    runs = []
    owner = type(est).__name__

    def done(position):
        epoch, states, _ = position
        return epoch >= max_iter or (states is not None and not any(any(s["stop"]["active"]) for s in states))

    def run(position):
        epoch, states, _ = position
        end = by_work.end(epoch, chunk_end(epoch, max_iter, every))
        if checkpoint is not None:  # a worker lost between two runs, e.g. during a save
            _raise_restored(ps, saved, seen, "(between runs)")
        run_cfg = by_work.config(cfg)
        if epoch or states is not None or end != max_iter:
            run_cfg = dataclasses.replace(run_cfg, epoch0=epoch, max_iter=end, states=states)
        if starts is not None:
            first = not runs and not rollbacks
            run_cfg = dataclasses.replace(run_cfg, start_table=starts.before_run(run_cfg, first=first))
        t = time.perf_counter()
        try:
            per_epoch = -(-run_cfg.steps_per_epoch // run_cfg.clock_every)  # R rounds an epoch
            results = ps.run(_sgd_participant, parts.futures, cfg=run_cfg,
                             run_info=run_info(est, (end - epoch) * per_epoch, **_epochs(est, per_epoch, epoch, max_iter)))
        finally:
            timing["run_seconds"] = timing.get("run_seconds", 0.0) + time.perf_counter() - t
        if checkpoint is not None:  # restored as the run ended: not saved, trained again
            _raise_restored(ps, saved, seen, results[0].get("run_id") or "(a run)")
        by_work.measured(run_cfg, end - epoch, results)
        return end, results

    def recover(error, position):
        epoch = position[0]
        end = epoch if getattr(error, "run_id", None) == "(between runs)" else chunk_end(epoch, max_iter, every)
        if isinstance(error, RolledBackError):
            rolled = error
        elif checkpoint is not None and may_be_worker_loss(error):
            # The run failed while a lost worker's blocks were being restored
            # from the checkpoint (a read that found them unreachable for
            # ps.timeouts.failover): once the repair is done, the same redo.
            ps.wait_for_placement()
            rolled = _restored(ps, saved, seen, "(a failed run)")
            if rolled is None:
                return None
        else:
            return None
        back = _redo_from_checkpoint(ps, checkpoint, saved, rolled, epoch, end, rollbacks, owner)
        if back is not None:
            seen.update(dict.fromkeys(saved, 0))  # loaded again: new tables
        return back

    def finish(position, outcome):
        end, results = outcome
        runs.append(results)
        states = tuple(r["state"] for r in results)
        n_iter = int(max(max(s["stop"]["n_iter"]) for s in states))
        if checkpoint is not None:
            metadata = checkpoint_record(
                est._checkpoint_kind(), record["fingerprint"],
                n_outputs=record["n_outputs"], epoch=end, n_iter=n_iter, t0=cfg.t0,
                t_=cfg.t0 + n_iter * record["n_seen"], average_offsets=cfg.average_offsets,
                tables={"weights": cfg.table, "stats": cfg.stats_table if cfg.global_stop else None},
                n_parts=len(record["sizes"]), sizes=[int(s) for s in record["sizes"]], seeds=list(cfg.seeds),
                states=list(states))
            t = time.perf_counter()
            save_checkpoint(ps, checkpoint, saved, metadata, owner=owner, after=f"epoch {end}")
            timing["checkpoint_seconds"] = timing.get("checkpoint_seconds", 0.0) + time.perf_counter() - t
        return end, states, n_iter

    _, states, n_iter = run_in_chunks((start.epoch, start.states, start.n_iter), done=done, run=run,
                                      recover=recover, finish=finish)
    return runs, states, n_iter


def _restored(ps, saved, seen, run_id) -> RolledBackError | None:
    """The restores of the tables ``saved`` from their checkpoint that no run
    reported (beyond the ``seen`` first records per table: a worker lost
    between two runs, e.g. during a save, or during a run that failed), as
    a ``RolledBackError``; None when there are none."""
    missed = [r for name in saved for r in ps.rollbacks(name)[seen[name]:]]
    return RolledBackError.from_run(run_id, missed) if missed else None


def _raise_restored(ps, saved, seen, run_id) -> None:
    missed = _restored(ps, saved, seen, run_id)
    if missed is not None:
        raise missed


def _redo_from_checkpoint(ps, checkpoint, saved, error: RolledBackError, epoch, end, rollbacks, owner):
    """After a run of epochs ``[epoch, end)`` that ended with ``error``
    (blocks of the fit's tables were lost with a worker, ``replication=1``,
    and restored from the checkpoint while it ran, or between runs when
    ``end == epoch``: the tables mix checkpoint and current blocks): load
    the whole tables ``saved`` again from the checkpoint they were restored
    from and return where it stands, ``(epoch, states, n_iter)``, to train
    from there. Recorded in ``rollbacks`` (the estimator's ``rollbacks_``),
    with a ``RuntimeWarning``.

    Returns None without a checkpoint of this fit to go back to (a table
    restored from another path, another fit's tables)."""
    records = error.rollbacks
    path = None if checkpoint is None else str(checkpoint)
    if (path is None or not records
            or any(r["table"] not in saved or str(r["checkpoint"]) != path for r in records)):
        return None
    meta = ps.load(checkpoint, tables=saved, overwrite=True)
    back_to = int(meta["epoch"])
    tables = sorted({r["table"] for r in records})
    rollbacks.append({
        "epochs": [int(epoch), int(end)],  # the run that lost its updates
        "resumed_from_epoch": back_to,
        "run_id": error.run_id,
        "tables": tables,
        "rollbacks": records,
    })
    when = f"during epochs {epoch + 1}-{end}" if end > epoch else f"after epoch {epoch}"
    warnings.warn(
        f"{owner}: a worker was lost {when} and blocks of {tables} were restored from the "
        f"checkpoint at {path!r}: training again from that checkpoint (epoch {back_to})",
        RuntimeWarning, stacklevel=5)
    logger.warning("%s: run %s rolled back (%s); epochs from %d trained again", owner, error.run_id,
                   tables, back_to)
    return back_to, tuple(meta["states"]), int(meta["n_iter"])


# --- checkpoints -----------------------------------------------------------------------------


def _fingerprint(est, hp, d, n_cols, classes, n_samples) -> dict:
    """What a checkpoint must match to be resumed: the data's shape (its
    samples however split: another cluster may resume) and classes and the
    parameters that define the problem and the schedule
    (``_BaseSGDPS._checkpoint_params``). Without the samples, a fit on
    other data with as many features resumed the old model silently."""
    return {
        "n_features": d, "n_samples": n_samples, "n_cols": n_cols,
        "classes": None if classes is None else np.asarray(classes).tolist(),
        **est._checkpoint_params(hp),
    }


def _resume(est, ps, path, fingerprint, start: _Start, d, n_cols, n_parts, sizes, dtype) -> _Start:
    """The start saved at ``path`` (``start`` as given when there is no
    checkpoint there): checks that the checkpoint belongs to this fit, loads
    its tables, reads the weights and stopping sums, and drops them again."""
    meta = find_checkpoint(path, est._checkpoint_kind(), fingerprint, owner=type(est).__name__)
    if meta is None:
        return start
    tables = meta["tables"]
    names = [tables["weights"]] + ([tables["stats"]] if tables.get("stats") else [])
    with temporary_tables(ps) as loaded:
        loaded.add(*names)
        ps.load(path, tables=names, overwrite=True)
        W = arrays.to_numpy(ps.pull(tables["weights"]))
        saved_stats = arrays.to_numpy(ps.pull(tables["stats"])) if tables.get("stats") else None
    if W.shape != (d + 1, n_cols):
        raise CheckpointMismatchError(
            f"the checkpoint at {str(path)!r}: weights of shape {W.shape}, expected {(d + 1, n_cols)}")
    states = [dict(s) for s in meta["states"]]
    same_parts = meta["n_parts"] == n_parts and list(meta["sizes"]) == [int(s) for s in sizes]
    if not same_parts:
        # Another split of the data (another number of workers, or sizes):
        # every participant goes on with the first one's stopping rule and
        # a fresh shuffling RNG.
        states = [{"stop": states[0]["stop"], "rng": None} for _ in range(n_parts)]
    return _Start(
        # The saved names: a save keeps the checkpoint's other tables, so new
        # names would pile up there.
        W0=W.astype(dtype, copy=False), name=tables["weights"], saved_stats=saved_stats,
        epoch=int(meta["epoch"]), n_iter=int(meta["n_iter"]), states=tuple(states),
        seeds=tuple(meta["seeds"]) if meta["n_parts"] == n_parts else start.seeds,
        offsets=bool(meta.get("average_offsets", False)),
    )


# --- progress and metrics --------------------------------------------------------------------


def _report(est, runs, held=None) -> tuple[list, list]:
    """``(metrics_, run_ids_)``: the last run's participants' metrics (with
    the bytes of the fit's tables on each one's worker, from ``held``:
    ``_table_bytes``) and the call's runs (keys of
    ``ParameterServer.metrics()``); with
    ``verbose``, prints scikit-learn's last line when the stopping rule
    ended the fit (the epochs themselves were printed as they ended,
    ``_monitor``)."""
    last = runs[-1] if runs else []
    metrics = participant_metrics(
        [dict(r["profile"], samples=r["samples"], seconds=r["seconds"], history=r["history"],
              run_id=r.get("run_id"), worker=r.get("worker")) for r in last],
        fields=("run_id", "worker", "ps_seconds", "ps_seconds_by_call", "cpu_seconds", "setup_seconds",
                "round_prep_seconds", "round_prep_cpu_seconds", "kernel_seconds", "samples", "seconds", "history"),
    )
    for m in metrics:
        on = (held or {}).get(m.get("worker"))
        if on is not None:
            m.update(table_bytes=on["table_bytes"], worker_memory_limit=on["memory_limit"],
                     worker_process_memory=on["process_memory"])
    run_ids = [results[0]["run_id"] for results in runs if results and results[0].get("run_id")]
    progress = Progress(est.verbose, logger)
    if not progress or not last:
        return metrics, run_ids
    n_iter = max(max(r["n_iter"]) for r in last)
    seconds = sum(max(r["seconds"] for r in results) for results in runs)
    if not any(any(r["state"]["stop"]["active"]) for r in last):
        progress.line(f"Convergence after {n_iter} epochs took {seconds:.2f} seconds")
    return metrics, run_ids
