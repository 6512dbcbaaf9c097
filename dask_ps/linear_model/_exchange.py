"""Rows dealt again between the participants of a dask input whose parts
hold different labels or targets (issue 33).

A dask input's part is the blocks one worker holds (``_data._dask_parts``);
each participant shuffles its own rows (``_data._shuffled_concatenation``),
but rows stored grouped (by label, by date, by source) and placed a group a
worker give participants that each see one class or one range of targets,
and their averaged model is not scikit-learn's: 20k text-like rows sorted by
label, one class a worker, one epoch scored 0.55-0.61 against
scikit-learn's 0.76-0.78.

What this module does, once per fit, on the client:

1. :func:`skew`: from each part's label counts (classifiers; exact, counted
   with the data) or a seeded sample of its targets (regressors: the pooled
   sample's deciles as bins), Pearson's chi-square test of homogeneity of the
   parts' shares against the whole: under a random deal of the rows the
   statistic is chi-square with ``(P-1)(K-1)`` degrees of freedom.
2. Where its p-value is below :data:`SKEW_P_VALUE` (``ps.sgd.exchange-rows:
   auto``; ``always``/``never`` force it), :func:`exchange` deals the rows
   again in a seeded uniform permutation of all of them: how many rows go
   from part ``i`` to part ``j`` is the multivariate hypergeometric draw a
   permutation of the whole gives (:func:`deal_counts`), which rows a
   uniform choice inside part ``i`` (:func:`_split`), and each new part the
   shuffled join of what it receives (:func:`_join`). Parts keep their
   sizes and workers; Dask moves the rows worker to worker
   (``TrainingParts.exchanged``).

Within a part: a part of one block is used in its stored order (no copy)
unless :func:`stored_grouped` finds its targets stored grouped (one-class
runs, sorted targets), which the parts' counts cannot see where every part
is balanced; ``_data._assemble_part`` then assembles it in a seeded shuffle.

The same ``random_state`` gives the same parts, so the same fit.
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from dask_ps._estimators import Progress, arrays, setting
from dask_ps.linear_model._participant import _PartData

logger = logging.getLogger("dask_ps.linear_model")

# A random deal of the rows gives a smaller p-value once in 10^4 fits: then
# one needless exchange (it costs less than an epoch; docs/benchmarks.md).
SKEW_P_VALUE = 1e-4
# Targets sampled a part (regressors): enough to see a part that holds
# another range of the targets (sorted input: p ~ 0), 8 KB a part.
TARGET_SAMPLE = 1000
TARGET_BINS = 10
MODES = ("auto", "always", "never")


def target_sample(y, seed=0) -> np.ndarray:
    """Task helper: up to :data:`TARGET_SAMPLE` of a part's targets, drawn
    without replacement (all of them in a smaller part)."""
    y = np.asarray(arrays.to_numpy(y), dtype=np.float64)
    if y.shape[0] <= TARGET_SAMPLE:
        return y.copy()
    return y[np.random.default_rng(seed).choice(y.shape[0], TARGET_SAMPLE, replace=False)]


def _table(infos, classifier) -> np.ndarray:
    """The parts' contingency table (P, K): label counts, or the counts of
    the targets' sample in the pooled sample's decile bins."""
    if classifier:
        labels = np.unique(np.concatenate([i[1] for i in infos]))
        table = np.zeros((len(infos), len(labels)))
        for p, (_, lab, cnt, *_) in enumerate(infos):
            table[p, np.searchsorted(labels, lab)] = cnt
        return table
    samples = [i[3] for i in infos]
    edges = np.unique(np.quantile(np.concatenate(samples), np.linspace(0, 1, TARGET_BINS + 1)[1:-1]))
    return np.array([np.bincount(np.searchsorted(edges, s, side="right"), minlength=len(edges) + 1)
                     for s in samples], dtype=np.float64)


def skew(infos, classifier) -> float:
    """The p-value of the parts' label (target) shares under a random deal
    of the rows: Pearson's chi-square test of homogeneity of the table of
    :func:`_table` (columns no part has are left out). ``infos``: per part
    ``(n, labels, counts, target sample)``; 1.0 with fewer than two parts
    or one column."""
    from scipy.stats import chi2

    if len(infos) < 2:
        return 1.0
    table = _table(infos, classifier)
    table = table[:, table.sum(axis=0) > 0]
    table = table[table.sum(axis=1) > 0]
    if table.shape[0] < 2 or table.shape[1] < 2:
        return 1.0
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, (table.shape[0] - 1) * (table.shape[1] - 1)))


# A part's targets in a random order give an order statistic z of about
# N(0, 1) (measured: at most 3.7 over 3,000 random orders of 50 to 20,000
# labels or targets, 4.7 at 50 rows of 20 classes); rows stored sorted give
# about sqrt(n) (100 for 10k rows).
ORDER_Z = 6.0


def order_z(y, classifier) -> float:
    """How far a part's stored order of its targets is from a random
    order's, in standard deviations: classifiers, the adjacent rows of the
    same label against their count under a random order (each adjacent
    pair the same with probability ``sum n_k (n_k - 1) / (n (n - 1))``);
    regressors, the lag-1 autocorrelation of the targets times ``sqrt(n)``
    (about N(0, 1) in a random order). 0 for fewer than 3 rows or constant
    targets."""
    y = np.asarray(arrays.to_numpy(y))
    n = y.shape[0]
    if n < 3:
        return 0.0
    if classifier:
        if y.dtype.kind in "iu" and y.min() >= 0 and y.max() < 1 << 16:  # no sort of a million labels
            counts = np.bincount(y)
        else:
            _, counts = np.unique(y, return_counts=True)
        p = float((counts * (counts - 1.0)).sum() / (n * (n - 1.0)))
        var = (n - 1) * p * (1.0 - p)
        same = np.count_nonzero(y[1:] == y[:-1])
        return float((same - (n - 1) * p) / np.sqrt(var)) if var > 0 else 0.0
    y = y.astype(np.float64) - y.mean(dtype=np.float64)
    ss = float(y @ y)
    return float(y[1:] @ y[:-1] / ss * np.sqrt(n)) if ss > 0 else 0.0


def stored_grouped(y, classifier) -> bool:
    """Whether a part's rows are stored grouped by their targets (runs of
    one label, targets sorted or trending): :func:`order_z` at least
    :data:`ORDER_Z`. Its participant's rounds would train such runs one
    after the other (sparse rounds keep up to 64 consecutive rows together:
    ``_rounds._composition_block``), so the part is assembled in a shuffle
    (``_data._assemble_part``)."""
    try:
        return order_z(y, classifier) >= ORDER_Z
    except (TypeError, ValueError):  # targets the checks refuse (after this): their error, not this one
        return False


def deal_counts(sizes, rng) -> np.ndarray:
    """``counts[i, j]``: rows part ``i`` sends to part ``j`` when all the
    rows are dealt in a uniform permutation into parts of the same sizes
    (each row of the multivariate hypergeometric draw of what is left)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    left = sizes.copy()
    counts = np.zeros((len(sizes), len(sizes)), dtype=np.int64)
    for i, n in enumerate(sizes):
        counts[i] = rng.multivariate_hypergeometric(left, int(n)) if n else 0
        left -= counts[i]
    return counts


def _split(part: _PartData, i, counts, seeds):
    """Task: part ``i``'s pieces, piece ``j`` a uniform choice of
    ``counts[i][j]`` of its rows (in their stored order)."""
    perm = np.random.default_rng(seeds[i]).permutation(len(part))
    ends = np.cumsum(counts[i])
    pieces = []
    for j, end in enumerate(ends):
        idx = np.sort(perm[end - counts[i][j]:end])
        pieces.append(_PartData(part.X[idx], part.y[idx], part.sw[idx]) if idx.size else None)
    return pieces


def _join(pieces, j, seeds):
    """Task: the new part ``j``, its pieces' rows in a shuffled order."""
    from dask_ps.linear_model._data import _shuffled_concatenation

    X, y, sw = _shuffled_concatenation([p.X for p in pieces], [p.y for p in pieces], [p.sw for p in pieces],
                                       seeds[j])
    return _PartData(X, y, sw)


def mode() -> str:
    """``ps.sgd.exchange-rows``, checked."""
    value = str(setting("sgd", "exchange-rows"))
    if value not in MODES:
        raise ValueError(f"dask config ps.sgd.exchange-rows must be one of {MODES}, got {value!r}")
    return value


def balance(parts, sizes, infos, classifier, seed, verbose=0, owner="SGDClassifier"):
    """The parts, their rows dealt again between the participants where
    :func:`skew` finds the parts' shares unlike a random deal's (or
    ``ps.sgd.exchange-rows: always``); ``parts`` itself where not (one part,
    ``never``, no ``seed``: the estimator's ``shuffle=False``)."""
    how = mode()
    if seed is None or len(parts) < 2 or how == "never":
        return parts
    p_value = skew(infos, classifier) if how == "auto" else 0.0
    if p_value >= SKEW_P_VALUE:
        return parts
    rng = np.random.default_rng([int(seed), 33])
    counts = deal_counts(sizes, rng)
    seeds = [int(s) for s in rng.integers(np.iinfo(np.int32).max, size=2 * len(parts))]
    what = "labels" if classifier else "targets"
    text = (f"{owner}: the {len(parts)} participants' {what} differ from the whole beyond a random deal "
            f"(chi-square p = {p_value:.2g}); their rows are dealt again between them (seeded)"
            if how == "auto" else f"{owner}: rows dealt again between {len(parts)} participants "
            "(ps.sgd.exchange-rows: always)")
    if verbose:
        progress = Progress(verbose, logger)
        try:
            progress.note(text)  # standard error and the logger
        finally:
            progress.close()
    else:
        logger.info(text)
    return parts.exchanged(functools.partial(_split, counts=counts, seeds=seeds[:len(parts)]),
                           functools.partial(_join, seeds=seeds[len(parts):]), counts)
