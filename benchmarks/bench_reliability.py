"""What reliability costs and what it buys (issue 6).

1. Cost of replication: push throughput with replication=2 vs 1 (ratio), from
   the client and from participants, measured in the same run.
2. Recovery: a participant flushes pushes continuously; a worker holding
   blocks is killed with SIGKILL. Reports the longest stall seen by the
   participant and the time until every block has two copies again.
3. Soak: 8 participants x 10,000 single-row pushes with one kill in the
   middle; reports pushes lost (must be 0) and peak worker memory.
4. Reads from replicas: participant pull throughput on a replication=2 table,
   reading any up-to-date copy (the default) vs the primary only
   (``ps.read-replicas: false``), measured in the same run.
5. A hung worker: as 2., but the worker holding blocks is stopped (SIGSTOP)
   for ``--stop`` seconds instead of killed. Reports the longest stall seen
   by the participant with hung-worker fencing (``ps.timeouts.hung``) and
   without it (``ps.timeouts.hung: 0``: the stall lasts as long as the
   stop), and whether every push counted exactly once after SIGCONT.

    python benchmarks/bench_reliability.py [--budget 2] [--pushes 10000] [--only reads|stop]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time

import numpy as np
from distributed import Client, LocalCluster

import dask_ps

logger = logging.getLogger("bench_reliability")


def rate(fn, budget):
    fn()  # warm up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < budget or n < 3:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def participant_flushes(ctx, _, table, n, width):
    rng = np.random.default_rng(ctx.rank)
    t0 = time.perf_counter()
    for _ in range(n):
        ctx.push_rows(table, rng.integers(0, 1000, 64), np.ones((64, width)))
        ctx.flush()
    return n / (time.perf_counter() - t0)


def replication_cost(ps, budget):
    rows = []
    for size in (64 * 1024, 1024 * 1024, 16 * 1024 * 1024):
        r = {}
        for k in (1, 2):
            name = f"cost{k}"
            ps.create_table(name, shape=(size // 8,), replication=k, block_rows=max(1, size // 8 // 4))
            x = np.ones(size // 8)
            r[k] = rate(lambda: ps.push(name, x), budget)
            ps.drop_table(name)
        rows.append((f"client push {size // 1024} KiB", r[1], r[2]))
    r = {}
    for k in (1, 2):
        ps.create_table("flush", shape=(1000, 16), replication=k, block_rows=100)
        r[k] = float(np.mean(ps.run(participant_flushes, range(2), table="flush", n=300, width=16)))
        ps.drop_table("flush")
    rows.append(("participant flush (64 rows x 16)", r[1], r[2]))
    return rows


def participant_pulls(ctx, _, table, seconds):
    ctx.pull(table)  # warm up (handle, connections)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 3:
        ctx.pull(table)
        n += 1
    return n / (time.perf_counter() - t0)


def _read_replicas(on: bool) -> None:
    import dask

    dask.config.set({"ps.read-replicas": on})


def replica_reads(ps, client, budget):
    """One participant per worker pulls the whole table in a loop (CVAP with
    a huge value bound: every read goes to a server, never the cache); the
    sum of their rates, median of 3 interleaved rounds."""
    rows = []
    n = len(ps.servers)
    for size in (64 * 1024, 4 * 1024 * 1024):
        ps.create_table("reads", shape=(size // 8 // 16, 16), replication=2, block_rows=max(1, size // 8 // 16 // 12),
                        consistency=dask_ps.CVAP(2, 1e18))
        ps.push("reads", np.ones((size // 8 // 16, 16)))
        r = {False: [], True: []}
        for _ in range(3):  # interleaved rounds, median: the machine is shared
            for on in (False, True):
                client.run(_read_replicas, on)
                r[on].append(float(np.sum(ps.run(participant_pulls, range(n), table="reads", seconds=budget))))
        client.run(_read_replicas, True)
        r = {k: float(np.median(v)) for k, v in r.items()}
        ps.drop_table("reads")
        rows.append((f"participant pull {size // 1024} KiB", r[False], r[True]))
    return rows


def kill_worker(client, addr):
    os.kill(client.run(os.getpid, workers=[addr])[addr], signal.SIGKILL)


def recovery(ps, client):
    ps.create_table("rec", shape=(10_000, 8), replication=2, block_rows=500)
    # The participant runs on a worker that is not the victim, recording its
    # flush times locally; we read them from its return value instead.
    def timed(ctx, _, seconds):
        out = []
        t_end = time.time() + seconds
        rng = np.random.default_rng(0)
        while time.time() < t_end:
            ctx.push_rows("rec", rng.integers(0, 10_000, 32), np.ones((32, 8)))
            ctx.flush()
            out.append(time.time())
        return out

    victim = ps.placement("rec")[0].worker
    others = [w for w in ps.servers if w != victim]
    result = {}

    def go():
        futs = client.scatter([0], workers=[others[0]])
        result["stamps"] = ps.run(timed, futs, seconds=4.0)[0]

    th = threading.Thread(target=go)
    th.start()
    time.sleep(1.5)
    t_kill = time.time()
    kill_worker(client, victim)
    th.join()
    ps.wait_for_placement()
    t_repaired = time.time()
    s = np.array(result["stamps"])
    gaps = np.diff(s)
    normal = float(np.median(gaps))
    around = s[(s > t_kill - 0.5)]
    stall = float(np.max(np.diff(around))) if around.size > 1 else float("nan")
    ps.drop_table("rec")
    return {"median flush interval (s)": normal, "longest stall after the kill (s)": stall,
            "time until 2 copies again (s)": t_repaired - t_kill, "flushes": len(s)}


def hung_worker(ps, client, stop_seconds, hung):
    """A participant flushes pushes (on a worker that is not the victim); the
    primary of block 0 is stopped with SIGSTOP for ``stop_seconds``, then
    continued. ``hung``: the ``ps.timeouts.hung`` setting (0: no fencing)."""
    import dask

    ps.create_table("hang", shape=(10_000, 8), replication=2, block_rows=500)

    def timed(ctx, _, seconds):
        out = []
        t_end = time.time() + seconds
        rng = np.random.default_rng(0)
        while time.time() < t_end:
            ctx.push_rows("hang", rng.choice(10_000, 32, replace=False), np.ones((32, 8)))
            ctx.flush()
            out.append(time.time())
        return out

    victim = ps.placement("hang")[0].worker
    others = [w for w in ps.servers if w != victim]
    pid = client.run(os.getpid, workers=[victim])[victim]
    result = {}

    def go():
        futs = client.scatter([0], workers=[others[0]])
        result["stamps"] = ps.run(timed, futs, seconds=stop_seconds + 3.0)[0]

    with dask.config.set({"ps.timeouts.hung": hung}):  # read by the scheduler (this process)
        th = threading.Thread(target=go)
        th.start()
        time.sleep(1.5)
        t_stop = time.time()
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stop_seconds)
        os.kill(pid, signal.SIGCONT)
        th.join()
        deadline = time.time() + 60
        while victim not in ps.servers and time.time() < deadline:  # taken back after SIGCONT
            time.sleep(0.2)
        ps.wait_for_placement()
    s = np.array(result["stamps"])
    around = s[(s > t_stop - 0.5)]
    stall = float(np.max(np.diff(around))) if around.size > 1 else float("nan")
    exact = float(ps.pull("hang").sum()) == len(s) * 32 * 8
    ps.drop_table("hang")
    return {"stop (s)": stop_seconds, "longest stall after the stop (s)": stall,
            "flushes": len(s), "every push counted once": exact}


def soak(ps, client, n_pushes):
    ps.create_table("soak", shape=(1000,), replication=2, block_rows=100, consistency=dask_ps.ASP())

    def pusher(ctx, _, n):
        start = ctx.current_clock * 1000  # a retried participant resumes at its clock
        for i in range(start, n):
            ctx.push_rows("soak", [i % 1000], [1.0])
            if i % 100 == 99:
                ctx.flush()
            if i % 1000 == 999:
                ctx.clock()
        return ctx.current_clock

    peak = {}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                rss = client.run(lambda: __import__("psutil").Process().memory_info().rss)
                for w, v in rss.items():
                    peak[w] = max(peak.get(w, 0), v)
            except Exception:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", ps.run(pusher, range(8), n=n_pushes)))
    t0 = time.time()
    th.start()
    time.sleep(max(1.0, 0.4 * n_pushes / 10_000 * 5))
    victim = ps.placement("soak")[0].worker
    kill_worker(client, victim)
    th.join()
    seconds = time.time() - t0
    stop.set()
    sampler.join()
    ps.wait_for_placement()
    total = float(ps.pull("soak").sum())
    expected = 8 * n_pushes
    return {"pushes": expected, "applied": total, "lost": expected - total, "seconds": seconds,
            "peak worker RSS (MiB)": max(peak.values()) / 2**20 if peak else float("nan")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.5)
    ap.add_argument("--pushes", type=int, default=10_000)
    ap.add_argument("--only", choices=["reads", "stop"], help="run only part 4 (reads) or 5 (stop)")
    ap.add_argument("--stop", type=float, default=10.0, help="seconds a worker stays stopped (part 5)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("distributed", "dask_ps"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        if args.only == "stop":
            _print_hung(_hung_both(ps, client, args.stop))
            return
        logger.info("4. reads from replicas")
        reads = replica_reads(ps, client, args.budget)
        if args.only == "reads":
            _print_reads(reads)
            return
        logger.info("1. replication cost")
        cost = replication_cost(ps, args.budget)
        logger.info("2. recovery")
        rec = recovery(ps, client)
        client.wait_for_workers(3)
        ps._servers(n=3, timeout=60)
        ps.wait_for_placement()
        logger.info("3. soak")
        sk = soak(ps, client, args.pushes)
        client.wait_for_workers(3)
        ps._servers(n=3, timeout=60)
        ps.wait_for_placement()
        hung = _hung_both(ps, client, args.stop)
    print("\n1. push throughput, replication=2 vs 1 (ops/s)")
    print(f"{'operation':36s} {'repl=1':>10s} {'repl=2':>10s} {'ratio':>7s}")
    for name, r1, r2 in cost:
        print(f"{name:36s} {r1:10.1f} {r2:10.1f} {r2 / r1:7.2f}")
    print("\n2. recovery after kill -9 of a worker holding blocks (replication=2)")
    for k, v in rec.items():
        print(f"{k:36s} {v:10.3f}")
    print("\n3. soak: 8 participants x pushes, one kill -9 mid-way (replication=2)")
    for k, v in sk.items():
        print(f"{k:36s} {v:10.1f}")
    _print_reads(reads)
    _print_hung(hung)


def _hung_both(ps, client, stop_seconds):
    logger.info("5. a hung worker (SIGSTOP), with and without fencing")
    return {"fenced (ps.timeouts.hung: 3s)": hung_worker(ps, client, stop_seconds, "3s"),
            "not fenced (ps.timeouts.hung: 0)": hung_worker(ps, client, stop_seconds, 0)}


def _print_hung(results):
    print("\n5. SIGSTOP of a worker holding blocks (replication=2), SIGCONT after the stop")
    for mode, r in results.items():
        print(mode)
        for k, v in r.items():
            print(f"  {k:34s} {v!s:>10s}" if isinstance(v, bool) else f"  {k:34s} {v:10.3f}")


def _print_reads(reads):
    print("\n4. pull throughput, replication=2, all participants together (pulls/s)")
    print(f"{'operation':36s} {'primary':>10s} {'replicas':>10s} {'ratio':>7s}")
    for name, r1, r2 in reads:
        print(f"{name:36s} {r1:10.1f} {r2:10.1f} {r2 / r1:7.2f}")


if __name__ == "__main__":
    main()
