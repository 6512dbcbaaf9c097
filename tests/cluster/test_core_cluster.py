"""The parameter-server core on a real LocalCluster (issue 2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid

import dask
import numpy as np
import pytest
from distributed import Client, Event, LocalCluster

import dask_ps
from dask_ps import PSValueError, TableExistsError, UnknownTableError
from dask_ps._scheduler_plugin import PSSchedulerPlugin


def test_quickstart_api(ps):
    ps.create_table("w", shape=(1000, 8), dtype="float32", block_rows=100)
    assert len({p.worker for p in ps.placement("w")}) == 2  # spread over both workers
    ps.push("w", np.ones((1000, 8), "float32"))
    ps.push_rows("w", rows=np.array([3, 3, 17]), values=np.ones((3, 8), "float32"))
    w = ps.pull("w")
    assert w.dtype == np.float32 and w.shape == (1000, 8)
    assert w[3, 0] == 3 and w[17, 0] == 2 and w.sum() == 8000 + 24
    np.testing.assert_array_equal(ps.pull_rows("w", np.array([17, 3, 999, 3]))[:, 0], [2, 3, 1, 3])
    assert ps.pull_rows("w", np.array([], dtype=int)).shape == (0, 8)


def test_init_values_and_placement_cover_all_rows(ps):
    init = np.arange(50.0).reshape(25, 2)
    ps.create_table("i", shape=(25, 2), init=init, block_rows=4)
    np.testing.assert_array_equal(ps.pull("i"), init)
    places = ps.placement("i")
    assert [(p.start, p.stop) for p in places] == [(s, min(s + 4, 25)) for s in range(0, 25, 4)]
    ps.create_table("c", shape=(5,), init=lambda shape, dtype: np.full(shape, 2.5, dtype))
    assert ps.pull("c").tolist() == [2.5] * 5
    ps.create_table("s", shape=(3,), init=7)
    assert ps.pull("s").tolist() == [7, 7, 7]


def _integer_workload(rank, n_rows, width, n_batches):
    """Deterministic pushes of one participant: (kind, rows, values)."""
    rng = np.random.default_rng(rank)
    ops = []
    for i in range(n_batches):
        if i % 100 == 99:
            ops.append(("dense", None, rng.integers(-3, 4, size=(n_rows, width)).astype("float64")))
        else:
            rows = rng.integers(0, n_rows, size=rng.integers(1, 20))  # duplicates included
            ops.append(("rows", rows, rng.integers(-5, 6, size=(rows.size, width)).astype("float64")))
    return ops


def _workload_sum(n_participants, n_rows, width, n_batches):
    """The exact table after every participant pushed its _integer_workload."""
    expected = np.zeros((n_rows, width))
    for rank in range(n_participants):
        for kind, rows, values in _integer_workload(rank, n_rows, width, n_batches):
            if kind == "dense":
                expected += values
            else:
                np.add.at(expected, rows, values)
    return expected


def test_exact_sums_under_concurrency(ps):
    n_rows, width, n_batches = 500, 4, 1000
    ps.create_table("sum", shape=(n_rows, width), block_rows=64, consistency=dask_ps.ASP())

    def train(ctx, rank):
        rng = np.random.default_rng(100 + rank)
        for i, (kind, rows, values) in enumerate(_integer_workload(rank, n_rows, width, n_batches)):
            if kind == "dense":
                ctx.push("sum", values)
            else:
                ctx.push_rows("sum", rows, values)
            if rng.random() < 0.05:
                ctx.flush()
            if i % 100 == 0:
                ctx.clock()
        return ctx.rank

    assert ps.run(train, range(4)) == [0, 1, 2, 3]
    np.testing.assert_array_equal(ps.pull("sum"), _workload_sum(4, n_rows, width, n_batches))


def test_batching_sends_one_message_per_server(ps):
    ps.create_table("b", shape=(10_000,), block_rows=1000)

    def train(ctx, _):
        for i in range(10_000):
            ctx.push_rows("b", [i], [1.0])
        ctx.flush()
        return ctx.metrics()["tables"]["b"]

    (m,) = ps.run(train, [None])
    assert m["flushes"] == 1
    assert ps.pull("b").tolist() == [1.0] * 10_000
    # Per-server message count, counted by the servers: at most one push each.
    counts = ps.client.run(lambda dask_worker: dask_worker.extensions["ps"].store.tables["b"].blocks)
    seqs = [blk.seq for blocks in counts.values() for blk in blocks.values()]
    assert seqs == [1] * 10


@pytest.mark.parametrize(
    "name,hp,ref",
    [
        ("sgd", {"lr": 0.5}, "sgd"),
        ("momentum", {"lr": 0.1, "momentum": 0.9}, "momentum"),
        ("adagrad", {"lr": 0.2}, "adagrad"),
        ("adam", {"lr": 0.05}, "adam"),
    ],
)
def test_optimizer_rules_match_numpy_step_by_step(ps, name, hp, ref):
    from tests.core.test_core_pure import ref_steps

    rng = np.random.default_rng(3)
    p0 = rng.normal(size=(40, 3))
    ps.create_table("opt", shape=(40, 3), init=p0, rule=name, block_rows=8, **hp)
    grads = []
    for step in range(4):
        g = rng.normal(size=(40, 3))
        grads.append(g)
        ps.push("opt", g)
        np.testing.assert_allclose(ps.pull("opt"), ref_steps(ref, p0, grads, **hp), rtol=1e-10)


def test_assign_rule_last_write_wins(ps):
    ps.create_table("a", shape=(4,), rule="assign")
    ps.push_rows("a", [1, 2, 1], [5.0, 6.0, 7.0])
    assert ps.pull("a").tolist() == [0, 7, 6, 0]


def test_torn_reads_never_seen(client):
    """Every pull is a state that existed: each server applies a message to
    all its blocks at once, so within one server's blocks all values agree.
    Runs with a low offload threshold too, so both the inline path and the
    offload-thread path (compute aside, swap on the loop) are checked."""
    ps = dask_ps.ParameterServer(client)
    ps.create_table("torn", shape=(2_000_000,), dtype="float64", block_rows=250_000)
    owner = {p.block: p.worker for p in ps.placement("torn")}

    def writer(ctx, event_name):
        ones = np.ones(2_000_000)
        for i in range(20):
            ctx.push("torn", ones)
            ctx.flush()
            if i == 9:  # half way: a read is surely taken while the writes go on (whatever the load)
                Event(event_name).wait(timeout=120)

    def check(w):
        for worker in set(owner.values()):
            vals = np.unique(np.concatenate([w[b * 250_000:(b + 1) * 250_000] for b, o in owner.items() if o == worker]))
            assert vals.size == 1, f"torn read on {worker}: {vals}"
        return float(w[0])

    try:
        for offload in ("1GiB", "1MiB"):
            client.run(lambda o=offload: dask.config.set({"ps.offload-bytes": o}))
            half_way = Event(f"torn-read-{offload}-{uuid.uuid4().hex}", client=client)
            before = check(ps.pull("torn"))
            t = threading.Thread(target=ps.run, args=(writer, [half_way.name]))
            t.start()
            seen = set()
            while t.is_alive():
                seen.add(check(ps.pull("torn")))
                if max(seen) > before:  # a read after a write, before the last ten
                    half_way.set()
            t.join()
            seen.add(check(ps.pull("torn")))
            assert len(seen) > 1  # the reads really overlapped the writes
    finally:
        client.run(lambda: dask.config.set({"ps.offload-bytes": "32MiB"}))
        ps.drop_table("torn")


BAD_PUSHES = [
    ("push", lambda: (np.ones((9, 4)),), "shape"),
    ("push", lambda: (np.ones((10, 4), complex),), "cannot cast"),
    ("push", lambda: ("not an array",), "array"),
    ("push", lambda: ({"a": 1},), "array"),
    ("push", lambda: (np.full((10, 4), np.nan),), "NaN"),
    ("push", lambda: (np.full((10, 4), np.inf),), "NaN or Inf"),
    ("push_rows", lambda: ([10], np.ones((1, 4))), "out of range"),
    ("push_rows", lambda: ([-1], np.ones((1, 4))), "out of range"),
    ("push_rows", lambda: ([1.5], np.ones((1, 4))), "integers"),
    ("push_rows", lambda: ([1, 2], np.ones((3, 4))), "shape"),
    ("push_rows", lambda: ([1], np.ones((1, 5))), "shape"),
    ("pull_rows", lambda: ([11],), "out of range"),
    ("pull_rows", lambda: (["a"],), "integers"),
]


@pytest.mark.parametrize("op,args,msg", BAD_PUSHES)
def test_bad_input_raises_at_caller_and_changes_nothing(ps, op, args, msg):
    init = np.arange(40.0).reshape(10, 4)
    ps.create_table("t", shape=(10, 4), init=init, block_rows=3)
    with pytest.raises(PSValueError, match=msg) as ei:
        getattr(ps, op)("t", *args())
    assert "'t'" in str(ei.value)
    np.testing.assert_array_equal(ps.pull("t"), init)


def test_bad_input_inside_a_participant(ps):
    ps.create_table("t", shape=(5,))

    def train(ctx, _):
        ctx.push_rows("t", [1], [1.0])
        ctx.push_rows("t", [7], [1.0])  # raises here, at the call

    with pytest.raises(PSValueError, match="row 7 is out of range"):
        ps.run(train, [None])
    assert ps.pull("t").tolist() == [0] * 5  # the buffered good push was not sent


def test_unknown_table_and_existing_spec(ps):
    with pytest.raises(UnknownTableError, match="'nope' does not exist"):
        ps.pull("nope")
    with pytest.raises(UnknownTableError):
        ps.push("nope", np.ones(3))
    ps.create_table("t", shape=(5, 2))
    ps.create_table("t", shape=(5, 2))  # identical spec: no-op
    with pytest.raises(TableExistsError, match="already exists"):
        ps.create_table("t", shape=(6, 2))
    with pytest.raises(TableExistsError):
        ps.create_table("t", shape=(5, 2), rule="adam")


def test_malformed_rpc_gets_error_reply_and_worker_survives(ps, client):
    ps.create_table("t", shape=(8,), block_rows=8, init=np.arange(8.0))
    addr = ps.placement("t")[0].worker
    rpc = client.rpc(addr)
    cases = [
        dict(table="t", version=1, blocks=[0], rows=[None], values=["junk"]),
        dict(table="t", version=1, blocks=[5], rows=[None], values=[np.ones(8)]),
        dict(table="t", version=1, blocks=[0], rows=[np.array([100])], values=[np.ones(1)]),
        dict(table="t", version=1, blocks=[0], rows=[None], values=[np.ones(3)]),
        dict(table="t", version=1, blocks=[0], rows=None, values=None),
        dict(table=42, version=1, blocks=[0], rows=[None], values=[np.ones(8)]),
        dict(table="nope", version=1, blocks=[0], rows=[None], values=[np.ones(8)]),
        dict(table="t", version=99, blocks=[0], rows=[None], values=[np.ones(8)]),
        dict(table="t", version=1, blocks=[0], rows=[None], values=[np.full(8, np.nan)]),
    ]
    for msg in cases:
        with pytest.raises(dask_ps.PSError):
            client.sync(rpc.ps_push, **msg)
    with pytest.raises(dask_ps.PSError):
        client.sync(rpc.ps_pull, table="t", version=1, blocks=[0], rows=[np.array([-1])])
    with pytest.raises(TypeError):
        client.sync(rpc.ps_push, bogus=1)
    np.testing.assert_array_equal(ps.pull("t"), np.arange(8.0))
    assert addr in client.scheduler_info()["workers"]


def test_register_twice_is_a_noop(ps, client):
    ps.create_table("keep", shape=(3,), init=1.0)
    client.register_plugin(PSSchedulerPlugin())
    ps2 = dask_ps.ParameterServer(client)
    assert "keep" in ps2.tables() and ps2.pull("keep").tolist() == [1, 1, 1]
    assert len(ps2.servers) == 2


def test_participant_error_propagates_and_does_not_deadlock(ps):
    ps.create_table("bsp", shape=(4,), consistency=dask_ps.BSP())

    def train(ctx, _):
        for i in range(1000):
            ctx.pull("bsp")
            ctx.push("bsp", np.ones(4))
            ctx.clock()
            if ctx.rank == 0 and i == 3:
                raise ValueError("participant 0 failed at clock 4")
        return "never"

    with pytest.raises(ValueError, match="participant 0 failed") as ei:
        ps.run(train, range(3))
    assert "train" in "".join(__import__("traceback").format_tb(ei.value.__traceback__))
    # The others were aborted, not left waiting; a new run works.
    assert ps.run(lambda ctx, p: p * 2, [1, 2]) == [2, 4]


def test_finished_participant_does_not_hold_others(ps):
    ps.create_table("bsp2", shape=(2,), consistency=dask_ps.BSP())

    def train(ctx, n_clocks):
        for _ in range(n_clocks):
            ctx.pull("bsp2")
            ctx.push("bsp2", np.ones(2))
            ctx.clock()
        return ctx.current_clock

    assert ps.run(train, [1, 5, 10]) == [1, 5, 10]
    assert ps.pull("bsp2").tolist() == [16, 16]


def test_participants_run_where_their_data_is(ps, client):
    workers = ps.servers
    futures = [client.scatter(np.full(3, i), workers=[w]) for i, w in enumerate(workers)]

    def where(ctx, part):
        return ctx.worker.address, int(part[0])

    assert ps.run(where, futures) == [(w, i) for i, w in enumerate(workers)]
    # Futures inside a part (a tuple of X and y, say) place it too.
    pairs = [(f, "label") for f in futures]
    assert ps.run(lambda ctx, p: (ctx.worker.address, int(p[0][0])), pairs) == [(w, i) for i, w in enumerate(workers)]
    # A persisted dask collection's partitions work too.
    import dask.array as da

    x = da.ones(10, chunks=5).persist()
    assert ps.run(lambda ctx, p: float(p.sum()), x.to_delayed().tolist()) == [5.0, 5.0]


def test_table_created_after_a_worker_joins():
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as c:
        ps = dask_ps.ParameterServer(c)
        ps.create_table("before", shape=(100,), block_rows=10, init=1.0)
        cluster.scale(2)
        c.wait_for_workers(2)
        ps2 = dask_ps.ParameterServer(c)  # waits until every worker serves
        assert len(ps2.servers) == 2
        ps.create_table("after", shape=(100,), block_rows=10)
        assert len({p.worker for p in ps.placement("after")}) == 2
        ps.push("before", np.ones(100))
        assert ps.pull("before").tolist() == [2.0] * 100
        assert ps.run(lambda ctx, _: float(ctx.pull("before").sum()), [0, 1]) == [200.0, 200.0]


def test_parameter_server_without_a_client_starts_and_closes_a_cluster(tmp_path):
    script = textwrap.dedent(
        """
        import numpy as np, dask_ps
        with dask_ps.ParameterServer(n_workers=2, threads_per_worker=1, dashboard_address=None) as ps:
            ps.create_table("w", shape=(10,))
            ps.push("w", np.ones(10))
            print(ps.pull("w").sum(), len(ps.servers))
            cluster = ps._own_cluster
        print(cluster.status.name)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[:2] == ["10.0", "2"] and lines[2] == "closed"


def test_recreated_table_is_detected_not_written_under_the_new_spec(ps, client):
    a, b = ps, dask_ps.ParameterServer(client)
    a.create_table("re", shape=(4,))
    a.push("re", np.ones(4))
    b.drop_table("re")
    b.create_table("re", shape=(4,), rule="assign")
    with pytest.raises(dask_ps.StaleVersionError, match="dropped and created again"):
        a.push("re", np.full(4, 5.0))
    assert b.pull("re").tolist() == [0, 0, 0, 0]
    a.push("re", np.full(4, 5.0))  # the next call uses the new table
    assert b.pull("re").tolist() == [5, 5, 5, 5]


def test_get_parameter_server_starts_one_cluster_per_process():
    script = textwrap.dedent(
        """
        import dask_ps
        a = dask_ps.get_parameter_server()
        b = dask_ps.get_parameter_server()
        print(a is b, a._own_cluster is not None)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_get_parameter_server_reuses_one_per_client(client):
    assert dask_ps.get_parameter_server(client) is dask_ps.get_parameter_server(client)
    assert dask_ps.get_parameter_server() is dask_ps.get_parameter_server(client)  # the current client


# --- device="cuda" / "auto": placement checks against the workers' GPUs ----------------


def _has_gpu():
    from dask_ps import _backend

    return _backend.gpu_info() is not None


@pytest.mark.skipif(_has_gpu(), reason="checks the refusal on workers without a GPU")
def test_cuda_table_on_workers_without_gpu_is_refused_and_auto_is_cpu(ps):
    with pytest.raises(PSValueError, match=r"'g'.*device='cuda' but worker\(s\).*no usable GPU"):
        ps.create_table("g", shape=(100, 4), device="cuda")
    assert "g" not in ps.tables()
    ps.create_table("a", shape=(100, 4), device="auto")
    assert ps.spec("a").device == "cpu"


def test_cuda_table_larger_than_a_shared_gpus_free_memory_is_refused(monkeypatch):
    """Two in-process workers reporting the same (fake) GPU with 1 MiB free:
    what the table puts on that GPU counts once per worker, so a table whose
    halves would each fit but not together is refused, naming the table."""
    from dask_ps import _backend

    monkeypatch.setattr(_backend, "gpu_info", lambda: {"device": "0000:fake:00.0", "free": 2**20, "total": 2**21})
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        ps = dask_ps.ParameterServer(c)
        assert c.sync(c.scheduler.ps_resolve_device) == "cuda"
        # 1 MiB of float64 in 8 blocks: ~0.5 MiB per worker (< 0.6 MiB), 1 MiB on the GPU (> 0.6 MiB)
        with pytest.raises(PSValueError, match=r"table 'big' needs 1\.00 MiB on the GPU 0000:fake:00\.0.*1\.00 MiB free"):
            ps.create_table("big", shape=(2**17,), device="cuda", block_rows=2**14)
        assert "big" not in ps.tables()
