"""A table's blocks are sized against each worker's memory limit with the
headroom Dask's memory monitor needs (issue 34, case 7): blocks are memory
Dask cannot spill, so a table that would bring a worker past Dask's spill
threshold (less ``ps.worker-memory-headroom``) is refused at
``create_table`` with the figures, and nothing is created."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps
from dask_ps._exceptions import PSValueError

MiB = 2**20


def test_a_table_past_a_workers_headroom_is_refused_with_the_figures():
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB", dashboard_address=None) as c, \
            Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        # 960 MiB over 2 workers: within ps.max-memory-fraction of the summed
        # limits (0.6 x 2 GiB), but about 480 MiB a worker on top of its own
        # process, past (0.7 - 0.2) x 1 GiB.
        with pytest.raises(PSValueError, match=r"'big' .* too little memory: tcp://.* now \+ .* of blocks = "
                                               r".*distributed\.worker\.memory\.spill.*ps\.worker-memory-headroom"):
            ps.create_table("big", shape=(960 * MiB // 8,), dtype="float64", block_rows=MiB)
        assert "big" not in ps.tables()
        assert all(not m.get("tables") for m in ps.memory().values())
        ps.create_table("small", shape=(8 * MiB // 8,), dtype="float64", block_rows=MiB // 8)  # 4 MiB a worker
        with dask.config.set({"ps.worker-memory-headroom": -1}):  # the check off: the total check only
            ps.create_table("big", shape=(960 * MiB // 8,), dtype="float64", block_rows=MiB)
        np.testing.assert_array_equal(ps.pull_rows("big", [0, 5]), [0.0, 0.0])
