"""Placement of row blocks on workers: consistent hashing with virtual nodes
and bounded loads (pure code).

Each worker owns ``vnodes`` points on a hash ring; a block goes to the first
worker clockwise from the block's own hash that still has room. "Room" is the
bounded-load rule of Mirrokni, Thorup & Zadimoghaddam ("Consistent Hashing
with Bounded Loads", 2018): no worker takes more than
about ``load_factor * n_blocks / n_workers`` blocks of one table, so even a
table of a few blocks spreads over the workers, while a membership change
still moves only about 1/N of the blocks.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable


def _hash(key: str) -> int:
    # Stable across processes and Python versions (unlike hash()).
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """A consistent-hash ring over worker addresses."""

    def __init__(self, workers: Iterable[str], vnodes: int = 64):
        self.workers = sorted(set(workers))
        self.vnodes = vnodes
        points = sorted(
            (_hash(f"{w}#{i}"), w) for w in self.workers for i in range(vnodes)
        )
        self._keys = [p for p, _ in points]
        self._owners = [w for _, w in points]

    def __repr__(self):
        return f"<HashRing {len(self.workers)} workers x {self.vnodes} vnodes>"

    def walk(self, key: str):
        """Distinct workers in ring order starting at ``key``'s position."""
        if not self.workers:
            return
        start = bisect.bisect(self._keys, _hash(key))
        seen = set()
        n = len(self._keys)
        for i in range(n):
            w = self._owners[(start + i) % n]
            if w not in seen:
                seen.add(w)
                yield w
                if len(seen) == len(self.workers):
                    return


def place_blocks(
    table: str,
    n_blocks: int,
    workers: Iterable[str],
    *,
    vnodes: int = 64,
    load_factor: float = 1.1,
    replication: int = 1,
) -> list[list[str]]:
    """Owners of each block of ``table``: ``result[b]`` lists ``replication``
    distinct workers, the primary first.

    Deterministic: the same table name, block count and worker set always give
    the same placement, wherever it is computed.
    """
    ring = HashRing(workers, vnodes)
    n_workers = len(ring.workers)
    if n_workers == 0:
        raise RuntimeError(f"table {table!r}: there are no parameter-server workers to place it on")
    if replication < 1 or replication > n_workers:
        raise ValueError(
            f"table {table!r}: replication={replication} needs between 1 and {n_workers} workers"
        )
    # Slack above the even share only where it is at least one block, so a
    # table of a few blocks still lands on as many workers as it can.
    avg = n_blocks * replication / n_workers
    cap = max(1, math.ceil(avg) + math.floor((load_factor - 1) * avg))
    load = dict.fromkeys(ring.workers, 0)
    placement = []
    for b in range(n_blocks):
        owners = []
        for w in ring.walk(f"{table}:{b}"):
            if load[w] < cap:
                owners.append(w)
                load[w] += 1
                if len(owners) == replication:
                    break
        if len(owners) < replication:  # every worker with room is taken: least loaded
            for w in sorted(ring.workers, key=load.__getitem__):
                if w not in owners and len(owners) < replication:
                    owners.append(w)
                    load[w] += 1
        placement.append(owners)
    return placement
