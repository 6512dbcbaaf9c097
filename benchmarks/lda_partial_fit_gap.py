"""How close ``partial_fit`` over batches gets to one ``fit`` of all of them,
dask_ps's against scikit-learn's (issue 35).

The training documents are cut into ``--batches`` batches. For each
library: a fit on the first batch only, ``partial_fit`` called once per
batch, and a ``fit`` of all the batches; each scored by the held-out
document-completion log-likelihood per token (``document_completion``,
the same split for every model). "closed" is the share of the gap between
the first batch's model and the full fit that the calls of ``partial_fit``
closed: ``(partial - first) / (full - first)``. dask_ps is run with its
rejuvenation (``ps.lda.partial-fit-kept-tokens``, default) and without it
(0: the earlier documents' topics stay as fitted, as on ``1322df5``).

    python benchmarks/lda_partial_fit_gap.py --corpus reuters --k 20 --iters 50 --seeds 0 1
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import dask
import numpy as np
from distributed import Client, LocalCluster
from sklearn.decomposition import LatentDirichletAllocation as SkLDA

sys.path.insert(0, os.path.dirname(__file__))
from bench_lda import load_news, load_reuters, split  # noqa: E402

from dask_ps.decomposition import LatentDirichletAllocation, document_completion  # noqa: E402

ALPHA, ETA = 0.1, 0.01


def heldout(components, test):
    ll, n = document_completion(components, test, ALPHA)
    return ll / n


def ours(client, batches, train, test, K, iters, seed, kept_tokens):
    def make():
        return LatentDirichletAllocation(K, doc_topic_prior=ALPHA, topic_word_prior=ETA, max_iter=iters,
                                         client=client, random_state=seed)

    with dask.config.set({"ps.lda.partial-fit-kept-tokens": kept_tokens}):
        first = make().fit(batches[0])
        m = make()
        for b in batches:
            m.partial_fit(b)
        full = make().fit(train)
    return heldout(first.components_, test), heldout(m.components_, test), heldout(full.components_, test)


def sklearn(batches, train, test, K, vb_iters, seed):
    kw = dict(doc_topic_prior=ALPHA, topic_word_prior=ETA, random_state=seed, total_samples=train.shape[0])
    first = SkLDA(K, max_iter=vb_iters, learning_method="batch", **kw).fit(batches[0])
    m = SkLDA(K, **kw)
    for b in batches:
        m.partial_fit(b)
    full = SkLDA(K, max_iter=vb_iters, learning_method="batch", **kw).fit(train)
    return heldout(first.components_, test), heldout(m.components_, test), heldout(full.components_, test)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=["news", "reuters"], default="reuters")
    ap.add_argument("--docs", type=int, default=None, help="training documents (default: all)")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--iters", type=int, default=50, help="Gibbs sweeps per fit / partial_fit call")
    ap.add_argument("--vb-iters", type=int, default=10, help="scikit-learn's batch passes (its default)")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    X = load_news() if args.corpus == "news" else load_reuters()
    train, test = split(X)
    if args.docs:
        train = train[:args.docs]
    batches = [train[i::args.batches] for i in range(args.batches)]  # interleaved: batches alike
    print(f"corpus {args.corpus}: {train.shape[0]} training documents, {int(train.sum())} tokens, "
          f"{args.batches} batches, K={args.k}, {args.iters} sweeps per call, held-out {test.shape[0]} documents; "
          f"load {os.getloadavg()[0]:.1f}\n")
    print("| model | seed | first batch | partial_fit | full fit | gap to full | closed |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for seed in args.seeds:
            rows = {
                "dask_ps, kept documents resampled": ours(client, batches, train, test, args.k, args.iters, seed,
                                                          200000),
                "dask_ps, none resampled (1322df5)": ours(client, batches, train, test, args.k, args.iters, seed, 0),
                "scikit-learn online partial_fit": sklearn(batches, train, test, args.k, args.vb_iters, seed),
            }
            for name, (first, partial, full) in rows.items():
                closed = (partial - first) / (full - first)
                print(f"| {name} | {seed} | {first:.4f} | {partial:.4f} | {full:.4f} | {full - partial:+.4f} "
                      f"| {100 * closed:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
