"""Issue 14, "no silent wrong answers": the worker and session side, without a
cluster. The worker plugin runs in-process on a fake worker (only its
address is used when nothing is replicated); races are injected
deterministically by holding a table's lock."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

import dask_ps
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec
from dask_ps._worker_plugin import PSWorkerPlugin

ME = "tcp://10.0.0.1:1"


class FakeScheduler:
    """What a worker plugin asks the scheduler about runs."""

    def __init__(self, active=("r",)):
        self.active = list(active)

    async def ps_active_runs(self, tables=None, token=None):  # the worker plugin's calls carry the token
        return list(self.active)


def plugin_with(*specs: TableSpec, active=("r",)) -> PSWorkerPlugin:
    """A worker plugin hosting every block of ``specs`` alone (no replicas)."""
    p = PSWorkerPlugin()
    p.worker = SimpleNamespace(address=ME, scheduler=FakeScheduler(active))
    for s in specs:
        p.create_shards(s.to_msg(), 1, list(range(s.n_blocks)), owners=[[ME]] * s.n_blocks)
    return p


def clock_spec(name, rule="sum", n=4, **kw):
    return TableSpec.create(name, (n,), "float64", rule=rule, aggregate="clock",
                            consistency=dask_ps.BSP(), **kw)


async def push(p, table, values, run, sender="r-0", msg_seq=0):
    return await p.push(table=table, version=1, blocks=[0], rows=[None], values=[np.asarray(values, float)],
                        run=run, sender=sender, msg_seq=msg_seq)


# --- item 1: clock-aggregated tables ----------------------------------------------------


def test_pull_racing_the_clock_advance_sees_the_clocks_sums():
    """Two clock-aggregated tables on one worker. The advance to min clock 1
    is held up at table A (its lock is taken); a pull of table B tagged with
    min clock 1 must still contain B's clock-0 sum. (Before the fix the
    advance recorded the min clock first, so the pull skipped applying and
    read B's zeros: the race of issue 14, item 1.)"""
    p = plugin_with(clock_spec("A"), clock_spec("B"))

    async def scenario():
        await push(p, "A", np.ones(4), ("r", 0))
        await push(p, "B", np.ones(4), ("r", 0), msg_seq=1)
        async with p._locks["A"]:  # an advance applying A's sums holds A here
            advance = asyncio.ensure_future(p.clock_advance("r", 1))
            for _ in range(5):  # let it record min clock 1 and block on A
                await asyncio.sleep(0)
            assert not advance.done()
            got = await p.local_pull("B", 1, [0], [None], run=("r", 1))
        await advance
        after = await p.local_pull("A", 1, [0], [None], run=("r", 1))
        return got["values"][0], after["values"][0]

    b, a = asyncio.run(scenario())
    np.testing.assert_array_equal(b, np.ones(4))
    np.testing.assert_array_equal(a, np.ones(4))


def test_sums_installed_with_a_block_are_applied_at_install():
    """A block moved by a placement change carries the per-clock sums its old
    owner had not applied. Sums of clocks the new owner knows to be complete
    are applied at install, so a read without a run tag (``ps.pull``) sees
    them; sums of later clocks wait for their clock."""
    s = clock_spec("A", n=4)
    src = ShardStore()
    t = src.create(s, 1, [0], owners=[["old"]])
    _, items = src.validate_push("A", 1, [0], [None], [np.ones(4)])
    src.accumulate(t, "r", 0, items)
    src.accumulate(t, "r", 2, [(0, None, np.full(4, 10.0))])
    exported = src.export(t, [0])

    p = plugin_with()
    p._min_clock["r"] = 1  # this worker heard that every participant finished clock 0
    p.install_blocks(s.to_msg(), exported, version=2, owners=[[ME]])
    got = asyncio.run(p.local_pull("A", 2, [0], [None]))
    np.testing.assert_array_equal(got["values"][0], np.ones(4))
    # clock 2's sum is still pending, and is applied when clock 2 completes
    got = asyncio.run(p.local_pull("A", 2, [0], [None], run=("r", 3)))
    np.testing.assert_array_equal(got["values"][0], np.full(4, 11.0))


# --- item 4: NaN under a numpy mask ---------------------------------------------------------


def _masked_nan():
    v = np.ma.masked_array(np.array([1.0, np.nan, 3.0, 4.0]), mask=[False, True, False, False])
    assert np.isfinite(v).all()  # what let it through: masked cells are skipped
    return v


def test_masked_values_are_refused_by_the_caller_side_checks():
    from dask_ps._spec import check_rows, check_values

    s = TableSpec.create("m", (4,), "float64")
    with pytest.raises(dask_ps.PSValueError, match="'m'.*masked"):
        check_values(s, _masked_nan(), (4,))
    with pytest.raises(dask_ps.PSValueError, match="'m'.*masked"):
        check_values(s, np.ma.masked_array(np.ones(4)), (4,))  # no cell masked: still refused
    with pytest.raises(dask_ps.PSValueError, match="'m'.*masked"):
        check_rows(s, np.ma.masked_array([0, 9], mask=[False, True]))


def test_masked_values_are_refused_by_the_shard_store_and_change_nothing():
    s = TableSpec.create("m", (4,), "float64")
    st = ShardStore()
    t = st.create(s, 1, [0])
    with pytest.raises(dask_ps.PSValueError, match="'m'.*masked"):
        st.validate_push("m", 1, [0], [None], [_masked_nan()])
    with pytest.raises(dask_ps.PSValueError, match="'m'.*masked"):
        st.validate_push("m", 1, [0], [np.ma.masked_array([0, 1])], [np.ones(2)])
    np.testing.assert_array_equal(t.blocks[0].data, np.zeros(4))


# --- item 5: per-run state is freed at the run's end ------------------------------------------


def test_run_end_frees_the_windows_and_refuses_the_runs_late_pushes():
    s = TableSpec.create("w", (4,), "float64")
    p = plugin_with(s, active=("r",))

    async def scenario():
        await push(p, "w", np.ones(4), ("r", 0), sender="r-0", msg_seq=0)
        await push(p, "w", np.ones(4), ("r", 0), sender="r-0", msg_seq=0)  # re-sent: counted once
        windows = len(p.store.tables["w"].blocks[0].applied)
        await p.run_end("r")
        after = len(p.store.tables["w"].blocks[0].applied)
        with pytest.raises(dask_ps.RunAbortedError, match="ended"):
            await push(p, "w", np.ones(4), ("r", 0), sender="r-0", msg_seq=0)
        with pytest.raises(dask_ps.RunAbortedError, match="ended"):  # unknown to the scheduler
            await push(p, "w", np.ones(4), ("x", 0), sender="x-0", msg_seq=0)
        with pytest.raises(dask_ps.PSValueError, match="participants"):  # not one of its senders
            await push(p, "w", np.ones(4), ("r", 0), sender="someone", msg_seq=5)
        return windows, after

    assert asyncio.run(scenario()) == (1, 0)
    np.testing.assert_array_equal(p.store.tables["w"].blocks[0].data, np.ones(4))


# --- item 8: exactly-once, tested directly ------------------------------------------------------


def test_a_resent_push_is_counted_once_by_the_shard_store():
    """The shard store's half of exactly-once: a message re-sent with the same
    ``(sender, msg_seq)`` is skipped, block by block, also after the block
    moved to another worker (its window moves with it)."""
    s = TableSpec.create("w", (8,), "float64", block_rows=4)
    st = ShardStore()
    t = st.create(s, 1, [0, 1])

    def send(store, table, sender, msg_seq, blocks=(0, 1)):
        t, items = store.validate_push("w", None, list(blocks), [None] * len(blocks),
                                       [np.ones(4)] * len(blocks))
        store.commit(t, store.apply(t, store.unapplied(t, items, sender, msg_seq)))

    send(st, t, "r-0", 7)
    send(st, t, "r-0", 7)  # re-sent: nothing applied
    send(st, t, "r-0", 7, blocks=(1,))  # a partial re-send (failover of one block): nothing
    send(st, t, "r-1", 7)  # another sender's message 7: applied
    send(st, t, "r-0", 8)  # the next message: applied
    assert [t.blocks[b].data.tolist() for b in (0, 1)] == [[3.0] * 4] * 2

    moved = ShardStore()
    moved.install(s, 2, [["b"], ["b"]], st.export(t, [0, 1]))
    send(moved, moved.tables["w"], "r-0", 8)  # re-sent to the block's new owner: nothing
    assert [moved.tables["w"].blocks[b].data.tolist() for b in (0, 1)] == [[3.0] * 4] * 2


def test_a_resent_push_is_counted_once_by_the_push_handler():
    """The worker handler's half: the same message to ``ps_push`` twice (a
    flushed push whose acknowledgement was lost, re-sent by the Router) is
    applied once, for per-push and for per-clock aggregation."""
    p = plugin_with(TableSpec.create("w", (4,), "float64"), clock_spec("c"))

    async def scenario():
        for table in ("w", "c"):
            for _ in range(2):
                await push(p, table, np.ones(4), ("r", 0), sender="r-0", msg_seq=(0 << 24) + 0)
            await push(p, table, np.ones(4), ("r", 0), sender="r-0", msg_seq=(0 << 24) + 1)
        await p.clock_advance("r", 1)
        return [(await p.local_pull(t, 1, [0], [None]))["values"][0] for t in ("w", "c")]

    w, c = asyncio.run(scenario())
    np.testing.assert_array_equal(w, np.full(4, 2.0))
    np.testing.assert_array_equal(c, np.full(4, 2.0))


# --- item 7: the worker handlers check what they act on ---------------------------------------


def test_a_malformed_placement_is_refused_and_the_blocks_stay():
    """``ps_set_placement(owners=[])`` made a worker silently drop its blocks."""
    s = TableSpec.create("t", (8,), "float64", block_rows=4)
    st = ShardStore()
    t = st.create(s, 1, [0, 1], owners=[["a"], ["a"]])
    for owners in ([], [["a"]], [["a"], []], [["a"], ["b", "b"]], [["a"], [None]], "a", None):
        with pytest.raises(dask_ps.PSValueError, match="'t'"):
            st.set_placement("t", s.table_id, 2, owners, "a")
    with pytest.raises(dask_ps.PSValueError, match="version"):
        st.set_placement("t", s.table_id, "2", [["a"], ["a"]], "a")
    assert sorted(t.blocks) == [0, 1] and t.version == 1 and t.owners == [["a"], ["a"]]
    st.set_placement("t", s.table_id, 2, [["a"], ["b"]], "a")  # a real change still drops block 1
    assert sorted(t.blocks) == [0] and t.version == 2
    with pytest.raises(dask_ps.PSValueError, match="'u'"):
        ShardStore().create(TableSpec.create("u", (8,), block_rows=4), 1, [0], owners=[["a"]])


def _replica_plugin(version=1, frozen=False):
    """This worker (ME) is the replica of both blocks of "t"; "tcp://p" is primary."""
    s = TableSpec.create("t", (8,), "float64", block_rows=4, replication=2)
    p = PSWorkerPlugin()
    p.worker = SimpleNamespace(address=ME, scheduler=FakeScheduler())
    p.create_shards(s.to_msg(), version, [0, 1], owners=[["tcp://p", ME]] * 2)
    p.store.tables["t"].frozen = frozen
    return p


async def _forwarded(p, version, forwarder, internal=True):
    return await p.push(table="t", version=version, blocks=[0], rows=[None], values=[np.ones(4)],
                        replica=True, forwarder=forwarder, internal=internal, sender="c", msg_seq=1)


def test_only_the_primary_may_forward_a_push_to_a_replica():
    """A forwarded push (replica=True) sent straight to a replica made the
    copies diverge. Now it needs the internal token and must come from the
    block's recorded primary under the replica's placement version."""
    p = _replica_plugin()
    with pytest.raises(dask_ps.PSError, match="only from the blocks' primary"):
        asyncio.run(_forwarded(p, 1, "tcp://p", internal=False))  # no token
    with pytest.raises(dask_ps.PSValueError, match="only the primary of block"):
        asyncio.run(_forwarded(p, 1, "tcp://someone"))
    with pytest.raises(dask_ps.PSValueError, match="forwarder"):
        asyncio.run(_forwarded(p, 1, None))
    assert p.store.tables["t"].blocks[0].data.sum() == 0
    asyncio.run(_forwarded(p, 1, "tcp://p"))
    assert p.store.tables["t"].blocks[0].data.sum() == 4


def test_a_forward_under_another_placement_version():
    from dask_ps._exceptions import ForwardRefusedError

    p = _replica_plugin(version=3)
    with pytest.raises(ForwardRefusedError):  # the forwarder is behind: not the primary any more
        asyncio.run(_forwarded(p, 2, "tcp://p"))
    with pytest.raises(dask_ps.StaleVersionError):  # this copy is behind, not in a change: fenced
        asyncio.run(_forwarded(p, 4, "tcp://p"))
    assert p.store.tables["t"].blocks[0].data.sum() == 0
    p = _replica_plugin(version=3, frozen=True)  # adopting the forwarder's newer placement
    asyncio.run(_forwarded(p, 4, "tcp://new-primary"))
    assert p.store.tables["t"].blocks[0].data.sum() == 4


def test_a_primary_whose_forward_is_refused_as_stale_does_not_fence_the_replica():
    """A replica refuses a forward from a worker whose placement is older
    (it is not the primary any more): the forwarder's caller gets a
    retryable error, and the replica is not reported as having missed it."""
    from dask_ps._exceptions import ForwardRefusedError

    class Scheduler(FakeScheduler):
        missed = []

        async def ps_replica_missed(self, **kw):
            self.missed.append(kw)

    class Replica:
        async def ps_push(self, **kw):
            assert kw["forwarder"] == ME and kw["token"]
            raise ForwardRefusedError("placement v2 here")

    s = TableSpec.create("t", (4,), "float64", replication=2)
    p = PSWorkerPlugin()
    p.worker = SimpleNamespace(address=ME, scheduler=Scheduler(), rpc=lambda addr: Replica())
    p.create_shards(s.to_msg(), 1, [0], owners=[[ME, "tcp://r"]])
    with pytest.raises(dask_ps.StaleVersionError, match="no longer the primary"):
        asyncio.run(p.push(table="t", version=1, blocks=[0], rows=[None], values=[np.ones(4)],
                           sender="c", msg_seq=1))
    assert Scheduler.missed == []


def _clip_add(param, update, state):
    """A custom rule: add, then clip to [-1, 1]."""
    np.clip(param + update, -1.0, 1.0, out=param)


def test_rules_registered_by_name_travel_as_their_name():
    from dask_ps import rules

    rules.register_rule("clip_add", _clip_add)
    try:
        with pytest.raises(ValueError, match="already registered"):
            rules.register_rule("clip_add", lambda p, u, s: None)
        with pytest.raises(ValueError, match="built-in"):
            rules.register_rule("Sum", _clip_add)
        s = TableSpec.create("t", (4,), rule="clip_add")
        assert s.rule == rules.Registered("clip_add") and "clip_add" in rules.registered_rules()
        msg = s.to_msg()
        assert msg["rule"] == {"rule": "registered", "rule_name": "clip_add"}  # no pickle
        st = ShardStore()
        t = st.create(TableSpec.from_msg(msg), 1, [0])
        _, items = st.validate_push("t", 1, [0], [None], [np.array([0.5, 2.0, -3.0, 0.0])])
        st.commit(t, st.apply(t, items))
        _, items = st.validate_push("t", 1, [0], [np.array([0, 3])], [np.array([0.7, 0.7])])
        st.commit(t, st.apply(t, items))
        assert t.blocks[0].data.tolist() == [1.0, 1.0, -1.0, 0.7]
    finally:
        rules.unregister_rule("clip_add")
    # A worker that lacks the registration refuses the table's blocks at once.
    with pytest.raises(dask_ps.PSValueError, match="'t'.*not registered"):
        ShardStore().create(TableSpec.from_msg(msg), 1, [0])


def test_pickled_rules_can_be_refused():
    import dask

    s = TableSpec.create("t", (4,), rule=_clip_add)
    msg = s.to_msg()
    assert TableSpec.from_msg(msg).rule.name == "custom"
    with dask.config.set({"ps.allow-pickled-rules": False}):
        with pytest.raises(dask_ps.PSValueError, match="'t'.*allow-pickled-rules"):
            TableSpec.from_msg(msg)
        assert TableSpec.from_msg(TableSpec.create("u", (4,), rule="adam", lr=0.1).to_msg()).rule.lr == 0.1
    with dask.config.set({"ps.allow-pickled-rules": "false"}):  # as an environment variable gives it
        with pytest.raises(dask_ps.PSValueError):
            TableSpec.from_msg(msg)


def test_a_hung_worker_holding_the_sole_copy_of_a_table_being_created_is_not_fenced():
    """A table's shards are created before it is registered: under load a
    worker could go quiet while it creates the only copy of a block, and
    fencing it then left the fit's pulls failing over to nowhere for 60 s
    ("stayed unreachable ... WorkerGone")."""
    from dask_ps._liveness import HungWorkers

    creating = {"counts": [["a"], ["b"]]}
    hung = HungWorkers(scheduler=None, members={"a", "b"}, retiring=set(), tables={}, creating=creating,
                       liveness=None, calls=None, worker_rpc=None, in_background=None, repair=None,
                       retiree_left=None, rejoin=None)
    assert "being created" in hung._sole_copies("a", silent={"a"})
    creating.clear()
    creating["weights"] = [["a", "b"], ["b", "a"]]  # replicated: another copy exists
    assert hung._sole_copies("a", silent={"a"}) is None
