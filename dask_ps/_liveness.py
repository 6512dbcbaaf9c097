"""Fail fast on dead workers.

Dask's connection pool retries a connect to a dead address until
``distributed.comm.timeouts.connect`` (30 s by default). dask_ps learns of a
dead worker from the scheduler at once (a handler on workers, an event on
clients); ``Liveness`` then cancels the calls in flight to it and refuses new
ones with ``OSError``, which the failover logic retries elsewhere.

Also here: the scheduler's calls to workers (``WorkerCalls``), a worker's
liveness beacon (``Beacon``: a thread of its own, so that a task or a
handler that keeps the event loop busy does not make the worker look dead),
the scheduler's watch for workers that stop instead of dying
(``HungWorkers``: fenced out like dead ones), and a worker's own check that
it was not stopped long enough to have been fenced out (``PauseGuard``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict

from distributed.comm import CommClosedError

logger = logging.getLogger(__name__)

BEACON_PERIOD = 0.5  # seconds between two beats of a worker's Beacon
# Seconds a retiring worker's teardown waits for its evacuation past the
# scheduler's own bound (ps.timeouts.failover), so that the scheduler marks
# it gone before it drops its copies (issue 34).
RETIRE_MARGIN = 10.0


class WorkerGone(OSError):
    """The worker was removed from the cluster."""


class Liveness:
    def __init__(self):
        self.dead: set[str] = set()
        # The tasks with a call in flight to each address, and those that
        # mark_dead cancelled for it (not yet back in ``call``).
        self._inflight: dict[str, set[asyncio.Task]] = defaultdict(set)
        self._cancelled: set[asyncio.Task] = set()

    def mark_dead(self, addr: str) -> None:
        """Called on the event loop that runs the calls."""
        self.dead.add(addr)
        for task in self._inflight.pop(addr, ()):
            self._cancelled.add(task)
            task.cancel()

    async def call(self, addr: str, make_call, involves=()):
        """Await ``make_call()`` (a call to ``addr``) unless ``addr`` is or
        becomes dead. A factory, so that nothing is created for a dead address.
        ``involves``: other workers the call waits on (a copy's target),
        whose death fails it too: the worker called may not hear of it.

        The call runs in the caller's task, which :meth:`mark_dead` cancels
        if ``addr`` dies meanwhile; that cancellation is taken back here and
        raised as :class:`WorkerGone` (a task of its own per call cost a
        task and two turns of the event loop on every push and pull;
        docs/benchmarks-history.md, KV)."""
        addrs = (addr, *involves)
        for a in addrs:
            if a in self.dead:
                raise WorkerGone(f"worker {a} has left the cluster")
        task = asyncio.current_task()
        held = [(a, self._inflight[a]) for a in addrs]
        for _, tasks in held:
            tasks.add(task)
        try:
            return await make_call()
        except asyncio.CancelledError:
            # mark_dead's cancellation is this call's failure; another
            # cancellation of the caller's task stands.
            if task in self._cancelled:
                self._cancelled.discard(task)
                if task.uncancel() == 0:
                    gone = next((a for a in addrs if a in self.dead), addr)
                    raise WorkerGone(f"worker {gone} left the cluster during the call") from None
            raise
        finally:
            for a, tasks in held:
                tasks.discard(task)
                if not tasks and self._inflight.get(a) is tasks:
                    del self._inflight[a]
            if task in self._cancelled:  # the call swallowed the cancellation
                self._cancelled.discard(task)
                task.uncancel()


class WorkerCalls:
    """The scheduler's RPCs to workers, through :class:`Liveness`.

    ``rpc(address)`` gives the scheduler's rpc to a worker; ``retiring`` and
    ``members`` are the plugin's sets (read at each call).
    """

    def __init__(self, rpc, liveness: Liveness, retiring: set[str], members: set[str]):
        self.rpc = rpc
        self.liveness = liveness
        self.retiring = retiring
        self.members = members

    def __repr__(self):
        return f"<WorkerCalls members={len(self.members)} retiring={sorted(self.retiring)}>"

    def call_once(self, worker: str, op: str, involves=(), **msg):
        """An RPC to a worker that fails fast if the worker (or one it
        ``involves``) is removed meanwhile."""
        return self.liveness.call(worker, lambda: getattr(self.rpc(worker), op)(**msg), involves)

    async def call(self, worker: str, op: str, attempts: int = 4, **msg):
        """An RPC to a worker (:meth:`call_once`), retried on a closed
        connection while ``worker`` is retiring: Dask's scheduler drops its
        connections to a worker when it removes it, while the worker still
        serves its blocks (its teardown waits for the evacuation), so a new
        connection gets through. Never past the retiree's departure
        (``Liveness.mark_dead`` at the end of its teardown: issue 34)."""
        for attempt in range(attempts):
            try:
                return await self.call_once(worker, op, **msg)
            except WorkerGone:
                raise
            except (CommClosedError, OSError):
                if worker not in self.retiring or worker in self.liveness.dead or attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)

    async def broadcast(self, op: str, **msg) -> None:
        """``op`` on every member and every retiring worker (it still serves,
        and copies its blocks away: it must hear that a worker left, or its
        copy to that worker waits on a dead address; issue 34); failures are
        logged (debug), not raised."""
        results = await asyncio.gather(
            *(self.call(w, op, **msg) for w in sorted(self.members | self.retiring)),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, Exception):
                logger.debug("dask_ps: %s failed on a worker: %r", op, r)


class Beacon:
    """A worker's liveness signal, sent from a thread of its own.

    Dask's heartbeats (and every handler) run on the worker's event loop, so
    anything that keeps that loop from running -- an import or a numba
    compile on it, a sync handler, a long garbage collection, a task thread
    holding the GIL in long stretches -- stops them, although the process
    is alive and will answer. Fencing such a worker out made healthy workers
    of a cold cluster drop their copies (issue 22). This thread only needs
    the GIL for a moment every ``period`` seconds (CPython hands it over
    every ``sys.getswitchinterval()``, 5 ms, to a waiting thread), and
    sends ``ps_alive`` (one-way, with the internal token) on a connection
    of its own to the scheduler, on an event loop of its own. What it
    proves is the process runs Python code; not that its event loop serves.

    ``last_tick`` (``time.monotonic``) is when the thread last ran; the
    longest gap between two of its runs since :meth:`take_gap` is what the
    worker's :class:`PauseGuard` reads: a gap long enough that the
    scheduler may have fenced this worker out.
    """

    def __init__(self, period: float = BEACON_PERIOD):
        self.period = period
        self.last_tick = time.monotonic()
        self.sent = 0
        self._gap = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self):
        return f"<Beacon sent={self.sent} running={self.running}>"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, scheduler_address: str, me: str, token: str, connection_args: dict | None = None) -> None:
        if self.running:
            return
        self._stop.clear()
        self.last_tick = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, args=(scheduler_address, me, token, dict(connection_args or {})),
            name=f"dask-ps-beacon {me}", daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread = None

    def take_gap(self) -> float:
        """The longest time this thread did not run since the last call (the
        time since it last ran included)."""
        gap = max(self._gap, time.monotonic() - self.last_tick)
        self._gap = 0.0
        return gap

    def _tick(self) -> None:
        now = time.monotonic()
        self._gap = max(self._gap, now - self.last_tick)
        self.last_tick = now

    def _run(self, address, me, token, connection_args) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._beat(address, me, token, connection_args))
        except Exception as e:  # never let the thread die loudly; the worker then looks stopped
            logger.warning("dask_ps: the liveness beacon stopped: %r", e)
        finally:
            loop.close()

    async def _beat(self, address, me, token, connection_args) -> None:
        from distributed.comm import connect

        comm = None
        stop = self._stop
        try:
            while not stop.is_set():
                self._tick()
                try:
                    if comm is None or comm.closed():
                        comm = await asyncio.wait_for(
                            connect(address, **connection_args), 10)
                    await asyncio.wait_for(comm.write(
                        {"op": "ps_alive", "address": me, "token": token, "reply": False}), 10)
                    self.sent += 1
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # the scheduler is busy, away or closing: again
                    logger.debug("dask_ps: beacon to %s: %r", address, e)
                    if comm is not None:
                        comm.abort()
                    comm = None
                # Short sleeps: the tick also measures this thread's own gaps.
                deadline = time.monotonic() + self.period
                while not stop.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(min(0.1, self.period))
                    self._tick()
        finally:
            if comm is not None:
                comm.abort()


class HungWorkers:
    """The scheduler's watch for shard servers that stop (SIGSTOP, a frozen
    VM) instead of dying.

    Dask removes such a worker only after ``distributed.scheduler.worker-ttl``
    (minutes); until then every push forwarded to it, and every read or push
    of a block it is primary of, waits up to ``ps.timeouts.rpc``.

    **Slow is not dead.** A member is judged by the later of its Dask
    heartbeat and its :class:`Beacon` (``ps_alive``, from a thread of its
    own, every 0.5 s): a worker whose event loop is busy (compiling,
    importing, a sync handler) still beats, and only one whose process
    does not run Python for ``ps.timeouts.hung`` (6 s) is *fenced out* as
    a dead worker is: the other workers and the clients cancel their calls
    to it (``ps_worker_left``, event ``"ps-worker-left"``) and refuse its
    forwards, and every table it holds is repaired without it (a replica is
    promoted, a new copy made). A member that never beat (no beacon) is
    judged by Dask's heartbeats, with at least three heartbeat intervals.
    Nothing is decided while this scheduler's own loop was late, nor for a
    second after (beacons may be waiting to be read), nor when every member
    is silent at once.

    It is done only where nothing is lost by it: every block the worker
    holds must have another up-to-date copy on a responsive member, a copy
    still being made by a placement change not counted (otherwise the
    callers wait for it, as before, and a WARNING says why). When the worker
    answers again, once no placement lists it any more (the repairs are
    done, so its copies are needed nowhere) it drops every copy it still has
    (``ps_evicted``: they missed pushes) and is taken back as a new member,
    so tables rebalance onto it with fresh copies.

    Handed what it uses by the scheduler plugin (built in its ``start``):
    the membership sets, the table registry, ``Liveness`` and the calls to
    workers, and three actions of other parts (``repair``, ``retiree_left``,
    ``rejoin``); it never reaches back into the plugin.
    """

    def __init__(self, *, scheduler, members, retiring, tables, creating, liveness, calls, worker_rpc,
                 in_background, repair, retiree_left, rejoin):
        self.scheduler = scheduler  # Dask's: workers (last_seen), status, event log
        self.members = members  # the shard servers (the set, read at each check)
        self.retiring = retiring  # being retired: judged by _check_retirees
        self.tables = tables  # name -> SchedulerTableState: whose copies are the only ones
        self.creating = creating  # table -> owners, while its shards are created
        self.liveness = liveness  # a fenced worker is marked dead there
        self.calls = calls  # WorkerCalls (ps_worker_left to the others)
        self.worker_rpc = worker_rpc  # worker -> rpc, not through Liveness (ps_evicted)
        self.in_background = in_background  # runs a task ps_placement_settled waits for
        self.repair = repair  # PlacementChanger.repair(name, gone=, reason=)
        self.retiree_left = retiree_left  # Retirements.left(worker, why)
        self.rejoin = rejoin  # the plugin's register_server(worker): a taken-back worker joins
        self.fenced: dict[str, str] = {}  # worker -> eviction id, until it is taken back
        self._warned: set[str] = set()  # hung workers not fenced (sole copies), warned once
        self._last_check: float | None = None
        self._callback = None
        self._waiting: set[asyncio.Task] = set()  # ps_evicted calls waiting for a hung worker
        self.beats: dict[str, float] = {}  # worker -> when its Beacon was last heard (distributed.metrics.time)
        self._quiet_until = 0.0  # no decision before (this loop was late: beacons may be unread)

    def __repr__(self):
        return f"<HungWorkers fenced={sorted(self.fenced)}>"

    def start(self, period: float = 0.25) -> None:
        from tornado.ioloop import PeriodicCallback

        self._callback = PeriodicCallback(self.check, period * 1000)
        self._callback.start()

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
        for task in self._waiting:
            task.cancel()

    def forget(self, worker: str) -> None:
        """``worker`` left the cluster (Dask removed it)."""
        self.fenced.pop(worker, None)
        self._warned.discard(worker)
        self.beats.pop(worker, None)

    def alive(self, worker: str) -> None:
        """``worker``'s :class:`Beacon` was heard (handler ``ps_alive``)."""
        from distributed.metrics import time

        self.beats[worker] = time()

    def last_heard(self, worker: str) -> float:
        """When ``worker`` was last heard: its beacon or its Dask heartbeat."""
        ws = self.scheduler.workers.get(worker)
        seen = ws.last_seen if ws is not None else 0.0
        return max(seen, self.beats.get(worker, 0.0))

    def limit(self, worker: str | None = None) -> float:
        """Seconds without being heard after which a member counts as hung
        (0: never): ``ps.timeouts.hung`` for a member with a beacon, at least
        three Dask heartbeat intervals for one without (or ``worker=None``)."""
        from distributed.scheduler import heartbeat_interval

        from dask_ps import _config

        hung = _config.get_seconds("timeouts.hung")
        if not hung:
            return 0.0
        if worker is not None and worker in self.beats:
            return max(hung, 4 * BEACON_PERIOD)
        return max(hung, 3 * heartbeat_interval(len(self.scheduler.workers)))

    def check(self) -> None:
        """Periodic (scheduler's event loop): fence out members that hang."""
        from distributed.metrics import time

        now = time()
        last, self._last_check = self._last_check, now
        if not self.limit() or self.scheduler is None or self.scheduler.status.name != "running":
            return
        if last is not None and now - last > 1.0:
            # This loop stalled itself: beacons and heartbeats may be waiting to be read.
            self._quiet_until = now + 1.0
        if now < self._quiet_until:
            return
        self._check_retirees(now)
        workers = self.scheduler.workers
        silent = {w for w in self.members
                  if w in workers and w not in self.retiring and now - self.last_heard(w) > self.limit(w)}
        for w in list(self._warned):
            if w not in silent:
                self._warned.discard(w)
        if not silent or len(silent) >= len(self.members):
            return  # nobody answers: more likely the scheduler's problem than theirs
        for w in sorted(silent):
            why_not = self._sole_copies(w, silent)
            if why_not:
                if w not in self._warned:
                    self._warned.add(w)
                    logger.warning("dask_ps: worker %s has not been heard for %.1f s but is not fenced: %s; "
                                   "calls to it wait until it answers or Dask removes it",
                                   w, now - self.last_heard(w), why_not)
                continue
            self._fence_out(w, f"{w} hung (not heard for {now - self.last_heard(w):.1f} s: no beacon, "
                               "no heartbeat)")

    def _check_retirees(self, now: float) -> None:
        """A retiring worker that Dask already removed (its teardown waits
        for the evacuation) and whose beacon is silent for the limit was
        killed or stopped while it retired: it is gone, so that no
        placement change waits on its copies (issue 34)."""
        for w in sorted(self.retiring):
            if (w not in self.scheduler.workers and w in self.beats
                    and now - self.beats[w] > self.limit(w)):
                logger.warning("dask_ps: retiring worker %s not heard for %.1f s: it is gone",
                               w, now - self.beats[w])
                self.retiree_left(w, f"{w} stopped while it retired")

    def _sole_copies(self, worker: str, silent: set[str]) -> str | None:
        """Why fencing ``worker`` out would lose data (a block whose only
        up-to-date copy it holds), or None. A copy a placement change is
        still making does not count (its target has nothing yet)."""
        for name, owners in list(self.creating.items()):
            if any(worker in ws and len(ws) == 1 for ws in owners):
                return f"it holds the only copy of a block of table {name!r}, being created"
        for t in self.tables.values():
            if t.lost or worker not in t.listed():
                continue
            for b in range(len(t.owners)):
                have = t.up_to_date(b)
                if worker in have and not any(
                    w != worker and w in self.members and w not in silent for w in have
                ):
                    return f"it holds the only up-to-date copy of block {b} of table {t.spec.name!r}"
        return None

    def _fence_out(self, worker: str, reason: str) -> None:
        import uuid

        logger.warning("dask_ps: %s: fencing it out (its copies leave every placement)", reason)
        self.fenced[worker] = uuid.uuid4().hex
        self.members.discard(worker)
        self.liveness.mark_dead(worker)  # the scheduler's own calls to it fail over
        self.scheduler.log_event("ps-worker-left", {"address": worker, "reason": reason})
        self.in_background(self._repair_without(worker, reason))
        task = asyncio.ensure_future(self._take_back(worker, self.fenced[worker]))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _repair_without(self, worker: str, reason: str) -> None:
        """Tell the other workers first (they then refuse its forwards: it
        may still think it is a primary when it runs again), then repair."""
        from dask_ps import _config

        bound = max(1.0, _config.get_seconds("timeouts.hung"))
        await asyncio.gather(*(
            asyncio.wait_for(self.calls.call(w, "ps_worker_left", address=worker), bound)
            for w in sorted(self.members)
        ), return_exceptions=True)
        for t in list(self.tables.values()):
            if worker in t.listed():
                self.in_background(self.repair(t.spec.name, gone={worker}, reason=reason))

    async def _take_back(self, worker: str, eviction: str) -> None:
        """Once it answers, it stops serving (``ps_evicted`` with
        ``drop=False``); once no placement lists ``worker`` any more (the
        repairs without it are done: another up-to-date copy of each of its
        blocks is confirmed), it drops its copies (``ps_evicted``); then it
        joins as a new member. Its copies are kept until then: a repair
        that is still copying (or waiting for a source that is itself
        stopped) must not find the placement naming a worker that has
        nothing."""
        # First it stops serving (a worker that is only slow runs on, and its
        # copies miss every push from now on); it keeps them for now.
        while self.fenced.get(worker) == eviction and worker in self.scheduler.workers:
            try:
                await asyncio.wait_for(self.worker_rpc(worker).ps_evicted(eviction=eviction, drop=False), 60)
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a connect that timed out while it hangs: again
                logger.debug("dask_ps: ps_evicted(drop=False) to %s: %r", worker, e)
                await asyncio.sleep(0.5)
        waited = 0.0
        while self.fenced.get(worker) == eviction and worker in self.scheduler.workers:
            listing = [t.spec.name for t in list(self.tables.values()) if worker in t.listed()]
            creating = any(worker in ws for owners in self.creating.values() for ws in owners)
            if not listing and not creating:
                break
            waited += 0.2
            if waited >= 5.0:  # a repair that gave up: ask again
                waited = 0.0
                for name in listing:
                    self.in_background(self.repair(
                        name, gone={worker}, reason=f"{worker} fenced out as hung"))
            await asyncio.sleep(0.2)
        while self.fenced.get(worker) == eviction and worker in self.scheduler.workers:
            try:
                # Not through Liveness: the worker is marked dead there.
                await asyncio.wait_for(self.worker_rpc(worker).ps_evicted(eviction=eviction), 60)
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a connect that timed out while it hangs: again
                logger.debug("dask_ps: ps_evicted to %s: %r", worker, e)
                await asyncio.sleep(0.5)
        if self.fenced.get(worker) != eviction or worker not in self.scheduler.workers:
            return
        del self.fenced[worker]
        logger.warning("dask_ps: worker %s answers again; it dropped its old copies and joins again", worker)
        await self.rejoin(worker)


class PauseGuard:
    """A worker's check that it has not been stopped (SIGSTOP, a frozen VM)
    long enough to have been fenced out as hung (:class:`HungWorkers`).

    When the process runs again, its event loop may serve a read or a push
    before it reads the scheduler's ``ps_evicted`` that drops its old
    copies; they missed every push made meanwhile. So a gap of more than
    half ``ps.timeouts.hung`` in the worker's :class:`Beacon` (the thread
    that tells the scheduler this process runs; without one, between two of
    this loop's ticks) makes :meth:`check` refuse (``StaleVersionError``:
    callers retry) until ``fenced_out()`` (an RPC to the scheduler) says
    this worker was not fenced out, or :meth:`clear` is called after the
    copies were dropped. An event loop that was only busy (the beacon went
    on) is no reason: the scheduler heard the worker all along.
    """

    def __init__(self, fenced_out, beacon: Beacon | None = None):
        self._fenced_out = fenced_out  # async () -> bool
        self._beacon = beacon
        self._last = time.monotonic()
        self._confirming: asyncio.Task | None = None
        self._gap = 0.0
        self._callback = None
        self._suspended: str | None = None  # fenced out (ps_evicted drop=False): serve nothing

    def __repr__(self):
        return f"<PauseGuard suspect={self._confirming is not None} suspended={self._suspended is not None}>"

    def suspend(self, why: str) -> None:
        """The scheduler fenced this worker out: its copies serve nothing
        (they stay until :meth:`clear`, after the repairs without it)."""
        self._suspended = why

    def start(self, period: float = 0.1) -> None:
        """Tick on the running event loop (until then nothing is refused)."""
        from tornado.ioloop import PeriodicCallback

        self._last = time.monotonic()
        self._callback = PeriodicCallback(self._observe, period * 1000)
        self._callback.start()

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        if self._confirming is not None:
            self._confirming.cancel()
            self._confirming = None

    def _observe(self) -> None:
        from dask_ps import _config

        if self._callback is None:
            return  # not started (a plugin used without a worker) or stopped
        now = time.monotonic()
        gap, self._last = now - self._last, now
        if self._beacon is not None and self._beacon.running:
            gap = self._beacon.take_gap()  # the process's own gaps, not this loop's
        limit = _config.get_seconds("timeouts.hung") / 2
        if limit and gap > limit and self._confirming is None:
            self._gap = gap
            # Debug, not a warning: a healthy worker on a busy machine (load
            # 17-35, or a long GIL-holding import) goes this long unscheduled
            # during ordinary fits, and the scheduler then says it was not
            # fenced out. The warning is for a worker that was (_confirm).
            logger.debug("dask_ps: this worker did not run for %.1f s; its copies serve nothing until the "
                         "scheduler says whether it was fenced out", gap)
            self._confirming = asyncio.ensure_future(self._confirm())

    async def _confirm(self) -> None:
        while True:
            try:
                if not await self._fenced_out():
                    self._confirming = None
                    logger.debug("dask_ps: not fenced out after %.1f s without running; serving again", self._gap)
                else:  # ps_evicted will come (the scheduler resends it) and clear()
                    logger.warning("dask_ps: this worker did not run for %.1f s and was fenced out as hung; its "
                                   "copies serve nothing until it has dropped them and joined again", self._gap)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the scheduler is busy or away: ask again
                logger.debug("dask_ps: asking whether this worker was fenced out: %r", e)
                await asyncio.sleep(0.5)

    def clear(self) -> None:
        """The old copies are gone (``ps_evicted``): serving is safe again."""
        if self._confirming is not None:
            self._confirming.cancel()
        self._confirming = None
        self._suspended = None
        self._last = time.monotonic()

    def check(self) -> None:
        """Raise ``StaleVersionError`` while this worker may have been fenced out."""
        if self._suspended is not None:
            from dask_ps._exceptions import StaleVersionError

            raise StaleVersionError(f"this worker was {self._suspended}; its copies serve nothing: retry")
        self._observe()
        if self._confirming is not None:
            from dask_ps._exceptions import StaleVersionError

            raise StaleVersionError(
                f"this worker did not run for {self._gap:.1f} s (stopped or hung); its copies serve "
                "nothing until the scheduler confirms its placement: retry"
            )
