"""SGD's training data: the validated input (``_Input``) and its parts on
the workers, one per participant (through ``dask_ps._estimators.TrainingParts``).
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_random_state
from sklearn.utils.validation import _check_y, check_array

from dask_ps._estimators import (
    InvalidPart,
    TrainingParts,
    arrays,
    is_dask_collection,
    is_dask_dataframe,
    max_participants,
    raise_invalid_parts,
    setting_bytes,
)
from dask_ps.linear_model import _exchange, _participants
from dask_ps.linear_model._participant import _PartData

logger = logging.getLogger("dask_ps.linear_model")

INT32_MAX = np.iinfo(np.int32).max


def int32_indices(X, what="X"):
    """``X`` with int32 indices when it is a sparse matrix with int64 ones
    that fit (the kernels' and scikit-learn's index type; the values are
    not copied); raises ``ValueError`` when they do not fit."""
    if not sp.issparse(X) or (X.indices.dtype == np.int32 and X.indptr.dtype == np.int32):
        return X
    if X.nnz > INT32_MAX or max(X.shape) > INT32_MAX:
        raise ValueError(
            f"{what} has {X.nnz} stored values and shape {X.shape}: more than 32-bit indices can address "
            f"({INT32_MAX}); split it into smaller blocks (e.g. a dask array of sparse chunks)")
    return type(X)((X.data, X.indices.astype(np.int32), X.indptr.astype(np.int32)), shape=X.shape)


class _Input:
    """Validated training data: in memory (X, y, sw arrays) or dask
    collections; ``n_jobs``: the estimator's, the most participants
    (``max_participants``); ``estimator``: its name, in scikit-learn's
    messages about the data."""

    def __init__(self, kind, X, y, sw, n_features, dtype, sparse, device, n_jobs=None, estimator="SGDClassifier"):
        self.kind, self.X, self.y, self.sw = kind, X, y, sw
        self.n_features, self.dtype, self.sparse, self.device = n_features, np.dtype(dtype), sparse, device
        self.n_jobs, self.estimator = n_jobs, estimator
        # A dask input's parts, prepared once on the workers (``_dask_parts``):
        # ``(parts, sizes, labels)``; the classes and the class weights come
        # from their label counts, without another pass over y.
        self.parts = None


def _shuffled_concatenation(Xs, ys, sws, seed):
    """The rows of the blocks ``Xs`` (with their ``ys``, ``sws``) in one
    array, in a shuffle of all of them drawn from ``seed`` (and the number
    of rows): each row is written once, straight to its place, so the
    shuffled part takes the memory of the concatenation it replaces (a CSR
    block's entries need one index array of that block's size meanwhile).

    A worker's blocks of a dask input stored sorted by label (partitions of
    one class each) were its participant's samples in that order, and the
    sparse rounds keep runs of up to 64 consecutive samples together
    (``_rounds._composition_block``): runs of one class, and a one-epoch
    fit on 20k text-like rows scored 0.51 against scikit-learn's 0.76."""
    sizes = np.array([x.shape[0] for x in Xs])
    n = int(sizes.sum())
    to = np.random.default_rng([int(seed), n]).permutation(n)  # where row g of the concatenation goes
    starts = np.concatenate([[0], np.cumsum(sizes)])
    if sp.issparse(Xs[0]):
        Xs = [_csr(x) for x in Xs]
        lengths = np.concatenate([np.diff(x.indptr) for x in Xs])
        out_len = np.empty(n, dtype=np.int64)
        out_len[to] = lengths
        indptr = np.concatenate([[0], np.cumsum(out_len)])
        nnz = int(indptr[-1])
        idx_dtype = np.int32 if nnz <= INT32_MAX else np.int64
        data = np.empty(nnz, dtype=np.result_type(*[x.dtype for x in Xs]))
        indices = np.empty(nnz, dtype=idx_dtype)
        for k, x in enumerate(Xs):
            rows_to = to[starts[k]:starts[k + 1]]
            # each entry's place: its row's start there, plus its offset in the row
            pos = np.repeat(indptr[rows_to] - x.indptr[:-1], np.diff(x.indptr)) + np.arange(x.nnz)
            data[pos] = x.data
            indices[pos] = x.indices
        X = sp.csr_matrix((data, indices, indptr.astype(idx_dtype)), shape=(n, Xs[0].shape[1]))
    else:  # dense, on the host or the device (the pieces of a device part's exchange: _exchange._join)
        X = arrays.namespace(*Xs).empty((n,) + tuple(Xs[0].shape[1:]), dtype=np.result_type(*[x.dtype for x in Xs]))
        for k, x in enumerate(Xs):
            X[to[starts[k]:starts[k + 1]]] = x

    def rows(vs):
        out = arrays.namespace(*vs).empty(n, dtype=np.result_type(*[v.dtype for v in vs]))
        for k, v in enumerate(vs):
            out[to[starts[k]:starts[k + 1]]] = v
        return out

    return X, rows(ys), None if all(v is None for v in sws) else rows(sws)


def _assemble_part(blocks, spec):
    """Task (on the worker holding the blocks): concatenate one worker's
    blocks of a dask input and validate them the scikit-learn way. Data
    that fails the checks gives an ``InvalidPart`` (a value: the caller
    raises its error, with lengths as totals over the parts).

    With ``spec["order_seed"]`` (the estimator's ``shuffle``) the blocks of
    host (numpy/scipy) data are concatenated in a shuffled order
    (``_shuffled_concatenation``), as an in-memory input's parts are; a
    part of one block is used as it is stored (no copy)."""
    Xs, ys, sws = [], [], []
    for xb, yb, *rest in blocks:
        swb = rest[0] if rest else None
        if hasattr(xb, "to_numpy") and not arrays.is_sparse(xb):  # pandas
            xb = xb.to_numpy()
        if hasattr(yb, "to_numpy"):
            yb = yb.to_numpy()
        if yb is not None and getattr(yb, "ndim", 1) == 2 and yb.shape[1] == 1:
            yb = yb.ravel()
        Xs.append(xb)
        ys.append(yb)
        sws.append(swb if swb is None or not hasattr(swb, "to_numpy") else swb.to_numpy())
    if _shuffles(Xs, ys, sws, spec):
        X, y, sw = _shuffled_concatenation(Xs, ys, sws, spec["order_seed"])
        return _validated_part(X, y, sw, spec)
    if arrays.is_sparse(Xs[0]):
        if sp.issparse(Xs[0]):
            X = sp.vstack(Xs, format="csr") if len(Xs) > 1 else _csr(Xs[0])
        else:  # cupyx sparse
            import cupyx.scipy.sparse as csp  # type: ignore[import-not-found]

            X = csp.vstack(Xs, format="csr") if len(Xs) > 1 else Xs[0].tocsr()
    else:
        xp = arrays.namespace(*Xs)
        X = xp.concatenate(Xs, axis=0) if len(Xs) > 1 else Xs[0]
    xp_y = arrays.namespace(*[v for v in ys if v is not None])
    y = xp_y.concatenate(ys) if len(ys) > 1 else ys[0]
    sw = None
    if any(s is not None for s in sws):
        sw = np.concatenate([arrays.to_numpy(s) for s in sws]) if len(sws) > 1 else arrays.to_numpy(sws[0])
    return _validated_part(X, y, sw, spec)


def _shuffles(Xs, ys, sws, spec) -> bool:
    """Whether a part's blocks are concatenated in a shuffled order
    (``_assemble_part``): blocks of host data, of consistent lengths
    (others are left to the checks' errors), several of them or one whose
    rows are stored grouped by their targets (``_exchange.stored_grouped``:
    a one-class run, a sorted target; a block in a random order is used as
    it is, without a copy)."""
    if spec.get("order_seed") is None:
        return False
    host = all(isinstance(x, np.ndarray) or sp.issparse(x) for x in Xs) and len({x.shape[1:] for x in Xs}) == 1
    host = host and all(isinstance(v, np.ndarray) for v in ys)
    host = host and (all(v is None for v in sws) or all(isinstance(v, np.ndarray) for v in sws))
    host = bool(host and all(getattr(x, "ndim", 2) == 2 and x.shape[0] == v.shape[0] and v.ndim == 1
                             and (w is None or w.shape == v.shape) for x, v, w in zip(Xs, ys, sws)))
    if not host or len(Xs) > 1:
        return host
    grouped = _exchange.stored_grouped(ys[0], spec.get("classifier", False))
    if grouped:
        logger.info("%s: a part of %d rows is stored grouped by its %s: assembled in a shuffle",
                    spec.get("estimator", "SGD"), ys[0].shape[0],
                    "labels" if spec.get("classifier") else "targets")
    return grouped


def _validated_part(X, y, sw, spec):
    """An assembled part checked (``_assemble_part``): its ``_PartData``,
    or its ``InvalidPart``."""
    lengths = (X.shape[0], y.shape[0], None if sw is None else sw.shape[0])
    stage = 0
    try:
        X, stage = _checked_X(X, spec), 1
        y, stage = _checked_y(y, X.dtype, spec), 2
        if lengths[0] != lengths[1]:
            return InvalidPart(None, lengths, stage)
        if sw is not None:
            sw = check_array(sw, ensure_2d=False, dtype=X.dtype, ensure_min_samples=0, input_name="sample_weight")
            if sw.shape != (X.shape[0],):
                return InvalidPart(None, lengths, stage)
    except (ValueError, TypeError) as e:  # the user's data, said in the caller (issue 24)
        return InvalidPart(e, lengths, stage)
    return _PartData(X, y, np.ones(X.shape[0], dtype=X.dtype) if sw is None else sw)


def _csr(X):
    """A scipy sparse block as a CSR matrix, not copied where it is one.

    A block received from another process holds views of the message's
    frames, and ``csr_matrix(X)`` "prunes" them: scipy copies an array that
    is a view of a much larger one (it compares the view's items with the
    frame's bytes, so every received block qualifies). Done at each fit,
    that copied each worker's whole training CSR: 51k page faults and a
    second of system time per worker in a one-epoch click-through fit
    (450k rows a worker), where the threads layout copied nothing."""
    return X if isinstance(X, sp.csr_matrix) else sp.csr_matrix(X)


def _checked_X(X, spec):
    """One part's X checked as scikit-learn's ``validate_data`` checks it
    (numpy/scipy: ``check_array``, with its messages; device arrays: finite
    values), with its number of features; returns X.

    numpy/scipy: the values are checked by one pass that sums their squares
    (``vdot``: finite exactly when no value is NaN or Inf and no square
    overflows); only where the sum is not finite does scikit-learn's own
    check run, and raise its error (squares that overflow are no error):
    13 ms instead of ~2x that for each participant's 18M non-zeros before
    every fit of the hashed benchmark."""
    if arrays.namespace(X) is np and not arrays.is_cupy_sparse(X):
        kw = dict(accept_sparse="csr", ensure_min_samples=0, input_name="X", estimator=spec["estimator"])
        X = int32_indices(check_array(X, dtype=[np.float64, np.float32], order="C", ensure_all_finite=False,
                                      **kw))
        values = X.data if sp.issparse(X) else X.reshape(-1)
        sq_sum = float(np.vdot(values, values))
        if not math.isfinite(sq_sum):
            check_array(X, **kw)  # NaN or Inf: scikit-learn's error
    elif not arrays.is_cupy_sparse(X) and not arrays.all_finite(X):
        raise ValueError("Input X contains NaN or infinity.")
    if X.shape[1] != spec["n_features"]:
        raise ValueError(f"X has {X.shape[1]} features, expected {spec['n_features']}")
    return X


def _checked_y(y, dtype, spec):
    """One part's y checked as scikit-learn checks it (host labels: its
    ``_check_y``; a regressor's targets in X's dtype)."""
    if arrays.namespace(y) is not np:
        return y if spec["classifier"] else y.astype(dtype, copy=False)
    y = _check_y(y, y_numeric=not spec["classifier"], estimator=spec["estimator"])
    return y if spec["classifier"] else y.astype(dtype, copy=False)


def label_counts(y):
    """``np.unique(y, return_counts=True)``; small non-negative integer
    labels (the usual case) are counted without sorting y (a sort of a
    million labels is tens of milliseconds a part, every fit)."""
    if y.dtype.kind in "iu" and y.size:
        lo, hi = y.min(), y.max()
        if lo >= 0 and hi < 1 << 16:
            counts = np.bincount(y, minlength=int(hi) + 1)
            labels = np.flatnonzero(counts)
            return labels.astype(y.dtype), counts[labels]
    return np.unique(y, return_counts=True)


def _part_info(part, classifier):
    """Task: ``(size, labels, label counts, targets' sample)`` of an
    assembled part (a classifier's labels and counts, a regressor's sample:
    ``_exchange.skew``), or the part's ``InvalidPart``."""
    if isinstance(part, InvalidPart):
        return part
    weighted = bool(arrays.to_numpy(part.sw).any())  # a weight that is not zero (no weights: ones)
    if classifier:
        labels, counts = label_counts(arrays.to_numpy(part.y))
        return len(part), labels, counts, None, weighted
    return len(part), None, None, _exchange.target_sample(part.y), weighted


def order_seed(est):
    """The seed of the order a dask input's parts are assembled in
    (``_dask_parts``): drawn from the estimator's ``random_state``; None
    (the stored order) where it does not shuffle."""
    if not getattr(est, "shuffle", True):
        return None
    return int(check_random_state(est.random_state).randint(np.iinfo(np.int32).max))


def _dask_parts(client, data: _Input, classifier: bool, order_seed=None, verbose=0, all_zero_weights=None):
    """The parts of a dask input: one per worker that holds blocks of it once
    persisted (at most ``_participants.dask_participants``: by the epoch's
    estimated compute, as an in-memory input), concatenated and validated there (``_assemble_part``; data
    that fails the checks raises here, in the caller); returns ``(parts, sizes, labels)`` -- ``labels``: ``(labels, counts)``
    over all parts for a classifier. Nothing is gathered to the client.
    ``order_seed`` (None: the stored order): each part's blocks
    concatenated in a shuffle drawn from it (``_shuffled_concatenation``),
    and the rows dealt again between the parts where their labels or
    targets are unlike a random deal's (``_exchange.balance``).
    ``all_zero_weights``: the error message where every sample weight is
    zero (scikit-learn's; the in-memory path's ``_check_sample_weight``)."""
    X, y, sw = data.X, data.y, data.sw
    if not is_dask_dataframe(X):
        X = X.rechunk({1: -1}) if X.numblocks[1] > 1 else X
    if not is_dask_collection(y):
        raise TypeError("y must be a dask collection when X is one")
    if hasattr(y, "chunks") and hasattr(X, "chunks") and not any(np.isnan(X.chunks[0])):
        if y.chunks[0] != X.chunks[0]:
            y = y.rechunk({0: X.chunks[0]})
    if sw is not None and not is_dask_collection(sw):
        import dask.array as da

        if hasattr(X, "chunks") and not any(np.isnan(X.chunks[0])):
            sw = da.from_array(np.asarray(sw), chunks=(X.chunks[0],))
        else:
            raise TypeError("sample_weight must be a dask collection aligned with X")
    spec = {"n_features": data.n_features, "classifier": classifier, "estimator": data.estimator,
            "order_seed": order_seed}
    max_parts = None  # n_jobs: fewer participants than the workers holding blocks
    if data.n_jobs is not None:
        max_parts = max_participants(data.n_jobs, len(client.scheduler_info(n_workers=-1)["workers"]))
    parts = TrainingParts.per_worker(client, [X, y] + ([sw] if sw is not None else []),
                                     prepare=functools.partial(_assemble_part, spec=spec),
                                     what="X, y (and sample_weight)", max_parts=max_parts,
                                     size_of=_participants.block_size,
                                     parts_for=functools.partial(_participants.dask_participants,
                                                                 on_device=data.device != "cpu"))
    infos = parts.gather(_part_info, classifier)
    try:
        raise_invalid_parts(data.estimator, [i if isinstance(i, InvalidPart) else (i[0],) * 3 for i in infos])
    except BaseException:
        parts.release()
        raise
    if sw is not None and all_zero_weights and not any(i[4] for i in infos):
        parts.release()
        raise ValueError(all_zero_weights)
    sizes = [i[0] for i in infos]
    labels = None
    if classifier:
        lab = [i[1] for i in infos if i[1] is not None and len(i[1])]
        cnt = [i[2] for i in infos if i[2] is not None and len(i[2])]
        if lab:
            all_labels, inv = np.unique(np.concatenate(lab), return_inverse=True)
            labels = (all_labels, np.bincount(inv, weights=np.concatenate(cnt)))
    keep = [i for i, n in enumerate(sizes) if n > 0]
    parts.keep(keep)
    sizes = [sizes[i] for i in keep]
    if data.device == "cpu" or not data.sparse:  # device CSR rows are not dealt (untested without a GPU)
        try:
            parts = _exchange.balance(parts, sizes, [infos[i] for i in keep], classifier, order_seed, verbose,
                                      data.estimator)
        except BaseException:
            parts.release()
            raise
    return parts, sizes, labels


def _memory_parts(client, servers, data: _Input, random_state, shuffle: bool, replication: int = 1):
    """Split an in-memory input into one part per worker (fewer for small
    inputs: ``_participants.participants``, by the epoch's estimated
    compute; at most the estimator's ``n_jobs``) and scatter each part once; returns
    ``(parts, sizes)``.

    Data scattered to a worker that dies is gone: Dask cannot recompute it,
    and the participant that Dask retries would fail. So with
    ``replication >= 2`` each part lives on ``replication`` workers and the
    participant's part is a loader task that takes the local copy or fetches
    a surviving one (``TrainingParts.from_pieces``). Parts small enough to
    travel inside the task (under ``ps.sgd.scatter-bytes``) and dask inputs
    are recomputable as they are."""
    X, y, sw = data.X, data.y, data.sw
    n = X.shape[0]
    n_parts = _participants.participants(X, max_participants(data.n_jobs, len(servers)),
                                         on_device=data.device != "cpu")
    if n_parts == 1:
        chunks = None
    else:
        # Shuffled, each part in the shuffle's order (not the input's): a
        # participant's sparse rounds keep runs of up to 64 consecutive samples
        # of its part together (_rounds._composition_block), which on rows
        # stored sorted by label were runs of one class (20k text-like rows, 2
        # participants, max_iter=1: accuracy 0.51-0.71 against scikit-learn's 0.76).
        idx = random_state.permutation(n) if shuffle else np.arange(n)
        chunks = np.array_split(idx, n_parts)

    def split():  # the same pieces at every call (keeps no copy of the data)
        if chunks is None:
            return [_PartData(X, y, sw)]
        return [_PartData(X[c], y[c], sw[c]) for c in chunks]

    sizes = [n] if chunks is None else [c.shape[0] for c in chunks]
    scatter = arrays.nbytes(X) >= setting_bytes("sgd", "scatter-bytes")
    parts = TrainingParts.from_pieces(client, split, workers=servers, scatter=scatter, replication=replication)
    return parts, sizes
