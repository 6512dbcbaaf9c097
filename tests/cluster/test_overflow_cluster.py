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


def _blocks_with_two_primaries(ps, prefix, fine, **spec):
    """Create a table named ``prefix`` (or ``prefix`` + a number) and
    return ``(name, block)``, a block whose primary is not ``fine``'s.
    The placement hashes the table's name over the workers' addresses
    (ports differ per cluster): for one name all 6 primaries can fall on
    one worker (1 in 32 clusters), and then do for every try of that name,
    so the next try takes another name."""
    ps.wait_for_servers(2, timeout=60)  # both workers serve (a busy one may still be joining)
    for i in range(50):
        name = prefix if i == 0 else f"{prefix}{i}"
        ps.create_table(name, **spec)
        h = ps._handle(name)
        big = next((b for b in range(6) if h.primary(b) != h.primary(fine)), None)
        if big is not None:
            return name, big
        last = ps.placement(name)
        ps.drop_table(name)
    raise AssertionError(f"50 table names put every primary on one worker "
                         f"(servers: {ps.servers}, last placement: {last})")


@pytest.mark.parametrize("replication", [1, 2])
def test_a_push_refused_by_one_server_is_applied_by_none(ps, client, replication):
    """Issue 34: a push over blocks on two servers, one of which would
    overflow, raised "nothing was applied" yet the other server had applied
    its part (4 of 5 calls; a dense push changed 16 of 24 rows). Every
    server now holds its part, checked, before any applies it."""
    fine = 0
    o, big = _blocks_with_two_primaries(ps, "o", fine, shape=(24,), block_rows=4, allow_nonfinite=False,
                                     replication=replication)
    ps.push_rows(o, [4 * big], [BIG])
    expected = ps.pull(o)
    for _ in range(3):
        with pytest.raises(dask_ps.PSValueError, match=f"'{o}'.*overflows.*nothing was applied"):
            ps.push_rows(o, [4 * fine, 4 * big], [1.0, BIG])
        np.testing.assert_array_equal(ps.pull(o), expected)
        with pytest.raises(dask_ps.PSValueError, match=f"'{o}'.*overflows.*nothing was applied"):
            ps.push(o, np.full(24, BIG))
        np.testing.assert_array_equal(ps.pull(o), expected)
    _assert_every_copy(client, o, expected)
    ps.push_rows(o, [4 * fine, 4 * big], [1.0, -BIG])  # still takes pushes, both parts
    expected[[4 * fine, 4 * big]] = [1.0, 0.0]
    np.testing.assert_array_equal(ps.pull(o), expected)
    _assert_every_copy(client, o, expected)


def test_an_integer_push_refused_by_one_server_is_applied_by_none(ps, client):
    t, big = _blocks_with_two_primaries(ps, "i", 0, shape=(24,), dtype="int32", block_rows=4)
    ps.push_rows(t, [4 * big], np.array([2**31 - 1], np.int32))
    with pytest.raises(dask_ps.PSValueError, match=f"'{t}'.*out of the range of int32.*nothing was applied"):
        ps.push(t, np.ones(24, np.int32))
    expected = np.zeros(24, np.int32)
    expected[4 * big] = 2**31 - 1
    np.testing.assert_array_equal(ps.pull(t), expected)


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


def test_a_table_created_again_under_its_name_has_none_of_the_old_leases(ps, client):
    """A client's leases (what it may push to a block unchecked, one phase)
    were kept by table name: after the table was dropped and created again,
    a push over two servers went in one phase on the old table's leases,
    and the new table's server that would overflow refused its part while
    the other applied its own (seen once in a full run of this file's
    all-or-nothing test)."""
    ps.create_table("o", shape=(24,), block_rows=4, allow_nonfinite=False)
    for _ in range(2):  # two-phase pushes over every block: leases at both servers
        ps.push("o", np.ones(24))
    ps.drop_table("o")
    ps.create_table("o", shape=(24,), block_rows=4, allow_nonfinite=False)
    h = ps._handle("o")
    fine = 0
    big = next(b for b in range(6) if h.primary(b) != h.primary(fine))
    ps.push_rows("o", [4 * big], [1.75e308])  # one server: no lease needed
    expected = ps.pull("o")
    with pytest.raises(dask_ps.PSValueError, match="'o'.*overflows.*nothing was applied"):
        ps.push_rows("o", [4 * fine, 4 * big], [1.0, 1e307])  # within the old table's leases
    np.testing.assert_array_equal(ps.pull("o"), expected)
    _assert_every_copy(client, "o", expected)
