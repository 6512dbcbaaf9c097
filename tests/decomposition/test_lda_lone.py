"""A run's lone participant keeps its counts local for the run
(``_gibbs._lone_iterations``, ``ps.lda.lone-participant-local``): one read
after its starting counts and one push at the end instead of a pull, a push
and a clock per iteration. Its reads could only ever see its own counts, so
the chain is the one the per-iteration exchange samples: the same model,
bit for bit, which is what these tests compare (a fit, a verbose fit whose
monitor reads the evaluations while the run goes on, a fit in checkpointed
runs, and a partial_fit whose tables start from the fitted counts)."""

from __future__ import annotations

import dask
import numpy as np
import pytest

pytest.importorskip("numba")

from dask_ps.decomposition import LatentDirichletAllocation  # noqa: E402


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as c:
            yield c


def _fit(client, X, exchange_each_iteration: bool, **params):
    with dask.config.set({"ps.lda.lone-participant-local": not exchange_each_iteration}):
        est = LatentDirichletAllocation(client=client, **params).fit(X)
        clocks = [m["clock"] for m in est.metrics_]  # of the fit's last run
        theta = est.transform(X)
        components = est.components_.copy()
        est.partial_fit(X[:15])
    return components, theta, est, clocks


@pytest.mark.parametrize("params", [
    dict(n_components=4, max_iter=30, random_state=0),
    dict(n_components=3, max_iter=12, evaluate_every=3, verbose=1, random_state=1),
    dict(n_components=5, max_iter=14, consistency="bsp", doc_topic_prior=0.3, random_state=2),
], ids=["default-ssp", "verbose-monitor", "bsp"])
def test_a_lone_participant_samples_the_chain_of_the_per_iteration_exchange(client, params):
    X = np.random.RandomState(0).poisson(0.4, size=(60, 40))
    local = _fit(client, X, exchange_each_iteration=False, **params)
    exchanged = _fit(client, X, exchange_each_iteration=True, **params)
    np.testing.assert_array_equal(local[0], exchanged[0])  # components_ after fit
    np.testing.assert_array_equal(local[1], exchanged[1])  # transform
    np.testing.assert_array_equal(local[2].components_, exchanged[2].components_)  # after partial_fit
    assert [h[0] for h in local[2].loglik_history_] == [h[0] for h in exchanged[2].loglik_history_]
    assert [h[-1] for h in local[2].loglik_history_] == [h[-1] for h in exchanged[2].loglik_history_]
    # one participant; two clocks (the starting counts, the final push), not one a sweep
    assert local[3] == [2] and exchanged[3] == [1 + params["max_iter"]], (local[3], exchanged[3])


def test_checkpointed_runs_of_a_lone_participant_match_too(client, tmp_path):
    X = np.random.RandomState(3).poisson(0.4, size=(50, 30))
    params = dict(n_components=3, max_iter=11, checkpoint_every=4, random_state=3)
    local = _fit(client, X, False, checkpoint=str(tmp_path / "a"), **params)
    exchanged = _fit(client, X, True, checkpoint=str(tmp_path / "b"), **params)
    np.testing.assert_array_equal(local[0], exchanged[0])
    np.testing.assert_array_equal(local[1], exchanged[1])
    np.testing.assert_array_equal(local[2].components_, exchanged[2].components_)
    assert local[3] == [2] and exchanged[3] == [1 + 11 - 8]  # the last run: iterations 8-10
