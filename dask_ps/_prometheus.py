"""dask_ps metrics on the scheduler's Prometheus endpoint (``/metrics``).

Registered by the scheduler plugin when ``prometheus_client`` is installed
(it is what Dask's own endpoint needs too). Metric names start with ``dask_ps_``.
"""

from __future__ import annotations

from collections.abc import Iterator

_collector = None
_live: list = []  # plugins of running schedulers in this process, newest last


def register(plugin) -> None:
    """Export ``plugin``'s state. One collector per process reports the newest
    running scheduler's plugin (several schedulers share a process in tests)."""
    global _collector
    try:
        import prometheus_client
    except ImportError:
        return
    _live.append(plugin)
    if _collector is None:
        _collector = PSCollector()
        prometheus_client.REGISTRY.register(_collector)


def unregister(plugin) -> None:
    if plugin in _live:
        _live.remove(plugin)


class PSCollector:
    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if not _live:
            return
        p = _live[-1]
        yield GaugeMetricFamily("dask_ps_servers", "Workers hosting shards", value=len(p.members))
        yield GaugeMetricFamily("dask_ps_tables", "Tables in the parameter server", value=len(p.tables))
        clocks = GaugeMetricFamily("dask_ps_run_clock", "Clock of each participant of a live run",
                                   labels=["run", "rank"])
        for run in p.runs.values():
            for rank, c in enumerate(run.clocks):
                clocks.add_metric([run.run_id, str(rank)], c)
        yield clocks
        for key, help_ in [
            ("reads", "Reads by participants of finished runs"),
            ("cache_hits", "Reads served from a participant's cache"),
            ("wait_seconds", "Seconds participants waited for the consistency bound"),
            ("bytes_pushed", "Bytes pushed by participants"),
            ("bytes_pulled", "Bytes pulled by participants"),
        ]:
            yield CounterMetricFamily(f"dask_ps_{key}", help_, value=p.totals.get(key, 0))
