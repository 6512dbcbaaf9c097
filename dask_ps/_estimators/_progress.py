"""Progress lines and ``metrics_`` of the parameter-server estimators.

One verbose style: with ``verbose > 0`` an estimator's progress lines go to
standard output, as scikit-learn's estimators print theirs, and the same
lines to the estimator's logger at INFO (for applications that collect
logs). ``metrics_`` is a list with one dict per participant of the fit's
last run: the session's counters (``ctx.metrics()``) and the estimator's
own timings and counts.
"""

from __future__ import annotations

import logging


class Progress:
    """Where an estimator's verbose output goes (see the module docstring)."""

    def __init__(self, verbose, logger: logging.Logger):
        self.verbose = int(verbose or 0)
        self.logger = logger

    def __repr__(self):
        return f"<Progress verbose={self.verbose} logger={self.logger.name!r}>"

    def __bool__(self):
        return self.verbose > 0

    def line(self, text: str) -> None:
        """One progress line (nothing unless ``verbose``)."""
        if self.verbose > 0:
            print(text, flush=True)
            self.logger.info(text)


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
