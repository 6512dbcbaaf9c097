"""GPU (issues 7 and 15): cuda tables on dask-cuda workers, on a real GPU.

Run with ``pytest -m gpu`` on a machine with cupy, dask-cuda and a CUDA GPU
(``scripts/gpu_check.sh`` does, on the lent GPU machine); skipped elsewhere.
The same code paths run in every test run on a CPU stand-in for cupy
(``test_standin.py``, ``test_standin_estimators.py``); these tests add what
only a GPU has: cupy's own kernels (``add.at``, ``bincount``, its random
streams), device memory, two worker processes sharing one GPU (Dask's cupy
serializer between them), and dask-cuda's cluster.
"""

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
    assert isinstance(w, cupy.ndarray)
    assert cupy.asnumpy(w)[3, 0] == 4 and float(cupy.asnumpy(w).sum()) == 2 * 8000 + 16
    on_gpu = gpu_client.run(lambda dask_worker: [
        isinstance(b.data, __import__("cupy").ndarray)
        for b in dask_worker.extensions["ps"].store.tables["g"].blocks.values()
    ])
    assert all(all(v) for v in on_gpu.values()) and sum(map(len, on_gpu.values())) == 10


def test_one_block_table_and_empty_pull_rows(gps):
    gps.create_table("one", shape=(4, 2), device="cuda")
    gps.push("one", np.ones((4, 2)))
    assert isinstance(gps.pull("one"), cupy.ndarray)  # writable copy: cupy has no flags.writeable
    empty = gps.pull_rows("one", np.array([], dtype=np.int64))
    assert isinstance(empty, cupy.ndarray) and empty.shape == (0, 2)


@pytest.mark.parametrize("dtype", ["int16", "float32", "complex64"])
def test_duplicate_rows_summed_with_cupy_add_at(gps, dtype):
    gps.create_table("d", shape=(20, 2), dtype=dtype, device="cuda")
    gps.push_rows("d", cupy.asarray([7, 1, 7, 7, 19]), cupy.ones((5, 2), dtype=dtype))
    out = cupy.asnumpy(gps.pull("d"))
    assert out[7].tolist() == [3, 3] and out[1].tolist() == [1, 1] and out.sum() == 10


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
def test_optimizer_rules_on_gpu_match_cpu_tables(gps, rule, hp):
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=(64, 4)).astype("float64")
    grads = [rng.normal(size=(64, 4)) for _ in range(3)]
    for device in ("cuda", "cpu"):
        gps.create_table(f"o_{device}", shape=(64, 4), device=device, init=p0, rule=rule, block_rows=16, **hp)
    for g in grads:
        gps.push("o_cuda", cupy.asarray(g))
        gps.push("o_cpu", g)
    np.testing.assert_allclose(cupy.asnumpy(gps.pull("o_cuda")), gps.pull("o_cpu"), rtol=1e-10)


@pytest.mark.parametrize("model", [dask_ps.BSP(), dask_ps.SSP(1), dask_ps.VAP(1e9)], ids=["bsp", "ssp", "vap"])
def test_participants_on_gpu_mix_host_and_device_pushes(gps, model):
    """Read-my-writes with host pushes into a cuda table (overlay,
    write-through, the VAP check): it raised on cupy before issue 15."""
    gps.create_table("p", shape=(100, 4), device="cuda", consistency=model)

    def train(ctx, rows):
        drows = cupy.asarray(rows)
        for c in range(3):
            w = ctx.pull_rows("p", drows)
            assert isinstance(w, cupy.ndarray)
            if c % 2:
                ctx.push_rows("p", rows, np.ones((len(rows), 4)))
            else:
                ctx.push_rows("p", drows, cupy.ones((len(rows), 4)))
            mine = ctx.pull_rows("p", rows)
            assert isinstance(mine, cupy.ndarray) and float(mine.min()) >= c + 1
            ctx.clock()
        return float(ctx.pull("p").sum())

    out = gps.run(train, [np.arange(0, 50), np.arange(50, 100)])
    if model.staleness == 0:
        assert out == [1200.0, 1200.0]
    assert float(cupy.asnumpy(gps.pull("p")).sum()) == 1200.0


def test_sgd_on_in_memory_cupy(gpu_client):
    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    X, y = make_classification(n_samples=4000, n_features=20, class_sep=2.0, random_state=0)
    clf = SGDClassifier(loss="log_loss", max_iter=5, batch_size=256, random_state=0, client=gpu_client)
    clf.fit(cupy.asarray(X), cupy.asarray(y))
    assert clf.score(X, y) > 0.8
    np.testing.assert_array_equal(clf.predict(cupy.asarray(X)), clf.predict(X))


def test_sgd_on_dask_cupy_chunks(gpu_client):
    import dask.array as da
    from sklearn.datasets import make_classification

    from dask_ps.linear_model import SGDClassifier

    X, y = make_classification(n_samples=8000, n_features=16, class_sep=2.0, random_state=0)
    dX = da.from_array(X, chunks=(2000, 16)).map_blocks(cupy.asarray, dtype=X.dtype)
    dy = da.from_array(y, chunks=2000).map_blocks(cupy.asarray, dtype=y.dtype)
    clf = SGDClassifier(loss="log_loss", max_iter=3, random_state=0, client=gpu_client).fit(dX, dy)
    assert clf.score(X, y) > 0.8


def test_lda_on_cupy_keeps_count_tables_on_the_gpu(gpu_client, monkeypatch):
    import scipy.sparse as sp

    from dask_ps.decomposition import LatentDirichletAllocation

    created = {}
    original = dask_ps.ParameterServer.create_table

    def create_table(self, name, *args, device="cpu", **kwargs):
        created[name] = device
        return original(self, name, *args, device=device, **kwargs)

    monkeypatch.setattr(dask_ps.ParameterServer, "create_table", create_table)
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(rng.poisson(0.3, size=(200, 100)))
    X = X[np.asarray(X.sum(axis=1)).ravel() > 0]
    lda = LatentDirichletAllocation(n_components=5, max_iter=5, device="cuda", random_state=0, client=gpu_client)
    assert lda._resolved(X) == ("cuda", "array")
    lda.fit(X)
    assert sum(d == "cuda" for d in created.values()) >= 1  # word-topic counts (the totals are its last row)
    assert lda.components_.shape == (5, 100)
    assert lda.components_.sum() == pytest.approx(X.sum() + 5 * 100 * lda.topic_word_prior_)  # every token once


def test_rmm_pool_option(gpu_client):
    pytest.importorskip("rmm")
    import dask
    from distributed import Client

    with dask.config.set({"ps.rmm-pool-size": "256 MiB"}), \
            dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("r", shape=(1000,), device="cuda")
        ps.push("r", np.ones(1000))
        assert float(cupy.asnumpy(ps.pull("r")).sum()) == 1000.0
        names = client.run(lambda: getattr(__import__("cupy").cuda.get_allocator(), "__name__", "?"))
        assert set(names.values()) == {"rmm_cupy_allocator"}, names
