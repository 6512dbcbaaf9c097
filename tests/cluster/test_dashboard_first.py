"""The ``/ps`` page before the first fit (issue 35): served and linked from
Dask's navigation as soon as the scheduler's process has imported dask_ps
(a ``LocalCluster`` of threads or processes started by this process, or
``dask scheduler --preload dask_ps``), saying what it will show; then
``/ps/status.json`` before, during and after a fit: progress in epochs,
the loss named, its series kept by the finished run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import dask
import pytest
from distributed import Client, LocalCluster

import dask_ps
from dask_ps import _dashboard
from ps_fixtures import wait_until as _until

pytest.importorskip("bokeh")

NAV_LINK = '<a href="ps">Ps</a>'


def _get(base, route, timeout=30):
    with urllib.request.urlopen(base + route, timeout=timeout) as r:
        assert r.status == 200
        return r.read().decode()


def _status(base):
    return json.loads(_get(base, "/ps/status.json"))


def _summary(base):
    from bokeh.client import pull_session

    with pull_session(url=base + "/ps") as session:
        return session.document.get_model_by_name("ps-summary").text


def _assert_page_before_any_run(base, n_workers):
    page = _get(base, "/ps")
    assert "static/js/bokeh.min.js" in page and "Dask Diagnostic UI" in page
    for route in ("/status", "/workers", "/ps"):
        assert NAV_LINK in _get(base, route), route
    snap = _status(base)
    assert snap["parameter_server"] is False and snap["about"] == _dashboard.ABOUT
    assert snap["runs"] == [] and snap["finished"] == [] and snap["tables"] == []
    assert len(snap["workers"]) == n_workers and all(w["server"] == "not a server" for w in snap["workers"])
    # the page says what it will show
    summary = _summary(base)
    assert "No parameter-server run on this cluster yet" in summary and "epochs for SGD" in summary


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_the_page_is_there_before_any_run(processes):
    """A ``LocalCluster`` started after ``import dask_ps`` (its scheduler in
    this process; workers threads or processes): ``/ps`` answers and Dask's
    pages link it before anything attached the parameter server; then
    ``ParameterServer(client)`` takes the same page over."""
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=processes, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        _assert_page_before_any_run(base, 1)
        dask_ps.ParameterServer(client)
        snap = _until(lambda: (lambda s: s if s["parameter_server"] and s["servers"] else None)(_status(base)),
                      "the parameter server on the page")
        assert list(snap["servers"].values()) == ["ok"]
        assert "shard servers answering" in _summary(base)


def test_without_a_bokeh_dashboard_the_plain_page_says_what_it_will_show():
    """A scheduler without Dask's Bokeh dashboard: ``/ps`` is the plain page,
    there before any run too, with the same sentence."""
    import html

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0",
                      scheduler_kwargs={"dashboard": False}) as cluster:
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        page = _get(base, "/ps")
        assert html.escape(_dashboard.ABOUT) in page and "bokeh.min.js" not in page
        assert _status(base)["parameter_server"] is False


def test_a_scheduler_already_running_gets_the_page_and_the_setting_turns_it_off():
    """With ``ps.dashboard.on-import: false`` a new scheduler serves no
    ``/ps`` (until a parameter server attaches); :func:`install_on_import`
    (what ``import dask_ps`` runs) gives a running scheduler the page."""
    with dask.config.set({"ps.dashboard.on-import": False}):
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") \
                as cluster:
            base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
            with pytest.raises(urllib.error.HTTPError, match="404"):
                _get(base, "/ps")
            assert NAV_LINK not in _get(base, "/status")
            with dask.config.set({"ps.dashboard.on-import": True}):
                _dashboard.install_on_import()
                _until(lambda: NAV_LINK in _get(base, "/status"), "the page installed on the running scheduler")
                _assert_page_before_any_run(base, 1)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dask_scheduler_preload_dask_ps_serves_the_page(tmp_path):
    """``dask scheduler --preload dask_ps`` (a separate process): the page
    from the scheduler's start, linked, saying what it will show."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH")] if p))
    proc = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                             "--dashboard-address", f"127.0.0.1:{port}", "--preload", "dask_ps"],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "scheduler.log", "w"))
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            try:
                return _get(base, "/ps", timeout=5)
            except OSError:
                assert proc.poll() is None, (tmp_path / "scheduler.log").read_text()[-3000:]
                return None
        _until(up, "the scheduler's /ps", timeout=120, poll=0.5)
        _assert_page_before_any_run(base, 0)
    finally:
        proc.terminate()
        proc.wait(60)


def _held_after(monkeypatch, epochs):
    """The participants (threads of this process) wait after reporting
    their ``epochs``-th loss until the returned event is set: the page is
    read while the run is held at a known point, whatever the machine's speed."""
    from dask_ps.linear_model import _participant

    gate, report = threading.Event(), _participant.report_progress
    counts, lock = {}, threading.Lock()

    def held(ctx, **values):
        report(ctx, **values)
        if "loss" in values:
            with lock:
                counts[ctx.rank] = counts.get(ctx.rank, 0) + 1
                n = counts[ctx.rank]
            if n == epochs:
                gate.wait(300)

    monkeypatch.setattr(_participant, "report_progress", held)
    return gate


def test_status_json_before_during_and_after_a_fit(monkeypatch, sgd_by_rows):
    """``/ps/status.json`` in each phase of an SGD fit on a fresh cluster:
    before, nothing but what the page will show; during (the run held after
    its 5th epoch), the run with its progress in epochs (not clocks), its
    loss named and sampled over time; after, the finished run with its
    series (its charts), at 100%."""
    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    gate = _held_after(monkeypatch, 5)

    X, y = make_classification(20000, 10, random_state=0)  # two participants (sgd_by_rows)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        before = _status(base)
        assert before["parameter_server"] is False and before["runs"] == [] and before["finished"] == []
        est = SGDClassifier(max_iter=60, tol=None, alpha=1e-3, random_state=0, client=client)
        fit = threading.Thread(target=est.fit, args=(X, y))
        fit.start()
        try:
            def running():
                snap = _status(base)
                runs = [r for r in snap["runs"] if r["label"].startswith("SGDClassifier(")]
                if not runs or runs[0]["loss"] is None or runs[0]["units_done"] < 5:
                    return None
                sampled = [h["runs"][runs[0]["run"]] for h in snap["history"] if runs[0]["run"] in h["runs"]]
                return (runs[0], sampled) if sampled and sampled[-1]["loss"] is not None else None
            run, sampled = _until(running, "the run held after 5 epochs, with its loss sampled")
        finally:
            gate.set()
            fit.join(600)
        assert run["unit"] == "epoch" and run["total_units"] == 60 and 5 <= run["units_done"] < 6
        assert run["planned_clocks"] % 60 == 0 and run["planned_clocks"] > 60  # rounds per epoch: clocks are not epochs
        assert run["progress"] == pytest.approx(run["units_done"] / 60)
        assert run["loss_name"] == "mean hinge loss per sample" and run["loss"] > 0
        assert all(p["units"] is not None and 0 <= p["units"] <= 60 for p in sampled)

        def finished():
            done = [f for f in _status(base)["finished"] if f["label"].startswith("SGDClassifier(")]
            return done[0] if done else None
        done = _until(finished, "the finished run")
        assert done["result"] == "done" and done["units_done"] == 60 and done["progress"] == 1.0
        series = done["series"]
        assert len(series) >= 2 and series[-1][1] == 60 and series[-1][2] == done["loss"]
        assert all(b[0] >= a[0] for a, b in zip(series, series[1:]))  # over time
        units = [u for _, u, _ in series if u is not None]
        assert units == sorted(units)  # epochs only grow
