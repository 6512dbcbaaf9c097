"""A primary's forwarding of pushes to its blocks' replicas (issue 36).

:class:`Replicator` sends a push the primary applied on to the blocks'
replicas and waits for them, reports replicas that missed it to the
scheduler (which fences and re-copies them), and, on a replica, checks
that a forwarded push comes from the blocks' primary. The worker plugin's
``ps_push`` handler delegates to it, as distributed's shuffle runs are
handed their collaborators (``shuffle/_core.py``): it is given what it
uses and never reaches back into the plugin.

Runs on the worker's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from distributed.comm import CommClosedError

from dask_ps import _config, _wire
from dask_ps._exceptions import ForwardRefusedError, PSValueError, StaleVersionError
from dask_ps._liveness import WorkerGone
from dask_ps._wire import framed, wire_values

logger = logging.getLogger(__name__)


class Replicator:
    """Forwards a primary's pushes to the replicas of its blocks.

    ``address()``: this worker's address; ``rpc(address)``: Dask's rpc to a
    peer worker; ``scheduler()``: the rpc to the scheduler (internal);
    ``liveness``: the workers known dead
    (:class:`~dask_ps._liveness.Liveness`), whose calls it also makes;
    ``token()``: the cluster's internal token, which a forward carries.
    """

    def __init__(self, address, rpc, scheduler, liveness, token):
        self._address = address
        self._rpc = rpc
        self._scheduler = scheduler
        self.liveness = liveness
        self._token = token

    def __repr__(self):
        return f"<Replicator {self._address()} dead={sorted(self.liveness.dead)}>"

    def check_forwarder(self, t, blocks, version, forwarder) -> None:
        """Only a block's primary forwards its pushes to its replicas. Under
        the same placement version the forwarder must be the primary this
        worker has recorded; a forwarder with an older version is not the
        primary any more (it refreshes and its caller retries); one with a
        newer version is accepted only while this worker waits to adopt that
        placement (frozen by a placement change in progress)."""
        name = t.spec.name
        if not isinstance(forwarder, str) or not isinstance(version, int) or isinstance(version, bool):
            raise PSValueError(f"table {name!r}: a forwarded push must name its forwarder and placement version",
                               name)
        if forwarder in self.liveness.dead:
            # Fenced out as hung (or removed): it may still take itself for
            # the primary when it runs again; its copy has left the placement.
            raise ForwardRefusedError(
                f"table {name!r}: {forwarder} forwarded a push but has left the placement (fenced out); "
                "refresh and retry"
            )
        if version < t.version:
            raise ForwardRefusedError(
                f"table {name!r}: {forwarder} forwarded a push under placement v{version}, this replica "
                f"has v{t.version}: it is no longer the primary; refresh and retry"
            )
        if version > t.version:
            if not t.frozen:  # this copy missed a placement change: its primary fences it
                raise StaleVersionError(
                    f"table {name!r}: this replica has placement v{t.version}, the forward is for v{version}"
                )
            return
        me = self._address()
        wrong = [b for b in blocks
                 if b >= len(t.owners) or t.owners[b][0] != forwarder or me not in t.owners[b][1:]]
        if wrong:
            raise PSValueError(
                f"table {name!r}: only the primary of block(s) {wrong} may forward their pushes to this "
                f"replica, not {forwarder}", name,
            )

    async def forward(self, t, items, raw, run, sender, msg_seq, bounds=None) -> None:
        """Send a primary's push on to the blocks' replicas and wait for them.

        A replica the scheduler removed is skipped (its repair replaces it).
        A live replica that fails (an error, a timeout) is reported to the
        scheduler, which fences its copy (it stops serving reads) and copies
        the block to it again, before this push is acknowledged: an
        acknowledged push is on every replica that may serve a read.
        """
        me = self._address()
        by_replica: dict[str, list] = defaultdict(list)
        for it in items:
            for r in t.replicas(it[0], me):
                by_replica[r].append(it)
        if not by_replica:
            return
        timeout = _config.get_seconds("timeouts.rpc")

        def bound_of(its):  # what this worker's checks found: the replica need not measure again
            found = [bounds.get(id(v)) for _, _, v in its] if bounds else [None]
            return None if None in found else max(found)

        numbered = sender is not None and msg_seq is not None
        calls = [
            self.call_replica(r, numbered, lambda r=r, its=its: asyncio.wait_for(self._rpc(r).ps_push(**framed(dict(
                table=t.spec.name, version=t.version, blocks=[b for b, _, _ in its],
                rows=[_wire.wire_local_rows(x) for _, x, _ in its],
                values=[wire_values(v, False) for _, _, v in its],  # as they came (nonzeros stay so)
                raw=raw, run=run, sender=sender, msg_seq=msg_seq, replica=True,
                forwarder=me, token=self._token(), bound=bound_of(its),
            ))), timeout))
            for r, its in by_replica.items()
        ]
        missed, refused = {}, []
        for r, res in zip(by_replica, await asyncio.gather(*calls, return_exceptions=True)):
            if isinstance(res, ForwardRefusedError):
                refused.append(res)  # our placement is older than the replica's: not its fault
            elif isinstance(res, Exception):
                logger.warning("dask_ps: replica %s of table %r missed a push: %r", r, t.spec.name, res)
                if not isinstance(res, WorkerGone) and r not in self.liveness.dead:
                    missed[r] = sorted({it[0] for it in by_replica[r]})
        if missed:
            await self.report_missed(t, missed)
        if refused:
            # Applied here, not acknowledged: the caller re-sends it (same
            # numbers) to the current primary.
            raise StaleVersionError(f"table {t.spec.name!r}: this worker is no longer the primary; retry") \
                from refused[0]

    async def call_replica(self, replica: str, numbered: bool, make_call, attempts: int = 3):
        """A forward to ``replica``, sent again on a new connection when the
        connection closed under it and the push is numbered (the replica
        applies it once). Dask closes every pooled connection to a worker it
        removes ("Address removed."), also to one that still serves while it
        retires: counted as a missed push, that fenced the retiring copy,
        and a kill of the primary then lost the block (issue 34)."""
        for attempt in range(attempts):
            try:
                return await self.liveness.call(replica, make_call)
            except CommClosedError:
                if not numbered or attempt == attempts - 1 or replica in self.liveness.dead:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)

    async def report_missed(self, t, missed: dict[str, list[int]]) -> None:
        """Have the scheduler fence and re-copy replicas that missed a push.
        If that fails, the push is not acknowledged: the caller gets a
        retryable error and re-sends it (numbered, so applied once here, and
        forwarded again)."""
        timeout = _config.get_seconds("timeouts.rpc")
        results = await asyncio.gather(*(
            asyncio.wait_for(self._scheduler().ps_replica_missed(
                table=t.spec.name, table_id=t.spec.table_id, replica=r, blocks=bs), timeout)
            for r, bs in missed.items()
        ), return_exceptions=True)
        for (r, bs), res in zip(missed.items(), results):
            if isinstance(res, Exception):
                raise StaleVersionError(
                    f"table {t.spec.name!r}: replica {r} missed a push to block(s) {bs} and could not "
                    f"be fenced ({res!r}); retry"
                ) from res
