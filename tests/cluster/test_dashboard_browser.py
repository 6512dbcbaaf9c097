"""The ``/ps`` page in a real headless browser before, during and after a
fit (issues 24, 35): linked from Dask's navigation before anything attached
the parameter server, saying what it will show; during the fit, progress in
epochs, the loss named and charted over time; after it, the finished run
with its charts kept.

Needs playwright (``pip install 'dask-ps[browser]'``) and a Chromium:
Debian's (``apt-get install chromium``, used at ``/usr/bin/chromium``; no
browser download) or the one named by ``DASK_PS_CHROMIUM``. Run with::

    python -m pytest -m slow tests/cluster/test_dashboard_browser.py

``DASK_PS_DASHBOARD_PNG=docs/dashboard.png`` also saves the page's
screenshot there (``scripts/dashboard_screenshot.py`` does this).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time

import pytest
from distributed import Client, LocalCluster

import dask_ps

pytestmark = pytest.mark.slow

# Every text node of the page, through the open shadow roots Bokeh renders
# its views in (styles and scripts left out).
DEEP_TEXT = """() => {
  const out = [];
  const walk = (n) => {
    if (n.nodeType === 3) { out.push(n.textContent); return; }
    if (n.nodeType === 1 && (n.tagName === 'STYLE' || n.tagName === 'SCRIPT')) return;
    if (n.shadowRoot) walk(n.shadowRoot);
    for (const c of n.childNodes) walk(c);
  };
  walk(document.body);
  return out.join(' ').replace(/\\s+/g, ' ');
}"""

# Points drawn by the charts: the lengths of the data sources' columns in
# the browser's copy of the document.
CHART_POINTS = """() => {
  const doc = Bokeh.documents[0];
  const src = (name) => doc.get_model_by_name(name).data;
  const units = src('ps-units'), loss = src('ps-loss'), spread = src('ps-spread'), traffic = src('ps-traffic');
  return {units: units.ys.map(y => Array.from(y)), loss: loss.ys.map(y => Array.from(y)),
          labels: Array.from(units.label), loss_labels: Array.from(loss.label),
          spread: spread.ys.map(y => Array.from(y)), traffic: Array.from(traffic.pushes)};
}"""

CANVASES = """() => {
  let n = 0;
  const walk = (node) => { if (node.tagName === 'CANVAS') n++; if (node.shadowRoot) walk(node.shadowRoot);
                           for (const c of node.children || []) walk(c); };
  walk(document.body);
  return n;
}"""


def _chromium():
    path = os.environ.get("DASK_PS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("no Chromium: apt-get install chromium (or set DASK_PS_CHROMIUM)")
    return path


def _until(page, predicate, what, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}; the page shows: {page.evaluate(DEEP_TEXT)}"
        page.wait_for_timeout(500)


def test_ps_page_in_a_browser_before_during_and_after_a_fit(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    pytest.importorskip("bokeh")
    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    chromium = _chromium()
    X, y = make_classification(20000, 10, random_state=0)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client, sync_api.sync_playwright() as pw:
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        est = SGDClassifier(max_iter=150, tol=None, alpha=1e-3, random_state=0, client=client)
        fit = threading.Thread(target=est.fit, args=(X, y))
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(base + "/status")
            # Dask's navigation bar links the page
            page.get_by_role("link", name="Ps", exact=True).click()
            page.wait_for_url(re.compile(r".*/ps$"))
            # before any run (no ParameterServer yet: dask_ps imported is enough): what it will show
            _until(page, lambda: "No parameter-server run on this cluster yet" in page.evaluate(DEEP_TEXT),
                   "the page before any run")
            assert "epochs for SGD, iterations for LDA" in page.evaluate(DEEP_TEXT)
            fit.start()

            def running():
                text = page.evaluate(DEEP_TEXT)
                m = re.search(r"SGDClassifier\(alpha=0\.001, max_iter=150, random_state=0, tol=None\) "
                              r"(\d+) of (\d+) epochs \((\d+)%\) ([0-9.]+) mean hinge loss per sample", text)
                return (m, text) if m and int(m.group(1)) > 0 else None

            m, text = _until(page, running, "the SGD run with its progress and loss")
            done, planned = int(m.group(1)), int(m.group(2))
            assert planned == 150 and 0 < done <= planned and float(m.group(4)) > 0
            # memory and CPU per worker (Dask's heartbeats); whether it answered the last sample
            # in time (ps_info within 2 s: "ok", else "error") depends on the machine's load
            assert len(re.findall(r"inproc://\S+ [0-9.]+ [MG]iB [0-9.]+ [MG]iB \d+ (ok|error) ", text)) == 2, text
            assert "shard servers answering" in text and "pushes/s" in text
            # the charts over time: epochs rising, loss, spread, traffic; drawn on canvases
            points = _until(page, lambda: (lambda p: p if p["units"] and len(p["units"][0]) >= 3
                                           and p["units"][0][-1] > 0 and p["loss"] else None)(
                page.evaluate(CHART_POINTS)), "three samples on the charts, the last past epoch 0")
            assert points["units"][0] == sorted(points["units"][0]) and max(points["units"][0]) <= 150
            assert points["labels"][0].endswith("(epochs)") and "mean hinge loss" in points["loss_labels"][0]
            assert len(points["spread"]) == 1 and max(points["traffic"]) > 0
            assert page.evaluate(CANVASES) >= 4
            # the picture: some seconds of the run on the charts (or its end on a fast machine)
            _until(page, lambda: (lambda p: not fit.is_alive() or (p["units"] and len(p["units"][0]) >= 6))(
                page.evaluate(CHART_POINTS)), "six samples of the run for the screenshot")
            out = os.environ.get("DASK_PS_DASHBOARD_PNG") or str(tmp_path / "dashboard.png")
            page.screenshot(path=out, full_page=True)
            assert os.path.getsize(out) > 10_000
        finally:
            fit.join(600)
            try:
                finished = _until(page, lambda: re.search(
                    r"Finished runs .*SGDClassifier\(alpha=0\.001[^)]*\) done ([0-9.]+) (\d+) of (\d+) epochs \(100%\)",
                    page.evaluate(DEEP_TEXT)), "the finished run")
                # after it: the finished run keeps its lines on the charts
                kept = _until(page, lambda: (lambda p: p if any(x.endswith("(epochs, finished)") for x in p["labels"])
                                             else None)(page.evaluate(CHART_POINTS)), "the finished run's charts")
            finally:
                browser.close()
        assert float(finished.group(1)) > 0 and finished.group(2) == finished.group(3) == "150"
        (k,) = [k for k, x in enumerate(kept["labels"]) if x.endswith("(epochs, finished)")]
        assert kept["units"][k][-1] == 150 and any(x.endswith("(finished)") for x in kept["loss_labels"])
