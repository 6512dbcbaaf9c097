"""SGD rounds sized by work (issue 36): past one machine a clock's sync
grows with the workers, so a round of the schedule's samples
(``ps.sgd.clock-samples``) can cost more in sync than in compute.

After a measured first run (the fit's first epoch at the schedule's
rounds), the driver makes the rounds of the later runs bigger: the
schedule's round doubled until its compute is at least
``ps.sgd.work-ratio`` times its sync, as measured (``measured_costs``),
keeping at least ``ps.sgd.work-min-rounds-per-epoch`` rounds an epoch
(1: with the catch-up SSP(1) keeps its answers at one round an epoch,
docs/benchmarks.md), ``s``
times as many under ``SSP(s)`` (the bound spans no more of an epoch than
SSP(1)'s; the stopping decision's lag stays one epoch). Only inputs whose
rounds are ``ps.sgd.clock-samples`` long are sized (the measured run is a
run more), and the rounds never get smaller than the schedule's: on a
quiet machine, where a clock's sync is a fraction of a round's compute, a
fit keeps today's rounds and answers.

The decision is made once, in the driver, from what the first run's
participants report, and sent to every participant with the run's
configuration: all of them clock the same rounds. Because it depends on
timings, it is only taken where a fit's answer already depends on them
(``ps.sgd.rounds-by-work: auto``: under a staleness bound, whose reads
are as fresh as the timing made them); a BSP fit keeps the schedule and
stays bit-reproducible for its ``random_state`` unless the user asks
(``always``).
"""

from __future__ import annotations

import dataclasses
import logging
import math

from dask_ps._estimators import setting

logger = logging.getLogger(__name__)

MODES = ("auto", "always", "never")


def work_clock_every(clock_every: int, steps: int, compute_per_round: float, sync_per_clock: float, ratio: float,
                     min_rounds: int) -> int:
    """Minibatches a round: the schedule's ``clock_every`` doubled while a
    round's compute (``compute_per_round`` seconds at ``clock_every``,
    growing with its samples) is under ``ratio`` x ``sync_per_clock``
    (taken as fixed: what a bigger round saves is clocks, whose messages
    and latencies do not grow with it), at most ``steps // min_rounds``
    (an epoch keeps ``min_rounds`` rounds) and never fewer than
    ``clock_every``. Inputs that are not finite and positive (nothing
    measured) leave the schedule."""
    clock_every, steps = max(1, int(clock_every)), max(1, int(steps))
    cap = max(clock_every, steps // max(1, int(min_rounds)))
    if not (math.isfinite(compute_per_round) and math.isfinite(sync_per_clock) and math.isfinite(ratio)):
        return clock_every
    if compute_per_round <= 0 or sync_per_clock <= 0 or ratio <= 0:
        return clock_every
    m = clock_every
    while m < cap and compute_per_round * m / clock_every < ratio * sync_per_clock:
        m = min(2 * m, cap)
    return m


def measured_costs(results, clocks: int) -> tuple[float, float]:
    """``(compute seconds a round, sync seconds a clock)`` of a run of
    ``clocks`` clocks from its participants' results.

    A round's compute is its CPU: the participant thread's CPU seconds in
    the run (``run_cpu_seconds``) and its round-building thread's. A
    clock's sync is the rest of the run's wall: the waits in the parameter
    server's calls, and the time the thread was off its core while the
    worker's event loop served the others' messages (with one core a
    worker, what serving P participants costs shows as a slower round, not
    as a wait). The compute is the participants' median; the sync the
    least any of them had (the others also waited for the slowest, which
    bigger rounds do not remove)."""
    clocks = max(1, int(clocks))
    compute, sync = [], []
    for r in results:
        prof = r.get("profile") or {}
        wall = float(r.get("seconds", float("nan")))  # counted from after the setup
        cpu = prof.get("run_cpu_seconds")
        if cpu is None:  # no CPU clock: the time outside the calls
            cpu = wall - float(prof.get("ps_seconds", float("nan")))
        else:
            cpu = float(cpu) + float(prof.get("round_prep_cpu_seconds") or 0.0)
        compute.append(cpu / clocks)
        sync.append(max(0.0, wall - cpu) / clocks)
    if not compute:
        return float("nan"), float("nan")
    compute.sort()
    return compute[len(compute) // 2], min(sync)


class RoundsByWork:
    """The driver's side of rounds sized by work for one fit
    (``_training._run_chunks``): whether it applies, where the measured
    first run ends, and the configuration of the runs after it."""

    def __init__(self, cfg, n_participants: int, mode: str | None = None):
        mode = setting("sgd", "rounds-by-work") if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"ps.sgd.rounds-by-work must be one of {MODES}, got {mode!r}")
        self.ratio = float(setting("sgd", "work-ratio"))
        s = cfg.staleness
        # Under SSP(s) s times as many: a bound of s clocks spans as much of an epoch as SSP(1)'s one
        # (the sweep measured SSP(1); SSP(2) at 4 rounds would span 3/4 of an epoch), and the stopping
        # decision's lag stays one epoch.
        self.min_rounds = max(1, int(setting("sgd", "work-min-rounds-per-epoch"))) * max(1, int(s or 0))
        # Only for inputs whose rounds are ps.sgd.clock-samples long (more
        # rounds an epoch than the schedule's minimum: over ~1M samples a
        # participant under SSP, ~0.5M under BSP), and where a round may at
        # least double. The measured epoch is a run more: its rounds are
        # built again (sparse data: compacted) and under a bound its start
        # pulled and pushed again (_RunStarts); on 2 workers and 360k
        # click-through rows that cost more CPU than the clocks saved.
        per_epoch = -(-cfg.steps_per_epoch // cfg.clock_every)
        full = per_epoch > int(setting("sgd", "bsp-min-rounds-per-epoch" if s == 0 else "min-rounds-per-epoch"))
        room = cfg.steps_per_epoch // self.min_rounds >= 2 * cfg.clock_every
        self.active = (n_participants > 1 and mode != "never" and (mode == "always" or s != 0) and full and room
                       and cfg.max_iter - cfg.epoch0 > 1)
        self.decided = None  # the clock_every of the runs after the measured one

    def __repr__(self):
        return (f"<RoundsByWork active={self.active} ratio={self.ratio} min_rounds={self.min_rounds} "
                f"decided={self.decided}>")

    def end(self, epoch: int, end: int) -> int:
        """The end of the run that starts at ``epoch``: the measured first
        run is one epoch."""
        if self.active and self.decided is None:
            return min(end, epoch + 1)
        return end

    def config(self, cfg):
        """``cfg`` with the rounds decided (itself before the decision)."""
        if self.decided is None or self.decided == cfg.clock_every:
            return cfg
        per_epoch = -(-cfg.steps_per_epoch // self.decided)
        lag = math.ceil(cfg.staleness / per_epoch) if cfg.global_stop else 0
        return dataclasses.replace(cfg, clock_every=self.decided, decision_lag=lag)

    def measured(self, cfg, epochs: int, results) -> None:
        """After the measured run (``epochs`` epochs of ``cfg``'s rounds):
        the rounds of the later runs."""
        if not self.active or self.decided is not None:
            return
        per_epoch = -(-cfg.steps_per_epoch // cfg.clock_every)
        compute, sync = measured_costs(results, per_epoch * max(1, epochs))
        self.decided = work_clock_every(cfg.clock_every, cfg.steps_per_epoch, compute, sync, self.ratio,
                                        self.min_rounds)
        logger.info("SGD rounds by work: a round %.4f s of compute, a clock %.4f s of sync (ratio %g): "
                    "%d minibatches a round instead of %d (%d rounds an epoch)", compute, sync, self.ratio,
                    self.decided, cfg.clock_every, -(-cfg.steps_per_epoch // self.decided))
