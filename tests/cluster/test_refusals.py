"""Issue 34: calls that would destroy a running fit, or store what a table
cannot represent, are refused and change nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from distributed import Event

import dask_ps


def _push_then_wait(ctx, _, event_name):
    ctx.push("w", np.ones(4))
    ctx.flush()
    ctx.clock()
    Event(event_name).wait(timeout=120)  # the test loads meanwhile
    ctx.push("w", np.ones(4))
    ctx.clock()
    return True


def test_load_overwrite_of_a_table_an_active_run_pushes_to_is_refused(ps, client, tmp_path):
    """It used to be accepted: the run failed with StaleVersionError and
    its acknowledged pushes were replaced by the checkpoint."""
    ps.create_table("w", shape=(4,))
    path = str(tmp_path / "ckpt")
    ps.save(path)
    go = Event("load-during-run", client=client)
    results, errors = [], []

    def run():
        try:
            results.extend(ps.run(_push_then_wait, [None], event_name="load-during-run"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        while not (ps.pull("w") == 1).all():  # the participant pushed; it waits for the event now
            assert thread.is_alive(), errors
            threading.Event().wait(0.05)
        (run_id,) = client.sync(ps._scheduler.ps_active_runs, tables=["w"])
        with pytest.raises(RuntimeError, match=rf"ps.load: table 'w' is in use by active run\(s\) \['{run_id}'\]"):
            ps.load(path, overwrite=True)
        np.testing.assert_array_equal(ps.pull("w"), np.ones(4))  # not replaced by the checkpoint's zeros
    finally:
        go.set()
        thread.join(120)
    assert errors == [] and results == [True]
    np.testing.assert_array_equal(ps.pull("w"), np.full(4, 2.0))
    ps.load(path, overwrite=True)  # between runs: loads
    np.testing.assert_array_equal(ps.pull("w"), np.zeros(4))


@pytest.mark.parametrize("init", [np.nan, np.inf, 1e30, -1])
def test_create_table_refuses_an_init_an_integer_table_cannot_hold(ps, init):
    dtype = "uint8" if init == -1 else "int32"
    with pytest.raises(dask_ps.PSValueError, match=f"'i'.*{dtype}"):
        ps.create_table("i", shape=(4,), dtype=dtype, init=init)
    assert "i" not in ps.tables()


def test_create_table_refuses_a_name_that_would_leave_a_checkpoint(ps):
    with pytest.raises(dask_ps.PSValueError, match="'../x' is not allowed"):
        ps.create_table("../x", shape=(4,))
    assert "../x" not in ps.tables()
