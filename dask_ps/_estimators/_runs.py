"""Chunked runs, checkpoints and resume, temporary tables, lost workers.

One rule for every estimator:

- **Compatibility.** A checkpoint's metadata records the estimator kind
  (``"estimator"``), a *fingerprint* (the values that define the problem:
  data shape, priors, loss...; stored at the top level, with their names
  under ``"fingerprint"``) and the estimator's own state. A fit resumes
  only a checkpoint of its own kind with an equal fingerprint; anything
  else raises :class:`CheckpointMismatchError` naming the differences.
- **Saving.** :func:`save_checkpoint` retries ``ps.save`` while it refuses
  for a transient reason (``RuntimeError``: a run using the tables is in
  progress, or the placement changed during the save) for up to
  ``SAVE_RETRY_SECONDS``; then, and at once for any other error, it warns
  (``RuntimeWarning``) and returns False: training goes on, and the last
  checkpoint saved stays the one to resume from.
- **Tables.** :func:`temporary_tables` drops the tables a fit created when
  the fit ends, also on error.
- **Lost workers.** :func:`may_be_worker_loss` and :func:`lost_workers`
  tell a failed run that lost a worker (to be redone, at most
  ``MAX_RESTARTS`` times per fit) from one that failed on its own.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings

import numpy as np

from dask_ps import ParticipantContext
from dask_ps import PSError, RolledBackError, SchedulerLostError, UnknownTableError, checkpoint_metadata  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

# Seconds ``save_checkpoint`` retries a save refused for a transient reason.
SAVE_RETRY_SECONDS = 30.0
# Runs redone after lost workers, per fit (Dask's allowed-failures is 3 too).
MAX_RESTARTS = 3


class CheckpointMismatchError(ValueError):
    """A checkpoint at the path given belongs to another estimator or to
    another fit (a ``ValueError``: the parameters do not match the path)."""


# --- checkpoint metadata ------------------------------------------------------------------


def jsonable(obj):
    """``obj`` as plain JSON values (checkpoint metadata), so that a value
    compares equal to itself after a save and a load."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return repr(obj)


def checkpoint_record(kind: str, fingerprint: dict, **state) -> dict:
    """The metadata to save with a checkpoint: ``kind``, the fingerprint's
    values (top level) and names (``"fingerprint"``), and ``state``."""
    fingerprint = jsonable(fingerprint)
    clash = set(fingerprint) & (set(state) | {"estimator", "fingerprint"})
    if clash:
        raise ValueError(f"checkpoint_record: state keys {sorted(clash)} clash with the fingerprint")
    return {"estimator": kind, **fingerprint, "fingerprint": sorted(fingerprint), **state}


def check_checkpoint(meta: dict, kind: str, fingerprint: dict, path, owner: str) -> None:
    """Raise :class:`CheckpointMismatchError` unless ``meta`` (a checkpoint's
    metadata, ``{}`` for one saved without any) is a checkpoint of ``kind``
    with this ``fingerprint``. ``owner`` names the estimator in the message."""
    where = f"the checkpoint at {str(path)!r}"
    if meta.get("estimator") != kind:
        raise CheckpointMismatchError(
            f"{where} holds {meta.get('estimator') or 'tables of something else'}, not a {owner} fit "
            f"(it was not written by {owner}.fit); use another checkpoint path"
        )
    mine = jsonable(fingerprint)
    names = sorted(set(mine) | set(meta.get("fingerprint") or ()))
    diffs = [f"{k}: saved {meta.get(k)!r}, now {mine.get(k)!r}" for k in names if meta.get(k) != mine.get(k)]
    if diffs:
        raise CheckpointMismatchError(
            f"{where} belongs to another fit ({'; '.join(diffs)}): use another checkpoint path, or "
            "delete that checkpoint to start over"
        )


def find_checkpoint(path, kind: str, fingerprint: dict, owner: str) -> dict | None:
    """The metadata of a compatible checkpoint at ``path``, or None when
    there is no checkpoint there (see :func:`check_checkpoint`)."""
    meta = checkpoint_metadata(path)
    if meta is None:
        return None
    check_checkpoint(meta, kind, fingerprint, path, owner)
    return meta


def save_checkpoint(ps, path, tables, metadata: dict, *, owner: str, after: str,
                    retry_seconds: float = SAVE_RETRY_SECONDS, poll_seconds: float = 0.5) -> bool:
    """``ps.save(path, tables, metadata)`` between two runs; True if saved.

    A ``RuntimeError`` (``ps.save`` refuses while a run using the tables is
    in progress, e.g. another fit's, or when the placement changed during
    the save) is retried for ``retry_seconds``; after that, and at once for
    any other error, a ``RuntimeWarning`` says that the checkpoint
    ``after`` (e.g. "epoch 4") was not saved, and False is returned.
    """
    deadline = time.monotonic() + retry_seconds
    while True:
        try:
            ps.save(path, tables=tables, metadata=metadata)
            return True
        except Exception as e:
            if isinstance(e, RuntimeError) and time.monotonic() < deadline:
                time.sleep(poll_seconds)
                continue
            warnings.warn(f"{owner}: checkpoint after {after} not saved: {type(e).__name__}: {e}",
                          RuntimeWarning, stacklevel=3)
            return False


def chunk_end(start: int, total: int, every: int | None) -> int:
    """The end of the run that starts at ``start`` (epochs, iterations):
    ``every`` later, at most ``total``; all at once when ``every`` is None."""
    if every is None:
        return int(total)
    return min(int(total), int(start) + int(every)) if start < total else int(start)


def run_in_chunks(position, *, done, run, recover, finish, max_restarts: int = MAX_RESTARTS):
    """The runs of one fit, and what happens when one fails: the loop every
    estimator shares (the estimator supplies its steps).

    From ``position`` (where the fit stands: an epoch or iteration, with
    whatever state the estimator carries), while not ``done(position)``:
    ``run(position)`` trains the next chunk and returns its outcome;
    ``finish(position, outcome)`` records it (a checkpoint save, the
    history) and returns the new position. When ``run`` raises,
    ``recover(error, position)`` returns the position to train again from
    (a lost worker whose blocks or parts were restored, tables rolled back
    to a checkpoint), or None when the error is the fit's own: then it, or
    the error after ``max_restarts`` recoveries, is raised. Returns the
    final position."""
    restarts = 0
    while not done(position):
        try:
            outcome = run(position)
        except Exception as error:
            back = recover(error, position) if restarts < max_restarts else None
            if back is None:
                raise
            restarts += 1
            position = back
            continue
        position = finish(position, outcome)
    return position


def table_consistency(consistency):
    """The model a table created with ``consistency`` gets (None: the
    configured default, ``ps.consistency``): an estimator decides how its
    tables sum pushes (``aggregate``) from its staleness before creating
    them."""
    from dask_ps.consistency import as_consistency

    return as_consistency(consistency)


# --- temporary tables ---------------------------------------------------------------------


class TemporaryTables:
    """The tables a fit created (or loaded), dropped by :func:`temporary_tables`."""

    def __init__(self, ps):
        self.ps = ps
        self.names: list[str] = []

    def __repr__(self):
        return f"<TemporaryTables {self.names}>"

    def create(self, name: str, **kwargs) -> str:
        """``ps.create_table(name, **kwargs)``, to be dropped at the end."""
        self.ps.create_table(name, **kwargs)
        self.add(name)
        return name

    def add(self, *names: str) -> None:
        """Drop these tables too at the end (created otherwise, e.g. loaded)."""
        self.names.extend(n for n in names if n not in self.names)

    def drop_all(self) -> None:
        """Drop every table recorded (best effort: the cluster may be going away)."""
        names, self.names = self.names, []
        for name in names:
            try:
                self.ps.drop_table(name)
            except UnknownTableError:
                pass  # recorded before it was created, and never was
            except SchedulerLostError:
                # The tables went with the scheduler, and the fit raises this
                # same error: a traceback per table was noise (Ctrl-C on a CLI
                # cluster during a fit printed two).
                logger.debug("table %r went with the scheduler", name)
            except Exception:  # pragma: no cover - cluster going away
                logger.warning("could not drop table %r", name, exc_info=True)


@contextlib.contextmanager
def temporary_tables(ps):
    """``with temporary_tables(ps) as tables: tables.create(...)``: the
    tables are dropped when the block ends, also on error."""
    tables = TemporaryTables(ps)
    try:
        yield tables
    finally:
        tables.drop_all()


# --- lost workers -------------------------------------------------------------------------


def cluster_members(client) -> set:
    """The addresses of the cluster's workers now (none known to a closed
    client: its ``scheduler_info`` is empty)."""
    return set(client.scheduler_info(n_workers=-1).get("workers", ()))


def may_be_worker_loss(error, also=()) -> bool:
    """Whether a failed run's error can come from a lost worker (then the
    scheduler gets a moment to notice the death); bad input cannot.
    ``also``: the estimator's own error types that a lost worker causes."""
    from distributed import KilledWorker

    from concurrent.futures import CancelledError

    # CancelledError (Dask's FutureCancelledError): a task whose input died
    # with its worker ("lost dependencies")
    return (isinstance(error, (PSError, KilledWorker, OSError, CancelledError, *also))
            and not isinstance(error, ValueError))


def lost_workers(client, members, wait: float = 5.0, poll_seconds: float = 0.2) -> set:
    """Workers of ``members`` that left the cluster (waiting up to ``wait``
    seconds for the scheduler to notice a death that caused an error)."""
    deadline = time.monotonic() + wait
    while True:
        if getattr(client, "status", "running") != "running":  # the client closed or lost its scheduler
            return set()
        lost = set(members) - cluster_members(client)
        if lost or time.monotonic() > deadline:
            return lost
        time.sleep(poll_seconds)


# --- participants ---------------------------------------------------------------------------


def wait_for_participants(ctx: ParticipantContext, table, owner: str, what: str) -> None:
    """Wait, in a participant, until every participant of the run has
    reached this point with its pushes so far on the servers: each counts
    itself in ``table`` (a one-element ``VAP`` table, whose reads always go
    to the servers) once its pushes are acknowledged, and polls it until all
    have. One wait per run, not a bound on every clock as a BSP table would
    be. Raises ``TimeoutError`` after ``ps.timeouts.clock``, naming
    ``owner`` and ``what`` it waited for."""
    import dask.config
    from dask.utils import parse_timedelta

    ctx.push(table, np.ones(1))
    ctx.flush()
    deadline = time.monotonic() + parse_timedelta(dask.config.get("ps.timeouts.clock"))
    pause = 0.0005
    while ctx.pull(table)[0] < ctx.n_participants:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{owner}: participant {ctx.rank} waited longer than ps.timeouts.clock for the other "
                f"participants' {what} (table {table!r})"
            )
        time.sleep(pause)
        pause = min(2 * pause, 0.02)


def participant_worker(ctx: ParticipantContext) -> str | None:
    """Where a participant runs: the address of the worker running its task
    (a participant of a parameter-server run), None for one trained in the
    calling process (no run: ``ctx.run_id`` is None)."""
    if getattr(ctx, "run_id", None) is None:
        return None
    from distributed import get_worker

    try:
        return get_worker().address
    except ValueError:  # not in a worker's task (a simulated run)
        return None
