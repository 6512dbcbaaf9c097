"""Live progress of an SGD fit (``verbose``, or ``ps.progress-bar``).

Each participant writes one row per epoch into a small progress table
(``_Participant.report``: assign rule, ASP, a ring of ``progress_epochs``
epochs of ``P`` rows each); the client's :class:`EpochMonitor` thread reads
the rows of the next epochs every ``ps.sgd.progress-interval`` and prints an
epoch once every participant wrote it, as scikit-learn prints its epochs::

    -- Epoch 1
    Norm: 6.38, NNZs: 20, Bias: -0.339887, T: 20000, Avg. loss: 0.453512, Objective: 0.453962
    Total training time: 0.05 seconds; 4.1e+05 samples/s, staleness 0.50 (max 2), 2 participant(s).

``Norm``/``NNZs``/``Bias`` are the coefficients' over all one-vs-rest
problems (the bias their mean); ``Avg. loss`` the epoch's loss per
training sample (at the weights each sample trained from), ``Objective``
that plus the penalty term of the model; ``T`` the samples trained so far
in this call; the staleness is that of the participants' reads of the
weights in the epoch, in clocks. The model's summary comes with the rows:
a lone participant's model, or on dense data participant 0's read of the
table after the epoch's last clock; on sparse data with several
participants the monitor reads the table when it prints (so a fit faster
than the polling shows its later model there).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from dask_ps._estimators import PollingMonitor, arrays, rate
from dask_ps.linear_model._kernels import _penalty_value

# The fields of a progress row (NaN: not known to this participant).
F_EPOCH = 0  # epoch + 1 (0: not written yet)
F_LOSS = 1  # loss sum over the epoch's training samples (mean over the outputs)
F_SAMPLES = 2  # samples trained in the epoch
F_SECONDS = 3  # seconds the epoch took
F_END = 4  # time.time() at the epoch's end
F_READS = 5  # reads of the weights in the epoch,
F_STALE_SUM = 6  # their staleness (clocks) summed,
F_STALE_MAX = 7  # and its maximum
F_NORM = 8  # a lone participant: ||coef||, non-zeros, mean bias, penalty term
F_NNZ = 9
F_BIAS = 10
F_PENALTY = 11
F_SCORE = 12  # validation score on the participant's validation samples (early_stopping)
N_FIELDS = 13

logger = logging.getLogger(__name__)

RING_EPOCHS = 1024  # epochs the progress table holds (a monitor further behind skips epochs)


def progress_row(cfg, n_participants: int, rank: int, epoch: int) -> int:
    """Row of the progress table for ``epoch`` of participant ``rank``."""
    return (epoch % cfg.progress_epochs) * n_participants + rank


def model_summary(hp, W, d: int) -> tuple:
    """``(norm, non-zeros, mean bias, penalty term)`` of the weights table
    ``W`` (rows: features then the intercept; columns: the outputs first)."""
    xp = arrays.namespace(W)
    K = hp.n_outputs
    coef = W[:d, :K]
    norm = float(xp.sqrt(xp.sum(coef * coef)))
    nnz = float(xp.count_nonzero(coef))
    bias = float(xp.mean(W[d, :K]))
    penalty = float(np.mean(arrays.to_numpy(_penalty_value(hp, W, xp))))
    return norm, nnz, bias, penalty


class EpochMonitor(PollingMonitor):
    """Prints the epochs of a fit as the participants complete them (see
    the module docstring).

    Parameters
    ----------
    read_rows : callable
        ``read_rows(rows) -> (len(rows), N_FIELDS)`` array of the progress table.
    read_weights : callable
        ``read_weights() -> W``, the weights table (several participants).
    n_participants, ring : int
        ``P`` and the epochs the table holds.
    first_epoch : int
        The first epoch the fit trains (a resumed fit's saved epoch).
    hp : _Hyper
    n_features : int
    progress : dask_ps._estimators.Progress
    t_start : float
        ``time.time()`` when the fit started.
    period : float
        Seconds between two reads.
    """

    WINDOW = 32  # epochs read per request

    def __init__(self, read_rows, read_weights, *, n_participants, ring, first_epoch, hp, n_features, progress,
                 t_start, period):
        super().__init__(period, name="sgd-progress")
        self.read_rows, self.read_weights = read_rows, read_weights
        self.P, self.ring, self.hp, self.d = n_participants, ring, hp, n_features
        self.progress, self.t_start = progress, t_start
        self.next_epoch = first_epoch
        self.samples = 0  # T: samples trained so far in this call
        self.final = False  # after the runs: print the epochs some participants wrote

    def __repr__(self):
        return f"<EpochMonitor P={self.P} next_epoch={self.next_epoch} alive={self.is_alive()}>"

    def stop(self, timeout: float = 30) -> None:
        self.final = True
        super().stop(timeout)
        if self.ident is None:  # never started: a fit in this thread (``poll_now`` at its flushes)
            self.poll_now()

    def poll_now(self) -> None:
        """Poll in the calling thread (a participant in this process, at
        each of its flushes); progress is best effort, never the fit's error."""
        try:
            self._poll_once()
        except Exception:
            logger.debug("sgd progress: poll failed", exc_info=True)

    def poll(self) -> None:
        """Print every complete epoch from ``next_epoch`` on."""
        weights = None
        while True:
            n = min(self.WINDOW, self.ring)
            epochs = range(self.next_epoch, self.next_epoch + n)
            rows = np.array([(e % self.ring) * self.P + r for e in epochs for r in range(self.P)])
            block = np.asarray(arrays.to_numpy(self.read_rows(rows))).reshape(n, self.P, N_FIELDS)
            for i, e in enumerate(epochs):
                tags = block[i, :, F_EPOCH]
                written = tags == e + 1
                if (tags > e + 1).any() and not written.any():  # overwritten: this monitor fell behind
                    self.next_epoch = e + 1
                    continue
                if not (written.all() or (self.final and written.any())):
                    return
                if weights is None and np.isnan(block[i, written, F_NORM]).all():
                    weights = np.asarray(arrays.to_numpy(self.read_weights()))
                self.print_epoch(e, block[i, written], weights)
                self.next_epoch = e + 1

    def print_epoch(self, epoch, rows, weights) -> None:
        samples = float(rows[:, F_SAMPLES].sum())
        self.samples += int(samples)
        loss = rows[:, F_LOSS].sum() / max(samples, 1.0)
        known = rows[~np.isnan(rows[:, F_NORM])]
        if len(known):
            norm, nnz, bias, penalty = known[0, F_NORM:F_PENALTY + 1]
        else:
            norm, nnz, bias, penalty = model_summary(self.hp, weights, self.d)
        line = (f"Norm: {norm:.2f}, NNZs: {int(nnz)}, Bias: {bias:.6f}, T: {self.samples}, "
                f"Avg. loss: {loss:.6f}, Objective: {loss + penalty:.6f}")
        scores = rows[:, F_SCORE]
        if not np.isnan(scores).all():
            line += f", Validation score: {np.nanmean(scores):.6f}"
        seconds = float(rows[:, F_SECONDS].max())
        samples_per_second = rate(samples, seconds)
        reads = rows[:, F_READS].sum()
        if reads > 0:
            staleness = (f"staleness {rows[:, F_STALE_SUM].sum() / reads:.2f} "
                         f"(max {int(rows[:, F_STALE_MAX].max())})")
        else:
            staleness = "no staleness" if self.P == 1 else "no reads"
        elapsed = max(0.0, float(rows[:, F_END].max()) - self.t_start)
        self.progress.line(f"-- Epoch {epoch + 1}")
        self.progress.line(line)
        self.progress.line(f"Total training time: {elapsed:.2f} seconds; {samples_per_second:.3g} samples/s, "
                           f"{staleness}, {self.P} participant(s).")
        postfix = {"loss": f"{loss:.4g}"}
        if math.isfinite(samples_per_second):
            postfix["samples/s"] = f"{samples_per_second:.3g}"
        self.progress.advance(1, **postfix)
