"""The invariants of ``benchmarks/sync_sim.py``, the discrete-event
simulation of the sync path (issue 36): what its scaling table rests on.
No cluster; every run is a few hundred events."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys

import numpy as np
import pytest


@pytest.fixture(scope="module")
def ss():
    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "sync_sim.py"
    spec = importlib.util.spec_from_file_location("sync_sim_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def free(ss, **kw):
    """No CPU a message, no hop, no network cost."""
    return {"costs": ss.Costs(msg_cpu=0, byte_cpu=0, direct_cpu=0, clock_cpu=0, hop=0, sched_cpu=0),
            "net": ss.Network(rtt=0, bandwidth=float("inf")), **kw}


def still(ss, **kw):
    return ss.Jitter(cv=0, tail_p=0, **kw)


def wl(ss, compute=0.1, clocks=10, **kw):
    return ss.Workload(compute=compute, clocks=clocks, push_rows=1000, read_rows=1000, push_value_bytes=8,
                       read_value_bytes=8, **kw)


@pytest.mark.parametrize("design", ["old", "current", "target", "wire"])
@pytest.mark.parametrize("prefetch", [False, True])
def test_without_jitter_or_costs_bsp_takes_the_compute(ss, design, prefetch):
    t, sim = ss.simulate(design, 8, wl(ss, prefetch=prefetch), jitter=still(ss), **free(ss))
    assert t == pytest.approx(10 * 0.1)
    assert sim.clock == [10] * 8


@pytest.mark.parametrize("design", ["old", "current", "target", "wire"])
def test_each_message_costs_time(ss, design):
    t, _ = ss.simulate(design, 8, wl(ss), jitter=still(ss))
    assert t > 10 * 0.1 * 1.01


@pytest.mark.parametrize("design", ["old", "current", "target", "wire"])
def test_a_persistent_straggler_sets_the_bsp_pace(ss, design):
    t, _ = ss.simulate(design, 8, wl(ss), jitter=still(ss, stragglers=1, straggler_slowdown=0.3), **free(ss))
    assert t == pytest.approx(10 * 0.13)


@pytest.mark.parametrize("design", ["old", "current", "target", "wire"])
def test_a_straggler_delays_bsp_by_its_delay_each_clock(ss, design):
    delays = {(3, c): 0.02 for c in (2, 5, 7)}
    t, _ = ss.simulate(design, 8, wl(ss), jitter=still(ss, transient=delays), **free(ss))
    assert t == pytest.approx(10 * 0.1 + 3 * 0.02)


@pytest.mark.parametrize("design", ["old", "current", "target", "wire"])
def test_ssp_absorbs_a_transient_straggler(ss, design):
    # One clock 1.5 compute late: SSP(2) lets the others run on; the straggler catches up on its own
    # schedule (its last clock ends 0.15 s late), nobody else waits.
    delays = {(3, 4): 0.15}
    bsp, _ = ss.simulate(design, 8, wl(ss), jitter=still(ss, transient=delays), **free(ss))
    ssp, sim = ss.simulate(design, 8, wl(ss), staleness=2, jitter=still(ss, transient=delays), **free(ss))
    assert bsp == pytest.approx(1.0 + 0.15)
    assert ssp == pytest.approx(1.0 + 0.15)  # the straggler's own time
    others = [e for p, e in enumerate(sim.end) if p != 3]
    assert max(others) == pytest.approx(1.0)  # ... the others lost nothing
    bsp_sim = ss.simulate(design, 8, wl(ss), jitter=still(ss, transient=delays), **free(ss))[1]
    assert min(e for p, e in enumerate(bsp_sim.end) if p != 3) == pytest.approx(1.15)


def test_ssp_does_not_absorb_a_straggler_beyond_its_bound(ss):
    # Late by 3 clocks' compute under SSP(1): the others wait for all but 1 clock of it.
    delays = {(0, 2): 0.3}
    t, sim = ss.simulate("target", 4, wl(ss), staleness=1, jitter=still(ss, transient=delays), **free(ss))
    assert min(sim.end[1:]) == pytest.approx(1.0 + 0.3 - 0.1)


@pytest.mark.parametrize("P", [2, 4, 16])
def test_message_counts_per_clock_are_the_designs(ss, P):
    work = wl(ss, clocks=6)
    old = ss.simulate("old", P, work, jitter=still(ss))[1].per_clock()
    # old: a push and a read to each server, the clock report to the scheduler, its wait for the
    # slowest where the bound is not known met, the scheduler's broadcast to every server once a clock
    assert old["push"] == old["read"] == P
    assert old["clock"] == 1
    assert old["broadcast"] == pytest.approx(1.0)  # P servers a clock, over P participants
    assert 0 < old["wait"] <= 1
    cur = ss.simulate("current", P, work, jitter=still(ss))[1].per_clock()
    assert cur == {"push": P, "clock": P, "read": P}  # 3P, none to the scheduler
    tgt = ss.simulate("target", P, work, jitter=still(ss))[1].per_clock()
    assert tgt == {"request": P}
    # wire (the code): one request to each server a clock; LDA's read after it, SGD's in it
    assert ss.simulate("wire", P, work, jitter=still(ss))[1].per_clock() == {"request": P, "read": P}
    sgd = wl(ss, clocks=6, prefetch=True)
    assert ss.simulate("wire", P, sgd, jitter=still(ss))[1].per_clock() == {"request": P}


def test_combined_per_process_sends_one_request_per_server_per_machine(ss):
    # 4 machines x 4 threads: 4 servers; one request to each a machine-clock, shared by 4 participants
    sim = ss.simulate("target", 16, wl(ss, clocks=6), threads=4, combine=True, jitter=still(ss))[1]
    assert sim.per_clock() == {"request": pytest.approx(4 / 4)}
    apart = ss.simulate("target", 16, wl(ss, clocks=6), threads=4, jitter=still(ss))[1]
    assert apart.per_clock() == {"request": 4}


def test_only_the_old_design_loads_the_scheduler(ss):
    c = ss.Costs(sched_cpu=1e-4)
    old = ss.simulate("old", 8, wl(ss), costs=c, jitter=still(ss))[1]
    n = sum(v for k, v in old.sent.items() if k in ("clock", "wait", "broadcast"))
    assert old.sched.busy == pytest.approx(n * 1e-4 + old.sent["clock"] * 1e-4 + old.sent.get("wait", 0) * 1e-4)
    for design in ("current", "target", "wire"):
        assert ss.simulate(design, 8, wl(ss), costs=c, jitter=still(ss))[1].sched.busy == 0


def test_bandwidth_bounds_a_clock(ss):
    # 1 MB pushed and read a clock over 1 MB/s links, no compute: at least a second each way
    work = ss.Workload(compute=0.0, clocks=3, push_rows=125_000, read_rows=125_000, push_value_bytes=8,
                       read_value_bytes=8, index_bytes=0)
    t, _ = ss.simulate("target", 2, work, jitter=still(ss), **free(ss, net=ss.Network(rtt=0, bandwidth=1e6)))
    assert t >= 3 * 2 * 0.5 * 0.999  # half the rows cross the wire each way (the other half is local)


def test_a_loop_shared_with_the_compute_stretches_it(ss):
    c = ss.Costs(msg_cpu=1e-3, byte_cpu=0, direct_cpu=0, clock_cpu=0, hop=0)
    # SSP(1): a clock's messages are served while the next compute runs
    shared, _ = ss.simulate("target", 4, wl(ss), staleness=1, costs=c, jitter=still(ss))
    apart, _ = ss.simulate("target", 4, wl(ss), staleness=1, costs=c, jitter=still(ss), shared_core=False)
    assert shared > apart + 9 * 4 * 1e-3 / 2  # at least the halves of the requests it serves, each clock


def test_bad_arguments_are_refused(ss):
    with pytest.raises(ValueError, match="design"):
        ss.Sim("new", 4, wl(ss))
    with pytest.raises(ValueError, match="threads"):
        ss.Sim("target", 6, wl(ss), threads=4)


def test_the_read_riding_the_clock_waits_a_round_trip_under_ssp1(ss):
    """``pipelined=False`` (dask_ps as built): under SSP(1) iteration c + 1
    waits for clock c's reply, a round trip a clock, where the target's
    read sent a clock earlier waits for nothing; under BSP both wait for
    the others' clock c alike."""
    net = ss.Network(rtt=0.01, bandwidth=float("inf"))
    costs = ss.Costs(msg_cpu=0, byte_cpu=0, direct_cpu=0, clock_cpu=0, hop=0, sched_cpu=0)
    w = wl(ss, compute=0.1, clocks=10, prefetch=True)
    run = {s: {p: ss.simulate("target", 4, w, costs=costs, net=net, jitter=still(ss), staleness=s, pipelined=p)[0]
               for p in (True, False)} for s in (0, 1)}
    assert run[0][True] == pytest.approx(run[0][False])
    assert run[1][True] == pytest.approx(10 * 0.1)  # the replies came during the next compute
    assert run[1][False] == pytest.approx(10 * (0.1 + 0.01))  # a round trip every clock


@pytest.fixture(scope="module")
def scale():
    here = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    import sync_scale

    return sync_scale


@pytest.mark.parametrize("design", ["old", "current", "target", "wire"])
def test_a_fits_unequal_participants_run_at_the_slower_ones_pace(ss, scale, design):
    """The 2-worker validation gives each participant its own measured
    compute (worker processes: one 1.4-4.5x the other's): the faster one's
    as the workload's, the slower a persistent straggler, so a BSP run
    takes the slower one's compute, not the mean's."""
    fit = {"participants": [{"cpu_seconds": 0.3, "round_prep_cpu_seconds": 0.0},
                            {"cpu_seconds": 0.1, "round_prep_cpu_seconds": 0.0}]}
    inp = scale.Inputs(costs={"processes": ss.Costs(clock_cpu=0.0)})
    base = wl(ss, compute=[1.0] * 5, clocks=5)
    unequal, ratio = scale.measured_compute(base, fit, inp, "processes", unequal=True)
    assert sum(unequal.compute) == pytest.approx(0.1) and ratio == pytest.approx(3.0)
    t, _ = ss.simulate(design, 2, unequal, jitter=still(ss, stragglers=1, straggler_slowdown=ratio - 1), **free(ss))
    assert t == pytest.approx(0.3)
    mean = scale.measured_compute(base, fit, inp, "processes")
    assert ss.simulate(design, 2, mean, jitter=still(ss), **free(ss))[0] == pytest.approx(0.2)


@pytest.mark.parametrize("layout", ["processes", "threads"])
def test_ldas_byte_cost_is_the_one_that_gives_its_cycles_measured_growth(ss, scale, layout):
    """LDA's sync is priced from LDA's own cycle (200-byte rows), not the
    message fit's byte constant from SGD's 8-byte rows (which over-predicted
    the 2-worker LDA fits by 26-152%): cycles "measured" by the simulation
    at a known byte cost give that cost back, and the others' constants
    are kept."""
    costs = ss.Costs(msg_cpu=500e-6, byte_cpu=3.0e-9, direct_cpu=300e-6, clock_cpu=0.3e-3, hop=100e-6)
    truth = 0.6e-9

    def cycle(U):
        row = {"U": U, "width": 50, "itemsize": 4}
        wl = scale.lda_cycle_workload(row)
        _, sim = ss.simulate(scale.VALIDATED, 2, wl, costs=dataclasses.replace(costs, byte_cpu=truth), net=scale.LOOPBACK,
                             jitter=ss.Jitter(cv=0, tail_p=0), layout=layout)
        cpu = (sum(sim.compute_seconds) + sum(lp.busy for lp in sim.loops)) / (wl.clocks * 2)
        return {**row, "worker_cpu": cpu}
    got = scale.lda_byte_cpu(costs, cycle(2_000), cycle(12_000), layout)
    assert got == pytest.approx(truth, rel=1e-6)
    inp = scale.Inputs(costs={layout: costs}, lda_costs={layout: dataclasses.replace(costs, byte_cpu=got)})
    assert inp.costs_for(layout, "sgd") is costs
    assert inp.costs_for(layout, "lda").byte_cpu == got and inp.costs_for(layout, "lda").msg_cpu == costs.msg_cpu
    assert inp.costs_for(layout, "lda-bsp") is inp.costs_for(layout, "lda")  # no BSP cycle measured


@pytest.mark.parametrize("layout", ["processes", "threads"])
def test_the_seeded_fits_sync_is_priced_from_its_own_cycle(ss, scale, layout):
    """The validated LDA fits are seeded: BSP, their counts summed per clock,
    each read riding the clock before. Their cycle costs more a row than
    the unseeded default's (SSP(2) with refresh; measured: 403 against 219
    ns a row in worker processes), so it is measured and priced apart
    (``lda-bsp``), its reads simulated with the clock; the table's BSP LDA
    rows use it, its SSP rows the default's."""
    costs = ss.Costs(msg_cpu=500e-6, byte_cpu=3.0e-9, direct_cpu=300e-6, clock_cpu=0.3e-3, hop=100e-6)
    truth = {False: 0.5e-9, True: 1.0e-9}

    def cycle(U, ahead):
        row = {"U": U, "width": 50, "itemsize": 4}
        wl = scale.lda_cycle_workload(row, prefetch=ahead)
        assert wl.prefetch is ahead
        _, sim = ss.simulate(scale.VALIDATED, 2, wl, costs=dataclasses.replace(costs, byte_cpu=truth[ahead]),
                             net=scale.LOOPBACK, jitter=ss.Jitter(cv=0, tail_p=0), layout=layout)
        return {**row, "worker_cpu": (sum(sim.compute_seconds) + sum(lp.busy for lp in sim.loops)) / (wl.clocks * 2)}
    got = {a: scale.lda_byte_cpu(costs, cycle(2_000, a), cycle(12_000, a), layout, prefetch=a) for a in truth}
    assert got[False] == pytest.approx(truth[False], rel=1e-6) and got[True] == pytest.approx(truth[True], rel=1e-6)
    inp = scale.Inputs(costs={layout: costs}, lda_costs={layout: dataclasses.replace(costs, byte_cpu=got[False])},
                       lda_bsp_costs={layout: dataclasses.replace(costs, byte_cpu=got[True])})
    assert inp.costs_for(layout, "lda-bsp").byte_cpu == got[True]
    assert inp.costs_for(layout, "lda").byte_cpu == got[False]
    assert scale.cost_kind("pub50", 0) == "lda-bsp" and scale.cost_kind("pub50", 2) == "lda"
    assert scale.cost_kind("sgd-weak", 0) == "sgd"


def test_an_lda_fits_sweep_spread_is_its_clock_to_clock_jitter(ss, scale):
    """The validation runs an LDA fit with the spread of its own sweeps
    (``metrics_``'s ``sweeps``, the cold first one left out) as the
    simulation's jitter: the clocks of BSP wait on the slower sweep."""
    steady = {"participants": [{"sweeps": [9.0, 1.0, 1.0, 1.0]}, {"sweeps": [5.0, 2.0, 2.0, 2.0]}]}
    assert scale.sweep_spread(steady) == 0.0
    assert scale.sweep_spread({"participants": [{"sweep_seconds": 1.0}]}) == 0.0  # not recorded
    uneven = {"participants": [{"sweeps": [9.0, 1.0, 3.0]}, {"sweeps": [9.0, 2.0, 2.0]}]}
    assert scale.sweep_spread(uneven) == pytest.approx(0.25)  # (0.5 + 0) / 2
    walls = [ss.simulate("wire", 2, wl(ss, compute=0.01, clocks=50), jitter=ss.Jitter(cv=cv, tail_p=0), **free(ss))[0]
             for cv in (0.0, 0.25)]
    assert walls[1] > walls[0] * 1.05


def test_an_lda_fit_is_simulated_with_its_own_sweeps(ss, scale):
    """As the SGD fits run with their own measured compute, an LDA fit runs
    with its own sweeps, clock by clock (the participants' mean), plus the
    model's deltas; a fit without them keeps the model's compute."""
    inp = scale.Inputs()
    base = wl(ss, compute=0.5, clocks=3)
    fit = {"participants": [{"sweeps": [0.3, 0.1, 0.1]}, {"sweeps": [0.5, 0.1, 0.3]}]}
    got = scale.lda_measured_compute(base, fit, inp)
    deltas = inp.compute["delta"][50] * base.push_rows
    np.testing.assert_allclose(got.compute, np.array([0.4, 0.1, 0.2]) + deltas)
    assert scale.lda_measured_compute(base, {"participants": [{"sweeps": [0.3]}]}, inp) is base


@pytest.mark.parametrize("P", [4, 64])
def test_bsp_with_free_sync_runs_at_the_jitter_ceiling(ss, scale, P):
    """The arithmetic under the LDA target's breakdown: with the sync free,
    a BSP clock lasts its slowest participant's compute, so BSP's
    efficiency is 1 / the mean over clocks of the largest of P jitter
    factors, and it falls as P grows (no sync design passes it)."""
    jitter = ss.Jitter()
    base = wl(ss, compute=0.5, clocks=8)
    for design in ("wire", "target"):
        t, _ = ss.simulate(design, P, base, jitter=jitter, **free(ss))
        assert 0.5 * 8 / t == pytest.approx(scale.bsp_jitter_ceiling(P, 8, jitter), rel=1e-9)
    assert scale.bsp_jitter_ceiling(P, 8) < scale.bsp_jitter_ceiling(2, 8) < 1.0


def test_the_breakdown_switches_off_one_part_at_a_time(scale):
    """Each part switched off gives at least the cell as simulated; the
    sync free leaves only the jitter, which under BSP is the ceiling."""
    inp = scale.Inputs()
    label = "wire + LDA's read with the clock (the code)"
    b = scale.breakdown(inp, "nyt50", 4, label)
    for part, _ in scale.PARTS[1:]:
        assert b[part] >= b["as simulated"] - 1e-9, part
    assert b["sync free (jitter only)"] == pytest.approx(b["BSP jitter ceiling"], rel=1e-9)
    assert b["no jitter"] < 1.0


def test_the_device_checks_corpus_grows_by_repeating_its_documents():
    """``sync_measure.py --workers`` grows the 2-worker LDA corpus with the
    participants (weak scaling) by repeating its documents: the same
    words and document lengths, as many rows as asked."""
    import scipy.sparse as sp

    here = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    import sync_measure

    X = sp.csr_matrix(np.arange(12).reshape(4, 3))
    got = sync_measure._repeat_rows(X, 10)
    assert got.shape == (10, 3)
    np.testing.assert_array_equal(got.toarray(), np.vstack([X.toarray()] * 3)[:10])
    assert sync_measure._repeat_rows(X, 3).shape == (3, 3)
