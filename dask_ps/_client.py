"""``ParameterServer``: the user's handle on the parameter server."""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import threading
import uuid
import weakref
from collections import namedtuple

import dask
import numpy as np
from dask.utils import parse_timedelta
from distributed import Client, Future, LocalCluster, futures_of, get_client

from dask_ps import _spec
from dask_ps._dashboard import check_run_info
from dask_ps._embedded_cluster import _EmbeddedNanny, describe_embedded_cluster, embedded_cluster_kwargs  # noqa: F401
from dask_ps._exceptions import (
    NoWorkersError,
    PSValueError,
    RolledBackError,
    SchedulerLostError,
    TableExistsError,
    UnknownTableError,
)
from dask_ps._routing import coalesce_rows
from dask_ps._scheduler_plugin import PSSchedulerPlugin
from dask_ps._transport import Router, Transport, blocking_call
from dask_ps._waiting import gather_outside_the_pool, keep_until_done

logger = logging.getLogger(__name__)

BlockPlacement = namedtuple("BlockPlacement", ["block", "start", "stop", "worker"])


class ParameterServer:
    """A parameter server living inside a Dask cluster.

    Parameters
    ----------
    client : distributed.Client or str, optional
        The cluster to use: a client, or a scheduler address (connected here).
        ``None`` uses the current client (``get_client()``) or, when there is
        none, starts the embedded ``LocalCluster`` (``ps.embedded-cluster``;
        in-process by default) owned by this object and closed by
        :meth:`close` (or on leaving a ``with`` block). It is not made the
        default Dask client.
    **cluster_kwargs
        Passed to ``LocalCluster`` when one is started (over the
        ``ps.embedded-cluster`` settings).

    Notes
    -----
    Creating it registers the dask_ps scheduler plugin, which installs the
    worker plugin on every current and future worker. Registering again (a
    second ``ParameterServer`` on the same cluster) is a no-op, and tables
    persist on the cluster until dropped.

    Examples
    --------
    >>> ps = ParameterServer(client)                        # doctest: +SKIP
    >>> ps.create_table("w", shape=(1000, 16), dtype="float32")  # doctest: +SKIP
    >>> ps.push("w", np.ones((1000, 16), "float32"))        # doctest: +SKIP
    >>> ps.pull("w").sum()                                  # doctest: +SKIP
    16000.0
    """

    def __init__(self, client: Client | None = None, **cluster_kwargs):
        self._own_cluster = None
        self._own_client = None
        if client is None:
            try:
                client = get_client()
            except ValueError:
                self._own_cluster = LocalCluster(**embedded_cluster_kwargs(cluster_kwargs))
                # Not the user's default scheduler: dask.compute() elsewhere in
                # the program keeps whatever scheduler it had.
                self._own_client = client = Client(self._own_cluster, set_as_default=False)
                logger.info("dask_ps: started %s", self._own_cluster)
        elif isinstance(client, str):
            self._own_client = client = Client(client, set_as_default=False)
        self.client = client
        client.register_plugin(PSSchedulerPlugin())
        info = client.scheduler_info(n_workers=-1)
        n_workers = len(info["workers"])
        self._scheduler_id = info.get("id")  # a new scheduler has another: the tables are not there
        # The scheduler plugin instance this object attached to (the one
        # registered first: registering is idempotent). Every call to the
        # scheduler carries it, and a new scheduler's plugin refuses it, even
        # where the client's identity of its scheduler is not updated yet.
        self._scheduler = _AttachedScheduler(client.scheduler, client.sync(client.scheduler.ps_cluster)["cluster_id"])
        # Worker plugins set up asynchronously; wait until every worker serves.
        self._servers(n=n_workers, timeout=30)
        self._latest_versions: dict[str, int] = {}
        self._router = Router(Transport(client.rpc, self._scheduler), latest_versions=self._latest_versions)
        self._router.lost_check = self._check_scheduler  # failover stops at once when the scheduler is gone
        client.subscribe_topic("ps-worker-left", self._on_worker_left)
        client.subscribe_topic("ps-worker-joined", self._on_worker_joined)
        self._metrics: dict[str, dict] = _RunHistory()  # the latest ps.metrics-history runs
        # Placement changes are announced as Dask events: refresh before the
        # next message instead of discovering a dead worker by a failed connect.
        client.subscribe_topic("ps-placement", self._on_placement)
        # Restores from a checkpoint outside a run (replication=1): the next
        # call on the table from this object raises RolledBackError once.
        # Learnt from every handle fetched (they carry the table's count of
        # restores) and from the "ps-rollback" event, whichever comes first.
        self._restores_seen: dict[str, tuple[str, int]] = {}  # table -> (table_id, restores known)
        self._rolled_back: dict[str, tuple[int, int]] = {}  # table -> (restores reported, known): to raise
        self._router.on_handle = self._saw_handle
        self._router.rollback_check = self._rollback_check
        client.subscribe_topic("ps-rollback", self._on_rollback)

    def __repr__(self):
        return f"<ParameterServer {self.client.scheduler.address} tables={self.tables()}>"

    # --- lifecycle -------------------------------------------------------------------
    def close(self) -> None:
        """Close the client and cluster this object started (if any)."""
        if self._own_client is not None:
            self._own_client.close()
            if self._own_cluster is not None:
                self._own_cluster.close()
            self._own_client = self._own_cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _on_worker_left(self, event) -> None:
        self._router.transport.liveness.mark_dead(event[1]["address"])

    def _on_worker_joined(self, event) -> None:
        self._router.transport.liveness.dead.discard(event[1]["address"])

    def _on_placement(self, event) -> None:
        _, msg = event
        name, version = msg["table"], msg["version"]
        self._latest_versions[name] = max(version, self._latest_versions.get(name, 0))

    # --- restores from a checkpoint outside a run --------------------------------------
    def _note_restores(self, name: str, table_id, count: int) -> None:
        seen = self._restores_seen.get(name)
        if seen is None or seen[0] != table_id:  # first sight of this table: nothing to report
            self._restores_seen[name] = (table_id, count)
            self._rolled_back.pop(name, None)
        elif count > seen[1]:
            reported = self._rolled_back.get(name, (seen[1], 0))[0]
            self._rolled_back[name] = (reported, count)
            self._restores_seen[name] = (table_id, count)

    def _saw_handle(self, h) -> None:
        self._note_restores(h.spec.name, h.spec.table_id, h.rollbacks)

    def _on_rollback(self, event) -> None:
        msg = event[1]
        if isinstance(msg, dict) and isinstance(msg.get("count"), int) and isinstance(msg.get("table"), str):
            self._note_restores(msg["table"], msg.get("table_id"), msg["count"])

    async def _rolled_back_error(self, name: str) -> RolledBackError:
        reported, known = self._rolled_back.pop(name)
        try:
            records = [_rollback_record(r) for r in await self._scheduler.ps_rollbacks(table=name)]
        except Exception:  # noqa: BLE001 - the error says what it knows
            records = []
        return RolledBackError.from_client(name, records[len(records) - (known - reported):] if records else [])

    async def _rollback_check(self, name: str, done: bool) -> None:
        """(Router, after a refresh in a retry) A restore learnt now, before
        any part of this call was done: this call is the one that raises."""
        if not done and name in self._rolled_back:
            raise await self._rolled_back_error(name)

    def _raise_if_rolled_back(self, name: str) -> None:
        """Before a call on ``name``: raise RolledBackError once if the table
        was restored from a checkpoint since this object last used it."""
        if name in self._rolled_back:
            raise self._sync(self._rolled_back_error, name)

    def _told_of(self, records: list[dict]) -> None:
        """A run reported these restores: calls on those tables need not."""
        for name in {r["table"] for r in records}:
            try:
                self._sync(self._router.handle, name, True)  # learn the table's count of restores now
            except Exception:  # noqa: BLE001 - dropped or lost: nothing to report later either
                pass
            self._rolled_back.pop(name, None)

    def _sync(self, fn, *args, **kwargs):
        self._check_scheduler()
        try:
            return blocking_call(self.client, fn, *args, **kwargs)
        except SchedulerLostError as e:  # a new scheduler's plugin refused this object's cluster id
            raise self._lost_error(str(e)) from e
        except Exception as e:
            self._check_scheduler(e)
            raise

    def _scheduler_lost(self) -> str | None:
        """Why this object's scheduler is gone (no RPC: the client's state), or None."""
        status = self.client.status
        if status in ("connecting", "closing", "closed", "failed"):
            # The client noticed at once: its stream to the scheduler closed.
            return f"the Dask client is {status!r}: its connection to the scheduler is gone"
        # Private, but scheduler_info() would make an RPC; updated on a reconnect.
        now = getattr(self.client, "_scheduler_identity", {}).get("id")
        if self._scheduler_id is not None and now is not None and now != self._scheduler_id:
            return f"the Dask client reconnected to a new scheduler ({now}, was {self._scheduler_id})"
        return None

    def _check_scheduler(self, error: BaseException | None = None) -> None:
        """Raise :class:`SchedulerLostError` if the scheduler is gone, instead of
        waiting for connects to a dead address (``distributed.comm.timeouts.connect``,
        then ``ps.timeouts.failover``) and raising a raw comm error."""
        why = self._scheduler_lost()
        if why is None:
            return
        raise self._lost_error(why) from error

    def _lost_error(self, why: str) -> SchedulerLostError:
        router = getattr(self, "_router", None)  # None while __init__ attaches
        tables = sorted(router.handles) if router is not None else []
        return SchedulerLostError(
            f"dask_ps: {why}. The scheduler held the metadata of every table (and Dask workers close "
            f"when their scheduler connection breaks, taking their blocks): tables {tables} "
            "and any run in progress are gone. Start a new scheduler and workers, then "
            "ParameterServer(Client(address)).load(checkpoint) to continue from the latest ps.save "
            "(docs/reliability.rst, 'Losing the scheduler')."
        )

    def _servers(self, n: int = 0, timeout: float = 0, running: bool = True) -> list[str]:
        return self._sync(self._scheduler.ps_servers, n=n, timeout=timeout, running=running)

    @property
    def servers(self) -> list[str]:
        """Addresses of the workers that host shards."""
        return self._servers(running=False)

    def wait_for_servers(self, n: int = 1, timeout: float | str | None = None) -> list[str]:
        """The shard servers (not those Dask's memory monitor paused, while
        others run), once at least ``n`` serve the parameter server; waits
        up to ``timeout`` (default ``ps.timeouts.no-workers``, 30 s) while there are fewer.

        Raises
        ------
        NoWorkersError
            Fewer than ``n`` after the wait (none at all: a scheduler
            without workers, where a fit used to wait forever). The message
            names the scheduler's address and the ``dask worker <address>``
            command that starts one.
        """
        servers = self._servers()
        if len(servers) >= n:
            return servers
        seconds = parse_timedelta(dask.config.get("ps.timeouts.no-workers") if timeout is None else timeout)
        logger.info("dask_ps: waiting up to %.0f s for %d worker(s) to join %s", seconds, n,
                    self.client.scheduler.address)
        servers = self._servers(n=n, timeout=seconds)
        if len(servers) >= n:
            return servers
        address = self.client.scheduler.address
        have = f"{len(servers)} worker(s) serve it" if servers else "no Dask worker is connected to it"
        raise NoWorkersError(
            f"dask_ps: the Dask scheduler at {address} has waited {seconds:g} s for {n} worker(s) and "
            f"{have}, so nothing can run. Start workers for it, e.g. `dask worker {address}` on each "
            "machine (or scale the cluster up), then try again; ps.timeouts.no-workers sets the wait.",
            address,
        )

    # --- tables ------------------------------------------------------------------------
    def create_table(
        self,
        name: str,
        shape,
        dtype="float64",
        *,
        init=None,
        rule="sum",
        consistency=None,
        device: str = "cpu",
        allow_nonfinite: bool | None = None,
        aggregate: str = "push",
        replication: int = 1,
        block_rows: int | None = None,
        sparse_wire: bool = False,
        **rule_params,
    ) -> None:
        """Create a table sharded over the workers.

        Parameters
        ----------
        name : str
            Table name, unique in the cluster.
        shape : int or tuple of int
            ``(n_rows, *row_shape)``. Rows are the unit of ``push_rows`` /
            ``pull_rows`` and of placement (grouped into row blocks of about
            ``dask.config`` ``ps.block-bytes``).
        dtype : dtype, default "float64"
        init : array, scalar or callable, optional
            Initial values (zeros by default): an array of ``shape``, a
            scalar, or ``init(shape, dtype) -> array`` (called here, once).
        rule : str, UpdateRule or callable, default "sum"
            How the servers fold a push into the stored values: "sum",
            "assign", "sgd", "momentum", "adagrad", "adam", or a callable
            ``rule(param_block, update_block, state)``. Hyper-parameters go in
            ``rule_params`` (``lr=0.1``).
        consistency : Consistency, optional
            ``BSP()``, ``SSP(s)``, ``ESSP(s)``, ``VAP(v)``, ``CVAP(s, v)``,
            ``ASP()``; default from ``dask.config`` ``ps.consistency``.
        device : {"cpu", "cuda", "auto"}
            Where the blocks live (cuda: cupy arrays on the workers' GPUs;
            auto: cuda when every worker has a GPU, else cpu). A cuda table
            is refused when a worker has no GPU or its share would exceed
            ``ps.max-memory-fraction`` of a GPU's free memory.
        allow_nonfinite : bool, optional
            Accept NaN/Inf in pushes (default ``ps.allow-nonfinite``: no).
        aggregate : {"push", "clock"}, default "push"
            "push" applies the rule to every push as it arrives. "clock" sums
            all participants' pushes of one clock and applies the rule once
            when every participant has finished that clock (MXNet's
            synchronous mode: one optimizer step per iteration on the summed
            gradient). Pushes from outside a run are applied at once.
        replication : int, default 1
            Copies of every block on distinct workers. A push is acknowledged
            once every live copy applied it; when a worker dies a surviving
            copy takes over and a new copy is made, so nothing acknowledged
            is lost. With 1, a lost block is restored from the latest
            :meth:`save` (updates since are lost, with a warning) or, without
            a checkpoint, the table raises :class:`DataLostError`.
        block_rows : int, optional
            Rows per block, overriding ``ps.block-bytes``.
        sparse_wire : bool, default False
            Rows mostly zeros (counts): participants' pushes and reads carry
            each row's nonzeros between processes where that halves the
            bytes of a block of 1 MiB or more.

        Raises
        ------
        TableExistsError
            A table of this name exists with a different spec (an identical
            spec is a no-op, so re-running a script is safe).
        """
        if device == "auto":
            device = self._sync(self._scheduler.ps_resolve_device)
        spec = _spec.TableSpec.create(
            name, shape, dtype, device=device, rule=rule, consistency=consistency,
            allow_nonfinite=allow_nonfinite, aggregate=aggregate, replication=replication,
            block_rows=block_rows, sparse_wire=sparse_wire, **rule_params,
        )
        values = None
        if init is not None:
            if callable(init):
                init = init(spec.shape, spec.dtype)
            if np.ndim(init) == 0 and not hasattr(init, "shape"):
                values = np.full(spec.shape, _spec.check_scalar(spec, init), dtype=spec.dtype)
            else:
                values = _spec.check_values(spec, init, spec.shape, what="init")
        handle = self._sync(self._scheduler.ps_create_table, spec=spec.to_msg())
        self._router.forget(name)
        if values is not None:
            if handle["spec"]["table_id"] != spec.table_id:
                logger.info("dask_ps: table %r already existed; init values not applied", name)
                return
            self._sync(self._router.push_dense, name, values, True)

    def drop_table(self, name: str) -> None:
        """Delete a table and free its shards."""
        self._sync(self._scheduler.ps_drop_table, name=name)
        self._router.forget(name)
        self._restores_seen.pop(name, None)  # one entry a table ever made (every fit's) grew without end

    def tables(self) -> list[str]:
        """Names of the existing tables."""
        return self._sync(self._scheduler.ps_list_tables)

    def spec(self, name: str) -> _spec.TableSpec:
        """The :class:`TableSpec` of a table."""
        return self._handle(name).spec

    def _handle(self, name, refresh=True):
        h = self._router.handles.get(name)
        if not refresh and h is not None and h.version >= self._latest_versions.get(name, 0):
            return h  # cached and current: no event-loop round trip
        return self._sync(self._router.handle, name, refresh)

    def placement(self, name: str) -> list[BlockPlacement]:
        """Which worker holds which rows: one ``(block, start, stop, worker)`` per block."""
        h = self._handle(name)
        return [
            BlockPlacement(b, *h.spec.block_bounds(b), h.primary(b)) for b in range(h.spec.n_blocks)
        ]

    # --- data -----------------------------------------------------------------------
    def push(self, name: str, values) -> None:
        """Send an update for the whole table; the servers fold it in with the
        table's rule (a sum by default). Returns once every server applied it."""
        # One block goes to one server in one message, whose NaN/Inf check
        # (fused with its overflow check's pass) refuses it whole: no pass
        # here. Blocks on several servers are checked here, before any is sent.
        _, (values, found) = self._checked(name, lambda spec: _spec.check_values(
            spec, values, spec.shape, check_finite=spec.n_blocks > 1, bound=True))
        self._raise_if_rolled_back(name)
        self._sync(self._router.push_dense, name, values, False, found)  # found: for the leases (Router.send)

    def push_rows(self, name: str, rows, values) -> None:
        """Update only ``rows``.

        Duplicate rows are summed before the table's rule is applied
        (``np.add.at`` semantics: an optimizer rule takes one step with the
        summed gradient), except for ``rule="assign"``, where the last
        occurrence wins; a participant's ``ctx.push_rows`` does the same.
        """
        def check(spec):
            checked = _spec.check_rows(spec, rows)
            return checked, _spec.check_values(spec, values, (len(checked), *spec.row_shape))

        h, (rows, values) = self._checked(name, check)
        rows, values = coalesce_rows(rows, values, additive=h.spec.rule.name != "assign")
        values = _spec.summed_in_range(h.spec, values)
        self._raise_if_rolled_back(name)
        self._sync(self._router.push_rows, name, rows, values)

    def pull(self, name: str):
        """The whole table as one array (numpy for cpu tables)."""
        self._handle(name, refresh=False)
        self._raise_if_rolled_back(name)
        return self._sync(self._router.pull_dense, name)

    def pull_rows(self, name: str, rows):
        """Values of ``rows`` (any order, duplicates allowed), shape ``(len(rows), *row_shape)``."""
        _, rows = self._checked(name, lambda spec: _spec.check_rows(spec, rows))
        self._raise_if_rolled_back(name)
        return self._sync(self._router.pull_rows, name, rows)

    def _checked(self, name: str, check):
        """``(handle, check(spec))`` on this client's cached handle of table
        ``name``; where the check refuses, on a fresh one if the table changed
        meanwhile (another client dropped it, or made it again with another
        dtype or shape): its error (``UnknownTableError`` where it is gone),
        not the stale spec's."""
        h = self._handle(name, refresh=False)
        try:
            return h, check(h.spec)
        except PSValueError:
            fresh = self._handle(name, refresh=True)
            if fresh.version == h.version and fresh.spec == h.spec:
                raise
            return fresh, check(fresh.spec)

    # --- participants ---------------------------------------------------------------------
    def run(self, fn, parts, *, run_info: dict | None = None, **kwargs) -> list:
        """Run ``fn(ctx, part, **kwargs)`` once per element of ``parts``, concurrently on workers.

        Parameters
        ----------
        fn : callable
            ``fn(ctx, part, **kwargs)``; ``ctx`` is a :class:`~dask_ps.Session`
            (push/pull/clock for this participant).
        parts : sequence
            One element per participant: plain objects, or futures / dask
            collections (each participant then runs where its data is).
        run_info : dict, optional
            What the dashboard's ``/ps`` page shows of the run (not passed
            to ``fn``): ``name`` (e.g. the estimator's class), ``params``
            (a dict shown next to it) and ``planned_clocks`` (the clocks
            each participant will complete: progress is shown as clocks
            done of these; in your units with ``unit``, ``clocks_per_unit``,
            ``total_units``..., ``loss_name``: ``_dashboard.check_run_info``).
            Participants report their loss with :func:`dask_ps.report_progress`.

        Returns
        -------
        list
            ``fn``'s return values, in the order of ``parts``.

        Notes
        -----
        Each participant is one long-running Dask task that secedes from the
        worker's thread pool. If one raises, the run is aborted: the others
        get :class:`RunAbortedError` at their next clock, and the first
        error is re-raised here with its remote traceback.

        Raises
        ------
        RolledBackError
            The run finished, but blocks of a table it used were lost with a
            worker (no replica) and restored from the table's checkpoint
            while it ran: updates since that checkpoint, the run's
            included, are gone. The error names the tables, blocks and
            clocks, and carries the participants' return values
            (``results``). A run that fails for another reason re-raises
            that error with a note saying the same.
        CopiesDisagreeError
            (``dask_ps._exceptions``, a ``PSError``) The run finished, but
            at its end a copy of a block of a table it used held fewer
            updates than the others (it missed some, and may have been
            read): the copy is made again; redo the run
            (docs/reliability.rst, "Known limits").
        """
        from dask_ps._session import participant

        parts = list(parts)
        n = len(parts)
        if n == 0:
            return []
        run_info = check_run_info(run_info)  # PSValueError before anything starts
        run_id, owner = uuid.uuid4().hex[:12], uuid.uuid4().hex  # owner: the run's secret (docs/security.rst)
        servers = self.wait_for_servers()  # NoWorkersError after ps.timeouts.no-workers without any
        name = getattr(fn, "__name__", "fn")
        self._sync(self._scheduler.ps_run_start, run_id=run_id, n=n, name=name, info=run_info, owner=owner)
        futures = []
        for rank, part in enumerate(parts):
            key = f"ps-run-{name}-{rank}-{run_id}"
            if dask.is_dask_collection(part):
                part = self.client.compute(part)
            if isinstance(part, Future) or futures_of(part):
                # Let Dask place the participant where its data is (futures
                # anywhere in the part, e.g. a tuple (X_future, y_future)).
                fut = self.client.submit(participant, run_id, rank, n, fn, part, kwargs, owner, key=key, pure=False)
            else:
                fut = self.client.submit(
                    participant, run_id, rank, n, fn, part, kwargs, owner, key=key, pure=False,
                    workers=[servers[rank % len(servers)]], allow_other_workers=True,
                )
            futures.append(fut)
        try:
            results = gather_outside_the_pool(self.client, futures)
        except BaseException as e:
            if not isinstance(e, Exception):  # Ctrl-C: the participants end at their next clock
                keep_until_done(futures)
            self._check_scheduler(e)  # the participants' futures were cancelled: say why
            try:
                self._sync(self._scheduler.ps_run_abort, run_id=run_id, reason=f"{type(e).__name__}: {e}",
                           owner=owner)
            finally:
                rolled_back = self._end_run(run_id, owner)
                if rolled_back:
                    e.add_note(f"dask_ps: {RolledBackError.from_run(run_id, rolled_back)}")
            raise
        rolled_back = self._end_run(run_id, owner)
        if rolled_back:
            # Never only a log line: acknowledged updates are gone.
            raise RolledBackError.from_run(run_id, rolled_back, results)
        disagree = self._metrics.get(run_id, {}).get("copies_disagree")
        if disagree:
            # A copy that missed updates may have been read: never a silent wrong answer (issue 22).
            from dask_ps._exceptions import CopiesDisagreeError

            raise CopiesDisagreeError(
                f"run {run_id} finished, but copies of a table it used held different updates at its end "
                + "; ".join(f"(table {d['table']!r}: block, worker, updates, highest: {d['copies']})"
                            for d in disagree)
                + ": a participant may have read a copy that missed updates. The copies are being made "
                "again; redo the run.", {d["table"]: d["copies"] for d in disagree}, results)
        return results

    def _end_run(self, run_id: str, owner: str) -> list[dict]:
        """Forget the run on the scheduler, keep its metrics; returns its rollbacks."""
        metrics = self._sync(self._scheduler.ps_run_end, run_id=run_id, owner=owner)
        if metrics is None:
            return []
        metrics["rolled_back"] = [_rollback_record(r) for r in metrics.get("rolled_back", ())]
        self._metrics[run_id] = metrics
        self._told_of(metrics["rolled_back"])  # the run raises: later calls on those tables do not
        return metrics["rolled_back"]

    def rollbacks(self, table: str | None = None) -> list[dict]:
        """The latest restores of lost blocks from a checkpoint (of ``table``,
        or of every table), whether or not a run was active: each record
        names the table, the blocks, the reason, the checkpoint and when it
        was noted and restored (see :class:`RolledBackError`). Updates made
        since the checkpoint to those blocks are gone."""
        return [_rollback_record(r) for r in self._sync(self._scheduler.ps_rollbacks, table=table)]

    def memory(self) -> dict[str, dict]:
        """What each shard server holds: per worker address, the bytes of the
        blocks of each table it hosts (primaries and replicas: every copy
        counts where it lives), their sum, and the worker's Dask memory
        limit and process memory (as of its last heartbeat; None where Dask
        does not report them).

        Returns
        -------
        dict
            ``{address: {"tables": {name: bytes}, "table_bytes": int,
            "memory_limit": int | None, "process_memory": int | None}}``;
            a server that did not answer has ``"error"`` instead of
            ``"tables"`` and ``"table_bytes"``.
        """
        servers = self.servers
        infos = self._sync(self._server_infos, servers)
        workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        out = {}
        for w, info in zip(servers, infos):
            ws = workers.get(w, {})
            entry = {"memory_limit": ws.get("memory_limit") or None,
                     "process_memory": ws.get("metrics", {}).get("memory")}
            if isinstance(info, Exception):
                entry["error"] = f"{type(info).__name__}: {info}"
            else:
                entry["tables"] = {name: int(t["nbytes"]) for name, t in info.items()}
                entry["table_bytes"] = sum(entry["tables"].values())
            out[w] = entry
        return out

    async def _server_infos(self, servers: list[str]) -> list:
        async def one(w):
            try:
                return await self.client.rpc(w).ps_info()
            except Exception as e:  # noqa: BLE001 - reported per server
                return e

        return await asyncio.gather(*[one(w) for w in servers])

    def metrics(self) -> dict:
        """Per run: clocks, attempts, seconds, and per participant and table
        the counters of :class:`~dask_ps.Session` (reads, cache hits, wait
        time, staleness histogram, bytes). Only the latest
        ``ps.metrics-history`` runs (default 100) are kept, oldest first.
        A run that raised is ended as soon as its error is known, so its
        entry holds the participants that had left by then (the others
        stop at their next call, unrecorded: their ``clocks`` read 0)."""
        return dict(self._metrics)

    # --- reliability: checkpoints and placement -----------------------------------------
    def wait_for_placement(self) -> None:
        """Block until background placement changes (rebalancing after a worker
        joined, repairs after one left) are done."""
        self._sync(self._scheduler.ps_placement_settled)

    def save(self, path: str, tables=None, metadata: dict | None = None) -> None:
        """Checkpoint tables (default: all) to ``path`` (any fsspec URL the
        workers can write, e.g. a shared directory or ``s3://...``).

        Each worker writes the blocks it is primary of; values and optimizer
        state are saved bitwise. The checkpoint becomes visible atomically
        (a manifest renamed into place); the saved tables replace their
        older copies at ``path`` and other tables saved there are kept. Call
        it between runs, at a clock boundary: it refuses while a run that
        used one of these tables is in progress. ``metadata`` (JSON-able) is stored with it and
        returned by :meth:`load` (estimators keep their iteration count there).
        Blocks later lost with a worker and no replica are restored from the
        latest checkpoint.
        """
        from dask_ps import _checkpoint

        names = self.tables() if tables is None else [tables] if isinstance(tables, str) else list(tables)
        active = self._sync(self._scheduler.ps_active_runs, tables=names)
        if active:
            raise RuntimeError(
                f"ps.save: run(s) {active} using these tables are in progress; save between runs "
                "so the checkpoint is a consistent state at a clock boundary"
            )
        # The scheduler has the tables' holders write their blocks under
        # path/data/<table> (it computes the directories: workers write
        # nowhere else); the manifest written here makes the save visible.
        path = _checkpoint.resolve(path)
        data = _checkpoint.new_data_dir(path)
        specs = self._sync(self._scheduler.ps_save_tables, path=path, data=data, tables=names)
        entries = {name: {"spec": specs[name], "data": data} for name in names}
        _checkpoint.commit(path, entries, metadata or {})
        self._sync(self._scheduler.ps_note_checkpoint, path=path, data=data, tables=names)
        logger.info("dask_ps: saved %d table(s) to %s", len(names), path)

    def load(self, path: str, tables=None, *, overwrite: bool = False) -> dict:
        """Restore tables (default: all) saved by :meth:`save`; returns the
        checkpoint's ``metadata``. Works on a different cluster: blocks go
        to the current workers by the usual placement.

        Raises
        ------
        FileNotFoundError
            No checkpoint at ``path``.
        TableExistsError
            A table exists already (``overwrite=True`` drops it first, unless
            an active run uses it: ``RuntimeError``, as :meth:`save`). The
            tables load one after the other, each dropped just before its
            own load: a load that fails (a missing or damaged block) leaves
            that table absent and those after it as they were.
        """
        from dask_ps import _checkpoint

        manifest = _checkpoint.read_manifest(path)
        if manifest is None:
            raise FileNotFoundError(f"no dask_ps checkpoint at {path!r} (manifest.json missing)")
        names = list(manifest["tables"]) if tables is None else [tables] if isinstance(tables, str) else list(tables)
        existing = set(self.tables())
        for name in names:
            if name not in manifest["tables"]:
                raise UnknownTableError(f"checkpoint {path!r} has no table {name!r}", name)
            if name in existing:
                if not overwrite:
                    raise TableExistsError(f"table {name!r} exists; pass overwrite=True to replace it", name)
                _checkpoint.refuse_overwrite(name, self._sync(self._scheduler.ps_active_runs, tables=[name]))
        path = _checkpoint.resolve(path)
        for name in names:
            # Each table dropped just before its own load: a load that fails
            # leaves the tables after it as they were (all were dropped first).
            if name in existing:
                self.drop_table(name)
            spec = _spec.TableSpec.from_msg(manifest["tables"][name]["spec"])
            spec = dataclasses.replace(spec, table_id=uuid.uuid4().hex)
            self._sync(self._scheduler.ps_create_table, spec=spec.to_msg())
            self._router.forget(name)
            # Every copy of every block, or none: each is checked against the
            # spec (shapes, dtypes, NaN/Inf where forbidden) before any is installed.
            try:
                self._sync(self._scheduler.ps_load_table, name=name, table_id=spec.table_id, path=path,
                           data=manifest["tables"][name]["data"])
            except BaseException:
                try:
                    self.drop_table(name)  # never a table with some blocks loaded and others zero
                except Exception as e:  # noqa: BLE001 - the load's error is the one to raise
                    logger.warning("dask_ps: could not drop %r after its load failed: %r", name, e)
                raise
        return manifest.get("metadata", {})


class _AttachedScheduler:
    """The client's rpc to the scheduler whose ``ps_*`` calls carry the id
    of the scheduler plugin a ParameterServer attached to (``cluster_id``):
    the plugin refuses a call meant for another instance with
    :class:`SchedulerLostError`. Other attributes are the rpc's."""

    def __init__(self, rpc, cluster_id: str | None):
        self._rpc, self.cluster_id = rpc, cluster_id

    def __getattr__(self, op):
        if op.startswith("_"):  # not set yet (copy, pickle): no recursion through self._rpc
            raise AttributeError(op)
        call = getattr(self._rpc, op)
        if not op.startswith("ps_"):
            return call
        return lambda **msg: call(cluster_id=self.cluster_id, **msg)


def _rollback_record(record: dict) -> dict:
    """A rollback record as sent, with lists again (msgpack gives tuples)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in record.items()}


# --- the parameter server an estimator uses with client=None ---------------------------
_clients_by_address: dict[str, Client] = {}


def _client_for(client):
    """``client`` as a ``Client``: a scheduler address string connects once
    per address (not as the default client); ``None`` stays ``None``."""
    if not isinstance(client, str):
        return client
    c = _clients_by_address.get(client)
    if c is None or c.status not in ("running", "connecting", "newly-created"):
        c = _clients_by_address[client] = Client(client, set_as_default=False)
    return c


_auto_lock = threading.Lock()
_auto_ps: ParameterServer | None = None
_ps_by_client: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def get_parameter_server(client: Client | str | None = None, on_start=None) -> ParameterServer:
    """The :class:`ParameterServer` of ``client`` (a ``Client`` or a scheduler
    address); with ``None``, the current client's, or one on the embedded
    cluster (:func:`embedded_cluster_kwargs`), started once per process,
    reused by every later call and closed at interpreter exit. The embedded
    cluster never becomes Dask's default scheduler.

    Estimators call this for ``client=None``, so fitting several (of any
    kind) in one process starts at most one cluster. ``on_start(ps)`` is
    called when this call started the embedded cluster (a verbose
    estimator says where its dashboard is: :func:`describe_embedded_cluster`).
    """
    global _auto_ps
    client = _client_for(client)
    if client is None:
        try:
            client = get_client()
        except ValueError:
            client = None
    with _auto_lock:
        if client is None or (_auto_ps is not None and client is _auto_ps.client):
            if _auto_ps is None or _auto_ps.client.status != "running":
                logger.info("dask_ps: no Dask client; starting a LocalCluster (closed at exit)")
                _auto_ps = ParameterServer()
                logger.info("%s", describe_embedded_cluster(_auto_ps))
                if on_start is not None:
                    on_start(_auto_ps)
            return _auto_ps
        ps = _ps_by_client.get(client)
        if ps is None:
            ps = _ps_by_client[client] = ParameterServer(client)
        return ps


def existing_client(client) -> Client | None:
    """The running client that :func:`get_parameter_server` would use for
    ``client`` (a ``Client``, an address, ``None``), if it exists already;
    never connects nor starts a cluster (a fit trained in the calling
    process is shown on the ``/ps`` page only where there is one)."""
    import distributed  # looked up at call time, as chose_a_cluster does

    if isinstance(client, str):
        client = _clients_by_address.get(client)
    elif client is None:
        try:
            client = distributed.get_client()
        except ValueError:
            client = _auto_ps.client if _auto_ps is not None else None
    if client is None or getattr(client, "status", None) != "running":
        return None
    return client


@atexit.register
def _close_auto_ps() -> None:
    global _auto_ps
    ps, _auto_ps = _auto_ps, None
    if ps is not None:
        try:
            ps.close()
        except Exception:  # pragma: no cover - interpreter shutting down
            pass


class _RunHistory(dict):
    """Metrics by run id, the oldest dropped beyond ``ps.metrics-history``
    runs (a grid search does thousands of fits; issue 14)."""

    def __setitem__(self, run_id, metrics):
        super().__setitem__(run_id, metrics)
        keep = max(0, int(dask.config.get("ps.metrics-history")))
        while len(self) > keep:
            del self[next(iter(self))]
