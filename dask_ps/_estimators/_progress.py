"""Progress lines, the progress bar and ``metrics_`` of the
parameter-server estimators.

One verbose style: with ``verbose > 0`` an estimator's progress lines go to
standard output, as scikit-learn's estimators print theirs (the same
lines, as many), and the same lines to the estimator's logger at INFO (for
applications that collect logs); what scikit-learn does not print goes to
the logger only (:meth:`Progress.log`) or, for a notice such as the
embedded cluster's dashboard, to standard error (:meth:`Progress.note`). They are printed while the fit runs: the participants write their
progress into a small table and a client-side thread (a
:class:`PollingMonitor`) prints what is complete.

The progress bar: with ``dask.config`` ``ps.progress-bar: true`` and tqdm
installed (the ``progress`` extra), a fit that knows its length (``total``)
also shows a ``tqdm.auto`` bar, in a terminal or a notebook, whatever
``verbose`` is; verbose lines are then written above it. A config switch
rather than a ``verbose`` value: ``verbose`` keeps scikit-learn's meaning
(an int), so ``clone``/``GridSearchCV`` and the estimator checks see the
same parameter, and one setting turns the bar on for every fit of a
program or notebook.

``metrics_`` is a list with one dict per participant of the fit's last
run: the session's counters (``ctx.metrics()``) and the estimator's own
timings and counts.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import sys
import threading

import dask

logger = logging.getLogger(__name__)


def _tqdm():
    """``tqdm.auto.tqdm`` when the bar is on (``ps.progress-bar``) and tqdm
    imports; else None."""
    if not dask.config.get("ps.progress-bar", False):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        logger.info("ps.progress-bar is set but tqdm is not installed (pip install 'dask-ps[progress]')")
        return None
    return tqdm


class Progress:
    """Where an estimator's verbose output goes (see the module docstring).

    Parameters
    ----------
    verbose : int
        Lines are printed when > 0.
    logger : logging.Logger
        Lines are also logged there at INFO.
    total : int, optional
        The fit's length in ``unit`` (epochs, iterations): with it, and
        ``ps.progress-bar`` set, a tqdm bar that :meth:`advance` moves.
    unit, desc : str
        The bar's unit and label.
    """

    def __init__(self, verbose, logger: logging.Logger, *, total=None, unit="it", desc=None):
        self.verbose = int(verbose or 0)
        self.logger = logger
        self._bar = None
        tqdm = _tqdm() if total is not None else None
        if tqdm is not None:
            self._bar = tqdm(total=int(total), unit=unit, desc=desc, leave=True, dynamic_ncols=True)
        if self.verbose > 0:  # a long compile of a kernel during the fit says so (a note)
            from dask_ps._compiled import CompileNotice

            CompileNotice.add_sink(self)

    def __repr__(self):
        return f"<Progress verbose={self.verbose} logger={self.logger.name!r} bar={self._bar is not None}>"

    def __bool__(self):
        return self.verbose > 0

    @property
    def active(self) -> bool:
        """Whether anything is shown: lines (``verbose``) or a bar."""
        return self.verbose > 0 or self._bar is not None

    def line(self, text: str) -> None:
        """One progress line (nothing unless ``verbose``)."""
        if self.verbose > 0:
            if self._bar is not None:
                self._bar.write(text)
            else:
                print(text, flush=True)
            self.logger.info(text)

    def note(self, text: str) -> None:
        """A notice that is no progress line (nothing unless ``verbose``):
        to standard error and the logger, so that standard output holds
        the estimator's lines alone, as scikit-learn's (its tests count
        them)."""
        if self.verbose > 0:
            print(text, file=sys.stderr, flush=True)
            self.logger.info(text)

    def log(self, text: str) -> None:
        """A line for the logger only (nothing unless ``verbose``): what an
        estimator reports beyond the lines of scikit-learn's format, whose
        count on standard output scikit-learn's tests check."""
        if self.verbose > 0:
            self.logger.info(text)

    def advance(self, n: int = 1, **postfix) -> None:
        """Move the bar ``n`` steps, showing ``postfix`` (no bar: nothing)."""
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        """Close the bar (lines need no closing) and stop the compile notices."""
        from dask_ps._compiled import CompileNotice

        CompileNotice.remove_sink(self)
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class PollingMonitor(threading.Thread):
    """A client-side thread that calls :meth:`poll` every ``period`` seconds
    while a fit runs, and once more when stopped: participants write their
    progress into a table, ``poll`` reads it and reports what is complete.

    Best effort: an error in ``poll`` (the cluster went away) ends the
    thread with a debug log, never the fit."""

    def __init__(self, period: float, name: str = "ps-progress"):
        super().__init__(daemon=True, name=name)
        self.period = float(period)
        self._stop_event = threading.Event()
        self._poll_lock = threading.Lock()

    def poll(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _poll_once(self):
        with self._poll_lock:
            self.poll()

    def stop(self, timeout: float = 30) -> None:
        """Stop polling; the last poll has run when this returns (or the
        thread did not end within ``timeout`` seconds)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=timeout)

    def run(self):
        try:
            while not self._stop_event.wait(self.period):
                self._poll_once()
            self._poll_once()
        except Exception:  # the cluster went away: progress is best effort
            logger.debug("%s stopped", self.name, exc_info=True)


def rate(amount: float, seconds: float) -> float:
    """``amount / seconds``, NaN when no time passed."""
    return amount / seconds if seconds > 0 else float("nan")


def participant_metrics(results, fields=(), session_key: str = "metrics") -> list[dict]:
    """``metrics_`` from a run's results (one dict per participant).

    Each entry is the participant's session counters (``result[session_key]``,
    as returned by ``ctx.metrics()``; missing or None: none) updated with
    ``result[k]`` for each of ``fields`` that the result has.
    """
    out = []
    for r in results:
        entry = dict(r.get(session_key) or {})
        entry.update({k: r[k] for k in fields if k in r})
        out.append(entry)
    return out


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    except Exception:  # noqa: BLE001 - arrays and other values without a plain ==
        return False


@functools.lru_cache(maxsize=64)
def _defaults(cls) -> dict:
    """The defaults of ``cls.__init__`` (once per class: a fit trained in
    the calling process computes its ``run_info`` each time)."""
    return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def run_info(est, planned_clocks: int, **units) -> dict:
    """``run_info`` of the estimator's runs (``ParameterServer.run``), for
    the dashboard's ``/ps`` page: its class name, the parameters set to
    something else than their defaults (as scikit-learn's ``repr`` shows
    them; not ``client``), the clocks each participant will complete and
    ``units``: how the page counts progress in the estimator's units and
    names its loss (``unit``, ``clocks_per_unit``, ``first_unit``,
    ``total_units``, ``lead_clocks``, ``loss_name``: ``_dashboard.check_run_info``)."""
    defaults = _defaults(type(est))
    params = {k: v for k, v in est.get_params(deep=False).items()
              if k != "client" and (k not in defaults or not _same(v, defaults[k]))}
    return {"name": type(est).__name__, "params": params, "planned_clocks": max(0, int(planned_clocks)), **units}


def dashboard_run(est, planned_clocks: int, function: str, **units):
    """A :class:`dask_ps._dashboard.LocalRun` showing a fit of ``est``
    trained in the calling process on the ``/ps`` page of the cluster this
    process already has a client of (:func:`dask_ps._client.existing_client`),
    or None where there is none: no cluster is started for the page."""
    from dask_ps._client import existing_client

    client = existing_client(est.client)
    if client is None:
        return None
    from dask_ps._dashboard import LocalRun

    return LocalRun(client, run_info(est, planned_clocks, **units), function)
