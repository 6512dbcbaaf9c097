"""Reads that say which clocks they hold (``with_clocks=True``, issue 33).

Each participant pushes to every row a one-hot marker for ``(participant,
clock)``; at every read it checks, per row, the clock the read says it holds
against the markers in it: with ``aggregate="clock"`` exactly (every other
participant's markers of the clocks below, none after), with
``aggregate="push"`` as a lower bound. Every read also holds all of the
reader's own markers. The SGD estimators' catch-up (``linear_model/_catch_up``)
relies on the exact form.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import dask_ps

P = 3  # participants
C = 8  # clocks per participant
N_ROWS = 12  # 4 blocks of 3 rows over the cluster's servers


def _check(v, held, rank, c, staleness, exact):
    """One read at clock ``c``: ``v`` (rows x markers), ``held`` per row."""
    assert held.shape == (v.shape[0],) and held.dtype == np.int64
    assert (held >= max(0, c - staleness)).all() and (held <= c).all(), (c, held.tolist())
    for i in range(v.shape[0]):
        seen = v[i].reshape(P, C)
        assert seen[rank, :c].all() and not seen[rank, c:].any(), f"own markers at clock {c}: {seen[rank]}"
        for q in range(P):
            if q == rank:
                continue
            below = seen[q, :held[i]]
            assert below.all(), f"row {i} says it holds clocks < {held[i]}, has participant {q}'s {seen[q]}"
            if exact:
                assert not seen[q, held[i]:].any(), (
                    f"row {i} says it holds clocks < {held[i]} exactly, has participant {q}'s {seen[q]}")


def _participant(ctx, _part, how, staleness, exact):
    rank = ctx.rank
    rng = np.random.default_rng(rank)
    rows = np.concatenate([rng.permutation(N_ROWS), [5, 5]])  # any order, duplicates
    handle, tags = None, []
    for c in range(C):
        time.sleep(0.03 * rng.uniform(0.5, 1.5) if rank == P - 1 else 0.002)  # the last one straggles
        if handle is not None:
            v, held = handle.result(with_clocks=True)
        elif how == "pull":
            v, held = ctx.pull("held", with_clocks=True)
        else:
            v, held = ctx.pull_rows("held", rows, with_clocks=True)
        _check(v, held, rank, c, staleness, exact)
        tags.append(held.tolist())
        marker = np.zeros((N_ROWS, P * C))
        marker[:, rank * C + c] = 1.0
        ctx.push("held", marker)
        if how == "prefetch" and c + 1 < C:
            handle = ctx.prefetch_rows("held", rows, for_clock=ctx.current_clock + 1)
            ctx.clock(wait=False)
        else:
            ctx.clock()
    return tags


@pytest.mark.parametrize("how", ["pull", "rows", "prefetch"])
@pytest.mark.parametrize("model,aggregate", [
    (dask_ps.SSP(staleness=1), "clock"),
    (dask_ps.SSP(staleness=3), "clock"),
    (dask_ps.ESSP(staleness=2), "clock"),
    (dask_ps.SSP(staleness=2), "push"),
], ids=lambda x: repr(x) if not isinstance(x, str) else x)
def test_a_read_says_which_clocks_it_holds(ps, model, aggregate, how):
    ps.create_table("held", shape=(N_ROWS, P * C), block_rows=3, consistency=model, aggregate=aggregate)
    ps.run(_participant, range(P), how=how, staleness=model.staleness, exact=aggregate == "clock")
    assert ps.pull("held").sum(axis=1).tolist() == [P * C] * N_ROWS  # nothing lost, nothing doubled


def test_a_bsp_read_holds_every_clock_before(ps):
    ps.create_table("held", shape=(N_ROWS, P * C), block_rows=3, consistency=dask_ps.BSP(), aggregate="clock")
    tags = ps.run(_participant, range(P), how="rows", staleness=0, exact=True)
    assert tags == [[[c] * (N_ROWS + 2) for c in range(C)]] * P
