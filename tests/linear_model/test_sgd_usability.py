"""SGD estimators the way scikit-learn and Dask users use them (issue 13):
live verbose progress, the same errors for dask inputs as for arrays,
compiled kernels cached outside the package, ``partial_fit`` of small
blocks in the calling process, run ids linking ``metrics_`` to
``ps.metrics()``.

One module-scoped in-process LocalCluster (2 workers, 1 thread each): the
participants run in this process, so a test can hold one back (a patched
method) until the client printed something.
"""

from __future__ import annotations

import io
import sys
import threading

import dask
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.preprocessing import StandardScaler

from dask_ps.linear_model import SGDClassifier, _participant
from ps_fixtures import SGD_BY_ROWS

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster, set_as_default=False) as c:
            yield c


def _data(n, d=20, seed=0):
    X, y = make_classification(n, d, random_state=seed)
    return StandardScaler().fit_transform(X), y


# --- live progress -----------------------------------------------------------------------------


class _Recorder(io.TextIOBase):
    """A stdout that keeps what was written and says when ``needle`` was."""

    def __init__(self, needle):
        self.text, self.needle, self.seen = [], needle, threading.Event()

    def write(self, s):
        self.text.append(s)
        if self.needle in "".join(self.text):
            self.seen.set()
        return len(s)


@pytest.mark.parametrize("n_samples", [5000, 30000], ids=["one-participant", "two-participants"])
def test_verbose_lines_appear_while_the_fit_runs(client, monkeypatch, n_samples):
    """Every participant waits at the end of its third epoch until the
    client printed the first one (at most 20 s): the lines come from the
    participants while the fit runs, not from the results afterwards (the
    previous code printed everything after the run, starting with
    ``avg. objective nan (of epoch -1)``)."""
    out = _Recorder("-- Epoch 1\n")
    printed_during_fit = []
    report = _participant._Participant.report  # each epoch's progress row (a lone participant's loop too)

    def held_report(self, epoch, *args, **kwargs):
        result = report(self, epoch, *args, **kwargs)
        if epoch == 2:
            printed_during_fit.append(out.seen.wait(20))
        return result

    monkeypatch.setattr(_participant._Participant, "report", held_report)
    monkeypatch.setattr(sys, "stdout", out)
    X, y = _data(n_samples)
    est = SGDClassifier(max_iter=5, tol=None, verbose=1, random_state=0, client=client).fit(X, y)
    monkeypatch.undo()
    text = "".join(out.text)
    assert printed_during_fit and all(printed_during_fit), text
    lines = text.splitlines()
    assert lines[0] == "-- Epoch 1", text
    assert [ln for ln in lines if ln.startswith("-- Epoch")] == [f"-- Epoch {e}" for e in range(1, 6)]
    stats = [ln for ln in lines if ln.startswith("Norm: ")]
    assert len(stats) == 5 and all(", NNZs: " in ln and ", Bias: " in ln and ", Avg. loss: " in ln for ln in stats)
    assert "nan" not in text.lower()
    assert all("samples/s" in ln and "staleness" in ln for ln in lines if ln.startswith("Total training time"))
    # T counts the samples trained in this call, as scikit-learn's
    assert stats[-1].split("T: ")[1].split(",")[0] == str(5 * n_samples)
    assert est.n_iter_ == 5


def test_verbose_avg_loss_is_scikit_learns_for_one_participant(client, capsys):
    """One participant without shuffling is scikit-learn's run: the same
    per-epoch average loss (and the same T)."""
    from sklearn.linear_model import SGDClassifier as SkSGDClassifier

    X, y = _data(3000)
    kw = dict(max_iter=3, tol=None, shuffle=False, verbose=1, random_state=0)
    SkSGDClassifier(**kw).fit(X, y)
    sk = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Norm:")]
    SGDClassifier(client=client, **kw).fit(X, y)
    ours = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Norm:")]

    def field(line, name):
        return float(line.split(f"{name}: ")[1].split(",")[0])

    assert len(sk) == len(ours) == 3
    for a, b in zip(sk, ours):
        for name in ("Norm", "NNZs", "T"):
            assert field(a, name) == pytest.approx(field(b, name), rel=1e-6), (a, b)
        assert field(a, "Avg. loss") == pytest.approx(field(b, "Avg. loss"), rel=1e-6), (a, b)
        assert field(a, "Bias") == pytest.approx(field(b, "Bias"), rel=1e-6, abs=1e-9), (a, b)


def test_progress_bar_with_tqdm(client, capsys):
    """``ps.progress-bar``: a tqdm bar over the epochs (on stderr), with or
    without verbose; nothing on stdout without verbose."""
    pytest.importorskip("tqdm")
    X, y = _data(3000)
    with dask.config.set({"ps.progress-bar": True}):
        SGDClassifier(max_iter=4, tol=None, random_state=0, client=client).fit(X, y)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "4/4" in captured.err and "SGDClassifier" in captured.err


def test_progress_bar_without_tqdm_is_skipped(client, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError("no tqdm here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    X, y = _data(3000)
    with dask.config.set({"ps.progress-bar": True}):
        SGDClassifier(max_iter=2, tol=None, random_state=0, verbose=1, client=client).fit(X, y)
    captured = capsys.readouterr()
    assert "-- Epoch 2" in captured.out and "2/2" not in captured.err


# --- dask inputs with a client that is not the default ---------------------------------------


def test_dask_inputs_fit_on_a_client_that_is_not_the_default(tmp_path):
    """The embedded cluster's client is never Dask's default: a dask input
    failed with ``No clients found`` (``distributed.wait``), and its labels
    were computed outside the cluster. Run in a fresh process, where no
    other test's client can be the default."""
    import subprocess
    import sys
    import textwrap

    pytest.importorskip("dask.dataframe")
    script = tmp_path / "fit_dask_inputs.py"
    script.write_text(textwrap.dedent("""
        import dask.array as da
        import dask.dataframe as dd
        import distributed
        import pandas as pd
        from sklearn.datasets import make_classification
        from sklearn.preprocessing import StandardScaler
        from dask_ps.linear_model import SGDClassifier

        X, y = make_classification(4000, 5, random_state=0)  # as _data(4000, d=5)
        X = StandardScaler().fit_transform(X)
        kw = dict(loss="log_loss", max_iter=20, tol=None, random_state=0)
        est = SGDClassifier(**kw).fit(da.from_array(X, chunks=1000), da.from_array(y, chunks=1000))
        print("array", est.score(X, y))
        df = dd.from_pandas(pd.DataFrame(X, columns=list("abcde")), npartitions=4)
        est = SGDClassifier(class_weight="balanced", **kw).fit(df, dd.from_pandas(pd.Series(y), npartitions=4))
        print("frame", est.score(X, y), [int(c) for c in est.classes_])
        try:
            distributed.get_client()
            print("a default client")
        except ValueError:
            print("no default client")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert float(lines["array"]) > 0.8
    assert float(lines["frame"].split()[0]) > 0.8 and lines["frame"].endswith("[0, 1]")
    assert lines["no"] == "default client"


# --- errors: dask inputs get scikit-learn's messages -------------------------------------------


def _sk_message(fit, *args, **kwargs):
    from sklearn.linear_model import SGDClassifier as SkSGDClassifier

    with pytest.raises(ValueError) as info:
        getattr(SkSGDClassifier(max_iter=2), fit)(*args, **kwargs)
    return str(info.value)


def _small():
    X, y = _data(100, d=5)
    return X, y


def test_dask_y_of_wrong_length_says_what_scikit_learn_says(client):
    """Was ``Chunks do not add up to shape``."""
    da = pytest.importorskip("dask.array")
    X, y = _small()
    message = _sk_message("fit", X, y[:99])
    with pytest.raises(ValueError) as info:
        SGDClassifier(max_iter=2, client=client).fit(da.from_array(X, chunks=50), da.from_array(y[:99], chunks=50))
    assert str(info.value) == message


def test_dask_sample_weight_of_wrong_length_says_what_scikit_learn_says(client):
    da = pytest.importorskip("dask.array")
    X, y = _small()
    message = _sk_message("fit", X, y, sample_weight=np.ones(99))
    for sw in (np.ones(99), da.ones(99, chunks=50)):
        with pytest.raises(ValueError) as info:
            SGDClassifier(max_iter=2, client=client).fit(da.from_array(X, chunks=50), da.from_array(y, chunks=50),
                                                         sample_weight=sw)
        assert str(info.value) == message


def test_dask_2d_y_says_what_scikit_learn_says(client):
    da = pytest.importorskip("dask.array")
    X, y = _small()
    Y = np.c_[y, y]
    message = _sk_message("fit", X, Y)
    with pytest.raises(ValueError) as info:
        SGDClassifier(max_iter=2, client=client).fit(da.from_array(X, chunks=50), da.from_array(Y, chunks=50))
    assert str(info.value) == message


def test_empty_dask_input_says_what_scikit_learn_says(client):
    """Was ``The number of classes has to be greater than one; got 0 class``:
    a dask array (known length) and a dask DataFrame (length known only once
    computed), for the classifier and the regressor."""
    from sklearn.linear_model import SGDRegressor as SkSGDRegressor

    from dask_ps.linear_model import SGDRegressor

    da = pytest.importorskip("dask.array")
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    X, y = _small()
    inputs = [
        (da.from_array(X[:0], chunks=50), da.from_array(y[:0], chunks=50)),
        (dd.from_pandas(pd.DataFrame(X[:0]), npartitions=1), dd.from_pandas(pd.Series(y[:0]), npartitions=1)),
    ]
    for ours, theirs in ((SGDClassifier, None), (SGDRegressor, SkSGDRegressor)):
        if theirs is None:
            message = _sk_message("fit", X[:0], y[:0])
        else:
            with pytest.raises(ValueError) as info:
                theirs().fit(X[:0], y[:0])
            message = str(info.value)
        for Xd, yd in inputs:
            with pytest.raises(ValueError) as info:
                ours(max_iter=2, client=client).fit(Xd, yd)
            assert str(info.value) == message, (ours, type(Xd))


def test_int64_sparse_indices_are_accepted(client):
    """scikit-learn's SGD refuses int64 indices (asking to report it on its
    tracker); they are downcast here when they fit, for scipy input and for
    dask arrays of scipy chunks, with the same model as int32 indices."""
    import scipy.sparse as sp

    da = pytest.importorskip("dask.array")
    X, y = _small()
    X32 = sp.csr_matrix(X)
    X64 = sp.csr_matrix(X)
    X64.indices, X64.indptr = X64.indices.astype(np.int64), X64.indptr.astype(np.int64)
    assert "32-bit integer indices" in _sk_message("fit", X64, y)
    kw = dict(max_iter=3, tol=None, random_state=0, client=client)
    ref = SGDClassifier(**kw).fit(X32, y)
    for Xin in (X64, da.from_array(X64, chunks=(100, 5), asarray=False)):
        yin = y if isinstance(Xin, sp.spmatrix) else da.from_array(y, chunks=100)
        est = SGDClassifier(**kw).fit(Xin, yin)
        np.testing.assert_array_equal(est.coef_, ref.coef_)
        np.testing.assert_array_equal(est.intercept_, ref.intercept_)
    assert X64.indices.dtype == np.int64  # the caller's matrix is left as it is
    np.testing.assert_array_equal(SGDClassifier(**kw).partial_fit(X64, y, classes=[0, 1]).predict(X64),
                                  SGDClassifier(**kw).partial_fit(X32, y, classes=[0, 1]).predict(X32))


def test_int64_indices_that_do_not_fit_are_refused():
    import scipy.sparse as sp

    from dask_ps.linear_model._data import int32_indices

    X = sp.csr_matrix((3, 2**31 + 5))
    X.indices, X.indptr = X.indices.astype(np.int64), X.indptr.astype(np.int64)
    with pytest.raises(ValueError, match="32-bit indices"):
        int32_indices(X)


# --- compiled kernels: cached outside the package ----------------------------------------------

_FIT_IN_A_FRESH_PROCESS = r"""
import json, pathlib, sys
import numpy as np, scipy.sparse as sp
import dask_ps
from dask_ps.linear_model import SGDClassifier, SGDRegressor, _sgd_numba

# The cache files of the SGD kernels, the only compiled module an SGD fit
# imports (checked below): other processes sharing the source tree may write
# other modules' files meanwhile (e.g. the LDA kernels' under numba's default).
pkg = pathlib.Path(dask_ps.__file__).parent
def cache_files():
    return {str(p): p.stat().st_mtime_ns for p in pkg.rglob("_sgd_numba.*") if p.suffix in (".nbi", ".nbc")}
before = cache_files()
rng = np.random.RandomState(0)
X = rng.randn(3000, 8); y = (X[:, 0] > 0).astype(int)
with dask_ps.ParameterServer() as ps:
    SGDClassifier(max_iter=2, tol=None, client=ps.client).fit(X, y)
    if sys.argv[1] == "every":  # sparse rows and float32 data: kernels of their own
        SGDClassifier(max_iter=2, tol=None, client=ps.client).fit(sp.csr_matrix(X), y)
        SGDRegressor(max_iter=2, tol=None, client=ps.client).fit(X.astype(np.float32), X[:, 1])
after = cache_files()
assert "dask_ps.decomposition._lda_kernels" not in sys.modules
print(json.dumps({
    "written_in_package": sorted(p for p, t in after.items() if before.get(p) != t),
    "cache_paths": sorted({f.stats.cache_path for f in (*_sgd_numba.compiled_kernels()["sgd_round"],
                                                         _sgd_numba.gather_rows, _sgd_numba._compact_fill)}),
}))
"""


def test_compiled_kernels_are_cached_outside_the_package(tmp_path):
    """A fresh process with an empty user cache directory: the kernels are
    compiled into ``$XDG_CACHE_HOME/dask_ps/numba`` (numba's ``cache=True``
    wrote into the package's ``__pycache__``), nothing is written under the
    package directory; ``ps.kernel-cache-dir`` moves them (checked with the
    dense fit's kernels only: every kernel compiles on a fresh cache, 2-3x
    the dense fit's CPU)."""
    import json
    import os
    import pathlib
    import subprocess

    import dask_ps

    pkg = pathlib.Path(dask_ps.__file__).parent
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "DASK_PS__KERNEL_CACHE_DIR")}
    for name, extra, where, fits in [
        ("default", {"XDG_CACHE_HOME": str(tmp_path / "xdg")}, tmp_path / "xdg" / "dask_ps" / "numba", "every"),
        ("config", {"DASK_PS__KERNEL_CACHE_DIR": str(tmp_path / "configured")}, tmp_path / "configured", "dense"),
    ]:
        out = subprocess.run([sys.executable, "-c", _FIT_IN_A_FRESH_PROCESS, fits], env={**env, **extra},
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["written_in_package"] == [], name
        for path in result["cache_paths"]:
            assert pathlib.Path(path).is_relative_to(where), (name, path)
            assert not pathlib.Path(path).is_relative_to(pkg), (name, path)
        assert any(where.rglob("*.nbi")) and any(where.rglob("*.nbc")), name


# --- partial_fit of small blocks in the calling process ------------------------------------------


def _blocks(kind, n_blocks=6, n=500, seed=0):
    import scipy.sparse as sp
    from sklearn.datasets import make_regression

    if kind == "regression":
        X, y = make_regression(n_blocks * n, 8, noise=1.0, random_state=seed)
        X = StandardScaler().fit_transform(X)
    else:
        X, y = make_classification(n_blocks * n, 12, n_informative=6, n_classes=3 if kind == "multiclass" else 2,
                                   random_state=seed)
        X = StandardScaler().fit_transform(X)
    if kind == "sparse":
        X[np.abs(X) < 0.8] = 0
        X = sp.csr_matrix(X)
    return [(X[i * n:(i + 1) * n], y[i * n:(i + 1) * n]) for i in range(n_blocks)]


PARTIAL_FIT_CASES = {
    "binary-hinge": ("binary", lambda c: SGDClassifier(random_state=0, client=c)),
    "multiclass-log-average": ("multiclass", lambda c: SGDClassifier(loss="log_loss", average=2, random_state=1,
                                                                     client=c)),
    "sparse-elasticnet-class-weight": ("sparse", lambda c: SGDClassifier(
        penalty="elasticnet", class_weight={0: 1.0, 1: 3.0}, random_state=2, client=c)),
    "regressor-adaptive": ("regression", lambda c: _regressor(learning_rate="adaptive", eta0=0.01, random_state=3,
                                                               client=c)),
    "float32-modified-huber-no-shuffle": ("binary32", lambda c: SGDClassifier(loss="modified_huber", shuffle=False,
                                                                              client=c)),
}


def _regressor(**kw):
    from dask_ps.linear_model import SGDRegressor

    return SGDRegressor(**kw)


@pytest.mark.parametrize("case", sorted(PARTIAL_FIT_CASES))
def test_partial_fit_in_process_equals_the_parameter_server_path(client, case):
    """k partial_fit calls on blocks under ``2 x
    ps.sgd.min-samples-per-participant`` train in the calling process (no
    run: ``ps.metrics()`` gets none) and give bitwise the model the
    parameter server's one-participant run gives
    (``ps.sgd.partial-fit-in-process: false``)."""
    import dask_ps

    kind, make = PARTIAL_FIT_CASES[case]
    blocks = _blocks(kind.replace("32", ""))
    if kind.endswith("32"):
        blocks = [(X.astype(np.float32), y) for X, y in blocks]
    classes = None if kind == "regression" else np.unique(np.concatenate([y for _, y in blocks]))
    weights = [np.random.RandomState(i).uniform(0.5, 2.0, len(y)) for i, (_, y) in enumerate(blocks)]

    def fit(est):
        for i, (X, y) in enumerate(blocks):
            kw = {} if classes is None else {"classes": classes}
            est.partial_fit(X, y, sample_weight=weights[i], **kw)
        return est

    ps = dask_ps.get_parameter_server(client)
    with dask.config.set({"ps.sgd.partial-fit-in-process": False}):
        on_cluster = fit(make(client))
    assert len(on_cluster.run_ids_) == 1 and on_cluster.run_ids_[0] in ps.metrics()
    runs_before = set(ps.metrics())
    in_process = fit(make(client))
    assert set(ps.metrics()) == runs_before and in_process.run_ids_ == []  # no run on the cluster
    np.testing.assert_array_equal(in_process.coef_, on_cluster.coef_)
    np.testing.assert_array_equal(in_process.intercept_, on_cluster.intercept_)
    assert in_process.coef_.dtype == on_cluster.coef_.dtype
    assert in_process.t_ == on_cluster.t_ and in_process.n_iter_ == on_cluster.n_iter_
    if getattr(on_cluster, "average", False):
        np.testing.assert_array_equal(in_process._average_coef, on_cluster._average_coef)
    assert in_process.metrics_[0]["in_process"] and "in_process" not in on_cluster.metrics_[0]


def test_partial_fit_of_a_large_block_still_runs_on_the_cluster(client):
    import dask_ps

    X, y = _data(2 * 10000 + 10)
    with dask.config.set(SGD_BY_ROWS):  # 2 participants
        est = SGDClassifier(random_state=0, client=client).partial_fit(X, y, classes=[0, 1])
    assert len(est.run_ids_) == 1 and est.run_ids_[0] in dask_ps.get_parameter_server(client).metrics()
    assert len(est.metrics_) == 2


def test_dask_ml_incremental_equals_partial_fit_on_the_parameter_server(client):
    """dask-ml's Incremental calls partial_fit once per block (22 s for 20
    blocks against 0.4 s with scikit-learn's estimator, when each was a
    run on the cluster): the same model as partial_fit on the parameter
    server's path, block after block."""
    dask_ml_wrappers = pytest.importorskip("dask_ml.wrappers")
    da = pytest.importorskip("dask.array")
    X, y = _data(20 * 500, d=10)
    Xd, yd = da.from_array(X, chunks=500), da.from_array(y, chunks=500)
    inc = dask_ml_wrappers.Incremental(SGDClassifier(loss="log_loss", random_state=0, client=client),
                                       shuffle_blocks=False)
    inc.fit(Xd, yd, classes=[0, 1])
    with dask.config.set({"ps.sgd.partial-fit-in-process": False}):
        ref = SGDClassifier(loss="log_loss", random_state=0, client=client)
        for i in range(20):
            ref.partial_fit(X[i * 500:(i + 1) * 500], y[i * 500:(i + 1) * 500], classes=[0, 1])
    np.testing.assert_array_equal(inc.estimator_.coef_, ref.coef_)
    np.testing.assert_array_equal(inc.estimator_.intercept_, ref.intercept_)
    assert inc.score(Xd, yd) > 0.7


# --- run ids: metrics_ linked to ps.metrics() -----------------------------------------------------


def test_run_ids_link_the_estimator_to_ps_metrics(client, tmp_path):
    """``ps.metrics()`` is keyed by run ids: ``run_ids_`` holds the fit's
    (one per checkpoint chunk), and each ``metrics_`` entry its run's."""
    import dask_ps

    X, y = _data(30000)
    ps = dask_ps.get_parameter_server(client)
    with dask.config.set(SGD_BY_ROWS):  # 2 participants
        est = SGDClassifier(max_iter=3, tol=None, random_state=0, client=client).fit(X, y)
    assert len(est.run_ids_) == 1
    run = ps.metrics()[est.run_ids_[0]]
    assert {m["run_id"] for m in est.metrics_} == set(est.run_ids_)
    assert len(est.metrics_) == 2 and run  # the run's own record: clocks, participants' counters
    chunked = SGDClassifier(max_iter=4, tol=None, random_state=0, client=client, checkpoint=str(tmp_path / "ck"),
                            checkpoint_every=2).fit(X, y)
    assert len(chunked.run_ids_) == 2 and all(r in ps.metrics() for r in chunked.run_ids_)
    assert {m["run_id"] for m in chunked.metrics_} == {chunked.run_ids_[-1]}
    assert "run_ids_" not in SGDClassifier().__dict__
