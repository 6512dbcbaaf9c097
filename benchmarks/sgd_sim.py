"""P participants of an SGD fit in one process, in lock-step (an evaluation tool).

:func:`simulate_fit` fits a dask_ps ``SGDClassifier``/``SGDRegressor``
with ``n_participants`` participants without a cluster: the estimator's own
driver (``_training.train``: the split of the data, the tables, the run
configuration, the seeds) and the participants' own code
(``_participant._sgd_participant``) run unchanged; only the parameter
server is replaced by :class:`SimServer`, which holds the tables in this
process and runs each participant in a thread of its own over a
:class:`SimSession` (the participant's ``ctx``).

The participants advance in lock-step: a clock completes when every
participant still running has called ``clock()``; then, and only then, the
pushes of that clock are applied to the tables, in rank order (the servers'
order for ``aggregate="clock"`` tables, ``_shard._pushes_in_sender_order``).
What a read returns is fixed, whatever the threads' timing:

* a table with staleness ``s`` (BSP: 0): a read at clock ``c`` holds every
  push of the clocks ``< c - s`` and none of the others' later ones, plus
  all of the reader's own pushes (read-my-writes, as ``Session`` adds its
  own unsummed pushes). Under BSP this is what the cluster's reads hold
  (``aggregate="clock"``), so a fit matches the cluster's bit for bit
  (``tests/linear_model/test_sgd_sim.py``); under ``SSP(s)`` it is the
  worst case the bound allows, every read as stale as it may be;
* ASP tables (the per-participant stats rows, the run's start table): as
  ``s = 0``.

Used by ``benchmarks/sgd_quality.py`` for 16 and 64 participants, which a
2-core machine cannot host as workers::

    from sgd_sim import simulate_fit
    est = simulate_fit(SGDClassifier(random_state=0), X, y, n_participants=16, consistency="ssp1")
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid
from unittest import mock

import dask
import numpy as np
from sklearn.base import clone

import dask_ps
from dask_ps.consistency import ASP, as_consistency
from dask_ps.linear_model import _data

FRESHER_BLOCKS = 4  # SimServer(fresher=seed): the blocks a read's freshness is drawn for

CONSISTENCIES = {"bsp": dask_ps.BSP(), "ssp1": dask_ps.SSP(1), "ssp2": dask_ps.SSP(2), "ssp3": dask_ps.SSP(3)}


def consistency_of(name):
    """A consistency model from a name of :data:`CONSISTENCIES` (or a model, or None: the estimator's default)."""
    if name is None or not isinstance(name, str):
        return name
    return CONSISTENCIES[name.lower()]


class _Aborted(RuntimeError):
    """Another participant of the simulated run failed."""


class _Table:
    """One table: ``base`` holds every push of the clocks ``< floor``
    (``floor = clock - staleness``); later pushes wait in ``log`` as
    ``(clock, rank, seq, rows, values)``."""

    def __init__(self, name, values, rule, staleness):
        self.name, self.values, self.rule = name, values, rule
        self.staleness = staleness
        self.log: list = []

    def __repr__(self):
        return f"<_Table {self.name!r} {self.values.shape} rule={self.rule} s={self.staleness} log={len(self.log)}>"

    def apply(self, rows, vals):
        if self.rule == "assign":
            if rows is None:
                self.values[...] = vals
            else:
                self.values[rows] = vals
        elif rows is None:
            self.values += vals
        else:
            np.add.at(self.values, rows, vals)  # duplicate rows summed, as a session's push_rows

    def commit_below(self, floor):
        """Apply the logged pushes of the clocks ``< floor``, by clock, then rank, then order."""
        due = sorted((e for e in self.log if e[0] < floor), key=lambda e: e[:3])
        if due:
            self.log = [e for e in self.log if e[0] >= floor]
            for _, _, _, rows, vals in due:
                self.apply(rows, vals)

    def read(self, rank, rows, held=None):
        """``base`` (its ``rows``, None: all) plus ``rank``'s own logged pushes;
        ``held``: per table row, the clock below which the others' logged
        pushes are in the read too (None: none of them, the worst case)."""
        out = np.array(self.values if rows is None else self.values[rows], copy=True)
        for clock, r, _, prow, pvals in self.log:
            if r != rank:
                if held is not None:
                    _add_held(out, rows, prow, pvals, held > clock)
                continue
            if rows is None:
                if prow is None:
                    out += pvals
                else:
                    np.add.at(out, prow, pvals)
            elif prow is None:
                out += pvals[rows]
            else:
                _add_common(out, rows, prow, pvals)
        return out


def _add_held(out, rows, prow, pvals, held):
    """Add a push of ``prow`` (None: every row) to a read of ``rows`` (None:
    every row) where ``held[table row]``."""
    if prow is None:
        pvals = pvals if rows is None else pvals[rows]
        keep = held if rows is None else held[rows]
        out[keep] += pvals[keep]
        return
    keep = held[prow]
    if not keep.any():
        return
    prow, pvals = prow[keep], pvals[keep]
    if rows is None:
        np.add.at(out, prow, pvals)
    else:
        _add_common(out, rows, prow, pvals)


def _add_common(out, rows, prow, pvals):
    """``out[i] += pvals[j]`` where ``rows[i] == prow[j]``."""
    order = np.argsort(prow, kind="stable")
    sp = prow[order]
    pos = np.clip(np.searchsorted(sp, rows), 0, max(sp.size - 1, 0))
    hit = sp.size > 0
    if not hit:
        return
    match = sp[pos] == rows
    if match.any():
        out[match] += pvals[order[pos[match]]]


class _Lockstep:
    """The run's clock: ``arrive`` blocks until every participant still
    running has arrived, and the last to arrive applies the clock's pushes."""

    def __init__(self, server, n):
        self.server, self.active = server, n
        self.cv = threading.Condition()
        self.arrived = 0
        self.clock = 0  # the clock every running participant is in
        self.error = None

    def _complete(self):
        self.clock += 1
        self.arrived = 0
        self.server.commit(self.clock)
        self.cv.notify_all()

    def arrive(self):
        with self.cv:
            if self.error is not None:
                raise _Aborted("another participant failed") from self.error
            self.arrived += 1
            if self.arrived == self.active:
                self._complete()
                return
            clock = self.clock
            while self.clock == clock and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise _Aborted("another participant failed") from self.error

    def leave(self, error=None):
        with self.cv:
            self.active -= 1
            if error is not None and self.error is None and not isinstance(error, _Aborted):
                self.error = error
                self.cv.notify_all()
            elif self.active and self.arrived == self.active:
                self._complete()


class SimSession:
    """A participant's ``ctx`` on a :class:`SimServer`: ``pull``/``pull_rows``,
    ``push``/``push_rows`` (logged under the participant's clock), ``clock``
    (lock-step), ``flush`` (nothing to send), ``metrics``, ``held_bytes``."""

    local_run = None
    worker = None

    def __init__(self, server, lockstep, run_id, rank, n):
        self.server, self.lockstep = server, lockstep
        self.run_id, self.rank, self.n_participants = run_id, rank, n
        self.current_clock = 0
        self._seq = itertools.count()

    def __repr__(self):
        return f"<SimSession rank={self.rank}/{self.n_participants} clock={self.current_clock}>"

    def pull(self, name, with_clocks=False):
        return self.server.read(name, self.rank, None, self.current_clock, with_clocks)

    def pull_rows(self, name, rows, with_clocks=False):
        return self.server.read(name, self.rank, np.asarray(rows), self.current_clock, with_clocks)

    def push(self, name, values, copy=True):
        self.server.log(name, self.current_clock, self.rank, next(self._seq), None, np.array(values, copy=True))

    def push_rows(self, name, rows, values, copy=True):
        self.server.log(name, self.current_clock, self.rank, next(self._seq), np.array(rows, copy=True),
                        np.array(values, copy=True))

    def flush(self, wait=True):
        return None

    def clock(self, wait=True):
        self.lockstep.arrive()
        self.current_clock += 1

    def metrics(self):
        return {"clock": self.current_clock, "clock_wait_seconds": 0.0, "tables": {}, "simulated": True}

    def held_bytes(self, name):
        return 0  # no cached rows or unsummed pushes: the reads come from the simulated tables


class SimServer:
    """The ``ParameterServer`` of a simulated fit: what ``_training.train``
    calls of it (``create_table``, ``drop_table``, ``pull``, ``push``,
    ``run``, ...), with the tables in this process and ``run`` driving one
    thread per participant in lock-step (module docstring)."""

    client = None

    def __init__(self, n_participants, fresher=None):
        self.n_participants = int(n_participants)
        # None: every read under a bound as stale as it may be; a seed: each
        # read's rows, in FRESHER_BLOCKS blocks, hold the others' pushes of
        # the clocks below a tag drawn in [c - s, c] (as servers answer).
        self.fresher = fresher
        self.servers = [f"sim-{i}" for i in range(self.n_participants)]
        self.tables: dict[str, _Table] = {}
        self.lock = threading.Lock()
        self.runs = 0
        self._reads: dict = {}  # rank -> its reads' count (a rank reads in its own thread: reproducible draws)

    def __repr__(self):
        return f"<SimServer P={self.n_participants} tables={sorted(self.tables)}>"

    # --- what the driver calls ----------------------------------------------------------
    def wait_for_servers(self, n: int = 1, timeout=None):
        return list(self.servers)

    def wait_for_placement(self):
        return None

    def create_table(self, name, shape, dtype="float64", *, init=None, rule="sum", consistency=None,
                     aggregate="push", **_):
        values = np.zeros(shape, dtype=dtype) if init is None else np.array(init, dtype=dtype, copy=True)
        c = as_consistency(consistency)
        s = c.staleness
        staleness = 0 if s is None or isinstance(c, ASP) else int(s)
        self.tables[name] = _Table(name, values, rule, staleness)
        return name

    def drop_table(self, name):
        self.tables.pop(name, None)

    def pull(self, name):
        return self.tables[name].values.copy()

    def pull_rows(self, name, rows):
        return self.tables[name].values[np.asarray(rows)].copy()

    def push(self, name, values):
        self.tables[name].apply(None, np.asarray(values))

    def memory(self):
        return {}

    def run(self, fn, parts, *, run_info=None, **kwargs):
        parts = list(parts)
        P = len(parts)
        run_id = f"sim-{uuid.uuid4().hex[:8]}-{self.runs}"
        self.runs += 1
        lockstep = _Lockstep(self, P)
        results: list = [None] * P
        errors: list = [None] * P

        def one(rank):
            ctx = SimSession(self, lockstep, run_id, rank, P)
            err = None
            try:
                results[rank] = fn(ctx, parts[rank], **kwargs)
            except BaseException as e:  # noqa: BLE001 - re-raised by run
                err = errors[rank] = e
            finally:
                lockstep.leave(err)

        threads = [threading.Thread(target=one, args=(r,), name=f"sim-participant-{r}", daemon=True)
                   for r in range(P)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.commit(float("inf"))  # what the last clocks left (a lone participant's push, the stats rows)
        first = next((e for e in errors if e is not None and not isinstance(e, _Aborted)), None)
        first = first or next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return results

    # --- what the sessions call ---------------------------------------------------------
    def log(self, name, clock, rank, seq, rows, vals):
        t = self.tables[name]
        if t.rule == "assign":  # progress rows, a run's start: no sum to order
            with self.lock:
                t.apply(rows, vals)
            return
        with self.lock:
            t.log.append((clock, rank, seq, rows, vals))

    def read(self, name, rank, rows, clock=0, with_clocks=False):
        """``rank``'s read at ``clock``; ``with_clocks``: ``(values, clocks)``,
        per row the clock below which every participant's pushes are in it."""
        t = self.tables[name]
        floor = max(0, clock - t.staleness)
        held = None
        if self.fresher is not None and t.staleness > 0:
            n = t.values.shape[0]
            nth = next(self._reads.setdefault(rank, itertools.count()))
            rng = np.random.default_rng([int(self.fresher), rank, clock, nth])
            tags = rng.integers(floor, clock + 1, size=FRESHER_BLOCKS)
            held = tags[np.arange(n) * FRESHER_BLOCKS // n]
        with self.lock:
            out = t.read(rank, rows, held)
        if not with_clocks:
            return out
        if held is None:
            return out, np.full(out.shape[0], floor, dtype=np.int64)
        return out, (held if rows is None else held[rows]).astype(np.int64)

    def commit(self, clock):
        """Every running participant is at ``clock``: apply what each table's staleness lets through."""
        with self.lock:
            for t in self.tables.values():
                t.commit_below(clock - t.staleness)


class _Parts:
    """``TrainingParts`` of a simulated fit: the pieces, held here."""

    def __init__(self, pieces):
        self.futures = list(pieces)

    def __len__(self):
        return len(self.futures)

    def release(self):
        self.futures = []

    def keep(self, idx):
        self.futures = [self.futures[i] for i in idx]


class _FakeTrainingParts:
    @staticmethod
    def from_pieces(client, split, **_):
        return _Parts(split())


@contextlib.contextmanager
def simulated(est, n_samples, n_participants, fresher=None):
    """While the block runs, ``est`` fits on a :class:`SimServer` of
    ``n_participants`` (the data cut into that many parts by the
    estimator's own ``_memory_parts``); yields the server."""
    server = SimServer(n_participants, fresher)
    per = max(1, n_samples // max(1, n_participants))
    settings = {"ps.sgd.min-samples-per-participant": per, "ps.sgd.fit-in-process": False}
    with dask.config.set(settings), mock.patch.object(_data, "TrainingParts", _FakeTrainingParts), \
            mock.patch.object(est, "_parameter_server", lambda: server, create=True):
        yield server


def simulate_fit(estimator, X, y, n_participants, consistency=None, sample_weight=None, fresher=None, **fit_params):
    """A clone of ``estimator`` fitted on ``X, y`` by ``n_participants``
    simulated participants (module docstring); ``consistency``: a name of
    :data:`CONSISTENCIES`, a model, or None (the estimator's own setting);
    ``fresher``: None (reads as stale as the bound allows) or a seed of the
    reads' drawn freshness (:class:`SimServer`).

    Returns the fitted clone (``coef_``, ``intercept_``, ``n_iter_``, ...);
    X must be an in-memory array or sparse matrix (the estimator's
    ``_memory_parts`` splits it)."""
    est = clone(estimator)
    if consistency is not None:
        est.set_params(consistency=consistency_of(consistency))
    if n_participants < 1:
        raise ValueError(f"n_participants must be at least 1, got {n_participants!r}")
    n = X.shape[0]
    with simulated(est, n, n_participants, fresher):
        est.fit(X, y, sample_weight=sample_weight, **fit_params)
    return est
