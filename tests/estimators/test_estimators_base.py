"""The shared estimator machinery (``dask_ps._estimators``) without a cluster:
a fake parameter server, a fake client and fake futures."""

from __future__ import annotations

import logging
import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import BaseEstimator, clone

from dask_ps import UnknownTableError
from dask_ps._estimators import (
    CheckpointMismatchError,
    PSEstimatorMixin,
    Progress,
    TrainingParts,
    check_checkpoint,
    checkpoint_record,
    chunk_end,
    lost_workers,
    may_be_worker_loss,
    participant_metrics,
    save_checkpoint,
    temporary_tables,
)
from dask_ps._estimators import _runs


class _FakePS:
    """Tables by name; ``save`` fails as told."""

    def __init__(self, save_errors=()):
        self.tables = {}
        self.saved = []
        self.save_errors = list(save_errors)

    def create_table(self, name, **kwargs):
        self.tables[name] = kwargs

    def drop_table(self, name):
        if name not in self.tables:
            raise UnknownTableError(f"no table {name!r}", name)
        del self.tables[name]

    def save(self, path, tables=None, metadata=None):
        if self.save_errors:
            raise self.save_errors.pop(0)
        self.saved.append((path, list(tables), metadata))


class _FakeFuture:
    def __init__(self, key, value):
        self.key, self.value, self.status = key, value, "finished"

    def __repr__(self):
        return f"<_FakeFuture {self.key} {self.status}>"


class _FakeClient:
    """Runs everything at once; records where things were sent."""

    def __init__(self):
        self.n = 0
        self.scattered = []
        self.submitted = []

    def _future(self, value, key=None):
        self.n += 1
        return _FakeFuture(key or f"f-{self.n}", value)

    def scatter(self, data, workers=None, hash=True):
        if isinstance(data, list):
            return [self.scatter(d, workers, hash) for d in data]
        self.scattered.append((data, workers))
        return self._future(data)

    def submit(self, fn, *args, key=None, pure=True, workers=None, allow_other_workers=False):
        args = [a.value if isinstance(a, _FakeFuture) else a for a in args]
        self.submitted.append((getattr(fn, "__name__", fn), workers, key))
        return self._future(fn(*args) if fn.__module__ != "dask_ps._estimators._data" else args[0], key)

    def compute(self, delayed):
        if isinstance(delayed, list):
            return [self.compute(d) for d in delayed]
        return self._future(delayed())

    def gather(self, futures):
        return [f.value for f in futures]


# --- checkpoints ---------------------------------------------------------------------------


def test_checkpoint_compatibility_rule():
    """A checkpoint resumes only a fit of its kind with an equal fingerprint;
    the error is a ValueError that names the differences (and keeps the
    fragments the estimators' tests match)."""
    fp = {"n_features": 5, "alpha": 1e-4, "classes": np.array([0, 1]), "tol": float("inf")}
    meta = checkpoint_record("kind.A", fp, epoch=3, states=[1, 2])
    assert meta["epoch"] == 3 and meta["n_features"] == 5 and meta["classes"] == [0, 1]
    assert meta["tol"] == "inf" and meta["fingerprint"] == ["alpha", "classes", "n_features", "tol"]
    check_checkpoint(meta, "kind.A", dict(fp), "/p", "Est")  # same fit: fine
    with pytest.raises(CheckpointMismatchError, match="belongs to another fit.*alpha: saved 0.0001, now 0.01"):
        check_checkpoint(meta, "kind.A", dict(fp, alpha=0.01), "/p", "Est")
    with pytest.raises(ValueError, match="belongs to another fit.*extra: saved None, now 1"):
        check_checkpoint(meta, "kind.A", dict(fp, extra=1), "/p", "Est")
    fewer = {k: v for k, v in fp.items() if k != "tol"}
    with pytest.raises(ValueError, match="belongs to another fit.*tol: saved 'inf', now None"):
        check_checkpoint(meta, "kind.A", fewer, "/p", "Est")
    for other in ({"estimator": "kind.B"}, {}):
        with pytest.raises(CheckpointMismatchError, match="not a Est fit.*not written by Est"):
            check_checkpoint(other, "kind.A", fp, "/p", "Est")
    with pytest.raises(ValueError, match="clash"):
        checkpoint_record("kind.A", fp, alpha=1)


def test_save_retries_a_refused_save_then_warns():
    """A RuntimeError (a run in progress) is retried until the deadline;
    then, and at once for another error, a RuntimeWarning and False."""
    ps = _FakePS(save_errors=[RuntimeError("run in progress")] * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert save_checkpoint(ps, "/p", ["t"], {"epoch": 1}, owner="Est", after="epoch 1",
                               retry_seconds=10, poll_seconds=0.001)
    assert ps.saved == [("/p", ["t"], {"epoch": 1})]
    ps = _FakePS(save_errors=[RuntimeError("run in progress")] * 1000)
    with pytest.warns(RuntimeWarning, match="Est: checkpoint after epoch 2 not saved: RuntimeError"):
        assert not save_checkpoint(ps, "/p", ["t"], {}, owner="Est", after="epoch 2",
                                   retry_seconds=0.01, poll_seconds=0.001)
    ps = _FakePS(save_errors=[PermissionError("read-only"), None])
    with pytest.warns(RuntimeWarning, match="iteration 7 not saved: PermissionError"):
        assert not save_checkpoint(ps, "/p", ["t"], {}, owner="Est", after="iteration 7", retry_seconds=10)
    assert len(ps.save_errors) == 1  # not retried


def test_chunk_end():
    assert chunk_end(0, 10, None) == 10
    assert chunk_end(0, 10, 3) == 3 and chunk_end(9, 10, 3) == 10
    assert chunk_end(12, 10, 3) == 12  # a checkpoint past the end: nothing to train


# --- temporary tables ----------------------------------------------------------------------


def test_temporary_tables_are_dropped_on_error(caplog):
    ps = _FakePS()
    ps.create_table("user's")
    with pytest.raises(ZeroDivisionError):
        with temporary_tables(ps) as tables:
            tables.create("a", shape=(3,))
            tables.add("b", "a")  # b never created; a recorded once
            ps.create_table("c")
            tables.add("c")
            1 / 0
    assert list(ps.tables) == ["user's"]
    assert tables.names == []
    assert "could not drop" not in caplog.text  # a table never created is no failure


# --- lost workers --------------------------------------------------------------------------


def test_worker_loss_helpers(monkeypatch):
    from distributed import KilledWorker

    from dask_ps import PSError

    assert may_be_worker_loss(KilledWorker("x", "w", None)) and may_be_worker_loss(OSError())
    assert may_be_worker_loss(PSError("lost")) and not may_be_worker_loss(ValueError("bad input"))

    class Lost(RuntimeError):
        pass

    assert not may_be_worker_loss(Lost()) and may_be_worker_loss(Lost(), also=(Lost,))
    seen = iter([{"a", "b"}, {"a", "b"}, {"a"}])
    monkeypatch.setattr(_runs, "cluster_members", lambda client: next(seen))
    assert lost_workers(None, {"a", "b"}, wait=10, poll_seconds=0.001) == {"b"}
    monkeypatch.setattr(_runs, "cluster_members", lambda client: {"a", "b"})
    assert lost_workers(None, {"a", "b"}, wait=0.0) == set()
    # a task whose input died with its worker is cancelled ("lost dependencies"):
    # a loss to look for (an LDA fit's worker killed between two chunks failed)
    from distributed.client import FutureCancelledError

    assert may_be_worker_loss(FutureCancelledError("k", reason="lost dependencies"))

    class Closed:  # a closed client: nothing is lost, the error is its own (was KeyError: 'workers')
        status = "closed"

        def scheduler_info(self, **kw):
            return {}

    monkeypatch.undo()
    assert lost_workers(Closed(), {"a"}, wait=0.0) == set() and _runs.cluster_members(Closed()) == set()


# --- training parts ------------------------------------------------------------------------


def _prepare(piece):
    return {"n": len(piece), "sum": int(np.sum(piece))}


def test_parts_from_pieces_keep_and_rebuild():
    """Split, scatter, prepare; keep the non-empty parts; a lost part is
    split again, scattered again and prepared again under a new key."""
    client = _FakeClient()
    data = np.arange(10)
    calls = []

    def split():
        calls.append(1)
        return [data[:0], data[:4], data[4:]]

    parts = TrainingParts.from_pieces(client, split, prepare=_prepare, key_prefix="est-prepare-u")
    assert [f.key for f in parts.futures] == ["est-prepare-u-1", "est-prepare-u-2", "est-prepare-u-3"]
    stats = parts.gather(lambda p: p["n"])
    assert stats == [0, 4, 6]
    parts.keep([i for i, n in enumerate(stats) if n > 0])
    assert parts.index == [1, 2] and len(parts) == 2
    parts.futures[1].status = "lost"
    assert parts.rebuild_lost(owner="Est") == [2]
    assert parts.futures[1].key == "est-prepare-u-4" and parts.futures[1].value == {"n": 6, "sum": 39}
    assert len(calls) == 2  # split again for the lost piece
    assert parts.rebuild_lost() == []
    parts.release()
    assert parts.futures == [] and parts.held == []


def test_parts_from_pieces_replicated_and_inline():
    """replication=k: each piece is scattered to k consecutive workers and the
    part is a loader task on the first; scatter=False: the pieces as they are."""
    client = _FakeClient()
    pieces = [np.arange(3), np.arange(4), np.arange(5)]
    workers = ["w0", "w1"]
    parts = TrainingParts.from_pieces(client, lambda: pieces, workers=workers, replication=3)
    assert [w for _, w in client.scattered] == [["w0"], ["w1"], ["w1"], ["w0"], ["w0"], ["w1"]]
    assert len(parts.held) == 6
    loads = [s for s in client.submitted if s[0] == "load_part"]
    assert [w for _, w, _ in loads] == [["w0"], ["w1"], ["w0"]]
    assert [f.value.keys for f in parts.futures] == [("f-1", "f-2"), ("f-4", "f-5"), ("f-7", "f-8")]
    plain = TrainingParts.from_pieces(_FakeClient(), lambda: pieces, workers=workers)
    assert [f.value is p for f, p in zip(plain.futures, pieces)] == [True] * 3
    inline = TrainingParts.from_pieces(_FakeClient(), lambda: pieces, scatter=False)
    assert inline.futures == pieces and inline.rebuild_lost() == []


def test_parts_from_chunks_rebuild_recomputes_the_chunk():
    client = _FakeClient()
    chunks = [lambda: np.arange(2), lambda: np.arange(5)]
    parts = TrainingParts.from_chunks(client, chunks, prepare=_prepare, key_prefix="p")
    assert [f.value["n"] for f in parts.futures] == [2, 5]
    parts.futures[0].status = "error"
    assert parts.rebuild_lost() == [0] and parts.futures[0].value["n"] == 2


# --- metrics, progress ---------------------------------------------------------------------


def test_participant_metrics():
    results = [
        {"metrics": {"clock": 3, "reads": 7}, "seconds": 1.5, "history": [1], "other": 0},
        {"metrics": None, "seconds": 2.0},
    ]
    m = participant_metrics(results, fields=("seconds", "history"))
    assert m == [{"clock": 3, "reads": 7, "seconds": 1.5, "history": [1]}, {"seconds": 2.0}]
    m[0]["clock"] = 0
    assert results[0]["metrics"]["clock"] == 3  # copies


def test_progress_prints_and_logs(capsys, caplog):
    log = logging.getLogger("tests.progress")
    with caplog.at_level(logging.INFO, logger="tests.progress"):
        Progress(0, log).line("quiet")
        Progress(1, log).line("-- Epoch 1: loud")
    assert capsys.readouterr().out == "-- Epoch 1: loud\n"
    assert "loud" in caplog.text and "quiet" not in caplog.text
    assert not Progress(0, log) and Progress(2, log)


# --- parameters: pickling and cloning ------------------------------------------------------


class _Est(PSEstimatorMixin, BaseEstimator):
    def __init__(self, alpha=1.0, client=None, checkpoint=None):
        self.alpha = alpha
        self.client = client
        self.checkpoint = checkpoint


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("a live connection")

    def __deepcopy__(self, memo):
        raise TypeError("a live connection")


def test_pickle_drops_the_client_and_clone_shares_it(tmp_path):
    client = _Unpicklable()
    est = _Est(alpha=[1, 2], client=client, checkpoint=tmp_path / "c")
    est.coef_ = np.ones(3)
    back = pickle.loads(pickle.dumps(est))
    assert back.client is None and back.alpha == [1, 2] and np.array_equal(back.coef_, est.coef_)
    assert est.client is client  # the estimator itself keeps it
    assert pickle.loads(pickle.dumps(_Est(client="tcp://h:8786"))).client == "tcp://h:8786"
    twin = clone(est)
    assert twin.client is client and twin.alpha == [1, 2] and twin.alpha is not est.alpha
    assert not hasattr(twin, "coef_")
    assert twin._checkpoint_path() == str(tmp_path / "c") and _Est()._checkpoint_path() is None
