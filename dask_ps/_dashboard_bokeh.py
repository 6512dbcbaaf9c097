"""``/ps`` as a Bokeh document of Dask's dashboard (needs bokeh).

distributed builds its pages as Bokeh documents (``applications`` in
``distributed/dashboard/scheduler.py``) served by a Bokeh application
mounted on the scheduler's HTTP server, with the navigation bar of its
template listing ``template_variables(scheduler)["pages"]``. It has no
registry for a third-party page, so :func:`add_page` does what its
``connect`` does for its own: a ``BokehApplication`` (distributed's
factory: same prefix, websocket origins and settings) serving ``/ps``,
added to the scheduler's HTTP application, and ``"ps"`` added to the
pages, so the link shows on every page of the dashboard. The document uses
Dask's template and theme.

The document (:class:`PSPage`) reads :class:`~dask_ps._dashboard.PSDashboard`
state on the scheduler's event loop every second: no call to the workers
(the dashboard's periodic sample makes those).
"""

from __future__ import annotations

import html
import logging
from functools import partial

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, Legend, LegendItem
from bokeh.palettes import Category10
from bokeh.plotting import figure
from tornado.ioloop import IOLoop

from dask_ps._dashboard_html import fmt_bytes, fmt_loss, fmt_progress, fmt_result, html_table

logger = logging.getLogger(__name__)

ROUTE = "/ps"
PAGE = "ps"  # in the navigation bar
UPDATE_MS = 1000
COLORS = Category10[10]
CHARTED_FINISHED = 10  # the latest finished runs whose lines stay on the charts (all stay in the table)


def _ms(t: float) -> float:
    return 1000.0 * t  # bokeh datetime axes count milliseconds


_CSS = """
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f2f2f2; }
"""


def _chart(title, y_label, **kwargs):
    fig = figure(title=title, x_axis_type="datetime", height=230, sizing_mode="stretch_width",
                 tools="pan,wheel_zoom,box_zoom,reset", toolbar_location="above", **kwargs)
    fig.yaxis.axis_label = y_label
    return fig


class PSPage:
    """The charts and tables of ``/ps``; :meth:`update` refreshes them."""

    def __init__(self, dashboard):
        self.dashboard = dashboard
        columns = {
            "traffic": ("time", "pushes", "pulls"),
            "units": ("xs", "ys", "color", "label"),
            "loss": ("xs", "ys", "color", "label"),
            "spread": ("xs", "ys", "color", "label"),
            "progress": ("label", "fraction", "text", "color"),
            "runs": ("run", "label", "progress", "loss", "loss_name", "participants", "clocks", "spread", "waiting",
                     "seconds", "state"),
            "finished": ("label", "result", "seconds", "progress", "loss", "loss_name"),
            "workers": ("worker", "memory", "memory_limit", "cpu", "server", "ps_bytes", "pushes", "pulls"),
            "tables": ("name", "used_by", "shape", "dtype", "rule", "consistency", "copies", "blocks", "bytes"),
        }
        self.sources = {k: ColumnDataSource({c: [] for c in cols}, name=f"ps-{k}") for k, cols in columns.items()}
        self.summary = Div(text="", sizing_mode="stretch_width", name="ps-summary")
        self.root = self._layout()

    def _layout(self):
        s = self.sources
        traffic = _chart("Traffic: pushes and reads served per second", "per second")
        r_push = traffic.line("time", "pushes", source=s["traffic"], color=COLORS[0], line_width=2)
        r_pull = traffic.line("time", "pulls", source=s["traffic"], color=COLORS[1], line_width=2)
        traffic.add_layout(Legend(items=[LegendItem(label="pushes", renderers=[r_push]),
                                         LegendItem(label="reads", renderers=[r_pull])], location="top_left"))
        units = _chart("Progress: epochs (SGD) or iterations (LDA) done, the slowest participant of each run",
                       "epochs / iterations")
        units.multi_line("xs", "ys", color="color", legend_field="label", source=s["units"], line_width=2)
        loss = _chart("Loss over time: each run's reported loss (its unit in the run's label)", "loss")
        loss.multi_line("xs", "ys", color="color", legend_field="label", source=s["loss"], line_width=2)
        for fig in (units, loss):
            fig.legend.location = "top_left"
            fig.legend.label_text_font_size = "10px"
        spread = _chart("Staleness: clock spread (fastest minus slowest) of each run", "clocks")
        spread.multi_line("xs", "ys", color="color", source=s["spread"], line_width=2)
        progress = figure(title="Progress: done of planned, in each estimator's units", y_range=[], x_range=(0, 1),
                          height=160, sizing_mode="stretch_width", tools="", toolbar_location=None)
        progress.hbar(y="label", right="fraction", height=0.6, color="color", source=s["progress"])
        progress.text(x=0.01, y="label", text="text", source=s["progress"], text_baseline="middle",
                      text_font_size="11px")
        self.progress_figure = progress
        self.figures = {"traffic": traffic, "units": units, "loss": loss, "spread": spread, "progress": progress}
        self.tables = {  # HTML tables of the sources (BokehJS 3.9's DataTable kept its first rows)
            "runs": [("label", "run"), ("progress", "progress"), ("loss", "last loss"), ("loss_name", "loss is"),
                     ("participants", "participants"), ("clocks", "clocks (min-max)"), ("spread", "spread"),
                     ("waiting", "waiting now"), ("seconds", "age s"), ("state", "state")],
            "finished": [("label", "run"), ("result", "result"), ("seconds", "duration s"),
                         ("progress", "progress"), ("loss", "last loss"), ("loss_name", "loss is")],
            "workers": [("worker", "worker"), ("memory", "memory"), ("memory_limit", "limit"), ("cpu", "CPU %"),
                        ("server", "parameter server"), ("ps_bytes", "table bytes"), ("pushes", "pushes"),
                        ("pulls", "reads")],
            "tables": [("name", "table"), ("used_by", "used by"), ("shape", "shape"), ("dtype", "dtype"),
                       ("rule", "rule"), ("consistency", "consistency"), ("copies", "copies"), ("blocks", "blocks"),
                       ("bytes", "bytes")],
        }
        self.divs = {k: Div(text="", sizing_mode="stretch_width", name=f"ps-{k}-table", stylesheets=[_CSS])
                     for k in self.tables}
        runs, finished, workers, tables = (self.divs[k] for k in ("runs", "finished", "workers", "tables"))
        heading = partial(Div, sizing_mode="stretch_width")
        return column(
            self.summary, progress, heading(text="<b>Runs</b>"), runs,
            row(units, loss, sizing_mode="stretch_width"), row(spread, traffic, sizing_mode="stretch_width"),
            heading(text="<b>Workers</b>"), workers, heading(text="<b>Finished runs</b>"), finished,
            heading(text="<b>Tables</b>"), tables, sizing_mode="stretch_width",
        )

    @staticmethod
    def _set(source, data: dict) -> None:
        if dict(source.data) != data:
            source.data = data

    def update(self):
        st = self.dashboard.state()
        history = st["history"]
        s = self.sources
        s["traffic"].data = {"time": [_ms(h["time"]) for h in history],
                             "pushes": [h["per_second"]["pushes"] for h in history],
                             "pulls": [h["per_second"]["pulls"] for h in history]}
        runs = st["runs"]
        fin = st["finished"]
        color = _colors(runs, fin)
        lines = _lines(history, runs, fin, color)
        for key in ("units", "loss", "spread"):
            s[key].data = lines[key]
        labels = [f"{r['label'][:60]} [{r['run'][:6]}]" for r in runs]
        self.progress_figure.y_range.factors = labels
        s["progress"].data = {"label": labels, "fraction": [r["progress"] or 0.0 for r in runs],
                              "text": [fmt_progress(r) for r in runs], "color": [color[r["run"]] for r in runs]}
        self._set(s["runs"], {
            "run": [r["run"] for r in runs], "label": [r["label"] for r in runs],
            "progress": [fmt_progress(r) for r in runs], "loss": [fmt_loss(r["loss"]) for r in runs],
            "loss_name": [r.get("loss_name") or "-" for r in runs],
            "participants": [r["participants"] for r in runs],
            "clocks": [f"{r['min_clock']}-{r['max_clock']}" for r in runs], "spread": [r["spread"] for r in runs],
            "waiting": [r["waiting"] for r in runs], "seconds": [r["seconds"] for r in runs],
            "state": [r["state"] for r in runs],
        })
        self._set(s["finished"], {"label": [r["label"] for r in fin], "result": [fmt_result(r) for r in fin],
                               "seconds": [r["seconds"] for r in fin], "progress": [fmt_progress(r) for r in fin],
                               "loss": [fmt_loss(r["loss"]) for r in fin],
                               "loss_name": [r.get("loss_name") or "-" for r in fin]})
        ws = st["workers"]
        self._set(s["workers"], {
            "worker": [w["worker"] for w in ws], "memory": [fmt_bytes(w["memory"]) for w in ws],
            "memory_limit": [fmt_bytes(w["memory_limit"]) for w in ws], "cpu": [f"{w['cpu']:.0f}" for w in ws],
            "server": [w["server"] for w in ws], "ps_bytes": [fmt_bytes(w["ps_bytes"]) for w in ws],
            "pushes": [w["pushes"] for w in ws], "pulls": [w["pulls"] for w in ws],
        })
        tb = st["tables"]
        self._set(s["tables"], {
            "name": [t["name"] for t in tb], "used_by": ["; ".join(t["used_by"]) or "-" for t in tb],
            "shape": ["x".join(map(str, t["shape"])) for t in tb],
            "dtype": [t["dtype"] for t in tb], "rule": [t["rule"] for t in tb],
            "consistency": [t["consistency"] for t in tb], "copies": [t["replication"] for t in tb],
            "blocks": [t["blocks"] for t in tb], "bytes": [fmt_bytes(t["bytes"]) for t in tb],
        })
        for key, columns in self.tables.items():
            data = s[key].data
            rows = [list(r) for r in zip(*(data[f] for f, _ in columns))]
            self.divs[key].text = html_table([t for _, t in columns], rows)
        rate = st["traffic"]["per_second"]
        n_ok = sum(v == "ok" for v in st["servers"].values())
        if not (runs or fin or st["parameter_server"]):
            self.summary.text = f"<b>dask_ps parameter server</b>: {html.escape(st['about'])}"
            return
        self.summary.text = (
            f"<b>dask_ps parameter server</b>: {n_ok} of {len(st['servers'])} shard servers answering, "
            f"{len(tb)} tables, {len(runs)} running, {len(fin)} finished; "
            f"{rate['pushes']:.1f} pushes/s ({fmt_bytes(rate['bytes_pushed'])}/s), "
            f"{rate['pulls']:.1f} reads/s ({fmt_bytes(rate['bytes_pulled'])}/s)"
        )


def _colors(runs, finished) -> dict:
    """A color per run, kept while it lives and after it ends (by start)."""
    order = sorted([(r.get("series") or [[r.get("ended", 0)]])[0][0], r["run"]] for r in finished)
    ids = [run for _, run in order] + [r["run"] for r in runs]
    return {run: COLORS[i % len(COLORS)] for i, run in enumerate(ids)}


def _lines(history, runs, finished, color) -> dict:
    """The multi-line sources: per run, its units done, loss and clock
    spread over time; a live run's from the samples, a finished run's from
    the series it kept (no spread: one value at its end)."""
    lines = {k: {"xs": [], "ys": [], "color": [], "label": []} for k in ("units", "loss", "spread")}

    def add(key, run, label, pts):
        pts = [(t, v) for t, v in pts if v is not None]
        if pts:
            lines[key]["xs"].append([_ms(t) for t, _ in pts])
            lines[key]["ys"].append([v for _, v in pts])
            lines[key]["color"].append(color[run])
            lines[key]["label"].append(label)

    def name(r):  # a legend entry's run: the estimator and its parameters, cut
        return r["label"] if len(r["label"]) <= 60 else r["label"][:57] + "..."

    for r in runs:
        samples = [(h["time"], h["runs"][r["run"]]) for h in history if r["run"] in h["runs"]]
        unit = r.get("unit") or "clock"
        add("units", r["run"], f"{name(r)} ({unit}s)",
            [(t, p.get("units") if r.get("unit") else p["min"]) for t, p in samples])
        add("loss", r["run"], f"{name(r)}: {r.get('loss_name') or 'loss'}", [(t, p.get("loss")) for t, p in samples])
        add("spread", r["run"], name(r), [(t, p["spread"]) for t, p in samples])
    for r in finished[:CHARTED_FINISHED]:  # the latest first
        series = r.get("series") or []
        unit = r.get("unit") or "clock"
        add("units", r["run"], f"{name(r)} ({unit}s, finished)", [(t, u) for t, u, _ in series])
        add("loss", r["run"], f"{name(r)}: {r.get('loss_name') or 'loss'} (finished)",
            [(t, x) for t, _, x in series])
    return lines


def ps_doc(dashboard, scheduler, extra, doc):
    """The ``/ps`` document (a Bokeh application's function handler)."""
    from distributed.dashboard.components import add_periodic_callback
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    page = PSPage(dashboard)
    page.update()
    add_periodic_callback(doc, page, UPDATE_MS)
    doc.title = "Dask: Parameter server"
    doc.add_root(page.root)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


def add_page(scheduler, dashboard, prefix: str):
    """Serve :func:`ps_doc` at ``/ps`` in Dask's dashboard and link it from
    the navigation bar; returns the Bokeh application (None if distributed's
    dashboard modules do not import)."""
    try:
        from distributed.dashboard.core import BokehApplication
        from distributed.dashboard.scheduler import template_variables
    except ImportError as e:  # a bokeh that distributed does not accept
        logger.info("dask_ps: no Bokeh page (%s)", e)
        return None
    variables = template_variables(scheduler)  # memoized per scheduler: shared by every page
    pages = variables["pages"]
    if PAGE not in pages:
        pages.insert(pages.index("info") if "info" in pages else len(pages), PAGE)
    app = BokehApplication({ROUTE: partial(ps_doc, dashboard)}, scheduler, prefix=prefix,
                           template_variables=variables)
    scheduler.http_application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    return app
