"""Topics of Reuters news stories: LDA by collapsed Gibbs sampling on the
parameter server, against scikit-learn's LatentDirichletAllocation.

The corpus ships inside the ``lda`` package (``pip install lda``, also in
dask_ps's ``test`` extra): 395 Reuters stories from 1996 as document-term
counts over 4,258 words. A tenth of the stories (seeded) is held out.

It fits ``dask_ps.decomposition.LatentDirichletAllocation`` (client=None:
the embedded in-process cluster, one worker per core; ``--processes`` for a
``LocalCluster`` of worker processes) and scikit-learn's variational LDA
with the same priors on the training stories, prints the top words of
every topic, and compares the two on the held-out stories by document
completion (each story's words split in two halves at random, the same
split for both models: the topic proportions are fitted on one half, the
other half is scored), with the fit times and ``score``/``perplexity``
(scikit-learn's definition for both models) on the training stories.

Run: ``python examples/topics.py`` (under a minute on two cores);
``--topics 10 --iterations 200`` for a quicker run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import LatentDirichletAllocation as SkLatentDirichletAllocation

from dask_ps.decomposition import LatentDirichletAllocation, document_completion


def reuters(seed=0, test_fraction=0.1):
    """``(train, test, vocabulary)``: the ``lda`` package's Reuters counts
    (CSR), split by story."""
    try:
        import lda.datasets
    except ImportError as e:  # pragma: no cover - the example needs the corpus
        raise SystemExit("this example reads the corpus of the 'lda' package: pip install lda") from e
    X = sp.csr_matrix(lda.datasets.load_reuters())
    vocabulary = np.asarray(lda.datasets.load_reuters_vocab())
    order = np.random.default_rng(seed).permutation(X.shape[0])
    n_test = int(round(X.shape[0] * test_fraction))
    return X[order[n_test:]], X[order[:n_test]], vocabulary


def heldout(components, test, alpha):
    """Per-token log-likelihood of the held-out halves, and their perplexity."""
    ll, n = document_completion(components, test, alpha, random_state=0)
    return ll / n, float(np.exp(-ll / n))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=400, help="Gibbs sweeps (dask_ps)")
    parser.add_argument("--sklearn-iterations", type=int, default=50, help="variational EM passes (scikit-learn)")
    parser.add_argument("--words", type=int, default=8, help="top words shown per topic")
    parser.add_argument("--processes", action="store_true", help="a LocalCluster of 2 worker processes")
    args = parser.parse_args()
    alpha, beta = 0.1, 0.01  # sparse topics and documents, as usual for news

    train, test, vocabulary = reuters()
    print(f"Reuters (from the 'lda' package): {train.shape[0]} training and {test.shape[0]} held-out stories, "
          f"{train.shape[1]} words, {int(train.sum()):,} training tokens")

    client = cluster = None
    if args.processes:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
        client = Client(cluster, set_as_default=False)
    print(f"\nFitting {args.topics} topics by {args.iterations} Gibbs sweeps (verbose=1: a line a sweep, as "
          "scikit-learn's; the evaluated ones with the perplexity)", flush=True)
    try:
        t0 = time.perf_counter()
        ours = LatentDirichletAllocation(
            args.topics, doc_topic_prior=alpha, topic_word_prior=beta, max_iter=args.iterations,
            evaluate_every=max(args.iterations // 4, 1), client=client, random_state=0, verbose=1,
        ).fit(train)
        ours_seconds = time.perf_counter() - t0  # with the cluster's start on the first fit
    finally:
        if client is not None:
            client.close()
            cluster.close()

    t0 = time.perf_counter()
    sk = SkLatentDirichletAllocation(
        args.topics, doc_topic_prior=alpha, topic_word_prior=beta, learning_method="batch",
        max_iter=args.sklearn_iterations, random_state=0,
    ).fit(train)
    sk_seconds = time.perf_counter() - t0

    print(f"\nTopics of dask_ps's LatentDirichletAllocation ({args.words} most probable words each):")
    for k, words in enumerate(ours.top_words(vocabulary, n=args.words)):
        print(f"  {k:2d}  " + " ".join(w for w, _ in words))

    ll_ours, perp_ours = heldout(ours.components_, test, alpha)
    ll_sk, perp_sk = heldout(sk.components_, test, alpha)
    print("\nHeld-out stories, document completion (higher log-likelihood / lower perplexity is better):")
    print(f"  dask_ps       {ll_ours:8.4f} nats/token  perplexity {perp_ours:7.1f}   fit {ours_seconds:5.1f} s "
          f"({args.iterations} Gibbs sweeps, {len(ours.metrics_)} "
          f"participant{'s' if len(ours.metrics_) != 1 else ''})")
    print(f"  scikit-learn  {ll_sk:8.4f} nats/token  perplexity {perp_sk:7.1f}   fit {sk_seconds:5.1f} s "
          f"({args.sklearn_iterations} variational EM passes)")
    print("\nTraining stories, score() and perplexity(): scikit-learn's variational bound, the same on the same "
          "topics")
    print(f"  dask_ps       score {ours.score(train):12,.0f}  perplexity {ours.perplexity(train):7.1f}")
    print(f"  scikit-learn  score {sk.score(train):12,.0f}  perplexity {sk.perplexity(train):7.1f}")

if __name__ == "__main__":
    main()
