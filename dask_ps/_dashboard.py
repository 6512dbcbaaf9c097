"""The parameter server's page on the Dask dashboard (``/ps``).

Three parts, all on the scheduler:

- :class:`PSDashboard` keeps what the page shows. A periodic callback of
  the scheduler (``ps.dashboard.interval``, 1 s) samples every shard
  server's counters (``ps_info``: bytes held, pushes and reads served) and
  the runs' clocks into a bounded ring (``ps.dashboard.history`` samples):
  the traffic rates and the charts over time come from there, never from
  the time between two viewers' requests (a first load shows the rate of
  the last interval). Runs that ended are kept in a second ring
  (``ps.dashboard.finished-runs``) with their duration and result.
- What a run is: ``ParameterServer.run(..., run_info={"name", "params",
  "planned_clocks"})`` (the estimators pass their class, parameters and
  planned clocks), and what its participants report while it runs
  (:func:`report_progress`: their last loss; Dask's event log carries it,
  the ``log_event`` hook of a small scheduler plugin receives it). A fit
  trained in the calling process (a lone SGD participant of a small input:
  no parameter-server run) is reported the same way by a :class:`LocalRun`
  when its process already has a client of such a scheduler.
- When: as soon as the scheduler's process has imported dask_ps, before
  any run (:func:`install_page`: ``dask scheduler --preload dask_ps``; an
  import adds :data:`PRELOAD` to ``distributed.scheduler.preload`` for the
  schedulers the process starts later, ``LocalCluster``'s included, and
  installs the page on those already running: :func:`install_on_import`,
  ``ps.dashboard.on-import``). Until a :class:`PSSchedulerPlugin` attaches
  (a fit, ``ParameterServer(client)``) the page says what it will show
  (:data:`ABOUT`) and lists the workers and the fits trained in the
  calling process.
- Progress is counted in the estimator's units (``run_info``'s ``unit``:
  epochs, iterations), not in clocks, and each run's loss (named by
  ``loss_name``) and progress are charted over time; a finished run keeps
  its series (:meth:`PSDashboard.run_ended`).
- The pages: ``/ps`` is a Bokeh document in Dask's own dashboard, linked
  from its navigation bar (``_dashboard_bokeh``; distributed has no
  registry for third-party pages: the document is served by a Bokeh
  application added to the scheduler's HTTP server, as distributed adds
  its own, and ``ps`` is added to the navigation's pages). Without bokeh,
  ``/ps`` is a plain HTML page that says so (``_dashboard_html``).
  ``/ps/status.json`` is the same state as JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import numbers
import threading
import time
import uuid
import weakref
from collections import deque

from distributed import SchedulerPlugin
from tornado.ioloop import PeriodicCallback
from tornado.web import RequestHandler

from dask_ps import _config
from dask_ps._exceptions import PSValueError

logger = logging.getLogger(__name__)

ROUTE = "/ps"
JSON_ROUTE = "/ps/status.json"
REPORT_TOPIC = "ps-run-report"  # Dask event topic of report_progress
LOCAL_RUN_TOPIC = "ps-local-run"  # Dask event topic of LocalRun (a fit trained in the calling process)
INFO_TIMEOUT = 2.0  # seconds a shard server may take to answer ps_info
RUN_INFO_KEYS = {"name", "params", "planned_clocks", "unit", "clocks_per_unit", "first_unit", "total_units",
                 "lead_clocks", "loss_name"}
UNIT_KEYS = ("unit", "clocks_per_unit", "first_unit", "total_units", "lead_clocks", "loss_name")
SERIES_POINTS = 600  # points of a finished run's series kept (progress and loss over time)
ABOUT = ("No parameter-server run on this cluster yet. When a dask_ps estimator fits here (or "
         "ParameterServer(client) attaches), this page shows each run: its estimator and parameters, its "
         "progress in the estimator's units (epochs for SGD, iterations for LDA), its loss over time, the "
         "staleness of its participants, its tables and where their blocks live, and the push and read "
         "traffic of every worker; finished runs stay listed with their charts. Fits trained in the calling "
         "process show here too once they end.")
TRAFFIC_KEYS = ("pushes", "bytes_pushed", "pulls", "bytes_pulled")


# --- what a run is (client and participants) ---------------------------------------
def check_run_info(run_info) -> dict:
    """``run_info`` of :meth:`ParameterServer.run`, checked and made
    msgpack-able: ``name`` (str), ``params`` (a dict; values shown as their
    ``repr`` unless numbers, strings, booleans or None), ``planned_clocks``
    (an int >= 0, the clocks each participant will complete)."""
    if run_info is None:
        return {}
    if not isinstance(run_info, dict):
        raise PSValueError(f"run_info must be a dict with keys {sorted(RUN_INFO_KEYS)}, got {type(run_info).__name__}")
    unknown = set(run_info) - RUN_INFO_KEYS
    if unknown:
        raise PSValueError(f"run_info: unknown keys {sorted(unknown)}; expected some of {sorted(RUN_INFO_KEYS)}")
    out = {}
    if "name" in run_info:
        if not isinstance(run_info["name"], str):
            raise PSValueError(f"run_info['name'] must be a str, got {run_info['name']!r}")
        out["name"] = run_info["name"][:200]
    if "params" in run_info:
        params = run_info["params"]
        if not isinstance(params, dict):
            raise PSValueError(f"run_info['params'] must be a dict, got {type(params).__name__}")
        out["params"] = {str(k): v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)[:80]
                         for k, v in params.items()}
    if "planned_clocks" in run_info:
        planned = run_info["planned_clocks"]
        if not (isinstance(planned, int) and not isinstance(planned, bool) and planned >= 0):
            raise PSValueError(f"run_info['planned_clocks'] must be an int >= 0, got {planned!r}")
        out["planned_clocks"] = planned
    out.update(_check_units(run_info))
    return out


def _check_units(run_info: dict) -> dict:
    """``run_info``'s progress units: ``unit`` (str: "epoch", "iteration"),
    ``clocks_per_unit`` (int >= 1), ``first_unit`` (the units done before
    this run), ``total_units`` (the fit's), ``lead_clocks`` (clocks before
    the first unit, e.g. LDA's starting counts) (ints >= 0), ``loss_name``
    (str: what the reported loss is, with its unit)."""
    out = {}
    for key in ("unit", "loss_name"):
        if key in run_info:
            if not isinstance(run_info[key], str):
                raise PSValueError(f"run_info[{key!r}] must be a str, got {run_info[key]!r}")
            out[key] = run_info[key][:100]
    for key, least in (("clocks_per_unit", 1), ("first_unit", 0), ("total_units", 0), ("lead_clocks", 0)):
        if key in run_info:
            v = run_info[key]
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= least):
                raise PSValueError(f"run_info[{key!r}] must be an int >= {least}, got {v!r}")
            out[key] = v
    return out


def report_progress(ctx, **values) -> None:
    """Show ``values`` of this participant on the dashboard's ``/ps`` page.

    Call it from a participant of :meth:`ParameterServer.run` (``ctx`` its
    :class:`~dask_ps.Session`), e.g. once per epoch:
    ``report_progress(ctx, loss=0.31)``. Known keys: ``loss`` (the run shows
    the mean over its participants' last reports) and ``clock`` (progress in
    clocks, for a participant that trains without calling ``ctx.clock()``).
    Numbers only. Sent in the background through Dask's event log (the
    worker's batched stream to the scheduler); a participant trained in the
    calling process (its ``ctx.local_run`` a :class:`LocalRun`) hands them
    to that; elsewhere outside a run on a worker it does nothing.
    """
    from distributed import get_worker

    bad = {k: v for k, v in values.items() if not isinstance(v, numbers.Real) or isinstance(v, bool)}
    if bad:
        raise PSValueError(f"report_progress takes numbers only, got {bad}")
    run_id = getattr(ctx, "run_id", None)
    if run_id is None:
        local = getattr(ctx, "local_run", None)
        if local is not None:
            local.report(values)
        return
    try:
        worker = get_worker()
    except ValueError:  # not in a worker (a participant run in the calling process)
        return
    worker.log_event(REPORT_TOPIC, {"run_id": run_id, "rank": int(ctx.rank),
                                    "values": {k: float(v) for k, v in values.items()}})


class LocalRun:
    """A fit trained in the calling process, shown on the ``/ps`` page of
    ``client``'s scheduler as a run of one participant (the in-process path
    creates no parameter-server run: ``linear_model._in_process``).

    Nothing blocks the fit: its messages go to an outbox of ``client``,
    sent as one Dask event (``Scheduler.log_event``) at most every
    ``ps.dashboard.report-interval`` from ``client``'s event loop, whose reply
    nobody waits for (a message alone cost ~0.2 ms of CPU, more than a
    small fit's tenth). A short fit sends one message, at its :meth:`end`
    (with what it is, its clocks and loss, duration and result); a longer
    one also shows while it runs, from its first :meth:`report` after an
    interval and then at most once an interval.

    Parameters
    ----------
    client : distributed.Client
        A running client of the scheduler (``_estimators.dashboard_run``).
    run_info : dict
        As ``ParameterServer.run``'s (name, params, planned_clocks).
    function : str
        The participant function's name.
    """

    def __init__(self, client, run_info: dict, function: str = ""):
        self.client = client
        self.run_id = f"local-{uuid.uuid4().hex[:16]}"
        self.interval = _config.get_seconds("dashboard.report-interval")
        self.started = time.time()
        self._last_sent = time.monotonic()  # nothing shown before the first interval
        self.msg = {"run_id": self.run_id, "client": client.id, "info": check_run_info(run_info),
                    "function": function[:200], "started": self.started, "clocks": 0, "values": {}}

    def __repr__(self):
        return f"<LocalRun {self.run_id} clocks={self.msg['clocks']}>"

    def report(self, values: dict) -> None:
        """A participant's :func:`report_progress`: ``clock`` is its clocks
        done, the other values are kept (the last of each)."""
        clock = values.get("clock")
        if clock is not None:
            self.msg["clocks"] = max(self.msg["clocks"], int(clock))
        self.msg["values"].update({k: float(v) for k, v in values.items() if k != "clock"})
        now = time.monotonic()
        if now - self._last_sent >= self.interval:
            self._last_sent = now
            self._send("progress")

    def end(self, result: str = "done") -> None:
        """The fit ended (``result``: ``"done"`` or why it failed)."""
        self._send("end", seconds=round(time.time() - self.started, 3), result=str(result)[:300])

    def _send(self, event: str, **extra) -> None:
        if self.client.status == "running":
            msg = dict(self.msg, values=dict(self.msg["values"]), event=event, **extra)
            _Outbox.of(self.client, self.interval).put(self.client, msg)


class _Outbox:
    """The :class:`LocalRun` messages of one client not sent yet: the first
    one schedules a send of all of them an interval later on the client's
    loop (one event, ``{"runs": [...]}``). It holds no reference to the
    client (the key of its weak registry)."""

    _lock = threading.Lock()
    _of_client: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, interval: float):
        self.interval = interval
        self.pending: list[dict] = []

    @classmethod
    def of(cls, client, interval: float) -> _Outbox:
        with cls._lock:
            box = cls._of_client.get(client)
            if box is None:
                box = cls._of_client[client] = cls(interval)
            box.interval = interval  # the setting now
            return box

    def put(self, client, msg: dict) -> None:
        with self._lock:
            self.pending.append(msg)
            first = len(self.pending) == 1
        if first:
            client.loop.add_callback(self._send_later, client)

    async def _send_later(self, client) -> None:
        await asyncio.sleep(self.interval)
        with self._lock:
            runs, self.pending = self.pending, []
        try:
            await client.scheduler.log_event(topic=LOCAL_RUN_TOPIC, msg={"runs": runs})
        except Exception as e:  # noqa: BLE001 - the page is best effort; never a fit's error
            logger.debug("dask_ps: reporting %d in-process runs to the dashboard failed: %r", len(runs), e)


class _ReportListener(SchedulerPlugin):
    """Receives :func:`report_progress` and :class:`LocalRun` events
    (``SchedulerPlugin.log_event``); a client that leaves ends its local runs."""

    name = "ps-dashboard"
    idempotent = True

    def __init__(self, dashboard):
        self.dashboard = dashboard

    def log_event(self, topic, msg):
        if topic == REPORT_TOPIC:
            self.dashboard.on_report(msg)
        elif topic == LOCAL_RUN_TOPIC and isinstance(msg, dict) and isinstance(msg.get("runs"), list):
            for run in msg["runs"]:
                self.dashboard.on_local_run(run)

    def remove_client(self, scheduler, client):
        self.dashboard.client_left(client)


# --- the state the pages show ------------------------------------------------------
def _mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


class PSDashboard:
    """What ``/ps`` shows, for one :class:`~dask_ps._scheduler_plugin.PSSchedulerPlugin`
    (``plugin``; None until one attaches: the page of a scheduler whose
    process imported dask_ps, :func:`install`)."""

    def __init__(self, plugin, scheduler=None):
        self.plugin = plugin
        self.scheduler = scheduler if scheduler is not None else plugin.scheduler
        self.history: deque[dict] = deque(maxlen=int(_config.get("dashboard.history")))
        self.finished: deque[dict] = deque(maxlen=int(_config.get("dashboard.finished-runs")))
        self.reports: dict[str, dict[int, dict]] = {}  # run -> rank -> last values reported
        self.local_runs: dict[str, dict] = {}  # run -> the last message of a live LocalRun
        self.served: dict[str, dict] = {}  # the last ps_info of each member
        self._callback: PeriodicCallback | None = None
        self._sampling: asyncio.Future | None = None

    def __repr__(self):
        return f"<PSDashboard samples={len(self.history)} finished={len(self.finished)} of {self.plugin!r}>"

    # --- sampling (the scheduler's periodic callback) ------------------------------
    def start(self, scheduler) -> None:
        """Sample every ``ps.dashboard.interval`` on the scheduler's loop."""
        self.stop()
        interval_ms = 1000 * _config.get_seconds("dashboard.interval")
        self._callback = PeriodicCallback(self._tick, interval_ms)
        scheduler.periodic_callbacks["ps-dashboard"] = self._callback  # stopped with the scheduler
        self._callback.start()

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None

    def _tick(self) -> None:
        if self._sampling is None or self._sampling.done():  # one sample at a time
            self._sampling = asyncio.ensure_future(self.sample())

    async def _served(self) -> dict[str, dict]:
        """Per member: ``ps_info(served=True)``, or ``{"error": ...}``."""
        if self.plugin is None:
            return {}
        members = sorted(self.plugin.members)

        async def one(worker):
            try:
                return await asyncio.wait_for(
                    self.plugin.calls.call_once(worker, "ps_info", served=True), INFO_TIMEOUT)
            except Exception as e:  # a dead or hung worker: shown, not fatal
                return {"error": f"{type(e).__name__}: {e}"}

        return dict(zip(members, await asyncio.gather(*[one(w) for w in members])))

    async def sample(self) -> dict:
        """One sample: the servers' counters, their rates since the previous
        sample, and each live run's clocks; appended to :attr:`history`."""
        try:
            self.served = await self._served()
            self.plugin.run_book.sampled(self.served)  # the runs' clocks, counted by the servers
        except Exception as e:  # noqa: BLE001 - the page shows the last sample instead
            logger.debug("dask_ps dashboard: sampling failed: %r", e)
            return self.history[-1] if self.history else {}
        now = time.time()
        totals = dict.fromkeys(TRAFFIC_KEYS, 0)
        for info in self.served.values():
            for k, v in info.get("served", {}).items():
                totals[k] = totals.get(k, 0) + v
        rates = dict.fromkeys(TRAFFIC_KEYS, 0.0)
        if self.history and now > self.history[-1]["time"]:
            prev = self.history[-1]
            dt = now - prev["time"]
            rates = {k: max(0.0, (totals[k] - prev["totals"].get(k, 0)) / dt) for k in TRAFFIC_KEYS}
        runs = {}
        for run_id, run in self._live_runs().items():
            done = self._clocks_done(run)
            live = [c for r, c in enumerate(done) if r not in run.done] or done
            d = self._describe(run)
            runs[run_id] = {"min": min(live), "max": max(live), "spread": max(live) - min(live),
                            "units": d.get("units_done"), "loss": d["loss"]}
        for run_id, msg in self.local_runs.items():
            d = self._describe_local(msg)
            runs[run_id] = {"min": msg["clocks"], "max": msg["clocks"], "spread": 0, "units": d.get("units_done"),
                            "loss": d["loss"]}
        sample = {"time": now, "totals": totals, "per_second": rates, "runs": runs}
        self.history.append(sample)
        return sample

    # --- runs ----------------------------------------------------------------------------
    def _live_runs(self) -> dict:
        return self.plugin.runs if self.plugin is not None else {}

    def on_report(self, msg: dict) -> None:
        run_id, rank, values = msg.get("run_id"), msg.get("rank"), msg.get("values")
        if isinstance(run_id, str) and isinstance(rank, int) and isinstance(values, dict):
            if run_id in self._live_runs() or any(f["run"] == run_id for f in self.finished):
                self.reports.setdefault(run_id, {}).setdefault(rank, {}).update(values)
                for f in self.finished:  # a report that arrived after the run's end
                    if f["run"] == run_id:
                        f["loss"] = self._loss(run_id)
                        if "clock" in values:
                            done = max(int(values["clock"]), f["clocks_done"])  # one participant's
                            if f["participants"] == 1 and done != f["clocks_done"]:
                                f.update(self._progress(done, f["planned_clocks"], f.get("info")))
                        if f["series"]:  # the series ends at the run's final state
                            f["series"][-1] = [f["series"][-1][0], f.get("units_done"), f["loss"]]

    def on_local_run(self, msg: dict) -> None:
        """A :class:`LocalRun`'s message: a live run, or (``event: "end"``) a finished one."""
        if not (isinstance(msg, dict) and isinstance(msg.get("run_id"), str)
                and isinstance(msg.get("clocks"), int) and isinstance(msg.get("values"), dict)):
            return
        try:
            msg["info"] = check_run_info(msg.get("info"))
        except PSValueError:
            msg["info"] = {}
        run_id = msg["run_id"]
        if any(f["run"] == run_id for f in self.finished):  # a progress message that came after its end
            return
        if msg.get("event") != "end":
            self.local_runs[run_id] = msg
            return
        self.local_runs.pop(run_id, None)
        self._local_ended(msg, str(msg.get("result", "done")), msg.get("seconds"))

    def client_left(self, client: str) -> None:
        """The live local runs of a client that left end (their end cannot come)."""
        for run_id, msg in list(self.local_runs.items()):
            if msg.get("client") == client:
                del self.local_runs[run_id]
                self._local_ended(msg, "failed: its client left before the end", None)

    def _local_ended(self, msg: dict, result: str, seconds) -> None:
        record = self._describe_local(msg)
        if not isinstance(seconds, numbers.Real):
            seconds = time.time() - float(msg.get("started") or time.time())
        record.update(seconds=round(float(seconds), 2), ended=time.time(), result=result)
        record["series"] = self._series(record)
        self.finished.append(record)

    def _series(self, record: dict) -> list[list]:
        """A run's ``[time, units done, loss]`` over time, from the samples,
        ending at its final state: kept with the finished run (its charts)."""
        run_id = record["run"]
        points = [[h["time"], h["runs"][run_id].get("units"), h["runs"][run_id].get("loss")]
                  for h in self.history if run_id in h["runs"]]
        points.append([record["ended"], record.get("units_done"), record["loss"]])
        return points[-SERIES_POINTS:]

    def _clocks_done(self, run) -> list[int]:
        """Per participant: clocks completed, or reported (``report_progress(clock=)``)."""
        reported = self.reports.get(run.run_id, {})
        return [max(c, int(reported.get(r, {}).get("clock", 0))) for r, c in enumerate(run.clocks)]

    def _loss(self, run_id: str):
        return _mean(r.get("loss") for r in self.reports.get(run_id, {}).values())

    @staticmethod
    def _progress(done: int, planned, info=None) -> dict:
        """Progress: clocks done of planned, and where ``run_info`` names a
        unit, the units done (e.g. epochs, fractional within one) of the
        fit's ``total_units``, which the fraction ``progress`` then counts."""
        out = {"clocks_done": done, "planned_clocks": planned,
               "progress": (min(1.0, done / planned) if planned else None)}
        info = info or {}
        if info.get("unit"):
            span = max(0, done - info.get("lead_clocks", 0))
            if planned:
                span = min(span, max(0, planned - info.get("lead_clocks", 0)))
            units = info.get("first_unit", 0) + span / info.get("clocks_per_unit", 1)
            total = info.get("total_units")
            out.update(unit=info["unit"], units_done=units, total_units=total,
                       progress=min(1.0, units / total) if total else out["progress"])
        return out

    @staticmethod
    def _units_info(info: dict) -> dict:
        return {k: info[k] for k in (*UNIT_KEYS, "planned_clocks") if k in info}

    @staticmethod
    def _named(run_id: str, function: str, info: dict) -> dict:
        params = info.get("params", {})
        estimator = info.get("name")
        label = (f"{estimator}({', '.join(f'{k}={v!r}' for k, v in params.items())})" if estimator
                 else function or run_id)
        return {"run": run_id, "label": label, "estimator": estimator, "params": params, "function": function}

    def _describe(self, run) -> dict:
        info = getattr(run, "info", None) or {}
        return {**self._named(run.run_id, run.name, info), "participants": run.n, "in_process": False,
                **self._progress(min(self._clocks_done(run)), info.get("planned_clocks"), info),
                "loss": self._loss(run.run_id), "loss_name": info.get("loss_name"), "info": self._units_info(info)}

    def _describe_local(self, msg: dict) -> dict:
        """A :class:`LocalRun` as :meth:`_describe` describes a run."""
        info, loss = msg["info"], msg["values"].get("loss")
        return {**self._named(msg["run_id"], str(msg.get("function", "")), info), "participants": 1,
                "in_process": True, **self._progress(msg["clocks"], info.get("planned_clocks"), info),
                "loss": loss if isinstance(loss, numbers.Real) and math.isfinite(loss) else None,
                "loss_name": info.get("loss_name"), "info": self._units_info(info)}

    def run_ended(self, run, copies_disagree=False) -> None:
        """Called by the plugin's ``run_end``: the run joins :attr:`finished`."""
        record = self._describe(run)
        result = "done"
        if run.aborted:
            result = f"failed: {run.aborted}"
        elif copies_disagree:
            result = "copies disagree (CopiesDisagreeError)"
        elif any(r["table"] in run.tables for r in run.rollbacks):
            result = "rolled back (RolledBackError)"
        record.update(seconds=round(time.time() - run.started, 2), ended=time.time(), result=result)
        record["series"] = self._series(record)
        self.finished.append(record)
        live = set(self.plugin.runs) | {f["run"] for f in self.finished}
        for run_id in [r for r in self.reports if r not in live]:
            del self.reports[run_id]

    # --- snapshots ----------------------------------------------------------------------
    def _tables(self) -> list[dict]:
        if self.plugin is None:
            return []
        used_by: dict[str, list[str]] = {}  # table -> labels of the live runs that use it
        for run in self.plugin.runs.values():
            for name in run.tables:
                used_by.setdefault(name, []).append(self._describe(run)["label"])
        out = []
        for name, t in sorted(self.plugin.tables.items()):
            spec = t.spec
            per_worker: dict[str, dict] = {}
            for owners in t.owners:
                for i, w in enumerate(owners):
                    d = per_worker.setdefault(w, {"primary": 0, "replica": 0, "bytes": 0})
                    d["primary" if i == 0 else "replica"] += 1
            for w, info in self.served.items():
                held = info.get("tables", {}).get(name)
                if held is not None and w in per_worker:
                    per_worker[w]["bytes"] = int(held.get("nbytes", 0))
            out.append({
                "name": name, "shape": list(spec.shape), "dtype": str(spec.dtype), "rule": spec.rule.name,
                "consistency": repr(spec.consistency), "replication": spec.replication,
                "device": spec.device, "version": t.version, "blocks": len(t.owners),
                "bytes": sum(d["bytes"] for d in per_worker.values()),
                "lost_blocks": sorted(t.lost), "placement": per_worker, "used_by": used_by.get(name, []),
            })
        return out

    def _runs(self) -> list[dict]:
        now = time.time()
        out = []
        for run in self._live_runs().values():
            done = self._clocks_done(run)
            live = [c for r, c in enumerate(done) if r not in run.done]
            d = self._describe(run)
            d.update({
                "name": run.name, "clocks": done, "finished": sorted(run.done),
                "min_clock": min(live) if live else None, "max_clock": max(live) if live else None,
                # how far the fastest live participant is ahead of the slowest
                "spread": (max(live) - min(live)) if live else 0,
                "waiting": run.waiting, "wait_seconds": round(run.wait_seconds, 3),
                "where": {str(r): w for r, w in run.where.items()}, "seconds": round(now - run.started, 1),
                "aborted": run.aborted,
                "state": run.aborted or ("done" if len(run.done) == run.n else "running"),
            })
            out.append(d)
        for msg in self.local_runs.values():
            d = self._describe_local(msg)
            d.update({
                "name": d["function"], "clocks": [msg["clocks"]], "finished": [],
                "min_clock": msg["clocks"], "max_clock": msg["clocks"], "spread": 0, "waiting": 0,
                "wait_seconds": 0.0, "where": {"0": "the calling process"},
                "seconds": round(now - float(msg.get("started") or now), 1), "aborted": None,
                "state": "running in the calling process",
            })
            out.append(d)
        return out

    def _workers(self) -> list[dict]:
        """Every worker of the scheduler: memory and CPU from its heartbeats
        (``WorkerState.metrics``) and, for shard servers, what they hold and serve."""
        out = []
        members = self.plugin.members if self.plugin is not None else ()
        for addr, ws in sorted(self.scheduler.workers.items()):
            info = self.served.get(addr, {})
            served = info.get("served", {})
            state = ("error" if "error" in info else "ok") if addr in members else "not a server"
            out.append({
                "worker": addr, "name": str(ws.name), "nthreads": ws.nthreads,
                "memory": int(ws.metrics.get("memory", 0) or 0), "memory_limit": int(ws.memory_limit or 0),
                "cpu": float(ws.metrics.get("cpu", 0.0) or 0.0),
                "ps_bytes": int(sum(t.get("nbytes", 0) for t in info.get("tables", {}).values())),
                "pushes": int(served.get("pushes", 0)), "pulls": int(served.get("pulls", 0)), "server": state,
            })
        return out

    async def snapshot(self) -> dict:
        """:meth:`state`, sampled first if no sample was taken yet."""
        if not self.history:  # before the first periodic sample
            await self.sample()
        return self.state()

    def state(self) -> dict:
        """Everything the pages show, as a JSON-able dict (the last sample's
        traffic; no call to the workers)."""
        last = self.history[-1] if self.history else {"totals": dict.fromkeys(TRAFFIC_KEYS, 0),
                                                       "per_second": dict.fromkeys(TRAFFIC_KEYS, 0.0)}
        return {
            "time": time.time(),
            "parameter_server": self.plugin is not None,  # a PSSchedulerPlugin attached
            "about": ABOUT,
            "servers": {w: ("error" if "error" in info else "ok") for w, info in self.served.items()},
            "workers": self._workers(),
            "tables": self._tables(),
            "runs": self._runs(),
            "finished": list(self.finished)[::-1],  # the latest first
            "traffic": {"totals": last["totals"], "per_second": last["per_second"]},
            "history": list(self.history),
        }


# --- HTTP ----------------------------------------------------------------------------
class _Handler(RequestHandler):
    def initialize(self, dashboard: PSDashboard):
        self.dashboard = dashboard


class StatusJSON(_Handler):
    async def get(self):
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(await self.dashboard.snapshot()))


def _bokeh_prefix(scheduler) -> str | None:
    """The prefix of distributed's Bokeh pages (``http_prefix``), or None
    when the scheduler serves none (no bokeh, or ``dashboard=False``)."""
    for app in getattr(scheduler.http_application, "applications", ()):
        if "/status" in getattr(app, "app_paths", ()):
            return app.prefix or "/"
    return None


def install(scheduler, plugin=None) -> PSDashboard | None:
    """Add ``/ps`` and ``/ps/status.json`` to the scheduler's HTTP server
    (if it has one) and start sampling. ``plugin``: the
    :class:`PSSchedulerPlugin` whose state the page shows (None: the page
    before one attaches, :func:`dask_setup`); installing it again hands the
    page to another plugin."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        if plugin is not None:
            logger.info("dask_ps: the scheduler has no HTTP server; no dashboard page")
        return None
    dashboard = getattr(app, "_ps_dashboard", None)
    if dashboard is not None:  # the routes exist
        if plugin is not None and plugin is not dashboard.plugin:
            if dashboard.plugin is not None:  # another plugin instance: none of the samples are its runs
                dashboard.history.clear()
            dashboard.plugin = plugin
            dashboard.start(scheduler)
        return dashboard
    dashboard = app._ps_dashboard = PSDashboard(plugin, scheduler)
    scheduler.add_plugin(_ReportListener(dashboard), name=_ReportListener.name, idempotent=True)
    kwargs = {"dashboard": dashboard}
    routes = [(JSON_ROUTE, StatusJSON, kwargs)]
    prefix = _bokeh_prefix(scheduler)
    page = None
    if prefix is not None:
        from dask_ps import _dashboard_bokeh

        page = _dashboard_bokeh.add_page(scheduler, dashboard, prefix)
    if page is None:  # no Bokeh dashboard: the plain page, which says why
        from dask_ps import _dashboard_html

        routes += _dashboard_html.routes(dashboard, ROUTE)
    app.add_handlers(r".*", routes)
    dashboard.start(scheduler)
    return dashboard


# --- the page before any run -------------------------------------------------------
PRELOAD = "dask_ps._dashboard"  # what an import adds to distributed.scheduler.preload


def install_page(server) -> None:
    """``/ps`` on a scheduler from its start, before any plugin attaches
    (``dask scheduler --preload dask_ps``: ``dask_ps.dask_setup``); a
    worker gets nothing from it."""
    from distributed import Scheduler

    if isinstance(server, Scheduler):
        install(server)


def dask_setup(server) -> None:
    """Preloaded (:data:`PRELOAD`) by the schedulers a process starts after
    importing dask_ps: the page, unless ``ps.dashboard.on-import`` is off
    (read when the scheduler starts)."""
    if _config.get("dashboard.on-import"):
        install_page(server)


def install_on_import() -> None:
    """At ``import dask_ps`` (``ps.dashboard.on-import``): every scheduler
    the process starts afterwards preloads :data:`PRELOAD` (added to
    ``distributed.scheduler.preload``), and those already running get the
    page now."""
    import dask
    from distributed import Scheduler
    from distributed.core import Status

    if not _config.get("dashboard.on-import"):
        return
    preload = dask.config.get("distributed.scheduler.preload", None) or []
    preload = [preload] if isinstance(preload, str) else list(preload)
    if PRELOAD not in preload:
        dask.config.set({"distributed.scheduler.preload": [*preload, PRELOAD]})
    for scheduler in list(Scheduler._instances):
        if scheduler.status == Status.running:
            scheduler.loop.add_callback(install, scheduler)
