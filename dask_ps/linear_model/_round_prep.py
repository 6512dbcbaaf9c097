"""A participant's sparse rounds prepared ahead (``_RoundPrep``, in a
background thread) and a round ready to train (``_Round``): the lazy
regularization's counts of the rounds that touch each feature, then each
round's touched features and
either its CSR compacted over them (rounds read again at later epochs, or
a table too wide to hold whole) or, for rounds read once with the whole
table held (a single pass), the round's samples left in place in the CSR
(``_sgd_numba.round_features``; trained over the participant's copy of the
whole table, ``_rounds._compiled_round``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from dask_ps.linear_model._rounds import _CompiledData, _RunConfig

# Lazy regularization counts one per feature of the table (bincount, an
# int32 array over the features) while the table has at most this many
# features per non-zero of the participant's rows; a wider table counts the
# features present only (unique: a sort, O(nnz log nnz), O(nnz) memory).
# The compiled rounds (``_RoundPrep``) and the minibatch kernel's alike.
_DENSE_COUNTS_PER_NONZERO = 4

_NO_COUNTS = np.zeros(0, dtype=np.int32)  # round_features without counting

# A participant whose training rows hold at most this many non-zeros builds
# its rounds with numpy (``numpy_round_features``, ``numpy_compact_rows``)
# instead of the compiled kernels: a fresh process's first sparse fit then
# compiles the round kernel only. The kernels' compile, 0.7 s of a quiet
# core (after numba's start), is most of what such a fit waited for (issue
# 35); numpy's build costs 10-20 ms more over a fit of 300k non-zeros
# (2^18 features; the rounds are kept across its epochs).
NUMPY_PREP_NONZEROS = 1 << 20


def _row_positions(rows, ptr):
    """Where the non-zeros of the CSR rows ``rows`` are (in the order of
    ``rows``), and the row pointers of those rows as a CSR of their own
    (int32, as ``compact_rows``')."""
    lengths = ptr[rows + 1] - ptr[rows]
    cptr = np.empty(rows.shape[0] + 1, dtype=np.int32)
    cptr[0] = 0
    np.cumsum(lengths, out=cptr[1:])
    return np.repeat(ptr[rows] - cptr[:-1], lengths) + np.arange(cptr[-1]), cptr


def _sorted_features(g, n_features):
    """The distinct features among ``g`` (sorted int64) and, for each entry
    of ``g``, its position among them (int32): a mark per feature of the
    table, or where the table is wide next to ``g`` (hashed features), a
    sort of ``g``."""
    if n_features > 4 * g.shape[0]:
        cols, inverse = np.unique(g, return_inverse=True)
        return cols.astype(np.int64), inverse.reshape(-1).astype(np.int32)
    touched = np.zeros(n_features, dtype=bool)
    touched[g] = True
    cols = np.flatnonzero(touched).astype(np.int64, copy=False)
    lookup = np.empty(n_features, dtype=np.int32)
    lookup[cols] = np.arange(cols.shape[0], dtype=np.int32)
    return cols, lookup[g]


def numpy_compact_rows(rows, data, ind, ptr, n_features):
    """``_sgd_numba.compact_rows``'s result (the same arrays and dtypes),
    computed with numpy: no compile (``NUMPY_PREP_NONZEROS``)."""
    pos, cptr = _row_positions(rows, ptr)
    cols, cind = _sorted_features(ind[pos], n_features)
    return cols, data[pos], cind, cptr


def numpy_round_features(rows, ind, ptr, n_features, counts):
    """``_sgd_numba.round_features``'s result (and its count into
    ``counts``), computed with numpy (``NUMPY_PREP_NONZEROS``)."""
    pos, _ = _row_positions(rows, ptr)
    g = ind[pos]
    if n_features > 4 * g.shape[0]:
        cols = np.unique(g).astype(np.int64)
    else:
        touched = np.zeros(n_features, dtype=bool)
        touched[g] = True
        cols = np.flatnonzero(touched).astype(np.int64, copy=False)
    if counts.shape[0] > 0:
        counts[cols] += 1
    return cols


class _Round:
    """A round ready to train: its touched rows (sparse data: the rows of
    the weights it reads and writes, the intercept's last; None for dense
    data), its samples as chunks for ``sgd_round`` (each ``(samples, X, Y
    per output, sample weights, rows of X to train on)``), its number of
    samples and, for sparse data with a penalty, ``1/q`` of its rows
    (lazy regularization; read after the round's training: a round built
    before the counts were done gets it then, ``_PendingInvQ``).
    ``in_place``: its samples are the participant's CSR rows themselves,
    over the whole table's columns (``_RoundPrep``); its ``inv_q`` is then
    ``(R, counts)``: the epoch's rounds and how many of them touch each of
    its features (``1/q = R / counts``, taking at most ``R`` values:
    ``_rounds._finish_in_place``)."""

    __slots__ = ("rows", "chunks", "n", "_inv_q", "in_place")

    def __init__(self, rows, chunks, n, inv_q=None, in_place=False):
        self.rows, self.chunks, self.n, self._inv_q, self.in_place = rows, chunks, n, inv_q, in_place

    @property
    def inv_q(self):
        if isinstance(self._inv_q, _PendingInvQ):
            self._inv_q = self._inv_q.value()
        return self._inv_q


class _PendingInvQ:
    """``1/q`` of a round's features (``cols``) built before the counts
    behind it: waits for them (``_RoundPrep._count``) at first use."""

    __slots__ = ("prep", "cols", "_value")

    def __init__(self, prep, cols):
        self.prep, self.cols, self._value = prep, cols, None

    def value(self):
        if self._value is None:
            t = time.perf_counter()
            self.prep._counted.result()  # (its error, if it failed)
            self.prep.waited += time.perf_counter() - t  # the participant's wait: round preparation's
            self._value = self.prep.round_share(self.cols)
        return self._value


class _RoundPrep:
    """The sparse rounds of a participant, compacted (``_sgd_numba.compact_rows``:
    a round's touched features and its rows as a CSR over them) or, where
    ``c.in_place``, its touched features only (``round_features``), built by
    one background thread ahead of the round that needs them, so that the
    participant's thread trains and syncs meanwhile (numba releases the
    GIL). The lazy regularization's counts of the rounds touching each
    feature are its second job (``_count``), after the first round asked
    for: that round's rows are read and it is trained meanwhile, and it
    takes its ``1/q`` after its training.

    Entries are kept across the epochs of a run when ``c.cache`` allows
    (``ps.sgd.round-cache-bytes``); otherwise each is dropped once taken
    and a round is built again at its next epoch, into the arrays of a
    round already trained (``recycle``): first writes to fresh memory cost
    page faults. Only this thread touches the compaction's scratch arrays."""

    def __init__(self, cfg: _RunConfig, c: _CompiledData, run_rounds):
        from concurrent.futures import ThreadPoolExecutor

        self.cfg, self.c, self.run_rounds = cfg, c, run_rounds
        self.pending: dict = {}  # round id -> Future of its entry
        # Lazy regularization (_count): how many rounds touch each feature,
        # per feature of the table (``counts_of_feature``, ``_dense_counts``),
        # or for the features the rounds touch only (sorted
        # ``count_features``, their ``counts`` and 1/q); and the rounds'
        # touched features.
        self.counts_of_feature = None
        self.count_features = self.counts = self.inv_q_of_feature = None
        self.features = None
        self._early_features: dict = {}  # round id -> features of a round built before the counts
        self._count_started = False  # (this thread's)
        self.cpu_seconds = 0.0  # the thread's CPU time in its jobs
        self.waited = 0.0  # the participant's seconds waiting for the counts after a round's training
        self.spare: list = []  # (data, indices) arrays of trained rounds, to build into (recycle)
        # A thread only helps where there is another round to train while one
        # is built: with one round an epoch the participant waited for it
        # (a thread started and a hand-over per fit and per round; most of a
        # small sparse fit's time), so the jobs run in the calling thread.
        one_round = -(-cfg.steps_per_epoch // cfg.clock_every) <= 1
        self._pool = _InlinePool() if one_round else ThreadPoolExecutor(1, thread_name_prefix="dask_ps-sgd-rounds")
        self._counted = None  # the Future of _count, the second job once the rounds are drawn

    def __repr__(self):
        return f"<_RoundPrep pending={sorted(self.pending)} kept={0 if self.c.cache is None else len(self.c.cache)}>"

    def _count(self):
        """Lazy regularization's ``1/q`` of every feature the rounds touch:
        ``q`` = the share of the epoch's rounds that touch it (its rounds'
        touched features, ``round_features``, counted), so that a feature's
        touches give it exactly an epoch's regularization, ``R`` rounds'
        worth (``_rounds._finish_round``). One read of the rounds' indices
        (a round built before, its features) and a count of their touched
        features; the rounds trained in place reuse those features
        (``_build``). Runs after the first round asked for is built.

        Counted per feature of the table where such a count is small next
        to what the participant holds (``_dense_counts``): no sort of the
        rounds' touched features and no search per round (hashed 2^20
        benchmark, 450k rows a participant: 0.05 s of CPU per fit before
        the first round, of which the sort 0.02 s, and 3 ms a round)."""
        cpu = time.thread_time()
        self._count_started = True
        c = self.c
        early = self._early_features
        dense = self._dense_counts()
        # Per feature of the table: counted as each round's features are
        # found (distinct features: one count each).
        counts = np.zeros(self.cfg.n_features if dense else 0, dtype=np.int32)
        features = []
        for rid, idx in enumerate(self.run_rounds):
            if rid in early:
                f = early.pop(rid)
                if dense:
                    counts[f] += 1
            else:
                f = self._round_features(idx, counts)
            features.append(f)
        if dense:
            self.counts_of_feature = counts
        else:
            touched = np.concatenate(features) if features else np.zeros(0, dtype=np.int64)
            self.count_features, self.counts = np.unique(touched, return_counts=True)
            self.inv_q_of_feature = len(features) / self.counts
        if c.in_place:
            self.features = features
        self.cpu_seconds += time.thread_time() - cpu

    def _dense_counts(self) -> bool:
        """Whether ``_count`` keeps a count per feature of the table (int32):
        where the participant holds the whole table anyway (``c.in_place``)
        or the table has at most ``_DENSE_COUNTS_PER_NONZERO`` features per
        non-zero of its data; a wider table (hashed 2^28 over a small
        part) counts the features its rounds touch only."""
        c = self.c
        return c.in_place or self.cfg.n_features <= _DENSE_COUNTS_PER_NONZERO * c.data.shape[0]

    def inv_q(self, cols):
        """``1/q`` of the features ``cols`` (sorted, touched by a round): the
        epoch's rounds over the rounds that touch each (``_count``)."""
        if self.counts_of_feature is not None:
            return len(self.run_rounds) / self.counts_of_feature[cols]
        return self.inv_q_of_feature[np.searchsorted(self.count_features, cols)]

    def round_share(self, cols):
        """What a round over the features ``cols`` gets for its lazy
        regularization (``_Round``): ``1/q`` of each, or for a round
        trained in place ``(R, counts)`` where the counts are kept per
        feature of the table (``_dense_counts``: always, in place)."""
        if self.c.in_place and self.counts_of_feature is not None:
            return len(self.run_rounds), self.counts_of_feature[cols]
        return self.inv_q(cols)

    def _build(self, rid):
        cpu = time.thread_time()
        c, d = self.c, self.cfg.n_features
        idx = self.run_rounds[rid]
        if c.in_place and self.features is not None:  # counted first (_count): the round's features
            cols = self.features[rid]
        elif c.in_place:  # the round's features only: its samples stay where they are (c.in_place)
            cols = self._round_features(idx, _NO_COUNTS)
        elif c.prep_in_numpy:
            cols, cdata, cind, cptr = numpy_compact_rows(idx, c.data, c.ind, c.ptr, d)
        else:
            out = self.spare.pop() if self.spare else None
            cols, cdata, cind, cptr = c.mod.compact_rows(idx, c.data, c.ind, c.ptr, c.bits, c.rank, c.slot, out)
        rows = np.append(cols, d)  # sorted and unique: pull_rows/push_rows do not sort them
        iq = None
        if c.lazy and not self._count_started:  # built before the counts (this thread's next job)
            self._early_features[rid] = cols  # _count takes them
            iq = _PendingInvQ(self, cols)
        elif c.lazy:
            self._counted.result()  # (its error, if it failed)
            iq = self.round_share(cols)
        if c.in_place:
            entry = rows, None, None, None, iq
        else:
            entry = rows, (cdata, cind, cptr), [yk[idx] for yk in c.Y], c.sw[idx], iq
        self.cpu_seconds += time.thread_time() - cpu
        return entry

    def _round_features(self, idx, counts):
        c = self.c
        if c.prep_in_numpy:
            return numpy_round_features(idx, c.ind, c.ptr, self.cfg.n_features, counts)
        return c.mod.round_features(idx, c.ind, c.ptr, c.bits, counts)

    def _kept(self, rid):
        return None if self.c.cache is None else self.c.cache.get(rid)

    def request(self, rid) -> None:
        """Build round ``rid`` in the background unless it is kept or on its
        way; the first request is followed by the counts (``_count``), or
        where the rounds train in place the second: building such a round
        is finding its features, which the counts reuse, and the second
        round's read then starts while the first trains (not after the
        counts)."""
        if rid not in self.pending and self._kept(rid) is None:
            self.pending[rid] = self._pool.submit(self._build, rid)
        if not self.c.in_place or len(self.pending) >= min(2, len(self.run_rounds)):
            self._start_counts()

    def _start_counts(self) -> None:
        if self._counted is None and self.c.lazy:
            self._counted = self._pool.submit(self._count)

    def ready(self, rid) -> bool:
        f = self.pending.get(rid)
        return self._kept(rid) is not None or (f is not None and f.done())

    def rows(self, rid):
        """The touched rows of round ``rid`` (waits for it to be built)."""
        return self._entry(rid, take=False)[0]

    def take(self, group) -> _Round:
        """Round ``group = (round id, order)``, in the sample order ``order``
        (None: its own, in which its CSR was built): the kernel reads its
        rows through that list (no copy of the CSR)."""
        rid, order = group
        self._start_counts()  # (after a lone request: a retried participant's last round)
        rows, csr, Y, sw, iq = self._entry(rid, take=True)
        c = self.c
        if csr is None:  # in place: the round's samples by their rows of the participant's CSR
            idx = self.run_rounds[rid]
            samples = idx if order is None else idx[order]
            return _Round(rows, [(samples, (c.data, c.ind, c.ptr), c.Y, c.sw, samples)], idx.shape[0], iq,
                          in_place=True)
        n = sw.shape[0]
        local = c.arange_n(n) if order is None else order
        return _Round(rows, [(local, csr, Y, sw, local)], n, iq)

    def recycle(self, rnd: _Round) -> None:
        """A trained round's CSR arrays, free to build a later round into
        (rounds not kept only; the caller no longer reads them)."""
        if self.c.cache is None and not rnd.in_place:
            cdata, cind, _ = rnd.chunks[0][1]
            self.spare.append((cdata.base if cdata.base is not None else cdata,
                               cind.base if cind.base is not None else cind))

    def _entry(self, rid, take):
        entry = self._kept(rid)
        if entry is None:
            self.request(rid)
            f = self.pending[rid]
            entry = f.result()
            if self.c.cache is not None:
                self.c.cache[rid] = entry
                del self.pending[rid]
            elif take:
                del self.pending[rid]
        return entry

    def close(self) -> None:
        """Stop building (the round being built finishes: numba cannot be interrupted)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.pending.clear()


class _InlinePool:
    """``ThreadPoolExecutor``'s ``submit``/``shutdown`` for jobs run at once
    in the calling thread (``_RoundPrep`` with one round an epoch)."""

    @staticmethod
    def submit(fn, *args):
        from concurrent.futures import Future

        f = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - raised by result(), as from the thread
            f.set_exception(e)
        return f

    def shutdown(self, wait=True, cancel_futures=False) -> None:
        pass
