"""The runs of one LDA fit, on the shared estimator machinery
(``dask_ps._estimators``): the corpus on the workers, the topic assignments
kept between runs, runs redone after a lost worker, checkpoints and the
verbose monitor (see "Estimators: LDA" in ``docs/architecture.rst``).

Called by ``LatentDirichletAllocation.fit`` on the client.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import dask
import numpy as np
from dask.utils import parse_timedelta

import dask_ps
from dask_ps._estimators import (
    MAX_RESTARTS,
    InvalidPart,
    PollingMonitor,
    Progress,
    TrainingParts,
    arrays,
    checkpoint_record,
    chunk_end,
    cluster_members,
    lost_workers,
    may_be_worker_loss,
    raise_invalid_parts,
    rate,
    run_in_chunks,
    save_checkpoint,
    setting,
    temporary_tables,
)
from dask_ps.decomposition._corpus import _part_stats, _prepare_part, _prepare_rows, _split_rows_at
from dask_ps.decomposition._gibbs import (
    P_DONE,
    P_EVALUATED,
    P_LOGLIK,
    P_READS,
    P_SECONDS,
    P_STALE_MAX,
    P_STALE_SUM,
    P_TOKEN_LOGLIK,
    PROGRESS_COLUMNS,
    GibbsConfig,
    LostAssignmentsError,
    _gibbs_participant,
)
from dask_ps.decomposition._scoring import _chunk_history

# The estimator's logger: what users configure for verbose output and restarts.
logger = logging.getLogger("dask_ps.decomposition._lda")

CHECKPOINT_KIND = "dask_ps.decomposition.LatentDirichletAllocation"
OWNER = "LatentDirichletAllocation"


# --- the corpus on the workers ----------------------------------------------------------


def make_parts(client, uid, n_features, *, chunks=None, matrix=None, n_parts=None) -> TrainingParts:
    """The prepared partitions (futures on the workers, one per participant).

    A dask array's row ``chunks`` (its ``to_delayed()`` pieces) are computed
    where Dask puts them, checked and prepared there, and recomputed from
    the graph when lost. An in-memory count ``matrix`` (already checked) is
    split on the client into ``n_parts`` row ranges with about the same
    number of tokens and scattered; a lost piece is split and scattered
    again.
    """
    key_prefix = f"lda-prepare-{uid}"
    if chunks is not None:
        prepare = functools.partial(_prepare_part, n_features=n_features, check=True)
        return TrainingParts.from_chunks(client, chunks, prepare=prepare, key_prefix=key_prefix)
    prepare = functools.partial(_prepare_rows, n_features=n_features)
    return TrainingParts.from_pieces(client, lambda: _split_rows_at(matrix, n_parts), prepare=prepare,
                                     key_prefix=key_prefix)


@dataclasses.dataclass(frozen=True, eq=False)
class CorpusLayout:
    """What the client knows of the prepared partitions (those with tokens)."""

    part_tokens: list[int]  # tokens per participant
    holders: np.ndarray  # per word: how many partitions hold it (at least 1)
    n_tokens: int
    rounded: bool = False  # a chunk of a dask array held floats that were rounded


def corpus_layout(parts: TrainingParts, uid, n_features) -> CorpusLayout:
    """Token counts and vocabularies of the partitions; the empty ones are
    dropped from ``parts`` (all of them for a corpus without tokens, which
    the estimator fits without a run)."""
    stats = parts.gather(_part_stats, key_prefix=f"lda-stats-{uid}")
    try:  # chunks that failed the checks: their error, raised here (issue 24)
        raise_invalid_parts("LatentDirichletAllocation", [s if isinstance(s, InvalidPart) else (s[0],) * 3
                                                          for s in stats])
    except BaseException:
        parts.release()
        raise
    n_tokens = sum(s[1] for s in stats)
    rounded = any(s[3] for s in stats)
    parts.keep([i for i, s in enumerate(stats) if s[1] > 0])
    holders = np.zeros(n_features, dtype=np.float64)
    part_tokens = [int(s[1]) for s in stats if s[1] > 0]
    for s in stats:
        if s[1] > 0:
            holders[s[2]] += 1
    holders[holders == 0] = 1.0
    return CorpusLayout(part_tokens, holders, int(n_tokens), rounded)


def totals_in_word_table(word, totals_consistency, vocabulary_slices: int) -> bool:
    """Whether a fit keeps the topic totals as the word-topic table's last
    row (row ``n_features``): with ``totals_consistency`` None, where the
    word rows are read from the servers every clock anyway (staleness 0, or
    ``refresh``: LDA's default) and held all at once. One read and one push
    then bring the rows and the totals, a message per server, not one more
    each way to the server of a totals table, and the totals are read under
    the rows' model, as fresh as ASP read them."""
    return (totals_consistency is None and vocabulary_slices == 1
            and (word.staleness == 0 or bool(getattr(word, "refresh", False))))


def reads_ahead(model) -> bool:
    """Whether the participants send each iteration's read with the clock
    before (``_gibbs._read_ahead``): under a model of staleness 0 without
    ``refresh`` (BSP, the seeded default), whose reads wait for the bound
    and hold the same values whenever they are made. A refreshing read
    (the unseeded default, ``SSP(2, refresh=True)``) is sent after the
    clock: made when the clock arrives it missed more of the others' last
    pushes (a 400-document corpus, S=1: log-likelihood -119,084 and
    -121,672 against -118,981 and -119,011 read after the clock, three
    seeds each). ``ps.lda.read-ahead: false``: the read after the clock
    under BSP too."""
    return (bool(setting("lda", "read-ahead")) and model.staleness == 0
            and not bool(getattr(model, "refresh", False)))


def count_aggregate(model) -> str:
    """How a count table sums pushes: per clock under a model of staleness 0
    (BSP), else per push.

    The reproducible mode. A BSP read at clock ``c`` is guaranteed every
    push of clocks ``< c``, but with per-push sums it also sees whatever
    pushes of clock ``c`` a faster participant has already made, which
    depends on timing (two fits with the same seeds differed by up to 26
    counts). Summed per clock, the servers hold clock ``c``'s pushes back
    until every participant has finished it, so each read sees exactly the
    clocks ``< c`` plus the reader's own pushes, and the same seeds give the
    same chain. With staleness, fresher rows are worth more than that (a
    read may see any clock between ``c - s`` and now), so pushes count at once.
    """
    return "clock" if model.staleness == 0 else "push"


def _starts_together(plan) -> bool:
    """Whether the first reads of a run wait for every participant's
    starting counts by themselves (staleness 0 on both count tables);
    otherwise the participants wait for them once (``start_name``)."""
    return plan.word_model.staleness == 0 and plan.totals_model.staleness == 0


# --- assignments between runs, progress ---------------------------------------------------


class _AssignmentSets:
    """Two alternating sets of tables holding each participant's topic
    assignments (int32, assign rule, ``replication`` copies), named from
    ``z_id`` (a resumed checkpoint's, so that saves replace its tables).

    A chunk reads the last complete set and writes the other, so a chunk
    that fails half-way never damages the set it would be redone from."""

    def __init__(self, ps, z_id, part_tokens, replication):
        self.ps, self.part_tokens, self.replication = ps, part_tokens, replication
        self.names = [[f"lda-{z_id}-assignments{s}-{r}" for r in range(len(part_tokens))] for s in (0, 1)]

    def fresh(self, s):
        """(Re)create set ``s`` empty: the set a chunk writes holds nothing
        needed, also after its blocks were lost with a worker."""
        existing = set(self.ps.tables())
        for name, n in zip(self.names[s], self.part_tokens):
            if name in existing:
                self.ps.drop_table(name)
            self.ps.create_table(name, shape=(n,), dtype="int32", rule="assign",
                                 consistency=dask_ps.ASP(), replication=self.replication)


def iteration_line(n, max_iter, perplexity=None, details="") -> str:
    """The verbose line of iteration ``n`` (sweeps done), scikit-learn's
    (``"iteration: %d of max_iter: %d"``, with ``", perplexity: %.4f"`` on
    evaluations), with dask_ps's ``details`` after it on the same line."""
    line = f"iteration: {n} of max_iter: {max_iter}"
    if perplexity is not None:
        line += f", perplexity: {perplexity:.4f}"
    return line + details


def end_of_fit_lines(progress, runs, est, final, P) -> None:
    """After a fit: the last iteration's line, unless the monitor printed it
    (after the run: its evaluation is the exact final state's; its
    perplexity is ``bound_``, as scikit-learn's last evaluation is), and the
    summary, to the logger only (scikit-learn prints nothing more).
    Nothing without ``verbose`` (a ``bound_`` left pending stays so)."""
    if not progress.verbose > 0:
        return
    if runs.stop > runs.printed:
        evaluated = est.evaluate_every > 0 and runs.stop % est.evaluate_every == 0
        progress.line(iteration_line(
            runs.stop, est.max_iter, est.bound_ if evaluated else None,
            # said: bound_ (scikit-learn's variational bound) sits well above the
            # sampler's plug-in figure of the lines before (1,025 -> 1,999 on the news corpus)
            f" (bound_, scikit-learn's variational bound; the lines before: the sampler's; log-likelihood "
            f"{final:.6g}, {est.tokens_per_second_:.3g} tokens/s, {runs.seconds:.1f} s)"
            if evaluated else ""))
    progress.log(
        f"LatentDirichletAllocation: {runs.stop} iterations, {est.n_tokens_} tokens, {P} participants, "
        f"{runs.seconds:.1f} s, {est.tokens_per_second_:.3g} tokens/s, log-likelihood {final:.6g}, "
        f"bound_ (perplexity) {est.bound_:.6g} ({runs.score_seconds:.1f} s)"
    )


class _Monitor(PollingMonitor):
    """Prints a line per iteration while the fit runs, as the participants
    write their progress (verbose), and moves the progress bar.

    Participant ``r`` writes row ``(it - start) * P + r`` of a small assign
    table (``_gibbs.P_*`` columns) at iteration ``it`` of the run, after
    its read: done, seconds since the fit started and, when ``it`` was
    evaluated, its parts of the log-likelihood and of the tokens'
    log-likelihood and the staleness of its word-row reads. Iteration
    ``it``'s row is the state after ``it`` sweeps, scikit-learn's line of
    iteration ``it`` (its iterations count from 1, after the update); it is
    complete when all ``P`` rows are written. Iteration 0 (the random
    start) is logged, not printed: scikit-learn prints nothing for it.
    ``printed``: the last iteration whose line was printed (across the
    runs of a fit); ``reported``: where the bar is."""

    def __init__(self, ps, table, n_participants, evaluate_every, n_tokens, max_iter, progress: Progress, period,
                 start=0, printed=0):
        super().__init__(period, name="lda-progress")
        self.ps, self.table, self.P = ps, table, n_participants
        self.every, self.n_tokens, self.max_iter, self.progress = evaluate_every, n_tokens, max_iter, progress
        self.first = start  # the run's first iteration (row 0)
        self._next = 0  # the next row (iteration first + _next) to look at
        self._last = None  # (seconds, iteration) of the previous evaluation: tokens/s since it
        self.printed = printed
        self.reported = start

    def poll(self):
        prog = self.ps.pull(self.table).reshape(-1, self.P, PROGRESS_COLUMNS)
        while self._next < len(prog) and np.all(prog[self._next, :, P_DONE] >= 1):
            rows = prog[self._next]
            n = self.first + self._next
            self._next += 1
            sec = float(rows[:, P_SECONDS].max())
            if not np.all(rows[:, P_EVALUATED] >= 1):
                if n > self.printed:
                    self.progress.line(iteration_line(n, self.max_iter))
                    self.printed = n
                self._advance(n)
                continue
            ll = float(rows[:, P_LOGLIK].sum())
            perplexity = float(np.exp(-rows[:, P_TOKEN_LOGLIK].sum() / self.n_tokens))
            speed = ""
            if self._last is not None and n > self._last[1]:
                speed = f", {rate(self.n_tokens * (n - self._last[1]), sec - self._last[0]):.3g} tokens/s"
            reads = rows[:, P_READS].sum()
            stale = (f", staleness {rows[:, P_STALE_SUM].sum() / reads:.2f} (max {int(rows[:, P_STALE_MAX].max())})"
                     if reads > 0 and self.P > 1 else "")
            details = f" (log-likelihood {ll:.6g}{speed}{stale}, {sec:.1f} s)"
            self._last = (sec, n)
            if n == 0:  # the random start: scikit-learn prints no line for it
                self.progress.log(f"iteration: 0 of max_iter: {self.max_iter} (the random start): "
                                  f"log-likelihood {ll:.6g}, training perplexity {perplexity:.4f}{stale}")
            elif n > self.printed:
                self.progress.line(iteration_line(n, self.max_iter, perplexity, details))
                self.printed = n
            self._advance(n, perplexity=f"{perplexity:.4g}")

    def _advance(self, n, **postfix):
        if n > self.reported:
            self.progress.advance(n - self.reported, **postfix)
            self.reported = n


# --- the runs of one fit ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class RunPlan:
    """How one fit is cut into runs, decided before the first.

    Fault tolerance (``tolerant``: a checkpoint or replication): the fit
    trains in chunks of ``every`` iterations; after each, the assignments go
    to one of two alternating sets of tables (replicated, and saved when
    checkpointing). A chunk that loses a worker is redone from the last
    complete set. Without it the fit is one run of ``max_iter`` iterations.
    """

    max_iter: int
    every: int
    tolerant: bool
    checkpoint: str | None
    fingerprint: dict  # what a checkpoint must match to be resumed
    n_parts: int | None  # saved, so that a resumed fit splits in-memory input alike
    replication: int  # copies of the assignment tables
    word_model: object
    totals_model: object
    totals_row: bool  # the totals are the word-topic table's last row (read and pushed with the rows)
    count_dtype: type
    block_rows: int
    n_tokens: int
    # partial_fit of a fitted model: its word-topic counts (V x K), where the
    # count tables start (the new documents' starting counts go on top)
    base: np.ndarray | None = dataclasses.field(default=None, repr=False)


class GibbsRuns:
    """The runs of one fit, from ``resume`` = ``(z_id, good, history)``:
    the name of the assignment tables, the last complete set and iteration
    (``(set, iteration)`` or None) and the history so far.

    After :meth:`run`: ``results`` (the participants' reports of the last
    run), ``nwk``/``nk`` (the final counts), ``stop`` (iterations the final
    assignments have had), ``history``, ``n_restarts``, ``first_iteration``,
    ``t_start``, ``seconds`` (the runs), ``score`` (what ``run``'s ``score``
    returned) and ``score_seconds`` (its time).
    """

    def __init__(self, ps, parts: TrainingParts, uid, plan: RunPlan, fixed: dict, resume, progress: Progress,
                 info: dict | None = None):
        self.ps, self.client, self.parts, self.uid, self.plan = ps, ps.client, parts, uid, plan
        self.info = info or {}  # the dashboard's run_info (name, params), planned clocks added per run
        self.fixed = fixed  # the GibbsConfig fields that are the same in every run of the fit
        self.progress = progress
        self.z_id, self.good, self.history = resume
        self.P = len(plan.fingerprint["part_tokens"])
        self.sets = (_AssignmentSets(ps, self.z_id, plan.fingerprint["part_tokens"], plan.replication)
                     if plan.tolerant else None)

    def run(self, score=None):
        """Every chunk up to ``max_iter``; then ``score(parts, nwk)``, while
        the prepared partitions are still on the workers (``bound_``), is
        kept as ``self.score`` (None without it)."""
        self.results = None
        self.score = None
        self.n_restarts = 0
        self.t_start = time.time()
        t0 = time.perf_counter()
        self.first_iteration = self.good[1] if self.good else 0
        self.printed = self.first_iteration  # the last iteration whose verbose line was printed
        try:
            with temporary_tables(self.ps) as kept:
                if self.plan.tolerant:
                    kept.add(*self.sets.names[0], *self.sets.names[1])
                    if self.good is not None:
                        self.ps.load(self.plan.checkpoint, tables=self.sets.names[self.good[0]], overwrite=True)
                    for s in (0, 1):
                        if self.good is None or s != self.good[0]:
                            self.sets.fresh(s)
                # (the last complete assignment set or None, the iteration reached)
                # At least one run: a finished checkpoint resumed trains nothing
                # but reads its counts.
                run_in_chunks((self.good, self.good[1] if self.good else 0),
                              done=lambda position: self.results is not None and position[1] >= self.plan.max_iter,
                              run=self._chunk, recover=self._recover, finish=self._finish)
            # the sampling's time; bound_'s scoring (scikit-learn's E-step over
            # the training documents, as its fit ends with) is timed apart
            self.seconds = time.perf_counter() - t0
            if score is not None:
                self.score = score(self.parts, self.nwk)
        finally:
            self.parts.release()
        self.score_seconds = time.perf_counter() - t0 - self.seconds
        return self

    def _chunk(self, position):
        """One run from ``position`` (``run_in_chunks``); returns ``(stop,
        the set written, the monitor's last iteration printed)``."""
        current = position[0]
        plan, sets = self.plan, self.sets
        start = current[1] if current else 0
        stop = chunk_end(start, plan.max_iter, plan.every)
        out = (1 - self.good[0] if self.good else 0) if plan.tolerant else None
        tag = f"{self.uid}-{self.n_restarts}-{start}"
        cfg = GibbsConfig(
            **self.fixed, nwk_name=f"lda-{tag}-word-topic",
            nk_name=None if plan.totals_row else f"lda-{tag}-topic-totals",
            progress_name=f"lda-{tag}-progress" if stop > start and self.progress.active else None,
            start_name=None if _starts_together(plan) else f"lda-{tag}-started",
            start=start, stop=stop, z_in=sets.names[current[0]] if current else None,
            z_out=sets.names[out] if plan.tolerant else None, t_start=self.t_start,
            lone_local=bool(setting("lda", "lone-participant-local")),
            read_ahead=reads_ahead(plan.word_model),
            report_seconds=parse_timedelta(dask.config.get("ps.dashboard.report-interval", "250ms")),
        )
        # whose loss _recover looks for: the members at every chunk's start
        # since the last restart (a worker that died between two chunks was
        # not among the next one's, and its loss failed the fit unrecovered)
        self._members = getattr(self, "_members", set()) | cluster_members(self.client)
        with temporary_tables(self.ps) as tables:
            monitor = None
            try:
                monitor = self._create_tables(cfg, tables)
                # the starting counts, then a sweep each (a lone participant
                # reports those it never clocks: _lone_iterations)
                info = dict(self.info, planned_clocks=1 + stop - start, unit="iteration", clocks_per_unit=1,
                            first_unit=int(start), total_units=int(plan.max_iter), lead_clocks=1,
                            loss_name="-log p(words, topics) per token, nats")
                self.results = self.ps.run(_gibbs_participant, self.parts.futures, cfg=cfg, run_info=info)
                if stop >= plan.max_iter:
                    counts = np.maximum(arrays.to_numpy(self.ps.pull(cfg.nwk_name)), 0)
                    if cfg.nk_name is None:  # the totals row, last
                        self.nwk, self.nk = counts[:-1], counts[-1].astype(np.int64)
                    else:
                        self.nwk = counts
                        self.nk = np.maximum(arrays.to_numpy(self.ps.pull(cfg.nk_name)), 0)
            finally:
                if monitor is not None:
                    monitor.stop()
                    self.printed = max(self.printed, monitor.printed)
        return stop, out, (monitor.reported if monitor is not None else start)

    def _finish(self, position, outcome):
        """After a run (``run_in_chunks``): its history, and with fault
        tolerance the set it wrote becomes the last complete one once saved."""
        stop, out, reported = outcome
        current = position[0]
        self.history.extend(_chunk_history(self.results, self.P))
        self.progress.advance(stop - reported)
        self.stop = stop
        if self.plan.tolerant:
            current = (out, stop)
            if self.plan.checkpoint is None or self._save(out, stop):
                self.good = current
        return current, stop

    def _recover(self, error, position):
        """After a failed run (``run_in_chunks``): the position to redo the
        chunk from (the last complete set), or None."""
        current = position[0]
        start = current[1] if current else 0
        stop = chunk_end(start, self.plan.max_iter, self.plan.every)
        if not self._restart(error, self._members, start, stop):
            return None
        return self.good, self.good[1] if self.good else 0

    def _create_tables(self, cfg: GibbsConfig, tables):
        """The run's count tables (and, verbose, its progress table and
        monitor), in ``tables`` (dropped when the run ends)."""
        plan = self.plan
        K, V = cfg.n_components, cfg.n_features
        # The count tables live where the sampler runs (device="cuda": on the
        # GPU, the array sampler's rows are read and pushed without a host copy).
        # partial_fit: the tables start from the fitted counts (plan.base)
        base = {} if plan.base is None else {"init": plan.base.astype(plan.count_dtype)}
        totals = {} if plan.base is None else {"init": plan.base.sum(axis=0).astype(np.int64)}
        n_rows = V + 1 if cfg.nk_name is None else V  # the totals row after the word rows
        if cfg.nk_name is None and plan.base is not None:
            base = {"init": np.vstack([base["init"], totals["init"].astype(plan.count_dtype)[None]])}
        # sparse_wire: the word rows are mostly zeros (at K=1000, 99% late in
        # a fit), and so are the deltas pushed; between processes they move
        # as their nonzeros.
        tables.create(cfg.nwk_name, shape=(n_rows, K), dtype=plan.count_dtype, consistency=plan.word_model,
                      block_rows=plan.block_rows, aggregate=count_aggregate(plan.word_model), device=cfg.device,
                      sparse_wire=True, **base)
        if cfg.nk_name is not None:
            tables.create(cfg.nk_name, shape=(K,), dtype="int64", consistency=plan.totals_model,
                          aggregate=count_aggregate(plan.totals_model), device=cfg.device, **totals)
        if cfg.start_name is not None:
            # VAP: its reads always go to the servers (the participants poll it)
            tables.create(cfg.start_name, shape=(1,), dtype="float64", consistency=dask_ps.VAP(1.0))
        if cfg.progress_name is None:
            return None
        tables.create(cfg.progress_name, shape=((cfg.stop - cfg.start) * self.P, PROGRESS_COLUMNS),
                      dtype="float64", rule="assign", consistency=dask_ps.ASP())
        monitor = _Monitor(self.ps, cfg.progress_name, self.P, cfg.evaluate_every, plan.n_tokens, plan.max_iter,
                           self.progress, period=parse_timedelta(setting("lda", "progress-interval")),
                           start=cfg.start, printed=self.printed)
        monitor.start()
        return monitor

    def _restart(self, error, members, start, stop) -> bool:
        """After a failed run: when workers of ``members`` were lost (and
        restarts are left), make ready to redo the chunk from the last
        complete set and return True; else False (the error is the fit's)."""
        lost = set()
        if self.plan.tolerant:
            # A death that caused the error may take the scheduler a moment
            # to notice (lost_workers waits for it); bad input cannot be one.
            wait = {} if may_be_worker_loss(error, also=(LostAssignmentsError,)) else {"wait": 0.0}
            lost = lost_workers(self.client, members, **wait)
        if not lost:
            return False
        self._members = cluster_members(self.client)  # these losses are handled here
        self.n_restarts += 1
        logger.warning(
            "LatentDirichletAllocation: worker(s) %s lost during iterations %d-%d (%s: %s); "
            "redoing from iteration %d (restart %d of at most %d)",
            sorted(lost), start, stop, type(error).__name__, error, self.good[1] if self.good else 0,
            self.n_restarts, MAX_RESTARTS,
        )
        self.ps.wait_for_placement()
        self.sets.fresh(1 - self.good[0] if self.good else 0)  # the set the redo writes
        self.parts.rebuild_lost(owner=OWNER)
        return True

    def _save(self, out, stop) -> bool:
        plan = self.plan
        metadata = checkpoint_record(
            CHECKPOINT_KIND, plan.fingerprint, z_id=self.z_id, set=out, iteration=stop, n_parts=plan.n_parts,
            history=[list(h) for h in self.history],
        )
        return save_checkpoint(self.ps, plan.checkpoint, self.sets.names[out], metadata, owner=OWNER,
                               after=f"iteration {stop}")
