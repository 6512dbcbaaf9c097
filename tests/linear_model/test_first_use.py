"""A new user's first fit (issue 35): a compile of a kernel says what it is,
and an input's read-only flag compiles no kernel a second time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from dask_ps.linear_model import SGDClassifier

# One script for the first-use tests: fits in a fresh process, each with its
# standard error, the compile notices logged and numba's compiles during it.
# A fresh process with an empty cache costs 3-30 s (load 0-25), so two serve
# the three tests (module fixture ``first_fits``): one cold, one that loads.
_FITS = r"""
import contextlib, io, json, logging, sys
import numpy as np
import numba.core.event as ev
records, compiled = [], []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
log = logging.getLogger("dask_ps._compiled")
log.setLevel(logging.INFO)
log.addHandler(Keep())
class Count(ev.Listener):
    def on_start(self, event):
        compiled.append(event.data["dispatcher"].py_func.__qualname__)
    def on_end(self, event):
        pass
ev.register("numba:compile", Count())
from dask_ps.linear_model import SGDClassifier
rng = np.random.RandomState(0)
X = rng.randn(300, 6); y = (X[:, 0] + 0.5 * rng.randn(300) > 0).astype(int)
fits = []
for loss, verbose, seed in json.loads(sys.argv[1]):
    n_records, n_compiled, err = len(records), len(compiled), io.StringIO()
    with contextlib.redirect_stderr(err):
        est = SGDClassifier(loss=loss, max_iter=5, tol=None, random_state=seed, verbose=verbose).fit(X, y)
    fits.append({"notices": records[n_records:], "compiled": compiled[n_compiled:], "stderr": err.getvalue(),
                 "coef": est.coef_.ravel().tolist() + est.intercept_.tolist()})
print("RESULT " + json.dumps(fits))
"""


def _fits(cache_dir, *plan):
    """The fits of ``plan`` ((loss, verbose, random_state), ...) in a fresh
    process caching its kernels in ``cache_dir``."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    # every compile is "long": the notice's content is tested, not the machine's speed
    env.update(DASK_PS__KERNEL_CACHE_DIR=str(cache_dir), DASK_PS__COMPILE_NOTICE="0s")
    out = subprocess.run([sys.executable, "-c", _FITS, json.dumps(plan)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])


@pytest.fixture(scope="module")
def first_fits(tmp_path_factory):
    """(cache directory, fits of a process with an empty cache, fits of a
    later process): hinge without ``verbose``, log loss with it, log loss
    again (the same types); then the two losses loaded in the other order."""
    cache = tmp_path_factory.mktemp("kernels")
    cold = _fits(cache, ("hinge", 0, 0), ("log_loss", 1, 0), ("log_loss", 1, 1))
    warm = _fits(cache, ("log_loss", 1, 0), ("hinge", 1, 0))
    return cache, cold, warm


def test_a_compile_on_first_use_says_what_it_is(first_fits):
    """A fresh process with an empty kernel cache: the first fit's compile
    is logged (the kernel, the data's type, where it is cached) and, with
    ``verbose``, also written as a line of the fit (standard error, as the
    fit's other notes); a second fit of the same types compiles nothing and
    says nothing, nor does a later process that loads the kernel."""
    cache, (hinge, log_loss, again), warm = first_fits
    for fit in (hinge, log_loss):
        started = [m for m in fit["notices"] if m.startswith("dask_ps: compiling the kernel _sgd_numba.sgd_round")]
        assert started, fit
        assert "float64 data" in started[0], started
        assert str(cache) in started[0]
        assert any(m.startswith("dask_ps: compiled the kernel _sgd_numba.sgd_round in") for m in fit["notices"])
    assert started[0].split(";")[0] in log_loss["stderr"]  # the verbose line
    assert again["notices"] == [] and again["compiled"] == []
    for fit in warm:  # the kernels are cached now
        assert fit["notices"] == [] and "compiling" not in fit["stderr"]


def test_no_compile_notice_without_verbose_on_standard_error(first_fits):
    """Without ``verbose`` the notice goes to the log only."""
    _, (hinge, _, _), _ = first_fits
    assert any(m.startswith("dask_ps: compiling the kernel") for m in hinge["notices"])
    assert "dask_ps: compiling" not in hinge["stderr"]


def _kernels():
    """The compiled signatures of each SGD kernel, over its specializations."""
    from dask_ps.linear_model import _sgd_numba

    made = _sgd_numba.compiled_kernels()
    return {"sgd_round": sum(len(d.signatures) for d in made["sgd_round"]),
            "sklearn_shuffle": len(_sgd_numba.sklearn_shuffle.signatures),
            "gather_rows": len(_sgd_numba.gather_rows.signatures)}


def _read_only(X):
    if sp.issparse(X):
        X = X.copy()
        X.data.flags.writeable = False
        return X
    X = X.copy()
    X.flags.writeable = False
    return X


# Each case compiles its kernels first (a fresh clone's cache is empty): the
# default run takes each layout and each dtype once, -m slow the other two.
@pytest.mark.parametrize("dtype, sparse", [
    pytest.param(np.float64, False, id="float64-dense"),
    pytest.param(np.float32, True, id="float32-sparse"),
    pytest.param(np.float32, False, id="float32-dense", marks=pytest.mark.slow),
    pytest.param(np.float64, True, id="float64-sparse", marks=pytest.mark.slow),
])
def test_a_read_only_input_compiles_no_kernel_again(sparse, dtype):
    """numba compiles a kernel once per argument type, and an array's read-only
    flag is part of its type: a read-only input (a memory map; scikit-learn's
    ``check_estimator`` fits some) compiled every kernel a second time. Both
    fits here train in the calling process (a small input, no cluster)."""
    rng = np.random.RandomState(0)
    X = rng.randn(400, 6).astype(dtype)
    y = (X[:, 0] > 0).astype(int)
    if sparse:
        X[np.abs(X) < 0.5] = 0
        X = sp.csr_matrix(X)
    SGDClassifier(max_iter=2, tol=None, random_state=0).fit(X, y)
    before = _kernels()
    SGDClassifier(max_iter=2, tol=None, random_state=0).fit(_read_only(X), y)
    assert _kernels() == before


def test_a_read_only_input_on_the_cluster_compiles_no_kernel_again(client):
    """The same on the parameter server's path (rounds of gathered rows)."""
    rng = np.random.RandomState(1)
    X = rng.randn(6000, 5)
    y = (X[:, 1] > 0).astype(int)
    SGDClassifier(max_iter=2, tol=None, random_state=0, client=client).fit(X, y)
    before = _kernels()
    SGDClassifier(max_iter=2, tol=None, random_state=0, client=client).fit(_read_only(X), y)
    assert _kernels() == before


def test_each_case_is_its_own_kernel_in_the_cache(first_fits):
    """The SGD kernels are compiled per case (the loss, the penalty, ...:
    ``_compiled.Specializations``), and a fit compiles its case only; the
    cases share one source file and numba keys its cache index by bytecode
    and argument types, not by the constants a copy reads: a later process
    that loads them must get each case's own code (two losses, loaded in
    the other order, give the first process's models exactly)."""
    _, (hinge, log_loss, _), (log_loss_again, hinge_again) = first_fits
    cases = [name for fit in (hinge, log_loss) for name in fit["compiled"] if name.startswith("sgd_round__")]
    assert len(cases) == 2 and "loss_id_0" in cases[0] and "loss_id_2" in cases[1], cases
    assert hinge["coef"] != log_loss["coef"]
    for fit in (log_loss_again, hinge_again):
        assert not [name for name in fit["compiled"] if name.startswith("sgd_round")], fit
    assert (hinge_again["coef"], log_loss_again["coef"]) == (hinge["coef"], log_loss["coef"])


def test_a_constant_the_body_assigns_is_refused():
    """A specialization's constants are global names its body only reads: a
    local of that name (an argument, an assignment) would hide the constant
    and its branches would be compiled, not pruned."""
    from dask_ps._compiled import Specializations

    def kernel(x, flag):
        return x + 1 if flag else x

    with pytest.raises(TypeError, match="flag"):
        Specializations(kernel).make(flag=True)

    def reads(x):
        return x + 1 if flag else x  # noqa: F821 - the specialization's constant

    assert Specializations(reads, cache=False).make(flag=True)(1) == 2
    assert Specializations(reads, cache=False).make(flag=False)(1) == 1
