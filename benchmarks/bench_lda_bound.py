"""CPU seconds of ``bound_``'s scoring pass on one partition: scikit-learn's
variational bound (``_bound.part_document_terms``, since issue 35) against
another checkout's plug-in pass (``_scoring.part_doc_loglik`` of
``1322df5``), the same partition and counts, interleaved, process CPU time
(robust to a loaded machine).

    python benchmarks/bench_lda_bound.py --against /path/to/a/1322df5/checkout
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_lda import load_news, split  # noqa: E402

from dask_ps.decomposition import _bound  # noqa: E402
from dask_ps.decomposition._corpus import _prepare_part, _split_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="a checkout whose _scoring.py has part_doc_loglik")
    ap.add_argument("--k", type=int, nargs="+", default=[50, 1000])
    ap.add_argument("--docs", type=int, default=1500)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location(
        "old_scoring", os.path.join(args.against, "dask_ps", "decomposition", "_scoring.py"))
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    train, _ = split(load_news())
    train = train[:args.docs]
    part = _prepare_part(_split_rows(train, 2)[0], train.shape[1], False)
    rng = np.random.default_rng(0)
    words = np.repeat(train.indices, train.data)
    beta, alpha = 0.01, 0.1
    for K in args.k:
        nwk = np.zeros((train.shape[1], K), np.int32)  # every token in a random topic
        np.add.at(nwk, (words, rng.integers(0, K, words.size)), 1)
        scale = 1.0 / (nwk.sum(axis=0, dtype=np.int64) + nwk.shape[0] * beta)
        runs = {"plug-in (old)": lambda: old.part_doc_loglik(part, nwk, scale, beta, alpha, 100, 1e-3),
                "bound's document terms": lambda: _bound.part_document_terms(part, nwk, beta, alpha, 100, 1e-3),
                "bound's topic term (client)": lambda: _bound.count_topic_term(nwk, beta)}
        best = {name: np.inf for name in runs}
        for _ in range(4):  # the first round compiles
            for name, fn in runs.items():
                t = time.process_time()
                fn()
                best[name] = min(best[name], time.process_time() - t)
        ratio = best["bound's document terms"] / best["plug-in (old)"]
        print(f"K={K}: {part['words'].size} tokens, " + ", ".join(f"{n} {v:.3f} CPU-s" for n, v in best.items())
              + f"; document terms / plug-in {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
