"""Consistency models on a LocalCluster: exact audits, not statistics (issue 3).

Each participant pushes a one-hot marker for ``(participant, clock)``; at
every read it checks which markers the table's model guarantees are present.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np
import pytest

import dask_ps

P = 4  # participants
C = 10  # clocks per participant


def marker(rank, clock):
    return rank * C + clock


def _hold_until_read(ahead_dir, clock, timeout=60.0):
    """Until the other participants read at ``clock`` (their files in
    ``ahead_dir``): True; False after ``timeout`` s (they could not get
    ahead: the test's check fails)."""
    want = [pathlib.Path(ahead_dir, f"{q}-{clock}") for q in range(P - 1)]
    deadline = time.monotonic() + timeout  # a wait loop, not a timing assertion
    while not all(f.exists() for f in want):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def audit_participant(ctx, _part, delays, staleness, use_rows, ahead_dir=None):
    """Run C clocks; at every read check the model's guarantee exactly.

    With ``ahead_dir`` (a directory every participant reaches) the last
    participant is the straggler by construction, not by its delay: it
    starts clock c only once the others read at clock c + s (2 without a
    bound), so the fast ones reach the bound whatever the machine's load."""
    rank = ctx.rank
    rng = np.random.default_rng(rank)
    lags = []
    ahead = 2 if staleness is None else staleness
    for c in range(C):
        if ahead_dir is not None and rank == P - 1:
            if c + ahead < C and not _hold_until_read(ahead_dir, c + ahead):
                ahead_dir = None  # held once in vain: no more
        else:
            time.sleep(delays[rank] * rng.uniform(0.5, 1.5))
        v = ctx.pull("audit") if not use_rows else ctx.pull_rows("audit", np.arange(P * C))
        assert set(np.unique(v)) <= {0.0, 1.0}, f"torn or double-counted value at clock {c}: {np.unique(v)}"
        seen = v.reshape(P, C)
        # read-my-writes: every own marker so far (all flushed at earlier clocks)
        assert seen[rank, :c].all() and not seen[rank, c:].any()
        if staleness is not None:
            for q in range(P):
                need = max(0, c - staleness)
                assert seen[q, :need].all(), (
                    f"participant {rank} at clock {c}: participant {q}'s markers "
                    f"< {need} must be visible, saw {seen[q].astype(int).tolist()}"
                )
        # How far behind this read is on the slowest participant's markers.
        lags.append(c - int(seen.sum(axis=1).min()))
        if ahead_dir is not None:
            pathlib.Path(ahead_dir, f"{rank}-{c}").touch()
        ctx.push_rows("audit", [marker(rank, c)], [1.0])
        # Own pending write is visible before any flush.
        assert ctx.pull_rows("audit", [marker(rank, c)])[0] == 1.0
        ctx.clock()
    return lags


MODELS = [
    (dask_ps.BSP(), 0),
    (dask_ps.SSP(staleness=1), 1),
    (dask_ps.SSP(staleness=3), 3),
    (dask_ps.ESSP(staleness=2), 2),
    (dask_ps.SSP(staleness=2, refresh=True), 2),
    (dask_ps.ESSP(staleness=1, refresh=True), 1),
    (dask_ps.CVAP(staleness=2, bound=0.5), 2),
    (dask_ps.ASP(), None),
]


@pytest.mark.parametrize("use_rows", [False, True], ids=["dense", "rows"])
@pytest.mark.parametrize("model,staleness", MODELS, ids=lambda m: repr(m))
def test_staleness_audit_with_a_straggler(ps, model, staleness, use_rows, tmp_path):
    ps.create_table("audit", shape=(P * C,), block_rows=7, consistency=model)
    delays = [0.001, 0.002, 0.001, 0.03]  # participant 3 is the straggler (held back: ahead_dir)
    lags = ps.run(audit_participant, range(P), delays=delays, staleness=staleness, use_rows=use_rows,
                  ahead_dir=str(tmp_path))
    final = ps.pull("audit")
    assert final.tolist() == [1.0] * (P * C)  # nothing lost, nothing doubled
    fast = [max(lags[r]) for r in range(3)]
    if staleness is not None:
        assert max(fast) <= staleness
        # The bound is used: fast participants do get ahead by s (SSP did
        # not silently become BSP).
        assert max(fast) == staleness, f"fast participants' max lag {fast}, expected {staleness}"
    else:
        assert max(fast) >= 2  # ASP never waits for the straggler


def test_fast_participants_never_run_ahead_more_than_s(ps):
    ps.create_table("ahead", shape=(P,), consistency=dask_ps.SSP(staleness=2))

    def train(ctx, _):
        gaps = []
        for c in range(8):
            if ctx.rank == 0:
                time.sleep(0.03)
            ctx.push_rows("ahead", [ctx.rank], [1.0])
            ctx.clock()
            # Everyone else's clock is at least what the servers show for them.
            clocks = ctx.pull("ahead")
            gaps.append(ctx.current_clock - clocks.min())
        return gaps

    gaps = ps.run(train, range(P))
    assert max(max(g) for g in gaps) <= 2 + 1  # +1: the own clock() just advanced


@pytest.mark.parametrize("model", [dask_ps.VAP(bound=1.0), dask_ps.CVAP(staleness=100, bound=1.0)], ids=repr)
def test_value_bound_on_invisible_updates(ps, model):
    """VAP(v): the updates made (push returned) but not visible to a reader sum
    to at most v per element. Each participant logs when its pushes return;
    every read checks ``made_total(read start) - value <= v``."""
    v = 1.0
    ps.create_table("vap", shape=(3,), consistency=model)

    def train(ctx, _):
        rng = np.random.default_rng(ctx.rank)
        made, reads, total = [], [], 0.0
        for i in range(150):
            delta = float(rng.choice([0.05, 0.1, 0.15]))
            ctx.push("vap", np.array([delta, delta, 0.0]))
            total += delta
            made.append((time.monotonic(), total))
            if i % 3 == 0:
                t = time.monotonic()
                reads.append((t, float(ctx.pull("vap")[0])))
            if i % 50 == 49:
                ctx.clock()
        return made, reads

    out = ps.run(train, range(P))

    def made_total(t):
        s = 0.0
        for made, _ in out:
            before = [tot for (tm, tot) in made if tm <= t]
            s += before[-1] if before else 0.0
        return s

    deficits = [made_total(t) - val for _, reads in out for t, val in reads]
    assert max(deficits) <= v + 1e-9
    assert max(deficits) > 0.1  # updates really were buffered (the bound is used)
    assert ps.pull("vap")[0] == pytest.approx(sum(made[-1][1] for made, _ in out))


def test_metrics_report_waits_hits_and_staleness(ps):
    ps.create_table("m", shape=(10,), consistency=dask_ps.SSP(staleness=2))

    def train(ctx, _):
        for c in range(6):
            if ctx.rank == 0:
                time.sleep(0.05)
            ctx.pull("m")
            ctx.pull("m")  # second read in a clock: a cache hit
            ctx.push("m", np.ones(10))
            ctx.clock()

    ps.run(train, range(3))
    (run,) = [m for m in ps.metrics().values() if m["clocks"] == (6, 6, 6) or list(m["clocks"]) == [6, 6, 6]]
    parts = run["participants"]
    assert set(parts) == {0, 1, 2}
    for p in parts.values():
        t = p["tables"]["m"]
        assert t["reads"] == 12 and t["cache_hits"] >= 6
        assert set(t["staleness"]) <= {0, 1, 2} and sum(t["staleness"].values()) == 12
        assert t["bytes_pushed"] == 6 * 80
    assert parts[1]["clock_wait_seconds"] + parts[2]["clock_wait_seconds"] > 0.05  # fast ones waited


def test_restarted_participant_does_not_count_twice(ps, client):
    """A participant that joins again (Dask retried its task) resumes at the
    clock the run recorded for it run-wide: its last clock's message may
    have reached some servers only, so it repeats that clock (its pushes
    applied already are skipped: same numbers); its repeated clock reports
    count once."""
    ps.create_table("r", shape=(2,), consistency=dask_ps.BSP())
    from dask_ps import Session

    def train(ctx, _):
        for c in range(ctx.current_clock, 5):
            ctx.pull("r")
            ctx.push_rows("r", [0], [1.0])
            ctx.clock()
            if ctx.rank == 1 and c == 2 and not getattr(train, "retried", False):
                # Simulate Dask re-running this task: a fresh session joins as rank 1.
                train.retried = True
                again = Session(ctx.run_id, ctx.rank, ctx.n_participants, ctx.worker)
                again._join()
                assert again.current_clock == 2  # 3 clock messages sent: the 3rd counts where it arrived
                again._sync(again._reports.to_servers, "run_clock", clock=2)  # a repeated report: counted once
        return ctx.current_clock

    assert ps.run(train, range(2)) == [5, 5]
    assert ps.pull("r")[0] == 10


def test_essp_servers_push_fresh_rows(ps):
    """ESSP keeps the SSP guarantee (audited above) and servers refresh the
    readers' caches after clock advances: reads are served from those pushes."""
    ps.create_table("audit", shape=(P * C,), block_rows=7, consistency=dask_ps.ESSP(staleness=1))
    delays = [0.001, 0.002, 0.001, 0.03]
    lags = ps.run(audit_participant, range(P), delays=delays, staleness=1, use_rows=True)
    assert max(max(lag) for lag in lags[:3]) == 1
    run = list(ps.metrics().values())[-1]
    fills = [p["tables"]["audit"]["eager_fills"] for p in run["participants"].values()]
    hits = [p["tables"]["audit"]["cache_hits"] for p in run["participants"].values()]
    assert sum(fills) > 0 and sum(hits) > 0


def _wait_for_file(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


@pytest.mark.parametrize("use_rows", [False, True], ids=["dense", "rows"])
@pytest.mark.parametrize(
    "model", [dask_ps.SSP(staleness=5, refresh=True), dask_ps.ESSP(staleness=5, refresh=True), dask_ps.SSP(staleness=5)],
    ids=repr,
)
def test_refresh_reads_what_the_servers_have(ps, tmp_path, model, use_rows):
    """refresh=True: the first read of a clock sees every update that was on
    the servers when it started, although a cached copy meets the bound;
    plain SSP serves that (older) copy. Exact, ordered by files, no timing:
    the reader (rank 0) reads at clock 0 and caches; then the writer (rank 1)
    makes 5 clocks of one-hot markers (flushed by its clock() calls); then
    the reader, at clock 1 (the bound needs nothing: 1 - 5 < 0), reads."""
    n = 5
    ps.create_table("fresh", shape=(n,), block_rows=2, consistency=model)

    def read(ctx):
        return ctx.pull_rows("fresh", np.arange(n)) if use_rows else ctx.pull("fresh")

    def train(ctx, _):
        if ctx.rank == 1:
            _wait_for_file(tmp_path / "read0")
            for c in range(n):
                ctx.push_rows("fresh", [c], [1.0])
                ctx.clock()
            (tmp_path / "done").touch()
            return None
        first = read(ctx)
        (tmp_path / "read0").touch()
        _wait_for_file(tmp_path / "done")
        ctx.clock()
        second = read(ctx)
        ctx.push_rows("fresh", [0], [10.0])
        again = read(ctx)  # same clock: served from this clock's copy plus own writes
        return first, second, again, ctx.metrics()["tables"]["fresh"]

    first, second, again, metrics = ps.run(train, range(2))[0]
    assert first.tolist() == [0.0] * n
    if model.refresh:
        assert second.tolist() == [1.0] * n  # everything that was on the servers
        assert again.tolist() == [11.0] + [1.0] * (n - 1)
        assert metrics["refetches"] >= 1
        assert metrics["cache_hits"] >= 1  # the clock's second read is not a refetch
    else:
        # The control: the clock-0 copy meets SSP(5)'s bound and is served, so
        # the markers on the servers are not seen (what refresh changes).
        assert second.tolist() == [0.0] * n
        assert again.tolist() == [10.0] + [0.0] * (n - 1)
        assert metrics["refetches"] == 0 and metrics["cache_hits"] == 2
    assert ps.pull("fresh").tolist() == [11.0] + [1.0] * (n - 1)


@pytest.mark.parametrize("rule,hp", [("sgd", {"lr": 0.5}), ("adam", {"lr": 0.1})])
def test_aggregate_per_clock_applies_the_rule_once_per_clock(ps, rule, hp):
    """aggregate="clock" (MXNet's synchronous mode): the optimizer steps once
    per clock on the sum of every participant's gradients of that clock."""
    from tests.core.test_core_pure import ref_steps

    n_clocks, d = 5, 6
    ps.create_table("agg", shape=(d,), rule=rule, aggregate="clock", consistency=dask_ps.BSP(), **hp)

    def grad(rank, c):
        return np.random.default_rng(1000 * rank + c).normal(size=d)

    def train(ctx, _):
        reads = []
        for c in range(n_clocks):
            reads.append(ctx.pull("agg"))
            ctx.push("agg", grad(ctx.rank, c) / 2)
            ctx.push("agg", grad(ctx.rank, c) / 2)  # two pushes, still one step
            ctx.clock()
        return reads

    reads = ps.run(train, range(3))
    summed = [sum(grad(r, c) for r in range(3)) for c in range(n_clocks)]
    for c in range(n_clocks):
        expected = ref_steps(rule, np.zeros(d), summed[:c], **hp)
        for r in range(3):
            np.testing.assert_allclose(reads[r][c], expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ps.pull("agg"), ref_steps(rule, np.zeros(d), summed, **hp), rtol=1e-10)


def test_metrics_on_the_prometheus_endpoint(ps, client):
    pytest.importorskip("prometheus_client")
    ps.create_table("prom", shape=(4,))
    ps.run(lambda ctx, _: [ctx.pull("prom"), ctx.clock()], range(2))

    def scrape(dask_scheduler):
        import prometheus_client

        return prometheus_client.generate_latest().decode()

    text = client.run_on_scheduler(scrape)
    assert "dask_ps_servers 2.0" in text
    reads = [line for line in text.splitlines() if line.startswith("dask_ps_reads_total")]
    assert reads and float(reads[0].split()[-1]) >= 2


def test_clock_timeout_names_who_is_behind(ps, client):
    import dask

    ps.create_table("slow", shape=(2,), consistency=dask_ps.BSP())
    client.run(lambda: dask.config.set({"ps.timeouts.clock": "0.5s"}))
    try:

        def train(ctx, _):
            if ctx.rank == 1:
                time.sleep(3)  # never reaches clock 1 in time
                return
            ctx.push("slow", np.ones(2))
            ctx.clock()
            ctx.clock()

        with pytest.raises(dask_ps.ClockTimeoutError, match="participant 1 at clock 0 on (tcp|inproc)://"):
            ps.run(train, range(2))
    finally:
        client.run(lambda: dask.config.set({"ps.timeouts.clock": "300s"}))


def test_killed_participant_is_retried_and_counts_each_clock_once(tmp_path):
    """kill -9 the worker running a participant mid-run: Dask retries the task
    elsewhere, it resumes at the clock the run recorded, and every clock's
    marker is in the table exactly once per participant."""
    import os
    import signal

    from distributed import Client, LocalCluster

    n_clocks = 8
    flag = tmp_path / "killed"
    with LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as c:
        ps = dask_ps.ParameterServer(c)
        ps.create_table("k", shape=(n_clocks,), consistency=dask_ps.BSP())
        owner = ps.placement("k")[0].worker

        def train(ctx, _):
            for clock in range(ctx.current_clock, n_clocks):
                ctx.pull("k")
                ctx.push_rows("k", [clock], [1.0])
                if clock == 3 and ctx.worker.address != owner and not flag.exists():
                    flag.write_text(str(ctx.rank))
                    os.kill(os.getpid(), signal.SIGKILL)  # mid-clock: this push is never sent
                ctx.clock()
            return ctx.current_clock

        assert ps.run(train, range(3)) == [n_clocks] * 3
        assert flag.exists()
        assert ps.pull("k").tolist() == [3.0] * n_clocks
        run = list(ps.metrics().values())[-1]
        assert run["attempts"][int(flag.read_text())] == 2


def test_row_cache_fetches_only_missing_rows(ps):
    """Pulling new rows of a cached block moves only those rows (no refetch
    of what is cached and still valid)."""
    ps.create_table("rc", shape=(10_000, 4), block_rows=10_000, consistency=dask_ps.SSP(staleness=5))

    def train(ctx, _):
        ctx.pull_rows("rc", np.arange(0, 100))
        before = ctx.metrics()["tables"]["rc"]["bytes_pulled"]
        ctx.pull_rows("rc", np.arange(50, 150))  # 50 new rows
        after = ctx.metrics()["tables"]["rc"]["bytes_pulled"]
        again = ctx.pull_rows("rc", np.arange(0, 150))
        return after - before, ctx.metrics()["tables"]["rc"]["bytes_pulled"] - after, again.shape

    new_bytes, repeat_bytes, shape = ps.run(train, [None])[0]
    assert new_bytes == 50 * 4 * 8 and repeat_bytes == 0 and shape == (150, 4)


@pytest.mark.parametrize("model", [dask_ps.SSP(staleness=5), dask_ps.BSP()], ids=["SSP5", "BSP-per-clock"])
def test_uncache_drops_the_cached_rows_and_the_next_read_goes_to_the_servers(ps, model):
    """``ctx.uncache(name)`` frees the session's cached rows of a table
    (``held_bytes``) without losing anything a read must see: the next read
    of those rows fetches them again, with the own writes of this clock."""
    per_clock = model.staleness == 0  # aggregate="clock": the session keeps its pushes until summed
    ps.create_table("uc", shape=(1_000, 4), block_rows=250, consistency=model,
                    aggregate="clock" if per_clock else "push")

    def train(ctx, _):
        ctx.pull_rows("uc", np.arange(0, 300))
        cached = ctx.held_bytes("uc")
        ctx.push_rows("uc", np.arange(10), np.ones((10, 4)))
        ctx.flush()
        kept = ctx.held_bytes("uc")
        ctx.uncache("uc")
        dropped = ctx.held_bytes("uc")
        before = ctx.metrics()["tables"]["uc"]["bytes_pulled"]
        again = ctx.pull_rows("uc", np.arange(0, 300))
        refetched = ctx.metrics()["tables"]["uc"]["bytes_pulled"] - before
        return cached, kept, dropped, refetched, again[:12, 0].tolist()

    cached, kept, dropped, refetched, values = ps.run(train, [None])[0]
    assert cached >= 300 * 4 * 8 and refetched >= 300 * 4 * 8
    pushed = 10 * 4 * 8
    assert dropped == (kept - cached if per_clock else 0)
    if per_clock:
        assert dropped >= pushed
    assert values == [1.0] * 10 + [0.0, 0.0]  # read-my-writes
