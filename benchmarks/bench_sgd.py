"""SGDClassifier on the parameter server vs scikit-learn vs dask-ml, same data, one run.

For each data set (dense make_classification, sparse hashed text-like) and
each method, fits with ``max_iter = E`` epochs (``tol=None``) for E = 1, 2,
3, 5, 8, ... from scratch and reports:

- samples/s = training samples x epochs / fit seconds (of the largest E run),
- time to a fixed test accuracy: the fit seconds of the smallest E whose
  model reaches it. The target is scikit-learn's best test accuracy over the
  epochs tried, minus ``--slack`` (0.005).

Methods: scikit-learn ``SGDClassifier`` (one process); dask_ps
``SGDClassifier`` on ``LocalCluster(n_workers=2, threads_per_worker=1)``
(data given as a dask array persisted on the workers, one block per worker,
so the fit does not include moving the data); dask-ml
``Incremental(SGDClassifier)`` on the same cluster and blocks, where dask-ml
is installed. All use loss="log_loss", alpha=1e-4, the "optimal" schedule.

    python benchmarks/bench_sgd.py                     # ~2-3 minutes on 2 cores
    python benchmarks/bench_sgd.py --full              # the issue's 1M x 100 dense, 1M x 2^20 sparse
    python benchmarks/bench_sgd.py --dense-n 200000 --sparse-n 0 --epochs 1 2 3
    python benchmarks/bench_sgd.py --full --only sparse --epochs 1 2 3
"""

from __future__ import annotations

import argparse
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


def run_sklearn(Xtr, ytr, Xte, yte, epochs, kw):
    from sklearn.linear_model import SGDClassifier

    out = []
    for E in epochs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            m = SGDClassifier(max_iter=E, tol=None, random_state=0, **kw).fit(Xtr, ytr)
            dt = time.perf_counter() - t
        out.append((E, dt, m.score(Xte, yte)))
    return out


def run_dask_ps(client, dXtr, dytr, Xte, yte, epochs, kw, batch_size):
    from dask_ps.linear_model import SGDClassifier

    out = []
    for E in epochs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            m = SGDClassifier(max_iter=E, tol=None, random_state=0, batch_size=batch_size, client=client,
                              **kw).fit(dXtr, dytr)
            dt = time.perf_counter() - t
        out.append((E, dt, m.score(Xte, yte)))
    return out


def run_dask_ml(client, dXtr, dytr, Xte, yte, epochs, kw, classes):
    from dask_ml.wrappers import Incremental
    from sklearn.linear_model import SGDClassifier

    out = []
    for E in epochs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            inc = Incremental(SGDClassifier(tol=None, random_state=0, **kw), shuffle_blocks=True, random_state=0)
            for _ in range(E):
                inc.partial_fit(dXtr, dytr, classes=classes)
            dt = time.perf_counter() - t
        out.append((E, dt, inc.estimator_.score(Xte, yte)))
    return out


def summarize(name, results, n_train, target):
    E, dt, acc = results[-1]
    reach = next((r for r in results if r[2] >= target), None)
    tta = f"{reach[1]:.2f} s (E={reach[0]})" if reach else "not reached"
    accs = " ".join(f"{r[2]:.4f}" for r in results)
    secs = " ".join(f"{r[1]:.2f}" for r in results)
    print(f"  {name:28s} {n_train * E / dt:11.3g} samples/s   time-to-{target:.4f}: {tta:20s} acc by E: {accs}"
          f"   s by E: {secs}")
    return {"samples_s": n_train * E / dt, "tta": None if reach is None else reach[1], "acc": acc}


def spread_blocks(client, X, y, chunks_per_worker=1):
    """X and y as dask arrays whose blocks are in memory on the workers,
    ``chunks_per_worker`` consecutive blocks on each (scattered to a chosen
    worker: a plain ``persist`` may put both blocks on one worker, and the
    estimators train one participant per worker that holds blocks)."""
    import dask.array as da

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
    return da.concatenate(xs), da.concatenate(ys)


def bench(label, X, y, client, args, kw, batch_size, chunks_per_worker=1):
    from sklearn.model_selection import train_test_split

    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.1, random_state=0)
    n_train = Xtr.shape[0]
    print(f"\n{label}: {n_train} training samples, {X.shape[1]} features"
          + (f", {X.nnz / X.shape[0]:.1f} non-zeros/row" if sp.issparse(X) else ""))
    res = {}
    t = time.perf_counter()
    res["sklearn"] = run_sklearn(Xtr, ytr, Xte, yte, args.epochs, kw)
    target = max(r[2] for r in res["sklearn"]) - args.slack
    client.wait_for_workers(2)
    dXtr, dytr = spread_blocks(client, Xtr, ytr, chunks_per_worker)
    # One untimed fit on the persisted blocks first (worker-side imports, caches).
    run_dask_ps(client, dXtr, dytr, Xte, yte, [1], kw, batch_size)
    res["dask_ps (2 workers)"] = run_dask_ps(client, dXtr, dytr, Xte, yte, args.epochs, kw, batch_size)
    if not args.no_dask_ml:
        try:
            import dask_ml  # noqa: F401

            res["dask-ml Incremental"] = run_dask_ml(client, dXtr, dytr, Xte, yte, args.epochs, kw, np.unique(y))
        except ImportError:
            print("  dask-ml is not installed: column skipped")
    out = {}
    for name, r in res.items():
        out[name] = summarize(name, r, n_train, target)
    sk = out["sklearn"]
    ps = out["dask_ps (2 workers)"]
    print(f"  dask_ps / sklearn samples/s: {ps['samples_s'] / sk['samples_s']:.2f}x"
          + (f"; time-to-accuracy ratio dask_ps/sklearn: {ps['tta'] / sk['tta']:.2f}" if ps["tta"] and sk["tta"] else ""))
    if "dask-ml Incremental" in out:
        dm = out["dask-ml Incremental"]
        print(f"  dask_ps / dask-ml samples/s: {ps['samples_s'] / dm['samples_s']:.2f}x"
              + (f"; time-to-accuracy dask-ml/dask_ps: {dm['tta'] / ps['tta']:.2f}x" if ps["tta"] and dm["tta"] else ""))
    print(f"  ({time.perf_counter() - t:.0f} s for this data set)")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense-n", type=int, default=200_000)
    ap.add_argument("--dense-d", type=int, default=100)
    ap.add_argument("--sparse-n", type=int, default=100_000)
    ap.add_argument("--sparse-d", type=int, default=2**20)
    ap.add_argument("--nnz", type=int, default=50)
    ap.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 3, 5])
    ap.add_argument("--slack", type=float, default=0.005)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--full", action="store_true", help="the issue's sizes: 1M x 100 dense, 1M x 2^20 sparse")
    ap.add_argument("--no-dask-ml", action="store_true")
    ap.add_argument("--only", choices=["dense", "sparse"], help="run one of the two data sets")
    ap.add_argument("--cluster", choices=["processes", "threads"], default="processes",
                    help="2 worker processes, or 2 workers as threads of this process (processes=False)")
    args = ap.parse_args()
    if args.full:
        args.dense_n = args.sparse_n = 1_000_000
    if args.only == "sparse":
        args.dense_n = 0
    elif args.only == "dense":
        args.sparse_n = 0
    from distributed import Client, LocalCluster

    kw = dict(loss="log_loss", alpha=1e-4)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=args.cluster == "processes",
                      dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        # Warm up: the parameter server's plugins, imports on the workers.
        from dask_ps.linear_model import SGDClassifier

        Xw, yw = dense_data(200, 5)
        SGDClassifier(max_iter=2, client=client).fit(Xw, yw)
        if args.dense_n:
            X, y = dense_data(args.dense_n, args.dense_d)
            bench(f"dense {args.dense_n} x {args.dense_d}", X, y, client, args, kw, args.batch_size)
            del X, y
        if args.sparse_n:
            X, y = hashed_data(args.sparse_n, args.sparse_d, args.nnz)
            bench(f"sparse hashed {args.sparse_n} x 2^{int(np.log2(args.sparse_d))}", X, y, client, args, kw,
                  args.batch_size)


if __name__ == "__main__":
    main()
