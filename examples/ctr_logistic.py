"""Click-through-rate prediction: hashed features, logistic regression by SGD.

The shape of the Criteo display-ads data, generated here: each impression
has 13 numeric fields (counts, log-transformed: ``log(1 + x)``) and 26
categorical fields whose values follow Zipf laws (a few values are
everywhere, most are rare; vocabularies from tens to 100,000 values). The
categorical values are hashed into ``2**20`` columns (the hashing trick, with
the field in the hash, so the same value in two fields lands in two
columns), giving a CSR of 39 non-zeros per row. Clicks come from a logistic
model of the fields (a weight per categorical value, a few numeric effects),
about 20% of impressions.

It fits ``dask_ps.linear_model.SGDClassifier(loss="log_loss")`` on a
``LocalCluster`` of two workers and scikit-learn's ``SGDClassifier`` with
the same parameters on the same training rows, and prints the test ROC AUC
and the fit time of both (and the AUC of the model that generated the
clicks, the best any model can do).

Run: ``python examples/ctr_logistic.py`` (300,000 impressions, under a
minute on two cores); ``--rows 100000`` for a quicker run, ``--workers 4``
for more participants.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
from distributed import Client, LocalCluster
from sklearn.linear_model import SGDClassifier as SkSGDClassifier
from sklearn.metrics import log_loss, roc_auc_score

from dask_ps.linear_model import SGDClassifier

N_NUMERIC, N_CATEGORICAL = 13, 26
N_COLUMNS = 2**20


def impressions(n, seed=0, n_columns=N_COLUMNS):
    """``(X, y, p)``: the hashed CSR (n, ``n_columns``), the clicks and their
    true probabilities. (``benchmarks/bench_sgd.py --data ctr`` trains on
    these too, hashed into 2**22 columns.)"""
    rng = np.random.default_rng(seed)
    # Numeric fields: heavy-tailed counts, log-transformed (as CTR pipelines do).
    counts = rng.negative_binomial(1, rng.uniform(0.02, 0.5, N_NUMERIC), size=(n, N_NUMERIC))
    numeric = np.log1p(counts)
    # Categorical fields: Zipf-distributed value ids, vocabularies of 10 to 100,000.
    vocab = np.round(10 ** rng.uniform(1, 5, N_CATEGORICAL)).astype(np.int64)
    exponents = rng.uniform(1.05, 1.6, N_CATEGORICAL)
    values = np.stack([(rng.zipf(exponents[f], n) - 1) % vocab[f] for f in range(N_CATEGORICAL)], axis=1)
    # The clicks: a weight for some categorical values, a few numeric
    # effects, and the intercept that makes about 20% of impressions clicks.
    logit = np.zeros(n)
    for f in range(N_CATEGORICAL):
        weights = rng.normal(0.0, 0.5, vocab[f]) * (rng.random(vocab[f]) < 0.3)
        logit += weights[values[:, f]]
    logit += numeric @ (rng.normal(0.0, 0.25, N_NUMERIC) * (rng.random(N_NUMERIC) < 0.6))
    low, high = -20.0, 20.0
    for _ in range(50):  # bisection on the intercept
        mid = (low + high) / 2
        low, high = (low, mid) if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) > 0.2 else (mid, high)
    p = 1.0 / (1.0 + np.exp(-(logit + low)))
    y = (rng.random(n) < p).astype(np.int64)
    # Hashing: (field, value) -> one of the columns after the numeric ones.
    key = values.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.arange(N_CATEGORICAL, dtype=np.uint64)
    key ^= key >> np.uint64(29)
    key *= np.uint64(0xBF58476D1CE4E5B9)
    key ^= key >> np.uint64(32)
    hashed = N_NUMERIC + (key % np.uint64(n_columns - N_NUMERIC)).astype(np.int64)
    cols = np.concatenate([np.broadcast_to(np.arange(N_NUMERIC), (n, N_NUMERIC)), hashed], axis=1)
    data = np.concatenate([numeric, np.ones((n, N_CATEGORICAL))], axis=1)
    order = np.argsort(cols, axis=1, kind="stable")  # CSR rows with sorted columns
    cols = np.take_along_axis(cols, order, axis=1)
    data = np.take_along_axis(data, order, axis=1)
    width = N_NUMERIC + N_CATEGORICAL
    X = sp.csr_matrix((data.ravel(), cols.ravel().astype(np.int32), np.arange(0, n * width + 1, width)),
                      shape=(n, n_columns))
    X.sum_duplicates()  # two fields hashed to one column
    return X, y, p


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()

    t = time.perf_counter()
    X, y, p = impressions(args.rows)
    n_train = int(0.8 * args.rows)
    X_train, y_train, X_test, y_test = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
    print(f"{args.rows:,} impressions x {X.shape[1]:,} hashed columns, {X.nnz / X.shape[0]:.1f} non-zeros per "
          f"row, {y.mean():.1%} clicks (generated in {time.perf_counter() - t:.1f} s); "
          f"train {n_train:,}, test {args.rows - n_train:,}")
    params = dict(loss="log_loss", alpha=1e-4, max_iter=args.epochs, tol=None, random_state=0)

    results = {}
    t = time.perf_counter()
    sk = SkSGDClassifier(**params).fit(X_train, y_train)
    results["scikit-learn SGDClassifier"] = (time.perf_counter() - t, sk)

    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        SGDClassifier(max_iter=1, tol=None, client=client).fit(X_train[:2000], y_train[:2000])  # load the kernels
        t = time.perf_counter()
        ours = SGDClassifier(client=client, **params).fit(X_train, y_train)
        results[f"dask_ps SGDClassifier ({args.workers} workers)"] = (time.perf_counter() - t, ours)

    print(f"{'':36s}{'fit seconds':>12s}{'epochs':>8s}{'test ROC AUC':>14s}{'test log loss':>15s}")
    for name, (seconds, model) in results.items():
        proba = model.predict_proba(X_test)[:, 1]
        print(f"{name:36s}{seconds:12.2f}{model.n_iter_:8d}{roc_auc_score(y_test, proba):14.4f}"
              f"{log_loss(y_test, proba):15.4f}")
    print(f"{'the model that made the clicks':36s}{'':20s}{roc_auc_score(y_test, p[n_train:]):14.4f}"
          f"{log_loss(y_test, p[n_train:]):15.4f}")


if __name__ == "__main__":
    main()
