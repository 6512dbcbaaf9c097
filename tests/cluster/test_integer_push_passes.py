"""An integer table's sums are checked against its range (issue 34), from a
bound of each push's magnitudes. The participant finds it once, in the
check of its values, and sends it with the push: neither its leases nor the
server's lease and apply measure the values again (three passes over every
push of LDA's counts made its K = 1000 sync 40% slower). A bound is never
trusted where it may be wrong: duplicate rows summed in a push (integers
are then summed wide, and their exact bound kept)."""

from __future__ import annotations

import numpy as np
import pytest

import dask_ps
from dask_ps import _shard, _sums, _transport
from dask_ps._oplog import PushBuffer
from dask_ps._spec import TableSpec, check_values


def test_the_check_of_integer_values_finds_their_bound():
    spec = TableSpec.create("t", (4, 3), "int32", block_rows=2)
    vals = np.array([[1, -7, 0], [2, 3, 0], [0, 0, 5], [0, 0, 0]], np.int32)
    _, bound = check_values(spec, vals, (4, 3), bound=True)
    assert bound == 7.0
    assign = TableSpec.create("a", (4, 3), "int32", block_rows=2, rule="assign")
    assert check_values(assign, vals, (4, 3), bound=True)[1] is None  # not checked for overflow: not measured


def test_a_row_buffer_keeps_a_bound_that_holds():
    spec = TableSpec.create("t", (8,), "int32", block_rows=4)
    buf = PushBuffer(spec)
    buf.add_rows(np.array([1, 5]), np.array([3, -4], np.int32), bound=4.0)
    buf.add_rows(np.array([5, 6]), np.array([2, 1], np.int32), bound=2.0)
    assert buf.bound == 6.0  # rows of two pushes may overlap: |a + b| <= |a| + |b|
    dup = PushBuffer(spec)
    dup.add_rows(np.array([2, 2, 2]), np.array([4, 4, 4], np.int32), bound=4.0)
    assert dup.bound == 12.0  # row 2's sum, past the values' bound (4): an integer sum is made wide, exactly


def _count_passes(monkeypatch):
    """Passes over a push's values to find its bound: at a sender's leases
    (``_transport.push_bound``) and on a server (``_bound_of`` without a
    known bound); not the stored blocks' (``_data_bound``: once a block)."""
    calls = []
    real_bound, real_bound_of = _sums.push_bound, _sums._bound_of

    def at_sender(x):
        calls.append(("sender", getattr(x, "nbytes", 0)))
        return real_bound(x)

    def at_server(vals, bounds):
        if not bounds or id(vals) not in bounds:
            calls.append(("server", getattr(vals, "nbytes", 0)))
        return real_bound_of(vals, bounds)

    monkeypatch.setattr(_transport, "push_bound", at_sender)
    monkeypatch.setattr(_sums, "_bound_of", at_server)
    monkeypatch.setattr(_shard, "_bound_of", at_server)
    return calls


def _push_rows_twice(ctx, rank, *, name, rows, values):
    for _ in range(2):  # the second draws on the leases the first one's replies brought
        ctx.push_rows(name, rows, values)
        ctx.clock()


@pytest.mark.parametrize("sparse_wire", [False, True])
def test_a_participants_integer_push_is_measured_once(ps, monkeypatch, sparse_wire):
    """Two servers (the table's blocks on both in-process workers), one
    participant, an int32 table of counts: the participant's row pushes
    over both servers are applied with no pass over their values on the
    servers' side (the shared cluster runs its workers in this process, so
    every ``push_bound`` call is counted), and the sums are exact."""
    n = 64
    # 32 blocks: over both servers whatever the placement draws (what is
    # asserted holds on one server too, only without the leases' path)
    ps.create_table("counts", shape=(n, 16), dtype="int32", block_rows=2, sparse_wire=sparse_wire)
    rows = np.arange(0, n, 3)
    values = np.zeros((rows.size, 16), np.int32)
    values[:, 2] = 5
    values[::2, 7] = -3
    calls = _count_passes(monkeypatch)
    ps.run(_push_rows_twice, [0], name="counts", rows=rows, values=values)
    expected = np.zeros((n, 16), np.int32)
    expected[rows] += 2 * values
    np.testing.assert_array_equal(ps.pull("counts"), expected)
    assert calls == [], f"the values of a participant's push were measured again: {calls}"


def _remote_transport():
    """A transport as in a worker whose servers are all in other processes
    (``_sparse`` and ``serialized`` hold for every TCP address)."""
    from types import SimpleNamespace

    t = _transport.Transport(rpc=None, scheduler=None)
    t.local = SimpleNamespace(worker=None)
    return t


def _nwk_handle(dtype="int32", rule="sum", sparse_wire=True):
    from dask_ps._routing import TableHandle

    spec = TableSpec.create("nwk", (8192, 64), dtype, block_rows=4096, rule=rule, sparse_wire=sparse_wire)
    return TableHandle(spec, 1, (("tcp://10.0.0.2:2",), ("tcp://10.0.0.3:3",)))


def test_a_sparse_wire_push_finds_its_bound_from_the_nonzeros_it_sends(monkeypatch):
    """K=1000 LDA's counts: the flush encodes the rows for servers in other
    processes once and bounds them from those nonzeros; no pass over the
    dense delta for its bound (it was 8 ms a clock). Rows too dense to
    shrink stay arrays and are measured; the bound is exact either way."""
    from dask_ps import _sparse_rows

    t, h = _remote_transport(), _nwk_handle()
    assert t.bound_from_nonzeros(h)
    assert not t.bound_from_nonzeros(_nwk_handle(dtype="float32"))  # a float's bound is its NaN/Inf pass's
    assert not t.bound_from_nonzeros(_nwk_handle(rule="assign"))
    assert not t.bound_from_nonzeros(_nwk_handle(sparse_wire=False))
    assert not _transport.Transport(rpc=None, scheduler=None).bound_from_nonzeros(h)  # a client sends arrays
    sparse = np.zeros((4096, 64), np.int32)  # 1 MiB: _sparse_rows.MIN_BYTES
    sparse[1, 3], sparse[200, 60] = -9, 4
    dense = np.arange(1, 4096 * 64 + 1, dtype=np.int32).reshape(4096, 64)  # every element nonzero: stays dense
    measured = []
    real = _sums.push_bound
    monkeypatch.setattr(_transport, "push_bound", lambda x: measured.append(type(x).__name__) or real(x))
    msgs = {h.owners[0][0]: [(0, None, sparse)], h.owners[1][0]: [(1, None, dense)]}
    wired, bound = t.wire_nonzeros(h, msgs)
    assert bound == 4096.0 * 64
    enc = wired[h.owners[0][0]][0][2]
    assert isinstance(enc, _sparse_rows.EncodedRows) and enc.vals.size == 2
    np.testing.assert_array_equal(enc.toarray(), sparse)
    assert wired[h.owners[1][0]][0][2] is dense
    assert measured == ["EncodedRows", "ndarray"]
    assert msgs[h.owners[0][0]][0][2] is sparse  # the flight's own items stay dense (cache, prefetches)
    only_sparse = t.wire_nonzeros(h, {h.owners[0][0]: [(0, None, sparse)]})[1]
    assert only_sparse == 9.0


def _count_exact_totals(dask_worker=None):
    """On a worker: count the buffers' exact wide sums (``PushBuffer._int_total``
    where the bounds did not settle it)."""
    from dask_ps import _oplog

    real = getattr(_oplog.PushBuffer, "_real_int_total", _oplog.PushBuffer._int_total)
    _oplog.PushBuffer._real_int_total = real
    _oplog.exact_totals = 0

    def counting(self, *a, **k):
        out = real(self, *a, **k)
        _oplog.exact_totals += out is not None
        return out

    _oplog.PushBuffer._int_total = counting


def _exact_totals_and_restore(dask_worker=None):
    from dask_ps import _oplog

    _oplog.PushBuffer._int_total = _oplog.PushBuffer._real_int_total
    return _oplog.exact_totals


def test_two_row_pushes_in_a_clock_of_a_sparse_wire_table_are_summed_exactly(ps, client):
    """The first push of a clock leaves its bound to the flush's nonzeros
    (worker processes); a second one before the flush measures the first's,
    so the buffer's sum is settled by the bounds (no exact wide sum of the
    table), and the counts are exact."""
    n = 64
    ps.create_table("twice", shape=(n, 16), dtype="int32", block_rows=2, sparse_wire=True)
    rows = np.arange(0, n, 3)
    values = np.zeros((rows.size, 16), np.int32)
    values[:, 2] = 5
    values[::2, 7] = -3

    def twice(ctx, rank, *, name, rows, values):
        for _ in range(2):
            ctx.push_rows(name, rows, values)
            ctx.push_rows(name, rows[::2], values[::2])
            ctx.clock()

    client.run(_count_exact_totals)
    try:
        ps.run(twice, [0], name="twice", rows=rows, values=values)
    finally:
        exact = sum(client.run(_exact_totals_and_restore).values())
    expected = np.zeros((n, 16), np.int32)
    expected[rows] += 2 * values
    expected[rows[::2]] += 2 * values[::2]
    np.testing.assert_array_equal(ps.pull("twice"), expected)
    assert exact == 0, f"{exact} exact wide sums of the buffered pushes"
