"""One setting of the quality sweep, over many seeds: is a bad fit the rule
or scikit-learn's own spread? (docs/benchmarks.md, "SGD under SSP:
catching up").

scikit-learn over ``--ref-seeds`` seeds; dask_ps over ``--seeds`` seeds
on a cluster of P workers of one thread (``--layout threads|processes``)
or simulated (``sim``), under each ``--consistencies`` (``ssp3:nocatch``:
with ``ps.sgd.catch-up`` false)::

    python benchmarks/sgd_spread.py "C dense early_stopping=True tol=1e-3" --participants 2 \\
        --consistencies bsp ssp3 ssp3:nocatch ssp1
"""

from __future__ import annotations

import argparse
import contextlib

import dask
import numpy as np
from distributed import Client, LocalCluster

import dask_ps  # noqa: F401  (the ps.* defaults, before dask.config.set)
import sgd_quality as q


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a setting of sgd_quality.quick_settings(), as printed")
    ap.add_argument("--participants", type=int, default=2)
    ap.add_argument("--rows-per-participant", type=int, default=10_000)
    ap.add_argument("--layout", choices=["sim", "threads", "processes"], default="threads")
    ap.add_argument("--consistencies", nargs="+", default=["bsp", "ssp1", "ssp3"])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--ref-seeds", type=int, default=30)
    args = ap.parse_args()
    st = next(s for s in q.quick_settings() if " ".join(s.name.split()) == " ".join(args.name.split()))
    P, n_rows = args.participants, args.participants * args.rows_per_participant
    ref = q.sklearn_reference(st, n_rows, range(args.ref_seeds))
    sk = np.array(ref["scores"])
    print(f"{st.name.strip()}, {n_rows} rows; scikit-learn {args.ref_seeds} seeds: worst {sk.min():.4f}, "
          f"5th percentile {np.percentile(sk, 5):.4f}, median {np.median(sk):.4f}", flush=True)
    with contextlib.ExitStack() as stack:
        client = None
        if args.layout != "sim":
            cluster = stack.enter_context(LocalCluster(n_workers=P, threads_per_worker=1, memory_limit=0,
                                                       processes=args.layout == "processes",
                                                       dashboard_address=None))
            client = stack.enter_context(Client(cluster, set_as_default=False))
        for spec in args.consistencies:
            cons, _, opt = spec.partition(":")
            with dask.config.set({"ps.sgd.catch-up": opt != "nocatch"}):
                fits = [q.dask_ps_fit(st, n_rows, s, P, cons, client=client, max_iter=q.epoch_cap(st, ref))
                        for s in range(args.seeds)]
            sc = np.array([f[0] for f in fits])
            print(f"{spec:14s} {args.seeds} seeds: worst {sc.min():.4f}, median {np.median(sc):.4f}, "
                  f"below scikit-learn's worst - {q.SLACK}: {int((sc < sk.min() - q.SLACK).sum())}", flush=True)


if __name__ == "__main__":
    main()
