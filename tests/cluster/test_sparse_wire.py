"""Tables with ``sparse_wire=True`` on a LocalCluster: what participants and
the client push and read is exactly what a plain table holds, while the
rows cross processes as their nonzeros (the servers' reply bytes shrink,
pushes are sent encoded)."""

from __future__ import annotations

import numpy as np

import dask_ps
from dask_ps import _transport

N_ROWS, WIDTH = 3000, 300


def _deltas(rng, lo, hi, width, density):
    """Integer deltas of a third of the rows ``lo .. hi - 1``, at ``density`` nonzero (negatives too)."""
    rows = np.sort(rng.choice(np.arange(lo, hi), size=(hi - lo) // 3, replace=False))
    vals = np.zeros((rows.size, width), dtype=np.int32)
    hit = rng.random(vals.shape) < density
    vals[hit] = rng.integers(-3, 4, size=int(hit.sum()))
    return rows, vals


def _over_tcp(client) -> bool:
    return not next(iter(client.scheduler_info()["workers"])).startswith("inproc://")


def _served_pulled(client) -> int:
    return sum(client.run(lambda dask_worker: dask_worker.extensions["ps"].served["bytes_pulled"]).values())


def test_sparse_wire_reads_and_pushes_equal_a_plain_tables(ps, client):
    for name, sparse in (("sparse", True), ("plain", False)):
        ps.create_table(name, shape=(N_ROWS, WIDTH), dtype="int32", block_rows=250, sparse_wire=sparse,
                        consistency=dask_ps.BSP())

    def train(ctx, rank):
        rng = np.random.default_rng(rank)
        reads = []
        for it in range(4):
            # block 0 dense (sent and read as it is), the others mostly zeros (encoded), in one flush
            for lo, hi, density in ((0, 250, 0.9), (250, N_ROWS, 0.01)):
                rows, vals = _deltas(rng, lo, hi, WIDTH, density)
                for name in ("sparse", "plain"):
                    ctx.push_rows(name, rows, vals)
            ctx.clock()
            want = rng.integers(0, N_ROWS, size=1000)  # unsorted, with duplicates
            got = [ctx.pull_rows(name, want) for name in ("sparse", "plain")]
            assert got[0].dtype == np.int32 and got[0].flags.writeable
            reads.append(bool(np.array_equal(got[0], got[1])))
        return reads

    assert ps.run(train, range(2)) == [[True] * 4] * 2
    rng = np.random.default_rng(7)
    rows, vals = _deltas(rng, 0, N_ROWS, WIDTH, 0.02)
    encoded = []

    def counting(values, sparse):
        wired = wire_values(values, sparse)
        encoded.append(isinstance(wired, dict))
        return wired

    wire_values = _transport.wire_values
    _transport.wire_values = counting
    try:
        for name in ("sparse", "plain"):
            ps.push_rows(name, rows, vals)  # from the client: through Transport.push
    finally:
        _transport.wire_values = wire_values
    np.testing.assert_array_equal(ps.pull("sparse"), ps.pull("plain"))
    tcp = _over_tcp(client)
    assert any(encoded) == tcp  # an in-process comm copies nothing: never encoded
    all_rows = np.arange(N_ROWS)
    sizes = {}
    for name in ("sparse", "plain"):
        before = _served_pulled(client)
        assert np.array_equal(ps.pull_rows(name, all_rows), ps.pull_rows("plain", all_rows))
        sizes[name] = _served_pulled(client) - before
    plain_bytes = 2 * N_ROWS * WIDTH * 4
    assert sizes["plain"] == plain_bytes
    if tcp:  # the sparse table's reply: its nonzeros, far less than its rows
        assert sizes["sparse"] < 0.6 * plain_bytes
    else:
        assert sizes["sparse"] == plain_bytes
