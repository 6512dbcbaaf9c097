"""What a participant's session shares with the parts it holds
(``Session._in_flight``, :class:`dask_ps._flights.InFlight`): its clock
(:class:`ParticipantClock`), its counters (:class:`TableMetrics` per table,
:class:`CountedRPC` for the scheduler's calls), and its clock's calls to
the run's servers (:class:`ClockReports`: a clock counted, a wait for the
run's minimum, the run-wide clock a retried participant resumes at).

The servers count the clocks (issue 36; :mod:`dask_ps._runclocks`); the
clock's usual message, with its pushes and reads, is
``InFlight._clock_message``. The calls here are the clock alone: after a
clock message that failed, after a placement change, when a retried
participant joins.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field

from distributed.comm import CommClosedError

from dask_ps import _config
from dask_ps._exceptions import PSError
from dask_ps._liveness import WorkerGone
from dask_ps._routing import TableHandle
from dask_ps._transport import gather_settled
from dask_ps.consistency import ASP

_GONE = object()  # a server that left the cluster while a clock call was made to it


class ParticipantClock:
    """A participant's clock, as its session and its :class:`InFlight` see it.

    The session advances it (``clock()`` through :meth:`InFlight.send_clock`);
    the in-flight part numbers the pushes of a clock and raises what the
    servers' replies taught (``known_min``, ``settled``); the read path
    decides with it what a read needs. One small object both hold, not a
    session the in-flight part reaches into.
    """

    __slots__ = ("current", "known_min", "settled", "flushes", "wait_seconds", "resumed")

    def __init__(self):
        self.current = 0  # clocks this participant completed
        self.known_min = 0.0  # the run's minimum clock known here: every update below is on the servers
        self.settled = 0  # every own push of the clocks below is acknowledged by every server
        self.flushes = 0  # flushes in the current clock (numbers the pushes: exactly once)
        self.wait_seconds = 0.0  # blocked in clock() waiting for the slowest (SSP)
        self.resumed: tuple[int, ...] = ()  # a retried attempt's first clocks (see Session._join)

    def __repr__(self):
        return f"<ParticipantClock {self.current} known_min={self.known_min} settled={self.settled}>"

    def advance(self, clock: int) -> None:
        self.current, self.flushes = clock, 0

    def learn_min(self, m) -> None:
        """A server's answer: the run's minimum clock (None: the run ended)."""
        self.known_min = math.inf if m is None else max(self.known_min, m)

    def required_tag(self, h: TableHandle, clock: int | None = None) -> float | None:
        """Minimum cache tag a read of ``h`` needs now, or at ``clock``
        (None: never wait, ASP)."""
        c = h.spec.consistency
        if isinstance(c, ASP) or c.staleness is None:
            return None
        return (self.current if clock is None else clock) - c.staleness

    def own_writes_visible(self, h: TableHandle, clock: int | None = None) -> bool:
        """Whether the session can add its own updates to what it reads (a
        sum). Otherwise the server computes the result (an optimizer step,
        or a sum in the clock a retried task repeats, which may count a
        push already) and reads flush pending pushes first."""
        # ``clock``: of a write (a flush booked after the clock advanced).
        return h.spec.rule.additive and (self.current if clock is None else clock) not in self.resumed


def is_summed_per_clock(h: TableHandle) -> bool:
    """A sum table with aggregate="clock": the servers hold a push until
    its clock is complete everywhere, so the session adds its own sent
    pushes the servers have not summed yet to what it fetches (read-my-writes)."""
    return h.spec.rule.additive and h.spec.aggregate == "clock"


@dataclass
class TableMetrics:
    reads: int = 0
    cache_hits: int = 0
    wait_seconds: float = 0.0
    staleness: Counter = field(default_factory=Counter)
    bytes_pushed: int = 0
    bytes_pulled: int = 0
    flushes: int = 0
    eager_fills: int = 0  # ESSP: blocks refreshed by a server push
    refetches: int = 0  # refresh=True: blocks fetched although the cached copy met the bound
    prefetch_hits: int = 0  # prefetched reads served entirely by what was prefetched
    prefetch_rereads: int = 0  # prefetched reads that read (some blocks) again at result()

    def to_dict(self) -> dict:
        return {
            "reads": self.reads,
            "cache_hits": self.cache_hits,
            "cache_hit_rate": self.cache_hits / self.reads if self.reads else 0.0,
            "wait_seconds": self.wait_seconds,
            "staleness": dict(sorted(self.staleness.items())),
            "bytes_pushed": self.bytes_pushed,
            "bytes_pulled": self.bytes_pulled,
            "flushes": self.flushes,
            "eager_fills": self.eager_fills,
            "refetches": self.refetches,
            "prefetch_hits": self.prefetch_hits,
            "prefetch_rereads": self.prefetch_rereads,
        }


class CountedRPC:
    """An rpc whose calls are counted in ``sent["scheduler"]``."""

    def __init__(self, rpc, sent: Counter):
        self._rpc, self._sent = rpc, sent

    def __getattr__(self, op):
        if op.startswith("_"):
            raise AttributeError(op)
        call = getattr(self._rpc, op)

        def counted(**msg):
            self._sent["scheduler"] += 1
            return call(**msg)

        return counted


class ClockReports:
    """A participant's clock calls to the servers of its run, handed what
    they use: the ``transport`` (its ``run_call`` and liveness), the
    worker's run clocks (``runs``: which servers the run has), this
    worker's ``address`` and the table handles the participant routes by
    (``handles``, the router's: name -> ``TableHandle``)."""

    def __init__(self, transport, runs, address: str, run_id: str, rank: int, handles=None):
        self._transport, self._runs, self._address = transport, runs, address
        self._run_id, self._rank = run_id, rank
        self._handles = handles if handles is not None else {}

    def __repr__(self):
        return f"<ClockReports run={self._run_id} rank={self._rank}>"

    async def live_servers(self) -> tuple[list[str], str | None]:
        """The run's servers not known dead, and the one a wait goes to
        (this worker if it is one: no message; None: no server left)."""
        rec = await self._runs.get(self._run_id)
        dead = self._transport.liveness.dead
        servers = [a for a in rec.servers if a not in dead]
        # And every holder of a table it routes by: a server that joined
        # mid-run is in a placement this participant uses before, maybe, the
        # run's record here names it (the scheduler's two announcements race).
        # Its reads parked there wait on this participant's clocks, which
        # only this participant can report (it is parked in them).
        listed = set(servers)
        extra = {a for h in list(self._handles.values()) for a in h.holders if a not in listed and a not in dead}
        servers += sorted(extra)
        return servers, (self._address if self._address in servers else servers[0] if servers else None)

    async def to_servers(self, op: str, clock: int, wait_for=None) -> float:
        """Report ``clock`` to every server of the run (``op="run_clock"``;
        the servers count the clocks, issue 36), or park until the run's
        minimum reaches ``clock`` (``op="run_wait"``). A wait (``wait_for``
        of a report, SSP) goes to one server: this worker's own if it is
        one (no message), since any server's minimum bounds the whole run's
        (``_runclocks``). Returns the highest minimum a server answered."""
        servers, waiter = await self.live_servers()
        if not servers:  # none known alive: this worker's own (it answers, or the call fails)
            servers, waiter = [self._address], self._address
        if op == "run_clock":
            targets = servers
            calls = [self._to_server(a, op, clock=clock, wait_for=wait_for if a == waiter else None, rank=self._rank)
                     for a in servers]
            need = wait_for
        else:
            targets, calls, need = [waiter], [self._to_server(waiter, op, clock=clock)], clock
        results = await gather_settled(calls)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        m = max([math.inf if r is None else r for r in results if r is not _GONE], default=0)
        if need is not None and results[targets.index(waiter)] is _GONE:  # it left: wait at another
            m = max(m, await self.to_servers("run_wait", clock=need))
        return m

    async def run_wide_clock(self) -> int:
        """The highest run-wide clock a server of the run has of this
        participant (a retried one resumes there: every push before it is
        on every server)."""
        rec = await self._runs.get(self._run_id)
        dead = self._transport.liveness.dead
        got = await gather_settled([self._transport.run_call(a, "run_clocks", _config.get_seconds("timeouts.rpc"),
                                                             run_id=self._run_id)
                                    for a in rec.servers if a not in dead])
        return max([int(g["clocks"][self._rank]) for g in got if isinstance(g, dict) and g.get("clocks")], default=0)

    async def _to_server(self, addr: str, op: str, **msg):
        """One clock call, retried until it is answered, the server leaves
        (``_GONE``) or ``ps.timeouts.failover`` passes: a live server that
        missed a clock would hold every read that waits on it."""
        clock_timeout, rpc_timeout = _config.get_seconds("timeouts.clock"), _config.get_seconds("timeouts.rpc")
        waits = op == "run_wait" or msg.get("wait_for") is not None
        seconds = clock_timeout + rpc_timeout if waits else rpc_timeout
        deadline = time.monotonic() + _config.get_seconds("timeouts.failover")
        delay = 0.02
        while True:
            try:
                return await self._transport.run_call(addr, op, seconds, run_id=self._run_id,
                                                      timeout=clock_timeout, **msg)
            except WorkerGone:
                return _GONE
            except PSError:  # the server's answer (a timeout of the wait, an aborted run): no retry
                raise
            except (OSError, CommClosedError, TimeoutError) as e:  # a connection lost or slow: again
                if addr in self._transport.liveness.dead:
                    return _GONE
                if time.monotonic() > deadline:
                    raise PSError(f"{self!r}: server {addr} did not answer its {op} for "
                                  f"ps.timeouts.failover: {e!r}") from e
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.5)
