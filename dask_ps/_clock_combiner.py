"""Bösen's process oplog (issue 36): the clock messages of the participants
of one run that are threads of one worker process (``dask worker --nthreads
N``) go to each server in another process as ONE message per clock, so the
servers' messages grow with machines, not cores.

A participant's clock ``c`` message to a server (its pushes there, its clock,
its placement versions and the next clock's read it prefetched:
``Transport.clock_message``) is built as before and handed to its run's
:class:`ClockCombiner` in this process instead of being sent. The combiner
sends one ``ps_run_clock`` with ``sections=[...]``, one section per
participant, once every sibling *in the same clock* (the last clock it
handed in is ``c - 1``: it is computing clock ``c``) has handed in its
section for that server, or ``ps.clock.combine-window`` after the first
section, whichever is first. A sibling ahead (it handed in ``c`` already) or
behind (SSP/ASP let it lag) is not waited for, and one that left the run
(ended, failed) is not waited for either: a slow sibling holds a
participant back by at most the window, beyond what its consistency model
imposes (under BSP the server waits for every participant anyway).

The server (:func:`answer_sections`) makes each section exactly as it makes
a message of its own (``RunManager.run_clock``), all of them at once, so
the exactly-once numbering, the clocks per participant, the staleness audit
and BSP's bit-reproducibility are those of separate messages; its one reply
holds each section's reply, or its error (a section refused, e.g. for a row
list's key the server does not hold, fails its participant alone). A
message that fails as a whole fails every section in it: each participant
then sends its clock again on its own, as pushes numbered for exactly-once
(``InFlight._clock_by_pushes``).

On by default (``ps.clock.combine-per-process``): fewer messages and less
worker CPU per clock, measured side by side (docs/benchmarks.md, "Clock
messages combined per process"). Runs on the worker's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import Counter

from distributed.core import clean_exception, error_message

from dask_ps._exceptions import PSValueError

logger = logging.getLogger(__name__)

# Clock sections that went through a combiner in this process, and the
# messages they became (benchmarks and tests read them with ``client.run``).
combined: Counter = Counter()

_registry: weakref.WeakValueDictionary[str, "ClockCombiner"] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


def acquire(run_id: str, window: float) -> "ClockCombiner":
    """The clock combiner of run ``run_id`` in this process (created at its
    first participant here; it goes when the last one drops it)."""
    with _registry_lock:
        combiner = _registry.get(run_id)
        if combiner is None:
            combiner = _registry[run_id] = ClockCombiner(window)
        return combiner


def window_for(staleness_used: int | None, window: float, clock_timeout: float) -> float:
    """How long a participant's section may wait for its siblings: under
    BSP (the tightest bound of the tables it uses is 0) as long as a clock
    may take (``ps.timeouts.clock``), since its next read waits for every
    sibling's clock anyway (at its server, or parked with this message);
    else ``window`` (``ps.clock.combine-window``): a sibling SSP lets lag
    must not hold it back."""
    return clock_timeout if staleness_used == 0 else window


def run_changed(run_id: str, done, aborted: bool) -> None:
    """The scheduler's record of a run (``ps_run_update``, the event loop):
    its participants that are done (left, failed) are waited for no more,
    and once it is aborted nothing waits (each section then gets its
    server's refusal)."""
    combiner = _registry.get(run_id)
    if combiner is None:
        return
    for r in done:
        combiner.leave(int(r))
    if aborted:
        combiner.release()


class _Batch:
    __slots__ = ("sections", "timer", "deadline", "send")

    def __init__(self, send):
        self.sections: list[tuple[int, dict, float, asyncio.Future]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = float("inf")
        self.send = send


class ClockCombiner:
    """The clock sections of one run's participants in this process, by
    ``(server, clock)``, sent as one message each (see the module).

    ``window``: the longest a section waits for its siblings (seconds).
    ``send(addr, sections, seconds)`` (handed with each section, the first
    one's used): a coroutine that sends one combined message and returns
    its reply's ``sections``. Event loop only.
    """

    def __init__(self, window: float):
        self.window = window
        self._last: dict[int, int] = {}  # member rank -> the last clock it handed in (or joined at)
        self._batches: dict[tuple[str, int], _Batch] = {}

    def __repr__(self):
        return f"<ClockCombiner members={sorted(self._last)} pending={sorted(self._batches)}>"

    # --- membership --------------------------------------------------------------------
    def join(self, rank: int, clock: int) -> None:
        """Participant ``rank`` of this process joined the run at ``clock``."""
        self._last[rank] = clock

    def leave(self, rank: int) -> None:
        """``rank`` ended or failed: nothing waits for it any more."""
        self._last.pop(rank, None)
        for key in list(self._batches):
            self._maybe_send(key)

    def passed(self, rank: int, clock: int) -> None:
        """``rank`` sent ``clock`` otherwise (as pushes and a report, a
        fallback): no section of it will come."""
        if rank in self._last and clock > self._last[rank]:
            self._last[rank] = clock
            for key in list(self._batches):
                self._maybe_send(key)

    def release(self) -> None:
        """Send every section handed in now (the run was aborted)."""
        self._last.clear()
        for key in list(self._batches):
            self._fire(key)

    # --- sections ----------------------------------------------------------------------
    async def clock(self, send, addr: str, clock: int, rank: int, msg: dict, seconds: float,
                    window: float | None = None) -> dict:
        """Hand in ``rank``'s clock ``clock`` message ``msg`` to ``addr``
        (within ``seconds``; it waits for its siblings at most ``window``,
        default the combiner's); returns that section's reply (its error raised)."""
        key = (addr, clock)
        batch = self._batches.get(key)
        loop = asyncio.get_running_loop()
        if batch is None:
            batch = self._batches[key] = _Batch(send)
        deadline = loop.time() + (self.window if window is None else window)
        if deadline < batch.deadline:  # the most impatient section sets when the message goes
            if batch.timer is not None:
                batch.timer.cancel()
            batch.deadline, batch.timer = deadline, loop.call_at(deadline, self._fire, key)
        future = loop.create_future()
        batch.sections.append((rank, msg, seconds, future))
        if rank in self._last:
            self._last[rank] = max(self._last[rank], clock)
        if not self.waits_for(clock, {r for r, *_ in batch.sections}):
            # The last one expected: sent from here, no task of its own (a
            # process with one participant of the run pays no extra hop);
            # shielded, since the siblings' replies ride on it.
            sections = self._take(key)
            if sections:
                await asyncio.shield(self._send(addr, send, sections))
        reply = await future
        if isinstance(reply, dict) and reply.get("status") == "error":
            # (unwrapped where it did not cross a comm: an in-process test's server)
            _, exc, tb = clean_exception(*(getattr(reply.get(k), "data", reply.get(k))
                                           for k in ("exception", "traceback")))
            raise exc.with_traceback(tb)
        return reply

    def waits_for(self, clock: int, handed: set) -> list[int]:
        """The members a section of ``clock`` still waits for: those in the
        same clock (their last one is ``clock - 1``) that have not handed in."""
        return [r for r, last in self._last.items() if last == clock - 1 and r not in handed]

    def _maybe_send(self, key) -> None:
        batch = self._batches.get(key)
        if batch is not None and not self.waits_for(key[1], {r for r, *_ in batch.sections}):
            self._fire(key)

    def _take(self, key) -> list:
        """The batch's sections still waited for (a cancelled participant's
        dropped), the batch gone: later sections start a new one."""
        batch = self._batches.pop(key, None)
        if batch is None:
            return []
        if batch.timer is not None:
            batch.timer.cancel()
        return [s for s in batch.sections if not s[3].done()]

    def _fire(self, key) -> None:
        """Send the batch of ``key`` now (its window passed, or a sibling it
        waited for left), in a task of its own."""
        batch = self._batches.get(key)
        sections = self._take(key)
        if sections:
            asyncio.ensure_future(self._send(key[0], batch.send, sections))

    async def _send(self, addr: str, send, sections: list) -> None:
        combined["sections"] += len(sections)
        combined["messages"] += 1
        try:
            replies = await send(addr, [m for _, m, _, _ in sections], max(s for _, _, s, _ in sections))
            if not isinstance(replies, (list, tuple)) or len(replies) != len(sections):
                raise PSValueError(f"server {addr} answered a combined clock message with "
                                   f"{replies!r}: expected one reply per section ({len(sections)})")
        except BaseException as e:  # every participant sends its clock again on its own
            logger.debug("dask_ps: a combined clock message to %s failed: %r", addr, e)
            for *_, future in sections:
                if not future.done():
                    future.set_exception(e)
            return
        for (*_, future), reply in zip(sections, replies):
            if not future.done():
                future.set_result(reply)


async def answer_sections(sections, one) -> list:
    """Server side: make each section of a combined clock message with
    ``one(**section)`` (``RunManager.run_clock``'s handler body), all at
    once, as separate messages would be; each one's reply, or its error as
    ``error_message`` gives it (that section's participant raises it)."""
    if not isinstance(sections, (list, tuple)) or not all(isinstance(s, dict) for s in sections):
        raise PSValueError(f"a combined clock message's sections must be a list of messages, got {sections!r}")

    async def each(section):
        section = {k: v for k, v in section.items() if k not in ("pad", "token", "internal")}
        try:
            return await one(**section)
        except Exception as e:
            return error_message(e)

    return list(await asyncio.gather(*(each(s) for s in sections)))
