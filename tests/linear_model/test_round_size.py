"""SGD rounds sized by work (issue 36; ``linear_model/_round_size.py``).

The rule itself (pure), what the driver measures, when it applies, and
that it leaves BSP fits alone: bit-identical to the schedule's rounds
however expensive the sync looks, on the simulation and on a cluster.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
import warnings

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dask_ps
from dask_ps.linear_model import SGDClassifier
from dask_ps.linear_model._round_size import RoundsByWork, measured_costs, work_clock_every

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import sgd_sim  # noqa: E402

# --- the rule ------------------------------------------------------------------------------


def test_cheap_sync_keeps_the_schedule():
    """One machine: a round's compute already >= ratio x its sync."""
    assert work_clock_every(64, 4096, compute_per_round=0.045, sync_per_clock=0.009, ratio=4, min_rounds=4) == 64


def test_rounds_double_until_the_compute_is_ratio_times_the_sync():
    # 10 ms of compute a round against 9 ms of sync: 4x the round is the first with 40 ms >= 4 x 9 ms
    assert work_clock_every(64, 4096, compute_per_round=0.010, sync_per_clock=0.009, ratio=4, min_rounds=4) == 256
    # just under the bar at 2x: one more doubling
    assert work_clock_every(10, 1000, compute_per_round=1.0, sync_per_clock=0.5, ratio=4.0001, min_rounds=1) == 40


def test_an_epoch_keeps_its_minimum_rounds():
    m = work_clock_every(64, 4096, compute_per_round=0.001, sync_per_clock=1.0, ratio=4, min_rounds=4)
    assert m == 1024 and 4096 // m == 4
    # the cap is not a doubling of the schedule's round: the cap itself
    assert work_clock_every(5, 100, compute_per_round=0.001, sync_per_clock=1.0, ratio=4, min_rounds=8) == 12


def test_rounds_never_shrink():
    """Already fewer rounds than the minimum (a small input), or sync free: the schedule's."""
    assert work_clock_every(50, 100, compute_per_round=0.001, sync_per_clock=1.0, ratio=4, min_rounds=4) == 50
    assert work_clock_every(8, 100, compute_per_round=1.0, sync_per_clock=0.0, ratio=4, min_rounds=1) == 8


@pytest.mark.parametrize("compute,sync", [(math.nan, 1.0), (1.0, math.inf), (-1.0, 1.0), (0.0, 1.0)])
def test_nothing_measured_keeps_the_schedule(compute, sync):
    assert work_clock_every(8, 800, compute_per_round=compute, sync_per_clock=sync, ratio=4, min_rounds=1) == 8


def test_measured_costs_are_the_median_cpu_and_the_least_rest():
    """A round's compute is the participant's CPU in the run (its thread's
    and its round builder's); a clock's sync the rest of the wall, the
    least any participant had."""
    results = [{"seconds": 10.0, "profile": {"ps_seconds": 1.0, "run_cpu_seconds": 7.0, "round_prep_cpu_seconds": 1.0}},
               {"seconds": 10.0, "profile": {"ps_seconds": 5.0, "run_cpu_seconds": 4.0}},
               {"seconds": 10.0, "profile": {"ps_seconds": 2.0, "run_cpu_seconds": 6.0}}]
    compute, sync = measured_costs(results, clocks=2)
    assert (compute, sync) == (3.0, 1.0)  # CPU 8, 4, 6 -> median 6 / 2 clocks; rest 2, 6, 4 -> least 2 / 2
    # without a CPU clock: the time outside the parameter server's calls
    assert measured_costs([{"seconds": 10.0, "profile": {"ps_seconds": 4.0}}], clocks=2) == (3.0, 2.0)
    assert all(math.isnan(v) for v in measured_costs([], clocks=2))


@dataclasses.dataclass(frozen=True)
class _Cfg:
    """What ``RoundsByWork`` reads of a ``_RunConfig``."""

    staleness: int | None
    steps_per_epoch: int
    clock_every: int
    max_iter: int
    epoch0: int
    global_stop: bool
    decision_lag: int = 0


def _cfg(staleness, steps=64, clock_every=4, max_iter=5, epoch0=0):
    return _Cfg(staleness, steps, clock_every, max_iter, epoch0, global_stop=staleness is not None)


@pytest.mark.parametrize("mode,staleness,active", [
    ("auto", 0, False),      # BSP keeps the schedule: bit-reproducible
    ("auto", 1, True), ("auto", 3, True), ("auto", None, True),
    ("always", 0, True), ("never", 1, False),
])
def test_when_rounds_are_sized_by_work(mode, staleness, active):
    assert RoundsByWork(_cfg(staleness, steps=256), 4, mode).active is active


def test_not_applied_where_it_cannot_change_anything():
    assert not RoundsByWork(_cfg(1), 1, "always").active  # one participant: no clocks
    assert not RoundsByWork(_cfg(1, max_iter=1), 4, "always").active  # one epoch: nothing after the measured one
    assert not RoundsByWork(_cfg(1, max_iter=5, epoch0=4), 4, "always").active
    assert not RoundsByWork(_cfg(1, steps=16, clock_every=4), 4, "always").active  # already 4 rounds an epoch
    assert not RoundsByWork(_cfg(1, steps=28, clock_every=4), 4, "always").active  # 7 rounds: no doubling left
    assert RoundsByWork(_cfg(1, steps=72, clock_every=4), 4, "always").active
    # the schedule's minimum rounds (8 under a bound, 4 under BSP): rounds shorter than
    # ps.sgd.clock-samples, a small input: kept (the measured run would cost more than it saves)
    assert not RoundsByWork(_cfg(1, steps=64, clock_every=8), 4, "always").active
    assert RoundsByWork(_cfg(0, steps=160, clock_every=16), 4, "always").active  # BSP: 10 rounds > 4
    with pytest.raises(ValueError, match="rounds-by-work"):
        RoundsByWork(_cfg(1), 4, "sometimes")


def test_the_measured_run_is_one_epoch_and_the_decision_is_kept():
    ok = [{"seconds": 1.0, "profile": {"ps_seconds": 0.5}}] * 4  # 16 clocks: a round 0.031 s, a clock 0.031 s
    with dask.config.set({"ps.sgd.work-min-rounds-per-epoch": 4}):
        bw = RoundsByWork(_cfg(1), 4, "auto")
    assert bw.end(0, 5) == 1
    bw.measured(_cfg(1), 1, ok)
    assert bw.decided == 16  # the floor binds: 4 rounds an epoch (8 x the sync would need 8 x the round)
    assert bw.config(_cfg(1)).clock_every == 16
    assert bw.end(1, 5) == 5
    bw = RoundsByWork(_cfg(1), 4, "auto")  # the default floor, 1 round an epoch (SSP(1) catches up)
    bw.measured(_cfg(1), 1, ok)
    assert bw.decided == 32  # 8 x the round: 0.25 s >= 8 x 0.031 s (2 rounds an epoch)


def test_ssp_keeps_s_times_the_rounds_an_epoch():
    """SSP(s): s times the floor, so that the bound spans no more of an
    epoch than SSP(1)'s (and the stopping decision's lag stays one epoch)."""
    assert [RoundsByWork(_cfg(s, steps=512), 4, "auto").min_rounds for s in (0, 1, 2, 3, None)] == [1, 1, 2, 3, 1]
    with dask.config.set({"ps.sgd.work-min-rounds-per-epoch": 4}):
        assert [RoundsByWork(_cfg(s, steps=512), 4, "auto").min_rounds for s in (0, 1, 3)] == [4, 4, 12]
    # SSP(2) with the schedule's 8 rounds an epoch (ps.sgd.min-rounds-per-epoch): nothing to size
    assert not RoundsByWork(_cfg(2, steps=64, clock_every=8), 4, "auto").active


# --- fits ------------------------------------------------------------------------------------


def _data(n=6400):
    rs = np.random.RandomState(0)
    X = sp.random(n, 40, density=0.2, format="csr", random_state=rs)
    y = (X @ rs.randn(40) > 0).astype(int)
    return X, y


# A sync that looks 1e9 x a round's compute, and rounds of one 100-sample minibatch to size.
EXPENSIVE = {"ps.sgd.work-ratio": 1e9, "ps.sgd.clock-samples": 100}


def _simulated(consistency, mode, **params):
    X, y = _data()
    runs = []
    real = sgd_sim.SimServer.run

    def run(self, fn, parts, **kw):
        runs.append(kw["cfg"])
        return real(self, fn, parts, **kw)

    from unittest import mock

    with dask.config.set({**EXPENSIVE, "ps.sgd.rounds-by-work": mode}), mock.patch.object(sgd_sim.SimServer, "run",
                                                                                         run):
        est = sgd_sim.simulate_fit(SGDClassifier(random_state=0, max_iter=3, tol=None, batch_size=100, **params), X, y,
                                   n_participants=2, consistency=consistency)
    return est, runs


def test_ssp_fit_trains_its_later_epochs_in_rounds_sized_by_work():
    est, runs = _simulated("ssp1", "auto")
    assert [(c.epoch0, c.max_iter) for c in runs] == [(0, 1), (1, 3)]
    first, later = runs
    assert (first.steps_per_epoch, first.clock_every) == (32, 1)  # 3200 samples a participant, rounds of 100
    assert -(-later.steps_per_epoch // later.clock_every) == 1  # grown to ps.sgd.work-min-rounds-per-epoch
    assert later.decision_lag == first.decision_lag == 1
    assert est.n_iter_ == 3 and np.all(np.isfinite(est.coef_))
    X, y = _data()
    assert est.score(X, y) > 0.85


def test_bsp_fits_keep_the_schedule_bit_for_bit():
    """Under the default ``auto`` a BSP fit is not sized by work, however
    expensive its sync looks: the same bits as ``never``, one run."""
    auto, runs = _simulated("bsp", "auto")
    never, _ = _simulated("bsp", "never")
    assert len(runs) == 1
    assert auto.coef_.tobytes() == never.coef_.tobytes()
    assert auto.intercept_.tobytes() == never.intercept_.tobytes()
    always, runs = _simulated("bsp", "always")  # asked for: sized, so another model
    assert len(runs) == 2 and always.coef_.tobytes() != never.coef_.tobytes()


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, memory_limit=0,
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as c:
        yield c


def _fit(client, consistency, **settings):
    X, y = _data()
    with warnings.catch_warnings(), dask.config.set({**EXPENSIVE, "ps.sgd.min-samples-per-participant": 1000,
                                                     **settings}):
        warnings.simplefilter("ignore")
        return SGDClassifier(random_state=1, max_iter=3, tol=None, batch_size=100, client=client,
                             consistency=consistency).fit(X, y)


def test_cluster_bsp_fits_stay_bit_identical(client):
    """Two BSP fits under the default (with the sync looking expensive)
    are the same bits, and those of the rounds never sized by work."""
    a, b = _fit(client, dask_ps.BSP()), _fit(client, dask_ps.BSP())
    c = _fit(client, dask_ps.BSP(), **{"ps.sgd.rounds-by-work": "never"})
    assert len(a.metrics_) == 2 and len(a.run_ids_) == 1
    assert a.coef_.tobytes() == b.coef_.tobytes() == c.coef_.tobytes()


def test_cluster_ssp_fit_sized_by_work(client):
    from unittest import mock

    decided = []
    real = RoundsByWork.measured

    def measured(self, cfg, epochs, results):
        real(self, cfg, epochs, results)
        decided.append((cfg.steps_per_epoch, cfg.clock_every, self.decided))

    with mock.patch.object(RoundsByWork, "measured", measured):
        est = _fit(client, dask_ps.SSP(1))
    assert len(est.run_ids_) == 2  # the measured first epoch, then the rest in bigger rounds
    assert decided[0] == (32, 1, 32)  # one round an epoch: ps.sgd.work-min-rounds-per-epoch
    assert est.n_iter_ == 3 and est.score(*_data()) > 0.85
