"""Tables with ``sparse_wire=True`` on a LocalCluster: what participants push
and read is exactly what a plain table holds, while the rows cross
processes as their nonzeros (the servers' reply bytes shrink, pushes arrive
encoded); never over an in-process comm, nor from the client."""

from __future__ import annotations

import numpy as np

import dask_ps

N_ROWS, WIDTH = 2000, 1100  # blocks of 250 rows: 1.1 MB, over _sparse_rows.MIN_BYTES


def _deltas(rng, lo, hi, width, density):
    """Integer deltas of the rows ``lo .. hi - 1``, at ``density`` nonzero (negatives too)."""
    rows = np.arange(lo, hi)
    vals = np.zeros((rows.size, width), dtype=np.int32)
    hit = rng.random(vals.shape) < density
    vals[hit] = rng.integers(-3, 4, size=int(hit.sum()))
    return rows, vals


def _over_tcp(client) -> bool:
    return not next(iter(client.scheduler_info()["workers"])).startswith("inproc://")


def _count_decoded(dask_worker=None):
    """On a worker: count the pushed values that arrive encoded."""
    from dask_ps import _worker_plugin

    plain = getattr(_worker_plugin, "_plain_unwire", _worker_plugin.unwire_values)
    _worker_plugin._plain_unwire = plain
    _worker_plugin.decoded = 0

    def counting(values, max_bytes=None, decode=True):
        _worker_plugin.decoded += sum(isinstance(v, dict) for v in values)
        return plain(values, max_bytes, decode)

    _worker_plugin.unwire_values = counting


def _decoded_and_restore(dask_worker=None):
    from dask_ps import _worker_plugin

    _worker_plugin.unwire_values = _worker_plugin._plain_unwire
    return _worker_plugin.decoded


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

    client.run(_count_decoded)
    try:
        assert ps.run(train, range(2)) == [[True] * 4] * 2
    finally:
        decoded = sum(client.run(_decoded_and_restore).values())
    tcp = _over_tcp(client)
    assert (decoded > 0) == tcp  # encoded pushes arrived; an in-process comm copies nothing
    np.testing.assert_array_equal(ps.pull("sparse"), ps.pull("plain"))

    def read_all(ctx, name):
        return ctx.worker.address, ctx.pull_rows(name, np.arange(N_ROWS)).tobytes()

    sizes, values = {}, {}
    for name in ("sparse", "plain"):
        before = _served_pulled(client)
        ((where, values[name]),) = ps.run(read_all, [name])
        sizes[name] = _served_pulled(client) - before
    assert values["sparse"] == values["plain"]
    block_bytes = 250 * WIDTH * 4
    owners = ps._handle("sparse").owners
    local = sum(o[0] == where for o in owners) * block_bytes
    remote = N_ROWS * WIDTH * 4 - local
    assert sizes["plain"] == local + remote and remote > 0
    if tcp:  # the other worker's blocks: their nonzeros (block 0, dense, as it is)
        assert sizes["sparse"] < local + block_bytes + 0.1 * remote
    else:
        assert sizes["sparse"] == local + remote


def test_sparse_wire_pushes_reach_the_replicas_as_they_came(ps, client):
    """A primary forwards pushed rows as they arrived (nonzeros, or an
    array from its own process's session): every copy ends equal to a
    plain table's."""
    for name, sparse in (("rep-sparse", True), ("rep-plain", False)):
        ps.create_table(name, shape=(N_ROWS, WIDTH), dtype="int32", block_rows=250, sparse_wire=sparse,
                        replication=2, consistency=dask_ps.BSP())

    def train(ctx, rank):
        rng = np.random.default_rng(10 + rank)
        for _ in range(3):
            rows, vals = _deltas(rng, 0, N_ROWS, WIDTH, 0.01)
            for name in ("rep-sparse", "rep-plain"):
                ctx.push_rows(name, rows, vals)
            ctx.clock()
        return True

    assert ps.run(train, range(2)) == [True, True]

    def copies(dask_worker, name):
        t = dask_worker.extensions["ps"].store.tables[name]
        return {b: blk.data.tobytes() for b, blk in t.blocks.items()}

    want = ps.pull("rep-plain")
    for addr, blocks in client.run(copies, name="rep-sparse").items():
        assert len(blocks) == ps._handle("rep-sparse").spec.n_blocks  # two workers, two copies: all blocks each
        for b, data in blocks.items():
            assert data == want[b * 250:(b + 1) * 250].tobytes(), (addr, b)
