"""Issue 22: 1e308 pushed twice stored ``inf`` in an ``allow_nonfinite=False``
table (the inputs were checked, the sum was not). Now the second push is
refused like a non-finite input, from a client and from a participant,
dense and by rows, with a clear error naming the table, and every copy
keeps its finite value."""

from __future__ import annotations

import numpy as np
import pytest

import dask_ps

BIG = 1e308


def _copies(name, dask_worker=None):
    t = dask_worker.extensions["ps"].store.tables.get(name)
    return {} if t is None else {b: blk.data.copy() for b, blk in t.blocks.items()}


def _assert_every_copy(client, name, expected, block_rows=4):
    for copies in client.run(_copies, name).values():
        for b, data in copies.items():
            np.testing.assert_array_equal(data, expected[block_rows * b:block_rows * (b + 1)])


@pytest.mark.parametrize("how", ["dense", "rows"])
def test_a_client_push_whose_sum_overflows_is_refused(ps, client, how):
    ps.create_table("o", shape=(8,), block_rows=4, replication=2, allow_nonfinite=False)
    expected = np.zeros(8)
    if how == "dense":
        ps.push("o", np.full(8, BIG))
        expected[:] = BIG
        with pytest.raises(dask_ps.PSValueError, match="'o'.*overflows"):
            ps.push("o", np.full(8, BIG))
    else:
        ps.push_rows("o", [1, 6], [BIG, BIG])
        expected[[1, 6]] = BIG
        with pytest.raises(dask_ps.PSValueError, match="'o'.*overflows"):
            ps.push_rows("o", [5, 6], [1.0, BIG])  # one message: row 5 is fine, row 6 overflows
    np.testing.assert_array_equal(ps.pull("o"), expected)
    _assert_every_copy(client, "o", expected)
    ps.push_rows("o", [6], [-BIG])  # the table still takes pushes
    expected[6] -= BIG
    np.testing.assert_array_equal(ps.pull("o"), expected)


def test_a_push_refused_by_one_server_says_which_blocks_others_applied(ps, client):
    """Each server applies its part of a push whole or not at all; a push
    over blocks on two servers, one of which refuses its part, is partly
    applied, and the error says which blocks were."""
    ps.create_table("o", shape=(16,), block_rows=4, allow_nonfinite=False)
    h = ps._handle("o")
    fine = 0  # a block on another server than ``big``'s (4 blocks: both workers hold some)
    big = next(b for b in range(4) if h.primary(b) != h.primary(fine))
    ps.push_rows("o", [4 * big], [BIG])
    with pytest.raises(dask_ps.PSValueError, match="'o'.*overflows") as err:
        ps.push_rows("o", [4 * fine, 4 * big], [1.0, BIG])
    values = ps.pull("o")
    assert values[4 * big] == BIG and values[4 * fine] == 1.0
    assert any(f"block(s) [{fine}]" in note and f"[{big}] were not" in note for note in err.value.__notes__)


def _push_big_twice(ctx, _, how, table="o"):
    def send():
        if how == "dense":
            ctx.push(table, np.full(8, BIG))
        else:
            ctx.push_rows(table, [1, 6], [BIG, BIG])
        ctx.flush()

    send()
    try:
        send()
    except dask_ps.PSValueError as e:
        error = str(e)
    else:
        error = None
    ctx.clock()
    return error


@pytest.mark.parametrize("how", ["dense", "rows"])
def test_a_participant_push_whose_sum_overflows_is_refused(ps, client, how):
    ps.create_table("o", shape=(8,), block_rows=4, replication=2, allow_nonfinite=False)
    (error,) = ps.run(_push_big_twice, [None], how=how)
    assert error is not None and "'o'" in error and "overflows" in error
    expected = np.full(8, BIG) if how == "dense" else np.where(np.isin(np.arange(8), [1, 6]), BIG, 0.0)
    np.testing.assert_array_equal(ps.pull("o"), expected)
    _assert_every_copy(client, "o", expected)


def _push_big_once(ctx, _):
    ctx.push("c", np.full(4, BIG))
    try:
        ctx.flush()
    except dask_ps.PSValueError as e:
        ctx.clock()
        return str(e)
    ctx.clock()
    return None


def test_participants_whose_clock_sum_overflows_are_refused(ps, client):
    """aggregate="clock": two participants push 1e308 in the same clock; the
    servers sum them when the clock completes, so the second to arrive is
    refused when it is pushed, and the clock's sum that is applied is finite."""
    ps.create_table("c", shape=(4,), aggregate="clock", consistency=dask_ps.BSP(), allow_nonfinite=False)
    errors = ps.run(_push_big_once, range(2))
    refused = [e for e in errors if e is not None]
    assert len(refused) == 1 and "'c'" in refused[0] and "clock" in refused[0], errors
    np.testing.assert_array_equal(ps.pull("c"), np.full(4, BIG))
