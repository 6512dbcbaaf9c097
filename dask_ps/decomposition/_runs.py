"""Chunked runs of LDA's Gibbs sampler: the partitions of the corpus on the
workers, the topic assignments kept between runs, runs redone after a lost
worker, checkpoints, and verbose progress (see "Estimators: LDA" in
``docs/architecture.rst``).

Called by ``LatentDirichletAllocation.fit`` on the client.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings

import dask
import numpy as np
from dask.utils import parse_timedelta

import dask_ps
from dask_ps.decomposition._corpus import _part_stats, _prepare_part, _split_rows
from dask_ps.decomposition._gibbs import GibbsConfig, LostAssignmentsError, _gibbs_participant
from dask_ps.decomposition._scoring import _chunk_history

# The estimator's logger: what users configure for verbose output and restarts.
logger = logging.getLogger("dask_ps.decomposition._lda")

CHECKPOINT_KIND = "dask_ps.decomposition.LatentDirichletAllocation"


def _config(key):
    """``ps.lda.<key>`` from ``dask.config`` (defaults in ``dask_ps/ps.yaml``)."""
    return dask.config.get(f"ps.lda.{key}")


class _Parts:
    """The prepared partitions (futures on the workers, one per participant)
    and how to make one again when the worker that held it died.

    In-memory input is split on the client and scattered (no lineage: a lost
    piece is split and scattered again from ``matrix``); a dask array's
    chunks are computed where Dask puts them and recomputed from the graph.
    """

    def __init__(self, client, uid, n_features, *, delayed=None, matrix=None, n_parts=None):
        self.client, self.uid, self.n_features = client, uid, n_features
        self._delayed, self._matrix, self._n_parts = delayed, matrix, n_parts
        self._made = 0
        if delayed is not None:
            blocks = client.compute(delayed)
            self.futures = [self._prepare(b, check=True) for b in blocks]
        else:
            pieces = client.scatter(_split_rows(matrix, n_parts), hash=False)
            self.futures = [self._prepare(p, check=False) for p in pieces]
        self._index = list(range(len(self.futures)))

    def _prepare(self, block, check):
        self._made += 1
        return self.client.submit(_prepare_part, block, n_features=self.n_features, check=check,
                                  key=f"lda-prepare-{self.uid}-{self._made}")

    def keep(self, indices):
        """Keep only these partitions (those with tokens), in this order."""
        self.futures = [self.futures[i] for i in indices]
        self._index = [self._index[i] for i in indices]

    def rebuild_lost(self):
        """Make again the partitions whose data is gone with a worker."""
        for j, fut in enumerate(self.futures):
            if fut.status not in ("error", "cancelled", "lost"):
                continue
            i = self._index[j]
            if self._delayed is not None:
                self.futures[j] = self._prepare(self.client.compute(self._delayed[i]), check=True)
            else:
                piece = _split_rows(self._matrix, self._n_parts)[i]
                self.futures[j] = self._prepare(self.client.scatter(piece, hash=False), check=False)
            logger.info("LatentDirichletAllocation: partition %d was lost with its worker; made again", i)

    def release(self):
        self.futures = []


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


def _may_be_worker_loss(error) -> bool:
    """Whether a failed run's error can come from a lost worker (then the
    scheduler gets a moment to notice the death); bad input cannot."""
    from distributed.scheduler import KilledWorker

    return (isinstance(error, (LostAssignmentsError, dask_ps.PSError, KilledWorker, OSError))
            and not isinstance(error, ValueError))


def _lost_workers(client, members, wait) -> set:
    """Workers of ``members`` that left the cluster (waiting up to ``wait``
    seconds for the scheduler to notice a death that caused an error)."""
    deadline = time.monotonic() + wait
    while True:
        lost = set(members) - set(client.scheduler_info(n_workers=-1)["workers"])
        if lost or time.monotonic() > deadline:
            return lost
        time.sleep(0.2)


def _drop_tables(ps, names):
    for name in names:
        try:
            ps.drop_table(name)
        except Exception:  # pragma: no cover - cluster going away
            logger.warning("could not drop table %r", name, exc_info=True)


class _Monitor(threading.Thread):
    """Logs the training log-likelihood as participants report it (verbose).

    Participant ``r`` writes ``(loglik part, 1, seconds)`` into row
    ``(it // evaluate_every) * P + r`` of a small assign table; an evaluation
    is complete when all its P rows are written. ``first``: the first
    evaluation of this chunk."""

    def __init__(self, ps, table, n_participants, evaluate_every, n_tokens, t_start, period, first=0):
        super().__init__(daemon=True, name="lda-progress")
        self.ps, self.table, self.P = ps, table, n_participants
        self.every, self.n_tokens, self.t_start, self.period = evaluate_every, n_tokens, t_start, period
        self._stop_event = threading.Event()
        self._logged = first
        self._last = (0.0, 0)

    def stop(self):
        self._stop_event.set()
        self.join(timeout=10)

    def _poll(self):
        prog = self.ps.pull(self.table).reshape(-1, self.P, 3)
        while self._logged < len(prog) and np.all(prog[self._logged, :, 1] >= 1):
            ll = float(prog[self._logged, :, 0].sum())
            sec = float(prog[self._logged, :, 2].mean())
            it = self._logged * self.every
            t0, it0 = self._last
            rate = self.n_tokens * (it - it0) / (sec - t0) if it > it0 and sec > t0 else float("nan")
            logger.info("iteration %d: log-likelihood %.6g, %.3g tokens/s (%.1f s)", it, ll, rate, sec)
            self._last = (sec, it)
            self._logged += 1

    def run(self):
        try:
            while not self._stop_event.wait(self.period):
                self._poll()
            self._poll()
        except Exception:  # the cluster went away: progress is best effort
            logger.debug("progress monitor stopped", exc_info=True)


# --- the corpus on the workers ----------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class CorpusLayout:
    """What the client knows of the prepared partitions (those with tokens)."""

    part_tokens: list[int]  # tokens per participant
    holders: np.ndarray  # per word: how many partitions hold it (at least 1)
    n_tokens: int


def corpus_layout(client, parts: _Parts, uid, n_features) -> CorpusLayout:
    """Token counts and vocabularies of the partitions; the empty ones are
    dropped from ``parts``."""
    stats = client.gather(client.map(_part_stats, parts.futures,
                                     key=[f"lda-stats-{uid}-{i}" for i in range(len(parts.futures))]))
    n_tokens = sum(s[1] for s in stats)
    if n_tokens == 0:
        raise ValueError("LatentDirichletAllocation.fit: X has no tokens (every document is empty)")
    parts.keep([i for i, s in enumerate(stats) if s[1] > 0])
    holders = np.zeros(n_features, dtype=np.float64)
    part_tokens = [int(s[1]) for s in stats if s[1] > 0]
    for s in stats:
        if s[1] > 0:
            holders[s[2]] += 1
    holders[holders == 0] = 1.0
    return CorpusLayout(part_tokens, holders, int(n_tokens))


# --- checkpoints --------------------------------------------------------------------------


def check_resumable(meta, fingerprint, path):
    """Refuse a checkpoint that is not of this fit (another estimator, no
    metadata, other data or priors)."""
    where = f"the checkpoint at {path!r}"
    if meta.get("estimator") != CHECKPOINT_KIND:
        raise ValueError(
            f"{where} holds {meta.get('estimator') or 'tables of something else'}, not a "
            "LatentDirichletAllocation fit; use another checkpoint path"
        )
    diffs = [f"{k}: saved {meta.get(k)!r}, now {v!r}" for k, v in fingerprint.items() if meta.get(k) != v]
    if diffs:
        raise ValueError(
            f"{where} belongs to another fit ({'; '.join(diffs)}): use another checkpoint path, or "
            "delete that checkpoint to start over"
        )


def save_checkpoint(ps, path, tables, metadata) -> bool:
    """``ps.save`` between two chunks; on failure warn and go on (the
    previous checkpoint stays the one to resume from)."""
    try:
        ps.save(path, tables=tables, metadata=metadata)
        return True
    except Exception as e:
        warnings.warn(f"LatentDirichletAllocation: checkpoint after iteration {metadata['iteration']} "
                      f"not saved: {type(e).__name__}: {e}", RuntimeWarning,
                      stacklevel=6)  # as before: past _save, _chunk, run and fit, to fit's wrapper
        return False


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
    count_dtype: type
    block_rows: int
    n_evals: int  # evaluations a progress table has room for (0: no progress, not verbose)
    n_tokens: int


class GibbsRuns:
    """The runs of one fit, from ``resume`` = ``(z_id, good, history)``:
    the name of the assignment tables, the last complete set and iteration
    (``(set, iteration)`` or None) and the history so far.

    After :meth:`run`: ``results`` (the participants' reports of the last
    run), ``nwk``/``nk`` (the final counts), ``stop`` (iterations the final
    assignments have had), ``history``, ``n_restarts``, ``first_iteration``,
    ``t_start`` and ``seconds``.
    """

    def __init__(self, ps, parts: _Parts, uid, plan: RunPlan, fixed: dict, resume):
        self.ps, self.client, self.parts, self.uid, self.plan = ps, ps.client, parts, uid, plan
        self.fixed = fixed  # the GibbsConfig fields that are the same in every run of the fit
        self.z_id, self.good, self.history = resume
        self.P = len(plan.fingerprint["part_tokens"])
        self.sets = (_AssignmentSets(ps, self.z_id, plan.fingerprint["part_tokens"], plan.replication)
                     if plan.tolerant else None)

    def run(self):
        self.results = None
        self.n_restarts = 0
        self.t_start = time.time()
        t0 = time.perf_counter()
        self.first_iteration = self.good[1] if self.good else 0
        created = []
        try:
            if self.plan.tolerant:
                created.extend(self.sets.names[0] + self.sets.names[1])
                if self.good is not None:
                    self.ps.load(self.plan.checkpoint, tables=self.sets.names[self.good[0]], overwrite=True)
                for s in (0, 1):
                    if self.good is None or s != self.good[0]:
                        self.sets.fresh(s)
            current, done = self.good, False
            while not done:
                current, done = self._chunk(current)
        finally:
            _drop_tables(self.ps, created)
            self.parts.release()
        self.seconds = time.perf_counter() - t0
        return self

    def _chunk(self, current):
        """One run from ``current``; returns where the next starts and whether the fit is done."""
        plan, sets = self.plan, self.sets
        start = current[1] if current else 0
        stop = min(plan.max_iter, start + plan.every) if start < plan.max_iter else start
        out = (1 - self.good[0] if self.good else 0) if plan.tolerant else None
        tag = f"{self.uid}-{self.n_restarts}-{start}"
        cfg = GibbsConfig(
            **self.fixed, nwk_name=f"lda-{tag}-word-topic", nk_name=f"lda-{tag}-topic-totals",
            progress_name=f"lda-{tag}-progress" if plan.n_evals else None,
            start=start, stop=stop, z_in=sets.names[current[0]] if current else None,
            z_out=sets.names[out] if plan.tolerant else None, t_start=self.t_start,
        )
        members = set(self.client.scheduler_info(n_workers=-1)["workers"])
        chunk_tables = []
        monitor = None
        try:
            monitor = self._create_tables(cfg, chunk_tables)
            self.results = self.ps.run(_gibbs_participant, self.parts.futures, cfg=cfg)
            if stop >= plan.max_iter:
                self.nwk = np.maximum(self.ps.pull(cfg.nwk_name), 0)
                self.nk = np.maximum(self.ps.pull(cfg.nk_name), 0)
        except Exception as e:
            if not self._restart(e, members, start, stop):
                raise
            return self.good, False
        finally:
            if monitor is not None:
                monitor.stop()
            _drop_tables(self.ps, chunk_tables)
        self.history.extend(_chunk_history(self.results, self.P))
        self.stop = stop
        if plan.tolerant:
            current = (out, stop)
            if plan.checkpoint is None or self._save(out, stop):
                self.good = current
        return current, stop >= plan.max_iter

    def _create_tables(self, cfg: GibbsConfig, created):
        """The run's count tables (and progress table and monitor, verbose);
        their names go to ``created`` as they are made."""
        plan, ps = self.plan, self.ps
        K, V = cfg.n_components, cfg.n_features
        ps.create_table(cfg.nwk_name, shape=(V, K), dtype=plan.count_dtype, consistency=plan.word_model,
                        block_rows=plan.block_rows)
        created.append(cfg.nwk_name)
        ps.create_table(cfg.nk_name, shape=(K,), dtype="int64", consistency=plan.totals_model)
        created.append(cfg.nk_name)
        if cfg.progress_name is None:
            return None
        ps.create_table(cfg.progress_name, shape=(plan.n_evals * self.P, 3), dtype="float64",
                        rule="assign", consistency=dask_ps.ASP())
        created.append(cfg.progress_name)
        monitor = _Monitor(ps, cfg.progress_name, self.P, cfg.evaluate_every, plan.n_tokens, self.t_start,
                           period=parse_timedelta(_config("progress-interval")),
                           first=-(-cfg.start // cfg.evaluate_every))
        monitor.start()
        return monitor

    def _restart(self, error, members, start, stop) -> bool:
        """After a failed run: when workers of ``members`` were lost (and
        restarts are left), make ready to redo the chunk from the last
        complete set and return True; else False (the error is the fit's)."""
        max_restarts = int(_config("max-restarts"))
        lost = set()
        if self.plan.tolerant:  # a worker's death may take the scheduler a moment to notice
            wait = parse_timedelta(_config("lost-worker-wait")) if _may_be_worker_loss(error) else 0.0
            lost = _lost_workers(self.client, members, wait=wait)
        if not lost or self.n_restarts >= max_restarts:
            return False
        self.n_restarts += 1
        logger.warning(
            "LatentDirichletAllocation: worker(s) %s lost during iterations %d-%d (%s: %s); "
            "redoing from iteration %d (restart %d of at most %d)",
            sorted(lost), start, stop, type(error).__name__, error, self.good[1] if self.good else 0,
            self.n_restarts, max_restarts,
        )
        self.ps.wait_for_placement()
        self.sets.fresh(1 - self.good[0] if self.good else 0)  # the set the redo writes
        self.parts.rebuild_lost()
        return True

    def _save(self, out, stop) -> bool:
        plan = self.plan
        return save_checkpoint(self.ps, plan.checkpoint, self.sets.names[out], {
            "estimator": CHECKPOINT_KIND, "z_id": self.z_id, "set": out, "iteration": stop,
            "n_parts": plan.n_parts, "history": [list(h) for h in self.history], **plan.fingerprint,
        })
