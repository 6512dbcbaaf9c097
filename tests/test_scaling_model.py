"""The SSP wait of ``benchmarks/scaling_model.py``'s LDA term
(``ssp_period``): the staleness rule of ``Session.clock`` simulated, and the
model's LDA iteration that uses it."""

from __future__ import annotations

import numpy as np
import pytest


def test_equal_steady_work_does_not_wait(sm):
    assert sm.ssp_period([0.1, 0.1, 0.1], 0.0, 2, 30) == pytest.approx(0.1)


def test_a_systematically_slower_participant_sets_the_pace(sm):
    # The faster runs ahead by at most 2 clocks and then waits each clock.
    assert sm.ssp_period([0.10, 0.12], 0.0, 2, 30) == pytest.approx(0.12)
    # The mean participant waits the difference of the means (what the fit's clock waits show).
    assert sm.ssp_period([0.10, 0.14], 0.0, 2, 30) - np.mean([0.10, 0.14]) == pytest.approx(0.02)


def test_bsp_waits_for_the_expected_maximum_each_iteration(sm):
    # BSP (staleness 0), 2 participants, CV 10%: E[max of 2 N(0, 1)] = 1 / sqrt(pi).
    got = sm.ssp_period([1.0, 1.0], 0.1, 0, 200, reps=400)
    assert got == pytest.approx(1.0 + 0.1 / np.sqrt(np.pi), rel=0.005)


def test_staleness_absorbs_noise_and_the_wait_grows_with_participants(sm):
    bsp = sm.ssp_period([1.0] * 4, 0.1, 0, 30)
    ssp = sm.ssp_period([1.0] * 4, 0.1, 2, 30)
    assert 1.0 < ssp < bsp
    waits = [sm.ssp_period([1.0] * P, 0.05, 2, 30) - 1.0 for P in (2, 4, 16, 64)]
    assert all(a < b for a, b in zip(waits, waits[1:]))


def test_scale_free(sm):
    # Seconds in, seconds out: the same shape of work at another scale.
    a = sm.ssp_period([1.0, 1.3, 0.9], 0.2, 2, 20)
    assert sm.ssp_period([0.01, 0.013, 0.009], 0.2, 2, 20) == pytest.approx(a / 100)


def test_a_run_long_spread_between_participants_makes_the_others_wait(sm):
    # f_p ~ 1 + 0.1 N(0, 1) for the run: the pace is the expected slowest, 1 + 0.1 / sqrt(pi) at P = 2.
    assert sm.ssp_period([1.0, 1.0], 0.0, 2, 30, spread=0.1, reps=4000) == pytest.approx(1.0 + 0.1 / np.sqrt(np.pi),
                                                                                        rel=0.01)


def test_participant_noise_counts_only_what_differs_between_participants(sm):
    rng = np.random.default_rng(0)
    common = 0.05 * np.exp(rng.standard_normal(400))  # load that slows both at once: no one waits for it
    cv, spread2 = sm.participant_noise(np.array([common, common]))
    assert cv == pytest.approx(0.0, abs=1e-12) and spread2 == pytest.approx(0.0, abs=1e-12)
    own = 1.0 + 0.2 * rng.standard_normal((2, 400))
    cv, spread2 = sm.participant_noise(common * own)
    assert cv == pytest.approx(0.2, rel=0.1)  # each participant's own noise
    assert abs(spread2) < 0.002
    slower = np.array([[1.0], [1.3]]) * common  # one participant 1.3x slower all along
    cv, spread2 = sm.participant_noise(slower)
    assert cv == pytest.approx(0.0, abs=1e-12) and np.sqrt(spread2) == pytest.approx(0.3 / 1.15 / np.sqrt(2), rel=1e-6)


def _fit(cv, share=0.5, sync=0.02, iters=30):
    return {"share_before": share, "share_after": share, "iters": iters, "participants": [],
            "busy": {"iteration_cv": cv, "sync_wall": sync}}


def test_lda_iteration_of_a_measured_fit_adds_the_ssp_wait(sm):
    # The Model's LDA term alone (no measurements needed past its compute constants).
    mod = sm.Model.__new__(sm.Model)
    mod.lda = {"sweep_per_token": 100e-9, "delta_per_row": 0.0}
    mod.knobs = dict(sm.Model.KNOBS)
    mod.lda_spread = 0.0
    compute = 100e-9 * 500_000  # 50 ms of CPU, at half a core: 100 ms
    steady = mod.lda_iter(2, 500_000, 10_000, 30, here=True, fit=_fit(0.0))
    assert steady == pytest.approx(compute / 0.5 + 0.02)
    noisy = mod.lda_iter(2, 500_000, 10_000, 30, here=True, fit=_fit(0.3))
    assert noisy == pytest.approx(sm.ssp_period([steady, steady], 0.3, 2, 30)) and noisy > steady
    assert mod.lda_iter(2, 500_000, 10_000, 30, here=True, fit=_fit(0.3), waits=False) == pytest.approx(steady)
    mod.lda_spread = 0.2
    assert mod.lda_iter(2, 500_000, 10_000, 30, here=True, fit=_fit(0.3)) > noisy
