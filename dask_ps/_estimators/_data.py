"""Training data of a fit: one part per participant, on the workers.

:class:`TrainingParts` holds what ``ParameterServer.run`` gets (futures, or
plain objects small enough to travel inside the task), the futures that
must stay alive while the parts are used, and how to make a part again when
the worker holding it died. Three ways in, all parametrized by the
estimator's own split and prepare functions:

- :meth:`TrainingParts.from_pieces`: an in-memory input split on the client
  and scattered (optionally ``replication`` copies per part, each part then
  a small loader task, :func:`load_part`);
- :meth:`TrainingParts.from_chunks`: a dask collection, one part per chunk,
  computed where Dask puts it;
- :meth:`TrainingParts.per_worker`: persisted dask collections, one part per
  worker holding blocks, assembled on that worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dask_ps._estimators import _dask_adapter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartCopies:
    """The keys of the scattered copies of one in-memory part: on its
    participant's worker first, then the backups (``from_pieces``)."""

    keys: tuple


def load_part(copies: PartCopies):
    """Task: one part of an in-memory input, from a copy on this worker (no
    transfer, no copy) or else from a surviving copy on another worker. It
    depends on no other task, so Dask can always run it again: that is how
    the retried participant of a dead worker gets its data back."""
    return _dask_adapter.local_or_remote_copy(copies.keys)


def _is_lost(part) -> bool:
    return getattr(part, "status", None) in ("error", "cancelled", "lost")


def _on(worker) -> dict:
    """``submit``'s placement keywords for a task that should run on
    ``worker`` (where its input is) but may run elsewhere."""
    return {"workers": [worker], "allow_other_workers": True} if worker is not None else {}


def _cut_groups(groups: list, n: int) -> list:
    """``[(worker, blocks), ...]`` cut into up to ``n`` groups: the group
    with most blocks halved (consecutive blocks, same worker) while there
    are fewer than ``n`` and one has two blocks or more."""
    groups = list(groups)
    while len(groups) < n:
        i = max(range(len(groups)), key=lambda j: len(groups[j][1]))
        w, bl = groups[i]
        if len(bl) < 2:
            break
        half = (len(bl) + 1) // 2
        groups[i:i + 1] = [(w, bl[:half]), (w, bl[half:])]
    return groups


class TrainingParts:
    """The parts of a fit's training data, one per participant.

    Attributes
    ----------
    futures : list
        One element per participant, what ``ParameterServer.run`` gets.
    held : list
        Futures to keep alive while the parts are used (scattered copies,
        persisted collections).
    """

    def __init__(self, client, futures, remakes=None, held=()):
        self.client = client
        self.futures = list(futures)
        # Per part: a function making it again (None: Dask recomputes it
        # from its graph by itself, or it is a plain object).
        self._remakes = list(remakes) if remakes is not None else [None] * len(self.futures)
        self._index = list(range(len(self.futures)))
        self.held = list(held)
        self._made = 0

    def __len__(self):
        return len(self.futures)

    def __repr__(self):
        return f"<TrainingParts {len(self.futures)} part(s) of {self._index}>"

    # --- building --------------------------------------------------------------------
    def _submit(self, fn, *args, key_prefix=None, **kwargs):
        if key_prefix is None:
            return self.client.submit(fn, *args, pure=False, **kwargs)
        self._made += 1
        return self.client.submit(fn, *args, key=f"{key_prefix}-{self._made}", **kwargs)

    @classmethod
    def from_pieces(cls, client, split, *, prepare=None, key_prefix=None, workers=None, scatter=True,
                    replication=1):
        """Parts of an in-memory input.

        Parameters
        ----------
        split : callable
            ``split() -> list of pieces``, the same pieces on every call
            (a lost piece is split again and scattered again).
        prepare : callable, optional
            ``prepare(piece) -> part``, run on the worker holding the piece.
        key_prefix : str, optional
            Task keys of ``prepare``: ``f"{key_prefix}-{n}"`` (else random keys).
        workers : list of str, optional
            Piece ``i`` goes to ``workers[i % len(workers)]``; None: where
            ``Client.scatter`` puts them.
        scatter : bool
            False: the pieces travel inside the participants' tasks (small
            inputs; no ``prepare``).
        replication : int
            With ``workers`` and ``k = min(replication, len(workers)) > 1``:
            each piece is scattered to ``k`` consecutive workers under
            separate keys (Dask's memory manager never drops a copy as a
            redundant replica) and the part is a :func:`load_part` task, so
            a retried participant of a dead worker finds a surviving copy.
        """
        self = cls(client, [])
        pieces = split()
        if not scatter:
            self.futures = list(pieces)
            self._remakes = [None] * len(pieces)
        elif workers is not None and min(int(replication), len(workers)) > 1:
            k = min(int(replication), len(workers))
            for i, piece in enumerate(pieces):
                copies = [client.scatter(piece, workers=[workers[(i + j) % len(workers)]], hash=False)
                          for j in range(k)]
                self.held.extend(copies)
                self.futures.append(client.submit(
                    load_part, PartCopies(tuple(f.key for f in copies)),
                    workers=[workers[i % len(workers)]], allow_other_workers=True, pure=False))
                self._remakes.append(None)
        else:
            if workers is None:
                scattered = client.scatter(list(pieces), hash=False)
            else:
                scattered = [client.scatter(p, workers=[workers[i % len(workers)]], hash=False)
                             for i, p in enumerate(pieces)]

            def remake(i):
                piece = client.scatter(split()[i], hash=False)
                return self._submit(prepare, piece, key_prefix=key_prefix) if prepare is not None else piece

            for i, piece in enumerate(scattered):
                self.futures.append(self._submit(prepare, piece, key_prefix=key_prefix)
                                    if prepare is not None else piece)
                self._remakes.append(lambda i=i: remake(i))
        self._index = list(range(len(self.futures)))
        return self

    @classmethod
    def from_chunks(cls, client, chunks, *, prepare, key_prefix=None):
        """One part per chunk of a dask collection (``chunks``: its
        ``to_delayed()`` pieces): each computed where Dask puts it, then
        ``prepare(chunk)`` there; a lost part is computed again."""
        self = cls(client, [])
        blocks = client.compute(list(chunks))
        self.futures = [self._submit(prepare, b, key_prefix=key_prefix) for b in blocks]
        self._remakes = [lambda i=i: self._submit(prepare, client.compute(chunks[i]), key_prefix=key_prefix)
                         for i in range(len(chunks))]
        self._index = list(range(len(self.futures)))
        return self

    @classmethod
    def per_worker(cls, client, collections, *, prepare, what="the collections", max_parts=None,
                   size_of=None, parts_for=None):
        """One part per worker holding blocks of aligned dask collections.

        The collections are persisted (held by the parts); once their
        blocks are computed, the blocks of each worker go to
        ``prepare(blocks)`` on that worker, ``blocks`` a list of tuples (the
        futures of block ``i`` of each collection). Nothing is gathered to
        the client. With ``max_parts`` (an estimator's ``n_jobs``) and more
        workers holding blocks, the workers' blocks are dealt to that many
        parts (the workers with most blocks first, each to the part with
        fewest so far): Dask moves the others' blocks to the worker that
        prepares the part. With fewer workers holding blocks than
        ``max_parts``, a worker's blocks are cut into several parts (the
        largest group of consecutive blocks halved until there are
        ``max_parts`` or every part is one block): several participants per
        worker, threads of one process (``n_jobs`` above the workers, as
        ``max_participants`` reads it). With ``size_of`` (a task: a block of
        the first collection to its size, rows first) and ``parts_for`` (the
        blocks' sizes to a number of parts), at most that many parts: the
        workers' blocks are dealt to them as above, the groups with most
        rows first, each to the part with fewest rows so far (a small input
        spread over many workers would otherwise give participants of a few
        rows each, whose averaged models progress less than a sequential
        pass: issue 33).
        """
        from distributed import wait

        persisted = client.persist(list(collections))
        per_coll = [_dask_adapter.futures_in_block_order(c) for c in persisted]
        if len({len(b) for b in per_coll}) != 1:
            raise ValueError(
                f"{what} must have the same number of blocks/partitions; got "
                + ", ".join(str(len(b)) for b in per_coll)
            )
        blocks = [tuple(b[i] for b in per_coll) for i in range(len(per_coll[0]))]
        # Where the blocks are once computed (who_has is empty for a block
        # still being computed: every such block would land in one part).
        # ``wait`` uses the default client: ``client`` may not be it (the
        # embedded cluster's never is).
        with client.as_current():
            wait([b[0] for b in blocks])
        where = _dask_adapter.holders(client, [b[0] for b in blocks])
        by_worker: dict = {}
        for b in blocks:
            held_by = sorted(where.get(b[0].key) or ())
            # A block on several workers (copied where an earlier fit's part
            # was prepared) goes to the holder with fewest blocks so far:
            # taking the first holder put every block of such an input on
            # one worker, hence one participant.
            w = min(held_by, key=lambda h: len(by_worker.get(h, ()))) if held_by else None
            by_worker.setdefault(w, []).append(b)
        weight = len  # of a group of blocks: how many blocks, or with a row cap how many rows
        cap = max_parts
        if parts_for is not None:
            sizes = client.gather(client.map(size_of, [b[0] for b in blocks], pure=False))
            rows = {b[0].key: s[0] for b, s in zip(blocks, sizes)}
            wanted = max(1, int(parts_for(sizes)))
            cap = wanted if cap is None else min(cap, wanted)
            weight = lambda bl: sum(rows[b[0].key] for b in bl)  # noqa: E731
        if cap is not None and len(by_worker) > cap:
            merged: list = [[] for _ in range(max(1, cap))]
            for w, bl in sorted(by_worker.items(), key=lambda kv: -weight(kv[1])):
                min(merged, key=weight).extend(bl)
            by_worker = {}
            position = {b[0].key: i for i, b in enumerate(blocks)}
            for bl in merged:  # each part runs where its first blocks are
                if not bl:
                    continue
                bl.sort(key=lambda b: position[b[0].key])  # the stored order (shuffle=False keeps it)
                held_by = where.get(bl[0][0].key) or ()
                by_worker.setdefault(held_by[0] if held_by else None, []).extend(bl)
        self = cls(client, [], held=persisted)

        def submit(w, bl):
            kw = {"workers": [w], "allow_other_workers": True} if w is not None else {}
            return client.submit(prepare, bl, pure=False, **kw)

        groups = list(by_worker.items())
        if max_parts is not None and len(groups) < cap:  # n_jobs above the workers: cut, within the row cap
            groups = _cut_groups(groups, cap)
        for w, bl in groups:
            self.futures.append(submit(w, bl))
            self._remakes.append(lambda w=w, bl=bl: submit(w, bl))
        self._index = list(range(len(self.futures)))
        return self

    def exchanged(self, split, join, counts) -> TrainingParts:
        """The parts after an all-to-all exchange of their rows, as new parts
        (this object lets its parts go: Dask keeps each until it is split).

        ``counts[i][j]``: how many rows part ``i`` sends to part ``j``.
        ``split(part, i)`` runs where part ``i`` is and returns its pieces
        (a sequence, piece ``j`` for part ``j``); ``join(pieces, j)`` runs
        where part ``j`` was and gets the non-empty pieces for it in the
        order of ``i``. Dask moves the pieces worker to worker (nothing
        goes through the client), and computes any of them again from the
        graph if a worker is lost; the new parts keep the persisted
        collections the old ones were made from.
        """
        import operator

        from distributed import wait

        with self.client.as_current():
            wait(self.futures)
        where = _dask_adapter.holders(self.client, self.futures)
        homes = [(where.get(f.key) or [None])[0] for f in self.futures]
        split_futs = [self.client.submit(split, f, i, pure=False, **_on(w)) for i, (f, w) in
                      enumerate(zip(self.futures, homes))]
        new = TrainingParts(self.client, [], held=self.held)
        for j, w in enumerate(homes):
            pieces = [self.client.submit(operator.getitem, s, j, pure=False, **_on(homes[i]))
                      for i, s in enumerate(split_futs) if counts[i][j] > 0]
            new.futures.append(self.client.submit(join, pieces, j, pure=False, **_on(w)))
            new._remakes.append(None)  # Dask computes it again from its graph
        new._index = list(self._index)
        self.futures, self.held = [], []
        return new

    # --- using ---------------------------------------------------------------------------
    def gather(self, fn, *args, key_prefix=None):
        """``[fn(part, *args) for each part]``, computed where the parts are."""
        if key_prefix is None:
            futs = [self.client.submit(fn, p, *args, pure=False) for p in self.futures]
        else:
            futs = [self.client.submit(fn, p, *args, key=f"{key_prefix}-{i}") for i, p in enumerate(self.futures)]
        return self.client.gather(futs)

    def keep(self, indices):
        """Keep only these parts (e.g. those with data), in this order."""
        self.futures = [self.futures[i] for i in indices]
        self._index = [self._index[i] for i in indices]

    @property
    def index(self) -> list:
        """The position of each kept part among the parts first made."""
        return list(self._index)

    def rebuild_lost(self, owner="estimator") -> list:
        """Make again the parts whose data is gone with a worker; returns
        their positions (``index``)."""
        rebuilt = []
        for j, fut in enumerate(self.futures):
            i = self._index[j]
            if not _is_lost(fut) or self._remakes[i] is None:
                continue
            self.futures[j] = self._remakes[i]()
            rebuilt.append(i)
            logger.info("%s: partition %d was lost with its worker; made again", owner, i)
        return rebuilt

    def release(self) -> None:
        """Let the parts and what they hold go."""
        self.futures = []
        self.held = []
