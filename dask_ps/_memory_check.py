"""Whether a new table fits the workers' memory (``create_table``).

Two checks, both before anything is created, both refusing with a
:class:`PSValueError` that gives the figures:

* :func:`check_total`: the table's bytes (times ``replication``, plus its
  rule's optimizer state) against ``ps.max-memory-fraction`` of the
  workers' summed memory limits.
* :func:`check_headroom`: per worker, the blocks the placement puts there
  on top of the memory its process holds now (Dask's last heartbeat),
  against the first of Dask's memory thresholds that is on
  (``distributed.worker.memory.spill``, else ``pause``, else
  ``terminate``) less ``ps.worker-memory-headroom`` of its limit (blocks
  of under 1% of a worker's limit are not refused there). Blocks are
  memory Dask does not manage and cannot spill: past its spill threshold
  it spills the worker's other data instead (238 MiB in issue 34's run),
  past its pause threshold it pauses the worker (5 times there), and the
  fit still needs room for its working memory (compiled kernels, a
  round's rows: the process grows from about 210 to about 340 MiB,
  docs/architecture.rst, "Memory: what holds a table, where").
"""

from __future__ import annotations

import dask
from dask.utils import format_bytes

from dask_ps import _config
from dask_ps._exceptions import PSValueError

MIN_SHARE = 0.01  # blocks below this fraction of a worker's limit are not refused there


def bytes_per_value(spec) -> int:
    """Copies of the table's values a block holds: the values plus the
    optimizer state of its rule (momentum/adagrad: 1, adam: 2)."""
    return 1 + {"momentum": 1, "adagrad": 1, "adam": 2}.get(spec.rule.name, 0)


def check_total(spec, limits: list) -> None:
    """Refuse a table whose bytes (times replication, plus optimizer state)
    exceed ``ps.max-memory-fraction`` of the summed memory ``limits`` of the
    workers that would host it (skipped when one is unlimited)."""
    if not limits or not all(limits):
        return
    need = spec.nbytes * spec.replication * bytes_per_value(spec)
    budget = float(_config.get("max-memory-fraction")) * sum(limits)
    if spec.device == "cpu" and need > budget:
        raise PSValueError(
            f"table {spec.name!r} needs {format_bytes(need)} ({spec.describe()}) but the "
            f"{len(limits)} workers' memory limits allow {format_bytes(budget)} for tables "
            f"(ps.max-memory-fraction of {format_bytes(sum(limits))}). Use a smaller table, "
            "a smaller dtype, or more workers.",
            spec.name,
        )


def dask_threshold() -> tuple[str, float] | None:
    """The first of Dask's worker memory thresholds that is on, as
    ``(name, fraction of the memory limit)``; None when all are off."""
    for name in ("spill", "pause", "terminate"):
        value = dask.config.get(f"distributed.worker.memory.{name}", None)
        if value:
            return name, float(value)
    return None


def check_headroom(spec, by_worker: dict, workers: dict) -> None:
    """Refuse a CPU table whose blocks would bring a worker's process memory
    above Dask's first memory threshold less ``ps.worker-memory-headroom``
    (module docstring). ``by_worker``: worker -> the blocks the placement
    gives it; ``workers``: the scheduler's ``WorkerState`` by address."""
    threshold = dask_threshold()
    headroom = float(_config.get("worker-memory-headroom"))
    if spec.device != "cpu" or threshold is None or headroom < 0:
        return
    name, fraction = threshold
    block = spec.nbytes / max(1, spec.n_blocks) * bytes_per_value(spec)
    over = []
    for w, blocks in sorted(by_worker.items()):
        ws = workers.get(w)
        limit = getattr(ws, "memory_limit", 0)
        if not limit:
            continue  # unlimited: Dask's monitor does nothing
        now, need = ws.memory.process, len(blocks) * block
        allowed = (fraction - headroom) * limit
        # Blocks of under 1% of the limit are no reason (a worker whose own
        # process is past the line would refuse every small table).
        if need >= MIN_SHARE * limit and now + need > allowed:
            over.append(f"{w}: {format_bytes(now)} now + {format_bytes(int(need))} of blocks = "
                        f"{(now + need) / limit:.0%} of its {format_bytes(limit)} limit")
    if over:
        raise PSValueError(
            f"table {spec.name!r} ({spec.describe()}) would leave workers too little memory: "
            f"{'; '.join(over[:4])}{' ...' if len(over) > 4 else ''}. Dask spills a worker's other data "
            f"past {fraction:.0%} of its limit (distributed.worker.memory.{name}) and cannot spill "
            f"table blocks; dask_ps keeps {headroom:.0%} of the limit free below that for the fit's own "
            "memory (ps.worker-memory-headroom). Use more workers or a larger memory limit, a smaller "
            "table or dtype, or lower ps.worker-memory-headroom.",
            spec.name,
        )
