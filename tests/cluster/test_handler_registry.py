"""Issue 22: one registry of the ``ps_*`` handlers with their access levels.

Every handler the scheduler and a worker serve is enumerated from Dask's
own ``handlers`` dicts on a live cluster and checked against the registry
(``dask_ps._handlers``): none is installed outside it. Every internal one
is then called from the client without the cluster's token, with
arguments that would change something if it ran (a forged clock of a
running BSP run, a made-up server address, a replica fenced, a placement
without this worker, an eviction), and must be refused with
``InternalOnlyError`` (a ``PermissionError``) while nothing changes. A new
handler is enumerated here without anyone adding it to this file; a new
client-level one must be named in ``CLIENT_OPS`` (with a reason)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import dask_ps
from dask_ps._exceptions import InternalOnlyError
from dask_ps._handlers import CLIENT, INTERNAL, LEVELS, READ_ONLY
from dask_ps._scheduler_plugin import SCHEDULER_HANDLERS, PSSchedulerPlugin
from dask_ps._worker_plugin import WORKER_HANDLERS, PSWorkerPlugin

# Handlers a client may call and that change state; each validates its input.
CLIENT_OPS = {
    "scheduler": {
        "ps_create_table", "ps_drop_table", "ps_run_start", "ps_run_abort", "ps_run_end",  # a ParameterServer's own
        "ps_save_tables", "ps_load_table", "ps_note_checkpoint",  # ps.save / ps.load: paths checked there
    },
    "worker": {"ps_push"},  # validated; NaN/Inf and overflow refused; replica=True needs the token
}
FAKE = "tcp://127.0.0.1:9"  # no one listens there


def _installed(dask_scheduler=None, dask_worker=None):
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    return {op: getattr(h, "__ps_access__", None) for op, h in server.handlers.items() if op.startswith("ps_")}


def test_every_installed_handler_is_registered_with_an_access_level(ps, client):
    on_scheduler = client.run_on_scheduler(_installed)
    on_workers = client.run(_installed)
    registered = {op: SCHEDULER_HANDLERS.access(op) for op in SCHEDULER_HANDLERS}
    assert on_scheduler == registered
    for addr, ops in on_workers.items():
        assert ops == {op: WORKER_HANDLERS.access(op) for op in WORKER_HANDLERS}, addr
    for side, registry in (("scheduler", SCHEDULER_HANDLERS), ("worker", WORKER_HANDLERS)):
        assert set(registry.ops()) == set(registry.ops(INTERNAL)) | set(registry.ops(CLIENT)) | set(
            registry.ops(READ_ONLY))
        assert all(registry.access(op) in LEVELS for op in registry)
        unexpected = set(registry.ops(CLIENT)) - CLIENT_OPS[side]
        assert not unexpected, f"new client-level {side} handlers: {unexpected} (internal or read-only?)"
    # The handlers the trust model calls internal (issue 22 found them open).
    for op in ("ps_register_server", "ps_evacuate", "ps_replica_missed", "ps_run_join",
               "ps_run_leave", "ps_run_record"):
        assert SCHEDULER_HANDLERS.access(op) == INTERNAL, op
    # Clocks are counted by the servers (issue 36): reports, waits and
    # membership records are internal there.
    for op in ("ps_save_blocks", "ps_load_blocks", "ps_install_loaded", "ps_set_placement", "ps_evicted",
               "ps_cache_fill", "ps_run_clock", "ps_run_wait", "ps_run_update", "ps_run_clocks"):
        assert WORKER_HANDLERS.access(op) == INTERNAL, op


# --- snapshots of everything a handler could change ---------------------------------------


def _scheduler_state(dask_scheduler=None):
    p = dask_scheduler.extensions["ps"]
    return {
        "members": sorted(p.members),
        "dead": sorted(p.liveness.dead),
        "fenced": sorted(p.hung.fenced),
        "retiring": sorted(p._retiring),
        "tables": {n: (t.version, t.owners, sorted((b, sorted(ws)) for b, ws in t.stale.items()), dict(t.lost),
                       t.checkpoint, len(t.rollbacks)) for n, t in p.tables.items()},
        "runs": {r: (list(run.clocks), sorted(run.done), dict(run.where), dict(run.attempts), run.notify,
                     sorted(run.tables), run.aborted) for r, run in p.runs.items()},
    }


def _worker_state(dask_worker=None):
    p = dask_worker.extensions["ps"]
    return {
        "tables": {n: (t.version, t.owners, t.frozen, sorted(t.missed), sorted(t.pending),
                       {b: (blk.seq, blk.data.tolist()) for b, blk in t.blocks.items()})
                   for n, t in p.store.tables.items()},
        "dead": sorted(p.liveness.dead),
        "latest_versions": dict(p.latest_versions),
        "mailboxes": sorted(p.mailboxes),
        "subscriptions": sorted(p.subscriptions),
        "ended": list(p._ended_runs),
        "min_clock": dict(p._min_clock),
        "evictions": sorted(p._evictions),
        "served": dict(p.served),
    }


def _kwargs(method, pool: dict) -> dict:
    params = inspect.signature(method).parameters
    return {k: pool[k] for k in params if k in pool}


def _call(client, rpc, op, kwargs):
    return client.sync(getattr(rpc, op), **kwargs)


def test_every_internal_handler_refuses_a_call_without_the_token(ps, client):
    """Each internal ``ps_*`` handler of the scheduler and of a worker,
    called by a client without the token, raises ``InternalOnlyError``
    and changes nothing; read-only ones answer and change nothing."""
    ps.create_table("t", shape=(8,), block_rows=4, init=np.arange(8.0), replication=2)
    ps.create_table("e", shape=(4,), consistency=dask_ps.ESSP(staleness=1))
    h = ps._handle("t")
    primary, replica = h.owners[0]
    run_id = "registry-run"
    client.sync(ps._scheduler.ps_run_start, run_id=run_id, n=2)
    try:
        sched_pool = {
            "address": FAKE, "run_id": run_id, "rank": 0, "clock": 5, "wait_for": None, "timeout": 0.2,
            "metrics": None, "with_attempt": True, "table": "t", "table_id": h.spec.table_id,
            "replica": replica, "blocks": [0], "name": "t", "tables": ["t"], "n": 1,
            "path": "/tmp/forged-ckpt", "data": "ckpt-forged",
        }
        before = scheduler_before = client.run_on_scheduler(_scheduler_state)
        for op in SCHEDULER_HANDLERS.ops(INTERNAL):
            kwargs = _kwargs(getattr(PSSchedulerPlugin, op[3:]), sched_pool)
            with pytest.raises(InternalOnlyError, match=op):
                _call(client, client.scheduler, op, kwargs)
        for op in SCHEDULER_HANDLERS.ops(READ_ONLY):
            kwargs = _kwargs(getattr(PSSchedulerPlugin, op[3:]), {**sched_pool, "n": 0, "tables": None,
                                                                   "table": None})
            _call(client, client.scheduler, op, kwargs)  # answers (no PermissionError)
        assert client.run_on_scheduler(_scheduler_state) == before

        worker_pool = {
            "table": "t", "name": "t", "table_id": h.spec.table_id, "spec": h.spec.to_msg(),
            "version": h.version + 1, "blocks": [0], "owners": [[FAKE]] * h.spec.n_blocks,
            "moves": [(0, FAKE)], "address": replica if primary != replica else FAKE, "eviction": "forged",
            "run_id": run_id, "min_clock": None, "session": "forged-session", "tag": 1, "seqs": [0],
            "rows": [None], "values": [[1.0] * 4], "directory": "/tmp/forged-ckpt/t", "load_id": "forged",
            "discard": False,
        }
        for addr in (primary, replica):
            before = client.run(_worker_state, workers=[addr])[addr]
            for op in WORKER_HANDLERS.ops(INTERNAL):
                kwargs = _kwargs(getattr(PSWorkerPlugin, op[3:]), worker_pool)
                with pytest.raises(InternalOnlyError, match=op):
                    _call(client, client.rpc(addr), op, kwargs)
            # A participant's read options are internal too.
            for extra in ({"run": (run_id, 100)}, {"subscribe": (run_id, "forged", FAKE)}):
                with pytest.raises(InternalOnlyError, match="participant"):
                    _call(client, client.rpc(addr), "ps_pull", dict(
                        table="e", version=ps._handle("e").version, blocks=[0], rows=[None], **extra))
            after = client.run(_worker_state, workers=[addr])[addr]
            assert after == before, addr
        assert client.run_on_scheduler(_scheduler_state) == scheduler_before
    finally:
        client.sync(ps._scheduler.ps_run_end, run_id=run_id)
    np.testing.assert_array_equal(ps.pull("t"), np.arange(8.0))
    ps.push("t", np.ones(8))
    np.testing.assert_array_equal(ps.pull("t"), np.arange(8.0) + 1)


def _bsp_reader(ctx, _):
    import time

    seen = []
    for _c in range(3):
        seen.append(float(ctx.pull("b")[0]))
        if ctx.rank == 1:
            time.sleep(0.2)  # the slow one: rank 0 must wait for it at every clock
        ctx.push("b", np.ones(1))
        ctx.clock()
    return seen


def test_a_forged_clock_does_not_release_a_bsp_participant(ps, client):
    """Issue 22: a client's ``ps_clock`` with a forged clock released a BSP
    participant early (it read 0, 1, 2 instead of 0, 2, 4). Now the forged
    reports (to the servers, which count the clocks: ``ps_run_clock``) are
    refused and both participants read every clock complete."""
    import threading

    ps.create_table("b", shape=(1,), consistency=dask_ps.BSP())
    forged = threading.Event()

    workers = list(client.scheduler_info()["workers"])

    def forge():
        while not forged.is_set():
            for run_id in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.extensions["ps"].runs)):
                for rank, w in ((0, workers[0]), (1, workers[-1])):
                    try:
                        client.sync(client.rpc(w).ps_run_clock, run_id=run_id, rank=rank, clock=10)
                    except PermissionError:
                        pass
            forged.wait(0.01)

    t = threading.Thread(target=forge, daemon=True)
    t.start()
    try:
        seen = ps.run(_bsp_reader, range(2))
        # BSP: a read at clock c holds both participants' pushes of clocks < c.
        assert all(s[c] >= 2 * c for s in seen for c in range(3)), seen
    finally:
        forged.set()
        t.join()
