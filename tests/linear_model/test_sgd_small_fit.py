"""``fit`` of a small in-memory input with no cluster chosen trains in the
calling process (``ps.sgd.fit-in-process``; ``_training._trains_in_process``).

With ``client=None`` and no current Dask client, the parameter server of a
fit is the embedded cluster, started for it. An input of little work
(``linear_model/_participants.py``) gets one participant on any cluster, and a lone participant keeps the whole table local (one pull at
its start, one push at its end): the run adds only its round trips (tens
of ms a fit, most of ``check_estimator``'s time). Such a fit runs the same
participant on an ``InProcessSession``, as ``partial_fit`` of a small block
does: these tests check that the model is the parameter server's, bit for
bit, and where the cluster path is kept (a client, a checkpoint,
replication, a large input)."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_classification, make_regression
from sklearn.preprocessing import StandardScaler

import dask_ps
from dask_ps.linear_model import SGDClassifier, SGDRegressor
from ps_fixtures import SGD_BY_ROWS

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster, set_as_default=False) as c:  # not the current client: client=None has none
            yield c


@pytest.fixture
def no_current_client(monkeypatch):
    """No current Dask client, whatever clients other tests of the session
    left as the default: ``client=None`` then chooses no cluster."""
    import distributed

    def none():
        raise ValueError("No clients found")

    monkeypatch.setattr(distributed, "get_client", none)


def _classification(n=600, classes=2, seed=0):
    X, y = make_classification(n, 10, n_informative=5, n_classes=classes, random_state=seed)
    return StandardScaler().fit_transform(X), y


def _sparse(n=600):
    X, y = _classification(n)
    X[np.abs(X) < 0.8] = 0
    return sp.csr_matrix(X), y


def _regression(n=600):
    X, y = make_regression(n, 8, noise=1.0, random_state=0)
    return StandardScaler().fit_transform(X), y


CASES = {
    "binary-hinge-tol": (_classification, lambda **c: SGDClassifier(random_state=0, **c), False),
    "multiclass-log-average": (lambda: _classification(classes=3),
                               lambda **c: SGDClassifier(loss="log_loss", average=2, random_state=1, **c), False),
    "sparse-elasticnet-class-weight": (_sparse, lambda **c: SGDClassifier(
        penalty="elasticnet", class_weight={0: 1.0, 1: 3.0}, random_state=2, **c), False),
    "regressor-adaptive-weights": (_regression, lambda **c: SGDRegressor(learning_rate="adaptive", eta0=0.01,
                                                                          random_state=3, **c), True),
    "early-stopping": (_classification, lambda **c: SGDClassifier(early_stopping=True, n_iter_no_change=3,
                                                                 random_state=4, **c), True),
    "float32-modified-huber-no-shuffle": (lambda: tuple(a.astype(np.float32) if a.dtype.kind == "f" else a
                                                        for a in _classification()),
                                          lambda **c: SGDClassifier(loss="modified_huber", shuffle=False, **c),
                                          False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_small_fit_without_a_cluster_is_the_parameter_servers_fit(client, case, no_current_client):
    data, make, weighted = CASES[case]
    X, y = data()
    sw = np.random.RandomState(5).uniform(0.5, 2.0, len(y)) if weighted else None
    ps = dask_ps.get_parameter_server(client)
    on_cluster = make(client=client).fit(X, y, sample_weight=sw)
    assert len(on_cluster.run_ids_) == 1 and on_cluster.run_ids_[0] in ps.metrics()
    runs_before = set(ps.metrics())
    here = make().fit(X, y, sample_weight=sw)  # client=None, no current client
    assert set(ps.metrics()) == runs_before and here.run_ids_ == []  # no run on any cluster
    assert here.metrics_[0]["in_process"] and "in_process" not in on_cluster.metrics_[0]
    np.testing.assert_array_equal(here.coef_, on_cluster.coef_)
    np.testing.assert_array_equal(here.intercept_, on_cluster.intercept_)
    assert here.coef_.dtype == on_cluster.coef_.dtype
    assert here.n_iter_ == on_cluster.n_iter_ and here.t_ == on_cluster.t_
    if getattr(on_cluster, "average", False):
        np.testing.assert_array_equal(here._average_coef, on_cluster._average_coef)
    # and so is what a later partial_fit and warm start build on
    np.testing.assert_array_equal(here.predict(X), on_cluster.predict(X))


def test_a_fit_with_the_current_client_runs_on_its_cluster(client):
    from distributed import Client

    X, y = _classification(300)
    with Client(client.scheduler.address) as current:  # the current client: the user's cluster
        est = SGDClassifier(max_iter=3, tol=None, random_state=0).fit(X, y)
        assert len(est.run_ids_) == 1 and est.run_ids_[0] in dask_ps.get_parameter_server(current).metrics()


def test_where_the_cluster_path_is_kept(client, tmp_path, no_current_client):
    """The rule (``_trains_in_process``), without fitting: a client, a
    checkpoint, replication, ``ps.sgd.fit-in-process: false``, a large or
    a dask input keep a fit on a cluster; ``partial_fit`` follows its own
    setting whatever the client."""
    import dask.array as da

    from dask_ps.linear_model._training import _trains_in_process

    X, y = _classification(300)

    def rule(est, X=X, y=y, partial=False, checkpoint=None):
        return _trains_in_process(est, est._validate_input(X, y, None, reset=True), partial, checkpoint)

    assert rule(SGDClassifier())
    assert not rule(SGDClassifier(client=client))
    assert not rule(SGDClassifier(), checkpoint=str(tmp_path / "ckpt"))
    assert not rule(SGDClassifier(replication=2))
    with dask.config.set({"ps.sgd.fit-in-process": False}):
        assert not rule(SGDClassifier())
        assert rule(SGDClassifier(client=client), partial=True)
    with dask.config.set({"ps.sgd.partial-fit-in-process": False}):
        assert not rule(SGDClassifier(), partial=True) and rule(SGDClassifier())
    with dask.config.set({"ps.sgd.min-epoch-seconds-per-participant": 1e-5}):  # 300 x 10: ~24 us an epoch
        assert not rule(SGDClassifier())  # work for two participants
    Xl, yl = _classification(2 * 10000 + 10)
    with dask.config.set(SGD_BY_ROWS):  # the rule by rows: 2 participants
        assert not rule(SGDClassifier(), Xl, yl)
    assert rule(SGDClassifier(), Xl, yl)  # by work (~1.6 ms an epoch): one
    assert not rule(SGDClassifier(client=client), da.from_array(X, chunks=100), da.from_array(y, chunks=100))
