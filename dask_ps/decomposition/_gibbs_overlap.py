"""One Gibbs iteration with the word-topic rows moved while the sampler runs
(issue 12: communication off the critical path).

A partition's documents are split into two halves A and B of about equal
tokens. Per iteration (clock ``c``)::

    rows(A), totals <- the reads prefetched at the end of clock c-1
    sweep A                       (B's rows are being read meanwhile)
    push A's deltas, flush(wait=False)
    rows(B) <- the prefetched read, with own A pushes (the session adds them)
    sweep B                       (A's deltas are being sent meanwhile)
    push B's deltas and the totals' delta, clock(wait=False)
    prefetch rows(A), rows(B), totals for clock c+1

so the participant blocks only for what the other half did not hide. Every
guarantee stays the session's: a prefetched read is checked against the
table's bound when it is consumed (re-read if too old), own writes are in
it, and a clock is reported only after its flushes were acknowledged
(``dask_ps._overlap``). The deltas pushed are exact, so the count tables
still equal the participants' assignments. Under BSP the result is
deterministic as before (each read sees the clocks below plus the reader's
own pushes), though not the same chain as the one-piece iteration (the
second half samples from rows read after the first half's pushes).

Opt-in (``dask.config`` ``ps.lda.overlap: true``, read by the fit driver):
on the loaded 2-core benchmark machine it was not faster than the one-piece
iteration, within the run-to-run spread (``docs/benchmarks.md``, "LDA vs
one tomotopy thread"), and in one full test-suite run two small fits of 3-4
participants ended in a merged-topics mode with it (not reproduced alone).

Evaluations (``evaluate_every``) need every row at the iteration's start:
that iteration waits for both reads before sweeping. The array sampler
(``device="cuda"``) keeps the one-piece iteration.
"""

from __future__ import annotations

import time

import numpy as np

from dask_ps.decomposition import _gibbs
from dask_ps.decomposition._lda_kernels import row_deltas


class _Half:
    """A contiguous range of the partition's documents: its tokens (views),
    its local words and their rows' global indices."""

    def __init__(self, s, d0, d1):
        t0, t1 = int(s.doc_ptr[d0]), int(s.doc_ptr[d1])
        self.doc_ptr = s.doc_ptr[d0:d1 + 1] - t0
        self.words = s.words[t0:t1]
        self.z = s.z[t0:t1]
        self.ndk = s.ndk[d0:d1]
        self.local = np.unique(self.words).astype(np.int64)  # rows of the local nwk this half touches
        self.rows = s.vocab[self.local]  # their global word ids (sorted: vocab is)
        self.position = np.full(s.vocab.size, -1, dtype=np.int64)  # local word -> index in self.local
        self.position[self.local] = np.arange(self.local.size)


def _split(s):
    """Two halves of about equal tokens at a document boundary (one when
    the partition has a single document)."""
    n_docs = s.doc_ptr.size - 1
    mid = int(np.searchsorted(s.doc_ptr, s.doc_ptr[-1] / 2))
    mid = min(max(mid, 1), n_docs - 1) if n_docs > 1 else n_docs
    return [_Half(s, 0, mid)] + ([_Half(s, mid, n_docs)] if mid < n_docs else [])


def _prefetch(ctx, s, cfg):
    s.pending = ([ctx.prefetch_rows(cfg.nwk_name, h.rows) for h in s.halves], ctx.prefetch(cfg.nk_name))


def _fill(s, cfg, h, read):
    rows = read.result()
    if s.nwk is None:
        s.nwk = np.zeros((s.vocab.size, cfg.n_components), dtype=rows.dtype)
    s.nwk[h.local] = rows


def overlapped_iteration(ctx, s, cfg, it):
    """Iteration ``it`` of :func:`dask_ps.decomposition._gibbs._gibbs_participant`
    in two overlapped halves (module docstring)."""
    if not hasattr(s, "halves"):
        s.halves = _split(s)
        s.nwk = None  # the local copy of the rows, filled per half (the table's dtype)
        _prefetch(ctx, s, cfg)
    row_reads, nk_read = s.pending
    last = it == cfg.stop - 1
    seed = np.random.SeedSequence(cfg.seeds[s.rank], spawn_key=(it,)).generate_state(len(s.halves))
    t0 = time.perf_counter()
    nk = np.array(nk_read.result(), dtype=np.int64)  # own copy: the sweeps write it
    evaluate = cfg.evaluate_every > 0 and it % cfg.evaluate_every == 0
    fresh = set()
    if evaluate:  # every row as of the iteration's start
        for h, r in zip(s.halves, row_reads):
            _fill(s, cfg, h, r)
            fresh.add(id(h))
    s.timing["pull_seconds"] += time.perf_counter() - t0
    if evaluate:
        t1 = time.perf_counter()
        _gibbs._evaluate(ctx, s, cfg, it, s.nwk, nk)
        s.timing["eval_seconds"] += time.perf_counter() - t1
    nk_before = nk.copy()
    dt_sweeps = 0.0
    for j, (h, r) in enumerate(zip(s.halves, row_reads)):
        t0 = time.perf_counter()
        if id(h) not in fresh:
            _fill(s, cfg, h, r)  # with own pushes of the halves before (read-my-writes)
        t1 = time.perf_counter()
        z_before = h.z.copy()
        s.sweep(h.doc_ptr, h.words, h.z, h.ndk, s.nwk, nk, cfg.alpha, cfg.beta, s.vbeta,
                int(seed[j] & 0x7FFFFFFF))
        t2 = time.perf_counter()
        changed, delta = row_deltas(h.words, z_before, h.z, h.position, cfg.n_components, s.nwk.dtype.type(0))
        if changed.size:
            ctx.push_rows(cfg.nwk_name, h.rows[changed], delta, copy=False)
        t3 = t4 = time.perf_counter()
        if j == len(s.halves) - 1:
            ctx.push(cfg.nk_name, nk - nk_before, copy=False)
            t3 = time.perf_counter()
            ctx.clock(wait=last)  # the flush and the clock's report in the background
            if not last:
                _prefetch(ctx, s, cfg)  # the next clock's reads, checked against its bound when used
            t4 = time.perf_counter()
        else:
            ctx.flush(wait=False)
            t3 = t4 = time.perf_counter()
        s.timing["pull_seconds"] += t1 - t0
        s.timing["push_seconds"] += t3 - t2
        s.timing["clock_seconds"] += t4 - t3
        dt_sweeps += t2 - t1
    s.sweep_seconds += dt_sweeps
    if cfg.delay is not None:
        time.sleep(cfg.delay(s.rank, it, dt_sweeps))  # benchmark hook: emulate stragglers
