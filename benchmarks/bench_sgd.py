"""SGDClassifier on the parameter server vs scikit-learn vs dask-ml, same data, same process.

For each data set and each method, fits with ``max_iter = E`` epochs
(``tol=None``) for E = 1, 2, 3, 5, ... from scratch and reports:

- samples/s = training samples x epochs / fit seconds (of the largest E run),
- time to a fixed test score: the fit seconds of the smallest E whose model
  reaches it;

each fit is repeated ``--repeat`` times (3) and the run of median time is
reported, for each tool alike;
- epochs to that score, dask_ps's against scikit-learn's (statistical
  efficiency: scikit-learn's epochs / dask_ps's; above 1, an epoch on the
  parameter server makes more progress than a sequential one). The target is scikit-learn's best test score over the epochs
  tried, minus ``--slack`` (0.005). The score is the test accuracy, or the
  test ROC AUC on the click-through set.

Data sets (``--data``, default ``dense sparse``):

- ``dense``: make_classification, standardized (1M x 100 with ``--full``);
- ``sparse``: hashed bag-of-words-like CSR, 2^20 columns, ~41 non-zeros a
  row (1M rows with ``--full``);
- ``ctr``: click-through-rate-like impressions from ``examples/ctr_logistic.py``
  (13 log-transformed counts and 26 Zipf-distributed categorical fields
  hashed with their field into 2^22 columns, ~20% clicks), ``alpha=1e-6``,
  scored by test ROC AUC (1M rows with ``--full``).

Methods: scikit-learn ``SGDClassifier`` (one process); dask_ps
``SGDClassifier`` on ``LocalCluster(n_workers=2, threads_per_worker=1)``
(worker processes, or threads of this process with ``--cluster threads``;
data given as a dask array persisted on the workers, one block per worker,
so the fit does not include moving the data); dask-ml
``Incremental(SGDClassifier)`` on the same cluster and blocks, where dask-ml
is installed. All use loss="log_loss", the "optimal" schedule, alpha=1e-4
(1e-6 on ``ctr``).

``--breakdown`` prints, for the largest E, where the dask_ps fit's time went:
in the client (parts, tables, the run, the rest) and per participant
(setup, the rounds' preparation, the kernel, blocked on the parameter
server, the rest), from ``metrics_``; and the CPU seconds of the fit's
processes against scikit-learn's.

    python benchmarks/bench_sgd.py                     # ~2-3 minutes on 2 cores
    python benchmarks/bench_sgd.py --full              # the issue's 1M x 100 dense, 1M x 2^20 sparse
    python benchmarks/bench_sgd.py --full --data ctr --breakdown
    python benchmarks/bench_sgd.py --dense-n 200000 --sparse-n 0 --epochs 1 2 3
    python benchmarks/bench_sgd.py --full --only sparse --epochs 1 2 3
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import warnings

import numpy as np
import scipy.sparse as sp


def dense_data(n, d, seed=0):
    from sklearn.datasets import make_classification
    from sklearn.preprocessing import StandardScaler

    X, y = make_classification(n, d, n_informative=d // 2, n_redundant=d // 10, random_state=seed)
    X = StandardScaler().fit_transform(X)
    return X, y


def hashed_data(n, d, nnz, seed=0):
    """Hashed bag-of-words-like CSR: ``nnz`` hashed tokens per row from a
    Zipf vocabulary, tf-idf-like L2-normalized rows, labels from a sparse
    linear model with noise."""
    rng = np.random.RandomState(seed)
    vocab = 200_000
    p = 1.0 / np.arange(1, vocab + 1) ** 1.05
    p /= p.sum()
    tokens = rng.choice(vocab, size=n * nnz, p=p)
    # The hashing trick: token -> one of d columns.
    cols = (tokens.astype(np.int64) * 2654435761 % (2**32)) % d
    rows = np.repeat(np.arange(n), nnz)
    X = sp.csr_matrix((np.ones(n * nnz, dtype=np.float64), (rows, cols)), shape=(n, d))
    X.sum_duplicates()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1))).ravel()
    X = sp.csr_matrix(sp.diags(1.0 / norms) @ X)
    w_vocab = rng.randn(vocab) * (rng.rand(vocab) < 0.1) * 4
    w = np.zeros(d)
    np.add.at(w, (np.arange(vocab, dtype=np.int64) * 2654435761 % (2**32)) % d, w_vocab)
    s = X @ w + 0.5 * rng.randn(n)
    y = (s > np.median(s)).astype(int)
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)
    return X, y


def ctr_data(n, d=2**22, seed=0):
    """Click-through-like impressions: ``examples/ctr_logistic.py``'s
    generator (13 log counts, 26 Zipf categorical fields hashed with their
    field into ``d`` columns), as ``(X, y)``."""
    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    if str(examples) not in sys.path:
        sys.path.insert(0, str(examples))
    from ctr_logistic import impressions

    X, y, _ = impressions(n, seed=seed, n_columns=d)
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)
    return X, y


def accuracy(model, X, y):
    return model.score(X, y)


def roc_auc(model, X, y):
    from sklearn.metrics import roc_auc_score

    return roc_auc_score(y, model.predict_proba(X)[:, 1])


class CPUClock:
    """CPU seconds of this process and of the cluster's worker processes
    (the load-independent cost of a fit: on 2 cores, a fit whose processes
    use C CPU seconds takes at least C / 2 s)."""

    def __init__(self, client=None):
        self.client = client
        self.own_pid = os.getpid()

    def read(self) -> float:
        total = time.process_time()
        if self.client is not None:
            times = self.client.run(lambda: (os.getpid(), time.process_time()))
            total += sum(t for pid, t in times.values() if pid != self.own_pid)  # threads: this process
        return total


def timed_fits(fit, cpu_seconds, epochs, repeat, scorer, Xte, yte, keep_model=False):
    """``fit(E)`` for each E, ``repeat`` times, timed (wall and
    ``cpu_seconds()``) and scored: per E the run of median fit time, as
    ``(E, seconds, score, CPU seconds, model or None)``."""
    out = []
    for E in epochs:
        runs = []
        for _ in range(repeat):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                c = cpu_seconds()
                t = time.perf_counter()
                m = fit(E)
                dt = time.perf_counter() - t
                cpu = cpu_seconds() - c
            runs.append((E, dt, scorer(m, Xte, yte), cpu, m if keep_model else None))
        out.append(sorted(runs, key=lambda r: r[1])[len(runs) // 2])
    return out


def run_sklearn(Xtr, ytr, Xte, yte, epochs, kw, scorer, repeat=1, seed=0):
    from sklearn.linear_model import SGDClassifier

    return timed_fits(lambda E: SGDClassifier(max_iter=E, tol=None, random_state=seed, **kw).fit(Xtr, ytr),
                      time.process_time, epochs, repeat, scorer, Xte, yte)


def run_dask_ps(client, dXtr, dytr, Xte, yte, epochs, kw, batch_size, scorer, n_jobs=2, repeat=1, seed=0):
    from dask_ps.linear_model import SGDClassifier

    return timed_fits(lambda E: SGDClassifier(max_iter=E, tol=None, random_state=seed, batch_size=batch_size,
                                              client=client, n_jobs=n_jobs, **kw).fit(dXtr, dytr),
                      CPUClock(client).read, epochs, repeat, scorer, Xte, yte, keep_model=True)


def run_dask_ml(client, dXtr, dytr, Xte, yte, epochs, kw, classes, scorer):
    from dask_ml.wrappers import Incremental
    from sklearn.linear_model import SGDClassifier

    out = []
    clock = CPUClock(client)
    for E in epochs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = clock.read()
            t = time.perf_counter()
            inc = Incremental(SGDClassifier(tol=None, random_state=0, **kw), shuffle_blocks=True, random_state=0)
            for _ in range(E):
                inc.partial_fit(dXtr, dytr, classes=classes)
            dt = time.perf_counter() - t
            cpu = clock.read() - c
        out.append((E, dt, scorer(inc.estimator_, Xte, yte), cpu, None))
    return out


def summarize(name, results, n_train, target, metric):
    E, dt, score, cpu, _ = results[-1]
    reach = next((r for r in results if r[2] >= target), None)
    tta = f"{reach[1]:.2f} s (E={reach[0]})" if reach else "not reached"
    scores = " ".join(f"{r[2]:.4f}" for r in results)
    secs = " ".join(f"{r[1]:.2f}" for r in results)
    cpus = " ".join(f"{r[3]:.2f}" for r in results)
    print(f"  {name:28s} {n_train * E / dt:11.3g} samples/s   time-to-{target:.4f}: {tta:20s} {metric} by E: "
          f"{scores}   s by E: {secs}   CPU s by E: {cpus}")
    return {"samples_s": n_train * E / dt, "tta": None if reach is None else reach[1], "score": score,
            "tta_cpu": None if reach is None else reach[3], "epochs": None if reach is None else reach[0]}


def print_breakdown(model, seconds):
    """Where a dask_ps fit's time went: the client's phases
    (``model._fit_profile``) and each participant's (``metrics_``)."""
    prof = getattr(model, "_fit_profile", None) or {}
    if prof:
        run = prof.get("run_seconds", 0.0)
        parts = " ".join(f"{k.replace('_seconds', '')} {v:.3f}" for k, v in prof.items() if k != "run_seconds")
        print(f"    breakdown of the fit ({seconds:.2f} s): in ps.run {run:.3f} s; client: {parts}; "
              f"rest {seconds - sum(prof.values()):.3f} s")
    for i, m in enumerate(model.metrics_):
        keys = ("setup_seconds", "round_prep_seconds", "kernel_seconds", "ps_blocked_seconds", "ps_seconds",
                "compute_seconds", "cpu_seconds", "seconds")
        fields = " ".join(f"{k.replace('_seconds', '')} {m[k]:.3f}" for k in keys if isinstance(m.get(k), float))
        calls = " ".join(f"{k} {v:.3f}" for k, v in (m.get("ps_seconds_by_call") or {}).items())
        print(f"    participant {i}: {fields}  | in calls: {calls}")
        clocks = max(1, int(m.get("clock") or 0))
        sent = m.get("messages") or {}
        if sent:  # bytes on the wire a clock (direct calls in one process carry none)
            print(f"      sent a clock: {sent.get('bytes_pushed', 0) / clocks / 1e3:.1f} kB pushed, "
                  f"{sent.get('bytes_pulled', 0) / clocks / 1e3:.1f} kB pulled, "
                  f"{sent.get('bytes_rows', 0) / clocks / 1e3:.1f} kB of row lists, "
                  f"{sent.get('row_lists_keyed', 0) / clocks:.2f} lists by key, "
                  f"{sum(sent.get(k, 0) for k in ('push', 'pull', 'clock', 'wait')) / clocks:.2f} messages")
        for name, t in (m.get("tables") or {}).items():  # load-robust: reads and bytes per clock
            if t.get("reads"):
                print(f"      table {name}: {clocks} clocks, {t['reads'] / clocks:.2f} reads "
                      f"({t['cache_hits'] / clocks:.2f} from the cache), "
                      f"{t['bytes_pulled'] / clocks / 1e3:.1f} kB pulled and "
                      f"{t['bytes_pushed'] / clocks / 1e3:.1f} kB pushed, {t['flushes'] / clocks:.2f} flushes a clock")


def spread_blocks(client, X, y, chunks_per_worker=1):
    """X and y as dask arrays whose blocks are in memory on the workers,
    ``chunks_per_worker`` consecutive blocks on each (scattered to a chosen
    worker: a plain ``persist`` may put both blocks on one worker, and the
    estimators train one participant per worker that holds blocks)."""
    import dask.array as da
    from distributed import wait

    workers = sorted(client.scheduler_info()["workers"])
    nblocks = len(workers) * chunks_per_worker
    rows = int(np.ceil(X.shape[0] / nblocks))
    xs, ys = [], []
    for i in range(nblocks):
        a, b = i * rows, min((i + 1) * rows, X.shape[0])
        w = workers[i // chunks_per_worker]
        fx = client.scatter(X[a:b], workers=[w], hash=False)
        fy = client.scatter(y[a:b], workers=[w], hash=False)
        xs.append(da.from_delayed(fx, shape=(b - a, X.shape[1]), dtype=X.dtype, meta=X[:0]))
        ys.append(da.from_delayed(fy, shape=(b - a,), dtype=y.dtype, meta=y[:0]))
    # Persisted as a user's ``persist()`` leaves them: each block one key in
    # memory on its worker, not from_delayed tasks that every fit re-runs.
    dX, dy = client.persist([da.concatenate(xs), da.concatenate(ys)])
    wait([dX, dy])
    return dX, dy


def bench(label, X, y, client, args, kw, batch_size, scorer=accuracy, metric="acc", chunks_per_worker=1):
    from sklearn.model_selection import train_test_split

    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.1, random_state=0)
    n_train = Xtr.shape[0]
    print(f"\n{label}: {n_train} training samples, {X.shape[1]} features"
          + (f", {X.nnz / X.shape[0]:.1f} non-zeros/row" if sp.issparse(X) else "")
          + f"; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    res = {}
    t = time.perf_counter()
    res["sklearn"] = run_sklearn(Xtr, ytr, Xte, yte, args.epochs, kw, scorer, args.repeat, args.random_state)
    target = max(r[2] for r in res["sklearn"]) - args.slack
    client.wait_for_workers(args.workers)
    # N threads a worker: N blocks on each worker, one participant each (n_jobs)
    dXtr, dytr = spread_blocks(client, Xtr, ytr, chunks_per_worker * args.threads)
    # One untimed fit on the persisted blocks first (worker-side imports, caches).
    run_dask_ps(client, dXtr, dytr, Xte, yte, [1], kw, batch_size, scorer, args.participants)
    res["dask_ps (2 workers)"] = run_dask_ps(client, dXtr, dytr, Xte, yte, args.epochs, kw, batch_size, scorer,
                                             args.participants, args.repeat, args.random_state)
    if not args.no_dask_ml:
        try:
            import dask_ml  # noqa: F401

            res["dask-ml Incremental"] = run_dask_ml(client, dXtr, dytr, Xte, yte, args.epochs, kw, np.unique(y),
                                                     scorer)
        except ImportError:
            print("  dask-ml is not installed: column skipped")
    out = {}
    for name, r in res.items():
        out[name] = summarize(name, r, n_train, target, metric)
    sk = out["sklearn"]
    ps = out["dask_ps (2 workers)"]
    print(f"  dask_ps / sklearn samples/s: {ps['samples_s'] / sk['samples_s']:.2f}x"
          + (f"; time-to-target ratio dask_ps/sklearn: {ps['tta'] / sk['tta']:.2f}"
             f" (CPU seconds to the target: {ps['tta_cpu'] / sk['tta_cpu']:.2f}x)" if ps["tta"] and sk["tta"] else ""))
    if ps["epochs"] and sk["epochs"]:  # statistical efficiency, apart from the speed of an epoch
        print(f"  epochs to the target: dask_ps {ps['epochs']}, sklearn {sk['epochs']} "
              f"(statistical efficiency {sk['epochs'] / ps['epochs']:.2f})")
    if "dask-ml Incremental" in out:
        dm = out["dask-ml Incremental"]
        print(f"  dask_ps / dask-ml samples/s: {ps['samples_s'] / dm['samples_s']:.2f}x"
              + (f"; time-to-target dask-ml/dask_ps: {dm['tta'] / ps['tta']:.2f}x" if ps["tta"] and dm["tta"] else ""))
    if args.breakdown:
        E, dt, _, _, model = res["dask_ps (2 workers)"][-1]
        print(f"  dask_ps E={E}:")
        print_breakdown(model, dt)
    print(f"  ({time.perf_counter() - t:.0f} s for this data set)")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", choices=["dense", "sparse", "ctr"], default=["dense", "sparse"])
    ap.add_argument("--dense-n", type=int, default=200_000)
    ap.add_argument("--dense-d", type=int, default=100)
    ap.add_argument("--sparse-n", type=int, default=100_000)
    ap.add_argument("--sparse-d", type=int, default=2**20)
    ap.add_argument("--nnz", type=int, default=50)
    ap.add_argument("--ctr-n", type=int, default=300_000)
    ap.add_argument("--ctr-d", type=int, default=2**22)
    ap.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 3, 5])
    ap.add_argument("--slack", type=float, default=0.005)
    ap.add_argument("--random-state", type=int, default=0,
                    help="both estimators' random_state (the data and the split stay seed 0): time to target "
                         "on a flat score curve (hashed) moves by an epoch between seeds")
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--full", action="store_true",
                    help="the issue's sizes: 1M x 100 dense, 1M x 2^20 sparse, 1M x 2^22 ctr")
    ap.add_argument("--no-dask-ml", action="store_true")
    ap.add_argument("--only", choices=["dense", "sparse", "ctr"], help="run one of the data sets (as --data X)")
    ap.add_argument("--cluster", choices=["processes", "threads", "processes-1x2", "processes-2x2"], default="threads",
                    help="2 workers as threads of this process (LocalCluster(processes=False), the layout of "
                         "the embedded default cluster, fastest here), 2 worker processes, or 1 worker process "
                         "with 2 threads (a real cluster's layout: dask worker --nthreads N); 2 participants each; "
                         "or 2 worker processes x 2 threads, 4 participants (Bösen's process cache shares reads "
                         "from the other process)")
    ap.add_argument("--breakdown", action="store_true", help="where the largest E's dask_ps fit spent its time")
    ap.add_argument("--repeat", type=int, default=3,
                    help="fit each E this many times, with both tools, and report the run of median fit time "
                         "(one run of a ~1 s fit in worker processes varied by +-0.15 s here)")
    args = ap.parse_args()
    if args.full:
        args.dense_n = args.sparse_n = args.ctr_n = 1_000_000
    data = [args.only] if args.only else args.data
    from distributed import Client, LocalCluster

    kw = dict(loss="log_loss", alpha=1e-4)
    args.workers, args.threads = {"processes-1x2": (1, 2), "processes-2x2": (2, 2)}.get(args.cluster, (2, 1))
    args.participants = args.workers * args.threads
    with LocalCluster(n_workers=args.workers, threads_per_worker=args.threads, processes=args.cluster != "threads",
                      dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        # Warm up: the parameter server's plugins, imports on the workers.
        from dask_ps.linear_model import SGDClassifier

        Xw, yw = dense_data(200, 5)
        SGDClassifier(max_iter=2, client=client).fit(Xw, yw)
        # ... and the sparse path's kernels (numba compiles or loads them at
        # their first call: a few tenths of a second that landed in whichever
        # sparse fit came first; bench_first_fit.py measures that cost). With
        # the benchmark's blocks and participants, so that the rounds are
        # compacted as in the timed fits: a lone participant's loop loads
        # other kernels, and the first compacting fit cost 0.1-0.2 CPU s more
        # per worker (the first E=2 fit took 1.16-1.24 s, the next 0.91-0.99).
        for make in (lambda: hashed_data(4000, args.sparse_d, args.nnz), lambda: ctr_data(4000, args.ctr_d)):
            Xw, yw = spread_blocks(client, *make(), args.threads)
            SGDClassifier(max_iter=2, client=client, n_jobs=args.participants, **kw).fit(Xw, yw)
        print(f"cluster: {args.workers} worker(s) x {args.threads} thread(s), {args.cluster}; "
              f"{args.participants} participants")
        if "dense" in data and args.dense_n:
            X, y = dense_data(args.dense_n, args.dense_d)
            bench(f"dense {args.dense_n} x {args.dense_d}", X, y, client, args, kw, args.batch_size)
            del X, y
        if "sparse" in data and args.sparse_n:
            X, y = hashed_data(args.sparse_n, args.sparse_d, args.nnz)
            bench(f"sparse hashed {args.sparse_n} x 2^{int(np.log2(args.sparse_d))}", X, y, client, args, kw,
                  args.batch_size)
            del X, y
        if "ctr" in data and args.ctr_n:
            X, y = ctr_data(args.ctr_n, args.ctr_d)
            bench(f"click-through {args.ctr_n} x 2^{int(np.log2(args.ctr_d))}", X, y, client, args,
                  dict(kw, alpha=1e-6), args.batch_size, scorer=roc_auc, metric="AUC")


if __name__ == "__main__":
    main()
