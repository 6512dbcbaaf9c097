"""The measured inputs of ``sync_sim.py`` on 2 workers, in both layouts
(embedded threads: ``LocalCluster(processes=False)``; worker processes),
side by side in one run: the per-message and per-byte CPU of the current
sync path, the sync cycles' walls, and the 2-worker fits the simulation
is validated against.

- **Per message and per byte** (``_msg_cycle``): rank 0 pushes ``U`` rows
  of a 2^20 x 1 float64 BSP table as ``k`` flushes a clock (k = 1, 4, 12),
  the rows all in one block (its own server's: direct calls; the peer's:
  messages), then reads them and calls ``clock()``; rank 1 only clocks.
  The CPU of every process per clock (``process_time``: worker processes
  summed; threads: this one process, client and scheduler included), less
  the idle rate, against the requests ``metrics()["messages"]`` counted
  and the bytes: CPU = a + b x bytes + c x messages + d x direct calls
  (non-negative least squares). The counts vary the messages at P = 2,
  no oversubscription.
- **The cycles** of ``scaling_model`` (SGD's round and LDA's iteration
  without compute) at 2 sizes: wall and CPU per cycle; LDA's twice, as
  the unseeded default syncs (SSP(2) with refresh) and as the seeded fits
  validated here do (BSP, summed per clock, the read with the clock
  before: ``lda-bsp``).
- **Fits** (the figures predicted): ``SGDClassifier`` click-through
  ``--sgd-n`` rows, ``max_iter`` 1 and 2, and LDA K=50 on the news corpus
  (``--lda-docs`` documents, ``--lda-iters``), 3 each, and their tiny
  versions (fixed per-fit costs), with ``metrics_``.

    python benchmarks/sync_measure.py --json sync_measure.json     # ~6 minutes on 2 shared cores
    python benchmarks/sync_measure.py --messages-only --layouts processes --json msg.json   # ~1 minute

CPU seconds (not walls) carry the constants: the machine is shared, and the
load average is recorded with each layout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys
import time
import warnings

import dask
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import scaling_model as sm  # noqa: E402

LOG = logging.getLogger("sync_measure")
N_MSG = 2**20
REPS = 40


def _msg_cycle(ctx, part, *, table, reps):
    """Rank 0: ``flushes`` pushes of its rows a clock, a read, ``clock()``;
    the others only clock. Returns the messages and bytes sent by kind
    over the ``reps`` clocks."""
    before = ctx.metrics()["messages"]
    rows = part["rows"] if ctx.rank == 0 else np.empty(0, np.int64)
    chunks = np.array_split(rows, part["flushes"]) if rows.size else []
    vals = np.full((rows.size, 1), 1e-6)
    for _ in range(reps):
        for ch in chunks:
            ctx.push_rows(table, ch, vals[: ch.size])
            ctx.flush()
        if rows.size:
            ctx.pull_rows(table, rows)
        ctx.clock()
    after = ctx.metrics()["messages"]
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def _cpu(client, threads):
    """CPU seconds so far of everything that serves the run: the worker
    processes (summed), or in the threads layout this one process."""
    if threads:
        return time.process_time()
    return sum(client.run(time.process_time).values())


def message_costs(client, ps, threads, sizes=(200, 20_000), flushes=(1, 4, 12)):
    import dask_ps

    table = "sync-msg"
    ps.create_table(table, (N_MSG, 1), dtype="float64", consistency=dask_ps.BSP())
    out = []
    try:
        blocks = ps.placement(table)
        idle = idle_rate(client, threads)
        for blk in (blocks[0], blocks[-1]):  # one block of each worker: rank 0's own server and its peer's
            for U in sizes:
                rows = np.sort(np.random.default_rng(U).choice(np.arange(blk.start, blk.stop), U, replace=False))
                for k in flushes:
                    parts = [{"rows": rows.astype(np.int64), "flushes": k} for _ in range(2)]
                    ps.run(_msg_cycle, parts, table=table, reps=3)  # warm
                    got = {}
                    for reps in (4, REPS):
                        c0, t0 = _cpu(client, threads), time.perf_counter()
                        res = ps.run(_msg_cycle, parts, table=table, reps=reps)
                        wall = time.perf_counter() - t0
                        got[reps] = (_cpu(client, threads) - c0 - idle * wall, res, wall)
                    n = REPS - 4
                    sent = {}
                    for r_long, r_short in zip(got[REPS][1], got[4][1]):
                        for kind in set(r_long) | set(r_short):
                            sent[kind] = sent.get(kind, 0) + (r_long.get(kind, 0) - r_short.get(kind, 0)) / n
                    remote = sum(v for kk, v in sent.items() if kk in ("push", "pull", "clock", "wait"))
                    local = sum(v for kk, v in sent.items() if kk.endswith("_local"))
                    row = {"U": U, "flushes": k, "block_worker": blk.worker, "messages": remote, "local": local,
                           "by_kind": sent, "bytes": sent.get("bytes_pushed", 0) + sent.get("bytes_pulled", 0),
                           "cpu": (got[REPS][0] - got[4][0]) / n, "wall": (got[REPS][2] - got[4][2]) / n}
                    out.append(row)
                    LOG.info("msg cycle U=%d k=%d block on %s: %.1f messages %.1f direct a clock, CPU %.2f ms, "
                             "wall %.2f ms", U, k, blk.worker[-5:], remote, local, 1e3 * row["cpu"], 1e3 * row["wall"])
    finally:
        ps.drop_table(table)
    return out


def idle_rate(client, threads, seconds=2.0):
    c0, t0 = _cpu(client, threads), time.perf_counter()
    time.sleep(seconds)
    return (_cpu(client, threads) - c0) / (time.perf_counter() - t0)


def fit_message_costs(rows):
    """CPU a clock = a + b x bytes + c x messages + d x direct calls."""
    A = np.array([[1.0, r["bytes"], r["messages"], r["local"]] for r in rows])
    coef = sm.lstsq(A, [r["cpu"] for r in rows])
    pred = A @ coef
    resid = float(np.sqrt(np.mean((pred - np.array([r["cpu"] for r in rows])) ** 2)))
    return {"a": coef[0], "per_byte": coef[1], "per_message": coef[2], "per_direct": coef[3], "rms": resid}


def layout(threads, args, X_sgd, y_sgd, X_lda, pool):
    from distributed import Client, LocalCluster

    import dask_ps

    name = "threads" if threads else "processes"
    out = {"layout": name, "load_start": sm.load()}
    LOG.info("%s: 2 workers (load %s)", name, sm.load())
    if threads:  # the scaling model's CPU counters, for one process
        sm.process_cpu = lambda client: (time.process_time(), 0.0)
    else:
        sm.process_cpu = _process_cpu
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=not threads, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(2)
        ps = dask_ps.ParameterServer(client)
        ps.wait_for_servers(2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sm.sgd_fit(client, X_sgd[:60_000], y_sgd[:60_000], 1, 2)  # warm: kernels, plugins
            sm.lda_fit(client, X_lda[:200], 2)
            before = share(pool)
            out["messages"] = message_costs(client, ps, threads)
            out["fit_messages"] = fit_message_costs(out["messages"])
            if args.messages_only:
                out["cycle_share"] = 0.5 * (before + share(pool))
                out["load_end"] = sm.load()
                return out
            rng = np.random.default_rng(0)
            lda_sizes = {"U": [2_000, min(12_000, X_lda.shape[1])], "V": X_lda.shape[1]}
            # LDA's cycle twice: under the unseeded default (SSP(2), refresh) and as the seeded fits
            # validated here sync (BSP, summed per clock, the read with the clock before)
            out["cycles"] = {"sgd": sm.cycle_costs(client, ps, 2, "sgd", {"U": [2_000, 30_000]}, rng),
                             "lda": sm.cycle_costs(client, ps, 2, "lda", lda_sizes, rng),
                             "lda-bsp": sm.cycle_costs(client, ps, 2, "lda-bsp", lda_sizes, rng)}
            out["cycle_share"] = 0.5 * (before + share(pool))  # the load while the constants were measured
            Xt, yt = X_sgd[:24_000], y_sgd[:24_000]
            out["idle"] = idle_rate(client, threads)
            out["sgd_tiny"] = fits(lambda: sm.sgd_fit(client, Xt, yt, 1, 2), pool, 3)
            out["sgd_tiny"].update(n=Xt.shape[0], nnz=int(Xt.nnz))
            out["lda_tiny"] = fits(lambda: sm.lda_fit(client, X_lda[:300], 1), pool, 3)
            out["sgd"] = []
            for E in args.sgd_epochs:
                r = fits(lambda: sm.sgd_fit(client, X_sgd, y_sgd, E, 2), pool, args.repeats)
                out["sgd"].append(r)
                LOG.info("%s: SGD E=%d: %s s", name, E, " ".join(f"{w:.3f}" for w in r["walls"]))
            out["lda"] = fits(lambda: sm.lda_fit(client, X_lda, args.lda_iters), pool, args.repeats)
            LOG.info("%s: LDA %d iterations: %s s", name, args.lda_iters,
                     " ".join(f"{w:.3f}" for w in out["lda"]["walls"]))
    out["load_end"] = sm.load()
    return out


def share(pool):
    """The share of a core each of 2 spinning processes gets: the machine's
    other load (1.00: quiet); probed just before and after each fit."""
    return float(np.mean(list(pool.map(sm._spin, [0.5, 0.5]))))


def fits(fn, pool, repeats):
    """``repeats`` fits by ``fn()``, each with the core share before and
    after it; the median fit, every wall and share kept."""
    out = []
    for _ in range(repeats):
        before = share(pool)
        f = fn()
        f["share"] = 0.5 * (before + share(pool))
        out.append(f)
    r = sm.median_fit(out)
    r["each"] = [{"wall": f["wall"], "share": f["share"], "worker_cpu": f["worker_cpu"]} for f in out]
    return r


def _process_cpu(client):
    return sum(client.run(time.process_time).values()), time.process_time()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sgd-n", type=int, default=200_000)
    ap.add_argument("--sgd-epochs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--lda-docs", type=int, default=1500)
    ap.add_argument("--lda-iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layouts", nargs="+", default=["threads", "processes"])
    ap.add_argument("--messages-only", action="store_true", help="the per-message and per-byte cycles alone")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("distributed").setLevel(logging.ERROR)
    from bench_lda import load_news, split
    from bench_sgd import ctr_data

    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(2)  # the load probe, started before any cluster
    X_sgd, y_sgd = ctr_data(args.sgd_n, sm.D_SGD)
    X_lda = split(load_news())[0][: args.lda_docs]
    meas = {"sgd_n": X_sgd.shape[0], "sgd_nnz": int(X_sgd.nnz), "lda_docs": X_lda.shape[0],
            "lda_tokens": int(X_lda.sum()), "lda_iters": args.lda_iters, "cores": os.cpu_count(),
            "commit": sm._commit(), "layouts": {},
            # the seeded BSP LDA fits send each iteration's read with the clock before (ps.lda.read-ahead)
            "lda_read_ahead": bool(dask.config.get("ps.lda.read-ahead", False))}
    for name in args.layouts:
        meas["layouts"][name] = layout(name == "threads", args, X_sgd, y_sgd, X_lda, pool)
        pathlib.Path(args.json).write_text(json.dumps(meas, default=float))
    pool.terminate()
    LOG.info("measurements: %s", args.json)


if __name__ == "__main__":
    main()
