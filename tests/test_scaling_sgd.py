"""The SGD half of ``benchmarks/scaling_model.py`` (``scaling_sgd``): the
rounds read from the estimator's own schedule, the compute's calibration,
and the model's round on one core per worker."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("n_p, P, config", [(250_000, 2, None), (62_500, 16, None), (12_000, 2, None),
                                             (250_000, 2, {"ps.sgd.min-rounds-per-epoch": 32, "ps.sgd.bsp-min-rounds-per-epoch": 32}),
                                             (1_000_000, 1, None)])
def test_schedule_is_the_rounds_a_participant_trains(sm, n_p, P, config):
    import dask

    from dask_ps.linear_model import SGDClassifier
    from dask_ps.linear_model._rounds import _epoch_rounds
    from dask_ps.linear_model._training import _run_config, _Start

    rounds = sm.scaling_sgd.schedule(n_p, P, sm.BATCH, sm.D_SGD, config)
    est = SGDClassifier(batch_size=sm.BATCH)
    est.t_ = 1.0
    with dask.config.set(config or {}):
        cfg = _run_config(est, est._hyper(1, True), _Start(W0=np.zeros((1, 1)), seeds=(0,) * P, name="t"), None, 0,
                          sm.D_SGD, 1, n_p * P, [n_p] * P, 1, None, None, None, True)
    run_rounds = []
    _epoch_rounds(np.random.RandomState(0), True, np.arange(n_p), cfg.steps_per_epoch, cfg.clock_every, True,
                  run_rounds, 0, 0)
    assert list(rounds) == [r.shape[0] for r in run_rounds]
    assert rounds.sum() == n_p


def test_fit_compute_recovers_the_costs_per_nonzero_and_per_touched_row(sm):
    def U(m):
        return 3.0 * m ** 0.8

    consts = ((0.01, 8e-9, 40e-9), (1.5e-9, 50e-9))
    fits = []
    for n_p, E, config in ((250_000, 1, None), (250_000, 2, None), (250_000, 1, {"ps.sgd.min-rounds-per-epoch": 32}),
                           (12_000, 1, None)):
        rounds = sm.sgd_schedule(n_p, 2, config)
        Us, k, q = sm.scaling_sgd.round_costs(rounds, 39.0, U, consts)
        calls = E * sum(1e-4 + 1e-8 * u for u in Us)
        part = {"cpu_seconds": consts[0][0] + E * k.sum() + calls, "round_prep_cpu_seconds": q, "samples": E * n_p}
        fits.append({"E": E, "n_p": n_p, "nnz_row": 39.0, "rounds": rounds, "participants": [part, part]})
    c, qc, rows = sm.scaling_sgd.fit_compute(fits, U, lambda u: 1e-4 + 1e-8 * u, sm.lstsq)
    assert np.allclose(c, consts[0], rtol=1e-6) and np.allclose(qc, consts[1], rtol=1e-6)
    assert len(rows) == 8


def _model(sm, q_per_nonzero):
    """The Model's SGD round alone: 10 ns a non-zero, a cycle of 10 ms wall
    and 5 ms of worker CPU, U(m) = m."""
    mod = sm.Model.__new__(sm.Model)
    mod.knobs = dict(sm.Model.KNOBS)
    mod.share, mod.jitter, mod.rtt, mod.hops = 1.0, 0.05, 50e-6, 4
    mod.m = {"sgd_U": {"m": [1, 1e7], "U": [1, 1e7]}}
    mod.cyc = {"sgd": {"cpu": np.array([0.005, 0.0, 0.0]), "wall2": np.array([0.010, 0.0]), "sched": 0.0}}
    mod.sgd_c, mod.sgd_q = (0.0, 10e-9, 0.0), (q_per_nonzero, 0.0)
    mod.sgd_serving, mod.sgd_sync_busy, mod.sgd_barrier_here, mod.sgd_busy = 1.0, 1.0, 0.0, None
    return mod


def test_the_background_thread_shares_the_first_rounds_core(sm):
    n_p, nnz_row = 250_000, 39.0
    rounds = sm.sgd_schedule(n_p, 2)
    k = 10e-9 * nnz_row * rounds
    epoch = float(np.sum(k + 0.010))
    ends = 0.010  # the stopping rule's read at the epoch's end: a cycle of one row
    # Little background work: hidden in the first round's wait for the cycle.
    hidden = _model(sm, 0.1e-9)
    assert hidden.sgd_iterations(2, n_p, nnz_row, 1, here=True, fixed=False) == pytest.approx(epoch + ends)
    # More than the cycle's idle time: the first round is compute, background and the cycle's CPU on one core.
    busy = _model(sm, 2e-9)
    q = 2e-9 * nnz_row * n_p
    first = k[0] + q + 0.005
    got = busy.sgd_iterations(2, n_p, nnz_row, 1, here=True, fixed=False)
    assert got == pytest.approx(first + epoch - (k[0] + 0.010) + ends)
    # A second epoch trains the same rounds in place again: its compute and cycles, no background work.
    assert busy.sgd_iterations(2, n_p, nnz_row, 2, here=True, fixed=False) == pytest.approx(got + epoch + ends)
