"""Reports of blocks lost with their workers, told apart from a cluster
that is shutting down (issue 34).

A ``LocalCluster`` that closes kills its workers one after the other: the
first to go looks to the scheduler like a worker lost while the others
run, and its blocks have no copy left. Blocks are marked lost at once
(every later call on them raises ``DataLostError``: nothing is served
silently); only the log line waits ``ps.timeouts.lost-report``, and then
reads as data loss only if the cluster still runs. One line per table,
however many blocks and attempts.
"""

from __future__ import annotations

import asyncio
import logging

from dask_ps import _config


class LostReports:
    """Collects lost blocks per (table, why) and logs them once, after a delay.

    ``scheduler``: Dask's scheduler (is it closing?); ``running_members()``:
    the shard servers still running (has everyone left?).
    """

    def __init__(self, scheduler, running_members, logger: logging.Logger):
        self.scheduler = scheduler
        self.running_members = running_members
        self.logger = logger
        self.pending: dict[tuple[str, str], set[int]] = {}
        self._timer = None

    def __repr__(self):
        return f"<LostReports pending={sorted(self.pending)}>"

    def add(self, table: str, blocks, why: str) -> None:
        """Blocks of ``table`` lost: ``why`` completes "lost block(s) [..] ..."."""
        self.pending.setdefault((table, why), set()).update(int(b) for b in blocks)
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(_config.get_seconds("timeouts.lost-report"), self.flush)

    def flush(self) -> None:
        self._timer = None
        pending, self.pending = self.pending, {}
        scheduler = self.scheduler
        closing = scheduler is None or scheduler.status.name != "running"
        everyone_left = not closing and not self.running_members()
        for (table, why), blocks in sorted(pending.items()):
            if closing:
                self.logger.info("dask_ps: table %r: block(s) %s were not kept: the scheduler is closing",
                                 table, sorted(blocks))
            elif everyone_left:
                self.logger.warning("dask_ps: table %r lost block(s) %s %s; every worker has left (the cluster "
                                    "is shutting down, or all its workers were lost)", table, sorted(blocks), why)
            else:
                self.logger.error("dask_ps: table %r lost block(s) %s %s", table, sorted(blocks), why)
