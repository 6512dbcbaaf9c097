"""Quickstart: train a logistic-regression model with 4 participants through
dask_ps push/pull on a LocalCluster, and compare with scikit-learn; then the
same data through the scikit-learn-style estimator
(``dask_ps.linear_model.SGDClassifier``) beside scikit-learn's own.

    python examples/quickstart.py
"""

from __future__ import annotations

import time

import numpy as np
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.linear_model import SGDClassifier as SkSGDClassifier
from sklearn.model_selection import train_test_split

import dask_ps
from dask_ps.linear_model import SGDClassifier

N_PARTICIPANTS = 4
N_CLOCKS = 100
BATCH = 500


def train(ctx, part, lr):
    """One participant: pull the weights, compute a minibatch gradient of the
    logistic loss on its own data, push the update, clock. Returns its losses."""
    X, y = part
    rng = np.random.default_rng(ctx.rank)
    losses = []
    for t in range(N_CLOCKS):
        w = ctx.pull("w")                                   # (n_features + 1,)
        idx = rng.integers(0, len(y), BATCH)
        xb, yb = X[idx], y[idx]
        p = 1 / (1 + np.exp(-(xb @ w[:-1] + w[-1])))
        grad = np.append(xb.T @ (p - yb), np.sum(p - yb)) / BATCH
        step = lr / np.sqrt(1 + t / 10)
        ctx.push("w", -step * grad / ctx.n_participants)    # the servers sum all pushes
        ctx.clock()
        z = X @ w[:-1] + w[-1]                              # loss on all local data
        losses.append(float(np.mean(np.logaddexp(0, z) - y * z)))
    return losses


def main():
    X, y = make_classification(n_samples=300_000, n_features=50, n_informative=20, random_state=0)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
    parts = [(X_train[i::N_PARTICIPANTS], y_train[i::N_PARTICIPANTS]) for i in range(N_PARTICIPANTS)]

    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        print(f"dask_ps {dask_ps.__version__}: {len(ps.servers)} workers serve shards")
        ps.create_table("w", shape=(X.shape[1] + 1,), dtype="float64", consistency=dask_ps.SSP(staleness=1))
        parts = client.scatter(parts)                       # training data stays on the workers
        t0 = time.perf_counter()
        # The largest step that stays stable here: the logistic loss's curvature
        # is at most 1/4 of the largest eigenvalue of X'X/n (79), so 2/20 = 0.1.
        losses = ps.run(train, parts, lr=0.1)
        seconds = time.perf_counter() - t0
        w = ps.pull("w")
        metrics = ps.metrics()
        # The estimator: scikit-learn's API, the participants and tables made for you.
        est_seconds = []
        for _ in range(2):  # the first fit of a process compiles its kernels; the second is warm
            t0 = time.perf_counter()
            est = SGDClassifier(loss="log_loss", random_state=0, client=client).fit(X_train, y_train)
            est_seconds.append(time.perf_counter() - t0)

    mean_loss = np.mean(losses, axis=0)
    for clock in list(range(0, N_CLOCKS, 10)) + [N_CLOCKS - 1]:
        print(f"clock {clock:3d}  mean training log-loss {mean_loss[clock]:.4f}")
    acc = np.mean(((X_test @ w[:-1] + w[-1]) > 0) == y_test)
    ref = LogisticRegression(max_iter=1000).fit(X_train, y_train).score(X_test, y_test)
    samples = N_PARTICIPANTS * N_CLOCKS * BATCH
    run = next(iter(metrics.values()))
    hits = [t["w"]["cache_hit_rate"] for t in (p["tables"] for p in run["participants"].values())]
    print(f"trained {samples:,} samples in {seconds:.2f}s with {N_PARTICIPANTS} participants (SSP, staleness 1)")
    print(f"test accuracy: dask_ps {acc:.4f}   scikit-learn LogisticRegression {ref:.4f}")
    print(f"cache hit rate per participant: {', '.join(f'{h:.2f}' for h in hits)}")
    t0 = time.perf_counter()
    sk = SkSGDClassifier(loss="log_loss", random_state=0).fit(X_train, y_train)
    sk_seconds = time.perf_counter() - t0
    n_est = len(est.metrics_)
    print(f"SGDClassifier(loss='log_loss') on {len(y_train):,} rows, default stopping rule "
          f"({n_est} participant{'s' if n_est > 1 else ''}: one per ~20 ms of an epoch's compute, at most one a worker):")
    print(f"  dask_ps       test accuracy {est.score(X_test, y_test):.4f}  {est.n_iter_:3d} epochs  "
          f"{est_seconds[1]:6.2f}s (the first fit of the process, which compiles its kernels: {est_seconds[0]:.2f}s)")
    print(f"  scikit-learn  test accuracy {sk.score(X_test, y_test):.4f}  {sk.n_iter_:3d} epochs  {sk_seconds:6.2f}s")


if __name__ == "__main__":
    main()
