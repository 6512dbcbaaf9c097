"""The device path in the default test run (issue 15): ``device="cuda"``
tables, the session's cache, overlay, write-through and VAP check, update
rules, routing, and the dask-cuda conventions, run on a CPU stand-in for
cupy.

How the stand-in is wired in: ``dask_ps._backend.device_module()`` is the
one place that says what ``device="cuda"`` means (cupy where it imports).
The ``standin`` fixture (``tests/gpu/conftest.py``) replaces it with
``tests/gpu/cupy_standin.py`` for the test's duration through
``_backend.set_device_module``; the in-process cluster's workers are
threads of this process and see the same module. The stand-in's arrays are
their own type, refuse implicit conversion to numpy and numpy operands as
cupy does, copy to and from the host only through explicit calls (which it
counts), and report one fake GPU (``cupy_standin.GPU``).

These tests are not marked ``gpu``: they run everywhere. What only a GPU can
show (real kernels, memory, Dask's cupy serializer, speed) is in
``tests/gpu/test_gpu.py`` (``pytest -m gpu``).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps
from dask_ps import _backend


def _kinds_on_workers(client, name):
    """The array types of table ``name``'s blocks, per worker."""
    return client.run(lambda dask_worker: sorted({
        type(b.data).__name__ + "@" + type(b.data).__module__
        for b in dask_worker.extensions["ps"].store.tables[name].blocks.values()
    }) if name in dask_worker.extensions["ps"].store.tables else [])


# --- the stand-in itself ----------------------------------------------------------------------


def test_standin_refuses_what_cupy_refuses(standin):
    x = standin.asarray(np.arange(6.0).reshape(3, 2))
    host = np.ones((3, 2))
    assert not isinstance(x, np.ndarray)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(x)
    for mix in (lambda: x + host, lambda: host + x, lambda: x.__iadd__(host), lambda: host.__iadd__(x),
                lambda: standin.concatenate([x, host])):
        with pytest.raises(TypeError, match="Unsupported type"):
            mix()
    with pytest.raises(TypeError, match="Unsupported type"):
        y = x.copy()
        y[np.array([0, 2])] += host[:2]  # numpy index: allowed; numpy operand: not
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray"):
        x[:] = host
    assert not hasattr(x.flags, "writeable")  # cupy has no read-only arrays
    with pytest.raises(TypeError, match="only supports"):
        standin.add.at(standin.zeros(3, dtype=np.int16), np.array([0, 0]), standin.ones(2, dtype=np.int16))
    # explicit copies work, and are counted
    standin.reset_transfers()
    assert x.get().sum() == 15 and standin.asnumpy(x).shape == (3, 2)
    assert standin.transfers["d2h_calls"] == 2 and standin.transfers["d2h_bytes"] == 2 * 48
    # numpy functions dispatch to the stand-in; reductions stay on the device
    assert isinstance(np.concatenate([x, x]), standin.ndarray) and isinstance(x.sum(), standin.ndarray)
    assert float(x.sum()) == 15.0


def test_backend_device_module_is_the_standin(standin):
    assert _backend.device_module() is standin
    d = _backend.zeros((2, 3), "float32", "cuda")
    assert _backend.is_cupy(d) and _backend.namespace(np.ones(1), d) is standin
    assert _backend.to_device(np.ones(3), "cuda").__class__ is standin.ndarray
    assert isinstance(_backend.to_device(d, "cpu"), np.ndarray)
    assert isinstance(_backend.to_numpy(d), np.ndarray)
    assert _backend.gpu_info() == {"device": standin.GPU["device"], "free": standin.GPU["free"],
                                   "total": standin.GPU["total"]}


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8",
                                   "uint16", "uint32", "uint64", "complex64", "complex128", "bool"])
def test_scatter_add_on_the_device_every_table_dtype(standin, dtype):
    """``_backend.scatter_add`` is ``numpy.add.at`` on the device for every
    dtype a table may have, also those ``cupy.add.at`` does not take (int8,
    int16, uint8, uint16, complex, bool). It used ``cupyx.scatter_add``
    (deprecated for ``cupy.add.at``, with the same dtype limits)."""
    rng = np.random.default_rng(0)
    idx = np.array([0, 3, 0, 1, 3, 3])
    vals = rng.integers(0, 3, size=(6, 2)).astype(dtype)
    expected = np.zeros((5, 2), dtype=dtype)
    np.add.at(expected, idx, vals)
    out = standin.zeros((5, 2), dtype=dtype)
    _backend.scatter_add(out, standin.asarray(idx), standin.asarray(vals))
    assert isinstance(out, standin.ndarray) and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.get(), expected)


def test_writable_and_read_only_take_device_arrays(standin):
    d = standin.ones(3)
    assert _backend.writable(d) is d  # cupy's flags have no "writeable": every array is
    shared = _backend.read_only(d)  # no read-only flag on the device: a copy
    assert shared is not d and isinstance(shared, standin.ndarray) and shared.get().tolist() == [1, 1, 1]


# --- tables ---------------------------------------------------------------------------------


def test_cuda_table_stores_device_arrays_and_accepts_host_pushes(sps, standin, standin_client):
    sps.create_table("g", shape=(1000, 8), dtype="float32", device="cuda", block_rows=100)
    sps.push("g", standin.ones((1000, 8), dtype="float32"))
    sps.push("g", np.ones((1000, 8), dtype="float32"))  # host data into a cuda table
    sps.push_rows("g", standin.asarray(np.array([3, 3])), standin.ones((2, 8), dtype="float32"))
    sps.push_rows("g", np.array([5, 5]), np.ones((2, 8), dtype="float32"))
    w = sps.pull("g")
    assert isinstance(w, standin.ndarray)
    host = standin.asnumpy(w)
    assert host[3, 0] == 4 and host[5, 0] == 4 and float(host.sum()) == 2 * 8000 + 32
    rows = sps.pull_rows("g", [5, 3, 5])
    assert isinstance(rows, standin.ndarray) and rows.get()[:, 0].tolist() == [4, 4, 4]
    kinds = _kinds_on_workers(standin_client, "g")
    assert set().union(*map(set, kinds.values())) == {"ndarray@cupy_standin"}


def test_one_block_cuda_table_pull(sps, standin):
    """A one-block table's pull hands out a writable copy (``_backend.writable``):
    cupy arrays have no ``flags.writeable`` (AttributeError before)."""
    sps.create_table("one", shape=(4,), device="cuda")
    sps.push("one", np.arange(4.0))
    w = sps.pull("one")
    assert isinstance(w, standin.ndarray) and w.get().tolist() == [0, 1, 2, 3]


def test_empty_pull_rows_of_a_cuda_table_is_a_device_array(sps, standin):
    sps.create_table("e", shape=(10, 3), device="cuda")
    out = sps.pull_rows("e", np.array([], dtype=np.int64))
    assert isinstance(out, standin.ndarray) and out.shape == (0, 3) and out.dtype == np.float64

    def part(ctx, _):
        r = ctx.pull_rows("e", [])
        return type(r).__name__, tuple(r.shape), _backend.is_cupy(r)

    assert sps.run(part, [0]) == [("ndarray", (0, 3), True)]


def test_device_pushes_into_a_cpu_table(sps, standin):
    sps.create_table("c", shape=(10,), device="cpu")
    sps.push("c", standin.arange(10, dtype="float64"))
    sps.push_rows("c", standin.asarray(np.array([1, 1])), standin.ones(2))
    w = sps.pull("c")
    assert isinstance(w, np.ndarray) and w.tolist() == [0, 3] + list(range(2, 10))


@pytest.mark.parametrize("dtype", ["int16", "float32"])
def test_duplicate_rows_summed_on_the_device(sps, standin, dtype):
    """Duplicate rows of a push are merged with ``scatter_add`` on the device
    (``_routing.coalesce_rows``), also for a dtype ``cupy.add.at`` refuses."""
    sps.create_table("d", shape=(20, 2), dtype=dtype, device="cuda")
    rows = standin.asarray(np.array([7, 1, 7, 7, 19]))
    sps.push_rows("d", rows, standin.ones((5, 2), dtype=dtype))
    out = sps.pull("d").get()
    assert out[7].tolist() == [3, 3] and out[1].tolist() == [1, 1] and out[19].tolist() == [1, 1]
    assert int(out.sum()) == 10


@pytest.mark.parametrize("rule,hp", [("sgd", {"lr": 0.5}), ("momentum", {"lr": 0.05, "momentum": 0.9}),
                                     ("adagrad", {"lr": 0.1}), ("adam", {"lr": 0.05})])
def test_update_rules_on_cuda_tables_match_cpu_tables(sps, standin, rule, hp):
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=(64, 4))
    grads = [rng.normal(size=(64, 4)) for _ in range(3)]
    for device in ("cuda", "cpu"):
        sps.create_table(f"o_{device}", shape=(64, 4), device=device, init=p0, rule=rule, block_rows=16, **hp)
    for i, g in enumerate(grads):
        sps.push("o_cuda", standin.asarray(g) if i % 2 else g)  # device and host gradients
        sps.push("o_cpu", g)
    sps.push_rows("o_cuda", standin.asarray(np.array([2, 40])), standin.ones((2, 4)))
    sps.push_rows("o_cpu", [2, 40], np.ones((2, 4)))
    on_device = sps.pull("o_cuda")
    assert isinstance(on_device, standin.ndarray)
    np.testing.assert_allclose(on_device.get(), sps.pull("o_cpu"), rtol=1e-12)


# --- participants: cache, overlay, write-through, VAP -------------------------------------------


MODELS = {
    "bsp": lambda: dask_ps.BSP(),
    "ssp": lambda: dask_ps.SSP(1),
    "essp": lambda: dask_ps.ESSP(1),
    "vap": lambda: dask_ps.VAP(1e9),
    "asp": lambda: dask_ps.ASP(),
}


def _mixed_pushes(ctx, rows, host_first, table, device_mod):
    """Pushes of this participant for one clock: dense and rows, host and
    device in turn; between them, reads that must include them."""
    n, k = 40, 3
    dev = device_mod.asarray
    ones_dense = np.ones((n, k))
    ones_rows = np.ones((len(rows), k))
    first, second = (lambda a: a, dev) if host_first else (dev, lambda a: a)
    ctx.push_rows(table, first(rows), first(ones_rows))   # rows, one kind
    mid = ctx.pull_rows(table, rows)                          # own row push on top of the cache
    ctx.push(table, second(ones_dense))                       # dense, the other kind
    whole = ctx.pull(table)                                   # own dense + row pushes overlaid
    ctx.push_rows(table, second(rows), second(ones_rows))    # rows, the other kind
    again = ctx.pull_rows(table, rows)
    ctx.flush()                                               # write-through into the cache
    after = ctx.pull_rows(table, rows)
    return mid, whole, again, after


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_own_writes_of_host_and_device_data(sps, standin, model, device):
    """A participant pushing host data into a cuda table, or device data into
    a cpu table, reads its own writes (read-my-writes) under every model: the
    pull overlay (``out + self.dense``), the write-through after a flush
    (``e.values += vals``) and the VAP check (``total += vals``) mixed numpy
    and device arrays and raised before."""
    sps.create_table("t", shape=(40, 3), device=device, consistency=MODELS[model](), block_rows=10)
    xp_name = "ndarray@cupy_standin" if device == "cuda" else "ndarray@numpy"

    def participant(ctx, part):
        rank, rows = part
        out = []
        for c in range(2):
            ctx.pull_rows("t", rows)  # fills the cache (where the model caches)
            mid, whole, again, after = _mixed_pushes(ctx, rows, host_first=(rank + c) % 2 == 0, table="t",
                                                     device_mod=_backend.device_module())
            kinds = {type(a).__name__ + "@" + type(a).__module__ for a in (mid, whole, again, after)}
            out.append((kinds, [_backend.to_numpy(a).tolist() for a in (mid, whole, again, after)]))
            ctx.clock()
        return out

    parts = [(0, np.arange(0, 20, 2)), (1, np.arange(1, 20, 2))]
    results = sps.run(participant, parts)
    for rank, res in enumerate(results):
        for c, (kinds, (mid, whole, again, after)) in enumerate(res):
            assert kinds == {xp_name}
            # Own pushes of this clock: +1 (rows), +1 (dense), +1 (rows).
            # Others' pushes and own earlier clocks depend on the model: at least own earlier ones.
            own_before = 3 * c
            assert all(v >= own_before + 1 for row in mid for v in row), (model, rank, c, mid)
            assert all(v >= own_before + 3 for row in again for v in row)
            assert all(v >= own_before + 3 for row in after for v in row)
            mine = parts[rank][1]
            assert all(whole[r][0] >= own_before + 2 for r in mine)
    total = sps.pull("t")
    total = _backend.to_numpy(total)
    # every element: 2 participants x 2 clocks x 1 dense; rows of their own: + 2 x 2 per clock
    expected = np.full((40, 3), 4.0)
    expected[:20] += 4.0
    np.testing.assert_array_equal(total, expected)


@pytest.mark.parametrize("rule,device", [("sgd", "cuda"), ("sgd", "cpu"), ("sum", "cuda"), ("sum", "cpu")])
def test_vap_value_bound_with_host_and_device_pushes(sps, standin, rule, device):
    """The VAP check sums a participant's pending pushes (``max_abs``): for
    an optimizer rule every pending step in order (``total += vals``), for a
    sum the dense and row parts. Host and device pushes of one participant
    mixed there; a push over the bound is flushed at once."""
    hp = {"lr": 1.0} if rule == "sgd" else {}
    sps.create_table("v", shape=(8, 2), device=device, rule=rule, consistency=dask_ps.VAP(10.0), **hp)

    def participant(ctx, _):
        dev = _backend.device_module().asarray
        ctx.push("v", dev(np.full((8, 2), 1.0)))
        ctx.push("v", np.full((8, 2), 1.0))
        ctx.push_rows("v", np.array([1, 3]), dev(np.full((2, 2), 2.0)))
        ctx.push_rows("v", dev(np.array([2])), np.full((1, 2), 4.0))  # row 2: 6 > 10 / 2 pending: flushed
        ctx.push("v", dev(np.full((8, 2), 1.0)))
        ctx.clock()

    sps.run(participant, [0, 1])
    expected = np.full((8, 2), 2 * 3.0)  # per participant: 3 dense pushes, rows 1 and 3 (+2), 2 (+4)
    expected[[1, 3]] += 2 * 2.0
    expected[2] += 2 * 4.0
    out = sps.pull("v")
    assert _backend.is_cupy(out) == (device == "cuda")
    np.testing.assert_array_equal(_backend.to_numpy(out), -expected if rule == "sgd" else expected)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_clock_aggregated_cuda_table_sums_per_clock(sps, standin, device):
    """aggregate="clock" on the device: own sent pushes held back by the
    servers are added to reads (``ReadCache.own_unsummed``) on device arrays."""
    sps.create_table("s", shape=(6, 2), device=device, consistency=dask_ps.BSP(), aggregate="clock")

    def participant(ctx, rank):
        seen = []
        for _ in range(3):
            w = ctx.pull("s")
            assert _backend.is_cupy(w) == (device == "cuda")
            seen.append(float(w.sum()))
            ctx.push("s", np.ones((6, 2)) if rank == 0 else _backend.device_module().ones((6, 2)))
            ctx.flush()
            mine = ctx.pull_rows("s", [0, 5])  # own flushed push of this clock included
            assert _backend.is_cupy(mine) == (device == "cuda")
            seen.append(float(mine.sum()))
            ctx.clock()
        return seen

    out = sps.run(participant, [0, 1])
    for seen in out:
        # clock c: the sum of clocks < c (2 x 12 each), then + own 4 elements of rows 0 and 5
        assert seen == [0.0, 4.0, 24.0, 8.0 + 4.0, 48.0, 16.0 + 4.0]


# --- dask-cuda conventions ----------------------------------------------------------------------


def test_auto_device_is_cuda_where_the_workers_have_a_gpu(sps, standin):
    sps.create_table("a", shape=(100, 4), device="auto")
    assert sps.spec("a").device == "cuda"
    assert isinstance(sps.pull("a"), standin.ndarray)
    standin.GPU["count"] = 0  # the same workers, no GPU visible
    sps.create_table("b", shape=(100, 4), device="auto")
    assert sps.spec("b").device == "cpu"
    with pytest.raises(dask_ps.PSValueError, match=r"'c'.*device='cuda' but worker\(s\).*no usable GPU"):
        sps.create_table("c", shape=(100, 4), device="cuda")


def test_cuda_table_larger_than_the_gpus_free_memory_is_refused(sps, standin):
    standin.GPU["free"] = 2**20  # 1 MiB free on the (one, shared) fake GPU
    with pytest.raises(dask_ps.PSValueError, match=r"table 'huge' needs .* on the GPU 0000:5a:00\.0.*free"):
        sps.create_table("huge", shape=(2**17,), device="cuda", block_rows=2**13)
    assert "huge" not in sps.tables()
    sps.create_table("fits", shape=(2**10,), device="cuda")  # 8 KiB
    assert sps.spec("fits").device == "cuda"


def _fake_rmm(calls):
    rmm = types.ModuleType("rmm")
    rmm.reinitialize = lambda **kw: calls.append(("reinitialize", kw))
    allocators = types.ModuleType("rmm.allocators")
    cupy_mod = types.ModuleType("rmm.allocators.cupy")
    cupy_mod.rmm_cupy_allocator = "rmm_cupy_allocator"
    rmm.allocators = allocators
    allocators.cupy = cupy_mod
    return {"rmm": rmm, "rmm.allocators": allocators, "rmm.allocators.cupy": cupy_mod}


def test_rmm_pool_option_set_up_on_the_workers(standin, monkeypatch):
    """``ps.rmm-pool-size``: the worker plugin's setup makes an rmm pool of
    that size on each worker's GPU and has cupy allocate from it (where rmm
    imports; dask-cuda's own ``rmm_pool_size`` does the same for its workers).
    A fake rmm module records the calls."""
    import dask

    calls = []
    monkeypatch.setattr(_backend, "_rmm_pool_size", None)  # no pool made in this process yet
    for name, mod in _fake_rmm(calls).items():
        monkeypatch.setitem(sys.modules, name, mod)
    with dask.config.set({"ps.rmm-pool-size": "64 MiB"}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("r", shape=(10,), device="cuda")
        assert isinstance(ps.pull("r"), standin.ndarray)
    # once: the two in-process workers share this process (and its GPU); a
    # dask-cuda worker is a process of its own
    assert calls == [("reinitialize", {"pool_allocator": True, "initial_pool_size": 64 * 2**20})]
    assert standin.cuda.get_allocator() == "rmm_cupy_allocator"
    standin.cuda.set_allocator(None)


def test_rmm_pool_option_off_by_default_and_without_rmm(standin, monkeypatch, caplog):
    import dask

    assert dask.config.get("ps.rmm-pool-size") is None
    assert _backend.setup_device_memory(None) is False
    monkeypatch.setitem(sys.modules, "rmm", None)  # rmm does not import
    with caplog.at_level("WARNING", logger="dask_ps"):
        assert _backend.setup_device_memory("1 GiB") is False
    assert "rmm" in caplog.text and "ps.rmm-pool-size" in caplog.text
