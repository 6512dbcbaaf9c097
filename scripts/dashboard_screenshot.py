"""Screenshot of the /ps dashboard page during a run (docs/dashboard.png).

Starts an in-process cluster with a dashboard, creates two tables (one
replicated), runs four participants that push and pull for a while, and has
headless Chromium render ``/ps`` half-way through.

Usage: ``python scripts/dashboard_screenshot.py [out.png]`` (needs Debian's
``chromium``: ``apt-get install chromium``).
"""

import subprocess
import sys
import threading
import time

import numpy as np
from distributed import Client, LocalCluster

import dask_ps


def participant(ctx, part, seconds):
    end = time.monotonic() + seconds
    rng = np.random.default_rng(ctx.rank)
    while time.monotonic() < end:
        rows = np.unique(rng.integers(0, 100_000, 5_000))
        ctx.pull_rows("embeddings", rows)
        ctx.push_rows("embeddings", rows, np.ones((len(rows), 16), "float32"))
        ctx.push("bias", np.ones(16))
        ctx.clock()
        time.sleep(0.01 * (1 + ctx.rank))  # participants at different speeds
    return ctx.rank


def main(out="docs/dashboard.png"):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("embeddings", shape=(100_000, 16), dtype="float32", consistency=dask_ps.SSP(2))
        ps.create_table("bias", shape=(16,), replication=2, consistency=dask_ps.SSP(2))
        url = f"http://127.0.0.1:{cluster.scheduler.http_server.port}/ps"
        runner = threading.Thread(target=ps.run, args=(participant, range(4)), kwargs={"seconds": 8})
        runner.start()
        time.sleep(4)
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--hide-scrollbars", "--window-size=1400,700",
                        "--virtual-time-budget=1500", f"--screenshot={out}", url],
                       check=True, capture_output=True, timeout=60)
        runner.join()
    print(f"wrote {out} from {url}")


if __name__ == "__main__":
    main(*sys.argv[1:])
