"""The embedded cluster: the ``LocalCluster`` an estimator with
``client=None`` starts in this process (``ps.embedded-cluster``), and the
line that says what was started. :func:`dask_ps._client.get_parameter_server`
starts it once per process."""

from __future__ import annotations

import dask
from distributed import Nanny


def embedded_cluster_kwargs(overrides: dict | None = None) -> dict:
    """``LocalCluster`` arguments of the embedded cluster (``ps.embedded-cluster``).

    The default is an in-process cluster (workers are threads of this
    process, talking over Dask's in-process comm): it starts in a fraction of
    a second, and it needs no ``if __name__ == "__main__":`` guard, so it works
    from a plain script, a notebook, and inside joblib/loky workers (daemonic
    processes, which may not start worker processes). ``processes: true``
    gives worker processes, LocalCluster's own default, with
    :class:`_EmbeddedNanny`.

    The dashboard (``dashboard-address``) is served on a free port by
    default (``":0"``): the embedded cluster is one more cluster on the
    machine, and LocalCluster's ``:8787`` warned "Port 8787 is already in
    use" (and leaked the socket it tried, a ``ResourceWarning``) whenever
    another Dask dashboard ran. ``null``: no dashboard pages (Dask's HTTP
    server, which always runs, also on a free port); ``"default"``:
    LocalCluster's ``:8787``. A verbose fit that starts the cluster says
    where the dashboard is.
    """
    import os

    cfg = dask.config.get("ps.embedded-cluster")
    processes = bool(cfg.get("processes", False))
    kwargs = {
        "processes": processes,
        "n_workers": cfg.get("n-workers") or max(1, min(os.cpu_count() or 1, 8)),
        "threads_per_worker": cfg.get("threads-per-worker") or 1,
    }
    if processes:
        kwargs["worker_class"] = _EmbeddedNanny
    address = cfg.get("dashboard-address", ":0")
    if address is None:  # no dashboard; the HTTP server Dask always starts goes to a free port
        kwargs["dashboard_address"] = None
        kwargs["scheduler_kwargs"] = {"dashboard": False, "dashboard_address": ":0"}
    elif address != "default":
        kwargs["dashboard_address"] = address
    kwargs.update(overrides or {})
    return kwargs


class _EmbeddedNanny(Nanny):
    """The nanny of the embedded cluster's worker processes: at close, it
    lets its worker process exit by itself for up to
    ``EXIT_WAIT_SECONDS``, where Dask's nanny kills it after 4 s with a
    "Worker process still alive after 4.0 seconds, killing" warning.

    A worker process that trained exits more slowly than one that only ran
    Dask tasks: the interpreter's finalization of scikit-learn, SciPy and
    numba's compiled kernels took 1-1.5 s on an idle 2-core machine, and
    more than 4 s on a busy one, so a script with ``processes: true`` printed
    that warning twice at exit after a fit (issue 24). The process is not
    stuck, only finalizing: waiting is the quiet way to the same end. Its
    worker processes ignore Ctrl-C (``_embedded_worker``)."""

    EXIT_WAIT_SECONDS = 30

    def __init__(self, *args, **kwargs):
        # Its worker processes ignore Ctrl-C (the user's program gets it): _embedded_worker.
        preload = kwargs.get("preload") or dask.config.get("distributed.worker.preload") or []
        kwargs["preload"] = [*([preload] if isinstance(preload, str) else preload), "dask_ps._embedded_worker"]
        super().__init__(*args, **kwargs)

    async def close(self, timeout: float = 5, reason: str = "nanny-close"):  # type: ignore[override]
        return await super().close(timeout=max(timeout, self.EXIT_WAIT_SECONDS), reason=reason)


def describe_embedded_cluster(ps: ParameterServer) -> str:
    """One line on the embedded cluster ``ps`` started: its workers and
    where its dashboard is."""
    cluster = ps._own_cluster
    if cluster is None:
        return f"dask_ps: using the Dask cluster at {ps.client.scheduler.address}"
    workers = list(cluster.workers.values())
    kind = "worker processes" if workers and isinstance(workers[0], Nanny) else "workers in this process"
    nthreads = max([w.get("nthreads", 1) for w in ps.client.scheduler_info(n_workers=-1)["workers"].values()] or [1])
    where = "no dashboard (ps.embedded-cluster.dashboard-address: null)"
    if dask.config.get("ps.embedded-cluster.dashboard-address", ":0") is not None:
        where = f"dashboard at {cluster.dashboard_link}"
    return (f"dask_ps: started a local Dask cluster ({len(workers)} {kind}, {nthreads} thread(s) each, "
            f"closed at exit), {where}")
