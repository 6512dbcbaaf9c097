"""Row lists named by a key on a cluster (issue 36, ``dask_ps._row_lists``):
once a server acknowledged a participant's row list, the participant's
later messages there name it by its key and carry no rows; a server that
lost its keys (a restart of its cache, a failover to a replica that never
got them) refuses them and gets the lists again, and the sums stay exact."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from distributed import Client, Event, LocalCluster

import dask
import dask_ps
from tests.cluster.test_reliability import run_in_thread

N_ROWS, ROUNDS, EPOCHS = 4000, 4, 3


def round_rows(rank: int, r: int) -> np.ndarray:
    """Round ``r``'s rows of participant ``rank``: the same every epoch."""
    rng = np.random.default_rng(100 * rank + r)
    return np.sort(rng.choice(N_ROWS, 1200, replace=False))


def values(rank: int, clock: int, n: int) -> np.ndarray:
    return np.random.default_rng(10_000 + 100 * rank + clock).integers(-3, 4, size=n).astype("float64")


def expected(P: int, clocks: int) -> np.ndarray:
    out = np.zeros(N_ROWS)
    for rank in range(P):
        for c in range(clocks):
            rows = round_rows(rank, c % ROUNDS)
            out[rows] += values(rank, c, rows.size)
    return out


PAUSE_AT = ROUNDS + 2  # mid second epoch: every list goes by its key


def epochs(ctx, _, table, pause=None):
    """An SGD-like participant: reads its round's rows (prefetched with the
    clock before: they go with that clock's message) and pushes them each
    clock, the same rounds every epoch. Returns its message counters at
    the end of each epoch. ``pause``: at clock ``PAUSE_AT`` wait for the
    ``distributed.Event`` of that name (set by the test)."""
    snaps = []
    ahead = None
    for c in range(ctx.current_clock, ROUNDS * EPOCHS):
        if pause is not None and c == PAUSE_AT:
            assert Event(pause).wait(120)
        rows = round_rows(ctx.rank, c % ROUNDS)
        ahead.result() if ahead is not None else ctx.pull_rows(table, rows)
        ctx.push_rows(table, rows, values(ctx.rank, c, rows.size))
        ahead = ctx.prefetch_rows(table, round_rows(ctx.rank, (c + 1) % ROUNDS), for_clock=c + 1)
        ctx.clock()
        if (c + 1) % ROUNDS == 0:
            snaps.append(dict(ctx.metrics()["messages"]))
    return snaps


def test_after_the_first_epoch_messages_carry_no_row_lists(ps, client, request):
    """Worker processes: the first epoch's messages carry each round's lists
    (a read and a push of the same rows: the push's list already goes by
    its key), the second epoch's none, and the table holds the exact sum.
    With ``ps.row-lists.keyed`` off every epoch carries them (what this
    test tells apart). In-process workers send no messages (direct calls)."""
    if request.node.callspec.params.get("cluster") == "threads":
        pytest.skip("in-process workers call each other directly: no message carries rows")
    for keyed in (True, False):
        name = f"rl{int(keyed)}"
        ps.create_table(name, shape=(N_ROWS,), block_rows=500, consistency=dask_ps.BSP())
        client.run(_set_keyed, keyed)  # the participants' processes read it
        try:
            out = ps.run(epochs, range(2), table=name)
        finally:
            client.run(_set_keyed, True)
        for snaps in out:
            first = snaps[0].get("bytes_rows", 0)
            later = [b.get("bytes_rows", 0) - a.get("bytes_rows", 0) for a, b in zip(snaps, snaps[1:])]
            assert first > 0, snaps
            if keyed:
                assert later == [0] * (EPOCHS - 1), snaps
                assert snaps[-1].get("row_lists_keyed", 0) > 0 and snaps[-1].get("row_lists_refused", 0) == 0
            else:
                assert all(x >= first // 2 for x in later), snaps  # every epoch's reads and pushes: rows again
        np.testing.assert_array_equal(ps.pull(name), expected(2, ROUNDS * EPOCHS))
    # The run ended: the servers dropped its participants' lists.
    assert sum(client.run(lambda dask_worker: len(dask_worker.extensions["ps"].row_lists)).values()) == 0


def _set_keyed(keyed):
    dask.config.set({"ps.row-lists.keyed": keyed})


def _stored(dask_worker):
    return dask_worker.extensions["ps"].row_lists.stats["stored"]


def _forget_lists(dask_worker):
    """The server's cache as after a restart: empty."""
    lists = dask_worker.extensions["ps"].row_lists
    stats = dict(lists.stats)
    lists.__init__(lists._max_bytes)
    lists.stats = stats  # counted on


def _wait_for_clock(ps, clock, timeout=120):
    deadline = time.monotonic() + timeout  # a wait loop, not a timing assertion
    while time.monotonic() < deadline:
        runs = ps.client.run_on_scheduler(
            lambda dask_scheduler: [list(r.clocks) for r in dask_scheduler.extensions["ps"].runs.values()])
        if runs and min(runs[0]) >= clock:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the run did not reach clock {clock}")


@pytest.mark.parametrize("event", ["restart", "kill"])
def test_exact_sums_when_servers_lose_their_keys_mid_run(event):
    """Mid-run (in the second epoch: every list goes by its key) every
    server forgets its lists (``restart``: they refuse the keys and the
    participants send the lists again), or a worker holding primaries is
    killed and its replicas take over (``kill``: they got the pushes
    forwarded in full, never a participant's key, and a participant knows
    which server acknowledged which list: the lists go to the new
    primaries in full). Either way the table is the exact sum."""
    with LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None) as c, Client(c) as client:
        ps = dask_ps.ParameterServer(client)
        ps.create_table("t", shape=(N_ROWS,), block_rows=500, replication=2, consistency=dask_ps.SSP(1))
        victim = ps.placement("t")[0].worker
        go = Event("row-lists-go", client=client)
        thread, out = run_in_thread(ps, epochs, range(3), table="t", pause="row-lists-go")
        _wait_for_clock(ps, PAUSE_AT)  # every participant waits there
        survivors = [w for w in ps.servers if w != victim]
        stored = client.run(_stored, workers=survivors)
        if event == "restart":
            client.run(_forget_lists)
        else:
            os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        go.set()
        thread.join(180)
        assert not thread.is_alive()
        if "error" in out:
            raise out["error"]
        if event == "restart":
            assert sum(s[-1].get("row_lists_refused", 0) for s in out["result"]) > 0
        # the lists went again in full after the event (to the servers that lost them, the new primaries)
        after = client.run(_stored, workers=survivors)
        assert any(after[w] > stored[w] for w in survivors), (stored, after)
        ps.wait_for_placement()
        np.testing.assert_array_equal(ps.pull("t"), expected(3, ROUNDS * EPOCHS))


def test_a_client_cannot_name_row_lists_by_key(ps, client):
    """Keys come from participants' sessions only (they carry the cluster's
    internal token): a client's keyed list could otherwise replace the
    rows a participant's key names. Refused, nothing stored or applied."""
    ps.create_table("k", shape=(200,), block_rows=200)
    (addr,) = {p.worker for p in ps.placement("k")}
    keyed = {"key": "someone.0", "rows": np.arange(100, dtype=np.int32)}
    with pytest.raises(dask_ps.PSError, match="only from a participant"):
        client.sync(client.rpc(addr).ps_push, table="k", version=1, blocks=[0], rows=[keyed],
                    values=[np.ones(100)])
    with pytest.raises(dask_ps.PSError, match="only from a participant"):
        client.sync(client.rpc(addr).ps_pull, table="k", version=1, blocks=[0], rows=[keyed])
    np.testing.assert_array_equal(ps.pull("k"), np.zeros(200))
    assert client.run(lambda dask_worker: len(dask_worker.extensions["ps"].row_lists), workers=[addr])[addr] == 0
