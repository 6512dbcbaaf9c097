"""``/ps`` without bokeh: a plain HTML page of the dashboard's state.

Dask's dashboard needs bokeh; without it the scheduler serves a page that
says so at ``/status``, and ``/ps`` is this page: the same tables as the
Bokeh document (servers and workers, traffic, runs with their progress and
loss, finished runs, tables), re-rendered every second from
``/ps/body``, no charts, and a line saying what to install for them.
"""

from __future__ import annotations

import html
import importlib.util

from tornado.web import RequestHandler

NO_BOKEH = ("No charts: Dask's dashboard needs bokeh, and so do the charts of this page and its link in "
            "the dashboard's navigation. pip install 'dask-ps[dashboard]' (or bokeh) and restart the scheduler.")
NO_DASHBOARD = ("No charts: this scheduler serves no Bokeh dashboard (started with dashboard=False or no "
                "dashboard address), so this page is plain and not linked from the dashboard's navigation.")


def missing() -> str:
    """Why ``/ps`` is the plain page: bokeh is missing, or the dashboard is off."""
    return NO_DASHBOARD if importlib.util.find_spec("bokeh") is not None else NO_BOKEH


def html_table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_progress(r: dict) -> str:
    """In the estimator's units where the run names one: ``"12 of 60
    epochs (20%)"`` (whole units done), ``"12 epochs"`` when no total is
    known; else ``"106 of 400 clocks (26%)"``, or ``"106 clocks"`` when none
    are planned."""
    if r.get("unit"):
        done = int(r["units_done"] + 1e-9)
        if r.get("total_units"):
            return f"{done} of {r['total_units']} {r['unit']}s ({100 * (r['progress'] or 0):.0f}%)"
        return f"{done} {r['unit']}s"
    if r.get("planned_clocks"):
        return f"{r['clocks_done']} of {r['planned_clocks']} clocks ({100 * (r['progress'] or 0):.0f}%)"
    return f"{r['clocks_done']} clocks"


def fmt_result(r: dict) -> str:
    """A finished run's result, and where it trained if not on the cluster."""
    return r["result"] + (" (trained in the calling process)" if r.get("in_process") else "")


def fmt_loss(x) -> str:
    return "-" if x is None else f"{x:.6g}"


def render_sections(snap: dict) -> str:
    """The page's body for one snapshot (what the page's script re-renders)."""
    t = snap["traffic"]
    traffic = html_table(
        ["", "pushes", "push bytes", "reads", "read bytes"],
        [["total", t["totals"]["pushes"], fmt_bytes(t["totals"]["bytes_pushed"]), t["totals"]["pulls"],
          fmt_bytes(t["totals"]["bytes_pulled"])],
         ["per second", f"{t['per_second']['pushes']:.1f}", fmt_bytes(t["per_second"]["bytes_pushed"]) + "/s",
          f"{t['per_second']['pulls']:.1f}", fmt_bytes(t["per_second"]["bytes_pulled"]) + "/s"]],
    )
    workers = html_table(
        ["worker", "memory", "memory limit", "CPU %", "parameter server", "table bytes", "pushes", "reads"],
        [[w["worker"], fmt_bytes(w["memory"]), fmt_bytes(w["memory_limit"]), f"{w['cpu']:.0f}", w["server"],
          fmt_bytes(w["ps_bytes"]), w["pushes"], w["pulls"]] for w in snap["workers"]],
    )
    runs = html_table(
        ["run", "progress", "loss", "participants", "clocks", "spread", "waiting now", "wait s", "age s", "state"],
        [[r["label"], fmt_progress(r), fmt_loss(r["loss"]), r["participants"], " ".join(map(str, r["clocks"])),
          r["spread"], r["waiting"], r["wait_seconds"], r["seconds"], r["state"]] for r in snap["runs"]],
    )
    finished = html_table(
        ["run", "result", "duration s", "progress", "last loss"],
        [[r["label"], fmt_result(r), r["seconds"], fmt_progress(r), fmt_loss(r["loss"])] for r in snap["finished"]],
    )
    tables = html_table(
        ["table", "shape", "dtype", "rule", "consistency", "copies", "blocks", "bytes",
         "placement (primary/replica blocks, bytes)"],
        [[x["name"], "x".join(map(str, x["shape"])), x["dtype"], x["rule"], x["consistency"], x["replication"],
          x["blocks"] if not x["lost_blocks"] else f"{x['blocks']} (lost: {x['lost_blocks']})", fmt_bytes(x["bytes"]),
          "; ".join(f"{w}: {d['primary']}/{d['replica']}, {fmt_bytes(d['bytes'])}"
                    for w, d in sorted(x["placement"].items()))]
         for x in snap["tables"]],
    )
    about = ("" if snap["runs"] or snap["finished"] or snap.get("parameter_server", True)
             else f"<p>{html.escape(snap['about'])}</p>")
    return (f"<p class='note'>{html.escape(missing())}</p>{about}<h2>Runs</h2>{runs}<h2>Finished runs</h2>{finished}"
            f"<h2>Workers</h2>{workers}<h2>Traffic</h2>{traffic}<h2>Tables</h2>{tables}")


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>dask_ps</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; font-size: 13px; text-align: left; }}
th {{ background: #eef; }} .note {{ color: #a40; }}
h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; margin-top: 1.2em; }}
</style></head>
<body><h1>dask_ps parameter server</h1>
<div id="ps">{body}</div>
<script>
async function refresh() {{
  try {{
    const r = await fetch("{route}/body");
    if (r.ok) document.getElementById("ps").innerHTML = await r.text();
  }} catch (e) {{}}
}}
setInterval(refresh, 1000);
</script></body></html>
"""


class _Handler(RequestHandler):
    def initialize(self, dashboard):
        self.dashboard = dashboard


class StatusPage(_Handler):
    async def get(self):
        self.set_header("Content-Type", "text/html")
        self.write(_PAGE.format(body=render_sections(await self.dashboard.snapshot()), route=self.request.path))


class StatusBody(_Handler):
    async def get(self):
        self.set_header("Content-Type", "text/html")
        self.write(render_sections(await self.dashboard.snapshot()))


def routes(dashboard, route: str) -> list[tuple]:
    kwargs = {"dashboard": dashboard}
    return [(route, StatusPage, kwargs), (route + "/body", StatusBody, kwargs)]
