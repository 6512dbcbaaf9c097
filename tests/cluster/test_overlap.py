"""Communication overlapped with computation (issue 12): prefetched reads,
background flushes and clocks, zero-copy pushes. The staleness audit, exact
sums and torn reads of the blocking paths run against them, on worker
processes and on an in-process cluster (``conftest.py``), and a prefetched
read never returns data older than the bound allows when it is consumed."""

from __future__ import annotations

import time

import numpy as np
import pytest

import dask_ps

P = 4  # participants
C = 10  # clocks per participant

MODELS = [
    (dask_ps.BSP(), 0),
    (dask_ps.SSP(staleness=1), 1),
    (dask_ps.SSP(staleness=3), 3),
    (dask_ps.ESSP(staleness=2), 2),
    (dask_ps.SSP(staleness=2, refresh=True), 2),
    (dask_ps.CVAP(staleness=2, bound=0.5), 2),
    (dask_ps.ASP(), None),
]


def _check_read(v, rank, c, staleness):
    """The audit of tests/cluster/test_consistency.py at one read."""
    assert set(np.unique(v)) <= {0.0, 1.0}, f"torn or double-counted value at clock {c}: {np.unique(v)}"
    seen = v.reshape(P, C)
    assert seen[rank, :c].all() and not seen[rank, c:].any(), f"read-my-writes at clock {c}: {seen[rank]}"
    if staleness is not None:
        need = max(0, c - staleness)
        for q in range(P):
            assert seen[q, :need].all(), (
                f"participant {rank} at clock {c}: participant {q}'s markers < {need} must be "
                f"visible, saw {seen[q].astype(int).tolist()}"
            )
    return c - int(seen.sum(axis=1).min())


def overlapped_audit(ctx, _part, delays, staleness, use_rows, for_next):
    """The staleness audit, every read prefetched one clock ahead (issued
    before this clock's push and clock(), consumed after it) and every clock
    reported in the background. ``for_next``: the prefetch names the clock
    it is for (it waits for that clock's bound in the background); else it
    goes out at once and result() must re-read what the bound forbids."""
    rank = ctx.rank
    rng = np.random.default_rng(rank)
    rows = np.arange(P * C)

    def start(clock):
        kw = {"for_clock": clock} if for_next else {}
        return ctx.prefetch_rows("audit", rows, **kw) if use_rows else ctx.prefetch("audit", **kw)

    lags, handle = [], start(0)
    for c in range(C):
        v = handle.result()
        assert ctx.current_clock == c
        lags.append(_check_read(v, rank, c, staleness))
        handle = start(c + 1)  # issued before this clock's own write and clock()
        time.sleep(delays[rank] * rng.uniform(0.5, 1.5))  # "compute" while it travels
        ctx.push_rows("audit", [rank * C + c], [1.0])
        assert ctx.pull_rows("audit", [rank * C + c])[0] == 1.0  # own pending write
        ctx.flush(wait=False)
        ctx.clock(wait=False)
    handle.result()
    return lags, ctx.metrics()["tables"]["audit"]


@pytest.mark.parametrize("for_next", [True, False], ids=["for_clock", "issued_now"])
@pytest.mark.parametrize("use_rows", [False, True], ids=["dense", "rows"])
@pytest.mark.parametrize("model,staleness", MODELS, ids=lambda m: repr(m))
def test_staleness_audit_with_prefetch_and_background_clocks(ps, model, staleness, use_rows, for_next):
    ps.create_table("audit", shape=(P * C,), block_rows=7, consistency=model)
    delays = [0.001, 0.002, 0.001, 0.03]  # participant 3 is the straggler
    out = ps.run(overlapped_audit, range(P), delays=delays, staleness=staleness, use_rows=use_rows,
                 for_next=for_next)
    assert ps.pull("audit").tolist() == [1.0] * (P * C)  # nothing lost, nothing doubled
    lags = [lag for lag, _ in out]
    if staleness is not None:
        assert max(max(lag) for lag in lags) <= staleness
    metrics = [m for _, m in out]
    if model.value_bound is None:  # value-bounded tables are read at result()
        assert sum(m["prefetch_hits"] for m in metrics) > 0  # prefetched values were used
    assert all(m["reads"] >= C for m in metrics)


def test_a_prefetch_older_than_the_bound_is_read_again(ps, tmp_path):
    """BSP, deterministic: rank 0 prefetches at clock 0, before rank 1 has
    pushed its clock-0 marker, and consumes one prefetch at clock 0 and one
    after clock() (which waits for rank 1's clock). The second is older than
    the bound of clock 1, so result() reads again and sees the marker.
    Ordered by a file, no timing."""
    ps.create_table("bsp", shape=(2,), consistency=dask_ps.BSP())

    def train(ctx, _):
        if ctx.rank == 1:
            while not (tmp_path / "prefetched").exists():
                time.sleep(0.005)
            ctx.push_rows("bsp", [1], [1.0])
            ctx.clock()
            return None
        now, later = ctx.prefetch("bsp"), ctx.prefetch("bsp")
        while not (now.done() and later.done()):  # both read before rank 1 writes
            time.sleep(0.005)
        (tmp_path / "prefetched").touch()
        first = now.result()
        ctx.push_rows("bsp", [0], [1.0])
        ctx.clock()
        return first, later.result(), ctx.metrics()["tables"]["bsp"]

    first, second, m = ps.run(train, range(2))[0]
    assert first.tolist() == [0.0, 0.0]
    assert second.tolist() == [1.0, 1.0]  # the bound of clock 1: rank 1's clock-0 write
    assert m["prefetch_rereads"] == 1 and m["prefetch_hits"] == 1


@pytest.mark.parametrize("model", [dask_ps.ASP(), dask_ps.SSP(1, refresh=True)], ids=repr)
@pytest.mark.parametrize("copy", [True, False], ids=["copy", "zero_copy"])
@pytest.mark.parametrize("rows", [False, True], ids=["dense", "rows"])
def test_own_writes_flushed_after_a_prefetch_are_in_its_result(ps, copy, rows, model):
    """Whether the server applied the writer's background flush before or
    after it answered the prefetch, result() holds every own write exactly
    once (added from the flush where the reply shows it lacks it, or, for a
    zero-copy push whose array the caller may have changed, read again).
    One prefetch per clock (these models re-read once per clock)."""
    n = 64
    ps.create_table("own", shape=(n, 2), block_rows=16, consistency=model)

    def train(ctx, _):
        idx = np.arange(0, n, 3)
        total = np.zeros((n, 2))
        for i in range(30):
            h = ctx.prefetch_rows("own", idx) if rows else ctx.prefetch("own")
            vals = np.full((idx.size, 2), float(i + 1))
            ctx.push_rows("own", idx, vals, copy=copy)
            total[idx] += i + 1
            ctx.flush(wait=False)
            got = h.result()
            want = total[idx] if rows else total
            np.testing.assert_array_equal(got, want)
            ctx.clock(wait=bool(i % 2))
        return ctx.metrics()["tables"]["own"]

    (m,) = ps.run(train, [None])
    assert m["prefetch_hits"] + m["prefetch_rereads"] == 30
    if copy:
        assert m["prefetch_hits"] > 0
    expected = np.zeros((n, 2))
    expected[np.arange(0, n, 3)] = sum(range(1, 31))
    np.testing.assert_array_equal(ps.pull("own"), expected)


def test_exact_sums_with_background_flushes_and_zero_copy(ps):
    """The exact-sum workload of test_core_cluster with flush(wait=False),
    clock(wait=False) and copy=False pushes; copying pushes overwrite their
    arrays right after the push (the buffer's copy must be what is sent)."""
    from tests.cluster.test_core_cluster import _integer_workload, _workload_sum

    n_rows, width, n_batches = 500, 4, 600
    ps.create_table("sum", shape=(n_rows, width), block_rows=64, consistency=dask_ps.ASP())

    def train(ctx, rank):
        rng = np.random.default_rng(100 + rank)
        pending = None
        for i, (kind, rows, values) in enumerate(_integer_workload(rank, n_rows, width, n_batches)):
            zero_copy = i % 2 == 0
            if kind == "dense":
                ctx.push("sum", values, copy=not zero_copy)
            else:
                ctx.push_rows("sum", rows, values, copy=not zero_copy)
            if not zero_copy:
                values[...] = 10**6  # the caller reuses its array at once
            r = rng.random()
            if r < 0.05:
                pending = ctx.flush(wait=False)
            elif r < 0.07 and pending is not None:
                pending.wait()
            if i % 100 == 0:
                ctx.clock(wait=False)
        return ctx.rank

    assert ps.run(train, range(4)) == [0, 1, 2, 3]
    np.testing.assert_array_equal(ps.pull("sum"), _workload_sum(4, n_rows, width, n_batches))


def test_torn_reads_never_seen_by_prefetches(ps):
    """A participant's prefetched reads are states that existed: a server
    applies a message to all its blocks at once, so within one server's
    blocks all values agree, while another participant pushes whole-table
    updates in the background (zero-copy). Whole-table and all-rows reads
    (one range per block) alike."""
    n, block = 400_000, 50_000
    ps.create_table("torn", shape=(n,), dtype="float64", block_rows=block, consistency=dask_ps.ASP())
    owner = {p.block: p.worker for p in ps.placement("torn")}

    def train(ctx, _):
        if ctx.rank == 0:
            ones = np.ones(n)
            for _ in range(30):
                ctx.push("torn", ones, copy=False)
                ctx.flush(wait=False)
            return None
        seen = set()
        for i in range(30):
            h = ctx.prefetch("torn") if i % 2 else ctx.prefetch_rows("torn", np.arange(n))
            v = h.result()
            for worker in set(owner.values()):
                vals = np.unique(np.concatenate([v[b * block:(b + 1) * block] for b, o in owner.items() if o == worker]))
                assert vals.size == 1, f"torn read on {worker}: {vals}"
                seen.add(float(vals[0]))
            ctx.clock(wait=False)  # ASP: the next read goes to the servers
        return seen

    assert ps.run(train, range(2))[1]
    assert ps.pull("torn").tolist() == [30.0] * n


def test_metrics_say_where_the_time_went(ps):
    ps.create_table("t", shape=(10,), consistency=dask_ps.SSP(1))

    def train(ctx, _):
        for _ in range(3):
            h = ctx.prefetch("t")
            time.sleep(0.05)  # compute
            h.result()
            ctx.push("t", np.ones(10))
            ctx.clock(wait=False)
        m = ctx.metrics()
        return m

    for m in ps.run(train, range(2)):
        assert m["compute_seconds"] >= 0.15
        assert 0 < m["ps_blocked_seconds"] <= m["ps_seconds"]
    run = list(ps.metrics().values())[-1]  # the latest run, as ps.metrics() reports it
    assert set(run["participants"]) == {0, 1}
    for p in run["participants"].values():
        assert p["compute_seconds"] >= 0.15 and p["ps_seconds"] > 0


def test_prefetch_for_a_later_clock_consumed_early_reads_now(ps):
    """result() before the clock a prefetch was for (its fetch may be
    waiting for this very participant) reads at once instead of waiting."""
    ps.create_table("early", shape=(4,), consistency=dask_ps.BSP())

    def train(ctx, _):
        h = ctx.prefetch("early", for_clock=1)  # waits for every participant's clock 1
        ctx.push("early", np.ones(4))
        v = h.result()  # at clock 0: read now, own pending write included
        ctx.clock()
        with pytest.raises(ValueError, match="for_clock"):
            ctx.prefetch("early", for_clock=0)
        return v

    assert ps.run(train, [None])[0].tolist() == [1.0] * 4


def test_an_overflowing_sum_of_buffered_pushes_is_refused_at_flush(ps):
    """Servers trust a session's NaN/Inf check of each push; two finite
    pushes summed in the buffer can overflow, and that flush is refused
    before anything is sent (the table is unchanged)."""
    ps.create_table("big", shape=(4,), dtype="float32", consistency=dask_ps.ASP())

    def train(ctx, _):
        big = np.full(4, 3e38, np.float32)
        ctx.push("big", big)
        ctx.push("big", big)  # 6e38: inf in float32
        with pytest.raises(dask_ps.PSValueError, match="overflowed"):
            ctx.flush()
        ctx.push_rows("big", [1, 1], np.full(2, 3e38, np.float32))  # duplicates summed: inf too
        with pytest.raises(dask_ps.PSValueError, match="overflowed"):
            ctx.clock()
        ctx.push_rows("big", [2], [1.0])
        ctx.flush()

    ps.run(train, [None])
    assert ps.pull("big").tolist() == [0.0, 0.0, 1.0, 0.0]
