"""Clock messages combined per process (issue 36, Bösen's process oplog;
dask_ps._clock_combiner): the participants of a run that are threads of one
worker process send each server in another process ONE message per clock.

Counted at the servers (``RunManager.received``: ``clock``, the requests
through the comm; ``clock_sections``, the participants' clocks they
carried). The participants are placed on one worker (their parts are
scattered there), so that every clock message to the other worker leaves
the process. Their start is aligned with ``distributed.Event`` (every one
joined, so a member of the combiner, before the first clock), never by
sleeping.
"""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
from distributed import Event

import dask_ps
from dask_ps import _clock_combiner
from tests.cluster.test_consistency import C, P, audit_participant

CLOCKS = 8


def _set(client, values: dict):
    def set_to(v):
        dask.config.set(v)

    client.run(set_to, values)
    set_to(values)


@pytest.fixture
def combine(client):
    """``combine(window, on=True)``: clock messages combined per process in
    the workers for the test, or not (set back to the defaults after it)."""
    defaults = {k: dask.config.get(k) for k in ("ps.clock.combine-per-process", "ps.clock.combine-window")}
    yield lambda window="20ms", on=True: _set(client, {"ps.clock.combine-per-process": on,
                                                       "ps.clock.combine-window": window})
    _set(client, defaults)


def _received(client) -> dict:
    return client.run(lambda dask_worker: dict(dask_worker.extensions["ps"].run_manager.received))


def _on_one_worker(client, n):
    """``n`` parts scattered to the first worker, and the other worker."""
    a, b = sorted(client.scheduler_info()["workers"])
    return client.scatter(list(range(n)), workers=[a], broadcast=False, hash=False), a, b


def _aligned_start(ctx, prefix):
    """Every participant joined (a member of its process's combiner) before
    any clock."""
    Event(f"{prefix}-{ctx.rank}").set()
    for r in range(ctx.n_participants):
        assert Event(f"{prefix}-{r}").wait(timeout=60)


def _train(ctx, part, table, clocks, prefix, stop_at=None, fail_at=None, lockstep=False):
    _aligned_start(ctx, prefix)
    for c in range(clocks):
        if ctx.rank == 0 and c == stop_at:
            return ctx.worker.address
        if ctx.rank == 0 and c == fail_at:
            raise ValueError("participant 0 failed on purpose")
        ctx.pull(table)
        ctx.push(table, np.ones(ctx.n_participants * 10))
        ctx.clock()
        if lockstep:  # every participant handed in clock c before any goes on
            _aligned_start(ctx, f"{prefix}-c{c}")
    return ctx.worker.address


def _in_processes(client) -> bool:
    return any(pid != os.getpid() for pid in client.run(os.getpid).values())


def _delta(after, before, addr, key):
    return after[addr].get(key, 0) - before[addr].get(key, 0)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("consistency", [dask_ps.BSP(), dask_ps.SSP(1)], ids=repr)
def test_a_process_sends_each_server_one_clock_message_per_clock(ps, client, combine, consistency, n):
    """``n`` participants in one worker process: the server in the other
    process receives exactly ONE clock request per clock from that process,
    carrying ``n`` sections (without combining: ``n`` requests); the sums
    are exact."""
    ps.create_table("t", shape=(n * 10,), block_rows=5, consistency=consistency)
    parts, a, b = _on_one_worker(client, n)
    assert {a, b} <= {o.worker for o in ps.placement("t")}  # blocks on both workers
    for on in (False, True):
        combine("60s", on)  # long: only the siblings (or their leaving) send a message
        before = _received(client)
        prefix = f"cc-{on}-{np.random.randint(1 << 30)}"
        # SSP lets a sibling lag a clock, and one that lags is not waited for
        # (so how many clocks go combined would depend on the load): in
        # lockstep here, so that every clock is combined whatever the load.
        where = ps.run(_train, parts, table="t", clocks=CLOCKS, prefix=prefix,
                       lockstep=isinstance(consistency, dask_ps.SSP))
        after = _received(client)
        for server in (a, b):
            # Dask may have moved a participant to the other worker (stealing):
            # counted where each one ran.
            others = sum(w != server for w in where)
            messages, sections = _delta(after, before, server, "clock"), _delta(after, before, server, "clock_sections")
            if not _in_processes(client):  # every server in the process: direct calls, nothing to combine
                assert messages == sections == 0
                continue
            # Each participant's clocks but the first (a push over several
            # servers held first, before it has a lease: pushes, then a
            # report): one message per participant per clock without
            # combining, one per clock from the process with.
            assert sections >= others * (CLOCKS - 1), (server, where, messages, sections)
            if on and others:  # at most one message a clock from the other process (whichever way its first went)
                assert 1 <= messages <= CLOCKS, (server, where, messages, sections)
            else:
                assert messages == sections, (server, where, messages, sections)
    np.testing.assert_array_equal(ps.pull("t"), np.full(n * 10, 2.0 * n * CLOCKS))


@pytest.mark.parametrize("use_rows", [False, True], ids=["dense", "rows"])
@pytest.mark.parametrize("model,staleness", [(dask_ps.BSP(), 0), (dask_ps.SSP(staleness=2), 2),
                                             (dask_ps.ESSP(staleness=1), 1), (dask_ps.ASP(), None)], ids=repr)
def test_audit_holds_with_clocks_combined_in_the_process(ps, client, combine, model, staleness, use_rows):
    """The exact staleness audit of test_consistency with the clock messages
    of the process combined (one participant much slower, so sections also
    go without a sibling after the window): every read has exactly what its
    bound and read-my-writes require, nothing is lost or counted twice."""
    combine("5ms")
    ps.create_table("audit", shape=(P * C,), block_rows=7, consistency=model)
    parts, a, b = _on_one_worker(client, P)
    before = _received(client)
    lags = ps.run(audit_participant, parts, delays=[0.001, 0.002, 0.001, 0.03], staleness=staleness,
                  use_rows=use_rows)
    after = _received(client)
    assert ps.pull("audit").tolist() == [1.0] * (P * C)
    if staleness is not None:
        assert max(max(lag) for lag in lags) <= staleness
    if staleness == 0 and _in_processes(client):
        # BSP: the sections of a process's participants always wait for each
        # other (each reads every clock): fewer requests than sections.
        assert sum(_delta(after, before, w, "clock") for w in (a, b)) < \
            sum(_delta(after, before, w, "clock_sections") for w in (a, b))


def test_a_sibling_that_leaves_is_not_waited_for(ps, client, combine):
    """Participant 0 leaves the run after 2 clocks; its siblings in the
    process go on (their sections no longer wait for it, even with a
    window of 10 minutes) and every push counts once."""
    combine("600s")
    ps.create_table("lv", shape=(30,), block_rows=5, consistency=dask_ps.BSP())
    parts, a, b = _on_one_worker(client, 3)
    ps.run(_train, parts, table="lv", clocks=6, prefix=f"lv-{np.random.randint(1 << 30)}", stop_at=2)
    np.testing.assert_array_equal(ps.pull("lv"), np.full(30, 2 * 1.0 + 2 * 6.0))


def test_a_sibling_that_fails_releases_the_others(ps, client, combine):
    """Participant 0 fails at its third clock: the run is aborted, its
    error is raised to the caller, and no sibling stays blocked in the
    combiner (window of 10 minutes: a sibling waiting for it would hang
    the test)."""
    combine("600s")
    ps.create_table("fl", shape=(30,), block_rows=5, consistency=dask_ps.BSP())
    parts, a, b = _on_one_worker(client, 3)
    with pytest.raises(ValueError, match="failed on purpose"):
        ps.run(_train, parts, table="fl", clocks=6, prefix=f"fl-{np.random.randint(1 << 30)}", fail_at=2)
    # The next run of the process combines again from scratch.
    assert len(ps.run(_train, parts, table="fl", clocks=2, prefix=f"fl2-{np.random.randint(1 << 30)}")) == 3


def _combined(client) -> int:
    return sum(c.get("messages", 0) for c in client.run(lambda: dict(_clock_combiner.combined)).values())


def test_bsp_sgd_and_lda_are_the_same_bit_for_bit_with_clocks_combined(client, combine):
    """BSP fits of SGD and LDA with 4 participants on 2 worker processes give
    bit-identical models with the clock messages combined per process and
    without."""
    from sklearn.datasets import make_classification

    from dask_ps.decomposition import LatentDirichletAllocation
    from dask_ps.linear_model import SGDClassifier

    X, y = make_classification(4000, 20, random_state=0)
    D = np.random.default_rng(0).poisson(0.3, size=(200, 300))

    def fits():
        with dask.config.set({"ps.sgd.min-samples-per-participant": 500}):
            sgd = SGDClassifier(random_state=0, consistency=dask_ps.BSP(), max_iter=5, tol=None, n_jobs=4,
                                client=client).fit(X, y)
        lda = LatentDirichletAllocation(5, max_iter=4, consistency=dask_ps.BSP(), n_partitions=4, client=client,
                                        random_state=0).fit(D)
        assert len(sgd.metrics_) == 4
        return sgd.coef_.copy(), sgd.intercept_.copy(), lda.components_.copy()

    combine(on=False)
    alone = fits()
    combine("20ms")
    before = _combined(client)
    together = fits()
    assert _combined(client) > before or not _in_processes(client)  # the fits' clocks went combined
    for x, y_ in zip(together, alone):
        np.testing.assert_array_equal(x, y_)


def test_a_replicated_table_sums_exactly_with_clocks_combined(ps, client, combine):
    """Every server of a replicated table (primaries and replicas) gets the
    sections as it got the messages: the sums are exact on every copy."""
    if len(client.scheduler_info()["workers"]) < 2:
        pytest.skip("needs two servers")
    combine("20ms")
    ps.create_table("rp", shape=(40,), block_rows=10, replication=2, consistency=dask_ps.BSP())
    parts, a, b = _on_one_worker(client, 4)
    ps.run(_train, parts, table="rp", clocks=CLOCKS, prefix=f"rp-{np.random.randint(1 << 30)}")
    np.testing.assert_array_equal(ps.pull("rp"), np.full(40, 4.0 * CLOCKS))

    def copies(dask_worker):
        t = dask_worker.extensions["ps"].store.tables["rp"]
        return {b: float(np.asarray(v.data).sum()) for b, v in t.blocks.items()}

    held = client.run(copies)
    assert sum(len(blocks) for blocks in held.values()) == 8  # 4 blocks, 2 copies each
    for blocks in held.values():
        assert all(v == 10 * 4.0 * CLOCKS for v in blocks.values()), blocks
