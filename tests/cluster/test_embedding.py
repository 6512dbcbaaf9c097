"""dask_ps used the way scikit-learn and Dask users work (issue 13).

Plain scripts without ``if __name__ == "__main__":``, nested parallelism
(loky ``n_jobs``, joblib's dask backend, fits inside Dask tasks), a scheduler
address as ``client=``, and the embedded cluster never becoming Dask's
default scheduler. Each of these failed before the embedded cluster became
an in-process one and a fit waiting inside a task seceded from the
worker's thread pool.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification

import dask_ps
from dask_ps.linear_model import SGDClassifier


def _run_script(tmp_path, source: str, timeout: float = 240) -> subprocess.CompletedProcess:
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(source))
    # Fits that start the embedded cluster (in the script and in its loky
    # workers): a small fit with no cluster chosen would train in the
    # calling process (ps.sgd.fit-in-process) and start none.
    env = dict(os.environ, PYTHONWARNINGS="ignore", DASK_PS__SGD__FIT_IN_PROCESS="False")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env)


def test_plain_script_without_main_guard_and_default_scheduler_unchanged(tmp_path):
    """A script with no ``__main__`` guard fits (no multiprocessing
    tracebacks), and the embedded cluster is not the user's scheduler."""
    out = _run_script(tmp_path, """
        import dask, dask.base
        from sklearn.datasets import make_classification
        from dask_ps.linear_model import SGDClassifier

        before = dask.base.get_scheduler()
        X, y = make_classification(5000, 10, random_state=0)
        clf = SGDClassifier(max_iter=5, tol=None, random_state=0).fit(X, y)
        print("score", clf.score(X, y))
        print("same scheduler", dask.base.get_scheduler() is before)
        from distributed import default_client
        try:
            default_client()
            print("default client set")
        except ValueError:
            print("no default client")
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    score = float(next(l for l in lines if l.startswith("score")).split()[1])
    assert score > 0.75
    assert "same scheduler True" in lines
    assert "no default client" in lines


def test_grid_search_with_loky_n_jobs(tmp_path):
    """``GridSearchCV(n_jobs=2)``: each loky worker (a daemonic process, which
    may not start worker processes) fits on its own embedded cluster."""
    out = _run_script(tmp_path, """
        from sklearn.datasets import make_classification
        from sklearn.model_selection import GridSearchCV
        from dask_ps.linear_model import SGDClassifier

        X, y = make_classification(2000, 10, random_state=0)
        # refit=False: the search's fits are the loky workers'; a refit
        # would start the script's own embedded cluster (tested above)
        gs = GridSearchCV(SGDClassifier(max_iter=5, tol=None, random_state=0),
                          {"alpha": [1e-4, 1e-2]}, cv=2, n_jobs=2, refit=False).fit(X, y)
        print("best", gs.best_score_)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    best = float(out.stdout.split("best")[1])
    assert best > 0.75


def _fit_in_thread(fn, timeout):
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # re-raised in the test thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"the fit did not finish in {timeout} s (a deadlock)")
    if "error" in box:
        raise box["error"]
    return box["result"]


def test_joblib_dask_backend_grid_search_does_not_deadlock():
    """Fits run inside Dask tasks (joblib's dask backend), two per worker at
    a time: the task waiting for its participants secedes from the pool."""
    joblib = pytest.importorskip("joblib")
    from sklearn.model_selection import GridSearchCV

    X, y = make_classification(2000, 10, random_state=0)
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:

        def search():
            with joblib.parallel_backend("dask", client=client):
                return GridSearchCV(SGDClassifier(max_iter=5, tol=None, random_state=0),
                                    {"alpha": [1e-4, 1e-3]}, cv=2).fit(X, y)

        gs = _fit_in_thread(search, timeout=180)
    assert gs.best_score_ > 0.75


def test_scheduler_address_as_client(client):
    X, y = make_classification(2000, 10, random_state=0)
    clf = SGDClassifier(max_iter=5, tol=None, random_state=0, client=client.scheduler.address).fit(X, y)
    assert clf.score(X, y) > 0.75
    assert dask_ps.get_parameter_server(client.scheduler.address).client.scheduler.address == client.scheduler.address


def test_embedded_cluster_settings():
    import dask

    from dask_ps._client import embedded_cluster_kwargs

    assert embedded_cluster_kwargs()["processes"] is False
    with dask.config.set({"ps.embedded-cluster.processes": True, "ps.embedded-cluster.n-workers": 3}):
        kw = embedded_cluster_kwargs({"threads_per_worker": 2})
    assert kw["processes"] is True and kw["n_workers"] == 3 and kw["threads_per_worker"] == 2
    assert np.isfinite(kw["n_workers"])


def test_dask_ml_grid_search_runs_fits_as_tasks():
    """dask-ml's GridSearchCV fits every candidate inside a task of the
    client's cluster: each fit uses that worker's client and secedes."""
    dask_ml_search = pytest.importorskip("dask_ml.model_selection")
    X, y = make_classification(2000, 10, random_state=0)
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):  # the default client: dask-ml computes on it
        gs = _fit_in_thread(lambda: dask_ml_search.GridSearchCV(
            SGDClassifier(max_iter=5, tol=None, random_state=0), {"alpha": [1e-4, 1e-3]}, cv=2).fit(X, y),
            timeout=180)
    assert gs.best_score_ > 0.75
