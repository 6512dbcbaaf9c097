"""The Gibbs participant of LDA: one partition's collapsed Gibbs sampler,
``pull → sweep → push deltas → clock`` per iteration (AD-LDA; see the
"Estimators: LDA" section of ``docs/architecture.rst``).

It runs inside ``ParameterServer.run`` (a task on the worker that holds its
partition) and uses only the session's push/pull/clock.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from dask_ps import ParticipantContext, report_progress
from dask_ps._estimators import arrays, wait_for_participants
from dask_ps.decomposition import _lda_kernels as _k
from dask_ps.decomposition import _kept, _sliced
from dask_ps.decomposition._scoring import participant_loglik


class LostAssignmentsError(RuntimeError):
    """A participant was restarted mid-run (its worker died): the topic
    assignments it sampled since the run began are gone, while its pushes are
    on the servers, so it cannot simply go on. The estimator rolls the fit back
    to its last saved assignments when it has some (``replication >= 2`` or
    ``checkpoint``), otherwise the fit fails with this error."""


@dataclasses.dataclass(frozen=True, eq=False)
class GibbsConfig:
    """What the participants of one run (iterations ``start .. stop - 1``) are given.

    Tables: ``nwk_name`` (word-topic counts), ``nk_name`` (topic totals;
    None: the totals are the word-topic table's last row, ``n_features``,
    read and pushed with the word rows, in the same messages),
    ``progress_name`` (verbose or a progress bar: a row per iteration for
    the client's monitor, or None), ``start_name`` (a one-element VAP table the participants count
    themselves in after pushing their starting counts, or None under BSP,
    whose first read waits for them anyway); ``z_in``/``z_out``: per rank, the table of saved assignments to
    start from (None: random ones) and to write the final ones to (None:
    not kept). ``seeds``: one per rank; ``holders``: per word, how many
    partitions hold it. ``delay``: a benchmark hook, a picklable
    ``f(rank, iteration, sweep_seconds) -> seconds`` slept after each sweep
    to emulate stragglers.
    """

    nwk_name: str
    nk_name: str | None
    progress_name: str | None
    n_components: int
    alpha: float
    beta: float
    n_features: int
    start: int
    stop: int
    z_in: list[str] | None
    z_out: list[str] | None
    evaluate_every: int
    seeds: list[int] = dataclasses.field(repr=False)
    holders: np.ndarray = dataclasses.field(repr=False)
    sampler: str
    device: str
    t_start: float
    delay: Callable | None
    start_name: str | None = None
    lone_local: bool = True  # a lone participant keeps its counts local for the run (_lone_iterations)
    # a lone participant's progress to /ps at most this often (ps.dashboard.report-interval)
    report_seconds: float = 0.25
    vocabulary_slices: int = 1  # > 1: the word rows held a slice at a time (_sliced)
    # the next iteration's read sent with this iteration's clock (_read_ahead)
    read_ahead: bool = False
    # rows of the run's in-memory matrix whose final assignments come back (_kept), sorted; None: none
    keep_rows: np.ndarray | None = dataclasses.field(default=None, repr=False)
    # partial_fit: the kept earlier documents' assignments (rows 0 .. n - 1 of the run's in-memory
    # matrix; ``kept_ptr``: their token offsets), where those rows start instead of at random (_kept)
    z_kept: np.ndarray | None = dataclasses.field(default=None, repr=False)
    kept_ptr: np.ndarray | None = dataclasses.field(default=None, repr=False)


def _xp_for(device):
    if device == "cuda":
        xp = arrays.device_module()  # cupy (or the tests' CPU stand-in)
        if xp is None:
            raise RuntimeError("LatentDirichletAllocation: device='cuda' needs cupy on the workers")
        return xp
    return np


class _Sampler:
    """One participant's local state: its tokens, their topic assignments and
    its documents' topic counts (on the device for the array sampler), and
    what it has measured."""

    def __init__(self, part, z, ndk, cfg: GibbsConfig, rank, n_participants):
        self.rank, self.P = rank, n_participants
        self.vocab, self.words, self.doc_ptr = part["vocab"], part["words"], part["doc_ptr"]
        self.row0 = part.get("row0")  # its first document's row in an in-memory matrix (None: a dask chunk)
        self.rows = count_rows(self.vocab, cfg)  # the rows of the word-topic table it reads and pushes
        # Row deltas from the moved assignments (CPU samplers) where the rows
        # are much larger than the tokens: two random-access passes over the
        # tokens against sequential passes over rows x K (at K=50 on the
        # benchmark corpus comparing the rows was cheaper; at K=1000, 5x not).
        self.deltas_from_moves = cfg.sampler != "array" and self.vocab.size * cfg.n_components > 4 * self.words.size
        self.deltas = None  # their (rows x K) buffer, kept zeroed
        self.doc_len = np.diff(self.doc_ptr)
        self.z, self.ndk = z, ndk
        self.vbeta = cfg.n_features * cfg.beta
        self.sampler = cfg.sampler
        self.weights = 1.0 / cfg.holders[self.vocab]  # each word's rows count once over all holders
        self.history = []
        self.stale_seen = {}  # the staleness histogram of the word rows at the last evaluation
        self.evaluation = None  # the progress columns of an evaluation not yet reported (_report_iteration)
        self.doc_words = None  # the documents' word counts as CSR arrays, made by the first _token_loglik
        self.sweep_seconds = 0.0
        self.sweeps = []  # each iteration's sweep seconds: the clock-to-clock spread a straggler analysis needs
        # the word-topic rows held at once, and the session's bytes of that table
        self.peak_rows, self.peak_session_bytes = self.vocab.size, 0
        self.timing = {"pull_seconds": 0.0, "push_seconds": 0.0, "clock_seconds": 0.0, "eval_seconds": 0.0}

    def to_device(self, cfg: GibbsConfig, doc_idx):
        if self.sampler == "array":
            self.xp = _xp_for(cfg.device)
            self.d_words = self.xp.asarray(self.words.astype(np.int64))
            self.d_doc = self.xp.asarray(doc_idx)
            self.d_z = self.xp.asarray(self.z)
            self.d_ndk = self.xp.asarray(self.ndk)
        else:
            self.sweep = _k.SWEEPS[self.sampler]

    def local_ndk(self):
        return self.ndk if self.sampler != "array" else arrays.to_host(self.d_ndk)

    def local_z(self):
        return arrays.to_host(self.d_z) if self.sampler == "array" else self.z


def _gibbs_participant(ctx: ParticipantContext, part, cfg: GibbsConfig):
    """One partition's Gibbs sampler for iterations ``cfg.start .. cfg.stop - 1``:
    ``pull → sweep → push deltas → clock``.

    Clock 0 pushes the counts of the starting assignments -- random ones
    (``cfg.z_in`` None) or those saved in the table ``cfg.z_in[rank]`` -- into
    the run's fresh, empty count tables, so the tables always equal the sum
    of the participants' assignment counts. With ``cfg.z_out``, the final
    assignments are written (assign rule) to ``cfg.z_out[rank]`` before
    returning.
    """
    if ctx.current_clock != 0:
        raise LostAssignmentsError(
            "LatentDirichletAllocation: a participant was restarted mid-fit (its worker was lost) and "
            "its topic assignments are gone. Fit with replication=2 or checkpoint=<path> to resume "
            "from the last saved assignments instead."
        )
    s = _setup(ctx, part, cfg)
    if keeps_counts_local(cfg, ctx.n_participants):
        _lone_iterations(ctx, s, cfg)
        return _finish(ctx, s, cfg)
    if cfg.vocabulary_slices > 1:
        slices = _sliced.cut(s.words, s.doc_ptr, s.vocab.size, cfg.vocabulary_slices)
        s.peak_rows = 0
        for it in range(cfg.start, cfg.stop):
            _sliced.sliced_iteration(ctx, s, slices, cfg, it)
        return _finish(ctx, s, cfg)
    ahead = None
    for it in range(cfg.start, cfg.stop):
        ahead = _iteration(ctx, s, cfg, it, ahead)
    return _finish(ctx, s, cfg)


def keeps_counts_local(cfg: GibbsConfig, n_participants: int) -> bool:
    """Whether a run's participants keep their counts local for the run
    (:func:`_lone_iterations`): a lone one, with a CPU sampler, unless
    ``ps.lda.lone-participant-local`` is false, or it holds its word rows a
    vocabulary slice at a time."""
    return cfg.lone_local and n_participants == 1 and cfg.sampler != "array" and cfg.vocabulary_slices == 1


def _setup(ctx: ParticipantContext, part, cfg: GibbsConfig) -> _Sampler:
    """The starting assignments and their counts, pushed at clock 0."""
    K = cfg.n_components
    rank = ctx.rank
    words, doc_ptr = part["words"], part["doc_ptr"]
    n_tokens = words.size
    doc_len = np.diff(doc_ptr)
    doc_idx = np.repeat(np.arange(doc_len.size, dtype=np.int64), doc_len)
    Vp = part["vocab"].size

    if cfg.z_in is None:  # random initial assignment, reproducible from the seed
        z = np.random.default_rng(np.random.SeedSequence(cfg.seeds[rank])).integers(K, size=n_tokens, dtype=np.int32)
        if cfg.z_kept is not None and part.get("row0") is not None:  # kept documents go on from where they were
            _kept.continue_kept(z, part["row0"], doc_ptr, cfg.z_kept, cfg.kept_ptr)
    else:
        z = np.array(ctx.pull(cfg.z_in[rank]), dtype=np.int32)
        if z.shape != (n_tokens,) or (z.size and (z.min() < 0 or z.max() >= K)):
            raise ValueError(
                f"LatentDirichletAllocation: saved assignments in table {cfg.z_in[rank]!r} do not fit "
                f"partition {rank} ({n_tokens} tokens, {K} topics)"
            )
    # The starting counts are this participant's first push: counted in one
    # compiled pass, straight into int32 rows (np.bincount's int64 rows x K,
    # then cast for the table, were two passes over 2x the bytes: 115 MB at
    # K=1000 on the benchmark corpus).
    ndk = np.zeros((doc_len.size, K), dtype=np.int32)
    rows = count_rows(part["vocab"], cfg)
    nwk0 = np.zeros((rows.size, K), dtype=np.int32 if n_tokens < 2**31 else np.int64)
    nk0 = np.zeros(K, dtype=np.int64)
    _k.init_counts(doc_ptr, words, z, ndk, nwk0[:Vp], nk0)
    if cfg.nk_name is None:
        nwk0[Vp] = nk0  # the totals row
    ctx.push_rows(cfg.nwk_name, rows, nwk0, copy=False)
    if cfg.nk_name is not None:
        ctx.push(cfg.nk_name, nk0, copy=False)
    ctx.clock()
    if cfg.start_name is not None:
        # Under staleness s a read at clock c is only guaranteed the clocks
        # < c - s: the first s sweeps (all of them under ASP) could read
        # tables without the other participants' starting counts, sample
        # their partition as if it were the whole corpus (topics that then do
        # not line up across partitions) and evaluate the starting state on a
        # fraction of the tokens (loglik_history_[0] came out better than
        # iteration 10). The first read of the count tables after the wait
        # goes to the servers (nothing is cached yet) and sees them all.
        wait_for_participants(ctx, cfg.start_name, "LatentDirichletAllocation", "starting counts")

    s = _Sampler(part, z, ndk, cfg, rank, ctx.n_participants)
    s.to_device(cfg, doc_idx)
    return s


def count_rows(vocab, cfg: GibbsConfig):
    """The word-topic table's rows a participant holding the words ``vocab``
    reads and pushes: theirs, and the totals row where the totals are in
    that table (``cfg.nk_name`` None)."""
    return vocab if cfg.nk_name is not None else np.append(vocab, cfg.n_features)


def _read_counts(ctx: ParticipantContext, s: _Sampler, cfg: GibbsConfig, ahead=None):
    """``(counts, nwk, nk)``: the rows of the words held (``nwk``) and the
    topic totals (``nk``, int64 as the samplers take them). With the totals
    in the word-topic table one read brings both, in one message per
    server: ``counts`` is what it returned, the rows and last the totals
    row, ``nwk`` a view of its rows; else ``counts`` is ``nwk``. ``ahead``:
    that read, started with the clock before (``_read_ahead``)."""
    if cfg.nk_name is not None:
        nwk = ctx.pull_rows(cfg.nwk_name, s.vocab)
        return nwk, nwk, ctx.pull(cfg.nk_name)
    counts = ctx.pull_rows(cfg.nwk_name, s.rows) if ahead is None else ahead.result()
    return counts, counts[:-1], counts[-1].astype(np.int64)


def _read_ahead(ctx: ParticipantContext, s: _Sampler, cfg: GibbsConfig, it):
    """The next iteration's read of the rows and the totals, started before
    this iteration's clock so that the clock's message to each server
    carries it (one request per server per iteration instead of two: the
    clock, then the read; issue 36). The server answers it once the
    clock's bound holds there; ``result()`` is what ``pull_rows`` would
    return at the next clock (the session reads again what it cannot
    serve). None after the last iteration, where ``cfg.read_ahead`` is off
    (``_runs.reads_ahead``), or where the totals are a table of their own."""
    if not cfg.read_ahead or it + 1 >= cfg.stop or cfg.nk_name is not None or not hasattr(ctx, "prefetch_rows"):
        return None
    return ctx.prefetch_rows(cfg.nwk_name, s.rows, for_clock=ctx.current_clock + 1)


def _iteration(ctx: ParticipantContext, s: _Sampler, cfg: GibbsConfig, it, ahead=None):
    """Iteration ``it``: pull the rows of the words held and the totals
    (``ahead``: that read, started with the clock before), evaluate when
    due, sweep, push what changed, clock; the next iteration's read, if
    started (``_read_ahead``)."""
    t0 = time.perf_counter()
    counts, nwk, nk = _read_counts(ctx, s, cfg, ahead)
    t1 = time.perf_counter()
    s.timing["pull_seconds"] += t1 - t0
    if cfg.evaluate_every > 0 and it % cfg.evaluate_every == 0:
        _evaluate(ctx, s, cfg, it, nwk, nk)
        s.timing["eval_seconds"] += time.perf_counter() - t1
    if cfg.progress_name is not None:
        _report_iteration(ctx, s, cfg, it)  # flushed by this iteration's clock
    totals_row = counts is not nwk
    nk_before = nk.copy()
    moved = None
    if not s.deltas_from_moves:
        counts_before = counts.copy()
        nwk, nk = _sweep(s, cfg, it, nwk, nk)
        t2 = time.perf_counter()
        if s.sampler != "array":
            if totals_row:
                counts[-1] = nk  # the CPU samplers update nwk, a view of counts, in place
            changed, delta = _k.changed_rows(counts, counts_before)
        else:
            delta = nwk - counts_before[:nwk.shape[0]]
            if totals_row:
                xp = arrays.namespace(delta)
                delta = xp.concatenate([delta, (nk - nk_before).astype(delta.dtype)[None]])
            # the changed words' indices to the host (push_rows takes host rows); the
            # counts stay where the tables are (on the device with device="cuda")
            changed = arrays.to_numpy(arrays.namespace(delta).flatnonzero(delta.any(axis=1)))
            delta = delta[changed]
    else:
        # The rows' change from the assignments that moved: O(tokens), where
        # comparing the rows before and after is several passes over all of
        # them (most of an iteration's push at K=1000).
        z_before = s.z.copy()
        nwk, nk = _sweep(s, cfg, it, nwk, nk)
        t2 = time.perf_counter()
        if s.deltas is None or s.deltas.dtype != nwk.dtype:
            s.deltas = np.zeros(counts.shape, dtype=nwk.dtype)  # with the totals row: a row more
        changed = _k.row_deltas_into(s.words, z_before, s.z, s.deltas, False)
        if totals_row:
            moved = changed.size
            s.deltas[moved] = nk - nk_before
            changed = np.append(changed, s.vocab.size)  # the totals row's local row
        delta = s.deltas[:changed.size]
    if changed.size:
        # copy=False: the buffer is zeroed again only after clock() returned (its flush acknowledged)
        ctx.push_rows(cfg.nwk_name, s.rows[changed], delta, copy=False)
    if not totals_row:
        ctx.push(cfg.nk_name, (nk - nk_before).astype(np.int64), copy=False)
    ahead = _read_ahead(ctx, s, cfg, it)
    t3 = time.perf_counter()
    # The flush and the clock's report in one hop; the cached rows, read
    # again next clock, are not written through first (Session.clock).
    ctx.clock()
    if s.deltas_from_moves:
        _k.row_deltas_into(s.words, z_before, s.z, s.deltas, True)
        if moved is not None:
            s.deltas[moved] = 0
    s.timing["push_seconds"] += t3 - t2
    s.timing["clock_seconds"] += time.perf_counter() - t3
    return ahead


def _lone_iterations(ctx: ParticipantContext, s: _Sampler, cfg: GibbsConfig):
    """Iterations ``cfg.start .. cfg.stop - 1`` of a run's lone participant
    (a small corpus, ``ps.lda.min-tokens-per-participant``): the rows of its
    words and the totals read once, after its starting counts; every sweep
    on those local copies; their change pushed once at the end, and one
    clock.

    The same chain as :func:`_iteration`'s: a lone participant's read at
    any clock holds the table's start plus its own pushes, which are its
    local counts after the sweeps before (integers: exact), so the reads
    per iteration returned what it already had. Saves a pull, a push and a
    clock (three round trips through the event loop) per iteration: most of
    a small fit's time (100 iterations of a few tokens took 0.7 s).
    ``ps.lda.lone-participant-local: false`` exchanges every iteration.

    It never clocks while it sweeps, so its progress on the ``/ps`` page is
    reported (``report_progress(clock=)``: the starting counts' clock and a
    clock per sweep, as the planned clocks count them) at most every
    ``cfg.report_seconds``, and after the last sweep."""
    t0 = time.perf_counter()
    _, nwk, nk = _read_counts(ctx, s, cfg)
    nwk_start, nk_start = nwk.copy(), nk.copy()
    s.timing["pull_seconds"] += time.perf_counter() - t0
    reported = time.perf_counter()
    for it in range(cfg.start, cfg.stop):
        evaluated = cfg.evaluate_every > 0 and it % cfg.evaluate_every == 0
        if evaluated:
            t1 = time.perf_counter()
            _evaluate(ctx, s, cfg, it, nwk, nk)
            s.timing["eval_seconds"] += time.perf_counter() - t1
        if cfg.progress_name is not None:
            _report_iteration(ctx, s, cfg, it)
            if evaluated:
                ctx.flush()  # no clock to flush it: the client's monitor reads it while the run goes on
        nwk, nk = _sweep(s, cfg, it, nwk, nk)
        now = time.perf_counter()
        if now - reported >= cfg.report_seconds or it == cfg.stop - 1:
            report_progress(ctx, clock=2 + it - cfg.start)  # clock 1: the starting counts
            if cfg.progress_name is not None:
                ctx.flush()  # the rows of the iterations since (a flush per sweep cost 0.16 ms each)
            reported = now
    t2 = time.perf_counter()
    delta = nwk - nwk_start
    changed = np.flatnonzero(delta.any(axis=1))
    rows, delta = s.vocab[changed], delta[changed]
    if cfg.nk_name is None:  # the totals row's change with the rows'
        rows = np.append(rows, cfg.n_features)
        delta = np.concatenate([delta, (nk - nk_start).astype(delta.dtype)[None]])
    if rows.size:
        ctx.push_rows(cfg.nwk_name, rows, delta)
    if cfg.nk_name is not None:
        ctx.push(cfg.nk_name, (nk - nk_start).astype(np.int64))
    t3 = time.perf_counter()
    ctx.clock()  # the pushes flushed and counted: a retry after them finds clock 1 (LostAssignmentsError)
    s.timing["push_seconds"] += t3 - t2
    s.timing["clock_seconds"] += time.perf_counter() - t3


# The columns of a row of the progress table (verbose or a progress bar),
# one row per participant and iteration of the run, read by
# ``_runs._Monitor``: the row of iteration ``it`` is written after its read
# (and evaluation, when due), the state after ``it`` sweeps. The columns
# from P_EVALUATED on are written on the evaluations only.
P_DONE, P_SECONDS, P_EVALUATED, P_LOGLIK, P_TOKEN_LOGLIK, P_READS, P_STALE_SUM, P_STALE_MAX = range(8)
PROGRESS_COLUMNS = 8


def _evaluate(ctx: ParticipantContext, s: _Sampler, cfg: GibbsConfig, it, nwk, nk):
    """The state after ``it`` sweeps as this participant sees it, kept in
    its history and (with a progress table) kept for
    :func:`_report_iteration` with the log-likelihood of its tokens and the
    staleness of its word-row reads since the last evaluation."""
    nwk, nk = arrays.to_host(nwk), arrays.to_host(nk)  # the log-likelihood terms run on the host
    ll = participant_loglik(s.local_ndk(), s.doc_len, nwk, s.weights, nk, cfg.alpha, cfg.beta, s.vbeta, s.P)
    s.history.append((it, time.time() - cfg.t_start, ll))
    # The dashboard's /ps page: minus the log-likelihood per token of this participant's part.
    report_progress(ctx, loss=-ll / max(int(s.z.size), 1))
    if cfg.progress_name is not None:
        s.evaluation = (1.0, ll, _token_loglik(s, cfg, nwk, nk), *_staleness_since_last_evaluation(ctx, s, cfg))


def _token_loglik(s: _Sampler, cfg: GibbsConfig, nwk, nk) -> float:
    """``sum over this participant's tokens of log sum_k theta_dk phi_kw``
    with theta and phi the sampler's estimates from its counts as it sees
    them: the verbose lines' perplexity (``exp(-sum / tokens)``), the
    training documents' perplexity as ``perplexity``/``bound_`` mean it
    (which fold theta in instead). O(tokens x K), on evaluations when
    progress is shown only."""
    if s.doc_words is None:
        s.doc_words = doc_word_entries(s.words, s.doc_ptr)
    ndk = s.local_ndk()
    K = ndk.shape[1]
    theta = (ndk + cfg.alpha) / (s.doc_len + K * cfg.alpha)[:, None]
    # phi_kw = (n_wk + beta) / (n_k + V beta), read from the counts as they are
    scale = 1.0 / (np.maximum(nk, 0) + s.vbeta).astype(np.float64)
    out = np.empty(s.doc_len.size)
    _k.doc_logliks(*s.doc_words, np.maximum(nwk, 0), float(cfg.beta), scale, theta, out)
    return float(out.sum())


def doc_word_entries(words, doc_ptr):
    """The documents' word counts as CSR arrays ``(indptr, words, counts)``
    from their tokens: a run of one word's tokens in a document is one entry
    (the partition's tokens are grouped so), a log per entry, not per token."""
    words = words.astype(np.int64)
    new_entry = np.ones(words.size, dtype=bool)
    new_entry[1:] = words[1:] != words[:-1]
    new_entry[doc_ptr[:-1][np.diff(doc_ptr) > 0]] = True
    starts = np.flatnonzero(new_entry)
    return (np.searchsorted(starts, doc_ptr).astype(np.int64), words[starts],
            np.diff(np.append(starts, words.size)).astype(np.float64))


def _report_iteration(ctx: ParticipantContext, s: _Sampler, cfg: GibbsConfig, it):
    """The progress row of iteration ``it`` (the state after ``it``
    sweeps): done, seconds since the fit started, and the evaluation's
    columns when ``it`` was evaluated."""
    row = np.zeros((1, PROGRESS_COLUMNS))
    row[0, P_DONE] = 1.0
    row[0, P_SECONDS] = time.time() - cfg.t_start
    if s.evaluation is not None:
        row[0, P_EVALUATED:] = s.evaluation
        s.evaluation = None
    # assign: a retried chunk rewrites, never adds
    ctx.push_rows(cfg.progress_name, [(it - cfg.start) * s.P + s.rank], row)


def _staleness_since_last_evaluation(ctx: ParticipantContext, s: _Sampler, cfg: GibbsConfig):
    """``(reads, summed staleness, max staleness)`` of this participant's
    reads of the word-topic rows since the last call (the session's
    staleness histogram: clocks between the reader and the state its read
    is guaranteed to hold)."""
    hist = {int(k): int(v) for k, v in ctx.metrics().get("tables", {}).get(cfg.nwk_name, {}).get(
        "staleness", {}).items()}
    new = {k: v - s.stale_seen.get(k, 0) for k, v in hist.items() if v > s.stale_seen.get(k, 0)}
    s.stale_seen = hist
    return sum(new.values()), sum(k * v for k, v in new.items()), max(new, default=0)


def _sweep(s: _Sampler, cfg: GibbsConfig, it, nwk, nk):
    """Resample every token once, updating the local copies of the counts."""
    # Iteration ``it``'s stream: the same as spawning ``it`` children of the
    # partition's seed, so a fit run in chunks samples like one run.
    seed = int(np.random.SeedSequence(cfg.seeds[s.rank], spawn_key=(it,)).generate_state(1)[0] & 0x7FFFFFFF)
    t0 = time.perf_counter()
    if s.sampler == "array":
        # The rows as read: on the device for device="cuda" (cuda count
        # tables), where the sampler updates them and the deltas are pushed
        # from; nothing crosses to the host.
        xp = s.xp
        nwk, nk = xp.asarray(nwk), xp.asarray(nk)
        _k.gibbs_sweep_array(xp, s.d_doc, s.d_words, s.d_z, s.d_ndk, nwk, nk, cfg.alpha, cfg.beta,
                             s.vbeta, seed)
    else:
        s.sweep(s.doc_ptr, s.words, s.z, s.ndk, nwk, nk, cfg.alpha, cfg.beta, s.vbeta, seed)
    dt = time.perf_counter() - t0
    s.sweep_seconds += dt
    s.sweeps.append(dt)
    if cfg.delay is not None:
        time.sleep(cfg.delay(s.rank, it, dt))  # benchmark hook: emulate stragglers
    return nwk, nk


def _finish(ctx: ParticipantContext, s: _Sampler, cfg: GibbsConfig) -> dict:
    """Write the final assignments (when kept) and report."""
    if cfg.z_out is not None:
        ctx.push(cfg.z_out[s.rank], np.asarray(s.local_z(), dtype=np.int32))
        ctx.flush()
    kept = {}
    if cfg.keep_rows is not None and s.row0 is not None:
        kept["kept"] = _kept.select_rows(s.row0, s.doc_ptr, np.asarray(s.local_z()), cfg.keep_rows)
    return {
        **kept,
        "history": s.history,
        "doc_loglik": _k.doc_loglik(s.local_ndk(), s.doc_len, cfg.alpha),
        "end": time.time() - cfg.t_start,
        "sweep_seconds": s.sweep_seconds,
        "sweeps": s.sweeps,
        **s.timing,
        "n_tokens": s.words.size,
        "peak_rows": s.peak_rows,
        # the last iteration's rows are still cached (S = 1): the most it held
        "peak_session_bytes": max(s.peak_session_bytes, ctx.held_bytes(cfg.nwk_name)),
        "metrics": ctx.metrics(),
    }
