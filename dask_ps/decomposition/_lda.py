"""Latent Dirichlet Allocation by collapsed Gibbs sampling on the parameter server.

The paper's application (Petuum/Bösen's LDA): the word-topic counts and the
topic totals are parameter-server tables; every participant keeps its own
documents, their topic assignments and doc-topic counts, and per iteration

    pull_rows(word-topic, its words) + pull(totals)
    → sample all its tokens (compiled kernel, updating its local copy: AD-LDA)
    → push_rows(word-topic, changed words, delta) + push(totals, delta)
    → clock()

It uses only the public ``dask_ps`` API (``ParameterServer``, ``run``, the
session's push/pull/clock and the consistency models).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
import uuid
import warnings
from numbers import Integral, Real

import dask
import numpy as np
import scipy.sparse as sp
from dask.utils import parse_bytes
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, _fit_context
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, check_non_negative, validate_data

import dask_ps
from dask_ps.consistency import as_consistency
from dask_ps.decomposition import _lda_kernels as _k

logger = logging.getLogger(__name__)

_MODEL_NAMES = {"bsp", "ssp", "essp", "vap", "cvap", "asp"}
_CHECKPOINT_KIND = "dask_ps.decomposition.LatentDirichletAllocation"
_DEFAULT_CHECKPOINT_EVERY = 10  # iterations per chunk when fault tolerance is on
_MAX_RESTARTS = 3  # chunks redone after lost workers, per fit (Dask's allowed-failures is 3 too)


# --- input helpers -----------------------------------------------------------------


def _is_dask_array(X) -> bool:
    return dask.is_dask_collection(X) and hasattr(X, "chunks") and getattr(X, "ndim", 0) == 2


def _is_cupy(X) -> bool:
    mod = type(X).__module__ or ""
    return mod.startswith("cupy") or mod.startswith("cupyx")


def _to_host(X):
    """cupy / cupyx.scipy.sparse -> numpy / scipy.sparse."""
    if _is_cupy(X):
        return X.get()
    return X


def _check_counts(X, whom: str, integer: bool = True):
    """Non-negative (and, with ``integer``, whole-number) counts; NaN/Inf are
    caught earlier by ``validate_data``."""
    check_non_negative(X, whom)
    if integer:
        data = X.data if sp.issparse(X) else np.asarray(X)
        if data.dtype.kind == "f" and data.size and not np.all(np.floor(data) == data):
            raise ValueError(
                f"{whom}: X must hold whole-number counts (document-term counts); "
                "got non-integer values. Round or scale them to counts first."
            )
        if data.dtype.kind == "b":
            return
        if data.dtype.kind not in "iuf":
            raise ValueError(f"{whom}: X must be numeric counts, got dtype {data.dtype}")


def _as_count_csr(X) -> sp.csr_matrix:
    """A private int64 CSR copy with duplicates summed and zeros removed."""
    X = sp.csr_matrix(X, copy=True)
    X.sum_duplicates()
    X.eliminate_zeros()
    if X.data.dtype != np.int64:
        X = sp.csr_matrix((X.data.astype(np.int64), X.indices, X.indptr), shape=X.shape)
    return X


def _prepare_part(block, n_features: int, check: bool):
    """One partition of the corpus as token arrays (runs on the worker that holds it).

    Returns ``vocab`` (global ids of the words it holds, sorted), ``words``
    (local word id per token, grouped by document) and ``doc_ptr``
    (token offsets of each document; empty documents have empty ranges).
    """
    block = _to_host(block)
    if not sp.issparse(block):
        block = np.asarray(block)
        if block.ndim != 2:
            raise ValueError(f"LatentDirichletAllocation.fit: chunks must be 2-D, got shape {block.shape}")
    if block.shape[1] != n_features:
        raise ValueError(
            f"LatentDirichletAllocation.fit: a chunk has {block.shape[1]} columns, expected {n_features}"
        )
    if check:
        data = block.data if sp.issparse(block) else block
        if data.dtype.kind == "f" and not np.all(np.isfinite(data)):
            raise ValueError("LatentDirichletAllocation.fit: Input X contains NaN or infinity.")
        _check_counts(block, "LatentDirichletAllocation.fit")
    X = _as_count_csr(block)
    vocab, local = np.unique(X.indices, return_inverse=True)
    words = np.repeat(local.astype(np.int32), X.data)
    doc_len = np.asarray(X.sum(axis=1)).ravel().astype(np.int64)
    doc_ptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(doc_len, out=doc_ptr[1:])
    return {"vocab": vocab.astype(np.int64), "words": words, "doc_ptr": doc_ptr}


def _part_stats(part):
    return part["doc_ptr"].size - 1, int(part["words"].size), part["vocab"]


def _split_rows(X: sp.csr_matrix, n_parts: int) -> list[sp.csr_matrix]:
    """Contiguous row ranges with about the same number of tokens each."""
    doc_len = np.asarray(X.sum(axis=1)).ravel()
    cum = np.cumsum(doc_len)
    total = cum[-1] if cum.size else 0
    cuts = np.searchsorted(cum, total * np.arange(1, n_parts) / n_parts, side="left") + 1
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 0, X.shape[0]), [X.shape[0]]]))
    return [X[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


class _Parts:
    """The prepared partitions (futures on the workers, one per participant)
    and how to make one again when the worker that held it died.

    In-memory input is split on the client and scattered (no lineage: a lost
    piece is split and scattered again from ``matrix``); a dask array's
    chunks are computed where Dask puts them and recomputed from the graph.
    """

    def __init__(self, client, uid, n_features, *, delayed=None, matrix=None, n_parts=None):
        self.client, self.uid, self.n_features = client, uid, n_features
        self._delayed, self._matrix, self._n_parts = delayed, matrix, n_parts
        self._made = 0
        if delayed is not None:
            blocks = client.compute(delayed)
            self.futures = [self._prepare(b, check=True) for b in blocks]
        else:
            pieces = client.scatter(_split_rows(matrix, n_parts), hash=False)
            self.futures = [self._prepare(p, check=False) for p in pieces]
        self._index = list(range(len(self.futures)))

    def _prepare(self, block, check):
        self._made += 1
        return self.client.submit(_prepare_part, block, n_features=self.n_features, check=check,
                                  key=f"lda-prepare-{self.uid}-{self._made}")

    def keep(self, indices):
        """Keep only these partitions (those with tokens), in this order."""
        self.futures = [self.futures[i] for i in indices]
        self._index = [self._index[i] for i in indices]

    def rebuild_lost(self):
        """Make again the partitions whose data is gone with a worker."""
        for j, fut in enumerate(self.futures):
            if fut.status not in ("error", "cancelled", "lost"):
                continue
            i = self._index[j]
            if self._delayed is not None:
                self.futures[j] = self._prepare(self.client.compute(self._delayed[i]), check=True)
            else:
                piece = _split_rows(self._matrix, self._n_parts)[i]
                self.futures[j] = self._prepare(self.client.scatter(piece, hash=False), check=False)
            logger.info("LatentDirichletAllocation: partition %d was lost with its worker; made again", i)

    def release(self):
        self.futures = []


class _AssignmentSets:
    """Two alternating sets of tables holding each participant's topic
    assignments (int32, assign rule, ``replication`` copies), named from
    ``z_id`` (a resumed checkpoint's, so that saves replace its tables).

    A chunk reads the last complete set and writes the other, so a chunk
    that fails half-way never damages the set it would be redone from."""

    def __init__(self, ps, z_id, part_tokens, replication):
        self.ps, self.part_tokens, self.replication = ps, part_tokens, replication
        self.names = [[f"lda-{z_id}-assignments{s}-{r}" for r in range(len(part_tokens))] for s in (0, 1)]

    def fresh(self, s):
        """(Re)create set ``s`` empty: the set a chunk writes holds nothing
        needed, also after its blocks were lost with a worker."""
        existing = set(self.ps.tables())
        for name, n in zip(self.names[s], self.part_tokens):
            if name in existing:
                self.ps.drop_table(name)
            self.ps.create_table(name, shape=(n,), dtype="int32", rule="assign",
                                 consistency=dask_ps.ASP(), replication=self.replication)


def _may_be_worker_loss(error) -> bool:
    """Whether a failed run's error can come from a lost worker (then the
    scheduler gets a moment to notice the death); bad input cannot."""
    from distributed.scheduler import KilledWorker

    return (isinstance(error, (LostAssignmentsError, dask_ps.PSError, KilledWorker, OSError))
            and not isinstance(error, ValueError))


def _lost_workers(client, members, wait=5.0) -> set:
    """Workers of ``members`` that left the cluster (waiting up to ``wait``
    seconds for the scheduler to notice a death that caused an error)."""
    deadline = time.monotonic() + wait
    while True:
        lost = set(members) - set(client.scheduler_info(n_workers=-1)["workers"])
        if lost or time.monotonic() > deadline:
            return lost
        time.sleep(0.2)


def _drop_tables(ps, names):
    for name in names:
        try:
            ps.drop_table(name)
        except Exception:  # pragma: no cover - cluster going away
            logger.warning("could not drop table %r", name, exc_info=True)


def _chunk_history(results, P):
    """Intermediate evaluations of one chunk: the sum of the participants' parts."""
    by_iter: dict[int, list] = {}
    for r in results:
        for it, sec, ll in r["history"]:
            by_iter.setdefault(it, []).append((sec, ll))
    return [
        (it, max(s for s, _ in v), float(sum(ll for _, ll in v)))
        for it, v in sorted(by_iter.items()) if len(v) == P
    ]


# --- the participant ------------------------------------------------------------------


def _xp_for(device):
    if device == "cuda":
        import cupy

        return cupy
    return np


class LostAssignmentsError(RuntimeError):
    """A participant was restarted mid-run (its worker died): the topic
    assignments it sampled since the run began are gone, while its pushes are
    on the servers, so it cannot simply go on. The estimator rolls the fit back
    to its last saved assignments when it has some (``replication >= 2`` or
    ``checkpoint``), otherwise the fit fails with this error."""


def _gibbs_participant(
    ctx,
    part,
    *,
    nwk_name,
    nk_name,
    progress_name,
    n_components,
    alpha,
    beta,
    n_features,
    start,
    stop,
    z_in,
    z_out,
    evaluate_every,
    seeds,
    holders,
    sampler,
    device,
    t_start,
    delay,
):
    """One partition's Gibbs sampler for iterations ``start .. stop - 1``:
    ``pull → sweep → push deltas → clock``.

    Clock 0 pushes the counts of the starting assignments -- random ones
    (``z_in`` None) or those saved in the table ``z_in[rank]`` -- into the
    run's fresh, empty count tables, so the tables always equal the sum of
    the participants' assignment counts. With ``z_out``, the final
    assignments are written (assign rule) to ``z_out[rank]`` before returning.
    """
    if ctx.current_clock != 0:
        raise LostAssignmentsError(
            "LatentDirichletAllocation: a participant was restarted mid-fit (its worker was lost) and "
            "its topic assignments are gone. Fit with replication=2 or checkpoint=<path> to resume "
            "from the last saved assignments instead."
        )
    K = n_components
    rank, P = ctx.rank, ctx.n_participants
    vocab, words, doc_ptr = part["vocab"], part["words"], part["doc_ptr"]
    n_tokens = words.size
    vbeta = n_features * beta
    doc_len = np.diff(doc_ptr)
    doc_idx = np.repeat(np.arange(doc_len.size, dtype=np.int64), doc_len)
    Vp = vocab.size

    if z_in is None:  # random initial assignment, reproducible from the seed
        z = np.random.default_rng(np.random.SeedSequence(seeds[rank])).integers(K, size=n_tokens, dtype=np.int32)
    else:
        z = np.array(ctx.pull(z_in[rank]), dtype=np.int32)
        if z.shape != (n_tokens,) or (z.size and (z.min() < 0 or z.max() >= K)):
            raise ValueError(
                f"LatentDirichletAllocation: saved assignments in table {z_in[rank]!r} do not fit "
                f"partition {rank} ({n_tokens} tokens, {K} topics)"
            )
    # The starting counts are this participant's first push.
    ndk = np.bincount(doc_idx * K + z, minlength=doc_len.size * K).astype(np.int32).reshape(-1, K)
    nwk0 = np.bincount(words.astype(np.int64) * K + z, minlength=Vp * K).reshape(Vp, K)
    ctx.push_rows(nwk_name, vocab, nwk0)
    ctx.push(nk_name, np.bincount(z, minlength=K).astype(np.int64))
    ctx.clock()

    weights = 1.0 / holders[vocab]  # each word's rows count once over all holders
    history = []
    sweep_seconds = 0.0

    if sampler == "array":
        xp = _xp_for(device)
        d_words = xp.asarray(words.astype(np.int64))
        d_doc = xp.asarray(doc_idx)
        d_z = xp.asarray(z)
        d_ndk = xp.asarray(ndk)
    else:
        sweep = _k.SWEEPS[sampler]

    def local_ndk():
        return ndk if sampler != "array" else _to_host(d_ndk)

    timing = {"pull_seconds": 0.0, "push_seconds": 0.0, "clock_seconds": 0.0, "eval_seconds": 0.0}
    for it in range(start, stop):
        t0 = time.perf_counter()
        nwk = ctx.pull_rows(nwk_name, vocab)
        nk = ctx.pull(nk_name)
        t1 = time.perf_counter()
        timing["pull_seconds"] += t1 - t0
        if evaluate_every > 0 and it % evaluate_every == 0:
            # The state after `it` sweeps as this participant sees it.
            ll = (
                _k.doc_loglik(local_ndk(), doc_len, alpha)
                + _k.word_loglik_rows(nwk, weights, beta)
                + _k.totals_loglik(nk, vbeta) / P
            )
            history.append((it, time.time() - t_start, ll))
            if progress_name is not None:
                row = (it // evaluate_every) * P + rank  # assign: a retried chunk rewrites, never adds
                ctx.push_rows(progress_name, [row], np.array([[ll, 1.0, history[-1][1]]]))
            timing["eval_seconds"] += time.perf_counter() - t1
        nwk_before = nwk.copy()
        nk_before = nk.copy()
        # Iteration ``it``'s stream: the same as spawning ``it`` children of the
        # partition's seed, so a fit run in chunks samples like one run.
        seed = int(np.random.SeedSequence(seeds[rank], spawn_key=(it,)).generate_state(1)[0] & 0x7FFFFFFF)
        t0 = time.perf_counter()
        if sampler == "array":
            d_nwk = xp.asarray(nwk)
            d_nk = xp.asarray(nk)
            _k.gibbs_sweep_array(xp, d_doc, d_words, d_z, d_ndk, d_nwk, d_nk, alpha, beta, vbeta, seed)
            nwk, nk = _to_host(d_nwk), _to_host(d_nk)
        else:
            sweep(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, seed)
        dt = time.perf_counter() - t0
        sweep_seconds += dt
        if delay is not None:
            time.sleep(delay(rank, it, dt))  # benchmark hook: emulate stragglers
        t2 = time.perf_counter()
        delta = nwk - nwk_before
        changed = np.flatnonzero(delta.any(axis=1))
        if changed.size:
            ctx.push_rows(nwk_name, vocab[changed], delta[changed])
        ctx.push(nk_name, (nk - nk_before).astype(np.int64))
        ctx.flush()
        t3 = time.perf_counter()
        ctx.clock()
        timing["push_seconds"] += t3 - t2
        timing["clock_seconds"] += time.perf_counter() - t3

    if z_out is not None:
        ctx.push(z_out[rank], np.asarray(_to_host(d_z) if sampler == "array" else z, dtype=np.int32))
        ctx.flush()
    return {
        "history": history,
        "doc_loglik": _k.doc_loglik(local_ndk(), doc_len, alpha),
        "end": time.time() - t_start,
        "sweep_seconds": sweep_seconds,
        **timing,
        "n_tokens": n_tokens,
        "metrics": ctx.metrics(),
    }


# --- document completion -----------------------------------------------------------


def _topic_word(components) -> np.ndarray:
    """Rows of ``components`` normalized to distributions, transposed to V x K."""
    comp = np.asarray(components, dtype=np.float64)
    return np.ascontiguousarray((comp / comp.sum(axis=1, keepdims=True)).T)


def _fold_in(phi_t, X: sp.csr_matrix, alpha, max_iter, tol) -> np.ndarray:
    theta = np.empty((X.shape[0], phi_t.shape[1]))
    _k.fold_in(
        X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data.astype(np.float64),
        phi_t, float(alpha), int(max_iter), float(tol), theta,
    )
    return theta


def document_completion(components, X, doc_topic_prior, *, max_iter=100, tol=0.0, random_state=0):
    """Held-out log-likelihood by document completion.

    Each token of every document of ``X`` goes to half A or B with
    probability 1/2 (a binomial split of each count, drawn from
    ``random_state``, so two models scored with the same seed see the same
    split); the document's topic proportions are fitted on A with the topics
    fixed (:func:`fold-in <LatentDirichletAllocation.transform>`: the EM
    fixed point with ``doc_topic_prior``, ``max_iter`` iterations, early stop
    when the mean absolute change falls below ``tol``), and B is scored:
    ``sum over tokens of B of log sum_k theta_dk phi_kw``.

    Parameters
    ----------
    components : array of shape (n_components, n_features)
        Topic-word pseudo-counts or probabilities of any model (rows are
        normalized here), e.g. ``LatentDirichletAllocation.components_``,
        scikit-learn's ``components_`` or the ``lda`` package's ``topic_word_``.
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
        Held-out document-term counts (non-negative integers).
    doc_topic_prior : float
    max_iter : int, default 100
    tol : float, default 0.0
    random_state : int, RandomState or None, default 0

    Returns
    -------
    loglik : float
        Total log-likelihood of the B halves (nats).
    n_tokens : int
        Number of tokens in the B halves; ``loglik / n_tokens`` is the
        held-out log-likelihood per token (BASELINES.md's metric).
    """
    X = _to_host(X)
    if not sp.issparse(X):
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {X.shape}")
    if X.shape[1] != np.shape(components)[1]:
        raise ValueError(
            f"X has {X.shape[1]} features, but the topics have {np.shape(components)[1]}"
        )
    if not np.all(np.isfinite(X.data if sp.issparse(X) else X)):
        raise ValueError("document_completion: Input X contains NaN or infinity.")
    _check_counts(X, "document_completion")
    X = _as_count_csr(X)
    rng = check_random_state(random_state)
    a = rng.binomial(X.data, 0.5)
    A = sp.csr_matrix((a.astype(np.float64), X.indices, X.indptr), shape=X.shape)
    B = sp.csr_matrix(((X.data - a).astype(np.float64), X.indices, X.indptr), shape=X.shape)
    B.eliminate_zeros()
    phi_t = _topic_word(components)
    theta = _fold_in(phi_t, A, doc_topic_prior, max_iter, tol)
    ll = _k.heldout_loglik(B.indptr.astype(np.int64), B.indices.astype(np.int64), B.data, phi_t, theta)
    return float(ll), int(B.data.sum())


# --- the estimator ------------------------------------------------------------------


class LatentDirichletAllocation(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Latent Dirichlet Allocation by distributed collapsed Gibbs sampling.

    The word-topic counts (``n_features x n_components``) and the topic
    totals live in two tables of a :class:`dask_ps.ParameterServer`; the
    documents are split into partitions, one participant each, which keep
    their tokens, topic assignments and doc-topic counts. Each iteration a
    participant pulls the rows of the words it holds, resamples all its
    tokens with a compiled kernel while updating its local copy of the
    counts (approximate distributed LDA, AD-LDA), pushes only the changed
    rows, and calls ``clock()``. How stale the rows it reads may be is the
    table's consistency model.

    Parameters
    ----------
    n_components : int, default 10
        Number of topics K.
    doc_topic_prior : float, default None
        Symmetric Dirichlet prior alpha of the doc-topic distributions;
        None means ``1 / n_components`` (as scikit-learn).
    topic_word_prior : float, default None
        Symmetric Dirichlet prior beta of the topic-word distributions;
        None means ``1 / n_components`` (as scikit-learn).
    max_iter : int, default 100
        Gibbs sweeps over the corpus (clocks).
    evaluate_every : int, default 10
        Record the training log-likelihood every this many iterations (and
        at the end) in ``loglik_history_``; <= 0 records only the end.
    consistency : dask_ps.Consistency or str, default None
        Consistency model of the word-topic table (``dask_ps.BSP()``,
        ``SSP(s)``, ``ESSP(s)``, ``VAP(v)``, ``CVAP(s, v)``, ``ASP()`` or a
        model name); None uses dask_ps's configured default model
        (``ps.consistency``, ``ps.staleness``: SSP(2)) with ``refresh=True``
        when it is SSP or ESSP: the first read of a row block in each clock
        goes to the servers, and waits only when the bound requires. On the
        straggler benchmark this ended within 0.5% of BSP's log-likelihood,
        where plain SSP(2) ended up to 1.2% below it. A model object is
        used as given.
    totals_consistency : dask_ps.Consistency or str, default None
        Consistency model of the topic-totals row. None: the word-topic
        model when that has staleness 0 (BSP), otherwise ``ASP()``. The
        totals are read from the servers once per clock and never wait, so
        they are at least as fresh as the word rows (Petuum keeps this row
        fresher than the others) without adding a barrier: a clocked model
        with a smaller staleness here would bound the whole run by it,
        because ``clock()`` waits for the tightest bound a participant uses.
    n_partitions : int, default None
        Number of participants for in-memory input; None: one per worker
        thread. A dask array input has one participant per row chunk.
    sampler : {"auto", "sparse", "dense", "array"}, default "auto"
        "dense": O(K) per token, compiled (numba) and SIMD-friendly;
        "sparse": SparseLDA bucket decomposition (numba; cost per token ~ the
        number of topics the word occurs in, better for large K); "array":
        batched vectorized sampling written against the array API (numpy on
        the CPU, cupy on the GPU: tokens of one batch are drawn in parallel
        from the counts at the batch's start). "auto": "array" on
        ``device="cuda"``, else "dense" for ``n_components < 128`` and
        "sparse" above (where each was faster on the benchmark corpora).
    device : {"auto", "cpu", "cuda"}, default "auto"
        Where participants sample. "auto": "cuda" for cupy input, else "cpu".
        The tables stay on the servers' host memory either way.
    max_doc_update_iter : int, default 100
        Fold-in iterations per document in ``transform`` and ``score``.
    mean_change_tol : float, default 1e-3
        Fold-in stops when the mean absolute change of a document's topic
        proportions falls below this.
    checkpoint : str or path-like, default None
        A directory (local, shared, or any fsspec URL the workers can write)
        where the topic assignments are saved every ``checkpoint_every``
        iterations with ``ParameterServer.save``. If it already holds a
        checkpoint of a fit of the same data and priors, ``fit`` resumes
        from it (a larger ``max_iter`` continues a finished fit; with
        ``n_partitions=None`` the documents are split as the saved fit split
        them, whatever the cluster's size now); a checkpoint of another fit
        is an error. A fit whose workers die
        is redone from the last checkpoint.
    checkpoint_every : int, default None
        Iterations between saved assignments (the chunk a lost worker can
        cost). None: 10 when ``checkpoint`` or ``replication`` asks for
        fault tolerance. Needs one of them.
    replication : int, default 1
        Copies (on different workers) of the saved assignments. With 2 or
        more, a fit survives up to ``replication - 1`` workers dying at once
        without a checkpoint: the chunk in progress is redone from the
        copies. The count tables are not replicated -- they are rebuilt
        from the assignments.
    client : distributed.Client, default None
        The cluster; None: the current client, else a ``LocalCluster``
        started once per process and closed at exit. Not pickled.
    random_state : int, RandomState instance or None, default None
    verbose : int, default 0
        > 0 logs (``logging``, logger ``dask_ps.decomposition._lda``) the
        training log-likelihood and tokens/s at every evaluation.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Topic-word pseudo-counts: word-topic counts + ``topic_word_prior``
        (normalize rows to get the topic-word distributions), as in
        scikit-learn.
    loglik_history_ : list of (iteration, seconds, loglik)
        Training log-likelihood ``log p(w, z)`` (the collapsed joint, as the
        ``lda`` package reports it) after ``iteration`` sweeps, ``seconds``
        after the start of ``fit``. Intermediate entries are the sum of each
        participant's part computed on its own (possibly stale) view: the
        documents it holds, the word rows it holds (each word weighed by 1 /
        number of holders) and 1 / P of the totals term; exact under BSP.
        The last entry (``iteration == n_iter_``) is computed from the final
        tables and is exact.
    n_iter_ : int
        Gibbs sweeps the final assignments have had: ``max_iter``, or more
        when a checkpoint that was already further along was resumed.
    n_restarts_ : int
        Chunks redone because a worker was lost (fault tolerance on).
    n_tokens_ : int
        Training tokens.
    fit_seconds_ : float
        Wall-clock seconds of the distributed sampling (the runs, and the
        checkpoints and restarts between them).
    tokens_per_second_ : float
        ``n_tokens_ * iterations trained in this call / fit_seconds_``.
    doc_topic_prior_, topic_word_prior_ : float
    random_state_ : RandomState
    n_features_in_ : int
    metrics_ : list of dict
        Per participant: the parameter-server session's counters (reads,
        cache hits, waits, staleness histogram, bytes), seconds spent
        sampling, pulling, pushing, in ``clock()`` and evaluating, its token
        count, and its own ``history`` of ``(iteration, seconds, loglik part)``.
        Of the fit's last run: with ``checkpoint`` or ``replication > 1`` the
        fit runs in chunks of ``checkpoint_every`` iterations, and these
        cover the last chunk only.

    Notes
    -----
    *Negative counts.* Pushes are exact deltas, so the word-topic counts are
    sums of non-negative per-participant counts; a participant's view mixes
    clocks under staleness but, with read-my-writes and per-row atomic
    pushes, cannot go below zero. The samplers nevertheless clamp every count
    at zero when computing probabilities (see ``_lda_kernels``), so a
    transiently negative count (e.g. after an aborted participant) is read as
    zero and never yields NaN.

    *Input.* Document-term counts: non-negative whole numbers (floats with
    integral values are accepted). Empty documents are allowed: they are
    skipped by the sampler and ``transform`` returns the uniform
    distribution for them; a corpus with no tokens at all is an error.
    ``transform`` accepts non-negative real weights.

    *Held-out score.* ``score`` and ``perplexity`` use document completion
    (:func:`document_completion`): each token of a document goes to half A
    or B at random (fixed seed 0, so all models see the same split), theta
    is fitted on A with the topics fixed, and B is scored.

    *Fault tolerance.* The count tables always equal the sum of the
    participants' assignment counts: each run starts from empty tables that
    every participant fills with the counts of its starting assignments.
    With ``replication >= 2`` or ``checkpoint``, the fit runs in chunks of
    ``checkpoint_every`` iterations and stores the assignments after each
    (two alternating sets of tables, so a chunk that fails half-way never
    damages the last complete one). When a worker dies, its participants
    lose their assignments (Dask retries them and they raise
    :class:`LostAssignmentsError`), the run is aborted, lost partitions of
    the input are made again, and the chunk is redone from the last
    complete set -- at most 3 times per fit (``n_restarts_``). Without
    either option a lost worker fails the fit with that error.

    Examples
    --------
    >>> from dask_ps.decomposition import LatentDirichletAllocation
    >>> lda = LatentDirichletAllocation(n_components=20, doc_topic_prior=0.1,
    ...                                 topic_word_prior=0.01, max_iter=200,
    ...                                 consistency=dask_ps.SSP(2), random_state=0)  # doctest: +SKIP
    >>> lda.fit(X).transform(X[:5])  # doctest: +SKIP
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "doc_topic_prior": [None, Interval(Real, 0, None, closed="neither")],
        "topic_word_prior": [None, Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "evaluate_every": [Integral],
        "consistency": [None, dask_ps.Consistency, StrOptions(_MODEL_NAMES)],
        "totals_consistency": [None, dask_ps.Consistency, StrOptions(_MODEL_NAMES)],
        "n_partitions": [None, Interval(Integral, 1, None, closed="left")],
        "sampler": [StrOptions({"auto", "sparse", "dense", "array"})],
        "device": [StrOptions({"auto", "cpu", "cuda"})],
        "max_doc_update_iter": [Interval(Integral, 0, None, closed="left")],
        "mean_change_tol": [Interval(Real, 0, None, closed="left")],
        "checkpoint": [str, os.PathLike, None],
        "checkpoint_every": [Interval(Integral, 1, None, closed="left"), None],
        "replication": [Interval(Integral, 1, None, closed="left")],
        "client": "no_validation",
        "random_state": ["random_state"],
        "verbose": ["verbose"],
    }

    def __init__(
        self,
        n_components=10,
        *,
        doc_topic_prior=None,
        topic_word_prior=None,
        max_iter=100,
        evaluate_every=10,
        consistency=None,
        totals_consistency=None,
        n_partitions=None,
        sampler="auto",
        device="auto",
        max_doc_update_iter=100,
        mean_change_tol=1e-3,
        checkpoint=None,
        checkpoint_every=None,
        replication=1,
        client=None,
        random_state=None,
        verbose=0,
    ):
        self.n_components = n_components
        self.doc_topic_prior = doc_topic_prior
        self.topic_word_prior = topic_word_prior
        self.max_iter = max_iter
        self.evaluate_every = evaluate_every
        self.consistency = consistency
        self.totals_consistency = totals_consistency
        self.n_partitions = n_partitions
        self.sampler = sampler
        self.device = device
        self.max_doc_update_iter = max_doc_update_iter
        self.mean_change_tol = mean_change_tol
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.replication = replication
        self.client = client
        self.random_state = random_state
        self.verbose = verbose

    # --- sklearn plumbing ------------------------------------------------------------------
    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.positive_only = True
        tags.transformer_tags.preserves_dtype = ["float64"]
        tags.non_deterministic = True
        return tags

    def __getstate__(self):
        state = super().__getstate__()
        if state.get("client") is not None:  # a Client is a live connection: not pickled
            state = dict(state)
            state["client"] = None
        return state

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def _more_validate_params(self, device):
        if self.sampler in ("sparse", "dense") and device == "cuda":
            raise ValueError(
                f"sampler={self.sampler!r} runs on the CPU (numba); use sampler='array' or 'auto' "
                "with device='cuda'"
            )
        if self.checkpoint_every is not None and self.checkpoint is None and self.replication < 2:
            raise ValueError(
                "checkpoint_every is set but there is nothing to save to: pass checkpoint=<path> "
                "and/or replication >= 2"
            )
        if self.client is not None and not hasattr(self.client, "scheduler_info"):
            raise TypeError(f"client must be a distributed.Client or None, got {type(self.client).__name__}")

    def _resolved(self, X):
        device = self.device
        if device == "auto":
            device = "cuda" if _is_cupy(X) else "cpu"
        sampler = self.sampler
        if sampler == "auto":
            sampler = "array" if device == "cuda" else ("dense" if self.n_components < 128 else "sparse")
        return device, sampler

    def _consistencies(self):
        word = as_consistency(self.consistency)
        if self.consistency is None and hasattr(word, "refresh"):
            # LDA's own default: read the word rows fresh when cheap. Topics
            # move fast early on; rows s clocks old cost more log-likelihood
            # per iteration than the one read per clock costs time
            # (docs/benchmarks.md, LDA part 2).
            word = dataclasses.replace(word, refresh=True)
        if self.totals_consistency is not None:
            totals = as_consistency(self.totals_consistency)
        elif word.staleness == 0:
            totals = word
        else:
            totals = dask_ps.ASP()
        return word, totals

    # --- fit ----------------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the topics to document-term counts ``X`` by collapsed Gibbs sampling.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            Document-term counts. A dask array (numpy or scipy.sparse chunks)
            stays on the workers: each row chunk is one participant, run
            where the chunk is.
        y : ignored

        Returns
        -------
        self
        """
        device, sampler = self._resolved(X)
        self._more_validate_params(device)
        self.random_state_ = check_random_state(self.random_state)
        K = self.n_components
        self.doc_topic_prior_ = 1.0 / K if self.doc_topic_prior is None else float(self.doc_topic_prior)
        self.topic_word_prior_ = 1.0 / K if self.topic_word_prior is None else float(self.topic_word_prior)
        word_model, totals_model = self._consistencies()

        ps = dask_ps.get_parameter_server(self.client)
        client = ps.client
        uid = uuid.uuid4().hex[:10]
        checkpoint = None if self.checkpoint is None else os.fspath(self.checkpoint)
        meta = dask_ps.checkpoint_metadata(checkpoint) if checkpoint is not None else None
        if _is_dask_array(X):
            if math.isnan(X.shape[1]):
                raise ValueError("LatentDirichletAllocation.fit: the number of columns of X must be known")
            self.n_features_in_ = int(X.shape[1])
            if len(X.chunks[1]) > 1:
                X = X.rechunk({1: -1})
            parts = _Parts(client, uid, self.n_features_in_, delayed=list(X.to_delayed()[:, 0]))
        else:
            X = _to_host(X)
            X = validate_data(
                self, X, reset=True, accept_sparse="csr",
                dtype=[np.float64, np.float32, np.int64, np.int32, np.int16, np.int8, np.uint32, np.uint16, np.uint8],
            )
            _check_counts(X, "LatentDirichletAllocation.fit")
            X = _as_count_csr(X)
            # A resumed fit splits the documents as the saved one did, whatever
            # the cluster's size now.
            n_parts = self.n_partitions or (meta or {}).get("n_parts") or max(
                1, sum(w.get("nthreads", 1) for w in client.scheduler_info(n_workers=-1)["workers"].values())
            )
            parts = _Parts(client, uid, self.n_features_in_, matrix=X, n_parts=n_parts)
        stats = client.gather(client.map(_part_stats, parts.futures,
                                         key=[f"lda-stats-{uid}-{i}" for i in range(len(parts.futures))]))
        n_tokens = sum(s[1] for s in stats)
        if n_tokens == 0:
            raise ValueError("LatentDirichletAllocation.fit: X has no tokens (every document is empty)")
        parts.keep([i for i, s in enumerate(stats) if s[1] > 0])
        V = self.n_features_in_
        holders = np.zeros(V, dtype=np.float64)
        part_tokens = [int(s[1]) for s in stats if s[1] > 0]
        for s in stats:
            if s[1] > 0:
                holders[s[2]] += 1
        holders[holders == 0] = 1.0
        self.n_tokens_ = int(n_tokens)
        P = len(part_tokens)
        del stats

        count_dtype = np.int32 if n_tokens < 2**31 - 1 else np.int64
        n_servers = max(1, len(ps.servers))
        row_bytes = K * np.dtype(count_dtype).itemsize
        block_rows = max(1, min(parse_bytes(dask.config.get("ps.block-bytes", "4MiB")) // row_bytes,
                                -(-V // (4 * n_servers))))
        seeds = [int(s) for s in self.random_state_.randint(0, 2**31 - 1, size=P)]
        evaluate_every = self.evaluate_every if self.evaluate_every > 0 else 0
        n_evals = (self.max_iter + evaluate_every - 1) // evaluate_every if evaluate_every else 0
        beta = self.topic_word_prior_

        # Fault tolerance: train in chunks of ``checkpoint_every`` iterations;
        # after each, the assignments go to one of two alternating sets of
        # tables (replicated, and saved when checkpointing). A chunk that
        # loses a worker is redone from the last complete set.
        tolerant = checkpoint is not None or self.replication > 1
        every = (self.checkpoint_every or _DEFAULT_CHECKPOINT_EVERY) if tolerant else max(1, self.max_iter)
        fingerprint = {
            "n_components": K, "doc_topic_prior": self.doc_topic_prior_, "topic_word_prior": beta,
            "n_features": V, "part_tokens": part_tokens,
        }
        z_id, good, history = uid, None, []
        if meta is not None:  # a checkpoint is there ({} if saved without metadata: not ours)
            self._check_resumable(meta, fingerprint, checkpoint)
            z_id, good, history = meta["z_id"], (int(meta["set"]), int(meta["iteration"])), [
                tuple(h) for h in meta["history"]]
        sets = _AssignmentSets(ps, z_id, part_tokens, min(self.replication, n_servers)) if tolerant else None

        created = []
        results = None
        n_restarts = 0
        t_start = time.time()
        t0 = time.perf_counter()
        first_iteration = good[1] if good else 0
        try:
            if tolerant:
                created.extend(sets.names[0] + sets.names[1])
                if good is not None:
                    ps.load(checkpoint, tables=sets.names[good[0]], overwrite=True)
                for s in (0, 1):
                    if good is None or s != good[0]:
                        sets.fresh(s)
            current = good
            while True:
                start = current[1] if current else 0
                stop = min(self.max_iter, start + every) if start < self.max_iter else start
                out = (1 - good[0] if good else 0) if tolerant else None
                tag = f"{uid}-{n_restarts}-{start}"
                nwk_name, nk_name = f"lda-{tag}-word-topic", f"lda-{tag}-topic-totals"
                progress_name = f"lda-{tag}-progress" if self.verbose and n_evals else None
                members = set(client.scheduler_info(n_workers=-1)["workers"])
                chunk_tables = []
                monitor = None
                try:
                    ps.create_table(nwk_name, shape=(V, K), dtype=count_dtype, consistency=word_model,
                                    block_rows=block_rows)
                    chunk_tables.append(nwk_name)
                    ps.create_table(nk_name, shape=(K,), dtype="int64", consistency=totals_model)
                    chunk_tables.append(nk_name)
                    if progress_name is not None:
                        ps.create_table(progress_name, shape=(n_evals * P, 3), dtype="float64",
                                        rule="assign", consistency=dask_ps.ASP())
                        chunk_tables.append(progress_name)
                        monitor = _Monitor(ps, progress_name, P, evaluate_every, n_tokens, t_start,
                                           first=-(-start // evaluate_every))
                        monitor.start()
                    # ``_sweep_delay`` (not a parameter): a benchmark hook, a picklable
                    # ``f(rank, iteration, sweep_seconds) -> seconds`` that participants
                    # sleep after each sweep to emulate stragglers.
                    results = ps.run(
                        _gibbs_participant, parts.futures,
                        nwk_name=nwk_name, nk_name=nk_name, progress_name=progress_name, n_components=K,
                        alpha=self.doc_topic_prior_, beta=beta, n_features=V, start=start, stop=stop,
                        z_in=sets.names[current[0]] if current else None,
                        z_out=sets.names[out] if tolerant else None,
                        evaluate_every=evaluate_every, seeds=seeds, holders=holders,
                        sampler=sampler, device=device, t_start=t_start,
                        delay=getattr(self, "_sweep_delay", None),
                    )
                    if stop >= self.max_iter:
                        nwk = np.maximum(ps.pull(nwk_name), 0)
                        nk = np.maximum(ps.pull(nk_name), 0)
                except Exception as e:
                    lost = (_lost_workers(client, members, wait=5.0 if _may_be_worker_loss(e) else 0.0)
                            if tolerant else set())
                    if not lost or n_restarts >= _MAX_RESTARTS:
                        raise
                    n_restarts += 1
                    current = good
                    logger.warning(
                        "LatentDirichletAllocation: worker(s) %s lost during iterations %d-%d (%s: %s); "
                        "redoing from iteration %d (restart %d of at most %d)",
                        sorted(lost), start, stop, type(e).__name__, e, current[1] if current else 0,
                        n_restarts, _MAX_RESTARTS,
                    )
                    ps.wait_for_placement()
                    sets.fresh(1 - good[0] if good else 0)  # the set the redo writes
                    parts.rebuild_lost()
                    continue
                finally:
                    if monitor is not None:
                        monitor.stop()
                    _drop_tables(ps, chunk_tables)
                history.extend(_chunk_history(results, P))
                if tolerant:
                    current = (out, stop)
                    if checkpoint is None:
                        good = current
                    elif self._save(ps, checkpoint, sets.names[out], {
                        "estimator": _CHECKPOINT_KIND, "z_id": z_id, "set": out, "iteration": stop,
                        "n_parts": None if _is_dask_array(X) else n_parts,
                        "history": [list(h) for h in history], **fingerprint,
                    }):
                        good = current
                if stop >= self.max_iter:
                    break
        finally:
            _drop_tables(ps, created)
            parts.release()
        t_end = time.perf_counter() - t0

        self.components_ = nwk.T.astype(np.float64) + beta
        # A resumed checkpoint may already be past max_iter: report what the
        # assignments have had.
        self.n_iter_ = stop
        self.n_restarts_ = n_restarts
        self.fit_seconds_ = t_end
        trained = max(0, stop - first_iteration)
        self.tokens_per_second_ = n_tokens * trained / t_end if t_end > 0 else float("nan")
        self.metrics_ = [
            {**r["metrics"], **{k: r[k] for k in (
                "sweep_seconds", "pull_seconds", "push_seconds", "clock_seconds", "eval_seconds", "n_tokens",
                "history")}}
            for r in results
        ]
        final = (
            sum(r["doc_loglik"] for r in results)
            + _k.word_loglik_rows(nwk, np.ones(V), beta)
            + _k.totals_loglik(nk, V * beta)
        )
        history.append((stop, time.time() - t_start, float(final)))
        self.loglik_history_ = history
        if self.verbose:
            logger.info(
                "LatentDirichletAllocation: %d iterations, %d tokens, %d participants, %.1f s, "
                "%.3g tokens/s, log-likelihood %.6g",
                self.max_iter, n_tokens, P, t_end, self.tokens_per_second_, final,
            )
        return self

    # --- checkpoints ----------------------------------------------------------------------
    def _check_resumable(self, meta, fingerprint, path):
        where = f"the checkpoint at {path!r}"
        if meta.get("estimator") != _CHECKPOINT_KIND:
            raise ValueError(
                f"{where} holds {meta.get('estimator') or 'tables of something else'}, not a "
                "LatentDirichletAllocation fit; use another checkpoint path"
            )
        diffs = [f"{k}: saved {meta.get(k)!r}, now {v!r}" for k, v in fingerprint.items() if meta.get(k) != v]
        if diffs:
            raise ValueError(
                f"{where} belongs to another fit ({'; '.join(diffs)}): use another checkpoint path, or "
                "delete that checkpoint to start over"
            )

    def _save(self, ps, path, tables, metadata) -> bool:
        """``ps.save`` between two chunks; on failure warn and go on (the
        previous checkpoint stays the one to resume from)."""
        try:
            ps.save(path, tables=tables, metadata=metadata)
            return True
        except Exception as e:
            warnings.warn(f"LatentDirichletAllocation: checkpoint after iteration {metadata['iteration']} "
                          f"not saved: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
            return False

    # --- inference -----------------------------------------------------------------------
    def _check_X(self, X, whom, integer):
        X = _to_host(X)
        X = validate_data(self, X, reset=False, accept_sparse="csr", dtype=[np.float64, np.float32])
        _check_counts(X, whom, integer=integer)
        return X

    def transform(self, X):
        """Doc-topic distributions of ``X`` with the topics fixed (fold-in).

        The EM fixed point ``theta_k <- (sum_w x_w r_wk + alpha) / (n_d + K alpha)``
        with ``r_wk = theta_k phi_kw / sum_j theta_j phi_jw``, from the uniform
        start, ``max_doc_update_iter`` iterations at most per document. Runs
        locally (no cluster); a dask array is transformed chunk by chunk,
        lazily.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            Non-negative counts (or weights).

        Returns
        -------
        ndarray of shape (n_samples, n_components)
            Rows sum to 1; empty documents get the uniform distribution.
        """
        check_is_fitted(self)
        if _is_dask_array(X):
            if X.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input."
                )
            if len(X.chunks[1]) > 1:
                X = X.rechunk({1: -1})
            return X.map_blocks(
                self.transform, dtype=np.float64, chunks=(X.chunks[0], (self.components_.shape[0],)),
                meta=np.empty((0, 0)),
            )
        X = self._check_X(X, "LatentDirichletAllocation.transform", integer=False)
        X = sp.csr_matrix(X, dtype=np.float64)
        X.sum_duplicates()
        return _fold_in(
            _topic_word(self.components_), X, self.doc_topic_prior_, self.max_doc_update_iter,
            self.mean_change_tol,
        )

    def _completion(self, X):
        check_is_fitted(self)
        if _is_dask_array(X):
            X = X.compute()
        X = self._check_X(X, "LatentDirichletAllocation.score", integer=True)
        return document_completion(
            self.components_, X, self.doc_topic_prior_, max_iter=self.max_doc_update_iter,
            tol=self.mean_change_tol, random_state=0,
        )

    def score(self, X, y=None):
        """Held-out log-likelihood of ``X`` by document completion (total, nats).

        See :func:`document_completion`: each document's tokens are split at
        random (fixed seed) into halves A and B; theta is fitted on A with the
        topics fixed and the log-likelihood of B is returned. Divide by the
        number of B tokens (or use :meth:`perplexity`) for a per-token value.
        """
        return self._completion(X)[0]

    def perplexity(self, X):
        """``exp(-loglik / n_tokens)`` of the document-completion estimate
        (see :meth:`score`); lower is better."""
        ll, n = self._completion(X)
        if n == 0:
            raise ValueError("perplexity: the held-out halves of X have no tokens")
        return float(np.exp(-ll / n))


class _Monitor(threading.Thread):
    """Logs the training log-likelihood as participants report it (verbose).

    Participant ``r`` writes ``(loglik part, 1, seconds)`` into row
    ``(it // evaluate_every) * P + r`` of a small assign table; an evaluation
    is complete when all its P rows are written. ``first``: the first
    evaluation of this chunk."""

    def __init__(self, ps, table, n_participants, evaluate_every, n_tokens, t_start, period=0.5, first=0):
        super().__init__(daemon=True, name="lda-progress")
        self.ps, self.table, self.P = ps, table, n_participants
        self.every, self.n_tokens, self.t_start, self.period = evaluate_every, n_tokens, t_start, period
        self._stop_event = threading.Event()
        self._logged = first
        self._last = (0.0, 0)

    def stop(self):
        self._stop_event.set()
        self.join(timeout=10)

    def _poll(self):
        prog = self.ps.pull(self.table).reshape(-1, self.P, 3)
        while self._logged < len(prog) and np.all(prog[self._logged, :, 1] >= 1):
            ll = float(prog[self._logged, :, 0].sum())
            sec = float(prog[self._logged, :, 2].mean())
            it = self._logged * self.every
            t0, it0 = self._last
            rate = self.n_tokens * (it - it0) / (sec - t0) if it > it0 and sec > t0 else float("nan")
            logger.info("iteration %d: log-likelihood %.6g, %.3g tokens/s (%.1f s)", it, ll, rate, sec)
            self._last = (sec, it)
            self._logged += 1

    def run(self):
        try:
            while not self._stop_event.wait(self.period):
                self._poll()
            self._poll()
        except Exception:  # the cluster went away: progress is best effort
            logger.debug("progress monitor stopped", exc_info=True)
