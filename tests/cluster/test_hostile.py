"""Hostile input (issue 6): property-based tests of the shard store and of the
raw worker handlers. Every message either is applied or gets a dask_ps error;
nothing crashes, nothing stored changes on an error."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dask_ps import PSError, PSValueError
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec

SPEC = TableSpec.create("t", (10, 2), "float64", block_rows=4)  # blocks of 4, 4, 2 rows

dtypes = st.sampled_from(["float64", "float32", "int64", "int8", "uint16", "bool", "complex128", "U3", "O"])
junk = st.one_of(st.none(), st.integers(-(2**70), 2**70), st.text(max_size=5), st.floats(allow_nan=True),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


def arrays(max_dims=2):
    return hnp.arrays(
        dtype=st.sampled_from([np.float64, np.float32, np.int64, np.int8, np.complex128, np.bool_]),
        shape=hnp.array_shapes(min_dims=0, max_dims=max_dims, max_side=5),
        elements=None,
    )


rows_strategy = st.one_of(
    st.none(),
    hnp.arrays(np.int64, st.integers(0, 5), elements=st.integers(-(2**40), 2**40)),
    hnp.arrays(np.int64, st.integers(0, 4), elements=st.integers(0, 3), unique=True).map(np.sort),
    arrays(),
    junk,
)
values_strategy = st.one_of(arrays(), junk, hnp.arrays(np.float64, (4, 2), elements=st.floats(allow_nan=True, allow_infinity=True)))
blocks_strategy = st.lists(st.one_of(st.integers(-2, 4), st.text(max_size=2), st.none(), st.floats()), max_size=3)


def message():
    return st.fixed_dictionaries({
        "name": st.one_of(st.just("t"), junk),
        "version": st.one_of(st.just(1), junk),
        "blocks": st.one_of(blocks_strategy, junk),
        "rows": st.one_of(st.lists(rows_strategy, max_size=3), junk),
        "values": st.one_of(st.lists(values_strategy, max_size=3), junk),
    })


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message())
def test_store_applies_or_refuses_and_never_changes_on_error(msg):
    store = ShardStore()
    store.create(SPEC, 1, [0, 1, 2])
    t = store.tables["t"]
    before = {b: blk.data.copy() for b, blk in t.blocks.items()}
    try:
        tab, items = store.validate_push(msg["name"], msg["version"], msg["blocks"], msg["rows"], msg["values"])
    except PSError:
        for b, blk in t.blocks.items():
            np.testing.assert_array_equal(blk.data, before[b])
        assert sorted(t.blocks) == [0, 1, 2]
        return
    store.commit(tab, store.apply(tab, items))  # a valid message applies without error
    assert all(np.isfinite(blk.data).all() for blk in t.blocks.values())
    assert [blk.data.shape for blk in t.blocks.values()] == [(4, 2), (4, 2), (2, 2)]


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({
    "name": st.one_of(st.just("t"), junk),
    "version": st.one_of(st.just(1), junk),
    "blocks": st.one_of(blocks_strategy, junk),
    "rows": st.one_of(st.lists(rows_strategy, max_size=3), junk),
}))
def test_store_pull_answers_or_refuses(msg):
    store = ShardStore()
    store.create(SPEC, 1, [0, 1, 2])
    try:
        t, reqs = store.validate_pull(msg["name"], msg["version"], msg["blocks"], msg["rows"])
    except PSError:
        return
    seqs, values = store.read(t, reqs)
    assert len(values) == len(reqs)


def test_raw_handlers_never_crash_a_worker(ps, client):
    """Hostile messages (hypothesis) straight to a worker's ps_push and ps_pull:
    each gets a reply or an error reply; the table always equals a local
    mirror that applied exactly the accepted messages; the worker survives."""
    ps.create_table("t", shape=(10, 2), block_rows=4)
    spec = ps.spec("t")
    owner = {p.block: p.worker for p in ps.placement("t")}
    mirror = ShardStore()
    mirror.create(spec, 1, [0, 1, 2])

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(message(), st.sampled_from([0, 1, 2]), st.booleans(), st.sampled_from([None, "x", [1], ("r", 1)]))
    def hostile(msg, block, sane_version, run):
        addr = owner[block]
        kwargs = dict(table=msg["name"], version=1 if sane_version else msg["version"],
                      blocks=msg["blocks"], rows=msg["rows"], values=msg["values"])
        if run is not None:
            kwargs["run"] = run
        try:
            client.sync(client.rpc(addr).ps_push, **kwargs)
            accepted = True
        except Exception:  # an error reply, or a message our own client cannot even encode
            accepted = False
        if accepted:  # only messages for blocks this worker hosts are accepted
            t, items = mirror.validate_push(kwargs["table"], 1, kwargs["blocks"], kwargs["rows"], kwargs["values"])
            mirror.commit(t, mirror.apply(t, items))
        try:
            client.sync(client.rpc(addr).ps_pull, table=msg["name"], version=msg["version"],
                        blocks=msg["blocks"], rows=msg["rows"])
        except Exception:
            pass

    hostile()
    expected = np.concatenate([mirror.tables["t"].blocks[b].data for b in range(3)])
    np.testing.assert_array_equal(ps.pull("t"), expected)
    workers = client.scheduler_info()["workers"]
    assert all(addr in workers for addr in owner.values())
    ps.push("t", np.ones((10, 2)))  # still serving normally
    np.testing.assert_array_equal(ps.pull("t"), expected + 1)


def test_public_api_refuses_or_applies(ps):
    """Random calls of the public API: each is applied or raises PSValueError,
    and the table equals a numpy mirror of the accepted calls."""
    ps.create_table("p", shape=(6, 2), block_rows=4)
    mirror, size = np.zeros((6, 2)), np.zeros((6, 2))  # the accepted calls' sum, and of their magnitudes

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(rows_strategy, st.lists(st.integers(-3, 8), max_size=4)), values_strategy)
    def call(rows, values):
        nonlocal mirror, size
        try:
            if rows is None:
                ps.push("p", values)
                mirror = mirror + np.asarray(values)
                size = size + np.abs(np.asarray(values)).astype(np.float64)
            else:
                ps.push_rows("p", rows, values)
                np.add.at(mirror, np.asarray(rows), np.asarray(values))
                np.add.at(size, np.asarray(rows), np.abs(np.asarray(values)).astype(np.float64))
        except PSValueError as e:
            assert "'p'" in str(e)

    call()
    # The servers sum a call's repeated rows before adding them, the mirror
    # one at a time: floating-point sums in another order, equal to within
    # rounding of the terms' magnitudes (once 8 apart at 2e16).
    assert np.all(np.abs(ps.pull("p") - mirror) <= 1e-12 * size), (ps.pull("p"), mirror)


# Handlers that, given a well-formed message naming the table, legitimately
# change or remove it (placement, checkpoints, drops): hostile messages to
# them name other tables, so the check below ("t" unchanged) stays meaningful.
_CHANGES_THE_NAMED_TABLE = {
    "ps_drop_table", "ps_freeze", "ps_set_placement", "ps_install_blocks", "ps_load_blocks",
    "ps_create_shards", "ps_fence", "ps_copy_blocks", "ps_placement_changed",
}


def test_every_worker_handler_survives_hostile_messages(ps, client):
    """Junk (hypothesis) for every parameter of every ``ps_*`` worker handler,
    plus unknown parameters: each call answers or fails with an error reply
    within 5 s, the worker stays in the cluster, and table "t" on it keeps
    its values and keeps serving."""
    import asyncio
    import inspect

    from dask_ps._worker_plugin import WORKER_HANDLERS, PSWorkerPlugin

    HANDLERS = list(WORKER_HANDLERS)

    ps.create_table("t", shape=(10, 2), block_rows=4, init=np.arange(20.0).reshape(10, 2))
    addr = ps.placement("t")[0].worker
    params = {op: [p for p in inspect.signature(getattr(PSWorkerPlugin, op[3:])).parameters if p != "self"]
              for op in HANDLERS}
    others = st.one_of(junk, st.just("t-other"), arrays())

    async def call(op, kwargs):
        return await asyncio.wait_for(getattr(client.rpc(addr), op)(**kwargs), 5)

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(sorted(HANDLERS)), st.data())
    def hostile(op, data):
        names = params[op] + ["bogus"]
        chosen = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
        values = others if op in _CHANGES_THE_NAMED_TABLE else st.one_of(others, st.just("t"))
        kwargs = {k: data.draw(values) for k in chosen}
        try:
            client.sync(call, op, kwargs)
        except asyncio.TimeoutError:
            raise AssertionError(f"{op}({kwargs}) hung")
        except Exception:
            pass  # an error reply (or a message our client cannot encode)

    hostile()
    assert addr in client.scheduler_info()["workers"]
    np.testing.assert_array_equal(ps.pull("t"), np.arange(20.0).reshape(10, 2))
    ps.push("t", np.ones((10, 2)))
    np.testing.assert_array_equal(ps.pull("t"), np.arange(20.0).reshape(10, 2) + 1)
