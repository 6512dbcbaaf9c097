"""GPU (issue 7): cuda tables on dask-cuda workers. Run with ``pytest -m gpu``
on a machine with cupy, dask-cuda and a CUDA GPU; skipped elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")
dask_cuda = pytest.importorskip("dask_cuda")

import dask_ps  # noqa: E402


@pytest.fixture(scope="module")
def gpu_client():
    from distributed import Client

    # Two workers sharing the one GPU: the tests need two servers.
    with dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,0", dashboard_address=None) as cluster:
        with Client(cluster) as client:
            yield client


@pytest.fixture
def gps(gpu_client):
    ps = dask_ps.ParameterServer(gpu_client)
    yield ps
    for name in ps.tables():
        ps.drop_table(name)


def test_cuda_table_stores_cupy_and_accepts_numpy(gps, gpu_client):
    gps.create_table("g", shape=(1000, 8), dtype="float32", device="cuda", block_rows=100)
    gps.push("g", cupy.ones((1000, 8), dtype="float32"))
    gps.push("g", np.ones((1000, 8), dtype="float32"))  # numpy into a cuda table
    gps.push_rows("g", cupy.asarray([3, 3]), cupy.ones((2, 8), dtype="float32"))
    w = gps.pull("g")
    assert cupy.asnumpy(w)[3, 0] == 4 and float(cupy.asnumpy(w).sum()) == 2 * 8000 + 16
    kinds = gpu_client.run(lambda dask_worker: {
        type(b.data).__module__.split(".")[0] for b in dask_worker.extensions["ps"].store.tables["g"].blocks.values()
    })
    assert all(k == {"cupy"} for k in kinds.values())


def test_auto_device_and_gpu_memory_refusal(gps):
    gps.create_table("a", shape=(100, 4), device="auto")
    assert gps.spec("a").device == "cuda"  # every worker has a GPU
    free = cupy.cuda.runtime.memGetInfo()[0]
    rows = int(free // 8)  # a float64 table as large as the GPU's free memory
    with pytest.raises(dask_ps.PSValueError, match="needs .* on the GPU"):
        gps.create_table("huge", shape=(rows,), device="cuda")
    assert "huge" not in gps.tables()


def test_cupy_push_into_cpu_table(gps):
    gps.create_table("c", shape=(10,), device="cpu")
    gps.push("c", cupy.arange(10, dtype="float64"))
    assert isinstance(gps.pull("c"), np.ndarray) and gps.pull("c").tolist() == list(range(10))


@pytest.mark.parametrize("rule,hp", [("sgd", {"lr": 0.5}), ("adam", {"lr": 0.05})])
def test_optimizer_rules_on_gpu_match_numpy(gps, rule, hp):
    from tests.test_core_pure import ref_steps

    rng = np.random.default_rng(0)
    p0 = rng.normal(size=(64, 4)).astype("float64")
    grads = [rng.normal(size=(64, 4)) for _ in range(3)]
    gps.create_table("o", shape=(64, 4), device="cuda", init=p0, rule=rule, block_rows=16, **hp)
    for g in grads:
        gps.push("o", cupy.asarray(g))
    np.testing.assert_allclose(cupy.asnumpy(gps.pull("o")), ref_steps(rule, p0, grads, **hp), rtol=1e-10)


def test_participants_on_gpu(gps):
    gps.create_table("p", shape=(100, 4), device="cuda", consistency=dask_ps.BSP())

    def train(ctx, rows):
        rows = cupy.asarray(rows)
        for _ in range(3):
            w = ctx.pull_rows("p", rows)
            assert isinstance(w, cupy.ndarray)
            ctx.push_rows("p", rows, cupy.ones((len(rows), 4)))
            ctx.clock()
        return float(ctx.pull("p").sum())

    out = gps.run(train, [np.arange(0, 50), np.arange(50, 100)])
    assert out == [1200.0, 1200.0]


def test_sgd_on_cupy(gpu_client):
    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    X, y = make_classification(n_samples=4000, n_features=20, random_state=0)
    clf = SGDClassifier(loss="log_loss", max_iter=5, batch_size=256, random_state=0, client=gpu_client)
    clf.fit(cupy.asarray(X), cupy.asarray(y))
    assert clf.score(X, y) > 0.8


def test_lda_on_cupy(gpu_client):
    import scipy.sparse as sp

    from dask_ps.decomposition import LatentDirichletAllocation

    rng = np.random.default_rng(0)
    X = sp.csr_matrix(rng.poisson(0.3, size=(200, 100)))
    X = X[np.asarray(X.sum(axis=1)).ravel() > 0]
    # device="cuda": the array-API sampler runs on cupy (scipy input stays on the host)
    lda = LatentDirichletAllocation(n_components=5, max_iter=5, device="cuda", random_state=0, client=gpu_client)
    assert lda._resolved(X) == ("cuda", "array")
    lda.fit(X)
    assert lda.components_.shape == (5, 100)
    assert lda.components_.sum() == pytest.approx(X.sum() + 5 * 100 * lda.topic_word_prior_)  # every token once
