"""``LatentDirichletAllocation``: LDA by collapsed Gibbs sampling on the
parameter server (the seed paper's application).

The estimator validates, cuts the fit into runs (``_runs``) of the Gibbs
participant (``_gibbs``) and scores with ``_scoring``; how the pieces fit is
the "Estimators: LDA" section of ``docs/architecture.rst``. It uses only the
public ``dask_ps`` API and the shared estimator machinery
(``dask_ps._estimators``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
import uuid
import warnings
from numbers import Integral, Real

import dask
import numpy as np
import scipy.sparse as sp
from dask.utils import parse_bytes
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, _fit_context
from sklearn.decomposition import LatentDirichletAllocation as _SkLDA
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import validate_data

import dask_ps
from dask_ps._estimators import (
    SHARED_CONSTRAINTS,
    Progress,
    PSEstimatorMixin,
    arrays,
    check_checkpoint,
    dask_feature_names,
    is_dask_array,
    is_dask_collection,
    is_dask_dataframe,
    max_participants,
    participant_metrics,
    rate,
    run_info,
    setting,
)
from dask_ps.consistency import as_consistency
from dask_ps.decomposition._corpus import count_matrix, warn_rounded
from dask_ps.decomposition._runs import (
    CHECKPOINT_KIND,
    OWNER,
    GibbsRuns,
    RunPlan,
    corpus_layout,
    end_of_fit_lines,
    make_parts,
    totals_in_word_table,
)
from dask_ps.decomposition import _kept
from dask_ps.decomposition._bound import DeferredBound, PendingBound, training_bound
from dask_ps.decomposition._inference import TopicInference
from dask_ps.decomposition._scoring import components_dtype, final_loglik, topic_word_components

logger = logging.getLogger(__name__)

_MODEL_NAMES = {"bsp", "ssp", "essp", "vap", "cvap", "asp"}

# scikit-learn's parameters of online variational Bayes that a collapsed
# Gibbs sampler has no use for, with their defaults: set otherwise, a fit
# says so (issue 35: they were accepted and silently did nothing).
_VB_ONLY = {"learning_decay": 0.7, "learning_offset": 10.0, "batch_size": 128, "perp_tol": 0.1}


def _seeded(random_state) -> bool:
    """An int ``random_state``: the user asks for the same model every fit."""
    return isinstance(random_state, Integral) and not isinstance(random_state, bool)


def _warn_ignored(est, partial: bool) -> None:
    """A ``UserWarning`` naming each online-VB parameter set to something
    the Gibbs sampler would ignore (``learning_method`` only in ``fit``:
    scikit-learn's ``partial_fit`` ignores it too)."""
    ignored = [f"{k}={getattr(est, k)!r}" for k, default in _VB_ONLY.items() if getattr(est, k) != default]
    if est.learning_method == "online" and not partial:
        ignored.insert(0, "learning_method='online'")
    if ignored:
        warnings.warn(
            f"LatentDirichletAllocation: {', '.join(ignored)} ignored: dask_ps samples the topics by "
            "collapsed Gibbs sampling, every iteration a sweep over all the documents, with no step size "
            "or minibatch (scikit-learn's online variational Bayes); to add documents to a fitted model, "
            "call partial_fit.", UserWarning, stacklevel=4)


class LatentDirichletAllocation(TopicInference, PSEstimatorMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin,
                                BaseEstimator):
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
    learning_method : {"batch", "online"}, default "batch"
        Accepted for scikit-learn compatibility (its batch or online
        variational Bayes); "online" makes :meth:`fit` warn
        (``UserWarning``) that it is ignored: every iteration is a collapsed
        Gibbs sweep over all the documents, whose counts are exact sums of
        the assignments, so there is no step size to decay and no
        minibatch to draw. To train on a stream of documents, call
        :meth:`partial_fit` (which resamples a share of the earlier
        documents with each call's).
    learning_decay, learning_offset : float, default 0.7 and 10.0
        Validated as scikit-learn does; any other value makes ``fit`` and
        ``partial_fit`` warn that it is ignored (online variational Bayes'
        step size ``(learning_offset + t) ** -learning_decay``).
    max_iter : int, default 100
        Gibbs sweeps over the corpus (clocks); in :meth:`partial_fit`,
        sweeps over the new documents.
    batch_size : int, default 128
        Validated; any other value makes ``fit`` and ``partial_fit`` warn
        that it is ignored (the documents of one online update in
        scikit-learn; a Gibbs sweep takes all of a participant's partition).
    evaluate_every : int, default 10
        Record the training log-likelihood every this many iterations (and
        at the end) in ``loglik_history_``; <= 0 records only the end. With
        ``verbose``, the lines of these iterations carry the perplexity.
    total_samples : float, default 1e6
        The corpus size ``perplexity(X, sub_sampling=True)`` scales ``X``'s
        document terms to, as scikit-learn's (it also scales its online
        updates by it; the sampler has none).
    perp_tol : float, default 0.1
        Validated; any other value makes ``fit`` and ``partial_fit`` warn
        that it is ignored: the fit runs ``max_iter`` sweeps (scikit-learn
        stops early when the perplexity changes by less).
    consistency : dask_ps.Consistency or str, default None
        Consistency model of the word-topic table (``dask_ps.BSP()``,
        ``SSP(s)``, ``ESSP(s)``, ``VAP(v)``, ``CVAP(s, v)``, ``ASP()`` or a
        model name). None: with an int ``random_state``, ``BSP()``, so that
        the same seed gives the same model, as scikit-learn's does (see
        Notes, *Reproducibility*); otherwise dask_ps's configured default
        model (``ps.consistency``, ``ps.staleness``: SSP(2)) with
        ``refresh=True`` when it is SSP or ESSP: the first read of a row
        block in each clock goes to the servers, and waits only when the
        bound requires (see ``docs/consistency.rst``). A model object is
        used as given.
    totals_consistency : dask_ps.Consistency or str, default None
        Consistency model of the topic-totals row. None: where the word rows
        are read from the servers every clock (staleness 0, or ``refresh``:
        the default), the totals are a row of the word-topic table, read and
        pushed with the rows in the same messages, under their model;
        otherwise ``ASP()``, read from the servers once per clock without
        waiting (Petuum keeps this row fresher than the others). A clocked
        model with a smaller staleness here bounds the whole run by it.
    n_partitions : int, default None
        Number of participants for in-memory input; None: one per worker
        thread (or ``n_jobs``), but at most one per
        ``ps.lda.min-tokens-per-participant`` tokens (200,000, times
        sqrt(K / 50) past K = 50: a small corpus is sampled by one
        participant, faster and reproducible under any consistency
        model). A dask array input has one participant per row chunk.
    n_jobs : int, default None
        The number of participants an in-memory input is split into when
        ``n_partitions`` is None (scikit-learn's number of parallel jobs):
        None or -1, one per worker thread; ``-2``, all but one; ``k > 0``,
        ``k``. Small corpora get fewer (see ``n_partitions``).
    sampler : {"auto", "sparse", "dense", "array"}, default "auto"
        "dense": O(K) per token, compiled (numba) and SIMD-friendly;
        "sparse": SparseLDA's three buckets (numba; cost per token ~ the
        numbers of topics the word and the document occur in, not K; better
        for large K); "array":
        batched vectorized sampling written against the array API (numpy on
        the CPU, cupy on the GPU: tokens of one batch are drawn in parallel
        from the counts at the batch's start). "auto": "array" on
        ``device="cuda"``, else "dense" for ``n_components < 128`` and
        "sparse" above (where each was faster on the benchmark corpora).
    vocabulary_slices : int, default 1
        LightLDA's model slices, for word-topic rows larger than a worker's
        memory: each iteration a participant reads, samples and pushes the
        rows of its words one slice of its vocabulary at a time, so it holds
        about ``1 / vocabulary_slices`` of them (``metrics_``'s
        ``peak_rows``) and sends more messages. CPU samplers.
    device : {"auto", "cpu", "cuda"}, default "auto"
        Where participants sample. "auto": "cuda" for cupy input, else "cpu".
        The tables stay on the servers' host memory either way.
    max_doc_update_iter : int, default 100
        Fold-in iterations per document in ``transform``, ``score``,
        ``perplexity`` and ``bound_``.
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
        cost). None: ``ps.lda.checkpoint-every`` (10) when ``checkpoint``
        or ``replication`` asks for fault tolerance. Needs one of them.
    replication : int, default 1
        Copies (on different workers) of the saved assignments. With 2 or
        more, a fit survives up to ``replication - 1`` workers dying at once
        without a checkpoint: the chunk in progress is redone from the
        copies. The count tables are not replicated -- they are rebuilt
        from the assignments.
    client : distributed.Client or str, default None
        The cluster (a ``Client`` or a scheduler address); None: the current
        client, else the embedded cluster (in-process by default,
        ``ps.embedded-cluster``) started once per process and closed at
        exit. A ``Client`` is not pickled.
    random_state : int, RandomState instance or None, default None
        Seeds the starting assignments and every partition's sampler. An
        int makes the fit reproducible at the default ``consistency`` (then
        BSP; see Notes).
    verbose : int, default 0
        > 0 prints, while the fit runs, scikit-learn's lines: one per
        iteration ``n = 1 .. max_iter`` (the state after ``n`` sweeps),
        ``"iteration: n of max_iter: M"``, and on the iterations that are
        multiples of ``evaluate_every``
        ``"iteration: n of max_iter: M, perplexity: P"`` followed on the
        same line by the training log-likelihood (``loglik_history_``),
        tokens/s since the previous evaluation and the staleness of the
        participants' word-row reads (clocks, mean and max). ``P`` is the
        training documents' perplexity ``exp(-sum log p(w_i) / tokens)``
        with ``p(w) = sum_k theta_dk phi_kw`` from the sampler's counts at
        that iteration (a plug-in figure each participant computes on its
        own view; below scikit-learn's variational one), and on the last
        iteration ``bound_`` (scikit-learn's, as its last evaluation is).
        Nothing else goes to standard output; the same
        lines, the random start's evaluation (iteration 0) and a summary go
        to the logger ``dask_ps.decomposition._lda`` (INFO). With
        ``dask.config`` ``ps.progress-bar: true`` (and tqdm) a progress bar
        over the iterations is shown too, whatever ``verbose``.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Topic-word pseudo-counts: word-topic counts + ``topic_word_prior``
        (normalize rows to get the topic-word distributions), as in
        scikit-learn; float32 when ``X`` was float32, else float64.
    exp_dirichlet_component_ : ndarray of shape (n_components, n_features)
        ``exp(E[log beta])`` of the topic-word Dirichlet whose parameters
        are ``components_``: ``exp(digamma(components_) -
        digamma(components_.sum(axis=1)))[:, None]``, as scikit-learn
        defines it (same dtype as ``components_``).
    bound_ : float
        scikit-learn's final ``bound_``: the perplexity of the training
        documents (the counts the sampler took) under the fitted topics,
        ``perplexity(X)`` (its variational bound); the documents' terms
        computed where the documents are, after the last sweep; for an
        in-memory corpus of at most ``ps.lda.deferred-bound-tokens``
        tokens (4,000,000) without ``verbose``, at its first read instead,
        in the calling process (the same number, up to the order of the
        sums over several participants' documents; the model holds the
        counts till then, and a pickle holds the number: pickling computes
        it). Computing it took 17-43% of a 10-50-iteration fit. NaN for a
        corpus without tokens. After :meth:`partial_fit`: of the documents
        that call sampled (its own and the kept earlier ones).
    loglik_history_ : list of (iteration, seconds, loglik)
        Training log-likelihood ``log p(w, z)`` (the collapsed joint, as the
        ``lda`` package reports it) after ``iteration`` sweeps, ``seconds``
        after the start of ``fit``. Intermediate entries are the sum of each
        participant's part computed on its own (possibly stale) view: the
        documents it holds, the word rows it holds (each word weighed by 1 /
        number of holders) and 1 / P of the totals term; exact under BSP.
        Every participant's starting counts are on the servers before the
        first sweep reads the tables, so every view holds every token (at a
        stale topic at most) and the entries are comparable along the fit:
        the first one (``iteration == 0``) is the random starting
        assignment's, the worst. The last entry (``iteration == n_iter_``) is computed from the final
        tables and is exact.
    n_iter_ : int
        Gibbs sweeps the final assignments have had: ``max_iter``, or more
        when a checkpoint that was already further along was resumed (in
        :meth:`partial_fit`, the sweeps of that call's documents).
    n_batch_iter_ : int
        As scikit-learn's (1 + the updates of ``components_``): 1 + the
        Gibbs sweeps of every ``fit`` or ``partial_fit`` call since the
        last ``fit`` (scikit-learn counts an EM step of batch or online
        variational Bayes; here each sweep updates the word-topic counts
        once).
    n_restarts_ : int
        Chunks redone because a worker was lost (fault tolerance on).
    n_tokens_ : int
        Training tokens (after :meth:`partial_fit`, of every call).
    fit_seconds_ : float
        Wall-clock seconds of the distributed sampling (the runs, and the
        checkpoints and restarts between them); not ``bound_``'s scoring
        pass after them (scikit-learn's E-step over the training documents,
        up to ``max_doc_update_iter`` updates a document: at K=1000 about
        15 CPU-us a token, as much as ~70 sweeps), whose seconds the
        summary logged at the end of the fit gives.
    tokens_per_second_ : float
        ``n_tokens_ * iterations trained in this call / fit_seconds_``.
    doc_topic_prior_, topic_word_prior_ : float
    random_state_ : RandomState
    n_features_in_ : int
    metrics_ : list of dict
        Per participant: the parameter-server session's counters (reads,
        cache hits, waits, staleness histogram, bytes), seconds spent
        sampling (``sweep_seconds``; each iteration's in ``sweeps``),
        pulling, pushing, in ``clock()`` and evaluating, its token
        count, its own ``history`` of ``(iteration, seconds, loglik part)``,
        the word-topic rows it held at once (``peak_rows``) and the most
        bytes of that table its session held (``peak_session_bytes``).
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

    *Input.* Document-term counts: non-negative numbers (numpy or
    scipy.sparse arrays of any numeric dtype, or a dask array of them);
    negative values, NaN and infinity are errors. The sampler counts tokens,
    so ``fit`` (and :func:`document_completion`) round each count to the
    nearest integer (``numpy.rint``, halves to even; below 0.5 is 0) and
    warn (``sklearn.exceptions.DataConversionWarning``) when that changed a
    value: a tf-idf matrix, whose values are mostly below 0.5, is not a
    corpus. Empty documents are allowed: they are skipped by the sampler and
    ``transform`` returns the uniform distribution for them; a corpus with
    no tokens after rounding is an error. ``transform``, ``score`` and
    ``perplexity`` take non-negative real weights as they are, as
    scikit-learn's LDA does. A corpus of empty documents only (all-zero
    rows) fits without sampling: ``components_`` is then
    ``topic_word_prior`` everywhere, as scikit-learn's.

    *Adding documents* (:meth:`partial_fit`, online Gibbs with
    rejuvenation). The first call is :meth:`fit`. A fitted model keeps a
    uniform sample of the documents it was fitted on, up to
    ``ps.lda.partial-fit-kept-tokens`` tokens (200,000), with their topic
    assignments (in-memory input; a dask array's documents stay on the
    workers and are not kept). A later call samples the new documents
    together with the kept ones, for ``max_iter`` sweeps: the count tables
    start from ``components_ - topic_word_prior`` less the kept documents'
    counts, and both sets' starting counts are pushed on top (the kept ones
    from their kept assignments: their chain goes on); the result
    is ``components_``, and a new uniform sample of all the documents seen
    is kept. Without the resampled documents (Canini, Shi and Griffiths,
    "Online inference of topics with latent Dirichlet allocation", AISTATS
    2009: "rejuvenation") the early documents keep the topics they got
    from a young model, and a stream of ``partial_fit`` calls stayed
    further from one fit of all of it than scikit-learn's online updates
    do (``docs/benchmarks.md``, "LDA partial_fit"). Calling it repeatedly
    with the same documents adds them again, as scikit-learn's
    ``partial_fit`` does for the statistics of its online updates.

    *Scores.* ``score(X)``, ``perplexity(X)``, ``transform(X)`` and
    ``bound_`` are scikit-learn's, computed from ``components_`` and the
    priors: its E-step (variational ``gamma`` of each document, from
    ``gamma = 1``) and its variational bound (``_approx_bound``). On the
    same components, priors and documents they equal scikit-learn's to
    floating-point rounding, so model selection by ``score``
    (``GridSearchCV``) ranks models as it would with scikit-learn. The
    bound includes the divergence of the topics from their prior, a term
    that grows with ``n_components x n_features`` and does not depend on
    ``X``. For held-out evaluation by prediction (comparing models of
    different libraries or samplers on documents they were not trained
    on) use :func:`document_completion`: each token of a document goes to
    half A or B at random (fixed seed, so all models see the same split),
    theta is fitted on A and B is scored. The perplexities in the
    ``verbose`` lines before the last are the sampler's (see ``verbose``).

    *Reproducibility.* Two fits give identical ``components_``,
    ``loglik_history_`` values and ``transform`` results when they have the
    same data, the same parameters, an integer ``random_state``, a
    consistency model of staleness 0 (``BSP()``, which ``consistency=None``
    is with an int ``random_state``; ``totals_consistency`` None or
    staleness 0 too), the same number of partitions (set ``n_partitions``:
    with None it is the number of worker threads, so it follows the
    cluster's threads, whether they are in one process or several; a dask
    array gives one per row chunk) and the same sampler on the same kind of
    machine (the compiled samplers use fast-math floating point). The
    number of workers, how the partitions are placed, their timing, and
    fitting in chunks (``checkpoint``, ``replication``) or resuming do not
    matter: under BSP the count tables sum pushes per clock, so every read
    at clock ``c`` sees exactly the clocks before ``c`` (plus the reader's
    own pushes), and each partition's random stream at each iteration comes
    from its own seed. Under staleness (``SSP``, ``ESSP``, ``VAP``,
    ``CVAP``, ``ASP``, and ``consistency=None`` without an int
    ``random_state``) what a read sees depends on timing: the topics are as
    good, but not the same bit for bit, except for a corpus that gets one
    participant (``n_partitions=None`` and fewer than twice
    ``ps.lda.min-tokens-per-participant`` tokens), whose reads see its own
    counts only. Why a seed switches the default to BSP rather than BSP
    always: BSP's barrier waits for the slowest participant every clock
    (0.88-1.00x SSP(2)-refresh's tokens/s in worker threads, 0.62-1.09x in
    worker processes on a loaded machine: ``docs/benchmarks.md``, "LDA:
    the same random_state"), a
    cost worth paying where the same model is asked for, not otherwise.

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
        **SHARED_CONSTRAINTS,  # client, replication, checkpoint, checkpoint_every, verbose
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "doc_topic_prior": [None, Interval(Real, 0, None, closed="neither")],
        "topic_word_prior": [None, Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "evaluate_every": [Integral],
        # LDA also takes a model's name
        "consistency": [None, dask_ps.Consistency, StrOptions(_MODEL_NAMES)],
        "totals_consistency": [None, dask_ps.Consistency, StrOptions(_MODEL_NAMES)],
        "n_partitions": [None, Interval(Integral, 1, None, closed="left")],
        "sampler": [StrOptions({"auto", "sparse", "dense", "array"})],
        "vocabulary_slices": [Interval(Integral, 1, None, closed="left")],
        "device": [StrOptions({"auto", "cpu", "cuda"})],
        "max_doc_update_iter": [Interval(Integral, 0, None, closed="left")],
        "mean_change_tol": [Interval(Real, 0, None, closed="left")],
        "random_state": ["random_state"],
        # scikit-learn's parameters of online variational Bayes, validated as
        # there (accepted; documented as not used by the Gibbs sampler)
        **{k: _SkLDA._parameter_constraints[k] for k in (
            "learning_method", "learning_decay", "learning_offset", "batch_size", "total_samples", "perp_tol")},
        "n_jobs": [None, Integral],
    }

    bound_ = DeferredBound()  # computed at its first read where the fit left it pending

    def __init__(
        self,
        n_components=10,
        *,
        doc_topic_prior=None,
        topic_word_prior=None,
        learning_method="batch",
        learning_decay=0.7,
        learning_offset=10.0,
        max_iter=100,
        batch_size=128,
        evaluate_every=10,
        total_samples=1e6,
        perp_tol=1e-1,
        consistency=None,
        totals_consistency=None,
        n_partitions=None,
        n_jobs=None,
        sampler="auto",
        vocabulary_slices=1,
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
        self.learning_method = learning_method
        self.learning_decay = learning_decay
        self.learning_offset = learning_offset
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.evaluate_every = evaluate_every
        self.total_samples = total_samples
        self.perp_tol = perp_tol
        self.consistency = consistency
        self.totals_consistency = totals_consistency
        self.n_partitions = n_partitions
        self.n_jobs = n_jobs
        self.sampler = sampler
        self.vocabulary_slices = vocabulary_slices
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
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        # Reproducible under staleness 0 (see Notes): then the checks that
        # compare two fits apply.
        word, totals = self._consistencies()
        tags.non_deterministic = not (word.staleness == 0 and totals.staleness == 0)
        return tags

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def _more_validate_params(self, device, sampler):
        if self.vocabulary_slices > 1 and sampler == "array":
            raise ValueError("vocabulary_slices > 1 needs a CPU sampler: sampler='dense' or 'sparse'")
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
        if self.client is not None and not isinstance(self.client, str) and not hasattr(self.client, "scheduler_info"):
            raise TypeError(
                f"client must be a distributed.Client, a scheduler address or None, got {type(self.client).__name__}"
            )

    def _resolved(self, X):
        device = self.device
        if device == "auto":
            device = "cuda" if arrays.is_cupy(X) or arrays.is_cupy_sparse(X) else "cpu"
        sampler = self.sampler
        if sampler == "auto":
            sampler = "array" if device == "cuda" else ("dense" if self.n_components < 128 else "sparse")
        return device, sampler

    def _consistencies(self):
        if self.consistency is None and _seeded(self.random_state):
            # A seeded fit repeats: BSP with per-clock sums (_runs.count_aggregate)
            # is the model whose reads do not depend on timing (issue 35; its
            # cost: docs/benchmarks.md, "LDA: the same random_state").
            word = dask_ps.BSP()
        else:
            word = as_consistency(self.consistency)
        if self.consistency is None and hasattr(word, "refresh"):
            # LDA's own default: read the word rows fresh when cheap. Topics
            # move fast early on; rows s clocks old cost more log-likelihood
            # per iteration than the one read per clock costs time
            # (docs/benchmarks.md, LDA part 2).
            word = dataclasses.replace(word, refresh=True)
        if self.totals_consistency is not None:
            return word, as_consistency(self.totals_consistency)
        same = word.staleness == 0 or totals_in_word_table(word, None, self.vocabulary_slices)  # (a row of it)
        return word, word if same else dask_ps.ASP()

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
        return self._fit(self._dask_input(X, reset=True), base=None, partial=False)

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y=None):
        """Add the documents ``X`` to the model and sample them (online Gibbs).

        The first call is :meth:`fit`. A later one samples the new
        documents' topic assignments for ``max_iter`` sweeps against the
        fitted word-topic counts plus the new documents' own, on the
        parameter server (the count tables start from the fitted counts),
        and adds their counts to ``components_``; see "Adding documents" in
        the class Notes. ``checkpoint`` is not used by this method.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            Document-term counts, with the features the model was fitted on.
        y : ignored

        Returns
        -------
        self
        """
        if not hasattr(self, "components_"):
            return self._fit(self._dask_input(X, reset=True), base=None, partial=True)
        nwk = np.rint(np.asarray(self.components_, dtype=np.float64) - self.topic_word_prior_)
        return self._fit(self._dask_input(X, reset=False),
                         base=np.ascontiguousarray(np.maximum(nwk, 0).astype(np.int64).T), partial=True)

    def _dask_input(self, X, reset: bool):
        """A dask collection's feature names set (``reset``) or checked as
        scikit-learn's for pandas, and a dask DataFrame as a dask array of
        its row partitions (it was computed whole on the client, its column
        names unread: reordered columns fitted or transformed silently).
        Other inputs as they are (``validate_data`` reads their names)."""
        if is_dask_collection(X):
            dask_feature_names(self, X, reset)
        return X.to_dask_array() if is_dask_dataframe(X) else X

    def _fit(self, X, base, partial):
        """``fit`` (``base`` None) or ``partial_fit`` (``partial``; of a
        fitted model: ``base`` the fitted word-topic counts (V x K) the count
        tables start from, and only ``X``'s documents are sampled)."""
        device, sampler = self._resolved(X)
        self._more_validate_params(device, sampler)
        _warn_ignored(self, partial)
        adding = base is not None
        batch_iter = self.n_batch_iter_ if adding else 1
        if not adding:
            self._kept = None
            self.random_state_ = check_random_state(self.random_state)
            K = self.n_components
            self.doc_topic_prior_ = 1.0 / K if self.doc_topic_prior is None else float(self.doc_topic_prior)
            self.topic_word_prior_ = 1.0 / K if self.topic_word_prior is None else float(self.topic_word_prior)
        K = self.components_.shape[0] if adding else self.n_components
        word_model, totals_model = self._consistencies()

        ps = self._parameter_server()
        uid = uuid.uuid4().hex[:10]
        checkpoint = None if partial else self._checkpoint_path()
        # Read before the data is split (a resumed fit splits as the saved one
        # did), checked once the fingerprint is known.
        meta = dask_ps.checkpoint_metadata(checkpoint) if checkpoint is not None else None
        # earlier documents sampled again with X's (in-memory X: _kept)
        kept = getattr(self, "_kept", None) if adding and not is_dask_array(X) else None
        parts, n_parts, dtype, matrix = self._partitions(X, ps.client, uid, meta, reset=not adding,
                                                         kept=None if kept is None else kept.X)
        if kept is not None:  # their counts come out of the fitted ones: the run puts them back
            base = np.maximum(base - kept.counts(*base.shape), 0)
        whom = "LatentDirichletAllocation." + ("partial_fit" if partial else "fit")
        layout = corpus_layout(parts, uid, self.n_features_in_)
        if layout.rounded:  # a dask array's chunks, rounded on the workers
            warn_rounded(whom)
        if layout.n_tokens == 0:  # empty documents only: nothing to sample (scikit-learn accepts them)
            parts.release()
            if layout.rounded:  # values that all rounded to 0 (tf-idf): not a corpus
                raise ValueError(f"{whom}: X has no tokens (every document is empty, its counts rounded "
                                 "to integers)")
            self._set_without_tokens(base, dtype)
            self.n_batch_iter_ = batch_iter
            return self
        # tokens sampled before (of the model), less those of the kept documents sampled again
        tokens_before = (int(self.n_tokens_) - (0 if kept is None else kept.n_tokens)) if adding else 0
        self.n_tokens_ = layout.n_tokens
        plan = self._plan(ps, layout, checkpoint, n_parts, word_model, totals_model, base)
        resume = (uid, None, [])
        if meta is not None:  # a checkpoint is there ({} if saved without metadata: not ours)
            check_checkpoint(meta, CHECKPOINT_KIND, plan.fingerprint, checkpoint, OWNER)
            resume = (meta["z_id"], (int(meta["set"]), int(meta["iteration"])),
                      [tuple(h) for h in meta["history"]])
        P = len(layout.part_tokens)
        fixed = dict(
            n_components=K, alpha=self.doc_topic_prior_, beta=self.topic_word_prior_,
            n_features=self.n_features_in_, evaluate_every=max(self.evaluate_every, 0),
            seeds=[int(s) for s in self.random_state_.randint(0, 2**31 - 1, size=P)],
            holders=layout.holders, sampler=sampler, device=device, vocabulary_slices=self.vocabulary_slices,
            # ``_sweep_delay`` (not a parameter): the benchmark hook of ``GibbsConfig.delay``.
            delay=getattr(self, "_sweep_delay", None),
        )
        keys, fixed["keep_rows"] = self._keep_plan(matrix, kept)
        if kept is not None:
            fixed.update(z_kept=kept.z, kept_ptr=kept.token_ptr())
        first = resume[1][1] if resume[1] else 0
        progress = Progress(self.verbose, logger, total=max(0, self.max_iter - first), unit="it",
                            desc=type(self).__name__)
        bound = dict(beta=self.topic_word_prior_, alpha=self.doc_topic_prior_, max_iter=self.max_doc_update_iter,
                     tol=self.mean_change_tol)
        # bound_ of an in-memory corpus waits for its first read: 17-43% of a fit's wall
        defer = (matrix is not None and not progress.verbose > 0
                 and layout.n_tokens <= int(setting("lda", "deferred-bound-tokens")))
        try:
            runs = GibbsRuns(ps, parts, uid, plan, fixed, resume, progress, info=run_info(self, 0)).run(
                score=None if defer else functools.partial(training_bound, client=ps.client, matrix=matrix, **bound))
            self._set_fitted(runs, P, progress, dtype, PendingBound(matrix, runs.nwk, self.n_tokens_, **bound)
                             if defer else None)
            if fixed["keep_rows"] is not None:
                self._kept = _kept.collect(matrix, keys, fixed["keep_rows"], runs.results)
        finally:
            progress.close()
        # scikit-learn's count: 1 + the updates of components_ (here: sweeps)
        self.n_batch_iter_ = batch_iter + self.n_iter_
        self.n_tokens_ += tokens_before
        return self

    def _keep_plan(self, matrix, kept):
        """``(keys, rows)``: a random key per document of the run's in-memory
        ``matrix`` (the kept documents' own first) and the rows whose
        assignments the model keeps (``_kept``); ``(None, None)`` for a dask
        array. Drawn after the participants' seeds, from their own stream."""
        if matrix is None:
            return None, None
        rng = np.random.default_rng(self.random_state_.randint(0, 2**31 - 1))
        n_old = 0 if kept is None else kept.X.shape[0]
        keys = np.concatenate([kept.keys if kept is not None else np.empty(0),
                               rng.random(matrix.shape[0] - n_old)])
        doc_tokens = np.asarray(matrix.sum(axis=1)).ravel()
        return keys, _kept.choose(keys, doc_tokens, int(setting("lda", "partial-fit-kept-tokens")))

    def _components_dtype(self, x_dtype, reset: bool):
        """float32 ``components_`` for float32 input, else float64; a
        ``partial_fit`` keeps the fitted model's (scikit-learn's online update
        does, whatever the batch's)."""
        return components_dtype(x_dtype) if reset else self.components_.dtype

    def _partitions(self, X, client, uid, meta, reset=True, kept=None):
        """The corpus prepared on the workers, the number of partitions an
        in-memory input was split into (None for a dask array), the dtype
        of ``components_`` (float32 for float32 input, else float64) and an
        in-memory input's count matrix (None for a dask array); ``reset``: a
        fit (sets ``n_features_in_``), else X is checked against it."""
        if is_dask_array(X):
            if math.isnan(X.shape[1]):
                raise ValueError("LatentDirichletAllocation.fit: the number of columns of X must be known")
            if reset:
                self.n_features_in_ = int(X.shape[1])
            elif int(X.shape[1]) != self.n_features_in_:
                raise ValueError(f"X has {int(X.shape[1])} features, but {type(self).__name__} is expecting "
                                 f"{self.n_features_in_} features as input.")
            if len(X.chunks[1]) > 1:
                X = X.rechunk({1: -1})
            parts = make_parts(client, uid, self.n_features_in_, chunks=list(X.to_delayed()[:, 0]))
            return parts, None, self._components_dtype(X.dtype, reset), None
        X = arrays.to_host(X)
        X = validate_data(
            self, X, reset=reset, accept_sparse="csr",
            dtype=[np.float64, np.float32, np.int64, np.int32, np.int16, np.int8, np.uint32, np.uint16, np.uint8],
        )
        dtype = self._components_dtype(X.dtype, reset)
        whom = "LatentDirichletAllocation." + ("fit" if reset else "partial_fit")
        had_values = (X.count_nonzero() if sp.issparse(X) else np.count_nonzero(X)) > 0
        X = count_matrix(X, whom)
        if had_values and X.nnz == 0:  # values that all rounded to 0 (tf-idf): not a corpus
            raise ValueError(f"{whom}: X has no tokens (every document is empty, its counts rounded to integers)")
        if kept is not None:  # partial_fit: the kept earlier documents first (rows 0 .. n_kept - 1)
            X = sp.vstack([kept, X], format="csr", dtype=np.int64)
            X.sort_indices()
        # A resumed fit splits the documents as the saved one did, whatever
        # the cluster's size now.
        threads = sum(w.get("nthreads", 1) for w in client.scheduler_info(n_workers=-1)["workers"].values())
        n_parts = self.n_partitions or (meta or {}).get("n_parts") or max(1, min(
            max_participants(self.n_jobs, threads),
            int(X.sum()) // min_tokens_per_participant(self.n_components),
        ))
        return make_parts(client, uid, self.n_features_in_, matrix=X, n_parts=n_parts), n_parts, dtype, X

    def _plan(self, ps, layout, checkpoint, n_parts, word_model, totals_model, base=None) -> RunPlan:
        """How the fit runs: chunks, tables, what a checkpoint must match."""
        K, V = self.n_components if base is None else base.shape[1], self.n_features_in_
        total = layout.n_tokens + (0 if base is None else int(base.sum()))
        count_dtype = np.int32 if total < 2**31 - 1 else np.int64
        n_servers = max(1, len(ps.servers))
        row_bytes = K * np.dtype(count_dtype).itemsize
        # Blocks of ps.block-bytes, but at least 4 per server, so that the
        # word rows (and the totals row, where it is one of them) spread over the servers.
        block_rows = max(1, min(parse_bytes(dask.config.get("ps.block-bytes", "4MiB")) // row_bytes,
                                -(-(V + 1) // (4 * n_servers))))
        tolerant = checkpoint is not None or self.replication > 1
        every = ((self.checkpoint_every or int(setting("lda", "checkpoint-every"))) if tolerant
                 else max(1, self.max_iter))
        return RunPlan(
            max_iter=self.max_iter, every=every, tolerant=tolerant, checkpoint=checkpoint,
            fingerprint={
                "n_components": K, "doc_topic_prior": self.doc_topic_prior_,
                "topic_word_prior": self.topic_word_prior_, "n_features": V,
                "part_tokens": layout.part_tokens,
            },
            n_parts=n_parts, replication=min(self.replication, n_servers), word_model=word_model,
            totals_model=totals_model, count_dtype=count_dtype, block_rows=block_rows,
            totals_row=totals_in_word_table(word_model, self.totals_consistency, self.vocabulary_slices),
            n_tokens=layout.n_tokens, base=base,
        )

    def _set_components(self, nwk, dtype):
        """``components_`` (word-topic counts ``nwk``, V x K, + beta) and
        ``exp_dirichlet_component_``."""
        self.components_, self.exp_dirichlet_component_ = topic_word_components(nwk, self.topic_word_prior_, dtype)

    def _set_fitted(self, runs: GibbsRuns, P, progress: Progress, dtype=np.float64, pending=None):
        """The fitted attributes after the runs; ``pending``: ``bound_``'s
        data where its computation waits for its first read."""
        beta = self.topic_word_prior_
        self._set_components(runs.nwk, dtype)
        # A resumed checkpoint may already be past max_iter: report what the
        # assignments have had.
        self.n_iter_ = runs.stop
        self.n_restarts_ = runs.n_restarts
        self.fit_seconds_ = runs.seconds
        trained = max(0, runs.stop - runs.first_iteration)
        self.tokens_per_second_ = rate(self.n_tokens_ * trained, runs.seconds)
        self.metrics_ = participant_metrics(runs.results, fields=(
            "sweep_seconds", "sweeps", "pull_seconds", "push_seconds", "clock_seconds", "eval_seconds", "n_tokens",
            "history", "peak_rows", "peak_session_bytes"))
        final = final_loglik([r["doc_loglik"] for r in runs.results], runs.nwk, runs.nk, beta)
        runs.history.append((runs.stop, time.time() - runs.t_start, float(final)))
        self.loglik_history_ = runs.history
        # scikit-learn's final bound_: the training documents' perplexity
        self._set_bound(float(np.exp(-runs.score / self.n_tokens_)) if pending is None else None, pending)
        end_of_fit_lines(progress, runs, self, final, P)

    def _set_without_tokens(self, base, dtype):
        """The fitted state after a call whose documents hold no token: the
        counts as they were (``base``, or none), nothing sampled."""
        K, V = (self.n_components, self.n_features_in_) if base is None else (base.shape[1], base.shape[0])
        nwk = np.zeros((V, K), dtype=np.int64) if base is None else base
        if base is None:
            self.n_tokens_ = 0
        self._set_components(nwk, dtype if base is None else self.components_.dtype)
        self.n_iter_ = self.n_restarts_ = 0
        self.fit_seconds_ = self.tokens_per_second_ = 0.0
        self.metrics_ = []
        self.loglik_history_ = [(0, 0.0, float(final_loglik([], nwk, nwk.sum(axis=0), self.topic_word_prior_)))]
        self._set_bound(float("nan"))

    def _set_bound(self, value, pending=None):
        """``bound_`` (``value``), or its computation left ``pending`` (:class:`DeferredBound`)."""
        if pending is None:
            self.__dict__.pop("_bound_pending", None)
            self.bound_ = value
        else:
            self.__dict__.pop("bound_", None)
            self._bound_pending = pending


def min_tokens_per_participant(n_components: int) -> int:
    """The tokens an in-memory corpus needs a participant:
    ``ps.lda.min-tokens-per-participant`` up to K = 50, times sqrt(K / 50)
    past it: a participant's sync (rows of K counts) grows with K faster
    than its sampling. On 2 workers two participants broke even with one
    at ~420k tokens at K=50 and at ~1.8M at K=1000 (4.3x; sqrt(20) = 4.5:
    ``benchmarks/bench_lda_participants.py``)."""
    return max(1, int(int(setting("lda", "min-tokens-per-participant")) * max(1.0, math.sqrt(n_components / 50))))
