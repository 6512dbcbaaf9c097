"""P participants of an LDA fit in one process, in lock-step, every read as
stale as the consistency model allows (an evaluation tool, and the
deterministic check of LDA under bounded staleness).

On a cluster what a read under ``SSP(s)`` holds of the clocks
``c - s .. c - 1`` depends on the timing, so a staleness fit is a different
chain every time (``tests/decomposition/test_lda.py`` runs one and can only
check what holds whatever the timing). Here the participants' own code
(``_gibbs._gibbs_participant``: the starting counts, the wait for everyone's,
``pull -> sweep -> push -> clock``) runs unchanged on ``sgd_sim.SimServer``,
whose reads at clock ``c`` hold exactly the pushes of the clocks ``< c - s``
plus the reader's own (the worst case the bound allows), so the same seeds
give the same chain. As on the cluster:

* the starting counts (clock 0) are in every read after the participants'
  one wait for them (``start_name``, a ``VAP`` table: its pushes reach the
  servers at once);
* the totals follow their own model (``ASP`` where the word rows are cached:
  fresh every clock here) or ride in the word-topic table's last row.

Returns the final log-likelihood ``log p(words, topics)`` as
``LatentDirichletAllocation.loglik_history_[-1]`` computes it
(``_scoring.final_loglik``)::

    from lda_sim import simulate_lda
    ll = simulate_lda(X, n_components=5, consistency=dask_ps.SSP(2), n_participants=4, seed=0)
"""

from __future__ import annotations

import numpy as np

import sgd_sim
from dask_ps.consistency import ASP, VAP, as_consistency
from dask_ps.decomposition import _corpus, _gibbs
from dask_ps.decomposition._runs import totals_in_word_table
from dask_ps.decomposition._scoring import final_loglik


class _LdaSimServer(sgd_sim.SimServer):
    """``SimServer`` plus the one-element ``VAP`` table the participants wait
    on for each other's starting counts: its pushes apply at once, and when
    the last participant counts itself in, the starting counts (clock 0) join
    every table, as the servers hold them when the wait ends."""

    def __init__(self, n_participants, start_name):
        super().__init__(n_participants)
        self.start_name = start_name

    def log(self, name, clock, rank, seq, rows, vals):
        if name != self.start_name:
            return super().log(name, clock, rank, seq, rows, vals)
        with self.lock:
            table = self.tables[name]
            table.apply(rows, vals)
            if table.values[0] >= self.n_participants:
                for t in self.tables.values():
                    t.commit_below(1)


def simulate_lda(X, n_components, consistency, n_participants, seed, *, max_iter=60, doc_topic_prior=0.3,
                 topic_word_prior=0.05) -> float:
    """The final log-likelihood of ``max_iter`` sweeps over the count matrix
    ``X`` (documents x words) cut into ``n_participants`` parts of about the
    same tokens (the estimator's in-memory split), every read as stale as
    ``consistency`` allows (module docstring)."""
    X = _corpus._as_count_csr(X)[0] if not hasattr(X, "indptr") else X.tocsr()
    V, K, P = X.shape[1], int(n_components), int(n_participants)
    pieces = _corpus._split_rows_at(X, P)
    if len(pieces) != P:
        raise ValueError(f"{X.shape[0]} documents do not make {P} parts")
    parts = [_corpus._prepare_rows(piece, V) for piece in pieces]
    holders = np.zeros(V, dtype=np.int64)
    for part in parts:
        holders[part["vocab"]] += 1
    word = as_consistency(consistency)
    # the estimator's tables (LatentDirichletAllocation._consistencies, totals_consistency unset): the
    # totals as the word rows' last row where those are read every clock, else their own ASP table
    totals_row = totals_in_word_table(word, None, 1)
    totals = word if word.staleness == 0 or totals_row else ASP()
    start_name = "started" if word.staleness else None
    server = _LdaSimServer(P, start_name)
    nwk_name, nk_name = "word-topic", None if totals_row else "topic-totals"
    server.create_table(nwk_name, shape=(V + 1 if totals_row else V, K), dtype="int32", consistency=word)
    if nk_name is not None:
        server.create_table(nk_name, shape=(K,), dtype="int64", consistency=totals)
    if start_name is not None:
        server.create_table(start_name, shape=(1,), dtype="float64", consistency=VAP(1.0))
    cfg = _gibbs.GibbsConfig(
        nwk_name=nwk_name, nk_name=nk_name, progress_name=None, n_components=K, alpha=float(doc_topic_prior),
        beta=float(topic_word_prior), n_features=V, start=0, stop=int(max_iter), z_in=None, z_out=None,
        evaluate_every=0, seeds=[int(s) for s in np.random.RandomState(seed).randint(0, 2**31 - 1, size=P)],
        holders=holders, sampler="dense", device="cpu", t_start=0.0, delay=None, start_name=start_name)
    results = server.run(_gibbs._gibbs_participant, parts, cfg=cfg)
    counts = server.pull(nwk_name)
    if totals_row:
        nwk, nk = counts[:-1], counts[-1].astype(np.int64)
    else:
        nwk, nk = counts, server.pull(nk_name)
    return final_loglik([r["doc_loglik"] for r in results], nwk, nk, cfg.beta)


def main():
    """The median gap to BSP's log-likelihood at the same seed, by sweeps and model (docs/benchmarks.md)."""
    import argparse
    import pathlib
    import sys

    import dask_ps

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
    import ps_fixtures

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--sweeps", type=int, nargs="+", default=[30, 60, 120, 240])
    ap.add_argument("--participants", type=int, default=4)
    ap.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    X = ps_fixtures.lda_corpus(400, 80, 200, 5, 0.3, 0.05, 0)[0]  # test_lda.py's corpus
    print(f"median (loglik - BSP's) / |BSP's| over {args.seeds} seeds, {args.participants} participants; "
          f"merged-topics fits (below BSP's median by 2%) counted")
    for sweeps in args.sweeps:
        bsp = np.array([simulate_lda(X, 5, dask_ps.BSP(), args.participants, s, max_iter=sweeps)
                        for s in range(args.seeds)])
        cells = [f"BSP stuck {int((bsp < 1.02 * np.median(bsp)).sum())}"]
        for s in args.staleness:
            ll = np.array([simulate_lda(X, 5, dask_ps.SSP(s), args.participants, seed, max_iter=sweeps)
                           for seed in range(args.seeds)])
            cells.append(f"SSP({s}) {100 * np.median((ll - bsp) / np.abs(bsp)):+.2f}% "
                         f"stuck {int((ll < 1.02 * np.median(bsp)).sum())}")
        print(f"{sweeps:4d} sweeps: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
