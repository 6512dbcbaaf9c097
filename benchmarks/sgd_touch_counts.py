"""A per-row rate factor from touch counts, tried in the simulation (issue
33; tried and not kept: docs/benchmarks-history.md, "SGD quality over issue 33's
space").

The quick sweep (``sgd_quality.py``) with the simulated server's sum of a
clock's sparse pushes to the weights table changed per row: each push
``(W - W0) / P`` is scaled by ``P w``,

* ``RULE=minf``: ``w = max(1/P, min(1/c_r, 1/f_p))``;
* ``RULE=count``: ``w = 1/c_r`` (rows averaged over the participants that
  touched them);
* ``RULE=none``: ``w = 1/P``, the estimator's rule (the mean);

``c_r`` the participants that pushed row ``r`` in the clock, ``f_p`` the
pusher's mean rate factor of the round (``_kernels.sample_scale`` weighted
by the rates: ``_rounds``' ``mean_scale``, computed here under BSP too).
A row one participant touched keeps ``1/f_p`` of its local step: a
sequential pass's step, where the mean gives ``f_p / P`` of it::

    RULE=minf python benchmarks/sgd_touch_counts.py --quick --axes loss penalty average data \\
        --participants 2 4 16 64 --consistencies bsp --no-ttq
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import threading

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sgd_quality  # noqa: E402
import sgd_sim  # noqa: E402

RULE = os.environ.get("RULE", "minf")
_local = threading.local()  # the simulated participants are threads
_FBAR: dict = {}


def _weights_table(name) -> bool:
    return name.startswith("dask_ps-sgd-") and name.count("-") == 2


def install():
    """Patch the participant's push and the simulated server's clock."""
    from dask_ps.linear_model import _participant, _rounds

    compiled_round = _rounds._compiled_round

    def rates_always(cfg, *args, **kwargs):  # mean_scale is kept under a staleness bound only
        return compiled_round(dataclasses.replace(cfg, staleness=cfg.staleness or 1), *args, **kwargs)

    _rounds._compiled_round = rates_always
    sync_round = _participant._Participant.sync_round

    def sync_with_factor(self, rows, W0, W):
        _local.fbar = float(getattr(self.rounds, "mean_scale", 1.0))
        return sync_round(self, rows, W0, W)

    _participant._Participant.sync_round = sync_with_factor
    push_rows = sgd_sim.SimSession.push_rows

    def push_with_factor(self, name, rows, values, copy=True):
        if _weights_table(name):
            _FBAR[(name, self.current_clock, self.rank)] = (getattr(_local, "fbar", 1.0), self.n_participants)
        return push_rows(self, name, rows, values, copy)

    sgd_sim.SimSession.push_rows = push_with_factor
    commit_below = sgd_sim._Table.commit_below

    def commit_per_row(self, floor):
        if _weights_table(self.name):
            by_clock: dict = {}
            for e in self.log:
                if e[0] < floor and e[3] is not None:
                    by_clock.setdefault(e[0], []).append(e)
            for clock, entries in by_clock.items():
                keys = [(self.name, clock, e[1]) for e in entries]
                if not all(k in _FBAR for k in keys):
                    continue
                P = _FBAR[keys[0]][1]
                touched = np.bincount(np.concatenate([np.unique(e[3]) for e in entries]))
                for e, k in zip(entries, keys):
                    fbar = max(_FBAR.pop(k)[0], 1.0)
                    c = touched[e[3]].astype(np.float64)
                    w = 1.0 / c if RULE == "count" else np.maximum(1.0 / P, np.minimum(1.0 / c, 1.0 / fbar))
                    e[4][...] = e[4] * (P * w)[:, None]
        return commit_below(self, floor)

    if RULE != "none":
        sgd_sim._Table.commit_below = commit_per_row


if __name__ == "__main__":
    install()
    sys.argv = ["sgd_quality.py"] + sys.argv[1:]
    sgd_quality.main()
