"""The SGD half of ``scaling_model.py``'s cost model: the estimator's round
schedule, read from its own code, and the participant's compute as the
sparse rounds now run it, calibrated from the 2-worker fits' ``metrics_``.

What a sparse participant of a run of at most ``IN_PLACE_EPOCHS`` epochs
does (``dask_ps/linear_model/_rounds.py``, ``_round_prep.py``,
``_participant.py``), and so what the model counts:

- **Its rounds** (``schedule``): ``_training._run_config`` cuts a
  participant's samples into ``steps_per_epoch`` minibatches and rounds of
  ``clock_every`` of them (``ps.sgd.clock-samples``,
  ``ps.sgd.min-rounds-per-epoch``); the last round of an epoch may be
  shorter. Nothing here restates that arithmetic.
- **The background thread, once a run** (``q``): the touched features of
  every round and the lazy regularization's counts (``_RoundPrep._count``;
  kept rounds are not built again at the next epoch, a one-epoch run's
  rounds are built from those features). The participant waits for the
  first round's features and takes the counts at that round's end: on one
  core per worker this CPU lands in the first round, next to its kernel.
- **The participant's thread, every round of every epoch** (``k``): the
  round's rows written into the participant's copy of the whole table,
  the kernel over the round's samples read in place from its CSR (per
  non-zero: reads and writes at random in the table's copy), the rows read
  back with the lazy regularization, the delta to push (per touched row).
  No compacted CSR and no compaction at later epochs any more.
- **Once a run** (``c0``): the copy of the table and the counts' first
  touch, the data's setup.

And what one core per worker does beside that compute (``busy_costs``):
the participant's round around a compiled loop that reads and writes at
random in a table-sized array without the GIL, against the same loop and
the cycle alone: the compute's stretch by the worker's serving of its
peer, the wait for the last push (BSP), the sync after it.

Calibrated (``fit_compute``) from the fits of the smallest cluster measured
(P = 2: one worker per core; the oversubscribed P = 4 and 8 stretch the CPU
of these memory-bound loops several-fold: the participants' copies of the
2^22-row table evict each other from the caches), their tiny fit included
(a small participant: the run's constant): the participant thread's CPU
less its calls' (the cycle's thread CPU at each round's rows), and the
background thread's.
"""

from __future__ import annotations

import math
import time

import numpy as np


def schedule(n_p, P, batch_size, n_features, config=None):
    """Samples of each round of an epoch of a participant with ``n_p``
    samples among ``P`` (one array of round sizes), as the estimator
    schedules them (``_training._run_config``: minibatches of
    ``batch_size`` and rounds of ``clock_every`` of them;
    ``_rounds._epoch_rounds``: runs of ``np.array_split``'s minibatches),
    under ``config`` (dask settings, e.g. ``ps.sgd.clock-samples``)."""
    import dask

    from dask_ps.linear_model import SGDClassifier
    from dask_ps.linear_model._training import _run_config, _Start

    n_p = max(1, int(n_p))
    est = SGDClassifier(loss="log_loss", batch_size=batch_size, max_iter=1)
    est.t_ = 1.0
    with dask.config.set(config or {}):
        cfg = _run_config(est, est._hyper(1, True), _Start(W0=np.zeros((1, 1)), seeds=(0,) * P, name="schedule"),
                          None, 0, n_features, 1, n_p * P, [n_p] * P, 1, None, None, None, True)
    S, m = cfg.steps_per_epoch, cfg.clock_every
    size, extra = divmod(n_p, S)
    bounds = np.minimum(np.arange(S + 1), extra) + np.arange(S + 1) * size
    starts = np.arange(0, S, m)
    return bounds[np.minimum(starts + m, S)] - bounds[starts]


def fit_compute(fits, U, calls_cpu, lstsq):
    """The compute constants from ``fits`` (``(P, fit)``: each fit's
    ``E``, ``n_p``, ``nnz_row``, ``rounds`` (its schedule) and its
    participants' ``metrics_``), ``U(m)`` the touched rows of a round of m
    samples and ``calls_cpu(U)`` the participant thread's CPU in one
    cycle's calls:

    - participant thread, less its calls: ``c0 + E x (kappa x non-zeros
      + rho x touched rows)`` (the rows summed over the epoch's rounds);
    - background thread, once a run: ``pi x non-zeros + chi x touched
      rows`` (an epoch's).

    Returns ``(c0, kappa, rho), (pi, chi)`` and the rows fitted."""
    A, b, Aq, bq, rows = [], [], [], [], []
    for fit in fits:
        E, n_p, nnz_row, rounds = fit["E"], fit["n_p"], fit["nnz_row"], fit["rounds"]
        Us = np.array([U(m) for m in rounds])
        calls = E * sum(calls_cpu(u) for u in Us)
        for p in fit["participants"]:
            A.append([1.0, E * n_p * nnz_row, E * Us.sum()])
            b.append(p["cpu_seconds"] - calls)
            Aq.append([n_p * nnz_row, Us.sum()])
            bq.append(p["round_prep_cpu_seconds"])
            rows.append({"E": E, "n_p": n_p, "R": len(rounds), "U": float(Us.mean()), "compute": b[-1],
                         "prep": bq[-1]})
    return tuple(lstsq(A, b)), tuple(lstsq(Aq, bq)), rows


def round_costs(rounds, nnz_row, U, consts, row_cpu=1.0):
    """Per round of an epoch: ``(U, k)``, its touched rows and the
    participant thread's compute (CPU seconds); and ``q``, the background
    thread's CPU of the run (``consts``: ``fit_compute``'s two tuples;
    ``row_cpu`` scales the costs per touched row)."""
    (c0, kappa, rho), (pi, chi) = consts
    Us = np.array([U(m) for m in rounds])
    k = kappa * np.asarray(rounds) * nnz_row + row_cpu * rho * Us
    q = pi * float(np.sum(rounds)) * nnz_row + row_cpu * chi * float(Us.sum())
    return Us, k, q


def rounds_scaled(rounds, factor):
    """The epoch's rounds ``factor`` times larger (a what-if: fewer, larger
    rounds; at most one round of all the samples)."""
    n = int(np.sum(rounds))
    m = int(min(n, max(1, round(float(np.max(rounds)) * factor))))
    R = math.ceil(n / m)
    return np.array([m] * (R - 1) + [n - m * (R - 1)])


# --- the cycle around a compute --------------------------------------------------------------------

_TOUCH = None


def _touch():
    """A compiled loop like the in-place kernel's memory traffic: reads and
    writes at random in a copy of the table, without the GIL (numba), so
    that the worker's event loop runs beside it on the same core."""
    global _TOUCH
    if _TOUCH is None:
        from numba import njit

        @njit(nogil=True)
        def touch(w, idx, n):
            s = 0.0
            mask = idx.shape[0] - 1
            for i in range(n):
                j = idx[i & mask]
                w[j] = w[j] * 0.999999 + 1e-9
                s += w[j]
            return s

        _TOUCH = touch
    return _TOUCH


def _busy_cycle(ctx, part, *, table, totals, reps, cpu, sync=True):
    """The SGD participant's round (``_participant``: the next round's read
    started, the round trained, its rows and stats row pushed,
    ``clock(wait=False)``, then the read's result) around a compute of
    ``cpu`` thread seconds (``_touch`` over a table-sized array, as the
    in-place kernel reads and writes); per round: the compute's wall and
    CPU, the sync's wall (the push to the read's result), and when the push
    started and the result came (``perf_counter``: the machine's monotonic
    clock, one for every process). ``sync=False``: the compute alone."""
    rows, d = part["rows"], part["n_features"]
    vals = np.full((rows.size, 1), 1e-6)
    srow = np.zeros((1, 8))
    where = np.array([ctx.rank])
    touch = _touch()
    w = np.zeros(d + 1)
    idx = np.random.default_rng(ctx.rank).integers(0, d, 1 << 20)
    touch(w, idx, 1 << 16)  # compiled
    c = time.thread_time()
    touch(w, idx, 1 << 21)
    n = max(1, int(cpu / max(time.thread_time() - c, 1e-9) * (1 << 21)))
    if sync:
        ctx.pull_rows(table, rows)
    out = []
    for _ in range(reps):
        handle = ctx.prefetch_rows(table, rows, for_clock=ctx.current_clock + 1) if sync else None
        w0, c0 = time.perf_counter(), time.thread_time()
        touch(w, idx, n)
        w1, c1 = time.perf_counter(), time.thread_time()
        if sync:
            ctx.push_rows(table, rows, vals)
            ctx.push_rows(totals, where, srow)
            ctx.clock(wait=False)
            handle.result()
        w2 = time.perf_counter()
        out.append((w1 - w0, c1 - c0, w2 - w1, w1, w2))
    if sync:
        ctx.clock()
    return out


def busy_costs(ps, P, U, cpu, n_features, reps=16, repeats=3):
    """``_busy_cycle`` at ``U`` rows a participant and ``cpu`` seconds of
    compute a round, on a table as the estimator's under BSP, each time
    between the same compute alone and the cycle alone (a compute of
    nothing), so that the machine's other load divides out (the rounds
    after the first two; the ratios: the least of ``repeats``, as other
    load only adds and moves within seconds):

    - ``stretch``: the compute's wall / CPU in the cycle against alone: the
      worker's serving of its peers' reads and pushes on the same core;
    - ``barrier``: the wait for the last participant's push (mean; the
      participants' compute differs), as a share of the compute's wall
      (``barrier_share``);
    - ``sync``: from the last push to the read's result, against the cycle
      alone (medians)."""
    import dask_ps

    table, totals = "scaling-sgd-busy", "scaling-sgd-busy-totals"
    ps.create_table(table, (n_features + 1, 1), dtype="float64", consistency=dask_ps.BSP(), aggregate="clock")
    ps.create_table(totals, (P, 8), dtype="float64", consistency=dask_ps.SSP(0), aggregate="clock")
    rng = np.random.default_rng(1)
    parts = [{"rows": np.sort(rng.choice(n_features, int(U), replace=False)).astype(np.int64),
              "n_features": n_features} for _ in range(P)]

    def run(c, sync=True):
        res = ps.run(_busy_cycle, parts, table=table, totals=totals, reps=reps, cpu=c, sync=sync)
        per = np.array([r[2:] for r in res])  # participant, round, field
        last_push = per[:, :, 3].max(axis=0)
        return {"compute_wall": float(np.median(per[:, :, 0])), "cpu": float(np.median(per[:, :, 1])),
                "stretch": float(np.median(per[:, :, 0] / per[:, :, 1])), "sync_wall": float(np.median(per[:, :, 2])),
                "sync_net": float(np.median(per[:, :, 4] - last_push[None, :])),
                "barrier": float(np.mean(last_push[None, :] - per[:, :, 3]))}

    got = []
    try:
        for _ in range(repeats):
            alone, compute, busy = run(1e-5), run(cpu, sync=False), run(cpu)
            got.append({**busy, "alone_sync": alone["sync_net"], "alone_stretch": compute["stretch"]})
    finally:
        ps.drop_table(table)
        ps.drop_table(totals)
    out = {k: float(np.median([g[k] for g in got])) for k in got[0]}
    out.update(U=int(U), serving=min(g["stretch"] / g["alone_stretch"] for g in got),
               sync_ratio=min(g["sync_net"] / g["alone_sync"] for g in got),
               barrier_share=min(g["barrier"] / g["compute_wall"] for g in got))
    return out
