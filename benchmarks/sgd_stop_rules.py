"""Stopping rules for several participants, replayed in the simulation
(issue 33; tried and not kept: docs/benchmarks-history.md, "Issue 33: rows
sorted by label as a dask input, and the stopping rule's epochs").

Each quick-sweep setting under a stopping rule is fitted once per
participant count and seed by simulated BSP participants (``sgd_sim``) with
the rule kept from stopping (``n_iter_no_change`` = 10^4, ``tol`` as set, so
the objective keeps its penalty term); the per-epoch objective (or
validation score) the participants decide on is recorded
(``metrics_[0]["history"]``). Under BSP the trajectory does not depend on
the rule until it stops, so each rule below is replayed on that sequence
and gives the epoch it would stop at (scikit-learn's rule replayed gives
the estimator's ``n_iter_``):

* ``sklearn``: scikit-learn's rule (``_kernels.stop_decision``);
* ``mean2`` / ``mean3``: scikit-learn's rule on the mean of the last 2 / 3
  epochs' values;
* ``ewma``: on an exponential average (weight 1/2);
* ``trend``: stop when the least-squares fall per epoch over the last
  ``n_iter_no_change + 1`` epochs is under ``tol``;
* ``noise``: scikit-learn's rule with ``tol`` raised by the residual spread
  of the last ``2 n_iter_no_change + 1`` epochs around their line.

With ``--votes`` (settings on the objective only): each participant's own
objective per epoch (its pushes to the stats table, before they are
summed), scikit-learn's rule on each, and the fit stopping when a majority
of the participants' rules have stopped.

With ``--end-model`` (settings on the objective, hinge and
epsilon_insensitive only): scikit-learn's rule on the objective of the
averaged model at each epoch's end (after its last clock) over every
training row (the mean loss plus the L2 penalty), a pass over the data an
epoch.

Off = more than ``STOP_SLACK`` epochs outside scikit-learn's range over
``--ref-seeds`` seeds (``sgd_quality.judge``)::

    python benchmarks/sgd_stop_rules.py --participants 1 2 4 16 64 --seeds 2
    python benchmarks/sgd_stop_rules.py --participants 2 4 16 64 --seeds 2 --votes
    python benchmarks/sgd_stop_rules.py --participants 2 4 16 64 --seeds 2 --end-model
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import warnings
from collections import defaultdict
from unittest import mock

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sgd_data  # noqa: E402
import sgd_quality  # noqa: E402
import sgd_sim  # noqa: E402


def sklearn_rule(values, higher_is_better, tol=1e-3, n=5):
    """The epoch (1-based) at which scikit-learn's rule stops ``values``."""
    best, count = (-np.inf if higher_is_better else np.inf), 0
    for i, v in enumerate(values):
        worse = v < best + tol if higher_is_better else v > best - tol
        best = max(best, v) if higher_is_better else min(best, v)
        count = count + 1 if worse else 0
        if count >= n:
            return i + 1
    return len(values)


def _mean_of_last(m):
    def rule(values, hib):
        v = np.asarray(values, float)
        return sklearn_rule([v[max(0, i - m + 1):i + 1].mean() for i in range(len(v))], hib)
    return rule


def _ewma(values, hib, a=0.5):
    out, acc = [], None
    for x in values:
        acc = x if acc is None else a * acc + (1 - a) * x
        out.append(acc)
    return sklearn_rule(out, hib)


def _trend(values, hib, tol=1e-3, n=5):
    v = np.asarray(values, float) * (-1.0 if hib else 1.0)
    x = np.arange(n + 1)
    for i in range(n, len(v)):
        if -np.polyfit(x, v[i - n:i + 1], 1)[0] < tol:
            return i + 1
    return len(v)


def _noise(values, hib, tol=1e-3, n=5, c=1.0):
    v = np.asarray(values, float)
    best, count = (-np.inf if hib else np.inf), 0
    for i, x in enumerate(v):
        y = v[max(0, i - 2 * n):i + 1]
        sig = 0.0
        if len(y) > 3:
            t = np.arange(len(y))
            sig = float((y - np.polyval(np.polyfit(t, y, 1), t)).std())
        worse = x < best + tol + c * sig if hib else x > best - tol - c * sig
        best = max(best, x) if hib else min(best, x)
        count = count + 1 if worse else 0
        if count >= n:
            return i + 1
    return len(v)


RULES = {"sklearn": sklearn_rule, "mean2": _mean_of_last(2), "mean3": _mean_of_last(3), "ewma": _ewma,
         "trend": _trend, "noise": _noise}


def record(setting, n_rows, P, seed, cap):
    """The per-epoch values a BSP fit of ``P`` simulated participants decides on."""
    import dask_ps.linear_model as lm

    X, y, _, _ = sgd_data.make(setting.shape, setting.classifier, n_rows)
    cls = lm.SGDClassifier if setting.classifier else lm.SGDRegressor
    est = cls(random_state=seed, **dict(setting.kwargs(), n_iter_no_change=10_000, max_iter=cap))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = sgd_sim.simulate_fit(est, X, y, n_participants=P)
    key = "score" if setting.kwargs().get("early_stopping") else "objective"
    return [r[key] for r in est.metrics_[0]["history"]]


def record_own(setting, n_rows, P, seed, cap):
    """Each participant's own objective per epoch in a BSP fit of ``P``
    simulated participants: its pushes to the stats table's rows (objective
    sum and samples, summed per row; a participant's rows are its epochs)."""
    import dask_ps.linear_model as lm

    sums = defaultdict(dict)
    push_rows = sgd_sim.SimSession.push_rows

    def recording(self, name, rows, values, copy=True):
        if name.endswith("-stats"):
            k = int(np.asarray(rows)[0])
            sums[self.rank][k] = sums[self.rank].get(k, 0.0) + np.asarray(values, float)[0, :2]
        return push_rows(self, name, rows, values, copy)

    X, y, _, _ = sgd_data.make(setting.shape, setting.classifier, n_rows)
    cls = lm.SGDClassifier if setting.classifier else lm.SGDRegressor
    est = cls(random_state=seed, **dict(setting.kwargs(), n_iter_no_change=10_000, max_iter=cap))
    with warnings.catch_warnings(), mock.patch.object(sgd_sim.SimSession, "push_rows", recording):
        warnings.simplefilter("ignore")
        sgd_sim.simulate_fit(est, X, y, n_participants=P)
    return [[sums[p][k][0] / sums[p][k][1] for k in sorted(sums[p])] for p in range(P)]


def record_end_model(setting, n_rows, P, seed, cap):
    """The objective of the averaged model at each epoch's end, over every
    training row, in a BSP fit of ``P`` simulated participants (rank 0
    reads the table after the epoch's last clock)."""
    import dask_ps.linear_model as lm
    from dask_ps.linear_model import _participant

    X, y, _, _ = sgd_data.make(setting.shape, setting.classifier, n_rows)
    kw = setting.kwargs()
    loss = kw.get("loss", "hinge" if setting.classifier else "squared_error")
    if loss not in ("hinge", "epsilon_insensitive"):
        raise ValueError(f"--end-model: hinge or epsilon_insensitive, got {loss!r}")
    target = np.where(y == np.unique(y)[1], 1.0, -1.0) if setting.classifier else np.asarray(y, float)
    alpha = float(kw.get("alpha", 1e-4))
    values, decide = [], _participant._Participant.decide

    def recording(self, epoch, seconds, row=None):
        out = decide(self, epoch, seconds, row)
        if self.ctx.rank == 0:
            W = np.asarray(self.ctx.pull(self.cfg.table))  # feature rows, the intercept's last
            f = np.asarray(X @ W[:-1, 0]).ravel() + W[-1, 0]
            lo = np.maximum(0, 1 - target * f) if loss == "hinge" else np.maximum(0, np.abs(target - f) - 0.1)
            values.append(float(lo.mean() + 0.5 * alpha * W[:-1, 0] @ W[:-1, 0]))
        return out

    cls = lm.SGDClassifier if setting.classifier else lm.SGDRegressor
    est = cls(random_state=seed, **dict(kw, n_iter_no_change=10_000, max_iter=cap))
    with warnings.catch_warnings(), mock.patch.object(_participant._Participant, "decide", recording):
        warnings.simplefilter("ignore")
        sgd_sim.simulate_fit(est, X, y, n_participants=P)
    return values


def votes_main(args):
    """``--votes``: the majority of the participants' own rules;
    ``--end-model``: scikit-learn's rule on the averaged model's objective."""
    sets = [s for s in sgd_quality.quick_settings() if s.stops and not s.kwargs().get("early_stopping")]
    off = {P: 0 for P in args.participants}
    for st in sets:
        ref = sgd_quality.sklearn_reference(st, args.rows, range(args.ref_seeds))
        lo, hi = min(ref["epochs"]), max(ref["epochs"])
        print(f"{st.name.strip()} (scikit-learn {lo}-{hi})", flush=True)
        for P in args.participants:
            for seed in range(args.seeds):
                cap = sgd_quality.epoch_cap(st, ref)
                if args.end_model:
                    own = [sklearn_rule(record_end_model(st, args.rows, P, seed, cap), False)]
                    e = own[0]
                else:
                    own = sorted(sklearn_rule(v, False) for v in record_own(st, args.rows, P, seed, cap))
                    e = own[P // 2]  # the epoch by which more than half have stopped
                bad = not (lo - sgd_quality.STOP_SLACK <= e <= hi + sgd_quality.STOP_SLACK)
                off[P] += bad
                what = "stops" if args.end_model else f"own rules {own[0]}-{own[-1]}, majority"
                print(f"  P={P} seed {seed}: {what} {'*' if bad else ''}{e}")
    print(("\nthe averaged model's objective" if args.end_model else "\nmajority of the participants' own rules")
          + ", off: "
          + ", ".join(f"P={P} {off[P]} of {len(sets) * args.seeds}" for P in args.participants))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--participants", type=int, nargs="+", default=[1, 2, 4, 16, 64])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--ref-seeds", type=int, default=10)
    ap.add_argument("--rows", type=int, default=8000)
    ap.add_argument("--votes", action="store_true", help="the majority of the participants' own rules")
    ap.add_argument("--end-model", action="store_true", help="the averaged model's objective at epoch end")
    args = ap.parse_args()
    if args.votes or args.end_model:
        return votes_main(args)
    sets = [s for s in sgd_quality.quick_settings() if s.stops]
    off = {r: {P: 0 for P in args.participants} for r in RULES}
    for st in sets:
        ref = sgd_quality.sklearn_reference(st, args.rows, range(args.ref_seeds))
        lo, hi = min(ref["epochs"]), max(ref["epochs"])
        cap = sgd_quality.epoch_cap(st, ref)
        hib = bool(st.kwargs().get("early_stopping"))
        line = {r: [] for r in RULES}
        for P in args.participants:
            for seed in range(args.seeds):
                vals = record(st, args.rows, P, seed, cap)
                for r, rule in RULES.items():
                    e = sklearn_rule(vals, hib) if P == 1 else rule(vals, hib)  # one participant: scikit-learn's
                    bad = not (lo - sgd_quality.STOP_SLACK <= e <= hi + sgd_quality.STOP_SLACK)
                    off[r][P] += bad
                    line[r].append(f"P={P}:{'*' if bad else ''}{e}")
        print(f"{st.name.strip()} (scikit-learn {lo}-{hi})", flush=True)
        for r in RULES:
            print(f"  {r:8s} " + " ".join(line[r]), flush=True)
    print("\n| rule | " + " | ".join(f"P={P}" for P in args.participants) + " |")
    print("| --- |" + " --- |" * len(args.participants))
    for r in RULES:
        print(f"| {r} | " + " | ".join(str(off[r][P]) for P in args.participants) + " |")


if __name__ == "__main__":
    main()
