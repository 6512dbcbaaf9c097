"""A hashed SGD table larger than any one worker's memory, trained end to end.

Trains ``dask_ps.linear_model.SGDClassifier`` (log loss) on a synthetic
click log (``examples/ctr_logistic.py``'s impressions: 13 log counts and 26
Zipf-distributed categorical fields, hashed with their field into
``2**--log2-features`` columns, float32) on a ``LocalCluster`` of worker
processes each limited to ``--memory-limit`` (Dask's memory monitor on, at
its defaults: pause at 80%, restart at 95%), so that the weights table
(``2**28`` float32 = 1 GiB by default) is larger than any one worker's
memory limit and lives only spread over the workers.

Prints, per worker: its peak resident memory (``VmHWM`` of its
process), the bytes of the fit's tables it held (``metrics_``'s
``table_bytes`` and ``ParameterServer.memory()`` while the tables exist),
its memory limit; whether any worker was restarted (its process id changed)
or paused (worker and nanny logs); the fit's seconds; test ROC AUC and
accuracy; and the same fit in one scikit-learn process (``--sklearn``) for
reference.

    python benchmarks/bench_big_table.py                       # 2^28, 8 x 768 MiB, 400k rows
    python benchmarks/bench_big_table.py --rows 1000000 --epochs 2 --sklearn
    python benchmarks/bench_big_table.py --log2-features 24 --memory-limit 300MiB --workers 2 --rows 100000
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import warnings

import numpy as np


def click_log(n, d, ids=0, seed=0):
    """``(X, y)``: ``n`` impressions hashed into ``d`` columns, float32 CSR.

    ``examples/ctr_logistic.py``'s impressions (13 log counts, 26 Zipf
    categorical fields with vocabularies of 10 to 100,000) plus, with
    ``ids``, two identifier fields of a click log's long tail (a device id
    uniform over ``ids`` values, an ad id Zipf(1.1) over ``10 * ids``), each
    id with a click effect uniform in [-0.5, 0.5) for a tenth of them: the distinct
    values that make a hashed table of 2^28 columns worth having, and that
    write rows all over it (every page of every shard is touched)."""
    import scipy.sparse as sp

    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    if str(examples) not in sys.path:
        sys.path.insert(0, str(examples))
    from ctr_logistic import impressions

    X, y, p = impressions(n, seed=seed, n_columns=d)
    if ids:
        rng = np.random.default_rng(seed + 1)
        device = rng.integers(0, ids, n)
        ad = (rng.zipf(1.1, n) - 1) % (10 * ids)
        logit = np.log(p / (1 - p))
        for f, v in enumerate((device, ad)):
            u = (v.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1000 + f)) >> np.uint64(7)
            effect = np.where(u % np.uint64(10) == 0, ((u >> np.uint64(8)) % np.uint64(1000)) / 1000.0 - 0.5, 0.0)
            logit = logit + effect
            cols = 13 + (u % np.uint64(d - 13)).astype(np.int64)
            X = X + sp.csr_matrix((np.ones(n), (np.arange(n), cols)), shape=(n, d))
        p = 1.0 / (1.0 + np.exp(-logit))
        y = (np.random.default_rng(seed + 2).random(n) < p).astype(np.int64)
    X = X.astype(np.float32)
    X.sort_indices()
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)
    return X, y


def _worker_peak():
    """This worker process's pid and peak resident bytes (``VmHWM``: of its
    own address space; ``ru_maxrss`` would carry the peak of the process
    that forked it, across the ``exec``)."""
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    return os.getpid(), hwm * 1024


def memory_events(client) -> dict:
    """Per worker (and nanny): log lines of Dask's memory monitor that
    pause or restart a worker. (Its 'Unmanaged memory use is high' warning
    is expected: shards are memory that Dask does not manage.)"""
    out = {}
    for nanny in (False, True):
        logs = client.get_worker_logs(nanny=nanny)
        for w, lines in logs.items():
            hits = [msg for _, msg in lines if any(s in msg for s in ("Pausing worker", "memory budget", "Restarting"))]
            if hits:
                out.setdefault(w, []).extend(hits)
    return out


def spread(client, X, y):
    """X and y as dask arrays, one block in memory on each worker."""
    import dask.array as da

    workers = sorted(client.scheduler_info()["workers"])
    rows = int(np.ceil(X.shape[0] / len(workers)))
    xs, ys = [], []
    for i, w in enumerate(workers):
        a, b = i * rows, min((i + 1) * rows, X.shape[0])
        fx = client.scatter(X[a:b], workers=[w], hash=False)
        fy = client.scatter(y[a:b], workers=[w], hash=False)
        xs.append(da.from_delayed(fx, shape=(b - a, X.shape[1]), dtype=X.dtype, meta=X[:0]))
        ys.append(da.from_delayed(fy, shape=(b - a,), dtype=y.dtype, meta=y[:0]))
    return da.concatenate(xs), da.concatenate(ys)


def mib(n) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2-features", type=int, default=28)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--memory-limit", default="768MiB")
    p.add_argument("--rows", type=int, default=400_000, help="training impressions (a fifth more for the test)")
    p.add_argument("--ids", type=int, default=2_000_000,
                   help="values of the device-id field (the ad id has ten times as many); 0: none")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--alpha", type=float, default=1e-6)
    p.add_argument("--sklearn", action="store_true", help="also fit scikit-learn's SGDClassifier (in this process)")
    p.add_argument("--no-spill", action="store_true",
                   help="turn Dask's spilling off (distributed.worker.memory.target/spill: false; pause and "
                        "terminate stay at 80% and 95%)")
    p.add_argument("--partial-fit", action="store_true",
                   help="then one partial_fit from the fitted model (its whole table sent to the workers first)")
    args = p.parse_args(argv)

    from dask.utils import parse_bytes
    from distributed import Client, LocalCluster
    from sklearn.metrics import roc_auc_score

    import dask_ps
    from dask_ps.linear_model import SGDClassifier

    d = 2 ** args.log2_features
    limit = parse_bytes(args.memory_limit)
    n_test = args.rows // 5
    t = time.perf_counter()
    X, y = click_log(args.rows + n_test, d, ids=args.ids)
    Xtr, ytr, Xte, yte = X[:args.rows], y[:args.rows], X[args.rows:], y[args.rows:]
    print(f"data: {args.rows:,} + {n_test:,} impressions x 2^{args.log2_features} hashed columns, "
          f"{X.nnz / X.shape[0]:.1f} non-zeros a row, {len(np.unique(Xtr.indices)):,} distinct features "
          f"({time.perf_counter() - t:.1f} s to make)")
    table = (d + 1) * 4
    pages = table / 4096
    touched = 1.0 - np.exp(-len(np.unique(Xtr.indices)) / pages)  # rows fall on 4 KiB pages at random
    print(f"pages of the table the fit writes: about {touched:.0%}")
    print(f"table: {mib(table)} float32; {args.workers} workers limited to {mib(limit)} each "
          f"(sum {mib(args.workers * limit)}); uptime: {os.popen('uptime').read().strip()}")
    kw = dict(loss="log_loss", alpha=args.alpha, max_iter=args.epochs, tol=None, random_state=0)

    if args.no_spill:  # read by the workers when they start
        import dask

        dask.config.set({"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, memory_limit=limit,
                               dashboard_address=":0")
    with cluster, Client(cluster) as client:
        pids0 = client.run(lambda: os.getpid())
        dX, dy = spread(client, Xtr, ytr)
        dX, dy = client.persist([dX, dy])
        model = SGDClassifier(client=client, **kw)
        t = time.perf_counter()
        model.fit(dX, dy)
        seconds = time.perf_counter() - t
        if args.partial_fit:
            t = time.perf_counter()
            model.partial_fit(dX, dy)
            print(f"partial_fit from the fitted model: {time.perf_counter() - t:.1f} s")
        peaks = client.run(_worker_peak)
        pids1 = client.run(lambda: os.getpid())
        events = memory_events(client)
        restarted = sorted(set(pids0.items()) ^ set(pids1.items()))
        info = client.scheduler_info(n_workers=-1)["workers"]
        status = {w: s["status"] if "status" in s else "?" for w, s in info.items()}
        spilled = sum(int((s.get("metrics", {}).get("spilled_bytes") or {}).get("disk", 0)) for s in info.values())
        auc = roc_auc_score(yte, model.predict_proba(Xte)[:, 1])
        acc = model.score(Xte, yte)
        print(f"\ndask_ps: fit {seconds:.1f} s, test AUC {auc:.4f}, accuracy {acc:.4f}, epochs {model.n_iter_}")
        held = {}
        for m in model.metrics_:
            held[m.get("worker")] = m
        print(f"{'worker':<24} {'peak RSS':>10} {'table bytes':>12} {'limit':>10}  {'peak/limit':>10}")
        for w in sorted(peaks):
            pid, peak = peaks[w]
            tb = held.get(w, {}).get("table_bytes")
            print(f"{w:<24} {mib(peak):>10} {mib(tb) if tb is not None else '-':>12} {mib(limit):>10}  "
                  f"{peak / limit:>10.2f}")
        total_table = sum(m.get("table_bytes", 0) for m in model.metrics_)
        print(f"tables' bytes over the workers: {mib(total_table)} (the weights table: {mib(table)}); "
              f"spilled to disk by Dask now: {mib(spilled)}")
        print(f"workers restarted: {len(restarted) // 2}; statuses now: {sorted(set(status.values()))}; "
              f"pauses and restarts logged by Dask's memory monitor: {sum(len(v) for v in events.values())}")
        for w, lines in events.items():
            for line in lines[:5]:
                print(f"  {w}: {line}")
        sys.path.insert(0, str(pathlib.Path(__file__).parent))
        from bench_sgd import print_breakdown  # the client's phases, each participant's

        print_breakdown(model, seconds)
        print(f"coef_ on the client: {mib(model.coef_.nbytes)} ({model.coef_.dtype})")
        dask_ps.close_parameter_server(client) if hasattr(dask_ps, "close_parameter_server") else None

    if args.sklearn:
        from sklearn.linear_model import SGDClassifier as SkSGD

        t = time.perf_counter()
        sk = SkSGD(**kw).fit(Xtr, ytr)
        sk_seconds = time.perf_counter() - t
        sk_auc = roc_auc_score(yte, sk.predict_proba(Xte)[:, 1])
        print(f"scikit-learn (one process, float64 coef_ of {mib(sk.coef_.nbytes)}): fit {sk_seconds:.1f} s, "
              f"test AUC {sk_auc:.4f}, accuracy {sk.score(Xte, yte):.4f}")


if __name__ == "__main__":
    main()
