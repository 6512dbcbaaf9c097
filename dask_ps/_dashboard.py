"""The parameter server's page on the Dask dashboard (``/ps``).

Served by the scheduler's own HTTP server (the one that serves the Dask
dashboard, ``/status`` and ``/health``), as distributed's JSON routes are:
tornado handlers added to ``scheduler.http_application``. ``/ps`` is a small
HTML page that polls ``/ps/status.json`` every second; the JSON is a
snapshot of the scheduler plugin's metadata (tables and their placement,
runs and their clocks) plus what every shard server reports through
``ps_info`` (bytes held, pushes and reads served). Rates are the change of
the servers' counters between two snapshots.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import time

from tornado.web import RequestHandler

logger = logging.getLogger(__name__)

ROUTE = "/ps"
JSON_ROUTE = "/ps/status.json"
INFO_TIMEOUT = 2.0  # seconds a shard server may take to answer ps_info


class PSDashboard:
    """Builds snapshots of one :class:`~dask_ps._scheduler_plugin.PSSchedulerPlugin`."""

    def __init__(self, plugin):
        self.plugin = plugin
        self._last: tuple[float, dict] | None = None  # (time, served totals) of the last snapshot

    def __repr__(self):
        return f"<PSDashboard of {self.plugin!r}>"

    async def _served(self) -> dict[str, dict]:
        """Per member: ``ps_info(served=True)``, or ``{"error": ...}``."""
        members = sorted(self.plugin.members)

        async def one(worker):
            try:
                return await asyncio.wait_for(
                    self.plugin.calls.call_once(worker, "ps_info", served=True), INFO_TIMEOUT)
            except Exception as e:  # a dead or hung worker: shown, not fatal
                return {"error": f"{type(e).__name__}: {e}"}

        return dict(zip(members, await asyncio.gather(*[one(w) for w in members])))

    def _tables(self, served: dict) -> list[dict]:
        out = []
        for name, t in sorted(self.plugin.tables.items()):
            spec = t.spec
            per_worker: dict[str, dict] = {}
            for owners in t.owners:
                for i, w in enumerate(owners):
                    d = per_worker.setdefault(w, {"primary": 0, "replica": 0, "bytes": 0})
                    d["primary" if i == 0 else "replica"] += 1
            for w, info in served.items():
                held = info.get("tables", {}).get(name)
                if held is not None and w in per_worker:
                    per_worker[w]["bytes"] = int(held.get("nbytes", 0))
            out.append({
                "name": name, "shape": list(spec.shape), "dtype": str(spec.dtype), "rule": spec.rule.name,
                "consistency": repr(spec.consistency), "replication": spec.replication,
                "device": spec.device, "version": t.version, "blocks": len(t.owners),
                "bytes": sum(d["bytes"] for d in per_worker.values()),
                "lost_blocks": sorted(t.lost), "placement": per_worker,
            })
        return out

    def _runs(self) -> list[dict]:
        now = time.time()
        out = []
        for run in self.plugin.runs.values():
            live = [c for r, c in enumerate(run.clocks) if r not in run.done]
            out.append({
                "run": run.run_id, "name": getattr(run, "name", ""), "participants": run.n,
                "clocks": list(run.clocks), "finished": sorted(run.done),
                "min_clock": min(live) if live else None,
                # how far the fastest live participant is ahead of the slowest
                "spread": (max(live) - min(live)) if live else 0,
                "waiting": getattr(run, "waiting", 0), "wait_seconds": round(getattr(run, "wait_seconds", 0.0), 3),
                "where": {str(r): w for r, w in run.where.items()}, "seconds": round(now - run.started, 1),
                "aborted": run.aborted,
            })
        return out

    def _rates(self, served: dict, now: float) -> dict:
        totals = {"pushes": 0, "bytes_pushed": 0, "pulls": 0, "bytes_pulled": 0}
        for info in served.values():
            for k, v in info.get("served", {}).items():
                totals[k] = totals.get(k, 0) + v
        rates = dict.fromkeys(totals, 0.0)
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            rates = {k: max(0.0, (v - self._last[1].get(k, 0)) / dt) for k, v in totals.items()}
        self._last = (now, totals)
        return {"totals": totals, "per_second": rates}

    async def snapshot(self) -> dict:
        served = await self._served()
        now = time.time()
        return {
            "time": now,
            "servers": {w: ("error" if "error" in info else "ok") for w, info in served.items()},
            "tables": self._tables(served),
            "runs": self._runs(),
            "traffic": self._rates(served, now),
        }


class _Handler(RequestHandler):
    def initialize(self, dashboard: PSDashboard):
        self.dashboard = dashboard


class StatusJSON(_Handler):
    async def get(self):
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(await self.dashboard.snapshot()))


class StatusPage(_Handler):
    async def get(self):
        self.set_header("Content-Type", "text/html")
        self.write(render_page(await self.dashboard.snapshot()))


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_sections(snap: dict) -> str:
    """The page's body for one snapshot (also what the page's script re-renders)."""
    t = snap["traffic"]
    traffic = _table(
        ["", "pushes", "push bytes", "reads", "read bytes"],
        [["total", t["totals"]["pushes"], _bytes(t["totals"]["bytes_pushed"]), t["totals"]["pulls"],
          _bytes(t["totals"]["bytes_pulled"])],
         ["per second", f"{t['per_second']['pushes']:.1f}", _bytes(t["per_second"]["bytes_pushed"]) + "/s",
          f"{t['per_second']['pulls']:.1f}", _bytes(t["per_second"]["bytes_pulled"]) + "/s"]],
    )
    tables = _table(
        ["table", "shape", "dtype", "rule", "consistency", "copies", "blocks", "bytes", "placement (primary/replica blocks, bytes)"],
        [[x["name"], "x".join(map(str, x["shape"])), x["dtype"], x["rule"], x["consistency"], x["replication"],
          x["blocks"] if not x["lost_blocks"] else f"{x['blocks']} (lost: {x['lost_blocks']})", _bytes(x["bytes"]),
          "; ".join(f"{w}: {d['primary']}/{d['replica']}, {_bytes(d['bytes'])}" for w, d in sorted(x["placement"].items()))]
         for x in snap["tables"]],
    )
    runs = _table(
        ["run", "function", "participants", "clocks", "min clock", "spread", "waiting now", "wait s", "age s", "state"],
        [[r["run"], r["name"], r["participants"], " ".join(map(str, r["clocks"])), r["min_clock"], r["spread"],
          r["waiting"], r["wait_seconds"], r["seconds"], r["aborted"] or ("done" if len(r["finished"]) == r["participants"] else "running")]
         for r in snap["runs"]],
    )
    servers = ", ".join(f"{w} ({s})" for w, s in sorted(snap["servers"].items())) or "none"
    return (f"<h2>Shard servers</h2><p>{html.escape(servers)}</p><h2>Traffic</h2>{traffic}"
            f"<h2>Tables</h2>{tables}<h2>Runs</h2>{runs}")


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>dask_ps</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; font-size: 13px; text-align: left; }}
th {{ background: #eef; }}
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


class StatusBody(_Handler):
    async def get(self):
        self.set_header("Content-Type", "text/html")
        self.write(render_sections(await self.dashboard.snapshot()))


def render_page(snap: dict) -> str:
    return _PAGE.format(body=render_sections(snap), route=ROUTE)


def install(scheduler, plugin) -> PSDashboard | None:
    """Add the ``/ps`` routes to the scheduler's HTTP server (if it has one)."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        logger.info("dask_ps: the scheduler has no HTTP server; no dashboard page")
        return None
    dashboard = getattr(app, "_ps_dashboard", None)
    if dashboard is not None:  # the plugin registered again: the routes exist
        dashboard.plugin, dashboard._last = plugin, None
        return dashboard
    dashboard = app._ps_dashboard = PSDashboard(plugin)
    kwargs = {"dashboard": dashboard}
    app.add_handlers(r".*", [
        (ROUTE, StatusPage, kwargs), (ROUTE + "/body", StatusBody, kwargs), (JSON_ROUTE, StatusJSON, kwargs),
    ])
    return dashboard
