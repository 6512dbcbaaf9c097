"""Catching up what a stale read missed (SGD under ``SSP(s)``, issue 33).

Several participants keep the weights table the exact mean of their
models (``_Participant.sync_round``). Under a staleness bound ``s`` a read
at clock ``c`` may hold the others' rounds only up to clock ``c - 1 - s``:
the participant then starts its round from a mean whose other ``P - 1``
models are up to ``s`` rounds old, and at moderate steps each round keeps
only part of its progress (docs/benchmarks.md, "SGD quality at the layouts
a user reaches": 10 of 100 fits bad at 16 participants under ``SSP(1)``).

The table is ``aggregate="clock"`` under a bound too, so a read holds every
participant's rounds of the clocks below its tag and none after (its own
always: read-my-writes), and ``Session.pull_rows(..., with_clocks=True)``
says that tag per row. A round the read missed is, per other participant,
``(M_q(k) - M_q(k-1)) / P`` of the fresh table; its expectation is the
mean training change of round ``k`` (with fresh starts the averaging terms
cancel over the participants), which this participant estimates by its own
change of that round, ``g(k)``: the round starts from

    read + (P - 1) / P * sum of g(k) over the clocks k the read missed

(delayed averaging: local SGD whose average arrives late, Wang et al.
2020, "Overlap Local-SGD"). Only the clocks a read missed are made up for,
so a read fresher than the worst case adds less, and a fresh one nothing:
no momentum. ``g`` is the training change alone (the round's model minus
the start it trained from), not the model's change, which carries the
correction itself and would feed it back (an earlier try did: it diverged
at ``SSP(3)``).

Pure: numpy or cupy arrays in, no session.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from dask_ps._estimators import arrays


class CatchUp:
    """One participant's last ``staleness`` rounds' own training changes,
    and the start of a round made from a read and the clocks it missed.

    Parameters
    ----------
    staleness : int
        The table's bound ``s`` (>= 1): a read misses at most ``s`` clocks.
    n_participants : int
        ``P``: a missed clock lacks ``P - 1`` participants' rounds.
    """

    def __init__(self, staleness: int, n_participants: int):
        if staleness < 1:
            raise ValueError(f"a staleness bound of at least 1 clock is needed, got {staleness!r}")
        self.share = (n_participants - 1.0) / n_participants
        # (clock, rows or None (the whole table), change): the round trained at ``clock``
        self.changes: deque = deque(maxlen=int(staleness))

    def __repr__(self):
        return f"<CatchUp share={self.share:.3f} clocks={[c for c, _, _ in self.changes]}>"

    def start(self, clock: int, rows, read, held):
        """The start of the round at ``clock``: ``read`` (the round's
        ``rows``, sorted, or None: the whole table) plus ``share`` of this
        participant's change in each round whose clock ``k`` the read
        missed (``held[i] <= k``: row ``i`` holds the others' clocks below
        ``held[i]``). ``read`` itself is never written to."""
        held = np.asarray(held)
        out = None
        for k, krows, g in self.changes:
            if k >= clock:
                continue
            missed = held <= k
            if rows is None:
                if krows is not None or not missed.any():
                    continue
                if out is None:
                    out = read.copy()
                m = _like(missed, out)
                out[m] += self.share * g[m]
                continue
            if krows is None or krows.size == 0 or rows.size == 0:
                continue
            pos = np.clip(np.searchsorted(krows, rows), 0, krows.size - 1)
            hit = (krows[pos] == rows) & missed
            if not hit.any():
                continue
            if out is None:
                out = read.copy()
            idx = np.flatnonzero(hit)
            out[_like(idx, out)] += self.share * g[_like(pos[idx], g)]
        return read if out is None else out

    def record(self, clock: int, rows, start, trained) -> None:
        """The round at ``clock`` trained ``rows`` (sorted; None: the whole
        table) from ``start`` to ``trained``."""
        self.changes.append((int(clock), None if rows is None else np.asarray(rows), trained - start))


def _like(a, ref):
    """``a`` (numpy) as an array of ``ref``'s library (numpy, or cupy where
    the weights live on the device: indexed with device arrays)."""
    return a if isinstance(ref, np.ndarray) else arrays.xp_of(ref).asarray(a)
