"""How many participants an in-memory input gets: by its work, not its rows.

A participant more splits an epoch's compute, and costs a clock's sync a
round, a share of the stopping rule's sums an epoch, and more epochs (an
average of P models moves about as far as one of them: fits of 2
participants stop 10-40% more epochs later than one). Below a few tens of
milliseconds of compute an epoch, one participant is faster: on 2 cores a
fit of 60,000 dense rows x 50 took 0.38 s on one participant and 0.73 s on
two (``benchmarks/bench_participants.py``, docs/benchmarks.md "Participants
by work").

So an input gets one participant per ``ps.sgd.min-epoch-seconds-per-participant``
of estimated compute an epoch (:func:`epoch_seconds`, from the compiled
kernel's measured costs per row and per stored value), at most one per
worker (and ``n_jobs``). ``ps.sgd.min-samples-per-participant`` set to a
number is the rule by rows instead (one participant per that many
samples), as before. A dask input is counted the same way from its
blocks' sizes (:func:`dask_participants`): a small one on many workers is
trained by fewer participants, and Dask moves the other workers' blocks
to them (an input that small is a few megabytes at most). Device (cupy)
data keeps the rule by rows (``DEFAULT_MIN_ROWS``): the device kernel's
costs are not measured.
"""

from __future__ import annotations

from dask_ps._estimators import setting

# The compiled kernel's cost of one epoch (one participant, 2-core machine,
# ``bench_participants.py``'s one-participant fits): a sample's fixed part
# (its loss, step and bookkeeping), then each stored value: a dense one
# streams from memory, a sparse one is an index and a scattered weight.
ROW_SECONDS = 60e-9
DENSE_VALUE_SECONDS = 2e-9
SPARSE_VALUE_SECONDS = 12e-9
# The rule by rows where the rule by work does not apply.
DEFAULT_MIN_ROWS = 10_000


def epoch_seconds(n_rows: int, n_values: int, sparse: bool) -> float:
    """Estimated compute of one epoch over ``n_rows`` samples holding
    ``n_values`` stored values (dense: rows x columns; sparse: non-zeros)."""
    per_value = SPARSE_VALUE_SECONDS if sparse else DENSE_VALUE_SECONDS
    return n_rows * ROW_SECONDS + n_values * per_value


def by_work(n_rows: int, n_values: int, sparse: bool, min_seconds: float) -> int:
    """Participants such that each gets at least ``min_seconds`` of an
    epoch's estimated compute (at least 1; no cap)."""
    if min_seconds <= 0:
        return max(1, n_rows)
    return max(1, min(n_rows, int(epoch_seconds(n_rows, n_values, sparse) // min_seconds)))


def _wanted(n_rows: int, n_values: int, sparse: bool, on_device: bool) -> int:
    """Participants wanted for ``n_rows`` samples holding ``n_values``
    stored values: by rows where ``ps.sgd.min-samples-per-participant``
    is a number (or on a device), else by work."""
    min_samples = setting("sgd", "min-samples-per-participant")
    if min_samples is None and on_device:
        min_samples = DEFAULT_MIN_ROWS
    if min_samples is not None:
        return max(1, n_rows // max(1, int(min_samples)))
    return by_work(n_rows, n_values, sparse, float(setting("sgd", "min-epoch-seconds-per-participant")))


def participants(X, cap: int, on_device: bool = False) -> int:
    """Participants of an in-memory input ``X`` (numpy, scipy.sparse or a
    device array) on a cluster that allows ``cap`` (workers, ``n_jobs``):
    by work, or by rows where ``ps.sgd.min-samples-per-participant`` is a
    number (module docstring)."""
    n = int(X.shape[0])
    sparse = hasattr(X, "nnz")
    n_values = int(X.nnz) if sparse else n * (int(X.shape[1]) if X.ndim > 1 else 1)
    return max(1, min(int(cap), _wanted(n, n_values, sparse, on_device)))


def block_size(block) -> tuple:
    """Task: ``(rows, stored values, sparse)`` of one block of a dask
    input's X (numpy, scipy.sparse, pandas, cupy)."""
    n = int(block.shape[0])
    if hasattr(block, "nnz"):
        return n, int(block.nnz), True
    return n, n * (int(block.shape[1]) if len(block.shape) > 1 else 1), False


def dask_participants(sizes, on_device: bool = False) -> int:
    """Participants of a dask input from its blocks' sizes (``block_size`` each; no
    cap: ``TrainingParts.per_worker`` keeps at most one a worker holding
    blocks, and ``n_jobs``)."""
    n = sum(s[0] for s in sizes)
    return _wanted(n, sum(s[1] for s in sizes), any(s[2] for s in sizes), on_device)
