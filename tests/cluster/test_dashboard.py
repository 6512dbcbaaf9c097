"""The ``/ps`` page on the Dask dashboard: tables, placement, bytes, runs'
clocks and waits, push/pull traffic."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import numpy as np
from distributed import Client, LocalCluster

import dask_ps


def _get(base, route):
    with urllib.request.urlopen(base + route, timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def _participant(ctx, part, release):
    for _ in range(3):
        ctx.pull("dash-w")
        ctx.push_rows("dash-w", part, np.ones((len(part), 4)))
        ctx.clock()
    while not release.exists():  # hold the run open while the page is read
        time.sleep(0.05)
    return ctx.rank


def test_dashboard_page_shows_tables_runs_and_traffic(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("dash-w", shape=(1000, 4), dtype="float64", replication=2)
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        _get(base, "/ps/status.json")  # the first snapshot: rates start here
        release = tmp_path / "release"
        result = {}
        runner = threading.Thread(target=lambda: result.update(
            out=ps.run(_participant, [np.arange(0, 10), np.arange(10, 20)], release=release)))
        runner.start()
        try:
            deadline = time.monotonic() + 60
            while True:
                snap = json.loads(_get(base, "/ps/status.json"))
                runs = [r for r in snap["runs"] if r["name"] == "_participant"]
                if runs and min(runs[0]["clocks"]) >= 3 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert runs and runs[0]["clocks"] == [3, 3] and runs[0]["participants"] == 2
            page = _get(base, "/ps")
        finally:
            release.write_text("x")
            runner.join(60)
        assert result["out"] == [0, 1]

        (table,) = [t for t in snap["tables"] if t["name"] == "dash-w"]
        assert table["shape"] == [1000, 4] and table["replication"] == 2
        assert table["bytes"] == 2 * 1000 * 4 * 8  # two copies of every block
        assert set(table["placement"]) == set(ps.servers)
        assert sum(d["primary"] for d in table["placement"].values()) == table["blocks"]
        traffic = snap["traffic"]
        # 3 pushes per participant; reads beyond the first may be cache hits (SSP)
        assert traffic["totals"]["pushes"] >= 6 and traffic["totals"]["pulls"] >= 2
        assert traffic["per_second"]["pushes"] > 0
        assert set(snap["servers"].values()) == {"ok"}
        assert "dash-w" in page and "_participant" in page and "<table>" in page
        ps.drop_table("dash-w")
