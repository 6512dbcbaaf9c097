"""The ``/ps`` page of the Dask dashboard (issues 24, 35): a Bokeh document of
Dask's dashboard, linked from its navigation bar as soon as the scheduler's
process imported dask_ps (before any run, saying what it will show; also
``dask scheduler --preload dask_ps``), with charts over time (progress in
the estimator's units, loss, spread, traffic) that finished runs keep,
progress in epochs (SGD) or iterations (LDA), runs named by their
estimator, parameters and last loss (its unit named), memory and CPU per
worker, finished runs; ``/ps/status.json``; the plain page without bokeh.

The browser test is ``test_dashboard_browser.py`` (``-m slow``)."""

from __future__ import annotations

import html
import json
import re
import threading
import time
import urllib.request

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps
from dask_ps import _dashboard, _dashboard_html
from dask_ps._dashboard_html import NO_BOKEH, NO_DASHBOARD
from ps_fixtures import wait_until as _until


def _get(base, route):
    with urllib.request.urlopen(base + route, timeout=30) as r:
        assert r.status == 200
        return r.read().decode()


def _participant(ctx, part, release):
    for i in range(3):
        ctx.pull("dash-w")
        ctx.push_rows("dash-w", part, np.ones((len(part), 4)))
        ctx.clock()
        dask_ps.report_progress(ctx, loss=1.0 / (1 + i + ctx.rank))
    while not release.exists():  # hold the run open, pushing, while the page is read
        ctx.push_rows("dash-w", part, np.ones((len(part), 4)))
        ctx.flush()
        time.sleep(0.05)
    return ctx.rank


@pytest.fixture(scope="module")
def dash_cluster():
    """An in-process cluster serving Dask's Bokeh dashboard (bokeh is in the test extra)."""
    pytest.importorskip("bokeh")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield cluster, client, f"http://127.0.0.1:{cluster.scheduler.http_server.port}"


def test_status_json_shows_runs_workers_traffic_and_finished_runs(dash_cluster, tmp_path):
    cluster, client, base = dash_cluster
    ps = dask_ps.ParameterServer(client)
    ps.create_table("dash-w", shape=(1000, 4), dtype="float64", replication=2)
    release = tmp_path / "release"
    result = {}
    info = {"name": "MyModel", "params": {"alpha": 0.5}, "planned_clocks": 3}
    runner = threading.Thread(target=lambda: result.update(
        out=ps.run(_participant, [np.arange(0, 10), np.arange(10, 20)], release=release, run_info=info)))
    runner.start()
    try:
        def ready():
            run = [r for r in ps.client.run_on_scheduler(_live_runs) if r["function"] == "_participant"]
            return run and min(run[0]["clocks"]) >= 3 and run[0]["loss"] is not None
        _until(ready, "the run's three clocks and a loss")
        dashboard = cluster.scheduler.extensions["ps"].dashboard
        n = len(dashboard.history)
        _until(lambda: len(dashboard.history) >= n + 2, "two samples of the scheduler's periodic callback")
        # One request, the first of this viewer: the rates are the scheduler's
        # last sample's (the old page computed them since the previous request: 0.0).
        snap = json.loads(_get(base, "/ps/status.json"))
    finally:
        release.write_text("x")
        runner.join(60)
    assert result["out"] == [0, 1]
    (run,) = [r for r in snap["runs"] if r["function"] == "_participant"]
    assert run["label"] == "MyModel(alpha=0.5)" and run["participants"] == 2
    assert run["clocks"] == [3, 3] and run["clocks_done"] == 3 and run["planned_clocks"] == 3
    assert run["progress"] == 1.0
    assert run["loss"] == pytest.approx((1 / 3 + 1 / 4) / 2)  # the mean of the last reports
    (table,) = [t for t in snap["tables"] if t["name"] == "dash-w"]
    assert table["bytes"] == 2 * 1000 * 4 * 8  # two copies of every block
    assert table["used_by"] == ["MyModel(alpha=0.5)"]  # the run, not only a table name
    assert sum(d["primary"] for d in table["placement"].values()) == table["blocks"]
    traffic = snap["traffic"]
    assert traffic["totals"]["pushes"] >= 8 and traffic["totals"]["pulls"] >= 2
    # the history ring: samples about a second apart, with the run's clocks
    history = snap["history"]
    assert len(history) >= 2 and all(b["time"] > a["time"] for a, b in zip(history, history[1:]))
    assert traffic["per_second"] == history[-1]["per_second"] and traffic["per_second"]["pushes"] > 0
    assert [h["runs"][run["run"]]["min"] for h in history if run["run"] in h["runs"]][-1] == 3
    # memory and CPU of every worker, from the scheduler's heartbeats
    workers = {w["worker"]: w for w in snap["workers"]}
    assert set(workers) == set(cluster.scheduler.workers)
    assert all(w["memory"] > 0 and w["memory_limit"] > 0 and w["cpu"] >= 0 for w in workers.values())
    assert sum(w["ps_bytes"] for w in workers.values()) == table["bytes"]

    # once ended, the run is listed among the finished runs with its duration and result
    snap = json.loads(_get(base, "/ps/status.json"))
    assert run["run"] not in {r["run"] for r in snap["runs"]}
    (done,) = [f for f in snap["finished"] if f["run"] == run["run"]]
    assert done["result"] == "done" and done["label"] == "MyModel(alpha=0.5)" and done["seconds"] > 0
    assert done["clocks_done"] == 3 and done["loss"] == pytest.approx(run["loss"])
    ps.drop_table("dash-w")


def _live_runs(dask_scheduler=None):
    return dask_scheduler.extensions["ps"].dashboard.state()["runs"]


def test_traffic_rate_is_sampled_on_the_scheduler(dash_cluster):
    """The rates come from the scheduler's periodic samples, whoever asks:
    two viewers' back-to-back requests see the same rates."""
    cluster, client, base = dash_cluster
    dashboard = cluster.scheduler.extensions["ps"].dashboard if "ps" in cluster.scheduler.extensions else None
    if dashboard is None:
        dask_ps.ParameterServer(client)
        dashboard = cluster.scheduler.extensions["ps"].dashboard
    assert dashboard._callback is not None and dashboard._callback.is_running()
    n = len(dashboard.history)
    _until(lambda: len(dashboard.history) >= n + 2, "two more samples")
    a, b = json.loads(_get(base, "/ps/status.json")), json.loads(_get(base, "/ps/status.json"))
    if a["history"][-1]["time"] == b["history"][-1]["time"]:  # no sample between the two requests
        assert a["traffic"] == b["traffic"]
    assert len(dashboard.history) <= dashboard.history.maxlen


def test_ps_page_is_a_bokeh_document_linked_from_dasks_navigation(dash_cluster):
    cluster, client, base = dash_cluster
    dask_ps.ParameterServer(client)
    page = _get(base, "/ps")
    assert "static/js/bokeh.min.js" in page and "Dask Diagnostic UI" in page  # a Bokeh document in Dask's template
    assert html.escape(NO_BOKEH) not in page and html.escape(NO_DASHBOARD) not in page
    for route in ("/ps", "/status", "/workers"):  # Dask's own pages link to it
        assert '<a href="ps">Ps</a>' in _get(base, route)


def _pull(base):
    from bokeh.client import pull_session

    with pull_session(url=base + "/ps") as session:
        doc = session.document
        out = {f"ps-{k}": _columns(doc.get_model_by_name(f"ps-{k}-table").text)
               for k in ("runs", "finished", "workers", "tables")}
        out["progress"] = dict(_source_of(doc, "progress").data)
        out.update(units=dict(_source_of(doc, "units").data), loss=dict(_source_of(doc, "loss").data),
                   traffic=dict(_source_of(doc, "traffic").data), summary=doc.get_model_by_name("ps-summary").text)
        return out


def _columns(table_html: str) -> dict[str, list[str]]:
    """The columns of an HTML table the document shows, by header."""
    cell = re.compile(r"<t[hd]>(.*?)</t[hd]>")
    rows = [[html.unescape(c) for c in cell.findall(r)] for r in re.findall(r"<tr>(.*?)</tr>", table_html)]
    return {h: [r[i] for r in rows[1:]] for i, h in enumerate(rows[0])} if rows else {}


def _line_of(source: dict, prefix: str) -> int | None:
    """The index of the one line whose label starts with ``prefix``."""
    found = [i for i, label in enumerate(source.get("label", [])) if label.startswith(prefix)]
    assert len(found) <= 1, source.get("label")
    return found[0] if found else None


def _source_of(doc, key):
    from bokeh.models import ColumnDataSource

    (source,) = [m for m in doc.models if isinstance(m, ColumnDataSource) and m.name == f"ps-{key}"]
    return source


def test_bokeh_document_fills_during_an_estimator_fit(dash_cluster, sgd_by_rows):
    """The document Dask's dashboard serves, pulled through Bokeh's
    websocket protocol (bokeh.client) during an SGDClassifier fit: the run
    is named by the estimator and its parameters, with progress in epochs
    (not clocks: 90 epochs are 90 x rounds-per-epoch clocks), a loss named
    with its unit, its epochs and loss over time; memory per worker; then the
    finished run, which keeps its lines on both charts."""
    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    cluster, client, base = dash_cluster
    X, y = make_classification(20000, 10, random_state=0)  # two participants (sgd_by_rows)
    # Long enough for the 1 s samples behind the clocks line to see it run.
    est = SGDClassifier(max_iter=90, tol=None, alpha=1e-3, random_state=0, client=client)
    fit = threading.Thread(target=est.fit, args=(X, y))
    fit.start()
    try:
        def running():
            try:
                d = _pull(base)
            except OSError:  # the fit installs the plugin, and with it /ps, when it starts
                return None
            labels = d["ps-runs"].get("run")
            ok = labels and labels[0].startswith("SGDClassifier(") and d["ps-runs"]["last loss"][0] != "-"
            # the lines come from the periodic samples (ps.dashboard.interval), the loss from reports
            # an earlier test's finished run keeps its lines too: find this run's by name
            sgd_units, sgd_loss = _line_of(d["units"], "SGDClassifier("), _line_of(d["loss"], "SGDClassifier(")
            sampled = sgd_units is not None and sgd_loss is not None and len(d["loss"]["xs"][sgd_loss]) >= 1
            # the progress comes from the servers' clocks, sampled apart from
            # the loss reports: a sample may show the loss before any epoch
            moved = d["progress"]["fraction"] and d["progress"]["fraction"][0] > 0
            return d if ok and sampled and moved else None
        d = _until(running, "the SGD run with a loss and a sampled clock on the Bokeh document")
    finally:
        fit.join(300)
    runs = d["ps-runs"]
    assert runs["run"][0] == "SGDClassifier(alpha=0.001, max_iter=90, random_state=0, tol=None)"
    assert re.fullmatch(r"\d+ of 90 epochs \(\d+%\)", runs["progress"][0]), runs["progress"]
    assert float(runs["last loss"][0]) > 0 and runs["loss is"][0] == "mean hinge loss per sample"
    assert d["progress"]["text"] == runs["progress"] and 0 < d["progress"]["fraction"][0] <= 1
    u, lo = _line_of(d["units"], "SGDClassifier("), _line_of(d["loss"], "SGDClassifier(")
    assert len(d["units"]["xs"][u]) == len(d["units"]["ys"][u]) >= 1 and max(d["units"]["ys"][u]) <= 90
    assert d["units"]["label"][u].endswith("(epochs)") and "mean hinge loss per sample" in d["loss"]["label"][lo]
    assert len(d["traffic"]["time"]) >= 1
    workers = d["ps-workers"]
    assert len(workers["worker"]) == 2 and all(m.endswith("iB") and not m.startswith("0 ") for m in workers["memory"])
    assert all(float(c) >= 0 for c in workers["CPU %"]) and "not a server" not in workers["parameter server"]
    assert "shard servers answering" in d["summary"]

    d = _until(lambda: (lambda d: d if d["ps-finished"].get("run") else None)(_pull(base)), "the finished run")
    fin = d["ps-finished"]
    i = fin["run"].index(runs["run"][0])
    assert fin["result"][i] == "done" and float(fin["duration s"][i]) > 0
    assert fin["progress"][i] == "90 of 90 epochs (100%)"  # tol=None: every epoch ran
    # the finished run keeps its lines: epochs up to 90, and its loss
    k = _line_of(d["units"], "SGDClassifier(")
    assert d["units"]["label"][k].endswith("(epochs, finished)")
    assert d["units"]["ys"][k][-1] == 90 and len(d["units"]["ys"][k]) >= 2
    assert d["loss"]["label"][_line_of(d["loss"], "SGDClassifier(")].endswith("(finished)")


def test_plain_page_without_a_bokeh_dashboard(ps):
    """The shared cluster serves no Bokeh dashboard (dashboard_address=None):
    ``/ps`` is the plain page, saying what is missing."""
    scheduler = ps.client.cluster.scheduler
    dashboard = scheduler.extensions["ps"].dashboard
    assert _dashboard._bokeh_prefix(scheduler) is None and dashboard is not None
    base = f"http://127.0.0.1:{scheduler.http_server.port}"
    page = _get(base, "/ps")
    assert html.escape(NO_DASHBOARD) in page and "<h2>Runs</h2>" in page and "<h2>Workers</h2>" in page
    assert "<h2>Finished runs</h2>" in _get(base, "/ps/body")


@pytest.mark.parametrize("bad, match", [
    ("x", "run_info must be a dict"),
    ({"nme": "x"}, "unknown keys"),
    ({"name": 3}, r"run_info\['name'\] must be a str"),
    ({"params": [1]}, r"run_info\['params'\] must be a dict"),
    ({"planned_clocks": -1}, r"must be an int >= 0"),
    ({"planned_clocks": 2.5}, r"must be an int >= 0"),
    ({"unit": 3}, r"run_info\['unit'\] must be a str"),
    ({"clocks_per_unit": 0}, r"run_info\['clocks_per_unit'\] must be an int >= 1"),
    ({"total_units": np.int64(3)}, r"run_info\['total_units'\] must be an int >= 0"),
])
def test_run_info_is_checked(bad, match):
    with pytest.raises(dask_ps.PSValueError, match=match):
        _dashboard.check_run_info(bad)


def test_run_info_values_travel_as_plain_values():
    out = _dashboard.check_run_info({"name": "E", "params": {"a": [1, 2], "b": None, "c": 0.5}, "planned_clocks": 4})
    assert out == {"name": "E", "params": {"a": "[1, 2]", "b": None, "c": 0.5}, "planned_clocks": 4}


def test_plain_page_says_to_install_bokeh_when_it_is_missing(monkeypatch):
    from dask_ps import _dashboard_html

    monkeypatch.setattr(_dashboard_html.importlib.util, "find_spec", lambda name: None)
    snap = {"traffic": {"totals": dict.fromkeys(_dashboard.TRAFFIC_KEYS, 0),
                        "per_second": dict.fromkeys(_dashboard.TRAFFIC_KEYS, 0.0)},
            "workers": [], "runs": [], "finished": [], "tables": []}
    assert html.escape(NO_BOKEH) in _dashboard_html.render_sections(snap)


def test_estimator_runs_are_named_with_planned_clocks_and_loss(ps):
    """The estimators' runs carry their class, changed parameters and
    planned clocks (``run_info``), and their participants report a loss:
    LDA (a sweep per clock after the starting counts) and SGD (epochs x
    rounds per epoch), as listed among the finished runs."""
    from sklearn.datasets import make_classification

    from dask_ps.decomposition import LatentDirichletAllocation
    from dask_ps.linear_model import SGDRegressor

    dashboard = ps.client.cluster.scheduler.extensions["ps"].dashboard
    counts = np.random.default_rng(0).poisson(0.3, size=(200, 50))
    with dask.config.set({"ps.lda.min-tokens-per-participant": 100}):  # two participants: a clock per sweep
        LatentDirichletAllocation(n_components=3, max_iter=5, evaluate_every=1, random_state=0, n_jobs=2,
                                  client=ps.client).fit(counts)
    X, y = make_classification(20000, 5, random_state=0)
    SGDRegressor(max_iter=3, tol=None, random_state=0, client=ps.client).fit(X, y)

    def finished(prefix):
        runs = [f for f in dashboard.finished if f["label"].startswith(prefix) and f["loss"] is not None]
        return runs[-1] if runs else None

    lda = _until(lambda: finished("LatentDirichletAllocation("),
                 "the LDA run's loss (reports travel in the background)", timeout=30)
    assert lda["label"] == ("LatentDirichletAllocation(evaluate_every=1, max_iter=5, n_components=3, n_jobs=2, "
                            "random_state=0)") and lda["participants"] == 2
    assert lda["planned_clocks"] == lda["clocks_done"] == 6 and lda["result"] == "done"
    # in iterations, not clocks (the starting counts' clock is no iteration)
    assert lda["unit"] == "iteration" and lda["units_done"] == lda["total_units"] == 5 and lda["progress"] == 1.0
    assert lda["loss"] > 0 and lda["loss_name"] == "-log p(words, topics) per token, nats"
    assert lda["series"][-1][1:] == [5, lda["loss"]]  # its chart ends at its final state
    sgd = _until(lambda: finished("SGDRegressor("), "the SGD run's loss", timeout=30)
    assert sgd["label"] == "SGDRegressor(max_iter=3, random_state=0, tol=None)"
    assert sgd["planned_clocks"] == sgd["clocks_done"] and sgd["planned_clocks"] % 3 == 0 and sgd["loss"] > 0
    assert sgd["unit"] == "epoch" and sgd["units_done"] == sgd["total_units"] == 3
    assert sgd["loss_name"] == "mean squared_error loss per sample"
    assert _dashboard_html.fmt_progress(sgd) == "3 of 3 epochs (100%)"


@pytest.mark.parametrize("interval", ["0s", "250ms"])
def test_a_lone_lda_participant_shows_its_iterations_while_it_samples(ps, monkeypatch, interval):
    """A small corpus gets one participant, which keeps its counts local
    and clocks only after its starting counts and at its end
    (``_gibbs._lone_iterations``): its progress on the page is the
    iterations it reports, as clocks (the starting counts', then one per
    sweep) of 1 + max_iter planned, at most once per
    ``ps.dashboard.report-interval`` and after its last sweep (the page
    read "0 of 2 clocks" until the end)."""
    from dask_ps.decomposition import LatentDirichletAllocation

    dashboard = ps.client.cluster.scheduler.extensions["ps"].dashboard
    received = []  # the reports, as the scheduler's listener hands them over
    on_report = dashboard.on_report
    monkeypatch.setattr(dashboard, "on_report", lambda msg: (received.append(msg), on_report(msg)))
    counts = np.random.default_rng(1).poisson(0.3, size=(80, 40))
    before = {f["run"] for f in dashboard.finished}
    with dask.config.set({"ps.dashboard.report-interval": interval}):
        est = LatentDirichletAllocation(n_components=3, max_iter=9, random_state=5, client=ps.client).fit(counts)
    assert [m["clock"] for m in est.metrics_] == [2]  # one participant, which clocked twice
    label = "LatentDirichletAllocation(max_iter=9, n_components=3, random_state=5)"
    done = _until(lambda: [f for f in dashboard.finished if f["run"] not in before and f["label"] == label],
                  "the finished LDA run", 30)[0]
    run_id = done["run"]
    assert done["participants"] == 1 and done["planned_clocks"] == 10 and done["clocks_done"] == 10
    assert done["progress"] == 1.0
    clocks = [m["values"]["clock"] for m in received if m["run_id"] == run_id and "clock" in m["values"]]
    if interval == "0s":  # a report after every sweep, while the run went on
        assert clocks == list(range(2, 11))
    else:
        assert clocks and clocks[-1] == 10 and clocks == sorted(clocks)


def test_report_progress_takes_numbers_and_does_nothing_outside_a_worker():
    class Ctx:
        run_id, rank = "r", 0

    dask_ps.report_progress(Ctx(), loss=np.float32(0.5), clock=np.int64(3))  # not on a worker: nothing sent
    with pytest.raises(dask_ps.PSValueError, match="numbers only"):
        dask_ps.report_progress(Ctx(), loss="low")


def test_fits_trained_in_the_calling_process_show_on_the_page(dash_cluster, monkeypatch):
    """A small fit trains in the calling process (``partial_fit``; ``fit``
    with no cluster chosen): no parameter-server run, yet where the process
    has a client of a cluster (given, current, or the embedded cluster's)
    the page lists it among the finished runs, named, with its clocks
    (epochs) of planned, loss, duration and result. Without any cluster,
    nothing is reported and none is started for it."""
    import distributed
    from sklearn.datasets import make_classification

    from dask_ps import _client
    from dask_ps._client import existing_client
    from dask_ps.linear_model import SGDClassifier, SGDRegressor

    cluster, client, base = dash_cluster
    dask_ps.ParameterServer(client)
    X, y = make_classification(300, 5, random_state=0)
    # partial_fit of a small block, with the client given
    est = SGDClassifier(alpha=0.01, random_state=0, client=client).partial_fit(X, y, classes=[0, 1])
    assert est.run_ids_ == []  # trained in this process
    # fit with client=None and no current client, the embedded cluster started earlier (here: this one)
    monkeypatch.setattr(distributed, "get_client", lambda: (_ for _ in ()).throw(ValueError("No clients found")))
    monkeypatch.setattr(_client, "_auto_ps", type("Embedded", (), {"client": client})())
    reg = SGDRegressor(max_iter=7, tol=None, random_state=0).fit(X, y.astype(float))
    assert reg.run_ids_ == [] and reg.metrics_[0]["in_process"]

    def listed(d):
        fin = d["ps-finished"]
        labels = fin.get("run", [])
        want = ["SGDClassifier(alpha=0.01, random_state=0)", "SGDRegressor(max_iter=7, random_state=0, tol=None)"]
        return d if all(w in labels for w in want) else None

    d = _until(lambda: listed(_pull(base)), "the two in-process fits among the finished runs", timeout=30)
    fin = d["ps-finished"]
    i, j = fin["run"].index("SGDClassifier(alpha=0.01, random_state=0)"), fin["run"].index(
        "SGDRegressor(max_iter=7, random_state=0, tol=None)")
    assert fin["result"][i] == fin["result"][j] == "done (trained in the calling process)"
    assert fin["progress"][i] == "1 of 1 epochs (100%)"  # partial_fit: one epoch
    assert fin["progress"][j] == "7 of 7 epochs (100%)"  # every epoch ran (tol=None)
    assert float(fin["last loss"][i]) > 0 and float(fin["last loss"][j]) > 0 and float(fin["duration s"][j]) >= 0

    # no cluster at all: nothing to report to, and none started for it
    monkeypatch.setattr(_client, "_auto_ps", None)
    assert existing_client(None) is None
    SGDRegressor(max_iter=3, tol=None, random_state=0).fit(X, y.astype(float))
    assert _client._auto_ps is None


def test_a_live_in_process_run_shows_until_its_end_or_its_client_leaves(dash_cluster):
    """A longer in-process fit shows among the running runs while it trains
    (its reports at most once per ``ps.dashboard.report-interval``), then
    among the finished ones; a run whose client left ends as failed."""
    cluster, client, base = dash_cluster
    dask_ps.ParameterServer(client)  # the plugin and its page exist
    dashboard = cluster.scheduler.extensions["ps"].dashboard
    info = {"name": "SGDClassifier", "params": {"max_iter": 10}, "planned_clocks": 10}
    with dask.config.set({"ps.dashboard.report-interval": "0s"}):
        run = _dashboard.LocalRun(client, info, "_sgd_participant")
        lost = _dashboard.LocalRun(client, info, "_sgd_participant")
    run.report({"clock": 4, "loss": 0.5})
    lost.report({"clock": 2})
    live = _until(lambda: [r for r in dashboard.state()["runs"] if r["run"] == run.run_id], "the live run", 30)[0]
    assert live["label"] == "SGDClassifier(max_iter=10)" and live["state"] == "running in the calling process"
    assert live["clocks_done"] == 4 and live["planned_clocks"] == 10 and live["progress"] == 0.4
    assert live["loss"] == 0.5 and live["participants"] == 1
    from dask_ps import _dashboard_html

    body = _dashboard_html.render_sections(dashboard.state())  # the plain page (no bokeh) shows it too
    assert "SGDClassifier(max_iter=10)" in body and "running in the calling process" in body
    json.dumps(dashboard.state())  # /ps/status.json
    assert run.run_id in _until(lambda: dashboard.history[-1]["runs"] if dashboard.history
                                and run.run_id in dashboard.history[-1]["runs"] else None, "a sample of it", 30)
    run.report({"clock": 10, "loss": 0.25})
    run.end()
    done = _until(lambda: [f for f in dashboard.finished if f["run"] == run.run_id], "its end", 30)[0]
    assert done["result"] == "done" and done["in_process"] and done["clocks_done"] == 10 and done["loss"] == 0.25
    assert run.run_id not in {r["run"] for r in dashboard.state()["runs"]}
    _until(lambda: lost.run_id in dashboard.local_runs, "the other live run", 30)
    dashboard.client_left(client.id)  # the scheduler's remove_client hook
    (gone,) = [f for f in dashboard.finished if f["run"] == lost.run_id]
    assert gone["result"].startswith("failed: its client left") and gone["clocks_done"] == 2
