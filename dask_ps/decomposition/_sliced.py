"""LDA's vocabulary slices (LightLDA's model slices): an iteration of the
Gibbs participant that holds the word-topic rows of one slice of its
vocabulary at a time (``vocabulary_slices=S > 1``).

A participant's vocabulary (its local rows, sorted by word) is cut into
``S`` ranges of about ``|V_p| / S`` rows. Each iteration it reads the
totals once; then, slice by slice, it reads the rows of the slice's words,
drops the session's cached copy, sends the slice before's change (in the
background), sweeps the tokens of those words only -- in document order, with the
documents' topic counts and the totals local and updated as it goes -- and
pushes the rows' change; the totals' change and the clock end the
iteration, as in :func:`dask_ps.decomposition._gibbs._iteration`. Each
token's conditional is the collapsed one, from the current document counts,
its word's row as read for its slice (updated by the slice's own moves) and
the local totals: a systematic-scan Gibbs sweep in slice-major order. The
rows of one slice are held at a time: reading the next slice ahead
(``prefetch_rows``) doubled that and was not faster (docs/benchmarks.md,
"Vocabulary slices").
See "LDA's word-topic table beyond one worker" in ``docs/architecture.rst``.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dask_ps import ParticipantContext, report_progress
from dask_ps.decomposition import _lda_kernels as _k


@dataclasses.dataclass(eq=False)
class Slices:
    """A participant's vocabulary cut in slices, and its tokens by slice.

    Slice ``j`` is the local rows ``bounds[j] .. bounds[j + 1] - 1``; its
    tokens are ``tokens[j]`` (positions in the partition's token order, in
    document order), their words ``words[j]`` (rows relative to
    ``bounds[j]``) and ``doc_ptr[j]`` their range per document.
    ``entries[j]``: their (document, word) runs as CSR arrays for the
    verbose perplexity, made at its first evaluation.
    """

    bounds: np.ndarray
    tokens: list
    words: list
    doc_ptr: list
    entries: list | None = None

    @property
    def count(self) -> int:
        return self.bounds.size - 1

    def rows(self, j) -> slice:
        return slice(int(self.bounds[j]), int(self.bounds[j + 1]))


def cut(words, doc_ptr, n_rows: int, n_slices: int) -> Slices:
    """``n_rows`` local rows in ``min(n_slices, n_rows)`` slices of about
    equal rows (the memory bound is in rows), and the tokens of each."""
    S = max(1, min(int(n_slices), int(n_rows)))
    bounds = np.linspace(0, n_rows, S + 1).round().astype(np.int64)
    slice_of = np.searchsorted(bounds, words, side="right") - 1
    order = np.argsort(slice_of, kind="stable")  # by slice, in document order within one
    ends = np.cumsum(np.bincount(slice_of, minlength=S))
    doc_of = np.repeat(np.arange(doc_ptr.size - 1, dtype=np.int64), np.diff(doc_ptr))
    tokens, slice_words, ptrs = [], [], []
    for j in range(S):
        tok = order[(ends[j - 1] if j else 0):ends[j]]
        ptr = np.zeros(doc_ptr.size, dtype=doc_ptr.dtype)
        np.cumsum(np.bincount(doc_of[tok], minlength=doc_ptr.size - 1), out=ptr[1:])
        tokens.append(tok)
        slice_words.append((words[tok] - bounds[j]).astype(words.dtype))
        ptrs.append(ptr)
    return Slices(bounds, tokens, slice_words, ptrs)


def sliced_iteration(ctx: ParticipantContext, s, sl: Slices, cfg, it):
    """Iteration ``it`` of participant ``s`` (a ``_gibbs._Sampler``) slice
    by slice: read the totals, then per slice read its rows, sweep its
    tokens, push the rows' change; push the totals' change and clock."""
    from dask_ps.decomposition._gibbs import _report_iteration, _staleness_since_last_evaluation

    t0 = time.perf_counter()
    nk = ctx.pull(cfg.nk_name)
    nk_before = nk.copy()
    s.timing["pull_seconds"] += time.perf_counter() - t0
    evaluation = _Evaluation(s, sl, cfg, it, nk) if cfg.evaluate_every > 0 and it % cfg.evaluate_every == 0 else None
    sweep_seconds = s.sweep_seconds
    for j in range(sl.count):
        t1 = time.perf_counter()
        rows = ctx.pull_rows(cfg.nwk_name, s.vocab[sl.rows(j)])
        ctx.uncache(cfg.nwk_name)  # this slice's rows are read once per clock: a cached copy is only memory
        if j:
            # The slice before's change, sent while this one is swept: after
            # this read, which would otherwise wait for its acknowledgement.
            ctx.flush(wait=False)
        s.peak_rows = max(s.peak_rows, rows.shape[0])
        t2 = time.perf_counter()
        s.timing["pull_seconds"] += t2 - t1
        if evaluation is not None:
            evaluation.add(j, rows)
            if j == sl.count - 1:  # every slice's rows seen: the state after ``it`` sweeps
                evaluation.finish(ctx, _staleness_since_last_evaluation)
            s.timing["eval_seconds"] += time.perf_counter() - t2
        if cfg.progress_name is not None and j == sl.count - 1:
            _report_iteration(ctx, s, cfg, it)  # flushed by this iteration's clock
        changed, delta = _sweep_slice(s, sl, cfg, it, j, rows, nk)
        t3 = time.perf_counter()
        if changed.size:
            ctx.push_rows(cfg.nwk_name, s.vocab[sl.bounds[j] + changed], delta, copy=False)  # a fresh array
        s.timing["push_seconds"] += time.perf_counter() - t3
        del rows, delta
    s.sweeps.append(s.sweep_seconds - sweep_seconds)
    if cfg.delay is not None:
        time.sleep(cfg.delay(s.rank, it, s.sweep_seconds - sweep_seconds))  # benchmark hook: stragglers
    t4 = time.perf_counter()
    ctx.push(cfg.nk_name, (nk - nk_before).astype(np.int64), copy=False)
    s.peak_session_bytes = max(s.peak_session_bytes, ctx.held_bytes(cfg.nwk_name))
    ctx.clock()
    s.timing["clock_seconds"] += time.perf_counter() - t4


def _sweep_slice(s, sl: Slices, cfg, it, j, rows, nk):
    """Resample the tokens of slice ``j`` once against its ``rows``
    (updated in place, with the documents' counts and ``nk``); returns the
    rows that changed and their change."""
    # Slice j of iteration it: its own stream of the partition's seed.
    seed = int(np.random.SeedSequence(cfg.seeds[s.rank], spawn_key=(it, j)).generate_state(1)[0] & 0x7FFFFFFF)
    tok, words = sl.tokens[j], sl.words[j]
    z = s.z[tok]
    t0 = time.perf_counter()
    # As _gibbs._iteration: the change from the moved assignments where the
    # rows are much larger than the tokens, else from comparing the rows.
    from_moves = rows.shape[0] * cfg.n_components > 4 * tok.size
    if from_moves:
        z_before = z.copy()
    else:
        rows_before = rows.copy()
    s.sweep(sl.doc_ptr[j], words, z, s.ndk, rows, nk, cfg.alpha, cfg.beta, s.vbeta, seed)
    s.sweep_seconds += time.perf_counter() - t0
    s.z[tok] = z
    if from_moves:
        out = np.zeros(rows.shape, dtype=rows.dtype)  # pages touched only where tokens moved
        changed = _k.row_deltas_into(words, z_before, z, out, False)
        return changed, out[:changed.size]
    return _k.changed_rows(rows, rows_before)


class _Evaluation:
    """The state after ``it`` sweeps as a slicing participant sees it,
    summed slice by slice (``_gibbs._evaluate``'s terms): the documents'
    and the totals' parts (and, with a progress table, theta) before the
    first sweep, each slice's word rows as read, before its sweep."""

    def __init__(self, s, sl: Slices, cfg, it, nk):
        from dask_ps.decomposition._scoring import participant_loglik

        self.s, self.sl, self.cfg, self.it = s, sl, cfg, it
        nk = np.asarray(nk)
        # the documents' and the totals' parts: no word row
        self.ll = participant_loglik(s.ndk, s.doc_len, np.zeros((0, nk.size), dtype=np.int64), s.weights[:0], nk,
                                     cfg.alpha, cfg.beta, s.vbeta, s.P)
        self.token_ll = None
        if cfg.progress_name is not None:
            K = nk.size
            self.theta = (s.ndk + cfg.alpha) / (s.doc_len + K * cfg.alpha)[:, None]
            self.scale = 1.0 / (np.maximum(nk, 0) + s.vbeta).astype(np.float64)
            self.token_ll = 0.0
            if sl.entries is None:
                from dask_ps.decomposition._gibbs import doc_word_entries

                sl.entries = [doc_word_entries(w, p) for w, p in zip(sl.words, sl.doc_ptr)]

    def add(self, j, rows):
        s, cfg = self.s, self.cfg
        self.ll += _k.word_loglik_rows(rows, s.weights[self.sl.rows(j)], cfg.beta)
        if self.token_ll is not None:
            out = np.empty(s.doc_len.size)
            _k.doc_logliks(*self.sl.entries[j], np.maximum(rows, 0), float(cfg.beta), self.scale, self.theta, out)
            self.token_ll += float(out.sum())

    def finish(self, ctx, staleness):
        """Keep the evaluation (as ``_gibbs._evaluate``): in the history,
        on the ``/ps`` page, and for the progress row."""
        s, cfg = self.s, self.cfg
        s.history.append((self.it, time.time() - cfg.t_start, self.ll))
        report_progress(ctx, loss=-self.ll / max(int(s.z.size), 1))
        if self.token_ll is not None:
            s.evaluation = (1.0, self.ll, self.token_ll, *staleness(ctx, s, cfg))
