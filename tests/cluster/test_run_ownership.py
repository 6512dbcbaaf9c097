"""Issue 34, item 4: a second client of the cluster (another notebook, a
re-run cell) could break a run it did not start: ``ps_run_start`` with the
active run's id was accepted (the run hung), and pushes forged with the
sender id of a participant (``f"{run_id}-{rank}"``) and its predictable
message numbers had the servers skip the participant's real pushes as
duplicates. Now a run id starts once, ending or aborting a run takes the
secret it was started with, and a participant's sender id holds that secret
(docs/security.rst)."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import get_worker
from distributed.utils import sync

import dask_ps


def test_an_active_run_id_cannot_be_started_again(ps, client):
    client.sync(ps._scheduler.ps_run_start, run_id="mine", n=1, owner="s3cret")
    try:
        with pytest.raises(dask_ps.PSValueError, match="run mine is active already"):
            client.sync(ps._scheduler.ps_run_start, run_id="mine", n=3)
        runs = client.run_on_scheduler(lambda dask_scheduler: {
            k: (r.n, r.owner) for k, r in dask_scheduler.extensions["ps"].runs.items()})
        assert runs["mine"] == (1, "s3cret")  # unchanged
    finally:
        client.sync(ps._scheduler.ps_run_end, run_id="mine", owner="s3cret")


def test_only_the_starting_client_ends_or_aborts_its_run(ps, client):
    client.sync(ps._scheduler.ps_run_start, run_id="owned", n=1, owner="s3cret")
    for call, kw in ((ps._scheduler.ps_run_end, {}), (ps._scheduler.ps_run_abort, {"reason": "x"})):
        for owner in (None, "guess"):
            with pytest.raises(dask_ps.PSValueError, match="run owned was started by another client"):
                client.sync(call, run_id="owned", owner=owner, **kw)
    aborted = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.extensions["ps"].runs["owned"].aborted)
    assert aborted is None
    assert client.sync(ps._scheduler.ps_run_end, run_id="owned", owner="s3cret")["run_id"] == "owned"


def _push_after_forgeries(ctx, _, name, table_id, version, primaries, n_pushes):
    """Before pushing, "another client" sends pushes of zeros to every
    server under this participant's old sender id and the message numbers
    its flushes of clock 0 take (``(clock << 24) + k``)."""
    worker = get_worker()

    async def forge():
        for addr, blocks in primaries.items():
            for k in range(n_pushes):
                await worker.rpc(addr).ps_push(
                    table=name, table_id=table_id, version=version, blocks=blocks, rows=[None] * len(blocks),
                    values=[np.zeros(4) for _ in blocks], sender=f"{ctx.run_id}-{ctx.rank}", msg_seq=k)

    sync(worker.loop, forge)
    for _ in range(n_pushes):
        ctx.push(name, np.ones(8))
        ctx.flush()
    ctx.clock()


@pytest.mark.parametrize("replication", [1, 2])
def test_forged_pushes_do_not_make_servers_skip_a_participants_pushes(ps, client, replication):
    ps.create_table("f", shape=(8,), block_rows=4, replication=replication)
    h = ps._handle("f")
    primaries: dict[str, list[int]] = {}
    for b in range(h.spec.n_blocks):
        primaries.setdefault(h.primary(b), []).append(b)
    ps.run(_push_after_forgeries, [None], name="f", table_id=h.spec.table_id, version=h.version,
           primaries=primaries, n_pushes=6)
    np.testing.assert_array_equal(ps.pull("f"), np.full(8, 6.0))  # every real push counted


def test_a_table_another_client_dropped_or_made_again_is_said_as_it_is_now(ps, client):
    """This client's cached spec of a table that another client dropped (or
    made again with another dtype or shape) refused values by the stale
    spec ("cannot cast ... to int8" for a table that no longer exists); a
    refusal is now checked against the table as it is."""
    from distributed import Client

    ps.create_table("t", shape=(4,), dtype="float32")
    ps.push("t", np.ones(4, "float32"))
    with Client(client.scheduler.address, set_as_default=False) as other:
        theirs = dask_ps.ParameterServer(other)
        theirs.drop_table("t")
        theirs.create_table("t", shape=(4,), dtype="int8")
        theirs.drop_table("t")
        with pytest.raises(dask_ps.UnknownTableError, match="'t' does not exist"):
            ps.push("t", np.full(4, 0.5))
        theirs.create_table("t", shape=(6,), dtype="float32")
        ps.push_rows("t", [5], np.ones((1,), "float32"))  # a row the old shape did not have
        np.testing.assert_array_equal(ps.pull("t"), [0, 0, 0, 0, 0, 1])
        with pytest.raises(dask_ps.PSValueError, match="rows"):
            ps.pull_rows("t", [6])  # refused by the table as it is


def _inner(ctx, part, name):
    ctx.push_rows(name, [0], np.ones((1, 2)))
    ctx.clock()
    return ctx.rank


def _outer(ctx, part, name):
    return dask_ps.get_parameter_server().run(_inner, [0, 1], name=name)


def test_a_run_started_inside_a_participant_runs(ps):
    """``ps.run`` inside a run's ``fn``: the waiting thread seceded from the
    worker's pool a second time, and Dask's ``secede`` raised a bare
    ``KeyError`` (the caller saw ``Exception('KeyError(<Thread ...>)')``).
    A participant is out of the pool already: it waits as it is."""
    ps.create_table("nested", shape=(4, 2), dtype="float64")
    assert ps.run(_outer, [0], name="nested") == [[0, 1]]
    np.testing.assert_array_equal(ps.pull("nested")[0], [2.0, 2.0])
