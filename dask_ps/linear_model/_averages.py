"""The averaged weights of a fit of several participants, held as offsets.

scikit-learn's averaged model (``average=True`` or an integer) is the mean
of the pass's iterates from sample ``average`` on: ``avg = S / N``, ``S``
the iterates' sum and ``N`` their count. With ``P`` participants the global
sample count ``t`` advances by ``step = n / n_p`` a sample and each iterate
stands for ``step`` of them, so after the samples up to ``t``, ``N(t) = t -
average`` (``average_count``; the compiled kernel's ``num_iter``).

A sparse round reads, trains and pushes only the rows its samples touch. A
row that a participant's round did not touch kept that participant's share
of the table's average where the sequential average moves it towards the
row's (unchanged) weight: every sample of the round counts the weight as it
is. So a feature that few participants' rounds touched had an average that
lagged the pass: text regression with a constant rate and ``average=10``,
five epochs on 8k rows, R^2 0.0937 at 64 participants against
scikit-learn's 0.1208 on tf-idf rows, while the same rows dense (every row
touched by every round) gave 0.1201.

So, in a fit of several participants (or one that reads its table by
rows, ``uses_offsets``), the table's averaged columns hold ``V = N (avg -
w)`` (``S - N w``: the iterates' sum less what the current weight would
give) instead of ``avg``. A row whose weight nobody changed keeps its
``V``, and its average ``w + V / N(t)`` moves towards ``w`` as ``N``
grows, exactly as the sequential average of a constant weight. ``V`` is
linear in ``(w, avg)``, so the table's mean over the participants is the
mean of their averages, and the pushes' sums (``_Participant.sync_round``)
keep it. A participant converts its read to averages before a round
(``from_offsets`` at the round's first ``t``) and its trained rows back
after it (``to_offsets`` at the round's last), the driver converts the
start and the end (``_training``). A lone participant holding the whole
table keeps plain averages: its fit is scikit-learn's, bit for bit.
"""

from __future__ import annotations

import numpy as np

from dask_ps._estimators import arrays


def uses_offsets(average, n_participants: int, whole_table: bool) -> bool:
    """Whether a fit's table holds its averages as offsets (module
    docstring): averaging on, and not one participant holding the whole
    table (``_Participant.solo``)."""
    return bool(average) and not (n_participants == 1 and whole_table)


def average_count(t, average):
    """``N``: the global samples the averaged model counts once the samples
    before global sample ``t`` are trained (0 before averaging starts: the
    kernel averages a sample at ``t_i`` where ``average <= t_i + step - 1``,
    so the last one before ``t`` where ``average <= t - 1``). ``t`` a
    number or an array (one per output)."""
    average = float(average)
    if np.ndim(t):
        t = np.asarray(t, dtype=np.float64)
        return np.where((average > 0) & (t - 1.0 >= average), t - average, 0.0)
    return t - average if average > 0 and t - 1.0 >= average else 0.0


def output_counts(t, average, t0, n_total, active, n_iter):
    """Per output, ``N`` at global sample ``t`` where it trains (``active``),
    and at the end of its last epoch where it stopped (``n_iter`` epochs:
    its average is frozen there, as scikit-learn's is once its fit of that
    output ends; a stopped output's rows keep their offsets and averages)."""
    ts = np.where(np.asarray(active, dtype=bool), float(t), t0 + np.asarray(n_iter, dtype=np.float64) * n_total)
    return average_count(ts, average)


def _like(W, n):
    """``n`` (a number, or one per output) as ``W``'s kind of array (numpy or cupy)."""
    return arrays.namespace(W).asarray(n, dtype=W.dtype) if np.ndim(n) else n


def round_count(cfg, epoch, seen, n_train, active, n_iter):
    """A participant's ``N`` per output (a number for one output) after
    ``seen`` of its ``n_train`` samples of ``epoch`` (``_RunConfig``'s
    ``t0``, ``n_total``: each sample stands for ``n_total / n_train``
    global ones; :func:`output_counts`)."""
    t = cfg.t0 + epoch * cfg.n_total + seen * cfg.n_total / max(n_train, 1)
    n = output_counts(t, cfg.hp.average, cfg.t0, cfg.n_total, active, n_iter)
    return n if n.shape[0] > 1 else float(n[0])


def to_offsets(W, K: int, n):
    """``W``'s averaged columns (``K:``) as offsets at count ``n`` (a number
    or one per output), in place: ``V = n (avg - w)``; returns ``W``."""
    A = W[:, K:]
    A -= W[:, :K]
    A *= _like(W, n)
    return W


def from_offsets(W, K: int, n):
    """The inverse of ``to_offsets``, in place: ``avg = w + V / n``; before
    averaging starts (``n`` 0) the averages are zeros (scikit-learn's, and
    the kernel replaces them at the first averaged sample). Returns ``W``."""
    A = W[:, K:]
    if np.ndim(n):
        n = np.asarray(n, dtype=np.float64)
        started = n > 0
        A *= _like(W, np.where(started, 1.0 / np.where(started, n, 1.0), 0.0))
        A += W[:, :K] * _like(W, started.astype(np.float64))
    elif n > 0:
        A *= 1.0 / n
        A += W[:, :K]
    else:
        A[...] = 0
    return W
