"""The estimators' device path in the default test run (issue 15): SGD on
device arrays (in memory and dask), the array-API minibatch kernel,
prediction, and LDA's array sampler with its count tables on the device, on
the CPU stand-in for cupy (``cupy_standin``; see ``test_standin.py`` and
``tests/gpu/conftest.py`` for how it is wired in).
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_classification, make_regression

import dask_ps
from dask_ps import _backend


@pytest.fixture
def table_devices(monkeypatch):
    """The devices of the tables the estimators create (name -> device)."""
    created = {}
    original = dask_ps.ParameterServer.create_table

    def create_table(self, name, *args, device="cpu", **kwargs):
        created[name] = device
        return original(self, name, *args, device=device, **kwargs)

    monkeypatch.setattr(dask_ps.ParameterServer, "create_table", create_table)
    return created


# --- SGD --------------------------------------------------------------------------------------


def _classification(n=3000, d=12, seed=0):
    X, y = make_classification(n_samples=n, n_features=d, n_informative=6, class_sep=2.0, random_state=seed)
    return X, y


def test_sgd_classifier_fits_an_in_memory_device_array(standin, standin_client, table_devices):
    """``SGDClassifier.fit`` on device arrays in memory: scikit-learn's
    ``validate_data`` converted them to numpy (cupy refuses: TypeError) and
    the device was "cpu" whatever the input. Now X stays on the device, the
    weights table is a cuda table, the minibatch kernel runs on device arrays,
    and predictions on device input are device arrays' labels."""
    from dask_ps.linear_model import SGDClassifier

    X, y = _classification()
    dX, dy = standin.asarray(X), standin.asarray(y)
    standin.reset_transfers()
    clf = SGDClassifier(loss="log_loss", max_iter=5, batch_size=256, random_state=0, client=standin_client)
    clf.fit(dX, dy)
    assert "cuda" in table_devices.values() and set(table_devices.values()) <= {"cuda", "cpu"}
    assert clf.coef_.shape == (1, X.shape[1]) and isinstance(clf.coef_, np.ndarray)
    assert clf.n_features_in_ == X.shape[1] and clf.classes_.tolist() == [0, 1]
    assert clf.score(X, y) > 0.8
    # X crossed to the host at most once in pieces no larger than itself (the
    # labels do: classes and class weights are computed on the host)
    assert standin.transfers["d2h_bytes"] < X.nbytes
    np.testing.assert_array_equal(clf.predict(dX), clf.predict(X))
    np.testing.assert_allclose(_backend.to_numpy(clf.decision_function(dX)), clf.decision_function(X))
    np.testing.assert_allclose(_backend.to_numpy(clf.predict_proba(dX)), clf.predict_proba(X), atol=1e-12)


def test_sgd_regressor_fits_an_in_memory_device_array(standin, standin_client, table_devices):
    from dask_ps.linear_model import SGDRegressor

    X, y = make_regression(n_samples=3000, n_features=8, noise=0.1, random_state=0)
    reg = SGDRegressor(max_iter=5, random_state=0, client=standin_client)
    reg.fit(standin.asarray(X), standin.asarray(y), sample_weight=standin.asarray(np.ones(len(y))))
    assert "cuda" in table_devices.values()
    assert reg.score(X, y) > 0.95
    np.testing.assert_allclose(_backend.to_numpy(reg.predict(standin.asarray(X))), reg.predict(X))
    reg.partial_fit(standin.asarray(X[:500]), standin.asarray(y[:500]))  # on the cluster: not a host block
    assert reg.score(X, y) > 0.95


def test_sgd_on_the_device_catches_up_under_a_bound(standin, standin_client, table_devices):
    """Under SSP(1) two participants on device data start each round from
    the read plus what it missed (``_catch_up``: the changes kept on the
    device, indexed with device arrays); the fit matches scikit-learn's."""
    from sklearn.linear_model import SGDRegressor as SkSGD

    from dask_ps.linear_model import SGDRegressor

    X, y = make_regression(n_samples=3000, n_features=8, noise=0.1, random_state=0)
    sk = [SkSGD(max_iter=5, tol=None, random_state=s).fit(X, y).score(X, y) for s in range(3)]
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000}):
        reg = SGDRegressor(max_iter=5, tol=None, random_state=0, client=standin_client,
                           consistency=dask_ps.SSP(1)).fit(standin.asarray(X), standin.asarray(y))
    assert len(reg.metrics_) == 2 and "cuda" in table_devices.values()
    assert reg.score(X, y) >= min(sk) - 0.02, (reg.score(X, y), sk)


def test_sgd_device_input_is_checked_as_scikit_learn_checks_host_input(standin, standin_client):
    from dask_ps.linear_model import SGDClassifier

    X, y = _classification(n=200)
    clf = SGDClassifier(max_iter=2, client=standin_client)
    bad = X.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.fit(standin.asarray(bad), standin.asarray(y))
    with pytest.raises(ValueError, match="Expected 2D array"):
        clf.fit(standin.asarray(X[:, 0]), standin.asarray(y))
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        clf.fit(standin.asarray(X), standin.asarray(y[:-1]))
    with pytest.raises(ValueError, match="0 sample"):
        clf.fit(standin.asarray(X[:0]), standin.asarray(y[:0]))


def test_minibatch_kernel_on_the_device_is_the_numpy_kernel(standin, standin_client):
    """The array-API minibatch kernel runs the same code on device arrays as
    on numpy (``ps.sgd.kernel: minibatch``): one participant, no shuffling,
    the same model."""
    from dask_ps.linear_model import SGDClassifier

    X, y = _classification(n=1500, d=10)
    kw = dict(loss="hinge", penalty="elasticnet", l1_ratio=0.3, max_iter=3, batch_size=128, shuffle=False,
              tol=None, random_state=0, client=standin_client, average=True)
    with dask.config.set({"ps.sgd.kernel": "minibatch", "ps.sgd.min-samples-per-participant": 10**6}):
        host = SGDClassifier(**kw).fit(X, y)
        device = SGDClassifier(**kw).fit(standin.asarray(X), standin.asarray(y))
    np.testing.assert_allclose(device.coef_, host.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(device.intercept_, host.intercept_, rtol=1e-10, atol=1e-12)


def test_sgd_on_a_dask_array_of_device_chunks(standin, standin_client, table_devices):
    import dask.array as da

    from dask_ps.linear_model import SGDClassifier

    X, y = _classification(n=4000)
    dX = da.from_array(X, chunks=(1000, X.shape[1])).map_blocks(standin.asarray, dtype=X.dtype)
    dy = da.from_array(y, chunks=1000).map_blocks(standin.asarray, dtype=y.dtype)
    clf = SGDClassifier(loss="log_loss", max_iter=3, random_state=0, client=standin_client).fit(dX, dy)
    assert "cuda" in table_devices.values()
    assert clf.score(X, y) > 0.8
    labels = clf.predict(dX).compute(scheduler="sync")
    np.testing.assert_array_equal(_backend.to_numpy(labels), clf.predict(X))


def test_device_rows_of_one_class_a_worker_are_dealt_again(standin, standin_client, caplog):
    """A dask input of device chunks stored sorted by label, one class on
    each worker: the participants' rows are dealt again between them as a
    host input's are (``_exchange.balance``), so the fit is as good as on
    shuffled rows. Device parts were left as they were: each participant
    trained one class (issue 33)."""
    import logging

    import dask.array as da
    from sklearn.linear_model import SGDClassifier as SkSGD

    from dask_ps.linear_model import SGDClassifier

    X, y = _classification(n=4000, seed=3)
    order = np.argsort(y, kind="stable")
    X, y = X[order], y[order]
    workers = sorted(standin_client.scheduler_info()["workers"])
    xs, ys = [], []
    for i in range(8):  # 500 rows a block; blocks 0-3 (class 0) on one worker, 4-7 (class 1) on the other
        a, b, w = 500 * i, 500 * (i + 1), workers[i // 4]
        fx = standin_client.scatter(standin.asarray(X[a:b]), workers=[w], hash=False)
        fy = standin_client.scatter(standin.asarray(y[a:b]), workers=[w], hash=False)
        xs.append(da.from_delayed(fx, shape=(500, X.shape[1]), meta=standin.asarray(X[:0])))
        ys.append(da.from_delayed(fy, shape=(500,), meta=standin.asarray(y[:0])))
    dX, dy = da.concatenate(xs), da.concatenate(ys)
    kw = dict(loss="log_loss", learning_rate="constant", eta0=0.01, max_iter=1, tol=None)
    shuffled = np.random.default_rng(0).permutation(len(y))
    sk = [SkSGD(random_state=s, **kw).fit(X[shuffled], y[shuffled]).score(X, y) for s in range(3)]
    with dask.config.set({"ps.sgd.min-samples-per-participant": 1000}), \
            caplog.at_level(logging.INFO, logger="dask_ps.linear_model"):
        clf = SGDClassifier(random_state=0, client=standin_client, **kw).fit(dX, dy)
    assert len(clf.metrics_) == 2
    assert "dealt again" in caplog.text
    assert clf.score(X, y) >= min(sk) - 0.02, (clf.score(X, y), sk)


# --- LDA --------------------------------------------------------------------------------------


def _corpus(n_docs=120, n_words=60, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.csr_matrix(rng.poisson(0.4, size=(n_docs, n_words)))
    return X[np.asarray(X.sum(axis=1)).ravel() > 0]


def test_lda_on_the_device_keeps_its_count_tables_there(standin, standin_client, table_devices):
    """LDA with ``device="cuda"``: the word-topic table (the topic totals its
    last row) is a cuda table, and a sweep no longer copies the counts device -> host ->
    device each iteration (they were cpu tables: the sampler copied every
    row it pulled to the device and back)."""
    from dask_ps.decomposition import LatentDirichletAllocation

    X = _corpus()
    K, iters = 50, 10
    lda = LatentDirichletAllocation(n_components=K, max_iter=iters, device="cuda", evaluate_every=0,
                                    random_state=0, client=standin_client, consistency=dask_ps.BSP())
    assert lda._resolved(X) == ("cuda", "array")
    standin.reset_transfers()
    lda.fit(X)
    counts = [name for name, device in table_devices.items() if device == "cuda"]
    assert len(counts) >= 1, table_devices  # word-topic counts (the topic totals are its last row)
    nwk_bytes = X.shape[1] * K * 4
    # What crossed device -> host: per iteration the indices of the changed
    # words (a few hundred bytes), then the final state (assignments,
    # document-topic counts, the tables once). Copying the pulled rows back
    # after each sweep moved more than a whole table per iteration.
    assert standin.transfers["d2h_bytes"] < iters * nwk_bytes, standin.transfers
    assert lda.components_.shape == (K, X.shape[1]) and isinstance(lda.components_, np.ndarray)
    assert lda.components_.sum() == pytest.approx(X.sum() + K * X.shape[1] * lda.topic_word_prior_)


def test_lda_device_sampler_is_the_array_api_sampler(standin, standin_client):
    """The device sampler is ``gibbs_sweep_array`` itself: under BSP (sums
    per clock, reproducible) a fit on the device equals the same fit with the
    array sampler on numpy (the stand-in draws numpy's stream)."""
    from dask_ps.decomposition import LatentDirichletAllocation

    X = _corpus(seed=1)
    kw = dict(n_components=3, max_iter=4, evaluate_every=2, random_state=0, client=standin_client,
              consistency=dask_ps.BSP())
    host = LatentDirichletAllocation(device="cpu", sampler="array", **kw).fit(X)
    device = LatentDirichletAllocation(device="cuda", **kw).fit(X)
    np.testing.assert_array_equal(device.components_, host.components_)
    assert [h[2] for h in device.loglik_history_] == pytest.approx([h[2] for h in host.loglik_history_])


def test_gibbs_sweep_array_on_device_arrays_equals_numpy(standin):
    from dask_ps.decomposition import _lda_kernels as k

    rng = np.random.default_rng(3)
    K, V, D, n = 5, 30, 8, 400
    words = rng.integers(V, size=n).astype(np.int64)
    doc = np.sort(rng.integers(D, size=n)).astype(np.int64)
    z = rng.integers(K, size=n).astype(np.int32)
    ndk = np.zeros((D, K), np.int32)
    np.add.at(ndk, (doc, z), 1)
    nwk = np.zeros((V, K), np.int32)
    np.add.at(nwk, (words, z), 1)
    nk = np.bincount(z, minlength=K).astype(np.int64)
    host = [a.copy() for a in (z, ndk, nwk, nk)]
    dev = [standin.asarray(a) for a in (z, ndk, nwk, nk)]
    k.gibbs_sweep_array(np, doc, words, *host[:1], *host[1:], 0.1, 0.01, V * 0.01, 7, batch_size=64)
    k.gibbs_sweep_array(standin, standin.asarray(doc), standin.asarray(words), *dev[:1], *dev[1:], 0.1, 0.01,
                        V * 0.01, 7, batch_size=64)
    for h, d in zip(host, dev):
        assert isinstance(d, standin.ndarray)
        np.testing.assert_array_equal(d.get(), h)
