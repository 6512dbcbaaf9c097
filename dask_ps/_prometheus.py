"""dask_ps metrics on the scheduler's Prometheus endpoint (``/metrics``).

Registered by the scheduler plugin when ``prometheus_client`` is installed
(it is what Dask's own endpoint needs too). Metric names start with ``dask_ps_``.
"""

from __future__ import annotations

from collections.abc import Iterator

_collector = None


def register(plugin) -> None:
    """Export ``plugin``'s state; re-registering (a new scheduler in the same
    process, as in tests) only points the one collector at the new plugin."""
    global _collector
    try:
        import prometheus_client
    except ImportError:
        return
    if _collector is None:
        _collector = PSCollector(plugin)
        prometheus_client.REGISTRY.register(_collector)
    else:
        _collector.plugin = plugin


class PSCollector:
    def __init__(self, plugin):
        self.plugin = plugin

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        p = self.plugin
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
