"""What a fresh install's first sparse SGD fit compiles (issue 35): the
kernels it runs, once each, and none of numba's own array constructors or
builtins; and dask_ps's compile notice leaves the user's numba code alone."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from dask_ps.linear_model import _sgd_numba
from dask_ps.linear_model._round_prep import numpy_compact_rows, numpy_round_features
from ps_fixtures import SGD_BY_ROWS_ENV

_BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"

# Every numba compile of a fresh process, by module and name (a script's header).
_COUNT_COMPILES = r"""
import numba.core.event as ev
compiled = []
class Count(ev.Listener):
    def on_start(self, event):
        fn = event.data["dispatcher"].py_func
        compiled.append(f"{fn.__module__}.{fn.__qualname__}")
    def on_end(self, event):
        pass
ev.register("numba:compile", Count())
"""

# Two participants of a sparse fit (benchmarks/sgd_sim.py: the participants'
# own code, in one process), twice: a small input's rounds are built by
# numpy (``_round_prep.NUMPY_PREP_NONZEROS``); then, with that threshold
# at 0, by the kernels: compacted (compact_rows) and the lazy
# regularization's count of the rounds' features (round_features).
_SPARSE_FIRST_FIT = _COUNT_COMPILES + r"""
import json, sys
import numpy as np, scipy.sparse as sp
sys.path.insert(0, sys.argv[1])
from sgd_sim import simulate_fit
from dask_ps.linear_model import SGDClassifier, _rounds
rng = np.random.RandomState(0)
X = sp.random(2000, 500, density=0.02, random_state=0, format="csr")
y = (np.asarray(X @ rng.randn(500)).ravel() > 0).astype(int)
fit = lambda: simulate_fit(SGDClassifier(max_iter=5, tol=None, random_state=0), X, y, n_participants=2).coef_
by_numpy = fit()
small = list(compiled)
_rounds.NUMPY_PREP_NONZEROS = 0
by_kernels = fit()
print("RESULT " + json.dumps({"small": small, "compiled": compiled, "coef": by_numpy.ravel().tolist(),
                              "same": bool(np.array_equal(by_numpy, by_kernels))}))
"""

_ROUND_KERNEL = "sgd_round__averaged_0_dense_0_keep_0_learning_rate_2_loss_id_0_penalty_2_scaled_1"
_SPARSE_USED = {"_compact_fill", "_set_bits", "_round_features", _ROUND_KERNEL}


def test_a_sparse_first_fit_compiles_the_kernels_it_runs_only(tmp_path):
    """Each compiled entry point, and each of numba's own functions a kernel
    calls on its first use in a process (``np.empty``: 0.1-0.15 s; ``min``,
    ``max``), cost a first fit compile time. A small input (20,000
    non-zeros) compiles the round kernel only: numpy builds its rounds.
    A larger one's compaction and features compile once each and allocate
    nothing (numpy makes their arrays and the row pointers); both give the
    same model bit for bit."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["DASK_PS__KERNEL_CACHE_DIR"] = str(tmp_path)
    env.update(SGD_BY_ROWS_ENV)  # the rounds whose kernels are listed below
    out = subprocess.run([sys.executable, "-c", _SPARSE_FIRST_FIT, str(_BENCHMARKS)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])

    def ours(names):
        return sorted(n.removeprefix("dask_ps.linear_model._sgd_numba.") for n in names if n.startswith("dask_ps."))

    assert ours(result["small"]) == [_ROUND_KERNEL], result["small"]
    assert ours(result["compiled"]) == sorted(_SPARSE_USED), result["compiled"]
    assert result["same"]
    assert not [name for name in result["compiled"] if name.startswith("numba.np.arrayobj")], result["compiled"]
    # numba's max: the round kernel's floats only (the compaction compares)
    assert result["compiled"].count("numba.cpython.builtins.ol_max.<locals>.impl") <= 1, result["compiled"]
    assert "numba.cpython.builtins.ol_min.<locals>.impl" not in result["compiled"], result["compiled"]
    assert np.all(np.isfinite(result["coef"])) and np.any(result["coef"])


def _compact_reference(rows, X):
    """``compact_rows`` by numpy: the rows' sorted features, the rows over them."""
    sub = X[rows]
    cols = np.unique(sub.indices).astype(np.int64)
    return cols, sub.data, np.searchsorted(cols, sub.indices).astype(np.int32), sub.indptr.astype(np.int32)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n_rows", [0, 1, 37, 400])
def test_compaction_into_numpy_buffers_is_numpys(dtype, n_rows):
    """The compaction's arrays come from numpy (the features' buffer sized
    by the rows' non-zeros): the same features, data, renumbered indices and
    row pointers as numpy's, for empty and single rows, into recycled
    buffers (``out``), and the scratch left as it was (bitmap zeroed, slots
    -1) for the next round."""
    rng = np.random.RandomState(n_rows)
    X = sp.random(500, 3000, density=0.01, random_state=rng, format="csr", dtype=dtype)
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)
    bits = np.zeros(3000 // 64 + 1, dtype=np.uint64)
    rank = np.zeros(bits.shape[0], dtype=np.int32)
    slot = np.full(500, -1, dtype=np.int32)
    rows = rng.permutation(500)[:n_rows].astype(np.int64)
    expected = _compact_reference(rows, X)
    for out in (None, (np.empty(X.nnz, dtype=dtype), np.empty(X.nnz, dtype=np.int32))):
        got = _sgd_numba.compact_rows(rows, X.data, X.indices, X.indptr, bits, rank, slot, out)
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert not bits.any() and (slot == -1).all()
    # numpy's build of a small participant's rounds (the same arrays): a
    # mark per feature, or a sort where the rows hold few non-zeros
    got = numpy_compact_rows(rows, X.data, X.indices, X.indptr, 3000)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for features_of in (lambda counts: _sgd_numba.round_features(rows, X.indices, X.indptr, bits, counts),
                        lambda counts: numpy_round_features(rows, X.indices, X.indptr, 3000, counts)):
        counts = np.zeros(3000, dtype=np.int32)
        features = features_of(counts)
        assert features.dtype == np.int64 and np.array_equal(features, expected[0])
        assert np.array_equal(np.flatnonzero(counts), expected[0]) and set(counts[expected[0]]) <= {1}
        assert not bits.any()


def test_the_compile_notice_leaves_a_function_without_a_module_alone():
    """dask_ps's listener hears every numba compile of the process: a
    user's function made by ``exec`` has no module (``__module__`` None),
    and its compile failed with an AttributeError from the listener. (In
    this process: the listener is the process's, installed here if no
    kernel was compiled yet; a fresh process cost 5-20 s for the import.)"""
    import numba

    from dask_ps._compiled import CompileNotice

    CompileNotice.install()
    namespace = {}
    exec("def f(x):\n    return x + 1\n", namespace)
    assert namespace["f"].__module__ is None
    assert numba.njit(namespace["f"])(41) == 42


# A small input with no cluster: one participant in the calling process, in
# scikit-learn's order (``_lone``), the first thing a new user fits.
_LONE_FIRST_FIT = _COUNT_COMPILES + r"""
import json
import numpy as np
from dask_ps.linear_model import SGDClassifier
from sklearn.linear_model import SGDClassifier as Sk
rng = np.random.RandomState(0)
X = rng.randn(500, 6); y = (X[:, 0] + 0.5 * rng.randn(500) > 0).astype(int)
ours, theirs = SGDClassifier(random_state=0).fit(X, y), Sk(random_state=0).fit(X, y)
same = bool(np.array_equal(ours.coef_, theirs.coef_) and np.array_equal(ours.intercept_, theirs.intercept_)
            and ours.n_iter_ == theirs.n_iter_)
print("RESULT " + json.dumps({"compiled": compiled, "same": same, "n_iter": int(ours.n_iter_)}))
"""


def test_a_first_fit_without_a_cluster_compiles_the_round_kernel_and_the_shuffle_only(tmp_path):
    """A lone participant's epochs and stopping rule are a Python loop around
    the round kernel (``_lone.lone_epochs``): a first fit compiles the round
    kernel of its case (the weight vector's state kept) and scikit-learn's
    shuffle, once each, and no loop over the epochs (its compile was ~0.65 s
    of CPU, most of what a new user waited for); the model is still
    scikit-learn's bit for bit, epochs included."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["DASK_PS__KERNEL_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", _LONE_FIRST_FIT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    ours = sorted(name.removeprefix("dask_ps.linear_model._sgd_numba.") for name in result["compiled"]
                  if name.startswith("dask_ps."))
    assert len(ours) == 2 and ours[1] == "sklearn_shuffle", result["compiled"]
    assert ours[0].startswith("sgd_round__") and "keep_1" in ours[0] and "dense_1" in ours[0], ours
    assert result["same"] and result["n_iter"] > 1, result
