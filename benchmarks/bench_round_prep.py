"""A small participant's sparse rounds built by numpy against the compiled
kernels (issue 35: ``_round_prep.NUMPY_PREP_NONZEROS``).

Two measurements, in one process, the kernels compiled first (a warm
process: what numpy costs where the compile is not the question):

- the build of a participant's rounds (``compact_rows``): 30 non-zeros a
  row over 2^18 features, its rows in 1 and in 10 rounds, numpy against
  the kernel, best of 5;
- warm sparse fits on ``ParameterServer()`` (two participants), 10
  epochs, with numpy building the rounds (the default under the threshold)
  and with the kernels (threshold 0), alternating, each 3 times.

    python benchmarks/bench_round_prep.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp


def hashed(n, d=2**18, nnz=30, seed=0):
    rng = np.random.RandomState(seed)
    X = sp.csr_matrix((rng.randn(n * nnz), rng.randint(0, d, n * nnz), np.arange(0, n * nnz + 1, nnz)), shape=(n, d))
    X.sum_duplicates()
    return X, (np.asarray(X @ rng.randn(d)).ravel() > 0).astype(int)


def builds(n_rows):
    from dask_ps.linear_model import _sgd_numba as K
    from dask_ps.linear_model._round_prep import numpy_compact_rows

    X, _ = hashed(n_rows)
    d = X.shape[1]
    ind, ptr = X.indices.astype(np.int32), X.indptr.astype(np.int32)
    bits = np.zeros(d // 64 + 1, np.uint64)
    rank, slot = np.zeros(bits.shape[0], np.int32), np.full(n_rows, -1, np.int32)
    perm = np.random.default_rng(0).permutation(n_rows)
    for n_rounds in (1, 10):
        rounds = np.array_split(perm, n_rounds)
        times = {}
        for name, build in (("kernel", lambda r: K.compact_rows(r, X.data, ind, ptr, bits, rank, slot)),
                            ("numpy", lambda r: numpy_compact_rows(r, X.data, ind, ptr, d))):
            build(rounds[0])  # (compiled, or numpy warmed)
            best = np.inf
            for _ in range(5):
                t = time.perf_counter()
                for r in rounds:
                    build(r)
                best = min(best, time.perf_counter() - t)
            times[name] = best
        print(f"{n_rows} rows ({X.nnz} non-zeros), {n_rounds} round(s): kernel {1e3 * times['kernel']:.1f} ms, "
              f"numpy {1e3 * times['numpy']:.1f} ms")


def fits(n_rows, repeats):
    from dask_ps import ParameterServer
    from dask_ps.linear_model import SGDClassifier, _rounds

    X, y = hashed(n_rows)
    ParameterServer()
    default = _rounds.NUMPY_PREP_NONZEROS
    seconds = {"numpy": [], "kernels": []}
    for threshold in (0, default):  # both paths compiled and warmed
        _rounds.NUMPY_PREP_NONZEROS = threshold
        SGDClassifier(max_iter=2, tol=None, random_state=0).fit(X, y)
    for _ in range(repeats):
        for name, threshold in (("numpy", default), ("kernels", 0)):
            _rounds.NUMPY_PREP_NONZEROS = threshold
            t = time.perf_counter()
            SGDClassifier(max_iter=10, tol=None, random_state=0).fit(X, y)
            seconds[name].append(time.perf_counter() - t)
    _rounds.NUMPY_PREP_NONZEROS = default
    per = X.nnz // 2
    print(f"warm fits, {n_rows} rows (~{per} non-zeros a participant; numpy builds under {default}), 10 epochs: "
          + ", ".join(f"{k} {' '.join(f'{s:.2f}' for s in v)} s" for k, v in seconds.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10000, help="rows of the build measurement")
    ap.add_argument("--fit-rows", type=int, default=60000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    builds(args.rows)
    fits(args.fit_rows, args.repeats)


if __name__ == "__main__":
    main()
