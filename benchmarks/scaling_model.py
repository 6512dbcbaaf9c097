"""Scaling past two workers, by model: a cost model of one iteration,
calibrated per layer on this machine, checked against measured 2-worker
fits, then extrapolated to 4-64 workers on 10 and 25 Gbit/s networks.

What is measured (``LocalCluster(processes=True, n_workers=P,
threads_per_worker=1)``, P = 2 and, oversubscribed on 2 cores, P = 4 and 8):

- **Sparsity, from the data.** SGD click-through (``bench_sgd.ctr_data``):
  the rows a round touches, U(m) = distinct features of m samples drawn as
  the fixed sparse rounds are (blocks of 64 consecutive samples, shuffled),
  plus the intercept's row. LDA (``bench_lda``'s news corpus): the distinct
  words of each participant's documents, V_p, as the corpus is split into P
  token-balanced parts (the estimator's split).
- **The synchronization cycle** of one iteration, ``pull_rows(U) ->
  push_rows(U) -> clock()``, in a ``ParameterServer.run`` whose participants
  do nothing else: on an SGD-like table (2^22 x 1 float64, BSP, per-clock
  sums) and an LDA-like one ((V + 1) x K int32 under SSP(2) with refresh,
  the K topic totals its last row, pulled and pushed with the word rows as
  the Gibbs participant does). Per
  cycle: the wall time in the participant (median, P = 2: the latency the
  model uses here), the participant thread's CPU, the CPU of every worker
  process per participant (its calls plus its share of serving the others:
  thread_time / process_time, load-robust) and the scheduler's CPU per clock.
  A run of 24 cycles minus a run of 2 removes the run's start and end
  (and the idle processes' CPU, measured over 3 s, is subtracted). Fitted:
  worker CPU per cycle = a + b * bytes + c * messages (messages = one per
  server per pull and per push, so 2P; bytes = U rows x (4-byte index +
  value)).
- **Compute**, CPU seconds: SGD from the fits of the smallest cluster
  (P = 2; ``scaling_sgd``: the estimator's rounds, trained in place)
  (``metrics_``: the participant thread's ``cpu_seconds`` minus its calls'
  CPU from the cycle, and the background thread's
  ``round_prep_cpu_seconds``), fitted as a constant a run + per epoch per
  non-zero and per touched row of a round; the background thread (round
  features, lazy regularization's counts) once a run, per non-zero and
  per touched row; LDA: the participant's sweep (the
  estimator's sampler, ``dense`` at K < 128) and its row deltas on one
  partition, thread_time per token over the fit's iteration count, in the
  2 worker processes at once.
- **LDA's participants out of step** (P = 2, before each LDA fit): the
  cycle around the participant's real sweep, in step and out of phase (odd
  ranks start half a sweep late, so each sync falls in the peer's sweep,
  as SSP(2) lets a fit's participants drift): the sync's wall less the
  clock's waits, each participant's sweep wall and CPU, and what differs
  between the participants' iterations (``participant_noise``: each one's
  iteration noise and a run-long spread, relative to their mean at each
  iteration, so that load slowing both at once does not count); the core
  share while both workers spin, just before and after each fit.
- **SGD's round around a compute** (P = 2, after the SGD fits;
  ``scaling_sgd.busy_costs``): the participant's round around a compiled
  loop without the GIL as long as an E=1 round's compute: the compute's
  wall against its CPU beyond the core share (the worker serving its peer
  on the same core), the wait for the last push (the barrier) and the
  sync after it, against the cycle alone.
- **Fixed per-fit costs**: a fit of the same width on tiny data (P x 12k
  rows; LDA: P x 150 documents, one iteration) minus its modelled
  iterations: data placement, table creation, run start and end, the final
  model pull; LDA's part that grows with the tokens (starting assignments
  and counts, final pull and likelihood) from a 1-iteration fit on the
  whole corpus. Also printed alone: ``create_table`` + ``drop_table`` of
  2^22 rows, a ``ps.run`` of a function that returns, ``ps.pull`` of the
  2^22-row table.

The model (one participant per worker, one core each; the server's share
runs on the same core):

    SGD round   = s k + b L + w            k: compute CPU (in place: the round's non-zeros
                                               and touched rows), L: the cycle's wall time;
                                               s, b, w: beside a compute (serving, sync, barrier)
    first round = max(s k + b L, s k + q + C) + w   q: the background thread's CPU (once a
                                               run), C: the cycle's worker CPU
    SGD fit     = F + c0 + sum over epochs of the schedule's rounds
    LDA iter    = ssp_period(sweep + deltas + busy x L, noise, SSP(2))
    LDA fit     = F(tokens) + iterations x LDA iter

``ssp_period`` simulates the clock's staleness rule (a participant more
than 2 clocks ahead of the slowest waits) for participants whose
iterations vary (CV) and who may differ for a whole run (spread): at P = 2
here both measured (the shared cores); on P machines a round's jitter (CV
``--jitter``), equal work. ``busy``: the out-of-phase cycle's sync against
the cycle alone.

On P workers over a network, L(P, U) = L(2, U) (measured, loopback) +
[C(P, U) - C(2, U)] (the messages that grow with P) + hops x RTT + bytes per
worker / bandwidth + scheduler CPU x P clocks (one scheduler serves them
all, in turn) + a BSP barrier for SGD (expected maximum of P round times with a
stated jitter, minus that of 2; LDA: the SSP wait above). Efficiency = T1 / (P x T_P), T1 the same
work on one worker without the parameter server (compute and fixed costs
only): strong scaling (the data fixed) and weak scaling (each worker's data
fixed at the 2-worker share).

    python benchmarks/scaling_model.py                 # ~10 minutes on 2 shared cores
    python benchmarks/scaling_model.py --quick         # ~4 minutes: smaller data, fewer cycles
    python benchmarks/scaling_model.py --sgd-n 1000000 --lda-iters 100   # bench_sgd --full's ctr size
    python benchmarks/scaling_model.py --from-json scaling.json          # table and plot again
    python benchmarks/scaling_model.py --workers 4 8 --json p48.json     # P = 4, 8 apart (CPU constants) ...
    python benchmarks/scaling_model.py --workers 2 --json p2.json        # ... and P = 2 on a quiet machine
    python benchmarks/scaling_model.py --from-json p2.json p48.json

Prints the measured constants, predicted against measured 2-worker fit times
(SGD click-through ``max_iter`` = 1 and 2; LDA K=50 on the news corpus) and
the efficiency table; saves the plot (``--plot``, docs/scaling.png) and the
measurements (``--json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time
import warnings

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import scaling_sgd  # noqa: E402

D_SGD = 2**22  # the click-through set's hashed features (bench_sgd --full)
BATCH = 2048  # bench_sgd's batch_size
K_LDA = 50
ALPHA, ETA = 0.1, 0.01
REPS_LONG, REPS_SHORT = 24, 2  # cycles of the long and the short run (their difference: no run start/end)
WORKERS = (1, 2, 4, 8, 16, 32, 64)
NETWORKS = {"10 Gbit/s": 1.25e9, "25 Gbit/s": 3.1e9}
SCHED_MESSAGES = {"sgd": 3, "lda": 1}  # scheduler messages per participant and iteration
LDA_STALENESS = 2  # the LDA estimator's default consistency: SSP(2) with refresh


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load():
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


# --- sparsity, from the data ---------------------------------------------------------------------


def sgd_schedule(n_p, P, config=None):
    """Samples of each round of an epoch of a participant with ``n_p``
    samples among ``P``, as the estimator cuts it (``scaling_sgd.schedule``:
    ``_training._run_config`` itself, ``ps.sgd.clock-samples``,
    ``ps.sgd.min-rounds-per-epoch``)."""
    return scaling_sgd.schedule(n_p, P, BATCH, D_SGD, config)


def touched_rows(X, m, rounds=6, seed=0):
    """Mean distinct rows of the weights table a round of ``m`` samples
    touches (its features and the intercept's row), rounds drawn as the
    fixed sparse rounds are: shuffled blocks of 64 consecutive samples."""
    rng = np.random.default_rng(seed)
    n = X.shape[0]
    m = min(m, n)
    nblocks = -(-n // 64)
    out = []
    for _ in range(rounds):
        blocks = rng.permutation(nblocks)[: -(-m // 64)]
        idx = (blocks[:, None] * 64 + np.arange(64)[None, :]).ravel()
        idx = idx[idx < n][:m]
        cols = np.concatenate([X.indices[X.indptr[i]:X.indptr[i + 1]] for i in np.sort(idx)]) if m < 4096 else \
            X[np.sort(idx)].indices
        out.append(np.unique(cols).size + 1)
    return float(np.mean(out))


def split_corpus(X, P):
    from dask_ps.decomposition._corpus import _split_rows

    return _split_rows(X, P)


def lda_vocab(X, P):
    """Per participant of P: (tokens, distinct words); max and mean over parts."""
    parts = split_corpus(X, P)
    toks = np.array([int(p.sum()) for p in parts])
    vocab = np.array([np.unique(p.indices).size for p in parts])
    return {"tokens_max": int(toks.max()), "tokens_mean": float(toks.mean()), "vocab_max": int(vocab.max()),
            "vocab_mean": float(vocab.mean()), "parts": len(parts)}


# --- the synchronization cycle ------------------------------------------------------------------


def _lda_cycle(ctx, part, *, table, totals, reps):
    """LDA's iteration without the sweep (``_gibbs._iteration``): pull the
    word rows and the totals row (the last of ``rows``; ``totals`` unused),
    push them, ``clock()``; per cycle: wall seconds, the part before the
    push, the thread's CPU seconds."""
    rows, width = part["rows"], part["width"]
    vals = np.ones((rows.size, width), dtype=np.int32)
    out = []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        ctx.pull_rows(table, rows)
        w1 = time.perf_counter()
        ctx.push_rows(table, rows, vals, copy=False)
        ctx.clock()
        out.append((time.perf_counter() - w0, w1 - w0, time.thread_time() - c0))
    return out


def _lda_bsp_cycle(ctx, part, *, table, totals, reps):
    """The seeded (BSP) LDA fit's iteration without the sweep: the rows read
    with the clock before (``_gibbs._read_ahead``: the clock's message
    carries it), pushed to a table summed per clock, ``clock()``; per
    cycle as ``_lda_cycle`` (the part before the push: the read's
    ``result()``)."""
    rows, width = part["rows"], part["width"]
    vals = np.ones((rows.size, width), dtype=np.int32)
    ahead = None
    out = []
    for i in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        if ahead is None:
            ctx.pull_rows(table, rows)
        else:
            ahead.result()
        w1 = time.perf_counter()
        ctx.push_rows(table, rows, vals, copy=False)
        ahead = ctx.prefetch_rows(table, rows, for_clock=ctx.current_clock + 1) if i + 1 < reps else None
        ctx.clock()
        out.append((time.perf_counter() - w0, w1 - w0, time.thread_time() - c0))
    return out


def _lda_busy_cycle(ctx, part, *, table, totals, reps, offset=False):
    """LDA's iteration as ``_gibbs._iteration`` does it, on the
    participant's partition: clock 0 pushes the starting counts; then pull
    the word rows and the totals row (the last of ``rows``; ``totals``
    unused), copy them, sweep the pulled rows (the
    estimator's kernel), the changed rows' deltas, push them, ``clock()``.
    So that the others' requests may find this worker's core busy.
    ``offset``: the odd ranks first sweep half their documents, so that
    each participant's sync falls in its peer's sweep, as in a fit whose
    participants are not in step (SSP(2) lets them drift apart).

    Per cycle: the pull/push/clock wall less the clock's wait for the
    slowest (the sweep, the copies and the deltas excluded: the model's
    compute), the pull's wall, the sweep's wall, the clock's wait, the
    sweep's thread CPU."""
    from dask_ps.decomposition import _lda_kernels as kk

    rows, width = part["rows"], part["width"]
    words, doc_ptr = part["words"], part["doc_ptr"]
    z = np.random.default_rng(ctx.rank).integers(width, size=words.size, dtype=np.int32)
    ndk = np.zeros((doc_ptr.size - 1, width), np.int32)
    counts = np.zeros((rows.size, width), np.int32)  # the word rows, then the totals row
    nk = np.zeros(width, np.int64)
    kk.init_counts(doc_ptr, words, z, ndk, counts[:-1], nk)
    counts[-1] = nk
    sweep = kk.SWEEPS["dense" if width < 128 else "sparse"]
    ctx.push_rows(table, rows, counts, copy=False)
    ctx.clock()
    nwk = counts[:-1]
    if offset and ctx.rank % 2:
        sweep(doc_ptr[: (doc_ptr.size + 1) // 2], words, z, ndk, nwk, nk, ALPHA, ETA, part["vbeta"], 0)
    out = []
    for it in range(reps):
        w0 = time.perf_counter()
        counts = ctx.pull_rows(table, rows)
        nwk, nk = counts[:-1], counts[-1].astype(np.int64)
        w1 = time.perf_counter()
        counts_before = counts.copy()
        c1, s1 = time.thread_time(), time.perf_counter()
        sweep(doc_ptr, words, z, ndk, nwk, nk, ALPHA, ETA, part["vbeta"], it)
        c2, w2 = time.thread_time(), time.perf_counter()
        counts[-1] = nk
        changed, delta = kk.changed_rows(counts, counts_before)
        w3 = time.perf_counter()
        if changed.size:
            ctx.push_rows(table, rows[changed], delta, copy=False)
        waited = ctx.metrics()["clock_wait_seconds"]
        ctx.clock()
        waited = ctx.metrics()["clock_wait_seconds"] - waited
        w4 = time.perf_counter()
        out.append(((w1 - w0) + (w4 - w3) - waited, w1 - w0, w2 - s1, waited, c2 - c1))
    return out


def lda_busy_costs(ps, X_lda, P, reps=12, offset=False):
    """``_lda_busy_cycle`` on the estimator's split of the corpus: the
    sync's wall when the peers are sweeping (medians of the cycles after
    the first two), and per participant the sweep's mean wall and CPU and
    the spread of its iterations (what the SSP wait of a fit comes from)."""
    import dask_ps

    # As the estimator keeps them: the topic totals are the table's last row (V).
    table, V = "scaling-lda-busy", X_lda.shape[1]
    ps.create_table(table, (V + 1, K_LDA), dtype="int32", consistency=dask_ps.SSP(LDA_STALENESS, refresh=True))
    try:
        parts = []
        for p in split_corpus(X_lda, P):
            vocab, local = np.unique(p.indices, return_inverse=True)
            doc_len = np.asarray(p.sum(1)).ravel()
            parts.append({"rows": np.append(vocab, V).astype(np.int64), "width": K_LDA, "vbeta": V * ETA,
                          "words": np.repeat(local, p.data).astype(np.int32),
                          "doc_ptr": np.concatenate([[0], np.cumsum(doc_len)]).astype(np.int64)})
        res = ps.run(_lda_busy_cycle, parts, table=table, totals=None, reps=reps, offset=offset)
    finally:
        ps.drop_table(table)
    per = [np.array(r[2:]) for r in res]  # per participant, the first two cycles left out (warm-up)
    cycles = np.concatenate(per)
    # a participant's iteration without waits: its sweep and its sync
    work = np.array([c[:, 0] + c[:, 2] for c in per])
    cv, spread2 = participant_noise(work)
    return {"sync_wall": float(np.median(cycles[:, 0])), "pull_wall": float(np.median(cycles[:, 1])),
            "sweep_wall": float(np.median(cycles[:, 2])), "clock_wait": float(np.mean(cycles[:, 3])),
            "sweep_walls": [float(np.mean(c[:, 2])) for c in per],
            "sweep_cpus": [float(np.mean(c[:, 4])) for c in per], "work": work.tolist(),
            "iteration_cv": cv, "spread2": spread2, "offset": offset, "U": int(max(p["rows"].size for p in parts))}


def participant_noise(work):
    """What differs between participants in ``work`` (P x n seconds: each
    one's iterations without waits, the same n iterations), relative to
    their mean at each iteration (load that slows all of them at once makes
    none wait): the CV of a participant's own iteration noise (about its
    own mean; measured against the P participants' mean it shows (P - 1) /
    P of its variance), and the variance of those means less what that
    noise leaves in a mean of n (an estimate of the square of a run-long
    spread's CV; may be < 0)."""
    x = np.asarray(work, float)
    x = x / x.mean(axis=0, keepdims=True)
    P, n = x.shape
    cv = float(np.sqrt(np.mean(np.var(x, axis=1, ddof=1)) * P / (P - 1)))
    return cv, float(np.var(x.mean(axis=1), ddof=1) - cv ** 2 / n)


def _sgd_cycle(ctx, part, *, table, totals, reps):
    """The SGD participant's round without the kernel
    (``_participant._Participant.round``/``sync_round``, ``ps.sgd.overlap``):
    the next round's read started for the next clock, the round's push and
    its stats row, ``clock(wait=False)``, then the read's result; per cycle
    (one result to the next): wall seconds, the read's wait, thread CPU."""
    rows = part["rows"]
    vals = np.full((rows.size, 1), 1e-6)
    srow = np.zeros((1, 8))
    where = np.array([ctx.rank])
    ctx.pull_rows(table, rows)
    t_prev, c_prev = time.perf_counter(), time.thread_time()
    out = []
    for _ in range(reps):
        handle = ctx.prefetch_rows(table, rows, for_clock=ctx.current_clock + 1)
        ctx.push_rows(table, rows, vals)
        ctx.push_rows(totals, where, srow)
        ctx.clock(wait=False)
        w1 = time.perf_counter()
        handle.result()
        t, c = time.perf_counter(), time.thread_time()
        out.append((t - t_prev, t - w1, c - c_prev))
        t_prev, c_prev = t, c
    ctx.clock()
    return out


def _clock_cycle(ctx, part, *, reps):
    """``clock()`` alone (no table read: no wait for the others), ``reps``
    times: the scheduler clock round trip; median wall seconds."""
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        ctx.clock()
        out.append(time.perf_counter() - t)
    return float(np.median(out))


def clock_costs(client, ps, P, reps=(20, 220)):
    """The clock RPC: wall per call in a participant (median) and this
    process's CPU (the scheduler's) per clock message, from a long and a
    short run of P participants."""
    idle_w, idle_s = idle_rates(client, 2.0)
    got = {}
    for n in reps:
        w0, s0 = process_cpu(client)
        t = time.perf_counter()
        res = ps.run(_clock_cycle, list(range(P)), reps=n)
        t = time.perf_counter() - t
        w1, s1 = process_cpu(client)
        got[n] = (s1 - s0 - idle_s * t, res, w1 - w0 - idle_w * t)
    n = (reps[1] - reps[0]) * P
    return {"wall": float(np.median(got[reps[1]][1])),
            "sched_cpu": max(0.0, (got[reps[1]][0] - got[reps[0]][0]) / n),
            "worker_cpu": max(0.0, (got[reps[1]][2] - got[reps[0]][2]) / n)}


def _spin(seconds=1.0):
    """The share of a core this thread got while it tried to use one."""
    w0, c0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() - w0 < seconds:
        sum(range(2000))
    return (time.thread_time() - c0) / (time.perf_counter() - w0)


def cpu_share(client):
    """Mean share of a core each worker's thread gets while every worker
    spins at once: 1 on a quiet machine with a core per worker; under
    other load, what stretches the compute's CPU seconds into wall time."""
    return float(np.mean(list(client.run(_spin).values())))


def _noop(ctx, part):
    return part


def process_cpu(client):
    """CPU seconds of the worker processes (sum) and of this process (the
    client and the LocalCluster's scheduler)."""
    times = client.run(time.process_time)
    return sum(times.values()), time.process_time()


def idle_rates(client, seconds=3.0):
    """CPU seconds per second of the idle worker processes (sum) and of
    this process (heartbeats, the dashboard's sampling, liveness beacons):
    subtracted from the cycles' CPU."""
    w0, s0 = process_cpu(client)
    t = time.perf_counter()
    time.sleep(seconds)
    w1, s1 = process_cpu(client)
    t = time.perf_counter() - t
    return (w1 - w0) / t, (s1 - s0) / t


def cycle_costs(client, ps, P, workload, sizes, rng):
    """The cycle of ``workload`` ("sgd", "lda" or "lda-bsp") at ``U`` rows per
    participant for each U of ``sizes``: per cycle wall (median), the
    participant thread's CPU, worker CPU per participant, scheduler CPU."""
    import dask_ps

    table, totals = f"scaling-{workload}", f"scaling-{workload}-totals"
    if workload == "sgd":  # as linear_model._training._create_tables under BSP
        n_rows, width, dtype, fn = D_SGD + 1, 1, "float64", _sgd_cycle
        ps.create_table(table, (n_rows, width), dtype=dtype, consistency=dask_ps.BSP(), aggregate="clock")
        ps.create_table(totals, (P, 8), dtype="float64", consistency=dask_ps.SSP(0), aggregate="clock")
    elif workload == "lda-bsp":  # as decomposition._runs under BSP (seeded): summed per clock, read ahead
        n_rows, width, dtype, fn = sizes["V"], K_LDA, "int32", _lda_bsp_cycle
        ps.create_table(table, (n_rows + 1, width), dtype=dtype, consistency=dask_ps.BSP(), aggregate="clock")
        totals = None
    else:  # as decomposition._runs under the estimator's default SSP(2) with refresh: the totals the last row
        n_rows, width, dtype, fn = sizes["V"], K_LDA, "int32", _lda_cycle
        ps.create_table(table, (n_rows + 1, width), dtype=dtype,
                        consistency=dask_ps.SSP(LDA_STALENESS, refresh=True))
        totals = None
    idle_w, idle_s = idle_rates(client)
    rows_out = []
    try:
        for U in sizes["U"]:
            U = int(min(U, n_rows))
            rows = [np.sort(rng.choice(n_rows, U, replace=False)).astype(np.int64) for _ in range(P)]
            if totals is None:
                rows = [np.append(r, n_rows) for r in rows]
            parts = [{"rows": r, "width": width, "dtype": dtype} for r in rows]
            ps.run(fn, parts, table=table, totals=totals, reps=REPS_SHORT)  # warm: cache, pools
            got = {}
            for reps in (REPS_SHORT, REPS_LONG):
                w0, s0 = process_cpu(client)
                t = time.perf_counter()
                res = ps.run(fn, parts, table=table, totals=totals, reps=reps)
                t = time.perf_counter() - t
                w1, s1 = process_cpu(client)
                got[reps] = (w1 - w0 - idle_w * t, s1 - s0 - idle_s * t, res)
            n = REPS_LONG - REPS_SHORT
            res = got[REPS_LONG][2]
            cycles = np.array([c for r in res for c in r[2:]])  # the first two cycles: warm-up
            row = {
                "P": P, "U": U, "width": width, "itemsize": np.dtype(dtype).itemsize,
                "wall": float(np.median(cycles[:, 0])),
                "wall_pull": float(np.median(cycles[:, 1])),
                "thread_cpu": float(np.median(cycles[:, 2])),
                "worker_cpu": max(0.0, (got[REPS_LONG][0] - got[REPS_SHORT][0]) / (n * P)),
                "sched_cpu": max(0.0, (got[REPS_LONG][1] - got[REPS_SHORT][1]) / n),
            }
            rows_out.append(row)
            log(f"  cycle {workload} P={P} U={U}: wall {row['wall'] * 1e3:.2f} ms (pull {row['wall_pull'] * 1e3:.2f}), "
                f"thread CPU {row['thread_cpu'] * 1e3:.2f} ms, worker CPU {row['worker_cpu'] * 1e3:.2f} ms, "
                f"scheduler CPU {row['sched_cpu'] * 1e3:.2f} ms per cycle")
    finally:
        ps.drop_table(table)
        if totals is not None:
            ps.drop_table(totals)
    return rows_out


def fixed_costs(client, ps):
    """Walls of the parameter server's per-fit operations alone."""
    out = {}
    t = time.perf_counter()
    ps.create_table("scaling-fixed", (D_SGD + 1, 1), dtype="float64")
    out["create_table"] = time.perf_counter() - t
    t = time.perf_counter()
    ps.pull("scaling-fixed")
    out["pull_table"] = time.perf_counter() - t
    t = time.perf_counter()
    ps.drop_table("scaling-fixed")
    out["drop_table"] = time.perf_counter() - t
    P = len(ps.servers)
    ps.run(_noop, list(range(P)))
    t = time.perf_counter()
    ps.run(_noop, list(range(P)))
    out["run_noop"] = time.perf_counter() - t
    return out


# --- the fits --------------------------------------------------------------------------------------


def sgd_fit(client, X, y, E, P):
    from bench_sgd import spread_blocks

    from dask_ps.linear_model import SGDClassifier

    client.wait_for_workers(P, timeout=120)  # a worker restarted under load: back before the blocks go out
    for _ in range(60):  # oversubscribed under load, the scheduler's worker list was seen empty a moment
        if client.scheduler_info()["workers"]:
            break
        time.sleep(1.0)
    dX, dy = spread_blocks(client, X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w0, s0 = process_cpu(client)
        t = time.perf_counter()
        m = SGDClassifier(loss="log_loss", alpha=1e-6, max_iter=E, tol=None, random_state=0, batch_size=BATCH,
                          client=client).fit(dX, dy)
        wall = time.perf_counter() - t
        w1, s1 = process_cpu(client)
    parts = []
    for mt in m.metrics_:
        parts.append({k: mt.get(k) for k in ("cpu_seconds", "round_prep_cpu_seconds", "setup_seconds",
                                              "kernel_seconds", "round_prep_seconds", "ps_seconds", "samples",
                                              "seconds", "ps_seconds_by_call")})
    return {"E": E, "wall": wall, "participants": parts, "profile": dict(getattr(m, "_fit_profile", {}) or {}),
            "worker_cpu": w1 - w0, "client_cpu": s1 - s0}


def median_fit(fits):
    """The fit of median wall time (of an odd count; the lower middle of an
    even one), with every wall time in ``walls``."""
    fits = sorted(fits, key=lambda f: f["wall"])
    out = dict(fits[(len(fits) - 1) // 2])
    out["walls"] = [f["wall"] for f in fits]
    return out


def lda_fit(client, X, iters, n_partitions=None):
    from dask_ps.decomposition import LatentDirichletAllocation

    # one participant a worker, as the model assumes (a small corpus would get one by default:
    # ps.lda.min-tokens-per-participant); ``n_partitions``: one a worker thread, say
    m = LatentDirichletAllocation(K_LDA, doc_topic_prior=ALPHA, topic_word_prior=ETA, max_iter=iters,
                                  evaluate_every=0, client=client, random_state=0,
                                  n_partitions=n_partitions or len(client.scheduler_info()["workers"]))
    w0, s0 = process_cpu(client)
    t = time.perf_counter()
    m.fit(X)
    wall = time.perf_counter() - t
    w1, s1 = process_cpu(client)
    keys = ("sweep_seconds", "sweeps", "pull_seconds", "push_seconds", "clock_seconds", "clock_wait_seconds",
            "n_tokens")
    return {"iters": iters, "wall": wall, "fit_seconds": m.fit_seconds_, "worker_cpu": w1 - w0,
            "client_cpu": s1 - s0,
            "participants": [{k: mt.get(k) for k in keys} for mt in m.metrics_]}


def lda_compute(part, n_features, iters=4):
    """Thread CPU per token of one partition's ``iters`` sweeps from a
    random start (the estimator's sampler at K=50: dense; a sweep gets
    cheaper as the topics concentrate, so the fit's iteration count) and per
    row of its row deltas (compare the rows, ``_gibbs._iteration``)."""
    from dask_ps.decomposition import _lda_kernels as kk

    vocab, local = np.unique(part.indices, return_inverse=True)
    doc_len = np.asarray(part.sum(1)).ravel()
    doc_ptr = np.concatenate([[0], np.cumsum(doc_len)]).astype(np.int64)
    words = np.repeat(local, part.data).astype(np.int32)
    n, V = words.size, vocab.size
    z = np.random.default_rng(0).integers(K_LDA, size=n, dtype=np.int32)
    ndk = np.zeros((part.shape[0], K_LDA), np.int32)
    nwk = np.zeros((V, K_LDA), np.int32)
    nk = np.zeros(K_LDA, np.int64)
    kk.init_counts(doc_ptr, words, z, ndk, nwk, nk)
    sweep = kk.SWEEPS["dense" if K_LDA < 128 else "sparse"]
    vbeta = n_features * ETA
    sweep(doc_ptr[:2], words, z.copy(), ndk.copy(), nwk.copy(), nk.copy(), ALPHA, ETA, vbeta, 0)  # compile
    t_sweep = t_delta = 0.0
    for it in range(iters):
        c0 = time.thread_time()
        before = nwk.copy()
        c1 = time.thread_time()
        sweep(doc_ptr, words, z, ndk, nwk, nk, ALPHA, ETA, vbeta, it)
        c2 = time.thread_time()
        delta = nwk - before
        changed = np.flatnonzero(delta.any(axis=1))
        delta = delta[changed]
        c3 = time.thread_time()
        t_sweep += c2 - c1
        t_delta += (c1 - c0) + (c3 - c2)
    return {"tokens": n, "vocab": V, "sweep_per_token": t_sweep / (iters * n),
            "delta_per_row": t_delta / (iters * V), "changed_rows": int(changed.size)}


# --- one cluster size ----------------------------------------------------------------------------


def measure_at(P, args, X_sgd, y_sgd, X_lda, rng):
    from distributed import Client, LocalCluster

    import dask_ps
    from dask_ps.decomposition import LatentDirichletAllocation
    from dask_ps.linear_model import SGDClassifier

    out = {"P": P, "load_start": load()}
    log(f"P={P}: starting {P} worker processes (load {load()})")
    with LocalCluster(n_workers=P, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(P)
        ps = dask_ps.ParameterServer(client)
        ps.wait_for_servers(P)
        # Warm up: plugins, imports and the compiled kernels on every worker.
        from bench_sgd import ctr_data

        Xw, yw = ctr_data(P * 3000, D_SGD, seed=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            SGDClassifier(loss="log_loss", alpha=1e-6, max_iter=2, tol=None, client=client).fit(Xw, yw)
        # ... and a one-epoch fit of many rounds (rounds not kept: another path of the round preparation,
        # whose compiled specializations load at their first use; CPU seconds that once landed in the first
        # measured E=1 fit)
        sgd_fit(client, X_sgd[: P * 50_000], y_sgd[: P * 50_000], 1, P)
        LatentDirichletAllocation(K_LDA, max_iter=2, client=client, random_state=0).fit(X_lda[:200])
        out["idle"] = idle_rates(client)  # the worker processes' and this process's CPU per second, idle
        out["fixed_ops"] = fixed_costs(client, ps)
        log(f"P={P}: fixed operations {json.dumps({k: round(v, 3) for k, v in out['fixed_ops'].items()})}")
        out["cycles"] = {
            "sgd": cycle_costs(client, ps, P, "sgd", {"U": args.sgd_u}, rng),
            "lda": cycle_costs(client, ps, P, "lda", {"U": [min(u, X_lda.shape[1]) for u in args.lda_u],
                                                       "V": X_lda.shape[1]}, rng),
        }
        out["clock"] = clock_costs(client, ps, P)
        log(f"P={P}: clock round trip {out['clock']['wall'] * 1e6:.0f} us, scheduler CPU "
            f"{out['clock']['sched_cpu'] * 1e6:.0f} us per clock message")
        # Fixed per-fit costs: the same fits on tiny data.
        Xt, yt = X_sgd[: P * 12_000], y_sgd[: P * 12_000]
        sgd_fit(client, Xt, yt, 1, P)
        out["sgd_tiny"] = median_fit([sgd_fit(client, Xt, yt, 1, P) for _ in range(3)])
        out["sgd_tiny"]["n"] = Xt.shape[0]
        out["sgd_tiny"]["nnz"] = int(Xt.nnz)
        Xl = X_lda[: P * 150]
        out["lda_tiny"] = median_fit([lda_fit(client, Xl, 1) for _ in range(3)])
        out["lda_tiny"]["docs"] = Xl.shape[0]
        log(f"P={P}: tiny fits: SGD {out['sgd_tiny']['wall']:.2f} s, LDA {out['lda_tiny']['wall']:.2f} s")
        # The fits: SGD max_iter = 1 and 2 (P = 2: the figures predicted;
        # P = 4, 8: the compute constants), LDA at P = 2.
        # P = 2: the core share just before and after each fit (the fits' predictions "here" use their mean)
        share = out["cpu_share"] = cpu_share(client)
        out["sgd"] = []
        for E in args.sgd_epochs:
            fits = []
            for _ in range(args.repeats if P == 2 else 1):
                fits.append(sgd_fit(client, X_sgd, y_sgd, E, P))
                if P == 2:
                    fits[-1]["share_before"], share = share, cpu_share(client)
                    fits[-1]["share_after"] = share
            r = median_fit(fits)
            r["fits"] = [{k: f[k] for k in ("wall", "share_before", "share_after") if k in f} for f in fits]
            out["sgd"].append(r)
            log(f"P={P}: SGD ctr {X_sgd.shape[0]} rows E={E}: {r['wall']:.2f} s; per participant thread CPU "
                + " ".join(f"{p['cpu_seconds']:.2f}" for p in r["participants"]) + ", round-prep thread CPU "
                + " ".join(f"{p['round_prep_cpu_seconds']:.2f}" for p in r["participants"]))
        if P == min(args.workers):
            # The SGD round around a compute as long as the E=1 fit's (its thread CPU a round, less the
            # cycle's), at the default round's rows: what one core per worker does beside the compute
            rounds = sgd_schedule(X_sgd.shape[0] // P, P)
            cyc = min(out["cycles"]["sgd"], key=lambda r: abs(r["U"] - 30_000))
            cpu = float(np.median([p["cpu_seconds"] / len(rounds) for p in out["sgd"][0]["participants"]])) \
                - cyc["thread_cpu"]
            out["sgd_busy"] = b = scaling_sgd.busy_costs(ps, P, touched_rows(X_sgd, int(rounds.max())),
                                                         max(cpu, 1e-3), D_SGD)
            log(f"P={P}: SGD round around a compute of {b['cpu'] * 1e3:.1f} ms CPU, {b['U']} rows: compute wall / CPU "
                f"{b['stretch']:.2f} (alone {b['alone_stretch']:.2f}), the wait for the last push "
                f"{b['barrier'] * 1e3:.1f} ms, then the sync {b['sync_net'] * 1e3:.1f} ms (alone "
                f"{b['alone_sync'] * 1e3:.1f} ms)")
        # Other round sizes at the same non-zeros: what separates the compute per non-zero from the
        # compute per touched row (both fall with P at the default rounds); at the smallest P only, whose
        # fits calibrate the compute (scaling_sgd: oversubscribed, these loops' CPU stretches)
        out["sgd_rounds"] = []
        if P == min(args.workers):
            import dask

            # Both minimums: BSP (these fits) reads ps.sgd.bsp-min-rounds-per-epoch, the others the other.
            for config in ({"ps.sgd.min-rounds-per-epoch": 32, "ps.sgd.bsp-min-rounds-per-epoch": 32},
                           {"ps.sgd.min-rounds-per-epoch": 2, "ps.sgd.bsp-min-rounds-per-epoch": 2,
                            "ps.sgd.clock-samples": 262_144}):
                with dask.config.set(config):
                    r = sgd_fit(client, X_sgd, y_sgd, 1, P)
                r["config"] = config
                out["sgd_rounds"].append(r)
                rounds = sgd_schedule(X_sgd.shape[0] // P, P, config)
                log(f"P={P}: SGD E=1 with {config}: {len(rounds)} rounds of up to {rounds.max()} samples; "
                    f"thread CPU " + " ".join(f"{p['cpu_seconds']:.2f}" for p in r["participants"])
                    + ", round-prep thread CPU "
                    + " ".join(f"{p['round_prep_cpu_seconds']:.2f}" for p in r["participants"]))
        out["cpu_share"] = min(out["cpu_share"], cpu_share(client))
        log(f"P={P}: a worker thread's share of a core while all spin: {out['cpu_share']:.2f}")
        if P == 2:
            # The sweep's CPU in the worker processes, both at once (as in the fit: the cores' contention)
            got = client.run(lda_compute, split_corpus(X_lda, 2)[0], X_lda.shape[1], args.lda_iters)
            out["lda_compute"] = {k: float(np.mean([g[k] for g in got.values()])) for k in next(iter(got.values()))}
            log(f"P={P}: LDA sweep in the workers {out['lda_compute']['sweep_per_token'] * 1e9:.0f} ns/token "
                f"(this process: {args.lda_compute_here['sweep_per_token'] * 1e9:.0f})")
            # Each LDA fit between two cycles around the real sweep (in step, then out of phase: each
            # participant's sync in its peer's sweep) and core shares, all under the fit's load.
            out["lda_fits"] = []
            for _ in range(args.repeats):
                got = {"busy_in_step": lda_busy_costs(ps, X_lda, P),
                       "busy": lda_busy_costs(ps, X_lda, P, reps=16, offset=True), "share_before": cpu_share(client)}
                got.update(lda_fit(client, X_lda, args.lda_iters))
                got["share_after"] = cpu_share(client)
                out["lda_fits"].append(got)
                b, i = got["busy"], got["busy_in_step"]
                log(f"P={P}: LDA cycle around the real sweep, {b['U']} rows: sync {i['sync_wall'] * 1e3:.1f} ms in "
                    f"step, {b['sync_wall'] * 1e3:.1f} ms out of phase (clock wait {b['clock_wait'] * 1e3:.1f} ms), "
                    f"sweep wall " + " ".join(f"{w * 1e3:.0f}" for w in b["sweep_walls"]) + " ms, CPU "
                    + " ".join(f"{w * 1e3:.0f}" for w in b["sweep_cpus"]) + f" ms, iteration CV "
                    f"{b['iteration_cv']:.2f}, run-long spread^2 {b['spread2']:+.4f} (in step {i['spread2']:+.4f}); "
                    f"core share {got['share_before']:.2f} / {got['share_after']:.2f}")
                log(f"P={P}: LDA {args.lda_iters} iterations: {got['wall']:.2f} s (sweep "
                    + " ".join(f"{p['sweep_seconds']:.2f}" for p in got["participants"]) + " s, clock wait "
                    + " ".join(f"{p['clock_wait_seconds']:.2f}" for p in got["participants"]) + f" s; load {load()})")
            out["lda"] = median_fit(out["lda_fits"])
            # The per-fit cost that grows with the data (starting assignments and counts pushed, the
            # final pull and likelihood): one iteration on the whole corpus
            out["lda_one"] = median_fit([lda_fit(client, X_lda, 1) for _ in range(3)])
            out["lda_one"]["share"] = cpu_share(client)
            log(f"P={P}: LDA 1 iteration: {out['lda_one']['wall']:.2f} s")
    out["load_end"] = load()
    return out


# --- the model -----------------------------------------------------------------------------------


def ssp_period(means, cv, staleness, iters, spread=0.0, reps=400, seed=0, _cache={}):
    """Expected seconds per iteration of participants under SSP(``staleness``)
    (0: BSP), participant p's iterations taking ``means[p] x f_p x (1 + cv
    x N(0, 1))`` seconds apart from waits, over ``iters`` iterations; f_p,
    drawn once a run, is 1 + ``spread`` x N(0, 1): a participant slower
    for the whole run (a core shared with more of other load).

    As ``Session.clock``: p reports clock c when its iteration c is done
    and, when c > staleness, returns only once every participant reported
    clock c - staleness; its next iteration starts then. The run ends when
    the last participant's last clock returns. Equal means and ``cv`` = 0
    give the mean (no wait); a systematic spread gives the slowest's mean
    (the others wait for it); noise adds, per iteration, the expected
    maximum over P of the noise averaged over about ``staleness`` + 1
    iterations (BSP: of one)."""
    means = np.asarray(means, float)
    scale = float(means.mean()) if means.size else 0.0
    if scale <= 0.0 or means.size == 1 or (cv <= 0 and spread <= 0 and np.all(means == means[0])):
        return float(means.max()) if means.size else 0.0
    key = (tuple(np.round(means / scale, 6)), round(float(cv), 6), round(float(spread), 6), int(staleness),
           int(iters), reps, seed)
    if key not in _cache:
        rng = np.random.default_rng(seed)
        rel = means / scale * np.maximum(0.0, 1.0 + spread * rng.standard_normal((reps, means.size)))
        reported = []  # per clock: (reps, P) times the clock was reported
        done = np.zeros((reps, means.size))
        for c in range(1, iters + 1):
            work = rel * np.maximum(0.0, 1.0 + cv * rng.standard_normal((reps, means.size)))
            reported.append(done + work)
            done = reported[-1]
            if c > staleness:
                done = np.maximum(done, reported[c - 1 - staleness].max(axis=1, keepdims=True))
        _cache[key] = float(done.max(axis=1).mean()) / iters
    return _cache[key] * scale


def lstsq(A, b):
    """Non-negative least squares (every constant of the model is a cost)."""
    from scipy.optimize import nnls

    A, b = np.asarray(A, float), np.asarray(b, float)
    scale = np.maximum(np.abs(A).max(axis=0), 1e-300)  # columns of very different magnitudes
    coef, _ = nnls(A / scale, b)
    return coef / scale


class Model:
    """The fitted constants and the predictions (see the module docstring)."""

    # What-if knobs (``what_must_change``): SGD round samples (None: the
    # estimator's schedule), sync overlapped with compute (a read a round
    # ahead that need not wait for the others: SSP >= 1), factors on the
    # per-message CPU, on the scheduler's clock messages and on the bytes.
    KNOBS = {"round_factor": 1.0, "overlap": False, "per_message": 1.0, "scheduler": 1.0, "bytes": 1.0,
             "latency": 1.0, "row_cpu": 1.0,
             "barrier": 1.0}

    def __init__(self, meas, rtt=50e-6, hops=4, jitter=0.05, **knobs):
        self.m = meas
        self.rtt, self.hops, self.jitter = rtt, hops, jitter
        self.knobs = dict(self.KNOBS, **knobs)
        self.share = 1.0  # predictions "here": the CPU seconds divided by the core share measured
        by_p = {r["P"]: r for r in meas["clusters"]}
        self.by_p = by_p
        self.fit_cycles()
        # LDA's participants are not in step (SSP(2)): a request finds the peer's core sweeping. The factor
        # by which that stretches the cycle: LDA's iteration around the real sweep out of phase (before each
        # 2-worker fit) against the cycle alone (median; 1 where not measured).
        self.lda_fits = next((c["lda_fits"] for c in meas["clusters"] if c.get("lda_fits")), [])
        self.lda_busy = max(1.0, float(np.median([f["busy"]["sync_wall"] / self.wall2("lda", f["busy"]["U"])
                                                  for f in self.lda_fits]))) if self.lda_fits else 1.0
        self.lda_spread = self.participant_spread()
        self.fit_sgd_compute()
        # SGD's round around a compute (P = 2, after the fits; scaling_sgd.busy_costs): the compute's wall
        # stretched by the worker's serving on its core, and the sync beside it (from the last participant's
        # push: the wait for it, the barrier, is the participants' differing compute, a share of the
        # compute's wall here; on P machines the jitter's); 1 and 0 where not measured
        self.sgd_busy = self.by_p[self.sgd_compute_P].get("sgd_busy")
        self.sgd_serving, self.sgd_sync_busy, self.sgd_barrier_here = 1.0, 1.0, 0.0
        if self.sgd_busy:
            b = self.sgd_busy
            self.sgd_serving = max(1.0, b["serving"])
            self.sgd_sync_busy = b["sync_ratio"]
            self.sgd_barrier_here = b["barrier_share"]
        # LDA compute: measured in the 2 worker processes at once where there (the fit's contention)
        self.lda = next((c["lda_compute"] for c in meas["clusters"] if "lda_compute" in c), meas["lda_compute"])
        self.fit_fixed()

    def participant_spread(self):
        """The CV of a participant's run-long slowness against its peers'
        on the shared cores here (``participant_noise``), pooled over the
        cycles around the real sweep (in step and out of phase, before
        every 2-worker LDA fit); 0 where not measured."""
        samples = [b["spread2"] for f in self.lda_fits for b in (f["busy"], f["busy_in_step"])]
        return math.sqrt(max(0.0, float(np.mean(samples)))) if samples else 0.0

    # cycles: C(P, U) = a + b * bytes + c * messages; L(2, U) = a + b * U
    def fit_cycles(self):
        self.cyc = {}
        for wl in ("sgd", "lda"):
            rows = [r for c in self.m["clusters"] for r in c["cycles"][wl]]
            msgs = np.array([self.messages(wl, r["P"]) for r in rows])
            byts = np.array([self.bytes_per_cycle(wl, r["U"]) for r in rows])
            A = np.c_[np.ones(len(rows)), byts, msgs]
            cpu = lstsq(A, [r["worker_cpu"] for r in rows])
            # the scheduler's CPU per clock message: from the clock-only runs where measured
            clocks = [c["clock"]["sched_cpu"] for c in self.m["clusters"] if "clock" in c]
            sched = float(np.median(clocks)) if clocks else float(np.median([r["sched_cpu"] / r["P"] for r in rows]))
            two = [r for r in rows if r["P"] == min(r["P"] for r in rows)]  # P = 2 where measured
            wall = lstsq(np.c_[np.ones(len(two)), [r["U"] for r in two]], [r["wall"] for r in two])
            thread = lstsq(np.c_[np.ones(len(two)), [r["U"] for r in two]], [r["thread_cpu"] for r in two])
            self.cyc[wl] = {"cpu": cpu, "sched": sched, "wall2": wall, "thread2": thread, "rows": rows}

    @staticmethod
    def row_bytes(wl):
        return 4 + (8 if wl == "sgd" else 4 * K_LDA)  # int32 index on the wire + the row's values

    def bytes_per_cycle(self, wl, U):
        """Bytes a participant's cycle moves (pull request + reply, push)."""
        return U * (4 + 2 * self.row_bytes(wl))

    @staticmethod
    def messages(wl, P):
        """Server messages of one participant's cycle: one per server per
        pull and per push (SGD: the stats row's push too; LDA's totals are
        a row of its table)."""
        return 2 * P + (1 if wl == "sgd" else 0)

    def worker_cpu(self, wl, P, U, knobs=False):
        a, b, c = self.cyc[wl]["cpu"]
        kb = self.knobs if knobs else self.KNOBS
        return a + b * kb["bytes"] * self.bytes_per_cycle(wl, U) + c * kb["per_message"] * self.messages(wl, P)

    def wall2(self, wl, U, knobs=False):
        a, b = self.cyc[wl]["wall2"]
        return (self.knobs["latency"] if knobs else 1.0) * a + b * U

    def thread2(self, wl, U):
        a, b = self.cyc[wl]["thread2"]
        return max(0.0, a + b * U)

    # SGD compute (scaling_sgd): participant thread = c0 + E x (kappa x nnz + rho x rows touched an epoch),
    # less its calls' CPU; background thread (round features, lazy regularization's counts) once a run
    def fit_sgd_compute(self):
        """From the fits of the smallest cluster measured (P = 2 here): the
        default rounds at E = 1 and 2, other round sizes at E = 1, the tiny
        fit (``scaling_sgd.fit_compute``)."""
        n = self.m["sgd_n"]
        nnz_row = self.m["sgd_nnz"] / n
        P = min(self.by_p)
        c = self.by_p[P]
        fits = []
        for fit in c["sgd"] + c.get("sgd_rounds", []) + [c["sgd_tiny"]]:
            n_p = fit["participants"][0]["samples"] / fit["E"]
            fits.append({**fit, "n_p": n_p, "rounds": sgd_schedule(int(n_p), P, fit.get("config")),
                         "nnz_row": fit["nnz"] / fit["n"] if "nnz" in fit else nnz_row})
        self.sgd_c, self.sgd_q, self.sgd_compute_rows = scaling_sgd.fit_compute(
            fits, self.U, lambda u: self.thread2("sgd", u), lstsq)
        self.sgd_compute_P = P

    def sgd_rounds(self, P, n_p, nnz_row, knobs=True):
        """An epoch's rounds of a participant: ``(U, k, q)`` (touched rows
        and compute CPU per round, background CPU of the run), under the
        what-if knobs where ``knobs``."""
        rounds = sgd_schedule(int(n_p), P)
        kb = self.knobs if knobs else self.KNOBS
        if kb["round_factor"] != 1.0 and P > 1:
            rounds = scaling_sgd.rounds_scaled(rounds, kb["round_factor"])
        rc = kb["row_cpu"] if P > 1 else 1.0
        Us, k, q = scaling_sgd.round_costs(rounds, nnz_row, self.U, (self.sgd_c, self.sgd_q), rc)
        return Us, k, q if P > 1 else 0.0  # alone: whole rounds on the CSR, nothing built ahead

    def U(self, m):
        """Touched rows of a round of m samples (interpolated in log-log on the measured curve)."""
        ms = np.array(self.m["sgd_U"]["m"], float)
        us = np.array(self.m["sgd_U"]["U"], float)
        return float(np.exp(np.interp(np.log(max(m, 1)), np.log(ms), np.log(us))))

    def V(self, P):
        ps = np.array(self.m["lda_vocab"]["P"], float)
        vs = np.array(self.m["lda_vocab"]["vocab_max"], float)
        return float(np.exp(np.interp(np.log(P), np.log(ps), np.log(vs))))

    # fixed per-fit costs F(P) = f0 + f1 * P from the tiny fits minus their modelled iterations
    def fit_fixed(self):
        self.fixed = {}
        for wl in ("sgd", "lda"):
            Ps, Fs = [], []
            for P, c in self.by_p.items():
                tiny = c[f"{wl}_tiny"]
                if wl == "sgd":
                    n_p = tiny["n"] // P
                    it = self.sgd_iterations(P, n_p, tiny["nnz"] / tiny["n"], 1, here=True, fixed=False)
                else:
                    tokens = sum(p["n_tokens"] for p in tiny["participants"]) / P
                    it = self.lda_iter(P, tokens, self.m["lda_tiny_vocab"][str(P)], tiny["iters"], here=True) \
                        * tiny["iters"]
                Ps.append(P)
                Fs.append(tiny["wall"] - it)
            # On P machines the per-fit cost grows by what one scheduler and client do per worker, in turn
            # (the tiny fits' CPU in this process, less its idle rate): not by the oversubscribed walls here.
            cpu = [(P, c[f"{wl}_tiny"]["client_cpu"] - c["idle"][1] * c[f"{wl}_tiny"]["wall"])
                   for P, c in self.by_p.items() if "client_cpu" in c[f"{wl}_tiny"]]
            slope = lstsq(np.c_[np.ones(len(cpu)), [p for p, _ in cpu]], [v for _, v in cpu])[1] \
                if len({p for p, _ in cpu}) > 1 else 0.0
            base = dict(zip(Ps, Fs)).get(2, min(Fs))
            self.fixed[wl] = {"f": np.array([base - 2 * slope, slope]), "points": dict(zip(Ps, Fs)), "per_token": 0.0}
        # LDA's per-fit cost grows with a participant's tokens (starting assignments and counts, the final
        # pull and likelihood): the 1-iteration fit on the whole corpus at P = 2 less its modelled iteration
        # (with the core share measured after it), against the tiny fit's
        c2 = self.by_p.get(2, {})
        if "lda_one" in c2 and 2 in self.fixed["lda"]["points"]:
            one, tiny = c2["lda_one"], c2["lda_tiny"]
            tokens = max(p["n_tokens"] for p in one["participants"])
            vocab = self.m["lda_vocab"]["vocab_max"][self.m["lda_vocab"]["P"].index(2)]
            self.share = min(1.0, one["share"])
            it = self.lda_iter(2, tokens, vocab, 1, here=True)
            self.share = 1.0
            self.fixed["lda"]["tokens_ref"] = sum(p["n_tokens"] for p in tiny["participants"]) / 2
            self.fixed["lda"]["full"] = one["wall"] - it
            self.fixed["lda"]["per_token"] = max(0.0, (one["wall"] - it - self.fixed["lda"]["points"][2])
                                                 / (tokens - self.fixed["lda"]["tokens_ref"]))

        # The same for the worker processes' CPU seconds (a check of the CPU layers that load does not move)
        self.fixed_cpu = {}
        for P, c in self.by_p.items():
            if "idle" not in c or "worker_cpu" not in c["sgd_tiny"]:
                continue
            tiny = c["sgd_tiny"]
            it = self.sgd_cpu(P, tiny["n"] // P, tiny["nnz"] / tiny["n"], 1)
            self.fixed_cpu["sgd", P] = self.fit_cpu(c, tiny) - it
            tiny = c["lda_tiny"]
            tokens = sum(p["n_tokens"] for p in tiny["participants"]) / P
            self.fixed_cpu["lda", P] = self.fit_cpu(c, tiny) - self.lda_cpu(P, tokens, self.m["lda_tiny_vocab"][str(P)],
                                                                             tiny["iters"])

    @staticmethod
    def fit_cpu(cluster, fit):
        """The worker processes' CPU seconds of a fit, less their idle rate."""
        return fit["worker_cpu"] - cluster["idle"][0] * fit["wall"]

    def sgd_cpu(self, P, n_p, nnz_row, E):
        """CPU seconds of all worker processes in an SGD fit's rounds: each
        participant's compute (its run's constant, E epochs of rounds, the
        background thread's once), and per round the cycle's worker CPU
        (calls and serving), E epochs each; each epoch's end reads a row."""
        Us, k, q = self.sgd_rounds(P, n_p, nnz_row, knobs=False)
        C = sum(self.worker_cpu("sgd", P, u) for u in Us)
        return P * (self.sgd_c[0] + E * (k.sum() + C) + q + E * self.worker_cpu("sgd", P, 1))

    def lda_cpu(self, P, tokens, vocab, iters):
        lc = self.lda
        per = lc["sweep_per_token"] * tokens + lc["delta_per_row"] * vocab + self.worker_cpu("lda", P, vocab)
        return P * iters * per

    def F(self, wl, P, here=False, tokens=None):
        """Fixed seconds of a fit on P workers (``tokens``: LDA's per
        participant, for the part that grows with them)."""
        fx = self.fixed[wl]
        grows = fx["per_token"] * max(0.0, tokens - fx["tokens_ref"]) if tokens and fx["per_token"] else 0.0
        if here and P in fx["points"]:
            return fx["points"][P] + grows
        f0, f1 = fx["f"]
        return f0 + f1 * P + grows

    # synchronization of one iteration on P workers
    def sync(self, wl, P, U, here=False, bandwidth=None):
        if P == 1:
            return 0.0
        busy = self.lda_busy if wl == "lda" else self.sgd_sync_busy
        L = busy * self.wall2(wl, U)
        if here:
            return L
        kb = self.knobs
        L = busy * self.wall2(wl, U, knobs=True)
        grow = self.worker_cpu(wl, P, U, knobs=True) - self.worker_cpu(wl, 2, U)
        # one scheduler handles every participant's clock messages in turn (SGD under BSP: the report, the
        # read's wait for the slowest and the clock's broadcast to the servers; LDA under SSP(2): the report)
        sched = self.cyc[wl]["sched"] * SCHED_MESSAGES[wl] * (P * kb["scheduler"] - 2)
        wire = kb["bytes"] * self.bytes_per_cycle(wl, U) * (P - 1) / P / bandwidth
        return max(0.0, L + grow + sched) + self.hops * self.rtt + wire

    @staticmethod
    def expected_max(P, _cache={}):
        if P not in _cache:
            _cache[P] = float(np.mean(np.max(np.random.default_rng(0).standard_normal((20000, P)), axis=1))) \
                if P > 1 else 0.0
        return _cache[P]

    def sgd_iterations(self, P, n_p, nnz_row, E, here=False, bandwidth=None, fixed=True):
        """Seconds of a P-participant SGD fit of E epochs, n_p samples each
        (``fixed``: with the per-fit costs).

        Each round: the participant's compute k (CPU: in place over its
        copy of the table; its wall stretched by what the worker's core
        serves meanwhile, ``sgd_serving``), then the cycle L (push, clock,
        the next round's read, started a round ahead but served once every
        participant has pushed: under BSP its wait does not overlap the
        compute; as measured beside the peers' compute, ``sgd_sync_busy``). The
        background thread's q (round features and counts, once a run) runs
        on the worker's one core beside the first round's compute and the
        cycle's CPU C: that round takes max(k + L, k + q + C). Each round
        waits for the slowest participant's push (BSP). Once a run the
        participant's constant c0; each epoch's end, the stopping rule's
        read of its stats row (a cycle of one row)."""
        Us, k, q = self.sgd_rounds(P, n_p, nnz_row)
        kb = self.knobs
        stretch = 1.0 / self.share if here else 1.0
        k, q, c0 = stretch * self.sgd_serving * k, stretch * q, stretch * self.sgd_c[0]
        L = np.array([self.sync("sgd", P, u, here, bandwidth) for u in Us])
        C = np.array([stretch * self.worker_cpu("sgd", P, u, knobs=True) if P > 1 else 0.0 for u in Us])
        # BSP: each round waits for the slowest of P: here as measured around a compute (a share of it), on P
        # machines from round times with CV ``jitter`` (against 2's, where the cycle was not measured beside
        # a compute: then in L)
        if here:
            barrier = self.sgd_barrier_here * k
        else:
            base = 0.0 if self.sgd_busy else self.expected_max(2)
            barrier = kb["barrier"] * self.jitter * (k + L) * max(0.0, self.expected_max(P) - base) * (P > 1)
        if kb["overlap"] and P > 1:  # the sync of a round hidden behind the next one's compute
            later = np.maximum(k + C, L) + barrier
            first = max(k[0] + q + C[0], L[0]) + barrier[0]
        else:
            later = k + L + barrier
            first = max(k[0] + L[0], k[0] + q + C[0]) + barrier[0]
        # each epoch's end: the stopping rule reads its stats row (a sync of one row)
        ends = E * self.sync("sgd", P, 1, here, bandwidth) if P > 1 else 0.0
        t = c0 + first + later[1:].sum() + (E - 1) * later.sum() + ends
        return t + (self.F("sgd", P, here) if fixed else 0.0)

    def lda_iter(self, P, tokens, vocab, iters, here=False, bandwidth=None, fit=None, waits=True):
        """Seconds of one of ``iters`` LDA iterations on P workers: each
        participant's sweep, row deltas and sync (the sync as when the peers
        sweep), and the SSP(2) wait for the slowest
        (:func:`ssp_period`): on P machines from a round's jitter (CV
        ``jitter``, as the SGD barrier's), the participants' work equal.

        ``fit`` (P = 2 here): one measured 2-worker fit with what was
        measured just before and after it: the compute's CPU seconds
        stretched by the core share (the mean of the two), the sync of the
        cycle around the real sweep out of phase (less its clock waits) and
        that cycle's iterations' CV; the participants' run-long spread
        (``participant_spread``) from every such cycle of the run.
        ``waits=False``: the same without the SSP wait."""
        lc = self.lda
        compute = lc["sweep_per_token"] * tokens + lc["delta_per_row"] * vocab
        if fit is not None:
            busy = fit["busy"]
            share = min(1.0, 0.5 * (fit["share_before"] + fit["share_after"]))
            it = compute / share + busy["sync_wall"]
            if not waits:
                return it
            return ssp_period([it] * P, busy["iteration_cv"], LDA_STALENESS, iters, spread=self.lda_spread)
        if here:
            compute /= self.share
        if self.knobs["overlap"] and P > 1:
            it = max(compute + self.worker_cpu("lda", P, vocab, knobs=True),
                     self.sync("lda", P, vocab, here, bandwidth))
        else:
            it = compute + self.sync("lda", P, vocab, here, bandwidth)
        cv = 0.0 if here else self.knobs["barrier"] * self.jitter
        return ssp_period([it] * P, cv, LDA_STALENESS, iters)

    def lda_fit(self, P, tokens, vocab, iters, here=False, bandwidth=None, fit=None, waits=True):
        return self.F("lda", P, here, tokens) + iters * self.lda_iter(P, tokens, vocab, iters, here, bandwidth, fit,
                                                                        waits)


# --- reports -------------------------------------------------------------------------------------


def print_constants(mod: Model):
    m = mod.m
    print("\n## Measured constants\n")
    print(f"machine: {os.cpu_count()} cores; load average at the start of each cluster: "
          + ", ".join(f"P={c['P']}: {c['load_start']}" for c in m["clusters"]))
    print("\n| workload | cycle: P | U rows | wall (ms) | participant thread CPU (ms) | worker CPU per participant "
          "(ms) | scheduler CPU per clock (us) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for wl in ("sgd", "lda"):
        for r in mod.cyc[wl]["rows"]:
            print(f"| {wl} | {r['P']} | {r['U']} | {r['wall'] * 1e3:.2f} | {r['thread_cpu'] * 1e3:.2f} | "
                  f"{r['worker_cpu'] * 1e3:.2f} | {r['sched_cpu'] / r['P'] * 1e6:.0f} |")
    print()
    for wl in ("sgd", "lda"):
        a, b, c = mod.cyc[wl]["cpu"]
        la, lb = mod.cyc[wl]["wall2"]
        print(f"- {wl} cycle, worker CPU = {a * 1e3:.2f} ms + {b * 1e9:.2f} ns/byte x bytes + {c * 1e6:.0f} us/message"
              f" x messages (bytes = U x {4 + 2 * mod.row_bytes(wl)}; messages = {mod.messages(wl, 2)} at P = 2, "
              f"2 per server); scheduler {mod.cyc[wl]['sched'] * 1e6:.0f} us CPU per clock message; "
              f"P = 2 wall L = {la * 1e3:.2f} ms + {lb * 1e6:.3f} us/row")
    (c0, kappa, rho), (pi, chi) = mod.sgd_c, mod.sgd_q
    print(f"- SGD compute (scaling_sgd; the fits at P = {mod.sgd_compute_P}, tiny and other round sizes "
          f"included): participant thread, less its calls' CPU, {c0 * 1e3:.1f} ms a run + per epoch "
          f"{kappa * 1e9:.2f} ns/non-zero + {rho * 1e9:.0f} ns per touched row of each round (in place: rows "
          f"into the table's copy, the kernel, rows read back with the lazy regularization, the delta); "
          f"background thread, once a run (round features, lazy regularization's counts) {pi * 1e9:.2f} "
          f"ns/non-zero + {chi * 1e9:.0f} ns per touched row of an epoch's rounds. Per participant, measured "
          "(model): " + "; ".join(
              f"E={r['E']} {r['n_p']:.0f} samples, {r['R']} rounds of U={r['U']:.0f}: compute {r['compute']:.3f} s "
              f"({c0 + r['E'] * (kappa * r['n_p'] * mod.m['sgd_nnz'] / mod.m['sgd_n'] + rho * r['R'] * r['U']):.3f}),"
              f" background {r['prep']:.3f} s" for r in mod.sgd_compute_rows[::mod.sgd_compute_P]))
    if mod.sgd_busy:
        b = mod.sgd_busy
        print(f"- SGD round around a compute (P = {mod.sgd_compute_P}, {b['U']} rows, {b['cpu'] * 1e3:.1f} ms of CPU a "
              f"round, after the fits, between the compute alone and the cycle alone): compute wall / CPU "
              f"{b['stretch']:.2f} against {b['alone_stretch']:.2f} alone (the worker's serving on the core: "
              f"{mod.sgd_serving:.2f}x); the wait for the last push {b['barrier'] * 1e3:.1f} ms "
              f"({b['barrier_share']:.2f} of the compute's wall), then the sync {b['sync_net'] * 1e3:.1f} ms "
              f"against {b['alone_sync'] * 1e3:.1f} ms alone ({mod.sgd_sync_busy:.2f}x)")
    lc = mod.lda
    if mod.lda_fits:
        U = mod.lda_fits[0]["busy"]["U"]
        print(f"- LDA cycle around the real sweep (P = 2, {U} rows; before each fit): sync "
              + ", ".join(f"{f['busy_in_step']['sync_wall'] * 1e3:.1f}" for f in mod.lda_fits) + " ms in step, "
              + ", ".join(f"{f['busy']['sync_wall'] * 1e3:.1f}" for f in mod.lda_fits) + " ms out of phase (each "
              f"participant's sync in its peer's sweep; clock waits left out), against {mod.wall2('lda', U) * 1e3:.1f}"
              f" ms alone: a sweeping peer stretches LDA's sync {mod.lda_busy:.2f}x (median, out of phase / alone); "
              "iterations' CV (out of phase) " + ", ".join(f"{f['busy']['iteration_cv']:.2f}" for f in mod.lda_fits)
              + f"; the participants' run-long spread on the shared cores, CV {mod.lda_spread:.2f}")
    print(f"- LDA compute (K={K_LDA}, one partition of 2, thread CPU): sweep "
          f"{lc['sweep_per_token'] * 1e9:.0f} ns/token "
          f"({1 / lc['sweep_per_token'] / 1e6:.1f} M tokens/CPU-s), row deltas {lc['delta_per_row'] * 1e9:.0f} ns/row")
    for wl in ("sgd", "lda"):
        fx = mod.fixed[wl]
        f0, f1 = fx["f"]
        pts = ", ".join(f"P={p}: {v:.2f} s" for p, v in fx["points"].items())
        grows = (f" + {fx['per_token'] * 1e9:.0f} ns x the tokens of a participant past the tiny fit's "
                 f"{fx['tokens_ref']:.0f} (the 1-iteration fit on the whole corpus less its iteration: "
                 f"{fx['full']:.2f} s)") if fx.get("full") is not None else ""
        print(f"- {wl} fixed per-fit cost (tiny fit minus its iterations): {pts}; on P machines "
              f"{f0:.2f} + {f1 * 1e3:.1f} ms x P (the slope: this process's CPU per worker in the tiny fits){grows}")
    for c in m["clusters"]:
        clock = (f"; clock round trip {c['clock']['wall'] * 1e6:.0f} us, scheduler CPU "
                 f"{c['clock']['sched_cpu'] * 1e6:.0f} us and worker CPU "
                 f"{c['clock'].get('worker_cpu', float('nan')) * 1e6:.0f} us per clock") if "clock" in c else ""
        if "idle" in c:
            clock += f"; idle CPU: workers {c['idle'][0]:.3f} s/s, this process {c['idle'][1]:.3f} s/s"
        print(f"- P={c['P']}: " + ", ".join(f"{k} {v:.3f} s" for k, v in c["fixed_ops"].items()) + clock)
    print("- touched rows per SGD round, U(m): " + ", ".join(
        f"m={mm}: {uu:.0f}" for mm, uu in zip(m["sgd_U"]["m"], m["sgd_U"]["U"])))
    print("- LDA words per participant, V_p (max over parts): " + ", ".join(
        f"P={p}: {v}" for p, v in zip(m["lda_vocab"]["P"], m["lda_vocab"]["vocab_max"])))


def predicted_vs_measured(mod: Model):
    m = mod.m
    rows = []
    c2 = mod.by_p.get(2)
    if c2 is None:
        return rows
    n, nnz_row = m["sgd_n"], m["sgd_nnz"] / m["sgd_n"]
    share = c2.get("cpu_share", 1.0)

    def predict(fn):
        mod.share = 1.0
        a = fn()
        mod.share = min(1.0, share)
        b = fn()
        mod.share = 1.0
        return a, b

    sgd_rows = []
    for fit in c2["sgd"]:
        pred = predict(lambda: mod.sgd_iterations(2, n // 2, nnz_row, fit["E"], here=True))
        if fit.get("fits") and "share_before" in fit["fits"][0]:
            # each fit with the core share just before and after it; the median of their predictions
            each = []
            for f in fit["fits"]:
                mod.share = min(1.0, 0.5 * (f["share_before"] + f["share_after"]))
                each.append((f, mod.sgd_iterations(2, n // 2, nnz_row, fit["E"], here=True)))
                mod.share = 1.0
            sgd_rows.append((fit["E"], each))
            pred = (pred[0], float(np.median([p for _, p in each])))
        rows.append((f"SGD click-through {n:,} rows, max_iter={fit['E']}", *pred, fit["wall"],
                     fit.get("walls", [fit["wall"]])))
    lda_rows = []
    if mod.lda_fits:
        vocab = m["lda_vocab"]["vocab_max"][m["lda_vocab"]["P"].index(2)]
        for fit in mod.lda_fits:
            tokens = max(p["n_tokens"] for p in fit["participants"])
            quiet = mod.lda_fit(2, tokens, vocab, fit["iters"], here=True)
            pred = mod.lda_fit(2, tokens, vocab, fit["iters"], here=True, fit=fit)
            lda_rows.append((fit, quiet, pred))
        fit = c2["lda"]
        rows.append((f"LDA K={K_LDA}, {m['lda_docs']} documents, {fit['iters']} iterations",
                     float(np.median([r[1] for r in lda_rows])), float(np.median([r[2] for r in lda_rows])),
                     fit["wall"], fit["walls"]))
    print("\n## Predicted against measured, 2 worker processes\n")
    print("The second prediction divides the compute's CPU seconds by the share of a core a worker thread got "
          "while both spun (1.00: a quiet machine), measured just before and after each fit (their mean; the "
          "median of the fits' predictions)" + ("" if sgd_rows else f"; SGD: {share:.2f}, the lower of two spins "
                                               "around the SGD fits") + ".\n")
    print("| fit | predicted (s) | error | predicted with the core share (s) | error | measured (s), median (range) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, p, ps_, w, walls in rows:
        spread = f" ({min(walls):.2f}-{max(walls):.2f})" if len(walls) > 1 else ""
        print(f"| {name} | {p:.2f} | {100 * (p - w) / w:+.1f}% | {ps_:.2f} | {100 * (ps_ - w) / w:+.1f}% | "
              f"{w:.2f}{spread} |")
    for E, each in sgd_rows:
        print(f"\nSGD max_iter={E}, each fit (core share before / after: predicted, measured): "
              + "; ".join(f"{f['share_before']:.2f} / {f['share_after']:.2f}: {p:.2f} s, {f['wall']:.2f} s "
                          f"({100 * (p - f['wall']) / f['wall']:+.1f}%)" for f, p in each))
    if lda_rows:
        print("\nLDA, each fit with what was measured just before and after it: the core share (before / after), "
              "the sync of the cycle around the real sweep out of phase, each participant's sweep stretch (wall / "
              "CPU) in that cycle, the predicted SSP wait (a participant's mean) against the fit's clock waits "
              "(the participants' mean):\n")
        print("| fit | core share | sync out of phase (ms) | sweep stretch | predicted (s) | SSP wait predicted (s) | "
              "measured (s) | clock wait measured (s) | error |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for i, (fit, _, pred) in enumerate(lda_rows):
            busy = fit["busy"]
            stretch = np.array(busy["sweep_walls"]) / np.array(busy["sweep_cpus"])
            tokens = max(p["n_tokens"] for p in fit["participants"])
            wait = pred - mod.lda_fit(2, tokens, vocab, fit["iters"], here=True, fit=fit, waits=False)
            waited = np.mean([p["clock_wait_seconds"] for p in fit["participants"]])
            print(f"| {i + 1} | {fit['share_before']:.2f} / {fit['share_after']:.2f} | {busy['sync_wall'] * 1e3:.1f} | "
                  + " / ".join(f"{x:.2f}" for x in stretch) + f" | {pred:.2f} | {wait:.2f} | "
                  f"{fit['wall']:.2f} | {waited:.2f} | {100 * (pred - fit['wall']) / fit['wall']:+.1f}% |")
    if ("sgd", 2) in mod.fixed_cpu:
        print("\nThe same fits in CPU seconds of the worker processes (less their idle rate), which other load "
              "does not stretch: fixed part from the tiny fit, the rest from the per-layer constants.\n")
        print("| fit | predicted worker CPU (s) | measured (s) | error |")
        print("| --- | --- | --- | --- |")
        for fit in c2["sgd"]:
            pred = mod.fixed_cpu["sgd", 2] + mod.sgd_cpu(2, n // 2, nnz_row, fit["E"])
            got = mod.fit_cpu(c2, fit)
            print(f"| SGD max_iter={fit['E']} | {pred:.2f} | {got:.2f} | {100 * (pred - got) / got:+.1f}% |")
        if "lda" in c2:
            fit = c2["lda"]
            tokens = max(p["n_tokens"] for p in fit["participants"])
            pred = mod.fixed_cpu["lda", 2] + mod.lda_cpu(2, tokens, vocab, fit["iters"])
            got = mod.fit_cpu(c2, fit)
            print(f"| LDA {fit['iters']} iterations | {pred:.2f} | {got:.2f} | {100 * (pred - got) / got:+.1f}% |")
    print_sgd_terms(mod, c2, n, nnz_row)
    if "lda" in c2:
        fit = c2["lda"]
        sw = np.mean([p["sweep_seconds"] for p in fit["participants"]])
        tokens = max(p["n_tokens"] for p in fit["participants"])
        print(f"LDA at P = 2: sweep wall per participant {sw:.2f} s (model, CPU: "
              f"{mod.lda['sweep_per_token'] * tokens * fit['iters']:.2f} s); pull/push/clock wall "
              + " / ".join(f"{np.mean([p[k] for p in fit['participants']]):.2f}"
                           for k in ("pull_seconds", "push_seconds", "clock_seconds"))
              + " s, of which clock wait " + " ".join(f"{p['clock_wait_seconds']:.2f}" for p in fit["participants"])
              + f" s; fixed {mod.F('lda', 2, True, tokens):.2f} s")
    return rows


def print_sgd_terms(mod: Model, c2, n, nnz_row):
    """Where a 2-worker SGD fit's time goes, by the model and by the fit's
    ``metrics_`` (means over the participants; walls on the core share
    measured around the fits)."""
    print("\nSGD at P = 2, per term: the model (with the core share) against the median fit's metrics_ (participant "
          "means). Compute: the participant thread's CPU less its calls' (measured) and the training's wall "
          "(kernel_seconds + round_prep_seconds); sync: its calls' wall (ps_seconds); outside: the fit's wall less "
          "the slowest participant's seconds (model: F, the tiny fit less its modelled rounds).\n")
    print("| fit | rounds x samples, U | compute CPU (s) | background CPU (s) | compute wall (s) | sync wall (s) | "
          "participant (s) | outside the run (s) | fit (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    mod.share = min(1.0, c2.get("cpu_share", 1.0))
    for fit in c2["sgd"]:
        E, n_p, ps = fit["E"], n // 2, fit["participants"]
        Us, k, q = mod.sgd_rounds(2, n_p, nnz_row, knobs=False)
        calls = E * sum(mod.thread2("sgd", u) for u in Us)
        compute = mod.sgd_c[0] + E * k.sum()
        compute_wall = (mod.sgd_c[0] + E * mod.sgd_serving * k.sum()) / mod.share
        run = mod.sgd_iterations(2, n_p, nnz_row, E, here=True, fixed=False)
        F = mod.F("sgd", 2, True)

        def got(key):
            return float(np.mean([p[key] for p in ps]))

        outside = fit["wall"] - max(p["seconds"] for p in ps)
        print(f"| E={E} | {len(Us)} x {n_p / len(Us):.0f}, {Us.mean():.0f} | {compute:.3f} / "
              f"{got('cpu_seconds') - calls:.3f} | {q:.3f} / {got('round_prep_cpu_seconds'):.3f} | "
              f"{compute_wall:.3f} / {got('kernel_seconds') + got('round_prep_seconds'):.3f} | "
              f"{run - compute_wall:.3f} / {got('ps_seconds'):.3f} | {run:.3f} / {got('seconds'):.3f} | "
              f"{F:.3f} / {outside:.3f} | {run + F:.3f} / {fit['wall']:.3f} |")
    mod.share = 1.0
    L = [mod.wall2("sgd", u) for u in Us]
    print(f"\n(model / measured; per round at the default rounds: compute {1e3 * k.mean():.1f} ms, cycle wall "
          f"{1e3 * np.mean(L):.1f} ms, its worker CPU {1e3 * np.mean([mod.worker_cpu('sgd', 2, u) for u in Us]):.1f}"
          f" ms; the background thread's {1e3 * q:.0f} ms beside the first round)")


def extrapolate(mod: Model, sgd_n, lda_tokens, lda_iters, sgd_epochs=1):
    """Predicted fit seconds and efficiencies for every network, workload,
    scaling mode and P."""
    nnz_row = mod.m["sgd_nnz"] / mod.m["sgd_n"]
    out = []
    for net, bw in NETWORKS.items():
        for mode in ("strong", "weak"):
            # SGD: sgd_n rows in all (strong) or sgd_n / 2 per worker (weak)
            for wl in ("sgd", "lda"):
                T1 = None
                for P in WORKERS:
                    if wl == "sgd":
                        n_p = sgd_n / P if mode == "strong" else sgd_n / 2
                        fit = mod.sgd_iterations(P, n_p, nnz_row, sgd_epochs, bandwidth=bw)
                        it = mod.sgd_iterations(P, n_p, nnz_row, sgd_epochs, bandwidth=bw, fixed=False)
                        work = sgd_n if mode == "strong" else n_p * P
                    else:
                        tokens = lda_tokens / P if mode == "strong" else lda_tokens / 2
                        vocab = mod.V(P) if mode == "strong" else mod.V(2)
                        if P == 1:
                            vocab = mod.V(1)
                        it = lda_iters * mod.lda_iter(P, tokens, vocab, lda_iters, bandwidth=bw)
                        fit = mod.F("lda", P, tokens=tokens) + it
                        work = lda_tokens if mode == "strong" else tokens * P
                    if P == 1:
                        T1 = (fit, it, work)
                    # efficiency: the P-worker time against one worker's time for the same work
                    scale = work / T1[2]
                    out.append({"network": net, "mode": mode, "workload": wl, "P": P, "fit": fit, "iterations": it,
                                "eff_fit": T1[0] * scale / (P * fit), "eff_iter": T1[1] * scale / (P * it)})
    return out


def print_table(rows):
    print("\n## Predicted scaling (efficiency = T1 x work / (P x T_P); iterations only / whole fit)\n")
    Ps = [p for p in WORKERS if p > 1]
    print("| workload | scaling | network | " + " | ".join(f"P={p}" for p in Ps) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in Ps) + " |")
    for wl in ("sgd", "lda"):
        for mode in ("strong", "weak"):
            for net in NETWORKS:
                cells = []
                for P in Ps:
                    r = next(r for r in rows if (r["workload"], r["mode"], r["network"], r["P"]) == (wl, mode, net, P))
                    cells.append(f"{r['fit']:.2f} s, {100 * r['eff_iter']:.0f}% / {100 * r['eff_fit']:.0f}%")
                name = "SGD click-through" if wl == "sgd" else f"LDA K={K_LDA}"
                print(f"| {name} | {mode} | {net} | " + " | ".join(cells) + " |")


WHAT_IFS = [
    ("as measured", {}),
    ("SGD: rounds 4x larger (ps.sgd.clock-samples x 4, fewer minimum rounds an epoch)", {"round_factor": 4.0}),
    ("SGD: one round per epoch (model averaging once an epoch)", {"round_factor": 1e9}),
    ("sync overlapped with compute, no barrier (SGD: a read a round ahead under SSP(1); LDA: rows read while "
     "sweeping)",
     {"overlap": True, "barrier": 0.0}),
    ("the cycle's fixed latency / 2 (fewer event-loop hops: clock report with the flush, servers count clocks)",
     {"latency": 0.5}),
    ("per-message CPU / 4 (pull, push and clock coalesced: one message per server per clock)", {"per_message": 0.25}),
    ("no scheduler in the clock (the scheduler only at run start and end)", {"scheduler": 0.0}),
    ("bytes / 2 (float32 SGD weights; LDA: only changed entries of the rows)", {"bytes": 0.5}),
    ("SGD: the participant's and the background thread's CPU per touched row / 4", {"row_cpu": 0.25}),
    ("overlap + latency / 2 + per-message / 4 + no scheduler clock",
     {"overlap": True, "barrier": 0.0, "latency": 0.5, "per_message": 0.25, "scheduler": 0.0}),
    ("... and SGD rounds 4x larger", {"overlap": True, "barrier": 0.0, "latency": 0.5, "per_message": 0.25,
                                      "scheduler": 0.0, "round_factor": 4.0}),
    ("... and SGD per-row CPU / 4", {"overlap": True, "barrier": 0.0, "latency": 0.5, "per_message": 0.25,
                                     "scheduler": 0.0, "round_factor": 4.0, "row_cpu": 0.25}),
]


def what_must_change(meas, args, P=16):
    """Iteration efficiency at ``P`` workers (10 Gbit/s) under each change
    of ``WHAT_IFS``, strong and weak scaling."""
    print(f"\n## What must change for >= 80% at {P} workers (iteration efficiency, 10 Gbit/s; "
          "strong / weak scaling)\n")
    print("| change | SGD click-through | LDA K=50 |")
    print("| --- | --- | --- |")
    out = []
    for name, knobs in WHAT_IFS:
        mod = Model(meas, rtt=args.rtt, hops=args.hops, jitter=args.jitter, **knobs)
        rows = [r for r in extrapolate(mod, args.model_sgd_n, meas["lda_tokens"], meas["lda_iters"])
                if r["P"] == P and r["network"] == "10 Gbit/s"]
        eff = {(r["workload"], r["mode"]): r["eff_iter"] for r in rows}
        cell = {wl: " / ".join(f"{100 * eff[wl, mode]:.0f}%" for mode in ("strong", "weak")) for wl in ("sgd", "lda")}
        print(f"| {name} | {cell['sgd']} | {cell['lda']} |")
        out.append((name, cell))
    return out


def plot(rows, path, better=None, better_name=""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    Ps = [p for p in WORKERS if p > 1]
    for ax, mode in zip(axes, ("strong", "weak")):
        for wl, color in (("sgd", "C0"), ("lda", "C1")):
            for net, style in zip(NETWORKS, ("-", "--")):
                ys = [100 * next(r["eff_iter"] for r in rows if (r["workload"], r["mode"], r["network"], r["P"])
                                 == (wl, mode, net, P)) for P in Ps]
                label = f"{'SGD click-through' if wl == 'sgd' else f'LDA K={K_LDA}'}, {net}"
                ax.plot(Ps, ys, style, color=color, marker="o", label=label)
            if better:
                ys = [100 * next(r["eff_iter"] for r in better if (r["workload"], r["mode"], r["network"], r["P"])
                                 == (wl, mode, "10 Gbit/s", P)) for P in Ps]
                ax.plot(Ps, ys, ":", color=color, marker="^", label=f"... with {better_name}, 10 Gbit/s")
        ax.axhline(80, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ps, [str(p) for p in Ps])
        ax.set_xlabel("workers (one core each)")
        ax.set_title(f"{mode} scaling (iterations, fixed costs apart)")
        ax.set_ylim(0, 105)
    axes[0].set_ylabel("predicted efficiency, % (T1 / (P x T_P))")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.suptitle("dask_ps, predicted from measured layers (10 and 25 Gbit/s nearly coincide: bandwidth is not "
                 "the limit)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


# --- main ----------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller data and fewer cycles (~4 minutes)")
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8], help="cluster sizes measured")
    ap.add_argument("--sgd-n", type=int, default=500_000, help="click-through rows of the measured fits")
    ap.add_argument("--sgd-epochs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sgd-u", type=int, nargs="+", default=[2_000, 8_000, 30_000], help="rows per cycle, SGD")
    ap.add_argument("--lda-u", type=int, nargs="+", default=[2_000, 6_000, 12_000], help="rows per cycle, LDA")
    ap.add_argument("--lda-docs", type=int, default=None, help="training documents (default: all)")
    ap.add_argument("--lda-iters", type=int, default=30)
    ap.add_argument("--model-sgd-n", type=int, default=1_000_000, help="rows of the extrapolated SGD fit")
    ap.add_argument("--rtt", type=float, default=50e-6, help="network round trip, seconds")
    ap.add_argument("--hops", type=int, default=4, help="sequential network round trips per iteration")
    ap.add_argument("--jitter", type=float, default=0.05, help="coefficient of variation of a round's compute")
    ap.add_argument("--repeats", type=int, default=3, help="fits measured at P = 2 (the median is predicted)")
    ap.add_argument("--plot", default="docs/scaling.png")
    ap.add_argument("--json", default=None, help="save the measurements here")
    ap.add_argument("--from-json", nargs="+", default=None,
                    help="skip the measurements: the model from saved files (the first's data measurements; "
                         "the cluster sizes of the others that the first lacks added, e.g. P = 4, 8 measured "
                         "apart from P = 2)")
    args = ap.parse_args()
    if args.quick:
        args.sgd_n = min(args.sgd_n, 200_000)
        args.lda_docs = args.lda_docs or 1500
        args.lda_iters = min(args.lda_iters, 10)
        args.sgd_u = args.sgd_u[::2]
        args.lda_u = args.lda_u[::2]
    import logging

    logging.getLogger("distributed").setLevel(logging.ERROR)
    if args.from_json:
        meas = json.loads(pathlib.Path(args.from_json[0]).read_text())
        for path in args.from_json[1:]:
            other = json.loads(pathlib.Path(path).read_text())
            if (other["sgd_n"], other["lda_docs"]) != (meas["sgd_n"], meas["lda_docs"]):
                raise SystemExit(f"{path}: other data sizes than {args.from_json[0]}")
            have = {c["P"] for c in meas["clusters"]}
            meas["clusters"] += [c for c in other["clusters"] if c["P"] not in have]
            meas["lda_tiny_vocab"] = {**other["lda_tiny_vocab"], **meas["lda_tiny_vocab"]}
        meas["clusters"].sort(key=lambda c: c["P"])
    else:
        meas = measure(args)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(meas, default=float))
            log(f"measurements: {args.json}")
    mod = Model(meas, rtt=args.rtt, hops=args.hops, jitter=args.jitter)
    print_constants(mod)
    predicted_vs_measured(mod)
    rows = extrapolate(mod, args.model_sgd_n, meas["lda_tokens"], meas["lda_iters"])
    print(f"\nNetwork: RTT {args.rtt * 1e6:.0f} us, {args.hops} sequential round trips per iteration, "
          f"BSP jitter CV {args.jitter:.0%}; SGD click-through {args.model_sgd_n:,} rows, max_iter=1; LDA "
          f"{meas['lda_tokens']:,} tokens, {meas['lda_iters']} iterations. Each cell: predicted fit seconds, "
          "efficiency of the iterations / of the whole fit.")
    print_table(rows)
    what_must_change(meas, args)
    if args.plot:
        name, knobs = WHAT_IFS[-1]
        better = extrapolate(Model(meas, rtt=args.rtt, hops=args.hops, jitter=args.jitter, **knobs),
                             args.model_sgd_n, meas["lda_tokens"], meas["lda_iters"])
        plot(rows, args.plot, better, "the changes of the last what-if row")


def _commit():
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=HERE, capture_output=True, text=True)
        return out.stdout.strip()
    except OSError:
        return None


def measure(args):
    from bench_lda import load_news, split
    from bench_sgd import ctr_data

    t0 = time.perf_counter()
    log(f"data (load {load()})")
    X_sgd, y_sgd = ctr_data(args.sgd_n, D_SGD)
    X_lda, _ = split(load_news())
    if args.lda_docs:
        X_lda = X_lda[: args.lda_docs]
    meas = {"sgd_n": X_sgd.shape[0], "sgd_nnz": int(X_sgd.nnz), "lda_docs": X_lda.shape[0],
            "lda_tokens": int(X_lda.sum()), "lda_iters": args.lda_iters, "argv": sys.argv[1:],
            "commit": _commit()}
    # U(m): the round sizes of 1..64 workers on this data and on the model's
    ms = sorted({int(m) for n in (args.sgd_n, args.model_sgd_n) for P in WORKERS if P > 1
                 for m in sgd_schedule(int(n / P), P)} | {1_000, 4_000, 16_000, 65_536, 131_072, 262_144, args.sgd_n})
    ms = [m for m in ms if m <= X_sgd.shape[0]]
    meas["sgd_U"] = {"m": ms, "U": [touched_rows(X_sgd, m) for m in ms]}
    vocab = {"P": [], "vocab_max": [], "tokens_max": []}
    for P in WORKERS:
        v = lda_vocab(X_lda, P)
        vocab["P"].append(P)
        vocab["vocab_max"].append(v["vocab_max"])
        vocab["tokens_max"].append(v["tokens_max"])
    meas["lda_vocab"] = vocab
    meas["lda_tiny_vocab"] = {str(P): lda_vocab(X_lda[: P * 150], P)["vocab_max"] for P in (2, 4, 8, *args.workers)}
    meas["lda_compute"] = lda_compute(split_corpus(X_lda, 2)[0], X_lda.shape[1])
    log(f"sparsity and LDA compute done ({time.perf_counter() - t0:.0f} s): U(m) "
        + " ".join(f"{m}:{u:.0f}" for m, u in zip(ms, meas["sgd_U"]["U"])))
    rng = np.random.default_rng(0)
    meas["clusters"] = []
    for P in args.workers:
        a = argparse.Namespace(**vars(args), lda_compute_here=meas["lda_compute"])
        if P > 4:  # oversubscribed 4x: one epoch count is enough for the compute constants
            a.sgd_epochs = args.sgd_epochs[:1]
        meas["clusters"].append(measure_at(P, a, X_sgd, y_sgd, X_lda, rng))
        if args.json:  # after each cluster size: a later one that fails keeps these
            pathlib.Path(args.json).write_text(json.dumps(meas, default=float))
    log(f"measured in {time.perf_counter() - t0:.0f} s")
    return meas


if __name__ == "__main__":
    main()
