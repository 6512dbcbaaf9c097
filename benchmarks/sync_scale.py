"""``sync_sim``'s inputs, its check against the measured 2-worker fits, and
its scaling table (issue 36).

- **Inputs.** The sync constants (CPU a message, a byte, a direct call, the
  participant's bookkeeping a clock) refit on the current path by
  ``sync_measure.py`` (2 workers, both layouts; CPU seconds); the wake-up
  latency a hop, the one wall-only constant, chosen so that the simulated
  2-worker SGD cycle (``scaling_model``'s, U = 2,000 rows) takes the
  measured wall at the measured core share. The compute constants from
  the quiet ``scaling_model.py`` run in docs/benchmarks.md (``2b7ab62``:
  SGD 7.87 ns a non-zero and 34 ns a touched row a round, 11.4 ms a run,
  the background thread 1.63 ns / 37 ns once a run; LDA K=50 53 ns a token,
  134 ns a row's delta) and for K = 1,000 the sweep of ``bench_lda.py``
  (threads, ``1d8c57a``: 3.63 s for 30 iterations of 453k tokens: 267 ns a
  token; deltas 20x K=50's a row); touched rows per SGD round U(m) from
  the click-through data (``scaling_model``'s measurement).
- **Validation** (``validate``): each measured 2-worker fit (SGD
  click-through ``max_iter`` 1 and 2, LDA K=50 BSP) predicted as its fixed
  cost (the tiny fit less its simulated run) plus the simulated run, every
  CPU constant divided by the core share measured around that fit; and
  the fit's CPU seconds (simulated compute + every loop's busy time
  against the processes' ``process_time`` less their idle rate), which
  load stretches less than walls.
  Each fit runs with its own measured compute (SGD: its participants'
  thread CPU; LDA: its sweeps clock by clock, their spread as the
  jitter), and LDA's sync is priced from LDA's own cycle
  (``lda_byte_cpu``), not from the message fit's byte constant, which
  SGD's 8-byte rows set: the cycle of the fit predicted (seeded: BSP,
  summed per clock, the read with the clock before; ``lda-bsp``).
- **Scaling** (``table``): iteration efficiency = the same work's compute on
  one worker alone (one SGD round an epoch; LDA: its sweep and deltas)
  / (P x the simulated time), one core per worker, 10 Gbit/s, RTT 50 us,
  jitter CV 5% with a heavy tail (0.2% of clocks, + 0.5 x Lomax(2) of the
  compute); BSP LDA rows priced from the seeded fit's cycle, SSP rows
  from the unseeded default's (``cost_kind``).
- **Breakdown** (``--breakdown``, ``breakdown``): an LDA cell with each
  part of its time switched off in turn (the jitter, the sync, the bytes'
  CPU, the messages' CPU and hops, the network), and the BSP jitter
  ceiling (``bsp_jitter_ceiling``): where a cell's loss goes.

LDA's vocabulary per worker (V_p) and the nonzeros of its rows come from a
Zipf(1) law over the corpus's V words: a word of frequency f is in a shard
of T tokens with probability 1 - exp(-T f), its pulled row has min(K, N f)
nonzeros (N: the corpus's tokens), its pushed delta min(K, 2 T f). K = 50
rows go dense (4 bytes an entry); K = 1,000 rows as (topic, count) pairs
(8 bytes) where fewer, with the share of those bounds that are nonzero
after 30 iterations on the news corpus (``SPARSITY``, measured by
``row_sparsity``: rows 0.16, deltas 0.12).
"""

from __future__ import annotations

import json
import math
import pathlib
import sys
from dataclasses import dataclass, field, replace

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import sync_sim as ss  # noqa: E402

D_SGD = 2**22
NNZ_ROW = 39.0  # bench_sgd.ctr_data: 13 counts + 26 hashed fields
BATCH = 2048
# docs/benchmarks.md, scaling_model.py on 2b7ab62 (quiet): the compute, which the clock path does not change
COMPUTE = {"c0": 11.4e-3, "kappa": 7.87e-9, "rho": 34e-9, "pi": 1.63e-9, "chi": 37e-9,
           "sweep": {50: 53e-9, 1000: 267e-9}, "delta": {50: 134e-9, 1000: 20 * 134e-9}}
# U(m), touched rows of a round of m click-through samples (scaling_model's measurement on 500k rows)
U_CURVE = ([1000, 6000, 14000, 30000, 61000, 124000, 500000], [5200, 18000, 31000, 50000, 75000, 110000, 194000])
CORPORA = {"NYTimes": {"tokens": 100e6, "V": 102_000, "docs": 300_000},
           "PubMed": {"tokens": 738e6, "V": 141_000, "docs": 8_200_000}}
# sgd_quality.py --quick, time to quality (click-through; docs/benchmarks.md): epochs to scikit-learn's best - 0.005
SGD_EPOCHS = {1: 4, 2: 1, 4: 1, 16: 1, 64: 2}
# K = 1,000 rows after 30 Gibbs iterations on the news corpus (the sparse sampler, random start): nonzeros of the
# word rows / sum over words of min(K, n_w), and of an iteration's deltas / sum of min(K, 2 n_w) (0.43 / 0.47
# after the first iteration); measured with the sampler in this process (sync_scale.row_sparsity)
SPARSITY = {"pull": 0.16, "push": 0.12}


@dataclass
class Inputs:
    costs: dict = field(default_factory=lambda: {"processes": ss.Costs(), "threads": ss.Costs()})
    compute: dict = field(default_factory=lambda: dict(COMPUTE))
    u_curve: tuple = U_CURVE
    source: str = "built-in defaults"
    meas: dict | None = None  # sync_measure's JSON
    fits: dict | None = None  # the message fits by layout
    hop_source: dict = field(default_factory=dict)
    u_fits: tuple | None = None  # U(m) of the validated fits' data
    lda_here: dict | None = None  # LDA's compute measured beside them
    # by layout: LDA's sync priced from LDA's own cycle (``lda_byte_cpu``), not SGD's 8-byte rows
    lda_costs: dict = field(default_factory=dict)
    # ... and from the cycle of the seeded fits (BSP: summed per clock, the read with the clock before)
    lda_bsp_costs: dict = field(default_factory=dict)

    def costs_for(self, layout, workload):
        """The sync constants of ``workload`` in ``layout``: "sgd"; "lda"
        (under SSP: the unseeded default's cycle); "lda-bsp" (the seeded
        BSP fit's cycle, where measured; else the other's)."""
        if workload == "lda-bsp" and layout in self.lda_bsp_costs:
            return self.lda_bsp_costs[layout]
        if workload.startswith("lda"):
            return self.lda_costs.get(layout, self.costs[layout])
        return self.costs[layout]

    def U(self, m):
        """Touched rows of a round of ``m`` samples: log-log interpolation
        of the measured curve, its last slope beyond it, at most the table."""
        ms, us = np.log(self.u_curve[0]), np.log(self.u_curve[1])
        x = math.log(max(m, 1.0))
        if x <= ms[-1]:
            return float(np.exp(np.interp(x, ms, us)))
        slope = (us[-1] - us[-2]) / (ms[-1] - ms[-2])
        return float(min(D_SGD + 1, np.exp(us[-1] + slope * (x - ms[-1]))))


def message_fit(rows):
    """CPU a clock = a + b x bytes + c x messages + d x direct calls, from
    ``sync_measure``'s message cycles (kinds counted by the sessions)."""
    from scaling_model import lstsq

    A, y = [], []
    for r in rows:
        k = r["by_kind"]
        A.append([1.0, k.get("bytes_pushed", 0) + k.get("bytes_pulled", 0),
                  sum(k.get(x, 0) for x in ("push", "pull", "clock", "wait")),
                  sum(v for x, v in k.items() if x.endswith("_local"))])
        y.append(r["cpu"])
    A, y = np.array(A), np.array(y)
    coef = lstsq(A, y)
    return {"a": coef[0], "byte": coef[1], "msg": coef[2], "direct": coef[3],
            "rms": float(np.sqrt(np.mean((A @ coef - y) ** 2)))}


def load_inputs(measured=None, u_from=None, messages=()):
    """``Inputs`` from ``sync_measure``'s JSON (the sync constants of each
    layout; the hop calibrated on its SGD cycle) and, where given,
    ``scaling_model``'s JSON (the U(m) curve)."""
    inp = Inputs()
    if u_from:  # U(m) of the validated fits' data, and LDA's K=50 compute measured in the workers beside them
        m = json.loads(pathlib.Path(u_from).read_text())
        inp.u_fits = (m["sgd_U"]["m"], m["sgd_U"]["U"])
        lc = next((c["lda_compute"] for c in m["clusters"] if "lda_compute" in c), m["lda_compute"])
        inp.lda_here = {"sweep": lc["sweep_per_token"], "delta": lc["delta_per_row"]}
    if not measured:
        return inp
    meas = json.loads(pathlib.Path(measured).read_text())
    if inp.u_fits is None and "sgd_U" in meas:  # U(m) of the fits' own data, measured beside them
        inp.u_fits = (meas["sgd_U"]["m"], meas["sgd_U"]["U"])
    # the constants from the 2-worker clusters (those with message cycles); larger ones are only predicted
    two = {name: L for name, L in meas["layouts"].items() if "messages" in L}
    pooled = {name: list(L["messages"]) for name, L in two.items()}
    for path in messages:  # more runs of the message cycles alone (sync_measure.py --messages-only): pooled
        for name, L in json.loads(pathlib.Path(path).read_text())["layouts"].items():
            if "messages" in L:
                pooled.setdefault(name, []).extend(L["messages"])
    fits = {name: message_fit(rows) for name, rows in pooled.items()}
    msg = fits.get("processes", {}).get("msg", ss.Costs().msg_cpu)
    for name, L in two.items():
        f = fits[name]
        thread = min((r["thread_cpu"] for w in ("sgd", "lda") for r in L.get("cycles", {}).get(w, [])),
                     default=ss.Costs().clock_cpu)
        c = ss.Costs(msg_cpu=msg if f["msg"] <= 0 else f["msg"], byte_cpu=f["byte"], direct_cpu=f["direct"],
                     clock_cpu=thread, sched_cpu=ss.Costs().sched_cpu)
        share = L.get("cycle_share", 0.0)  # not measured: not calibrated here
        if name == "threads":  # every call direct: no hop to calibrate
            hop, inp.hop_source[name] = 0.0, "none (direct calls)"
        elif share >= 0.6 and "cycles" in L:
            cyc = min(L["cycles"]["sgd"], key=lambda r: r["U"])
            hop = calibrate_hop(c, cyc["U"], cyc["wall"], share, name)
            inp.hop_source[name] = (f"the measured SGD cycle ({cyc['U']} rows, {cyc['wall'] * 1e3:.2f} ms, "
                                    f"share {share:.2f})")
        else:
            hop = quiet_hop()
            why = f"this run's core share {share:.2f} is too low to calibrate a latency" if share else \
                "no core share measured beside this run's cycles"
            inp.hop_source[name] = f"the quiet 2b7ab62 SGD cycle (old path; {why})"
        c = replace(c, hop=hop)
        inp.costs[name] = c
        for key, into, ahead in (("lda", inp.lda_costs, False), ("lda-bsp", inp.lda_bsp_costs, True)):
            lda = sorted(L.get("cycles", {}).get(key, []), key=lambda r: r["U"])
            if len(lda) >= 2 and lda[-1]["U"] > lda[0]["U"]:
                into[name] = replace(c, byte_cpu=lda_byte_cpu(c, lda[0], lda[-1], name, prefetch=ahead))
    inp.source = f"{measured} (load {', '.join(L['load_start'] for L in two.values())})"
    inp.fits = fits
    inp.meas = meas
    return inp


def lda_cycle_workload(row, clocks=20, prefetch=False):
    """``scaling_model``'s LDA cycle (``_lda_cycle``): its U word rows and
    the totals row read, then pushed, then the clock; no sweep.
    ``prefetch``: the read rides the clock before (``_lda_bsp_cycle``)."""
    b = float(row["width"] * row["itemsize"])
    return ss.Workload(compute=0.0, clocks=clocks, push_rows=row["U"] + 1, read_rows=row["U"] + 1,
                       push_value_bytes=b, read_value_bytes=b, prefetch=prefetch)


def lda_byte_cpu(costs, small, large, layout, prefetch=False):
    """The CPU a byte at which the simulated LDA cycle's worker CPU grows
    from ``small``'s rows to ``large``'s as the measured one did
    (``sync_measure``'s cycles: worker CPU a participant a cycle). The
    message fit's byte constant comes from SGD's 8-byte rows, where a row's
    fixed cost (its index, its slice of the message) is most of it; LDA's
    rows are 200 bytes (K = 50 int32), and priced at that constant the
    2-worker LDA fits were over-predicted by 26% (processes) and 152%
    (threads). The simulation is linear in the constant: two runs give it.
    ``prefetch``: the cycles of the seeded fit (``_lda_bsp_cycle``)."""
    P = 2

    def cpu_slope(byte_cpu):
        per = []
        for row in (small, large):
            wl = lda_cycle_workload(row, prefetch=prefetch)
            _, sim = ss.simulate(VALIDATED, P, wl, costs=replace(costs, byte_cpu=byte_cpu), net=LOOPBACK,
                                 jitter=ss.Jitter(cv=0, tail_p=0), layout=layout)
            per.append((sum(sim.compute_seconds) + sum(lp.busy for lp in sim.loops)) / (wl.clocks * P))
        return per[1] - per[0]
    s0, s1 = cpu_slope(0.0), cpu_slope(1e-9)
    measured = large["worker_cpu"] - small["worker_cpu"]
    return max(0.0, (measured - s0) / ((s1 - s0) / 1e-9)) if s1 > s0 else costs.byte_cpu


def scaled(costs, share):
    """The CPU constants as wall seconds on cores of which a process gets
    ``share``; the hop's wake-up stretched alike (as ``calibrate_hop``
    assumes)."""
    f = 1.0 / max(share, 1e-3)
    return replace(costs, msg_cpu=costs.msg_cpu * f, byte_cpu=costs.byte_cpu * f, direct_cpu=costs.direct_cpu * f,
                   clock_cpu=costs.clock_cpu * f, sched_cpu=costs.sched_cpu * f, hop=costs.hop * f)


LOOPBACK = ss.Network(rtt=40e-6, bandwidth=2.4e9)  # BASELINES.md: plain loopback TCP 2.4 GB/s


def cycle_workload(U, clocks=20):
    """``scaling_model``'s SGD cycle: U rows pushed and read (the next
    round's read sent with the push), no compute."""
    return ss.Workload(compute=0.0, clocks=clocks, push_rows=U + 1, read_rows=U, push_value_bytes=8,
                       read_value_bytes=8, prefetch=True)


def calibrate_hop(costs, U, wall, share=1.0, layout="processes", design="wire"):
    """The hop latency at which the simulated 2-worker cycle of ``U`` rows
    (``design``, loopback, CPU at the core share) takes ``wall`` seconds
    (bisection; 0 where the CPU alone already takes longer), as on a
    quiet machine (the wake-ups stretched by the load as the CPU is)."""
    wl = cycle_workload(U)

    def sim_wall(hop):
        t, _ = ss.simulate(design, 2, wl, costs=scaled(replace(costs, hop=hop), share), net=LOOPBACK,
                           jitter=ss.Jitter(cv=0, tail_p=0), layout=layout)
        return t / wl.clocks
    lo, hi = 0.0, 0.02
    if sim_wall(lo) >= wall:
        return 0.0
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sim_wall(mid) < wall else (lo, mid)
    return 0.5 * (lo + hi)


# The quiet run of docs/benchmarks.md (scaling_model.py on 2b7ab62, the old path, load 1.0-1.7): its SGD
# cycle at P = 2 took 6.19 ms + 0.043 us a row, its worker CPU 554 us a message and 1.14 ns a byte, the
# scheduler 143 us a clock message. The hop where the machine is too loaded to calibrate it (core share < 0.6).
QUIET_OLD_COSTS = ss.Costs(msg_cpu=554e-6, byte_cpu=1.14e-9, direct_cpu=150e-6, clock_cpu=0.3e-3, sched_cpu=143e-6)


def quiet_hop():
    return calibrate_hop(QUIET_OLD_COSTS, 2000, 6.19e-3 + 0.043e-6 * 2000, design="old")


# --- workloads -------------------------------------------------------------------------------------


def sgd_rounds(n_p, P, round_samples=None):
    """Samples of an epoch's rounds: the estimator's schedule, or rounds of
    ``round_samples``."""
    if round_samples:
        R = max(1, int(round(n_p / round_samples)))
        return np.full(R, n_p / R)
    import scaling_sgd

    return np.asarray(scaling_sgd.schedule(int(n_p), P, BATCH, D_SGD), float)


def sgd_workload(inp, n_p, P, epochs=1, round_samples=None, fit=False, clocks=None):
    """A participant of P with ``n_p`` click-through samples: its rounds
    as clocks, and the compute of the same samples alone (one round an
    epoch). ``fit``: the run's constant and the background thread once
    (a 2-worker fit's prediction); ``clocks``: at most that many rounds
    (equal ones, the epoch's mean: the scaling table)."""
    k = inp.compute
    rounds = sgd_rounds(n_p, P, round_samples)
    Us = np.array([inp.U(m) for m in rounds])
    per = k["kappa"] * NNZ_ROW * rounds + k["rho"] * Us
    alone = epochs * (k["kappa"] * NNZ_ROW * n_p + k["rho"] * inp.U(n_p))
    if clocks is not None:
        R = len(rounds)
        m = float(rounds.mean())
        wl = ss.Workload(compute=float(per.mean()), clocks=min(clocks, R * epochs), push_rows=inp.U(m) + 1,
                         read_rows=inp.U(m), push_value_bytes=8, read_value_bytes=8, prefetch=True)
        return wl, alone / (R * epochs), R
    first = (k["c0"] + k["pi"] * NNZ_ROW * n_p + k["chi"] * Us.sum()) if fit else 0.0
    comp = np.tile(per, epochs)
    wl = ss.Workload(compute=comp, clocks=comp.size, push_rows=float(Us.mean()) + 1, read_rows=float(Us.mean()),
                     push_value_bytes=8, read_value_bytes=8, prefetch=True, first_compute=first)
    return wl, alone, len(rounds)


def zipf_shard(T, V, N, K):
    """(V_p, mean nonzeros of a pulled row, of a pushed delta) of a shard
    of T tokens of a corpus of N tokens over V words, Zipf(1)."""
    f = 1.0 / np.arange(1, V + 1)
    f /= f.sum()
    present = -np.expm1(-T * f)
    Vp = float(present.sum())
    pull = float((present * np.minimum(K, N * f)).sum() / Vp)
    push = float((present * np.minimum(K, 2 * T * f)).sum() / Vp)
    return Vp, pull, push


def lda_workload(inp, T, V, N, K, clocks):
    """An LDA participant with T tokens of a corpus of N over V words:
    sweep and deltas, its rows pulled and pushed (``zipf_shard``)."""
    k = inp.compute
    Vp, pull, push = zipf_shard(T, V, N, K)
    dense = 4.0 * K
    pull_b = dense if K < 128 else min(dense, 8.0 * SPARSITY["pull"] * pull)
    push_b = dense if K < 128 else min(dense, 8.0 * SPARSITY["push"] * push)
    comp = k["sweep"][K] * T + k["delta"][K] * Vp
    wl = ss.Workload(compute=comp, clocks=clocks, push_rows=Vp, read_rows=Vp + 1, push_value_bytes=push_b,
                     read_value_bytes=pull_b, prefetch=False)
    return wl, Vp


def row_sparsity(K=1000, iters=30):
    """The measurement behind ``SPARSITY``: the estimator's sampler on
    the news corpus in this process from a random start; after ``iters``
    sweeps, the word rows' nonzeros over sum min(K, n_w) and the last
    sweep's deltas' over sum min(K, 2 n_w)."""
    from bench_lda import load_news, split

    from dask_ps.decomposition import _lda_kernels as kk

    X = split(load_news())[0]
    _, local = np.unique(X.indices, return_inverse=True)
    doc_ptr = np.concatenate([[0], np.cumsum(np.asarray(X.sum(1)).ravel())]).astype(np.int64)
    words = np.repeat(local, X.data).astype(np.int32)
    V = int(local.max()) + 1
    z = np.random.default_rng(0).integers(K, size=words.size, dtype=np.int32)
    ndk, nwk, nk = np.zeros((X.shape[0], K), np.int32), np.zeros((V, K), np.int32), np.zeros(K, np.int64)
    kk.init_counts(doc_ptr, words, z, ndk, nwk, nk)
    n_w = nwk.sum(1)
    sweep = kk.SWEEPS["dense" if K < 128 else "sparse"]
    for it in range(iters):
        before = nwk.copy()
        sweep(doc_ptr, words, z, ndk, nwk, nk, 0.1, 0.01, X.shape[1] * 0.01, it)
    delta = nwk - before
    return {"pull": np.count_nonzero(nwk) / np.minimum(K, n_w).sum(),
            "push": np.count_nonzero(delta) / np.minimum(K, 2 * n_w).sum()}


# The quiet 2b7ab62 fits (docs/benchmarks.md, SGD at P = 2 per term, participant means): click-through
# 500k rows, 5 rounds an epoch of 64k touched rows; compute and background thread CPU, participant and sync
# walls (``metrics_``: ``seconds``, ``ps_seconds``)
QUIET_FITS = ({"E": 1, "compute": 0.097, "background": 0.027, "participant": 0.218, "sync": 0.097},
              {"E": 2, "compute": 0.183, "background": 0.029, "participant": 0.382, "sync": 0.178})


def quiet_check():
    """The old design simulated with the quiet run's constants against
    that run's 2-worker SGD fits (its own measured compute): rows of
    (E, simulated participant s, measured, simulated sync s, measured)."""
    costs = replace(QUIET_OLD_COSTS, hop=quiet_hop())
    out = []
    for f in QUIET_FITS:
        R = 5 * f["E"]
        wl = ss.Workload(compute=f["compute"] / R, clocks=R, push_rows=63_984, read_rows=63_983,
                         push_value_bytes=8, read_value_bytes=8, prefetch=True, first_compute=f["background"])
        t, sim = ss.simulate("old", 2, wl, costs=costs, net=LOOPBACK, jitter=ss.Jitter(cv=0, tail_p=0))
        out.append((f["E"], t, f["participant"], float(np.mean(sim.sync_seconds)), f["sync"]))
    return out


# --- validation ----------------------------------------------------------------------------------


# The design the measured fits ran (sync_measure.py on the code since 8a9006a: one message a server a
# clock); before it, "current" (a push, a clock report and a read a server: 3P requests) was simulated
# for them, which the code no longer sends (tests/cluster/test_clock_path.py).
VALIDATED = "wire"


def sweep_spread(fit) -> float:
    """The coefficient of variation of an LDA fit's sweeps, clock to clock
    (``metrics_``'s ``sweeps``, each participant's first iteration left
    out: cold caches): the jitter its BSP clocks wait on. 0 where the fit
    did not record them."""
    cvs = [np.std(p["sweeps"][1:]) / np.mean(p["sweeps"][1:]) for p in fit["participants"]
           if len(p.get("sweeps") or ()) > 2]
    return float(np.mean(cvs)) if cvs else 0.0


JITTER_SEEDS = 8


def _fit_pred(inp, layout, wl_fn, fit, tiny, tiny_fn, idle, workload="sgd", cv=0.0, P=2, tpw=1):
    """Predicted wall of ``fit`` (each at its own core share; the median)
    and CPU seconds: the tiny fit less its simulated run is the fixed part
    of both. ``wl_fn()``: the workload, or ``(workload, ratio)``: its
    participants' compute unequal, the slowest one ``ratio`` x the fastest
    (a persistent straggler, ``measured_compute``). ``P`` participants,
    ``tpw`` a worker process."""
    base = inp.costs_for(layout, workload)

    def run(fn, share):  # with ``cv``: the mean wall over JITTER_SEEDS draws, the first draw's simulation
        wl, ratio = _with_ratio(fn())
        runs = [ss.simulate(VALIDATED, P, wl, costs=scaled(base, share), net=LOOPBACK, layout=layout,
                            threads=tpw if layout == "processes" else 1,
                            jitter=ss.Jitter(cv=cv, tail_p=0.0, stragglers=int(ratio > 1.0),
                                             straggler_slowdown=ratio - 1.0, seed=seed))
                for seed in range(JITTER_SEEDS if cv > 0 else 1)]
        return float(np.mean([t for t, _ in runs])), runs[0][1]

    def cpu_of(sim):  # the compute and every loop's busy time (at share 1: CPU seconds)
        return sum(sim.compute_seconds) + sum(lp.busy for lp in sim.loops)
    F = float(np.median([e["wall"] - run(tiny_fn, e["share"])[0] for e in tiny["each"]]))
    F_cpu = float(np.median([e["worker_cpu"] - idle * e["wall"] for e in tiny["each"]])) - cpu_of(run(tiny_fn, 1.0)[1])
    preds = [F + run(wl_fn, e["share"])[0] for e in fit["each"]]
    _, sim = run(wl_fn, 1.0)
    return float(np.median(preds)), F, F_cpu + cpu_of(sim), sim


def _with_ratio(x):
    return x if isinstance(x, tuple) else (x, 1.0)


def validate(inp, unequal=True):
    """Predicted against measured fits, both layouts, of 2 workers (or of
    each cluster ``sync_measure.py --workers`` measured: its layout's
    ``P`` worker processes of ``threads_per_worker``, its constants the
    2-worker ones); rows of (layout, fit, predicted s, measured s, error,
    predicted CPU s, measured CPU s, error, measured sync s, simulated
    sync s). ``unequal``: each SGD participant computes its own measured
    thread CPU (the slowest sets a BSP fit's pace); else all the mean."""
    meas = inp.meas
    if inp.u_fits:  # the fits' own data (a 200k-row set touches fewer rows than 500k's)
        inp = replace(inp, u_curve=inp.u_fits)
    out = []
    for key, L in meas["layouts"].items():
        if "sgd" not in L:  # message cycles alone
            continue
        layout, workers = L.get("layout", key), L.get("P", 2)
        idle = L.get("idle", 0.0)
        for fit in L["sgd"]:
            E, n, tiny = fit["E"], fit.get("n", meas["sgd_n"]), L["sgd_tiny"]
            P = len(fit["participants"])
            tpw = max(1, P // workers)  # participants a worker process
            pred, F, cpu, sim = _fit_pred(
                inp, layout,
                lambda: measured_compute(sgd_workload(inp, n / P, P, E, fit=True)[0], fit, inp, layout, unequal),
                fit, tiny, lambda: measured_compute(sgd_workload(inp, tiny["n"] / P, P, 1, fit=True)[0], tiny, inp,
                                                    layout, unequal), idle, P=P, tpw=tpw)
            out.append(_row(key, f"SGD click-through {n:,} rows, max_iter={E}, {P} participants", pred, fit, cpu,
                            idle, sim, F, "ps_seconds"))
        fit, tiny = L["lda"], L["lda_tiny"]
        lda_tokens = fit.get("tokens", meas["lda_tokens"])
        P = len(fit["participants"])
        tpw = max(1, P // workers)
        here = inp.lda_here
        if here:  # the sweep as measured beside these fits (the model's table keeps the quiet constants)
            inp = replace(inp, compute={**inp.compute, "sweep": {**inp.compute["sweep"], 50: here["sweep"]},
                                        "delta": {**inp.compute["delta"], 50: here["delta"]}})
        tokens = max(p["n_tokens"] for p in fit["participants"])
        V = 14_608
        ahead = bool(meas.get("lda_read_ahead", False))  # the read rode the clock's message (one request a server)

        def lda_wl(T, iters, measured=None):
            wl = replace(lda_workload(inp, T, V, lda_tokens, 50, iters)[0], prefetch=ahead)
            return lda_measured_compute(wl, measured, inp) if measured else wl
        cv = sweep_spread(fit)
        pred, F, cpu, sim = _fit_pred(
            inp, layout, lambda: lda_wl(tokens, fit["iters"], fit), fit, tiny,
            lambda: lda_wl(max(p["n_tokens"] for p in tiny["participants"]), tiny["iters"]), idle, "lda-bsp", cv,
            P=P, tpw=tpw)
        spread = f", its sweeps' spread {100 * cv:.0f}%" if cv else ""
        out.append(_row(key, f"LDA K=50, {fit.get('docs', meas['lda_docs'])} documents, {fit['iters']} iterations, "
                        f"{P} participants{spread}", pred, fit, cpu, idle, sim, F, None))
    return out


def lda_measured_compute(wl, fit, inp):
    """``wl`` with the LDA fit's own sweeps as its compute (clock by clock,
    the participants' mean; ``metrics_``'s ``sweeps``), the model's deltas
    added, as the SGD fits run with their own measured compute; ``wl``
    as it is where the fit did not record them."""
    sweeps = [p.get("sweeps") or () for p in fit["participants"]]
    if not all(len(x) == wl.clocks for x in sweeps):
        return wl
    deltas = inp.compute["delta"][50] * wl.push_rows
    return replace(wl, compute=np.mean(np.asarray(sweeps, dtype=float), axis=0) + deltas)


def measured_compute(wl, fit, inp, layout, unequal=False):
    """``wl`` with the fit's own compute: its participants' thread CPU
    (mean) less the calls' bookkeeping, shared over the rounds as the
    model shares it, and the background thread's CPU before the first.
    ``unequal``: ``(wl, ratio)``, the faster participant's compute and the
    slower one's over it (processes fits: 1.4-4.5x, threads 1.0-1.3x,
    docs/benchmarks.md), which the simulation runs as a persistent
    straggler."""
    ps = fit["participants"]
    own = [p["cpu_seconds"] - inp.costs[layout].clock_cpu * wl.clocks for p in ps]
    thread = min(own) if unequal else float(np.mean(own))
    comp = np.asarray(wl.compute, float)
    wl = replace(wl, compute=comp * max(thread, 0.0) / comp.sum(),
                 first_compute=float(np.mean([p["round_prep_cpu_seconds"] for p in ps])))
    if not unequal:
        return wl
    return wl, max(own) / thread if thread > 0 else 1.0


def _row(layout, name, pred, fit, cpu, idle, sim, F, sync_key):
    got_cpu = float(np.median([e["worker_cpu"] - idle * e["wall"] for e in fit["each"]]))
    sync = float(np.mean([p[sync_key] for p in fit["participants"]])) if sync_key else float(np.mean(
        [p["pull_seconds"] + p["push_seconds"] + p["clock_seconds"] for p in fit["participants"]]))
    return {"layout": layout, "fit": name, "pred": pred, "wall": fit["wall"], "walls": fit["walls"],
            "err": (pred - fit["wall"]) / fit["wall"], "cpu_pred": cpu, "cpu": got_cpu,
            "cpu_err": (cpu - got_cpu) / got_cpu if got_cpu > 0 else float("nan"),
            "sync": sync, "sync_pred": float(np.mean(sim.sync_seconds)),
            "share": float(np.median([e["share"] for e in fit["each"]])), "F": F}


# --- scaling -------------------------------------------------------------------------------------

NET10 = ss.Network(rtt=50e-6, bandwidth=1.25e9)
PS = (4, 8, 16, 32, 64, 128, 256)


def clocks_for(P):
    """Clocks simulated at P (the events grow as P^2 a clock)."""
    return 12 if P <= 32 else 8 if P <= 64 else 5 if P <= 128 else 3


def efficiency(inp, design, P, wl, alone, staleness=0, jitter=None, workload="sgd", **kw):
    """The compute of ``wl``'s clocks alone (``alone`` a clock) over the
    simulated time, and the simulation."""
    t, sim = ss.simulate(design, P, wl, costs=inp.costs_for("processes", workload), net=NET10,
                         jitter=jitter or ss.Jitter(), staleness=staleness, **kw)
    return alone * wl.clocks / t, t / wl.clocks, sim


def rounds_by_work(inp, P, n_p, ratio=4.0, _cache={}):
    """Samples a round such that its compute is at least ``ratio`` x its
    sync (the target design's, simulated with no compute), from the
    schedule's round up by doubling, at most one round an epoch."""
    key = (P, n_p, ratio, id(inp))
    if key in _cache:
        return _cache[key]
    m = float(sgd_rounds(n_p, P).mean())
    while True:
        wl, _, _ = sgd_workload(inp, n_p, P, round_samples=m, clocks=3)
        sync = efficiency(inp, "target", P, replace(wl, compute=0.0), 0.0, jitter=ss.Jitter(cv=0, tail_p=0))[1]
        if wl.compute >= ratio * sync or m >= n_p:
            break
        m = min(2 * m, n_p)
    _cache[key] = m
    return m


def rounds_as_built(inp, P, n_p, staleness=1, ratio=8.0, min_rounds=None, clocks=6, **sim):
    """Samples a round by ``dask_ps``'s own rule (``_round_size.work_clock_every``,
    ``ps.sgd.work-ratio`` 8, ``ps.sgd.work-min-rounds-per-epoch`` (None: the
    setting's value)): the
    schedule's rounds simulated with their compute, the sync a clock the
    least wall beside its compute any participant had (``measured_costs``:
    its waits and its compute stretched by the loop), the round doubled
    while its compute (taken as growing with its samples) is under ``ratio``
    x that sync, at least ``min_rounds`` x ``max(1, s)`` rounds an epoch; ``sim``:
    the simulation's options (``sync_sim.Sim``)."""
    from dask_ps.linear_model._round_size import setting, work_clock_every

    min_rounds = int(setting("sgd", "work-min-rounds-per-epoch")) if min_rounds is None else min_rounds
    m = float(sgd_rounds(n_p, P).mean())
    wl, _, _ = sgd_workload(inp, n_p, P, round_samples=m, clocks=clocks)
    _, _, run = efficiency(inp, "target", P, wl, 0.0, staleness=staleness, **sim)
    sync = min(e - c for e, c in zip(run.end, run.compute_seconds)) / wl.clocks
    steps = max(1, int(n_p // BATCH))
    every = work_clock_every(max(1, int(m // BATCH)), steps, wl.compute, sync, ratio, min_rounds * max(1, staleness))
    return min(n_p, every * BATCH)


def variants(workload):
    """(label, design, staleness, options) rows of the table."""
    rows = [("old (1322df5)", "old", 0, {}), ("current", "current", 0, {}),
            ("wire (the code, 8a9006a)", "wire", 0, {}), ("target", "target", 0, {})]
    if workload.startswith("sgd"):
        # dask_ps as built: one message per server per clock, row lists named by a key after their first
        # use (_row_lists), the rule of _round_size (after the measured first epoch), SSP(1)'s read riding
        # the clock's message (a round trip waited); then the read a clock earlier (the target).
        built = {"pipelined": False, "key_cache": True}
        rows.append(("as built: rounds by work + SSP(1)", "target", 1, {"built": True, "sim": built}))
        rows.append(("as built: rounds by work (always) + BSP", "target", 0,
                     {"built": True, "sim": {"key_cache": True}}))
        rows.append(("target, rounds by work + SSP(1)", "target", 1, {"by_work": True}))
    else:
        # the code since 2026-12-07: under BSP an LDA participant's next read
        # rides its clock's message (``ps.lda.read-ahead``), S requests an iteration
        rows.insert(3, ("wire + LDA's read with the clock (the code)", "wire", 0, {"read_ahead": True}))
        rows.append(("wire, SSP(2) (the code)", "wire", 2, {}))
        rows.append(("wire + LDA's read with the clock, SSP(2) (not built: staler reads)", "wire", 2,
                     {"read_ahead": True}))
        rows.append(("target, SSP(2), not pipelined", "target", 2, {"sim": {"pipelined": False}}))
        rows.append(("target, SSP(2)", "target", 2, {}))
    return rows


WORKLOADS = {
    "sgd-weak": "SGD click-through, weak, 10M rows a worker",
    "sgd-strong": "SGD click-through, strong, 45M rows",
    "nyt50": "LDA K=50, weak, NYTimes-sized shards (1.56M tokens a worker)",
    "nyt1000": "LDA K=1000, weak, NYTimes-sized shards",
    "pub50": "LDA K=50, weak, PubMed-sized shards (10M tokens a worker)",
    "pub1000": "LDA K=1000, weak, PubMed-sized shards",
    "pubs50": "LDA K=50, strong, PubMed (738M tokens)",
    "pubs1000": "LDA K=1000, strong, PubMed",
}


def cost_kind(name, staleness):
    """Whose measured sync constants price a table row: SGD's; LDA's seeded
    BSP fit's cycle (summed per clock, the read with the clock before) or
    under SSP the unseeded default's."""
    if name.startswith("sgd"):
        return "sgd"
    return "lda-bsp" if staleness == 0 else "lda"


def workload_at(inp, name, P, opts, staleness=0):
    """(Workload, compute alone a clock) of ``name`` at P workers."""
    clocks = clocks_for(P)
    if name.startswith("sgd"):
        n_p = 10e6 if name == "sgd-weak" else 45e6 / P
        m = rounds_by_work(inp, P, n_p) if opts.get("by_work") else None
        if opts.get("built"):
            m = rounds_as_built(inp, P, n_p, staleness, **opts.get("sim", {}))
        wl, alone, R = sgd_workload(inp, n_p, P, round_samples=m, clocks=clocks)
        return wl, alone, R
    K = 1000 if name.endswith("1000") else 50
    if name.startswith("nyt"):
        c = CORPORA["NYTimes"]
        T, N = c["tokens"] / 64, P * c["tokens"] / 64
    elif name.startswith("pubs"):
        c = CORPORA["PubMed"]
        T, N = c["tokens"] / P, c["tokens"]
    else:
        c = CORPORA["PubMed"]
        T, N = 10e6, P * 10e6
    wl, _ = lda_workload(inp, T, c["V"], N, K, clocks)
    if name.startswith("pubs"):  # alone: the whole corpus on one worker, a P-th of it
        alone = (inp.compute["sweep"][K] * N + inp.compute["delta"][K] * zipf_shard(N, c["V"], N, K)[0]) / P
    else:
        alone = wl.compute
    return wl, alone, 1


def table(inp, Ps=PS, names=tuple(WORKLOADS), log=print):
    """Efficiency by workload, design and P: {(name, label, P): (eff, s a clock, sim counters)}."""
    out = {}
    for name in names:
        for label, design, s, opts in variants(name):
            for P in Ps:
                wl, alone, R = workload_at(inp, name, P, opts, s)
                if opts.get("read_ahead"):
                    wl = replace(wl, prefetch=True)
                e, per, sim = efficiency(inp, design, P, wl, alone, staleness=s,
                                         workload=cost_kind(name, s), **opts.get("sim", {}))
                out[name, label, P] = {"eff": e, "clock_s": per, "epoch_s": per * R, "rounds": R,
                                       "sched_busy": sim.sched.busy / (per * wl.clocks),
                                       "requests": sum(v for k, v in sim.per_clock().items() if k != "broadcast")}
                log(f"{name} {label} P={P}: {100 * e:.0f}% ({per * 1e3:.1f} ms a clock)")
    return out


# What the breakdown switches off, one at a time (``breakdown``): the rest as simulated
PARTS = (
    ("as simulated", {}),
    ("no jitter", {"jitter": "still"}),
    ("sync free (jitter only)", {"costs": "free", "net": "free"}),
    ("no byte CPU", {"costs": {"byte_cpu": 0.0}}),
    ("no message CPU, no hop", {"costs": {"msg_cpu": 0.0, "hop": 0.0, "direct_cpu": 0.0, "clock_cpu": 0.0}}),
    ("no network time (bandwidth and RTT free)", {"net": "free"}),
)
FREE_COSTS = {"msg_cpu": 0.0, "byte_cpu": 0.0, "direct_cpu": 0.0, "clock_cpu": 0.0, "hop": 0.0, "sched_cpu": 0.0}
FREE_NET = ss.Network(rtt=0.0, bandwidth=float("inf"))
BREAKDOWN_ROWS = {  # the designs whose losses the breakdown splits: the code's, the target's
    "wire + LDA's read with the clock (the code)": ("wire", 0, {"read_ahead": True}),
    "wire, SSP(2) (the code)": ("wire", 2, {}),
    "target, SSP(2)": ("target", 2, {}),
}


def bsp_jitter_ceiling(P, clocks, jitter=None):
    """The efficiency BSP cannot pass with free sync: each clock lasts its
    slowest participant's compute, so the ceiling is 1 / the mean over
    clocks of the largest of P jitter factors (``Jitter.factors``, the
    draws the simulation uses)."""
    f = (jitter or ss.Jitter()).factors(P, clocks)
    return float(1.0 / f.max(axis=0).mean())


def breakdown(inp, name, P, label, parts=PARTS):
    """{part: efficiency} of one table cell (``BREAKDOWN_ROWS[label]``)
    with each part of the time switched off in turn (``PARTS``), and the
    BSP jitter ceiling: where the loss of a cell goes."""
    design, s, opts = BREAKDOWN_ROWS[label]
    wl, alone, _ = workload_at(inp, name, P, opts, s)
    if opts.get("read_ahead"):
        wl = replace(wl, prefetch=True)
    workload = cost_kind(name, s)
    base = inp.costs_for("processes", workload)
    out = {}
    for part, change in parts:
        costs = change.get("costs", {})
        costs = replace(base, **(FREE_COSTS if costs == "free" else costs))
        net = FREE_NET if change.get("net") == "free" else NET10
        jitter = ss.Jitter(cv=0, tail_p=0) if change.get("jitter") == "still" else ss.Jitter()
        t, _ = ss.simulate(design, P, wl, costs=costs, net=net, jitter=jitter, staleness=s,
                           **opts.get("sim", {}))
        out[part] = alone * wl.clocks / t
    out["BSP jitter ceiling"] = bsp_jitter_ceiling(P, wl.clocks)
    return out


def print_breakdown(inp, names, Ps, log=print):
    """The breakdown of each workload's code and target cells at each P."""
    cols = [p for p, _ in PARTS] + ["BSP jitter ceiling"]
    print("| workload | design | P | " + " | ".join(cols) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in cols) + " |")
    for name in names:
        if name.startswith("sgd"):
            continue
        for label in BREAKDOWN_ROWS:
            for P in Ps:
                b = breakdown(inp, name, P, label)
                log(f"breakdown {name} {label} P={P}")
                print(f"| {WORKLOADS[name]} | {label} | {P} | "
                      + " | ".join(f"{100 * b[c]:.1f}%" for c in cols) + " |", flush=True)


def print_table(res, Ps=PS):
    head = " | ".join(f"P={P} (model, not measured)" for P in Ps)
    print(f"| workload | design | {head} |")
    print("| --- | --- | " + " | ".join("---" for _ in Ps) + " |")
    for name, title in WORKLOADS.items():
        for label, *_ in variants(name):
            if (name, label, Ps[0]) not in res:
                continue
            cells = " | ".join(f"{100 * res[name, label, P]['eff']:.0f}%" for P in Ps)
            print(f"| {title} | {label} | {cells} |")


def print_quality(res, Ps=PS):
    """SGD strong scaling: seconds an epoch and to quality (the sweep's epochs)."""
    print("\n| design | " + " | ".join(f"P={P}" for P in Ps) + " |")
    print("| --- | " + " | ".join("---" for _ in Ps) + " |")
    for label, *_ in variants("sgd-strong"):
        if ("sgd-strong", label, Ps[0]) not in res:
            continue
        cells = []
        for P in Ps:
            r = res["sgd-strong", label, P]
            epoch = r["epoch_s"]
            E = SGD_EPOCHS.get(P)
            cells.append(f"{epoch:.1f} s an epoch, x {E} = {E * epoch:.1f} s" if E else f"{epoch:.1f} s an epoch")
        print(f"| {label} | " + " | ".join(cells) + " |")


def main(argv=None):
    import argparse
    import time

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", help="sync_measure.py's JSON (default: the built-in constants)")
    ap.add_argument("--u-from", help="scaling_model.py's JSON of the same data as --measured: its U(m) curve and "
                    "LDA compute, for the validation (the table keeps the 500k-row curve and the quiet compute)")
    ap.add_argument("--messages", nargs="*", default=(), help="sync_measure.py --messages-only JSONs, pooled")
    ap.add_argument("--ps", type=int, nargs="+", default=list(PS), help="cluster sizes (P = 256: a minute a row)")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--msg-cpu", type=float, help="override the CPU of a message (seconds; e.g. a quiet run's)")
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--validate-only", action="store_true", help="stop after the validation (the device check)")
    ap.add_argument("--breakdown", action="store_true", help="only where the LDA cells' time goes: each part "
                    "of the sync and the jitter switched off in turn (model, not measured)")
    ap.add_argument("--json", help="save the table's figures here")
    args = ap.parse_args(argv)
    inp = load_inputs(args.measured, args.u_from, args.messages)
    if args.msg_cpu is not None:
        inp.costs = {k: replace(c, msg_cpu=args.msg_cpu) for k, c in inp.costs.items()}
    print(f"# sync_sim: inputs from {inp.source}\n")
    for name, f in (inp.fits or {}).items():
        print(f"- {name}, message cycles (CPU a clock = a + b x bytes + c x messages + d x direct calls): a "
              f"{f['a'] * 1e3:.2f} ms, b {f['byte'] * 1e9:.2f} ns, c {f['msg'] * 1e6:.0f} us, "
              f"d {f['direct'] * 1e6:.0f} us (rms {f['rms'] * 1e3:.2f} ms); hop from {inp.hop_source[name]}")
    for key, costs, what in (("lda", inp.lda_costs, "SSP(2) with refresh, the unseeded default"),
                             ("lda-bsp", inp.lda_bsp_costs, "BSP summed per clock, the read with the clock")):
        for name, c in costs.items():
            cyc = inp.meas["layouts"][name]["cycles"][key]
            print(f"- {name}, LDA's sync ({what}): a byte {c.byte_cpu * 1e9:.2f} ns (from its own cycle's worker "
                  f"CPU, {int(min(r['U'] for r in cyc)):,} to {int(max(r['U'] for r in cyc)):,} rows)")
    for name, c in inp.costs.items():
        print(f"- {name}: a message {c.msg_cpu * 1e6:.0f} us CPU (request + reply), a byte "
              f"{c.byte_cpu * 1e9:.2f} ns, a direct call {c.direct_cpu * 1e6:.0f} us, a clock's bookkeeping "
              f"{c.clock_cpu * 1e6:.0f} us, a hop {c.hop * 1e6:.0f} us; the old scheduler "
              f"{c.sched_cpu * 1e6:.0f} us a clock message")
    if inp.meas and not args.no_validate:
        print("\n## Predicted against measured, 2 workers\n")
        print("| layout | fit | core share | predicted (s) | measured (s), median (range) | error (both the mean "
              "compute) | predicted CPU (s) | measured CPU (s) | error | sync a participant, simulated / measured "
              "(s) (both the mean) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r, m in zip(validate(inp), validate(inp, unequal=False)):
            print(f"| {r['layout']} | {r['fit']} | {r['share']:.2f} | {r['pred']:.2f} | {r['wall']:.2f} "
                  f"({min(r['walls']):.2f}-{max(r['walls']):.2f}) | {100 * r['err']:+.0f}% ({100 * m['err']:+.0f}%) | "
                  f"{r['cpu_pred']:.2f} | {r['cpu']:.2f} | {100 * r['cpu_err']:+.0f}% | {r['sync_pred']:.3f} / "
                  f"{r['sync']:.3f} ({m['sync_pred']:.3f}) |")
    if args.validate_only:
        return
    print("\nThe old design against the quiet 2b7ab62 fits (processes, SGD click-through 500k rows; participant "
          "means):\n")
    print("| max_iter | participant, simulated / measured (s) | error | sync, simulated / measured (s) | error |")
    print("| --- | --- | --- | --- | --- |")
    for E, t, tm, sy, sm_ in quiet_check():
        print(f"| {E} | {t:.3f} / {tm:.3f} | {100 * (t - tm) / tm:+.0f}% | {sy:.3f} / {sm_:.3f} | "
              f"{100 * (sy - sm_) / sm_:+.0f}% |")
    Ps = tuple(args.ps)
    t0 = time.perf_counter()
    if args.breakdown:
        print("\n## Where the LDA cells' time goes (one core per worker, 10 Gbit/s; model, not measured)\n")
        print_breakdown(inp, args.workloads, Ps, log=lambda m: print(f"[{time.perf_counter() - t0:.0f} s] {m}",
                                                                       file=sys.stderr, flush=True))
        return
    res = table(inp, Ps, args.workloads, log=lambda m: print(f"[{time.perf_counter() - t0:.0f} s] {m}",
                                                              file=sys.stderr, flush=True))
    print("\n## Iteration efficiency (one core per worker, 10 Gbit/s, RTT 50 us; every figure a simulation)\n")
    print_table(res, Ps)
    if "sgd-strong" in args.workloads:
        print("\nSGD click-through, strong (45M rows): an epoch and the time to quality (epochs from "
              "sgd_quality.py's sweep; one worker alone: "
              f"{SGD_EPOCHS[1]} epochs x {sgd_workload(inp, 45e6, 1, clocks=1)[1]:.1f} s)")
        print_quality(res, Ps)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({f"{k[0]}|{k[1]}|{k[2]}": v for k, v in res.items()}))


if __name__ == "__main__":
    main()
