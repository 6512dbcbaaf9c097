"""A discrete-event simulation of the parameter server's sync path, for
clusters this machine cannot run (issue 36).

What is simulated (plain Python, a ``heapq`` of events):

- **Machines.** One worker process per machine with ``threads`` participants
  (one compute core each) and one event loop. A message costs CPU on the
  event loop of both ends (``Costs.msg_cpu`` a request and its reply, both
  ends together, split in four; ``Costs.byte_cpu`` a byte moved, half at
  each end) and a wake-up latency per hop (``Costs.hop``, no CPU). A call
  to the participant's own server is direct (``Costs.direct_cpu``, no
  network, no hop). Messages serialize on the loop; with one core per
  worker (``shared_core``) the loop's CPU also stretches the compute that
  runs on that core meanwhile. ``layout="threads"``: every worker in one
  process (``LocalCluster(processes=False)``): every call is direct, one
  loop (the GIL) serializes them, no network.
- **The network.** Per machine a NIC out and in of ``Network.bandwidth``
  bytes a second; a message arrives RTT / 2 after its last byte left.
- **Jitter.** A participant's compute of a clock is its mean times a
  lognormal factor (``Jitter.cv``) and, with probability ``tail_p``, an
  extra ``tail_scale`` x Lomax(``tail_alpha``) (a heavy tail: page faults,
  a neighbour's burst); ``stragglers`` persistent ones (the first ranks)
  are ``straggler_slowdown`` slower the whole run; ``transient``:
  ``{(rank, clock): extra seconds}``.
- **The scheduler** (the old design only): one event loop that takes every
  clock message at ``Costs.sched_cpu``.

The sync of a clock ``c`` by design (a participant's read for iteration
c + 1 must hold every clock <= c - s, SSP(s); BSP is s = 0):

- ``old`` (``1322df5``): the pushes, one to each server, acknowledged;
  then ``ps_clock`` to the scheduler, which broadcasts the new minimum
  (``ps_clock_advance``) to every server when it moves; where the
  participant's known minimum is short of c - s, ``ps_wait_clock`` parked
  at the scheduler; the reads, one to each server, served once the
  server heard the broadcast. Requests a participant-clock: 2 S to the
  servers (S servers), 1 or 2 to the scheduler, and the scheduler's S
  broadcasts a clock (1 a participant).
- ``current`` (servers count clocks): the pushes, acknowledged; then a
  clock report to every server, the one to its own server parked until
  the bound holds (``wait_local``); the reads, one to each server,
  parked there until its vector of clocks reaches c - s. SGD sends its
  read with the pushes (``prefetch_rows``), LDA after ``clock()``. 3 S
  requests a participant-clock (one of each kind is direct).
- ``target`` (issue 36's): one request to each server carrying push(c),
  clock(c) and the read for iteration c + 1 + s; the server parks the
  read until its vector reaches c and the reply is the acknowledgement;
  row lists cached at the server by a key (values only after the first
  clock); with ``combine`` one request per server per process between
  its threads (sent when the process's last thread reaches the clock).
  Iteration c + 1 starts once the reply of the request of clock c - s is
  in: under SSP(1) the sync of a round overlaps the next one's compute.
  S requests a participant-clock (S / threads combined). With
  ``pipelined=False`` (dask_ps as built: SGD's read for c + 1 rides clock
  c's request, parked until the servers' vector reaches c - s) iteration
  c + 1 waits for clock c's reply: under SSP(1) a round trip, not the
  others' clock c.
- ``wire`` (the code since issue 36's one message a clock, ``8a9006a``):
  one request to each server carrying the pushes of clock c and the
  clock, the reply the acknowledgement; SGD's read for iteration c + 1
  goes in it (``prefetch_rows``), parked at the server until its vector
  reaches c - s; LDA reads after it returned, one request to each server
  parked alike. No row-list cache, no combining, no overlap. S requests a
  participant-clock (SGD), 2 S (LDA).

Not simulated: replication, failures, a fit's fixed costs (table
creation, data placement, the final pull: added from the measured tiny
fits where predicting a 2-worker fit), SGD's stats row and stopping
rule's read (one row), the LDA sampler's convergence.

    python benchmarks/sync_measure.py --json m.json                    # the inputs, 2 workers, both layouts
    python benchmarks/scaling_model.py --workers 2 --quick --json s.json   # U(m) and LDA's compute beside them
    python benchmarks/sync_scale.py --measured m.json --u-from s.json  # validation, then the table

This module is the simulator alone (``simulate``); ``sync_scale.py`` has
the inputs, the workloads, the validation and the table.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

DESIGNS = ("old", "current", "target", "wire")


@dataclass(frozen=True)
class Costs:
    """CPU and latency constants, seconds (defaults: refit on the current
    path, 2 worker processes, ``sync_measure.py``; see docs/benchmarks.md)."""

    msg_cpu: float = 300e-6  # a request and its reply, both event loops together
    byte_cpu: float = 1.0e-9  # a byte moved: serialize, copy, apply (both ends)
    direct_cpu: float = 60e-6  # a direct call to the participant's own server
    clock_cpu: float = 0.3e-3  # the participant thread's bookkeeping a clock
    hop: float = 150e-6  # an event-loop wake-up (thread hand-off, asyncio), wall only
    sched_cpu: float = 250e-6  # the scheduler's CPU a clock message (old design)


@dataclass(frozen=True)
class Network:
    rtt: float = 50e-6
    bandwidth: float = 1.25e9  # bytes a second, each direction of a NIC (10 Gbit/s)


@dataclass(frozen=True)
class Jitter:
    cv: float = 0.05
    tail_p: float = 0.002
    tail_alpha: float = 2.0
    tail_scale: float = 0.5
    stragglers: int = 0
    straggler_slowdown: float = 0.25
    transient: dict = field(default_factory=dict)
    seed: int = 0

    def factors(self, P, clocks):
        """(P, clocks) multipliers of the mean compute (transients apart)."""
        rng = np.random.default_rng(self.seed)
        f = np.ones((P, clocks))
        if self.cv > 0:
            sigma = math.sqrt(math.log1p(self.cv ** 2))
            f *= rng.lognormal(-0.5 * sigma ** 2, sigma, (P, clocks))
        if self.tail_p > 0:
            hit = rng.random((P, clocks)) < self.tail_p
            f += hit * self.tail_scale * rng.pareto(self.tail_alpha, (P, clocks))
        f[: self.stragglers] *= 1.0 + self.straggler_slowdown
        return f


@dataclass
class Workload:
    """One participant's clock: ``compute`` seconds (a scalar, or one per
    clock), rows pushed and read, their bytes on the wire."""

    compute: object
    clocks: int
    push_rows: float
    read_rows: float
    push_value_bytes: float
    read_value_bytes: float
    index_bytes: float = 4.0
    prefetch: bool = False  # the read goes with the pushes (SGD) or after the clock (LDA)
    first_compute: float = 0.0  # once, before the first clock (a run's constant)

    def compute_at(self, c):
        k = self.compute
        return float(k[c - 1]) if np.ndim(k) else float(k)


class _Loop:
    """An event loop (or a process's GIL): FIFO, one handler at a time."""

    __slots__ = ("free", "busy")

    def __init__(self):
        self.free = 0.0
        self.busy = 0.0


def _after(n, then):
    """A callback that calls ``then()`` on its ``n``-th call (the replies of
    ``n`` servers)."""
    left = [n]

    def one():
        left[0] -= 1
        if left[0] == 0:
            then()
    return one

class Sim:
    """One run of ``wl`` on ``P`` participants (``threads`` a machine)
    under ``design`` and SSP(``staleness``); :meth:`run` returns the
    seconds until the last participant's last clock."""

    def __init__(self, design, P, wl, costs=Costs(), net=Network(), jitter=Jitter(), staleness=0, threads=1,
                 layout="processes", combine=False, key_cache=True, shared_core=True, pipelined=True):
        if design not in DESIGNS:
            raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
        if P % threads:
            raise ValueError(f"P={P} participants do not fill machines of {threads} threads")
        self.design, self.P, self.wl, self.s = design, P, wl, int(staleness)
        self.costs, self.net, self.threads, self.layout = costs, net, threads, layout
        self.combine = combine and design == "target" and threads > 1
        self.key_cache = key_cache and design == "target"
        self.shared_core = shared_core
        # target: the read of iteration c + 1 goes with clock c - s's request
        # (the issue's); False: with clock c's, parked until c - s (dask_ps
        # as built: SGD's read rides the clock's message, its round trip waited)
        self.pipelined = pipelined
        self.M = 1 if layout == "threads" else P // threads  # processes
        self.S = P // threads if layout == "processes" else P  # servers: one per worker
        self.t, self._q, self._n = 0.0, [], 0
        self.loops = [_Loop() for _ in range(self.M)]
        self.sched = _Loop()
        self.nic_out = [0.0] * self.M
        self.nic_in = [0.0] * self.M
        self.factors = jitter.factors(P, wl.clocks)
        self.transient = dict(jitter.transient)
        self.sent = {}  # requests by kind
        self.bytes = 0.0
        # participants
        self.clock = [0] * P  # clocks completed (reported)
        self.end = [0.0] * P  # when each finished its last clock
        self.comp_end = [None] * P  # (end, token, clock) of the compute running
        self.computed_at = [0.0] * P
        self.sync_seconds = [0.0] * P  # from a compute's end to the next one's start (or the run's end)
        self.compute_seconds = [0.0] * P
        self.token = [0] * P
        self.reads = {}  # (p, c): servers still to answer the read needed after clock c
        self.ready = {}  # (p, c): what iteration c + 1 still waits for
        # servers: a vector of clocks over the participants (or processes, combined) and parked reads
        n_clk = self.M if self.combine else P
        self.vec = [[0] * n_clk for _ in range(self.S)]
        self.parked = [[] for _ in range(self.S)]  # heap of (bound, seq, callback)
        self.server_min = [0] * self.S
        # scheduler (old)
        self.sched_vec = [0] * P
        self.sched_min = 0
        self.sched_parked = []
        self.known_min = [0] * P
        self.proc_done = {}  # (machine, c): threads of the process past clock c (combined)
        self.have, self.gates = {}, {}  # target: the freshest read in, the iteration waiting for one

    # --- engine ---------------------------------------------------------------------------------
    def at(self, t, fn, *args):
        self._n += 1
        heapq.heappush(self._q, (t, self._n, fn, args))

    def run(self):
        for p in range(self.P):
            self.at(0.0, self._start, p, 1, self.wl.first_compute)
        while self._q:
            t, _, fn, args = heapq.heappop(self._q)
            self.t = t
            fn(*args)
        if any(c < self.wl.clocks for c in self.clock):
            raise RuntimeError(f"deadlock: clocks {self.clock} of {self.wl.clocks}")
        return max(self.end)

    def machine(self, p):
        return 0 if self.layout == "threads" else p // self.threads

    def server_machine(self, s):
        return 0 if self.layout == "threads" else s

    # --- CPU -------------------------------------------------------------------------------------
    def _reserve(self, m, cpu, earliest=None):
        """``cpu`` seconds on machine ``m``'s loop from ``earliest`` (now):
        returns when it is done (FIFO in the order reserved)."""
        loop = self.loops[m]
        start = max(self.t if earliest is None else earliest, loop.free)
        loop.free = start + cpu
        loop.busy += cpu
        if self.shared_core:
            self._steal(m, start, cpu)
        return loop.free

    def on_loop(self, m, cpu, fn, *args, hop=True, earliest=None):
        """``cpu`` seconds on machine ``m``'s loop, then ``fn`` (after a hop)."""
        self.at(self._reserve(m, cpu, earliest) + (self.costs.hop if hop else 0.0), fn, *args)

    def _steal(self, m, start, cpu):
        """A loop's CPU on the core of a computing participant of machine
        ``m`` stretches its compute (the first one computing then; in the
        threads layout, one of all)."""
        ps = range(self.P) if self.layout == "threads" else range(m * self.threads, (m + 1) * self.threads)
        for p in ps:
            ce = self.comp_end[p]
            if ce is not None and ce[0] > start:
                end, _, c = ce
                self.token[p] += 1
                self.comp_end[p] = (end + cpu, self.token[p], c)
                self.at(end + cpu, self._computed, p, c, self.token[p])
                return

    # --- messages --------------------------------------------------------------------------------
    def send(self, kind, src, dst, nbytes, fn, *args):
        """A request of ``kind`` from machine ``src`` to ``dst`` (a machine
        or ``"sched"``): ``fn(*args)`` runs at the receiver once its loop
        handled it. Counted by kind; a call to a server of the same
        process is direct."""
        self.sent[kind] = self.sent.get(kind, 0) + 1
        self._msg(src, dst, nbytes, fn, args)

    def reply(self, src, dst, nbytes, fn, *args):
        """A reply (or a one-way message) from ``src`` to machine ``dst``."""
        self._msg(src, dst, nbytes, fn, args)

    def _msg(self, src, dst, nbytes, fn, args):
        c = self.costs
        self.bytes += nbytes
        if src == dst:  # direct call on the caller's thread, serialized by the process's GIL
            if dst != "sched":
                self.on_loop(src, c.direct_cpu + c.byte_cpu * nbytes, fn, *args, hop=False)
            else:
                self.at(self.t, fn, *args)
            return
        half = 0.25 * c.msg_cpu + 0.5 * c.byte_cpu * nbytes
        if src == "sched":
            loop = self.sched
            start = max(self.t, loop.free)
            loop.free = start + c.sched_cpu
            loop.busy += c.sched_cpu
            out = loop.free + c.hop
        else:
            out = self._reserve(src, half) + c.hop
        if dst == "sched" or src == "sched":
            self.at(out + 0.5 * self.net.rtt, self._arrive, dst, nbytes, fn, args)
            return
        bw = self.net.bandwidth
        depart = max(out, self.nic_out[src])
        self.nic_out[src] = depart + nbytes / bw
        self.at(depart + 0.5 * self.net.rtt, self._arrive, dst, nbytes, fn, args)

    def _arrive(self, dst, nbytes, fn, args):
        c = self.costs
        if dst == "sched":
            loop = self.sched
            start = max(self.t, loop.free)
            loop.free = start + c.sched_cpu
            loop.busy += c.sched_cpu
            self.at(loop.free + c.hop, fn, *args)
            return
        start = max(self.t, self.nic_in[dst])
        self.nic_in[dst] = start + nbytes / self.net.bandwidth
        self.on_loop(dst, 0.25 * c.msg_cpu + 0.5 * c.byte_cpu * nbytes, fn, *args, earliest=self.nic_in[dst])

    # --- participants ----------------------------------------------------------------------------
    def _start(self, p, c, extra=0.0):
        """Iteration ``c`` of participant ``p`` starts computing."""
        k = self.wl.compute_at(c) * self.factors[p, c - 1] + self.transient.get((p, c), 0.0) + extra
        self.token[p] += 1
        self.compute_seconds[p] += k
        self.comp_end[p] = (self.t + k, self.token[p], c)
        self.at(self.t + k, self._computed, p, c, self.token[p])

    def _computed(self, p, c, token):
        if token != self.token[p]:
            return  # stretched meanwhile: a later event ends it
        c = self.comp_end[p][2]
        self.comp_end[p] = None
        self.computed_at[p] = self.t
        self.at(self.t + self.costs.clock_cpu, getattr(self, f"_sync_{self.design}"), p, c)

    def _next(self, p, c):
        """Participant ``p`` may start iteration c + 1 (its sync of clock c
        is done): the run ends after its last clock."""
        self.clock[p] = max(self.clock[p], c)
        self.sync_seconds[p] += self.t - self.computed_at[p]
        if c >= self.wl.clocks:
            self.end[p] = self.t
            return
        self._start(p, c + 1)

    def rows_bytes(self, rows, value_bytes, first, index=True):
        """Bytes of ``rows`` spread over the servers, per server."""
        per = rows / self.S
        idx = self.wl.index_bytes if index and not (self.key_cache and not first) else 0.0
        return per * (value_bytes + idx)

    # the read of the iteration after clock c: one request per server, each parked until the bound
    def _read(self, p, c, then, bound):
        self.reads[p, c] = self.S
        m = self.machine(p)
        req = self.rows_bytes(self.wl.read_rows, 0.0, c == 1)
        rep = self.wl.read_rows / self.S * self.wl.read_value_bytes
        for s in range(self.S):
            self.send("read", m, self.server_machine(s), req, self._serve_read, s, p, c, rep, bound, then)

    def _serve_read(self, s, p, c, rep, bound, then):
        def answer():
            self.reply(self.server_machine(s), self.machine(p), rep, self._read_in, p, c, then)
        self._park(s, bound, answer)

    def _read_in(self, p, c, then):
        self.reads[p, c] -= 1
        if self.reads[p, c] == 0:
            del self.reads[p, c]
            then()

    def _park(self, s, bound, fn):
        if self.server_min[s] >= bound:
            fn()
        else:
            self._n += 1
            heapq.heappush(self.parked[s], (bound, self._n, fn))

    def _server_clock(self, s, who, c):
        """Server ``s`` learns participant (or process) ``who`` reached clock ``c``."""
        v = self.vec[s]
        v[who] = max(v[who], c)
        self._server_min(s, min(v))

    def _server_min(self, s, m):
        if m <= self.server_min[s]:
            return
        self.server_min[s] = m
        q = self.parked[s]
        while q and q[0][0] <= m:
            heapq.heappop(q)[2]()

    def _join(self, p, c, parts, then):
        """``then()`` once every part of ``parts`` (names) of (p, c) is done."""
        self.ready[p, c] = set(parts)

        def done(part):
            left = self.ready[p, c]
            left.discard(part)
            if not left:
                del self.ready[p, c]
                then()
        return done

    def _pushes(self, p, c, then):
        """The pushes of clock c, one request to each server, acknowledged."""
        m = self.machine(p)
        nbytes = self.rows_bytes(self.wl.push_rows, self.wl.push_value_bytes, c == 1)
        acked = _after(self.S, then)
        for s in range(self.S):
            sm = self.server_machine(s)
            self.send("push", m, sm, nbytes, lambda sm=sm: self.reply(sm, m, 16, acked))

    # --- old: the scheduler counts clocks -------------------------------------------------------
    def _sync_old(self, p, c):
        bound = c - self.s
        m = self.machine(p)
        if self.wl.prefetch:
            done = self._join(p, c, ("read", "clock"), lambda: self._next(p, c))
            self._read(p, c, lambda: done("read"), bound)
            after = lambda: done("clock")  # noqa: E731
        else:  # the read after clock() returned
            after = lambda: self._read(p, c, lambda: self._next(p, c), bound)  # noqa: E731

        def reported():
            if self.known_min[p] >= bound:
                after()
            else:  # ps_wait_clock, parked at the scheduler
                self.send("wait", m, "sched", 64, self._sched_wait, p, bound, after)
        self._pushes(p, c, lambda: self.send("clock", m, "sched", 64, self._sched_clock, p, c, reported))

    def _sched_clock(self, p, c, reported):
        self.sched_vec[p] = max(self.sched_vec[p], c)
        m = min(self.sched_vec)
        if m > self.sched_min:
            self.sched_min = m
            for s in range(self.S):  # ps_clock_advance: one message to every server
                self.sent["broadcast"] = self.sent.get("broadcast", 0) + 1
                self.reply("sched", self.server_machine(s), 64, self._server_min, s, m)
            q = self.sched_parked
            while q and q[0][0] <= m:
                _, _, pp, cb = heapq.heappop(q)
                self.reply("sched", self.machine(pp), 64, cb)
        self.known_min[p] = max(self.known_min[p], self.sched_min)
        self.reply("sched", self.machine(p), 64, reported)

    def _sched_wait(self, p, bound, then):
        if self.sched_min >= bound:
            self.known_min[p] = self.sched_min
            self.reply("sched", self.machine(p), 64, then)
        else:
            self._n += 1
            heapq.heappush(self.sched_parked, (bound, self._n, p, then))

    # --- current: the servers count clocks, a report after the flush ----------------------------
    def _sync_current(self, p, c):
        bound = c - self.s
        m = self.machine(p)
        next_ = lambda: self._next(p, c)  # noqa: E731
        if self.wl.prefetch:
            done = self._join(p, c, ("read", "clock"), next_)
            self._read(p, c, lambda: done("read"), bound)
            after = lambda: done("clock")  # noqa: E731
        else:
            after = lambda: self._read(p, c, next_, bound)  # noqa: E731
        self._pushes(p, c, lambda: self._report(p, c, bound, m, after))

    def _report(self, p, c, bound, m, then):
        """The clock report to every server; the own server's reply parked
        until the bound holds (``wait_local``); ``then()`` after all."""
        back = _after(self.S, then)
        for s in range(self.S):
            sm = self.server_machine(s)
            own = s == p // self.threads  # its own worker's server: wait_local

            def got(s=s, sm=sm, own=own):
                self._server_clock(s, p, c)
                if own:
                    self._park(s, bound, lambda: self.reply(sm, m, 16, back))
                else:
                    self.reply(sm, m, 16, back)
            self.send("clock", m, sm, 16, got)

    # --- target: one request and one reply per server per clock --------------------------------
    def _sync_target(self, p, c):
        if not self.combine:
            self._target_request([p], p, c)
        else:
            m = self.machine(p)
            got = self.proc_done.setdefault((m, c), [])
            got.append(p)
            if len(got) == self.threads:
                del self.proc_done[m, c]
                self._target_request(got, m, c)
        # iteration c + 1 needs the read of clock c - s (sent with that clock's request)
        self._target_gate(p, c)

    def _target_request(self, members, who, c):
        m = self.machine(members[0])
        k = len(members)
        push = self.rows_bytes(self.wl.push_rows, self.wl.push_value_bytes, c == 1)
        req = k * (push + self.rows_bytes(self.wl.read_rows, 0.0, c == 1))
        rep = k * self.wl.read_rows / self.S * self.wl.read_value_bytes
        self.reads[who, c, "t"] = self.S
        for s in range(self.S):
            sm = self.server_machine(s)

            def got(s=s, sm=sm):
                self._server_clock(s, who, c)
                bound = c if self.pipelined else c - self.s
                self._park(s, bound, lambda: self.reply(sm, m, rep, self._target_in, members, who, c))
            self.send("request", m, sm, req, got)

    def _target_in(self, members, who, c):
        self.reads[who, c, "t"] -= 1
        if self.reads[who, c, "t"] == 0:
            del self.reads[who, c, "t"]
            for p in members:
                self.have[p] = max(self.have.get(p, 0), c)
                g = self.gates.pop(p, None)
                if g is not None and self.have[p] >= g[0]:
                    g[1]()
                elif g is not None:
                    self.gates[p] = g

    def _target_gate(self, p, c):
        need = c - self.s if self.pipelined else c
        if need <= 0 or self.have.get(p, 0) >= need:
            self._next(p, c)
        else:
            self.gates[p] = (need, lambda: self._next(p, c))

    # --- wire: the code's one message a server a clock (pushes + clock, SGD's read too) ---------------
    def _sync_wire(self, p, c):
        bound = c - self.s
        m = self.machine(p)
        push = self.rows_bytes(self.wl.push_rows, self.wl.push_value_bytes, True)
        read = self.wl.prefetch
        req = push + (self.rows_bytes(self.wl.read_rows, 0.0, True) if read else 0.0)
        rep = self.wl.read_rows / self.S * self.wl.read_value_bytes if read else 16
        next_ = lambda: self._next(p, c)  # noqa: E731
        then = next_ if read else lambda: self._read(p, c, next_, bound)  # noqa: E731
        back = _after(self.S, then)
        for s in range(self.S):
            sm = self.server_machine(s)

            def got(s=s, sm=sm):
                self._server_clock(s, p, c)
                answer = lambda: self.reply(sm, m, rep, back)  # noqa: E731
                self._park(s, bound, answer) if read else answer()
            self.send("request", m, sm, req, got)

    # --- reports ----------------------------------------------------------------------------------
    def per_clock(self):
        """Requests per participant-clock by kind (broadcasts: per clock,
        over the participants)."""
        n = self.P * self.wl.clocks
        return {k: v / n for k, v in self.sent.items()}


def simulate(design, P, wl, **kw):
    """Seconds of ``wl`` on ``P`` participants (:class:`Sim`'s arguments),
    and the simulation (its counters)."""
    sim = Sim(design, P, wl, **kw)
    return sim.run(), sim
