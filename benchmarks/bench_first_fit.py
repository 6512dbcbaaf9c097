"""The first fit of a fresh process: cluster start + SGDClassifier.fit on 20k rows.

Issue 13's targets: from a fresh install (no compiled kernels cached),
cluster start + the first fit of 20,000 rows <= 5 s; with the kernels
cached, the first fit <= 1 s. Each measurement runs in its own Python
process (nothing imported or compiled before), with its own empty kernel
cache directory (``DASK_PS__KERNEL_CACHE_DIR``):

- cold: an empty cache (what a fresh install does), start + first fit;
- warm: a second process on the cache the cold one filled, start + first fit;
- scikit-learn's ``SGDClassifier`` on the same data, in the same process as
  the warm one (its import not counted either).

Data: ``make_classification(20000, 20)``, standardized, or with
``--sparse`` a hashed CSR of 2^18 columns and 30 non-zeros per row;
default ``SGDClassifier()`` (hinge, max_iter=1000, tol=1e-3) with
``random_state=0``, on the embedded cluster (``ParameterServer()``:
in-process workers). ``--repeat`` runs each process that many times and
reports the median.

    python benchmarks/bench_first_fit.py
    python benchmarks/bench_first_fit.py --sparse --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t_process = time.perf_counter()
import numpy as np, scipy.sparse as sp
from sklearn.datasets import make_classification
from sklearn.preprocessing import StandardScaler
n, sparse = int(sys.argv[1]), sys.argv[2] == "sparse"
if sparse:
    rng = np.random.RandomState(0)
    d, nnz = 2**18, 30
    cols = (rng.zipf(1.3, size=n * nnz) * 2654435761 % 2**32) % d
    X = sp.csr_matrix((np.ones(n * nnz), (np.repeat(np.arange(n), nnz), cols)), shape=(n, d))
    X.sum_duplicates()
    w = rng.randn(d)
    y = (X @ w > 0).astype(int)
else:
    X, y = make_classification(n, 20, random_state=0)
    X = StandardScaler().fit_transform(X)
t0 = time.perf_counter()
import dask_ps
from dask_ps.linear_model import SGDClassifier
t_import = time.perf_counter()
ps = dask_ps.ParameterServer()
t_start = time.perf_counter()
est = SGDClassifier(random_state=0, client=ps.client).fit(X, y)
t_fit = time.perf_counter()
est2 = SGDClassifier(random_state=0, client=ps.client).fit(X, y)
t_fit2 = time.perf_counter()
out = {"import": t_import - t0, "start": t_start - t_import, "first_fit": t_fit - t_start,
       "second_fit": t_fit2 - t_fit, "accuracy": est.score(X, y), "n_iter": int(est.n_iter_)}
if sys.argv[3] == "sklearn":
    from sklearn.linear_model import SGDClassifier as SkSGDClassifier
    SkSGDClassifier(random_state=0).fit(X[:100], y[:100])  # its first-call costs out of the way
    t = time.perf_counter()
    sk = SkSGDClassifier(random_state=0).fit(X, y)
    out["sklearn_fit"] = time.perf_counter() - t
    out["sklearn_accuracy"] = sk.score(X, y)
    out["sklearn_n_iter"] = int(sk.n_iter_)
ps.close()
print("RESULT " + json.dumps(out))
"""


def run_child(n, sparse, cache_dir, sklearn=False) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["DASK_PS__KERNEL_CACHE_DIR"] = cache_dir
    args = [sys.executable, "-c", CHILD, str(n), "sparse" if sparse else "dense", "sklearn" if sklearn else "-"]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--sparse", action="store_true")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    cold, warm = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="dask_ps-bench-kernels-") as cache:
            cold.append(run_child(args.n, args.sparse, cache))
            warm.append(run_child(args.n, args.sparse, cache, sklearn=True))

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    kind = "sparse 2^18 columns" if args.sparse else "dense 20 features"
    print(f"first fit of {args.n} rows ({kind}), median of {args.repeat} run(s), each in a fresh process")
    print(f"{'':34s}{'import':>8s}{'start':>8s}{'fit':>8s}{'start+fit':>11s}{'2nd fit':>9s}")
    for name, rows in (("cold (empty kernel cache)", cold), ("warm (kernels cached)", warm)):
        start, fit = med(rows, "start"), med(rows, "first_fit")
        print(f"{name:34s}{med(rows, 'import'):8.2f}{start:8.2f}{fit:8.2f}{start + fit:11.2f}"
              f"{med(rows, 'second_fit'):9.2f}")
    print(f"{'scikit-learn SGDClassifier.fit':34s}{'':24s}{med(warm, 'sklearn_fit'):11.3f}")
    print(f"accuracy: dask_ps {warm[-1]['accuracy']:.4f} ({warm[-1]['n_iter']} epochs), "
          f"scikit-learn {warm[-1]['sklearn_accuracy']:.4f} ({warm[-1]['sklearn_n_iter']} epochs)")
    print("targets (issue 13): cold start+fit <= 5 s, warm first fit <= 1 s")


if __name__ == "__main__":
    main()
