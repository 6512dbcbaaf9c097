"""An in-process cluster (``LocalCluster(processes=False)``, the embedded
default) passes reply arrays without copying them: a reader must never be
able to change a server's stored values through one."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps


def _participant(ctx, _):
    seen = []
    for _ in range(3):
        seen.append(float(ctx.pull("inproc-t").sum()))
        ctx.push("inproc-t", np.ones(4))  # the write-through updates the cached block
        ctx.clock()
    return seen


@pytest.mark.parametrize("aggregate", ["push", "clock"])
def test_readers_cannot_change_the_servers_values(aggregate):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("inproc-t", shape=(4,), aggregate=aggregate, consistency=dask_ps.SSP(1))
        seen = ps.run(_participant, [0, 1])
        # SSP(1): a read at clock c holds the reader's own c pushes, the other
        # one's pushes of clocks < c - 1, and at most all 3 of the other's
        for clock, values in enumerate(zip(*seen)):
            for v in values:
                assert 4 * clock + 4 * max(0, clock - 1) <= v <= 4 * clock + 12
        w = ps.pull("inproc-t")
        w += 100  # the caller's copy
        np.testing.assert_array_equal(ps.pull("inproc-t"), np.full(4, 6.0))  # 2 participants x 3 clocks
        ps.drop_table("inproc-t")
