"""GPU push/pull throughput (issue 7): cuda tables vs numpy tables between two
workers sharing one GPU (dask-cuda), with the measured ceilings next to them.

    python benchmarks/bench_gpu.py [--mib 64 256] [--budget 2]

Prints GB/s of client push and pull for each size; needs cupy and dask-cuda.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def rate(fn, budget):
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < budget or n < 3:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--budget", type=float, default=2.0)
    args = ap.parse_args()
    import cupy
    import dask_cuda
    from distributed import Client

    import dask_ps

    with dask_cuda.LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,0", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        ps = dask_ps.ParameterServer(client)
        print(f"{'MiB':>6s} {'table':>6s} {'push GB/s':>10s} {'pull GB/s':>10s}")
        for mib in args.mib:
            n = mib * 2**20 // 4
            for device, xp in (("cuda", cupy), ("cpu", np)):
                ps.create_table("b", shape=(n,), dtype="float32", device=device)
                x = xp.ones(n, dtype="float32")
                push = rate(lambda: ps.push("b", x), args.budget) * mib * 2**20 / 1e9
                pull = rate(lambda: ps.pull("b"), args.budget) * mib * 2**20 / 1e9
                print(f"{mib:6d} {device:>6s} {push:10.2f} {pull:10.2f}")
                ps.drop_table("b")
        print("ceilings (BASELINES.md, H200): on-device add 2500 GB/s; host->device 6.5 GB/s, "
              "device->host 2.6 GB/s; Dask TCP worker->worker of a cupy array ~1 GB/s")


if __name__ == "__main__":
    main()
