"""CPU milliseconds of the data work in one LDA participant's row sync per
iteration, without the comm: what the servers and the participant do to
the word-topic rows of a ``sparse_wire`` table (K=1000: 14 blocks of 4 MB,
1.1% nonzero; K=50: 8 blocks of 0.37 MB, 6.6%), half of the blocks in the
participant's own process and half in the other's.

Steps (as in a 2-worker processes fit): the other server's read of its
blocks' rows (and their encoding), the participant's decoding of them, the
own server's read (a copy), the assembly of the 14 blocks into one array,
the participant's encoding of its pushed deltas (~300k moved counts), the
other server's receipt and add of them, the own server's add of the
other half. Process CPU time (load-robust), the median of ``--iters``
iterations; the same script runs on older code (the steps it lacks are
taken the old way), so two checkouts compare with ``PYTHONPATH``::

    python benchmarks/bench_lda_sync_cpu.py --k 1000 50
"""

from __future__ import annotations

import argparse
import inspect
import time

import numpy as np
from distributed.protocol.serialize import Serialize

import dask_ps
from dask_ps import _wire
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec

V = 14608
LAYOUT = {1000: (1048, 0.011), 50: (1826, 0.066)}  # block rows, nonzero share late in a fit (bench_lda wire)


def _unframe(w):
    """A wired value as the receiver gets it (arrays, no frames)."""
    if isinstance(w, dict):
        return {k: (x.data if isinstance(x, Serialize) else x) for k, x in w.items()}
    return w.data


def run(K: int, iters: int) -> dict[str, float]:
    block_rows, density = LAYOUT.get(K, (max(1, (4 << 20) // (4 * K)), 0.011))
    rng = np.random.default_rng(0)
    spec = TableSpec.create("t", (V, K), "int32", block_rows=block_rows, sparse_wire=True)
    store = ShardStore()
    store.create(spec, 1, list(range(spec.n_blocks)))
    t = store.tables["t"]
    for blk in t.blocks.values():
        hit = rng.random(blk.data.shape) < density
        blk.data[hit] = rng.integers(1, 40, int(hit.sum()))
    nb = spec.n_blocks
    remote, local = list(range(0, nb, 2)), list(range(1, nb, 2))
    rows = {b: np.sort(rng.choice(t.blocks[b].data.shape[0], int(0.98 * t.blocks[b].data.shape[0]),
                                  replace=False)).astype(np.int32) for b in range(nb)}
    deltas = {}
    for b in range(nb):
        d = np.zeros((rows[b].size, K), np.int32)
        pos = rng.choice(d.size, 300_000 // nb, replace=False)
        d.reshape(-1)[pos] = rng.choice([-1, 1], pos.size)
        deltas[b] = d
    signed = {1: deltas, -1: {b: -d for b, d in deltas.items()}}  # +, - in turn: the table stays as it is
    sparse_read = "sparse" in inspect.signature(ShardStore.read).parameters
    keeps_pushes = "decode" in inspect.signature(_wire.unwire_values).parameters

    def iteration(sign):
        c, t0 = {}, time.process_time()
        reqs = [(b, rows[b]) for b in remote]
        _, vals = store.read(t, reqs, sparse=True) if sparse_read else store.read(t, reqs)
        wired = [_unframe(_wire.wire_values(v, True)) for v in vals]
        t1 = time.process_time()
        got = _wire.unwire_values(wired)
        t2 = time.process_time()
        _, own = store.read(t, [(b, rows[b].astype(np.int64)) for b in local], copy=True)
        t3 = time.process_time()
        parts = {**dict(zip(remote, got)), **dict(zip(local, own))}
        np.concatenate([parts[b] for b in range(nb)])
        t4 = time.process_time()
        pushed = [_unframe(_wire.wire_values(signed[sign][b], True)) for b in remote]
        t5 = time.process_time()
        received = (_wire.unwire_values(pushed, 1 << 30, decode=False) if keeps_pushes
                    else _wire.unwire_values(pushed, 1 << 30))
        tt, items = store.validate_push("t", 1, remote, [rows[b] for b in remote], received)
        store.commit(tt, store.apply(tt, items))
        t6 = time.process_time()
        tt, items = store.validate_push("t", 1, local, [rows[b].astype(np.int64) for b in local],
                                        [signed[sign][b] for b in local])
        store.commit(tt, store.apply(tt, items))
        t7 = time.process_time()
        c.update({"other server: read + encode": t1 - t0, "participant: decode": t2 - t1,
                  "own server: read": t3 - t2, "participant: assemble": t4 - t3,
                  "participant: encode push": t5 - t4, "other server: receive + add push": t6 - t5,
                  "own server: add push": t7 - t6})
        return c

    for sign in (1, -1):  # warm-up (compiles)
        iteration(sign)
    acc: dict[str, list] = {}
    for i in range(iters):
        for k, v in iteration(1 if i % 2 == 0 else -1).items():
            acc.setdefault(k, []).append(v)
    return {k: float(np.median(v)) * 1e3 for k, v in acc.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[1000, 50])
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    print(f"dask_ps from {dask_ps.__file__}")
    for K in args.k:
        med = run(K, args.iters)
        print(f"K={K}: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()) + f"; total {sum(med.values()):.1f} ms")


if __name__ == "__main__":
    main()
