"""LDA's vocabulary slices (``vocabulary_slices=S``, ``_sliced``): a
participant holds the word-topic rows of one slice of its vocabulary at a
time, as LightLDA's model slices.

What matters, and what these tests check: the sliced sweep is still a
collapsed Gibbs sampler (on a tiny corpus its chain visits the states with
the exact posterior's frequencies), the count tables stay the sums of the
assignments, a fit is as good as one with S=1 over seeds (and as the
``lda`` package's), BSP fits stay reproducible, and a participant holds
about 1/S of its rows (``metrics_``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import gammaln

pytest.importorskip("numba")

import dask_ps  # noqa: E402
from dask_ps.decomposition import LatentDirichletAllocation, document_completion  # noqa: E402
from dask_ps.decomposition import _gibbs, _sliced  # noqa: E402
from tests.decomposition.test_lda_dropin import lda_corpus  # noqa: E402


# --- the slices of a partition (no cluster) -------------------------------------------------


def test_cut_gives_every_token_to_the_slice_of_its_word_in_document_order():
    rng = np.random.default_rng(0)
    doc_len = rng.integers(0, 12, size=30)
    doc_ptr = np.concatenate([[0], np.cumsum(doc_len)]).astype(np.int64)
    # grouped by word within a document, as the partitions are
    words = np.concatenate([np.sort(rng.integers(0, 23, size=n)) for n in doc_len]).astype(np.int32)
    sl = _sliced.cut(words, doc_ptr, 23, 4)
    assert sl.count == 4 and sl.bounds[0] == 0 and sl.bounds[-1] == 23
    assert np.ptp(np.diff(sl.bounds)) <= 1  # equal rows: the memory bound
    np.testing.assert_array_equal(np.sort(np.concatenate(sl.tokens)), np.arange(words.size))
    doc_of = np.repeat(np.arange(30), doc_len)
    for j in range(4):
        tok = sl.tokens[j]
        assert np.all(np.diff(tok) > 0)  # document order
        np.testing.assert_array_equal(sl.words[j] + sl.bounds[j], words[tok])
        assert np.all((sl.words[j] >= 0) & (sl.words[j] < sl.bounds[j + 1] - sl.bounds[j]))
        np.testing.assert_array_equal(np.diff(sl.doc_ptr[j]), np.bincount(doc_of[tok], minlength=30))
    # more slices than rows: one row each
    assert _sliced.cut(words, doc_ptr, 3, 10).count == 3


# --- the sliced chain against a table in this process (no cluster) --------------------------


class _Handle:
    def __init__(self, ctx, name, rows):
        self.ctx, self.name, self.rows = ctx, name, rows

    def result(self):
        return self.ctx.pull_rows(self.name, self.rows)


class _LocalCtx:
    """The session calls a lone participant makes, on tables in this
    process: every read sees every push so far (what a lone participant's
    reads see on the servers)."""

    rank, n_participants = 0, 1

    def __init__(self, V, K):
        self.tables = {"nwk": np.zeros((V, K), dtype=np.int32), "nk": np.zeros(K, dtype=np.int64)}
        self.current_clock = 0
        self.uncached = 0
        self.max_rows_read_at_once = 0

    def pull(self, name):
        return self.tables[name].copy()

    def pull_rows(self, name, rows):
        return self.tables[name][rows].copy()

    def prefetch_rows(self, name, rows):
        return _Handle(self, name, rows)

    def push(self, name, values, copy=True):
        self.tables[name] += values

    def push_rows(self, name, rows, values, copy=True):
        np.add.at(self.tables[name], rows, values)

    def flush(self, wait=True):
        return None

    def clock(self):
        self.current_clock += 1

    def uncache(self, name):
        self.uncached += 1

    def held_bytes(self, name):
        return 0

    def metrics(self):
        return {}


def _config(K, V, n_iter, S, sampler="dense", alpha=0.5, beta=0.5, seed=0):
    return _gibbs.GibbsConfig(
        nwk_name="nwk", nk_name="nk", progress_name=None, n_components=K, alpha=alpha, beta=beta, n_features=V,
        start=0, stop=n_iter, z_in=None, z_out=None, evaluate_every=0, seeds=[seed], holders=np.ones(V),
        sampler=sampler, device="cpu", t_start=0.0, delay=None, lone_local=False, vocabulary_slices=S)


def _joint(z, doc_ptr, words, K, V, alpha, beta):
    """log p(w, z) of the collapsed model (Griffiths & Steyvers)."""
    ndk = np.zeros((doc_ptr.size - 1, K))
    nwk = np.zeros((V, K))
    for d in range(doc_ptr.size - 1):
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            ndk[d, z[i]] += 1
            nwk[words[i], z[i]] += 1
    doc = (gammaln(K * alpha) - gammaln(ndk.sum(1) + K * alpha) + (gammaln(ndk + alpha) - gammaln(alpha)).sum(1)).sum()
    word = (K * gammaln(V * beta) - gammaln(nwk.sum(0) + V * beta).sum()
            + (gammaln(nwk + beta) - gammaln(beta)).sum())
    return doc + word


@pytest.mark.parametrize("sampler", ["dense", "sparse"])
def test_the_sliced_chain_samples_the_collapsed_posterior(sampler, monkeypatch):
    """Two documents, three words in three slices, K=2: the chain's
    frequency of each of the 2^5 assignments matches the exact posterior
    ``p(z | w)`` (enumerated). A sweep that read a word's row before the
    slice before was pushed, or used stale document counts or totals,
    samples another distribution."""
    K, V, S, alpha, beta, n_iter = 2, 3, 3, 0.5, 0.3, 30000
    doc_ptr = np.array([0, 3, 5], dtype=np.int64)
    words = np.array([0, 1, 2, 0, 2], dtype=np.int32)
    part = {"vocab": np.arange(V, dtype=np.int64), "words": words, "doc_ptr": doc_ptr}
    states = list(itertools.product(range(K), repeat=words.size))
    logp = np.array([_joint(np.array(z), doc_ptr, words, K, V, alpha, beta) for z in states])
    exact = np.exp(logp - logp.max())
    exact /= exact.sum()

    seen = []
    real_iteration = _sliced.sliced_iteration

    def recording_iteration(ctx, s, sl, cfg, it):
        real_iteration(ctx, s, sl, cfg, it)
        seen.append(int(np.ravel_multi_index(tuple(s.z), (K,) * words.size)))
        # the tables are the sums of the assignments after every iteration
        nwk = np.zeros((V, K), dtype=np.int64)
        np.add.at(nwk, (words, s.z), 1)
        np.testing.assert_array_equal(ctx.tables["nwk"], nwk)
        np.testing.assert_array_equal(ctx.tables["nk"], nwk.sum(0))

    monkeypatch.setattr(_sliced, "sliced_iteration", recording_iteration)
    ctx = _LocalCtx(V, K)
    out = _gibbs._gibbs_participant(ctx, part, _config(K, V, n_iter, S, sampler, alpha, beta))
    freq = np.bincount(seen, minlength=len(states)) / len(seen)
    tv = 0.5 * np.abs(freq - exact).sum()
    assert tv < 0.02, (tv, np.round(freq, 3), np.round(exact, 3))
    assert ctx.uncached == S * n_iter  # every slice's cached rows dropped
    assert out["peak_rows"] == 1  # one row per slice, one slice at a time


# --- fits on a cluster -------------------------------------------------------------------------


def _fit(client, X, S, seed, **kw):
    params = dict(n_components=5, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=40, n_partitions=2,
                  evaluate_every=10, client=client, random_state=seed, vocabulary_slices=S)
    return LatentDirichletAllocation(**{**params, **kw}).fit(X)


def test_slices_fit_as_well_as_one_slice_over_seeds_and_hold_fewer_rows(lda_client):
    """Held-out log-likelihood (document completion) and the final training
    log-likelihood of S=4 within the spread of S=1 over three seeds (an
    unseeded fit's default consistency, SSP(2) with refresh; two
    participants); each participant holds one slice's rows at a time, about
    1/S of S=1's, and its session keeps no copy of them."""
    X, _ = lda_corpus(n_docs=500)
    train, test = X[:400], X[400:]
    by_S = {}
    for S in (1, 4):
        fits = [_fit(lda_client, train, S, seed, consistency=dask_ps.SSP(2, refresh=True)) for seed in range(3)]
        heldout = [document_completion(f.components_, test, 0.3) for f in fits]
        by_S[S] = dict(fits=fits, heldout=np.array([ll / n for ll, n in heldout]),
                       loglik=np.array([f.loglik_history_[-1][2] for f in fits]))
    one, four = by_S[1], by_S[4]
    for key in ("heldout", "loglik"):
        spread = max(np.ptp(one[key]), np.ptp(four[key]), 0.005 * abs(one[key].mean()))
        assert abs(four[key].mean() - one[key].mean()) <= spread, (key, one[key], four[key])
    for f1, f4 in zip(one["fits"], four["fits"]):
        for m1, m4 in zip(f1.metrics_, f4.metrics_):
            rows = m1["peak_rows"]  # S=1: every row of its vocabulary
            assert m4["peak_rows"] <= -(-rows // 4) + 1, (rows, m4["peak_rows"])
            assert len(m4["sweeps"]) == f4.n_iter_ and sum(m4["sweeps"]) == pytest.approx(m4["sweep_seconds"])
            # SSP (per-push sums): no own pushes kept, no cached rows after a slice
            assert m4["peak_session_bytes"] == 0 < m1["peak_session_bytes"]


def test_bsp_fits_with_slices_are_reproducible_and_equal_chunked_ones(lda_client):
    """Under BSP the same random_state gives the same model with S=3, also
    in checkpointed chunks (the slices' streams come from the iteration's
    seed), and another S gives another chain."""
    X, _ = lda_corpus(n_docs=150, doc_len=50, n_words=120, seed=3)
    kw = dict(max_iter=12, evaluate_every=4, consistency=dask_ps.BSP(), n_partitions=3)
    a, b = (_fit(lda_client, X, 3, 0, **kw) for _ in range(2))
    np.testing.assert_array_equal(a.components_, b.components_)
    assert [(i, ll) for i, _, ll in a.loglik_history_] == [(i, ll) for i, _, ll in b.loglik_history_]
    chunked = _fit(lda_client, X, 3, 0, replication=2, checkpoint_every=5, **kw)
    np.testing.assert_array_equal(chunked.components_, a.components_)
    assert chunked.loglik_history_[-1][2] == pytest.approx(a.loglik_history_[-1][2], rel=1e-12)
    # under BSP the participants' evaluations, summed slice by slice, are
    # exact: the one after 4 sweeps is the final one of a 4-sweep fit
    short = _fit(lda_client, X, 3, 0, **{**kw, "max_iter": 4})
    assert dict((i, ll) for i, _, ll in a.loglik_history_)[4] == pytest.approx(short.loglik_history_[-1][2], rel=1e-9)
    assert not np.array_equal(_fit(lda_client, X, 2, 0, **kw).components_, a.components_)


def test_heldout_loglik_with_slices_close_to_lda_package(lda_client):
    """Reuters (ships with ``lda``), K=10, 60 iterations, default SSP(2), S=4."""
    lda = pytest.importorskip("lda")
    import lda.datasets

    X = sp.csr_matrix(lda.datasets.load_reuters())
    idx = np.random.default_rng(0).permutation(X.shape[0])
    n_test = X.shape[0] // 10
    train, test = X[idx[n_test:]], X[idx[:n_test]]
    ref = lda.LDA(n_topics=10, n_iter=60, alpha=0.1, eta=0.01, random_state=0, refresh=10**6).fit(train)
    ll_ref, n = document_completion(ref.topic_word_, test, 0.1)
    ours = LatentDirichletAllocation(10, doc_topic_prior=0.1, topic_word_prior=0.01, max_iter=60, client=lda_client,
                                     random_state=0, vocabulary_slices=4).fit(train)
    ll, _ = document_completion(ours.components_, test, 0.1)
    assert abs(ll - ll_ref) / abs(ll_ref) < 0.02, (ll / n, ll_ref / n)
    assert abs(ours.loglik_history_[-1][2] - ref.loglikelihood()) / abs(ref.loglikelihood()) < 0.02


def test_verbose_lines_of_a_sliced_fit(lda_client, capsys):
    """The verbose perplexity, summed slice by slice, falls along the fit
    and stays below ``bound_`` (scikit-learn's, the last line), as S=1's
    (test_lda_dropin.py)."""
    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=50, n_topics=3, seed=2)
    est = _fit(lda_client, X, 3, 0, n_components=3, max_iter=9, evaluate_every=3, verbose=True,
               consistency=dask_ps.BSP())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"iteration: {n} of max_iter: 9" for n in range(1, 10)]
    perplexities = [float(line.split("perplexity: ")[1].split()[0]) for line in lines if "perplexity" in line]
    assert len(perplexities) == 3 and perplexities[-1] == pytest.approx(est.bound_, abs=1e-4)
    assert perplexities[0] >= perplexities[1] and perplexities[1] < est.bound_, (perplexities, est.bound_)


@pytest.mark.parametrize("params, match", [
    ({"vocabulary_slices": 0}, "vocabulary_slices"),
    ({"vocabulary_slices": 2.5}, "vocabulary_slices"),
    ({"vocabulary_slices": "4"}, "vocabulary_slices"),
    ({"vocabulary_slices": 2, "sampler": "array"}, "CPU sampler"),
])
def test_vocabulary_slices_validation(params, match):
    with pytest.raises(ValueError, match=match):
        LatentDirichletAllocation(2, **params).fit(lda_corpus(n_docs=10, doc_len=10, n_words=20, n_topics=2)[0])
