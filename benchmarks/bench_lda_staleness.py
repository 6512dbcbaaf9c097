"""The seed paper's evaluation for LDA: time to the same held-out log-likelihood
under BSP, SSP(1-4), ESSP(s) and VAP with a persistent and a transient straggler,
2 participants on 2 workers, before and after a change (interleaved).

Corpus: drawn from the LDA generative process (``--docs`` documents of
``--doc-len`` tokens, V = ``--vocab``, ``--k`` topics; 200 more documents held
out). Every sweep of a participant costs an emulated ``--base`` seconds on top
of the real sampling (the straggler delays dominate, so the machine's load
does not decide who is slow), through ``LatentDirichletAllocation``'s
benchmark hook ``_sweep_delay`` (``GibbsConfig.delay``: ``f(rank, iteration,
sweep_seconds) -> seconds`` slept after each sweep):

- ``persistent``: participant 1 is slower every iteration: it sleeps
  ``2 * base + sweep_seconds`` where participant 0 sleeps ``base`` (half
  speed, its real compute counted twice);
- ``transient``: both sleep ``base``; every ``--period`` iterations one
  participant, in turn (1 first, at iteration ``period // 2``), pauses for
  ``--pause`` iterations' worth (``pause * base`` more, once).

What is measured, per model: the held-out log-likelihood per token by
document completion (``dask_ps.decomposition.document_completion``,
BASELINES.md's metric, the same split for every fit) of snapshots of the
word-topic table pulled from the servers every ``--snapshot`` seconds during
the fit (scored afterwards, outside the timing); the time from the first
sweep's start until a snapshot reaches the target, and the iterations done
by then (mean of the two participants, from the hook's log). The target is
``--frac`` of the gain BSP's run made from its first snapshot to its final
model, in the same child process. Ratios are BSP's time / the model's time.

Before and after: ``--versions old=/path/to/old/tree new=.`` runs one child
process per (repeat, layout, version), interleaved, with ``PYTHONPATH`` set
to that tree (the child prints which ``dask_ps`` it imported). Layouts:
``threads`` (``LocalCluster(processes=False)``, 2 workers x 1 thread: the
embedded cluster's layout) and ``processes`` (2 worker processes).

    python benchmarks/bench_lda_staleness.py --versions old=/work/wt/old1322 new=. \\
        --layouts threads processes --repeats 2
    python benchmarks/bench_lda_staleness.py --layouts threads --models BSP "SSP(1)" "SSP(2)" "ESSP(1)" \
        "ESSP(2)" --repeats 3 --bsp-seeds 3       # with BSP at seeds 1-3: the spread a seed alone gives
    # the same arguments plus --rescore DIR [--frac F]: an earlier run's snapshots against another target

Results and what they mean: docs/benchmarks.md, "LDA under bounded staleness".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

logger = logging.getLogger("bench_lda_staleness")

ALPHA, ETA = 0.1, 0.01
P = 2


def model_set():
    import dask_ps

    return {
        "BSP": dask_ps.BSP(), "SSP(1)": dask_ps.SSP(1), "SSP(2)": dask_ps.SSP(2), "SSP(3)": dask_ps.SSP(3),
        "SSP(4)": dask_ps.SSP(4), "ESSP(1)": dask_ps.ESSP(1), "ESSP(2)": dask_ps.ESSP(2),
        "ESSP(4)": dask_ps.ESSP(4), "VAP(10)": dask_ps.VAP(10.0),
    }


MODEL_NAMES = ["BSP", "SSP(1)", "SSP(2)", "SSP(3)", "SSP(4)", "ESSP(1)", "ESSP(2)", "ESSP(4)", "VAP(10)"]


def corpus(n_docs, doc_len, n_words, n_topics, n_test=200, seed=0):
    """Documents from the LDA generative process: (train, held-out) count matrices."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(n_words, 0.05), size=n_topics)
    theta = rng.dirichlet(np.full(n_topics, 0.3), size=n_docs + n_test)
    X = sp.csr_matrix(np.vstack([rng.multinomial(doc_len, p / p.sum()) for p in theta @ topics]))
    return X[:n_docs], X[n_docs:]


class Straggler:
    """The sweep-delay hook; every call is logged (rank, iteration, time,
    seconds slept) to ``path`` (one line, appended: the workers may be
    other processes)."""

    def __init__(self, scenario, base, period, pause, path):
        self.scenario, self.base, self.period, self.pause, self.path = scenario, base, period, pause, path

    def seconds(self, rank, it, dt):
        if self.scenario == "persistent":
            return 2 * self.base + dt if rank == 1 else self.base
        k, r = divmod(it, self.period)
        paused = r == self.period // 2 and rank == (1 + k) % P
        return self.base * (1 + (self.pause if paused else 0))

    def __call__(self, rank, it, dt):
        s = self.seconds(rank, it, dt)
        with open(self.path, "a") as f:
            f.write(f"{rank} {it} {time.time() - dt!r} {time.time()!r} {s!r}\n")
        return s


def _snapshots(ps, stop, every, out):
    """Pull the run's word-topic table every ``every`` s: (time, counts)."""
    while not stop.is_set():
        names = [n for n in ps.tables() if n.endswith("-word-topic")]
        if names:
            try:
                out.append((time.time(), np.asarray(ps.pull(names[0]))))
            except Exception:  # the table was dropped at the run's end
                pass
        stop.wait(every)


def _table_metrics(m):
    keys = ("reads", "cache_hits", "eager_fills", "refetches", "bytes_pulled", "wait_seconds")
    out = {k: 0.0 for k in keys}
    for mt in m.metrics_:
        for name, t in mt["tables"].items():
            if name.endswith("-word-topic"):
                for k in keys:
                    out[k] += float(t.get(k, 0))
    out["clock_wait_seconds"] = float(sum(mt.get("clock_wait_seconds", 0.0) for mt in m.metrics_))
    return out


def run_names(args):
    """The models, and BSP again with seeds 1 .. ``--bsp-seeds`` (how far a
    seed alone moves BSP's result: the spread the staleness figures sit in)."""
    return list(args.models) + [f"BSP seed={i}" for i in range(1, args.bsp_seeds + 1)]


def child(args):
    """One (version, layout, repeat): every scenario and model; writes a JSON
    and one .npz of snapshots per fit under ``args.out``."""
    import dask_ps
    from distributed import Client, LocalCluster

    from dask_ps.decomposition import LatentDirichletAllocation

    logging.getLogger("distributed").setLevel(logging.ERROR)
    logging.getLogger("dask_ps").setLevel(logging.ERROR)
    train, _ = corpus(args.docs, args.doc_len, args.vocab, args.k)
    models = model_set()
    fits = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.layout == "processes",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        warm = LatentDirichletAllocation(args.k, max_iter=2, n_partitions=P, client=client, random_state=0)
        warm.fit(train)  # compile the kernels on every worker first
        for scenario in args.scenarios:
            for name in run_names(args):
                log = os.path.join(args.out, f"hook-{len(fits)}.log")
                model, _, seed = name.partition(" seed=")
                m = LatentDirichletAllocation(args.k, doc_topic_prior=ALPHA, topic_word_prior=ETA,
                                              max_iter=args.iters, evaluate_every=0, consistency=models[model],
                                              n_partitions=P, client=client, random_state=int(seed or 0))
                m._sweep_delay = Straggler(scenario, args.base, args.period, args.pause, log)
                snaps, stop = [], threading.Event()
                th = threading.Thread(target=_snapshots, args=(ps, stop, args.snapshot, snaps), daemon=True)
                th.start()
                t0 = time.time()
                m.fit(train)
                t_end = time.time()
                stop.set()
                th.join()
                hook = np.loadtxt(log, ndmin=2)
                os.unlink(log)
                i = len(fits)
                np.savez_compressed(os.path.join(args.out, f"fit{i}.npz"),
                                    times=np.array([t for t, _ in snaps]),
                                    counts=np.array([c[:args.vocab] for _, c in snaps]),
                                    final=np.asarray(m.components_), hook=hook)
                fits.append({"scenario": scenario, "model": name, "t_call": t0, "t_end": t_end,
                             "fit_seconds": m.fit_seconds_, "train_ll": m.loglik_history_[-1][2],
                             "metrics": _table_metrics(m), "npz": f"fit{i}.npz"})
                logger.info("%s %s %s: %.1f s", args.layout, scenario, name, t_end - t0)
    with open(os.path.join(args.out, "fits.json"), "w") as f:
        json.dump({"dask_ps": dask_ps.__file__, "fits": fits}, f)


def score_fit(out, fit, test, n_words):
    """Held-out ll/token of each snapshot and of the final model; times from
    the first sweep's start; per snapshot the mean iterations completed."""
    from dask_ps.decomposition import document_completion

    z = np.load(os.path.join(out, fit["npz"]))
    hook = z["hook"]  # rank, it, sweep start, sweep end, sleep
    zero = hook[:, 2].min()
    done = hook[:, 3] + hook[:, 4]  # an iteration is complete after its sleep (then push and clock)

    def score(components):
        ll, n = document_completion(components, test, ALPHA)
        return ll / n

    times = list(z["times"] - zero)
    lls = [score(c.T.astype(np.float64) + ETA) if c.any() else float("nan") for c in z["counts"]]
    times.append(max([done.max() - zero] + times))  # the final model: when the last iteration ended
    lls.append(score(z["final"]))

    def iters_at(t):
        return float(np.mean([np.sum((hook[:, 0] == r) & (done - zero <= t)) for r in range(P)]))

    return np.array(times), np.array(lls), iters_at


def time_to(times, lls, target):
    ok = np.flatnonzero(np.nan_to_num(lls, nan=-np.inf) >= target)
    return float(times[ok[0]]) if ok.size else float("nan")


def summarize(results, args, test):
    """results[(version, layout)] = list of (out dir, fits.json)."""
    rows = {}
    for (version, layout), reps in results.items():
        for out, data in reps:
            for scenario in args.scenarios:
                fits = [f for f in data["fits"] if f["scenario"] == scenario]
                scored = {f["model"]: (f, *score_fit(out, f, test, args.vocab)) for f in fits}
                _, bt, bl, _ = scored["BSP"]
                first = bl[np.isfinite(bl)][0]
                target = first + args.frac * (bl[-1] - first)
                t_bsp = time_to(bt, bl, target)
                for name, (f, t, ll, iters_at) in scored.items():
                    tt = time_to(t, ll, target)
                    rows.setdefault((scenario, layout, name, version), []).append({
                        "t": tt, "speedup": t_bsp / tt, "iters": iters_at(tt) if np.isfinite(tt) else float("nan"),
                        "end": float(t[-1]), "final": float(ll[-1]), "bsp_final": float(bl[-1]), **f["metrics"],
                    })
    return rows


def print_tables(rows, args, versions):
    def rng(all_xs, fmt="{:.2f}"):
        xs = [x for x in all_xs if np.isfinite(x)]
        if not xs:
            return "not reached"
        lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
        out = lo if lo == hi else f"{lo}-{hi}"
        return out if len(xs) == len(all_xs) else f"{out} ({len(all_xs) - len(xs)} of {len(all_xs)} not reached)"

    for scenario in args.scenarios:
        for layout in args.layouts:
            print(f"\n### {scenario} straggler, {layout}: time to {args.frac:.0%} of BSP's held-out gain "
                  f"(ranges over {args.repeats} repeats)\n")
            print("| model | version | time to target s | vs BSP (x sooner) | iterations at target | run s "
                  "| final held-out ll/token vs BSP | reads served from cache | eager fills / read |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for name in run_names(args):
                for v in versions:
                    rs = rows.get((scenario, layout, name, v), [])
                    if not rs:
                        continue
                    hit = [r["cache_hits"] / max(r["reads"], 1) for r in rs]
                    fill = [r["eager_fills"] / max(r["reads"], 1) for r in rs]
                    print(f"| {name} | {v} | {rng([r['t'] for r in rs], '{:.1f}')} | "
                          f"{rng([r['speedup'] for r in rs])} | {rng([r['iters'] for r in rs], '{:.1f}')} | "
                          f"{rng([r['end'] for r in rs], '{:.1f}')} | "
                          f"{rng([r['final'] - r['bsp_final'] for r in rs], '{:+.4f}')} | "
                          f"{rng(hit)} | {rng(fill)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", nargs="+", default=["new=."],
                    help="label=path of a source tree (PYTHONPATH of that child)")
    ap.add_argument("--layouts", nargs="+", choices=["threads", "processes"], default=["threads", "processes"])
    ap.add_argument("--scenarios", nargs="+", choices=["persistent", "transient"],
                    default=["persistent", "transient"])
    ap.add_argument("--models", nargs="+", default=MODEL_NAMES, choices=MODEL_NAMES)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--bsp-seeds", type=int, default=0, help="BSP fits with random_state 1 .. N as well")
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--doc-len", type=int, default=100)
    ap.add_argument("--vocab", type=int, default=500)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--base", type=float, default=0.1, help="emulated seconds of compute per sweep")
    ap.add_argument("--period", type=int, default=8, help="transient: a pause every PERIOD iterations")
    ap.add_argument("--pause", type=int, default=3, help="transient: a pause's length in iterations")
    ap.add_argument("--snapshot", type=float, default=0.1, help="seconds between snapshots of the table")
    ap.add_argument("--frac", type=float, default=0.8, help="target: this fraction of BSP's held-out gain")
    ap.add_argument("--rescore", metavar="DIR", help="print the tables again from an earlier run's snapshots "
                    "(the directory it named), e.g. with another --frac")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: LAYOUT:OUTDIR
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.child:
        args.layout, args.out = args.child.split(":", 1)
        return child(args)
    if "BSP" not in args.models:
        args.models = ["BSP"] + args.models
    versions = [v.split("=", 1) for v in args.versions]
    root = args.rescore or tempfile.mkdtemp(prefix="bench_lda_staleness-")
    results = {}
    passthrough = ["--scenarios", *args.scenarios, "--models", *args.models, "--docs", str(args.docs),
                   "--doc-len", str(args.doc_len), "--vocab", str(args.vocab), "--k", str(args.k),
                   "--iters", str(args.iters), "--base", str(args.base), "--period", str(args.period),
                   "--pause", str(args.pause), "--snapshot", str(args.snapshot),
                   "--bsp-seeds", str(args.bsp_seeds)]
    for r in range(args.repeats):
        for layout in args.layouts:
            for label, path in versions:  # interleaved: a change of load falls on both versions
                out = os.path.join(root, f"{label}-{layout}-{r}")
                if args.rescore:
                    with open(os.path.join(out, "fits.json")) as f:
                        results.setdefault((label, layout), []).append((out, json.load(f)))
                    continue
                os.makedirs(out)
                env = {**os.environ, "PYTHONPATH": os.path.abspath(path)}
                logger.info("repeat %d/%d, %s, %s (%s)", r + 1, args.repeats, layout, label, path)
                subprocess.run([sys.executable, os.path.abspath(__file__), "--child", f"{layout}:{out}",
                                *passthrough], env=env, check=True)
                with open(os.path.join(out, "fits.json")) as f:
                    data = json.load(f)
                logger.info("  dask_ps from %s", data["dask_ps"])
                results.setdefault((label, layout), []).append((out, data))
    _, test = corpus(args.docs, args.doc_len, args.vocab, args.k)
    rows = summarize(results, args, test)
    print(f"\n## LDA under bounded staleness: {P} participants on 2 workers, {args.docs} docs x {args.doc_len} "
          f"tokens, V={args.vocab}, K={args.k}, {args.iters} iterations, {args.base * 1000:.0f} ms emulated "
          f"compute per sweep; load {os.getloadavg()[0]:.1f} at the end; snapshots in {root}")
    print_tables(rows, args, [v for v, _ in versions])
    with open(os.path.join(root, "rows.json"), "w") as f:
        json.dump({"|".join(k): v for k, v in rows.items()}, f)


if __name__ == "__main__":
    main()
