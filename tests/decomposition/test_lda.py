"""LatentDirichletAllocation (collapsed Gibbs sampling on the parameter server).

Default tests run in well under two minutes on two cores; ``-m slow`` adds the
larger comparisons with the ``lda`` package.
"""

from __future__ import annotations

import ast
import logging
import math
import pathlib
import pickle
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

pytest.importorskip("numba")

import ps_fixtures  # noqa: E402
import dask_ps  # noqa: E402
from dask_ps.decomposition import LatentDirichletAllocation, document_completion  # noqa: E402
from dask_ps.decomposition import _lda_kernels as kernels  # noqa: E402

PKG = pathlib.Path(dask_ps.__file__).parent / "decomposition"


# --- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def lda_client():
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            yield client


def lda_corpus(n_docs=400, doc_len=80, n_words=200, n_topics=5, alpha=0.1, eta=0.05, seed=0):
    """Documents drawn from the LDA generative process (sparser topic mixes
    than the other LDA tests'); returns (X, true topics)."""
    return ps_fixtures.lda_corpus(n_docs, doc_len, n_words, n_topics, alpha, eta, seed)


def matched_cosine(components, topics):
    a = components / np.linalg.norm(components, axis=1, keepdims=True)
    b = topics / np.linalg.norm(topics, axis=1, keepdims=True)
    cos = a @ b.T
    r, c = linear_sum_assignment(-cos)
    return float(cos[r, c].mean())


@pytest.fixture(scope="module")
def corpus():
    # alpha = 0.3: with 0.1 even a sequential Gibbs chain gets stuck for
    # 60+ sweeps in a merged-topics mode on about one seed in three, which
    # would make every comparison here a coin flip. With 0.3, 80 sweeps: a
    # 3-participant chain (not deterministic then: what a BSP read saw of the
    # current clock's pushes depended on timing, until issue 13) ended stuck (cosine 0.84) in
    # one of six full test runs on a doubly loaded machine at 60 sweeps, and
    # in none of 54 fits of this fixture alone (60 or 100 sweeps, half of
    # them with two busy loops on the 2 cores).
    return lda_corpus(alpha=0.3)


@pytest.fixture(scope="module")
def fitted(lda_client, corpus):
    X, _ = corpus
    return LatentDirichletAllocation(
        5, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=80, evaluate_every=10,
        consistency=dask_ps.BSP(), client=lda_client, random_state=0,
    ).fit(X)


# --- the rule: public dask_ps API only -----------------------------------------------------


def test_uses_public_dask_ps_api_only():
    private = []
    for path in PKG.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "dask_ps":
                names = [f"dask_ps.{node.attr}"]
            for n in names:
                parts = n.split(".")
                # dask_ps._estimators: the shared estimator machinery, the one private package allowed
                if parts[0] == "dask_ps" and len(parts) > 1 and parts[1].startswith("_") and parts[1] != "_estimators":
                    private.append((path.name, n))
    assert not private, f"dask_ps.decomposition uses private dask_ps names: {private}"


# --- kernels (no cluster) ------------------------------------------------------------------


def _conditional(nwk, nk, w, alpha, beta, vbeta):
    p = alpha * (np.maximum(nwk[w], 0) + beta) / (np.maximum(nk, 0) + vbeta)
    return p / p.sum()


@pytest.mark.parametrize("sampler", ["sparse", "dense", "array"])
def test_kernel_draws_the_full_conditional(sampler):
    """A one-token document resampled many times follows p(z | rest) exactly,
    including with a (clamped) negative count in the stale view."""
    rng = np.random.default_rng(1)
    K, V, alpha, beta = 6, 5, 0.3, 0.1
    nwk = rng.integers(0, 5, size=(V, K)).astype(np.int32)
    nwk[2, 4] = -3  # transiently negative under staleness: read as 0
    nk = (nwk.sum(0) + rng.integers(0, 20, size=K)).astype(np.int64)
    w, k0 = 2, 1
    nwk[w, k0] += 1
    nk[k0] += 1
    expected = _conditional(np.where(np.arange(K) == k0, nwk - 1, nwk), nk - (np.arange(K) == k0), w,
                            alpha, beta, V * beta)
    n = 20000 if sampler != "array" else 4000
    counts = np.zeros(K)
    doc_ptr = np.array([0, 1], dtype=np.int64)
    words = np.array([w], dtype=np.int32)
    z = np.array([k0], dtype=np.int32)
    ndk = np.zeros((1, K), dtype=np.int32)
    ndk[0, k0] = 1
    for s in range(n):
        if sampler == "array":
            kernels.gibbs_sweep_array(np, np.zeros(1, np.int64), words.astype(np.int64), z, ndk, nwk, nk,
                                      alpha, beta, V * beta, s)
        else:
            kernels.SWEEPS[sampler](doc_ptr, words, z, ndk, nwk, nk, alpha, beta, V * beta, s)
        counts[z[0]] += 1
    freq = counts / n
    tol = 4 * np.sqrt(expected * (1 - expected) / n) + 1e-3
    assert np.all(np.abs(freq - expected) < tol), (freq, expected)
    # the negative count is read as 0, never stored clamped: -3, or -2 while the token sits in topic 4
    assert nwk[2, 4] == -3 + (z[0] == 4) and ndk.sum() == 1 and np.isfinite(freq).all()


def _sweep_transition(z0, words, ndk0, nwk0, nk0, alpha, beta, vbeta):
    """The exact distribution of one sequential sweep's assignments of the
    tokens of one document, from ``z0`` and the counts (which include the
    tokens), as a dict {assignments: probability}."""
    K, n = nk0.shape[0], len(z0)
    out = {}
    for zs in np.ndindex(*(K,) * n):
        ndk, nwk, nk = ndk0.astype(float), nwk0.astype(float), nk0.astype(float)
        prob = 1.0
        for w, old, new in zip(words, z0, zs):
            ndk[old] -= 1
            nwk[w, old] -= 1
            nk[old] -= 1
            p = (ndk + alpha) * (np.maximum(nwk[w], 0) + beta) / (np.maximum(nk, 0) + vbeta)
            prob *= p[new] / p.sum()
            ndk[new] += 1
            nwk[w, new] += 1
            nk[new] += 1
        out[zs] = prob
    return out


@pytest.mark.parametrize("K", [3, 9])
@pytest.mark.parametrize("sampler", ["sparse", "dense"])
def test_a_sweep_draws_a_run_of_one_word_from_the_sequential_conditionals(sampler, K):
    """One document whose tokens are a run of one word, then another word
    (the partitions' token order): one sweep's joint draw of the new
    assignments follows the product of the sequential full conditionals,
    each token's counts including the new topics of the tokens before it
    (the dense sweep patches its probabilities along a run instead of
    recomputing them; K=9 puts two topics in a lane, K=3 leaves lanes empty)."""
    rng = np.random.default_rng(3)
    V, alpha, beta = 4, 0.3, 0.5
    words = np.array([1, 1, 1, 2], dtype=np.int32)
    z0 = rng.integers(K, size=words.size).astype(np.int32)
    ndk = np.zeros((1, K), np.int32)
    nwk = rng.integers(0, 2, size=(V, K)).astype(np.int32)  # other documents' tokens
    nk = (nwk.sum(0) + rng.integers(0, 6, size=K)).astype(np.int64)
    np.add.at(ndk[0], z0, 1)
    np.add.at(nwk, (words, z0), 1)
    np.add.at(nk, z0, 1)
    exact = _sweep_transition(z0, words, ndk[0], nwk, nk, alpha, beta, V * beta)
    n = 40000
    counts = {}
    doc_ptr = np.array([0, words.size], dtype=np.int64)
    for s in range(n):
        z = z0.copy()
        kernels.SWEEPS[sampler](doc_ptr, words, z, ndk.copy(), nwk.copy(), nk.copy(), alpha, beta, V * beta, s)
        counts[tuple(z)] = counts.get(tuple(z), 0) + 1
    tv = 0.5 * sum(abs(counts.get(zs, 0) / n - p) for zs, p in exact.items())
    # sampling noise alone: at most about 0.5 * sum sqrt(p / n) (0.01 at K=3, 0.12 at K=9); a sweep
    # that skipped one of the run's patches was 4x that at K=3, 3x at K=9
    noise = 0.5 * sum(math.sqrt(p / n) for p in exact.values())
    assert tv < 1.5 * noise, (tv, noise)


@pytest.mark.parametrize("sampler", ["sparse", "dense", "array"])
def test_kernels_keep_counts_consistent_and_agree(corpus, sampler):
    X, _ = corpus
    K, alpha, beta = 5, 0.3, 0.05
    V = X.shape[1]
    doc_len = np.asarray(X.sum(1)).ravel()
    doc_ptr = np.concatenate([[0], np.cumsum(doc_len)]).astype(np.int64)
    words = np.repeat(X.indices, X.data).astype(np.int32)
    doc_idx = np.repeat(np.arange(X.shape[0]), doc_len)
    z = np.random.default_rng(0).integers(K, size=words.size, dtype=np.int32)
    ndk = np.zeros((X.shape[0], K), np.int32)
    nwk = np.zeros((V, K), np.int32)
    nk = np.zeros(K, np.int64)
    kernels.init_counts(doc_ptr, words, z, ndk, nwk, nk)
    ll0 = kernels.doc_loglik(ndk, doc_len, alpha) + kernels.word_loglik_rows(nwk, np.ones(V), beta) \
        + kernels.totals_loglik(nk, V * beta)
    for it in range(30):
        if sampler == "array":
            kernels.gibbs_sweep_array(np, doc_idx, words.astype(np.int64), z, ndk, nwk, nk, alpha, beta,
                                      V * beta, it, batch_size=4096)
        else:
            kernels.SWEEPS[sampler](doc_ptr, words, z, ndk, nwk, nk, alpha, beta, V * beta, it)
    assert (nwk >= 0).all() and (ndk >= 0).all()
    np.testing.assert_array_equal(nwk.sum(0), nk)
    np.testing.assert_array_equal(ndk.sum(1), doc_len)
    np.testing.assert_array_equal(np.bincount(z, minlength=K), nk)
    check = np.zeros_like(nwk)
    np.add.at(check, (words, z), 1)
    np.testing.assert_array_equal(check, nwk)
    ll = kernels.doc_loglik(ndk, doc_len, alpha) + kernels.word_loglik_rows(nwk, np.ones(V), beta) \
        + kernels.totals_loglik(nk, V * beta)
    assert ll > ll0 * 0.8  # log-likelihoods are negative: it went up a lot


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_loglik_terms_equal_the_gammaln_formula(dtype):
    """The log-likelihood's lgamma sums (a lookup table over the positive
    counts, zeros skipped) equal lgamma(n + prior) - lgamma(prior) summed
    over every entry, negatives clamped at 0 (a participant's view of
    counts under staleness), for sparse and dense count tables."""
    from scipy.special import gammaln

    rng = np.random.default_rng(1)
    counts = rng.integers(-3, 40, size=(300, 70)) * (rng.random((300, 70)) < 0.1)
    counts = counts.astype(dtype)
    weights = rng.random(300)
    prior = 0.01
    expected = (gammaln(np.maximum(counts, 0) + prior) - gammaln(prior)).sum(axis=1)
    np.testing.assert_allclose(kernels.word_loglik_rows(counts, weights, prior), expected @ weights, rtol=1e-12)
    doc_len = np.maximum(counts, 0).sum(axis=1)
    K = counts.shape[1]
    keep = doc_len > 0
    expected_doc = keep.sum() * gammaln(K * prior) - gammaln(doc_len[keep] + K * prior).sum() + expected[keep].sum()
    np.testing.assert_allclose(kernels.doc_loglik(counts, doc_len, prior), expected_doc, rtol=1e-12)
    assert kernels.word_loglik_rows(np.zeros((5, 4), dtype), np.ones(5), prior) == 0.0


def test_row_deltas_into_a_kept_buffer_and_zeroed_again():
    from dask_ps.decomposition._lda_kernels import row_deltas_into

    rng = np.random.default_rng(1)
    V, K, n = 25, 6, 400
    words = rng.integers(0, V, n).astype(np.int32)
    z_before = rng.integers(0, K, n).astype(np.int32)
    z_after = z_before.copy()
    moved = rng.random(n) < 0.4
    z_after[moved] = rng.integers(0, K, moved.sum())
    out = np.zeros((V, K), np.int32)
    changed = row_deltas_into(words, z_before, z_after, out, False)
    full = np.zeros((V, K), np.int64)
    np.add.at(full, (words, z_after), 1)
    np.add.at(full, (words, z_before), -1)
    np.testing.assert_array_equal(changed, np.unique(words[z_before != z_after]))
    np.testing.assert_array_equal(out[:changed.size], full[changed])
    assert not out[changed.size:].any()
    row_deltas_into(words, z_before, z_after, out, True)
    assert not out.any()  # ready for the next iteration


def test_changed_rows_are_the_rows_that_differ_and_their_difference():
    rng = np.random.default_rng(2)
    before = rng.integers(0, 4, size=(30, 7)).astype(np.int32)
    after = before.copy()
    after[[3, 4, 17, 29], [0, 6, 2, 5]] += 1
    after[[4, 17], [1, 1]] -= 1
    after[[8, 8], [2, 3]] += [1, -1]
    changed, delta = kernels.changed_rows(after, before)
    np.testing.assert_array_equal(changed, [3, 4, 8, 17, 29])
    np.testing.assert_array_equal(delta, (after - before)[[3, 4, 8, 17, 29]])
    assert delta.dtype == np.int32
    changed, delta = kernels.changed_rows(before, before)
    assert changed.size == 0 and delta.shape == (0, 7)


def test_fold_in_and_doc_logliks_match_a_numpy_reference():
    """The compiled fold-in and scoring passes (reassociated sums) give the
    EM fixed point and the log-likelihoods a plain numpy loop gives, with
    K long enough for their vector lanes and a document without tokens."""
    rng = np.random.default_rng(3)
    K, V, alpha, max_iter, tol = 67, 40, 0.1, 30, 1e-9
    dense = rng.integers(1, 4, size=(12, V)) * (rng.random((12, V)) < 0.3)
    dense[5] = 0
    X = sp.csr_matrix(dense, dtype=np.float64)
    phi_t = np.ascontiguousarray(rng.dirichlet(np.full(V, 0.3), size=K).T)  # V x K
    ip, ix = X.indptr.astype(np.int64), X.indices.astype(np.int64)
    theta = np.empty((X.shape[0], K))
    kernels.fold_in(ip, ix, X.data, phi_t, 0.0, np.ones(K), alpha, max_iter, tol, theta)
    out = np.empty(X.shape[0])
    kernels.doc_logliks(ip, ix, X.data, phi_t, 0.0, np.ones(K), theta, out)
    # the topics read from counts, as bound_ reads them: (counts + beta) / (totals + V beta)
    counts = rng.integers(0, 5, size=(V, K)).astype(np.int32)
    beta = 0.01
    scale = 1.0 / (counts.sum(axis=0) + V * beta)
    theta_c = np.empty_like(theta)
    kernels.fold_in(ip, ix, X.data, counts, beta, scale, alpha, max_iter, tol, theta_c)
    out_c = np.empty_like(out)
    kernels.doc_logliks(ip, ix, X.data, counts, beta, scale, theta_c, out_c)
    phi_c = (counts + beta) / (counts + beta).sum(axis=0)
    np.testing.assert_allclose(out_c, doc_logliks_reference(X, phi_c, alpha, max_iter, tol)[1], rtol=1e-12)
    ref_theta, ref_out = doc_logliks_reference(X, phi_t, alpha, max_iter, tol)
    np.testing.assert_allclose(theta, ref_theta, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)


def doc_logliks_reference(X, phi_t, alpha, max_iter, tol):
    """Fold-in and per-document log-likelihood, a plain numpy loop."""
    K = phi_t.shape[1]
    thetas, outs = [], []
    for d in range(X.shape[0]):
        v, x = X[d].indices, X[d].data
        th = np.full(K, 1.0 / K)
        for _ in range(max_iter if x.size else 0):
            r = th * phi_t[v]  # entries x K
            new = ((r / r.sum(axis=1, keepdims=True)) * x[:, None]).sum(axis=0)
            new = (new + alpha) / (x.sum() + K * alpha)
            change = np.abs(new - th).mean()
            th = new
            if change < tol:
                break
        thetas.append(th)
        outs.append(float(x @ np.log(phi_t[v] @ th)) if x.size else 0.0)
    return np.array(thetas), np.array(outs)


def test_loglik_matches_lda_package_formula():
    pytest.importorskip("lda")
    import lda._lda as lda_c

    X, _ = lda_corpus(n_docs=30, doc_len=20, n_words=40, n_topics=3, seed=3)
    K, alpha, beta = 3, 0.2, 0.05
    doc_len = np.asarray(X.sum(1)).ravel()
    doc_ptr = np.concatenate([[0], np.cumsum(doc_len)]).astype(np.int64)
    words = np.repeat(X.indices, X.data).astype(np.int32)
    z = np.random.default_rng(0).integers(K, size=words.size, dtype=np.int32)
    ndk = np.zeros((X.shape[0], K), np.int32)
    nwk = np.zeros((X.shape[1], K), np.int32)
    nk = np.zeros(K, np.int64)
    kernels.init_counts(doc_ptr, words, z, ndk, nwk, nk)
    ours = kernels.doc_loglik(ndk, doc_len, alpha) + kernels.word_loglik_rows(nwk, np.ones(X.shape[1]), beta) \
        + kernels.totals_loglik(nk, X.shape[1] * beta)
    theirs = lda_c._loglikelihood(np.asfortranarray(nwk.T.astype(np.intc)), ndk.astype(np.intc),
                                  nk.astype(np.intc), doc_len.astype(np.intc), alpha, beta)
    assert ours == pytest.approx(theirs, rel=1e-9)


# --- fit -------------------------------------------------------------------------------------


def test_topic_recovery(fitted, corpus):
    X, topics = corpus
    assert fitted.components_.shape == (5, X.shape[1])
    assert matched_cosine(fitted.components_, topics) >= 0.9
    hist = fitted.loglik_history_
    assert [h[0] for h in hist] == [0, 10, 20, 30, 40, 50, 60, 70, 80]
    assert hist[-1][2] > hist[0][2]
    assert all(b[1] >= a[1] for a, b in zip(hist, hist[1:]))
    assert fitted.n_tokens_ == X.sum()
    assert fitted.n_iter_ == 80 and fitted.tokens_per_second_ > 0
    np.testing.assert_allclose(fitted.components_.sum(), X.sum() + 0.05 * 5 * X.shape[1])
    # (that the participants' evaluation during the fit is exact is checked
    # in test_chunked_and_resumed_fits_equal_one_run and, with several
    # participants, in test_lda_dropin.py; how far the chain moves in the
    # last 10 sweeps: 0.3-4.6% here)


def test_fitted_model_transform_and_score(fitted, corpus):
    X, _ = corpus
    theta = fitted.transform(X[:50])
    assert theta.shape == (50, 5)
    np.testing.assert_allclose(theta.sum(1), 1.0)
    # documents are dominated by few topics (alpha = 0.3)
    assert np.median(theta.max(1)) > 0.4
    ll, n = document_completion(fitted.components_, X[:50], fitted.doc_topic_prior_, tol=fitted.mean_change_tol)
    # score is scikit-learn's variational bound (issue 35; test_lda_sklearn_meaning.py); document
    # completion is the held-out measure by prediction
    assert fitted.perplexity(X[:50]) == pytest.approx(math.exp(-fitted.score(X[:50]) / X[:50].sum()))
    # better than the uniform model over words
    assert ll / n > -math.log(X.shape[1])
    # transform is the same without a cluster, after pickling
    m2 = pickle.loads(pickle.dumps(fitted))
    assert m2.client is None
    np.testing.assert_allclose(m2.transform(X[:50]), theta)
    assert m2.get_feature_names_out().tolist() == [f"latentdirichletallocation{i}" for i in range(5)]


@pytest.mark.parametrize("model", [
    dask_ps.SSP(2),
    # ASP has no bound: kept out of the default run for its time; run with -m slow.
    pytest.param(dask_ps.ASP(), marks=pytest.mark.slow),
], ids=["SSP2", "ASP"])
def test_staleness_fits_on_a_cluster(lda_client, corpus, model):
    """A staleness fit on worker processes: what holds whatever the timing.
    Each token is counted once (the table sums are exact), reads stay in the
    bound, a clock per sweep, and the chain trains: its log-likelihood ends
    within 15% of BSP's (the random start is 57% below; a Gibbs chain's
    merged-topics modes, which BSP at another seed reaches too, 4-8%).
    Where the chain ends against BSP's is a statistical claim about the
    reads, checked deterministically at the worst case the bound allows in
    test_lda_staleness_sim.py: here, what the reads hold of the last clocks
    depends on the timing, so the 2% this test asked for failed about one
    run in 40 (BSP itself: 1 seed in 40 ends in such a mode)."""
    X, topics = corpus
    kw = dict(doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=60, n_partitions=4,
              client=lda_client, random_state=1)
    bsp = LatentDirichletAllocation(5, consistency=dask_ps.BSP(), **kw).fit(X)
    # the one-process simulation is this chain under BSP, bit for bit
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import lda_sim

    assert bsp.loglik_history_[-1][2] == lda_sim.simulate_lda(X, 5, dask_ps.BSP(), 4, 1, max_iter=60)
    stale = LatentDirichletAllocation(5, consistency=model, **kw).fit(X)
    l_bsp, l_stale = bsp.loglik_history_[-1][2], stale.loglik_history_[-1][2]
    assert abs(l_stale - l_bsp) / abs(l_bsp) < 0.15, (l_stale, l_bsp)
    np.testing.assert_allclose(stale.components_.sum(), X.sum() + 0.05 * 5 * X.shape[1])
    assert stale.n_tokens_ == X.sum()
    assert len(stale.metrics_) == 4
    assert all(m["clock"] == kw["max_iter"] + 1 for m in stale.metrics_)  # the initial push + one clock per sweep
    for m in stale.metrics_:  # each iteration's sweep seconds, summing to the total
        assert len(m["sweeps"]) == kw["max_iter"] and sum(m["sweeps"]) == pytest.approx(m["sweep_seconds"])
    if model.staleness is not None:
        bound = model.staleness
        for m in stale.metrics_:
            seen = m["tables"][[t for t in m["tables"] if t.endswith("word-topic")][0]]["staleness"]
            assert seen and max(int(k) for k in seen) <= bound, seen


def test_dask_array_input_stays_on_workers(lda_client, corpus):
    """A dask array's row chunks are the partitions, prepared where Dask
    holds them: under BSP the fit equals the in-memory fit split the same
    way (reproducible whatever the placement and timing). The fit's quality
    is the ``fitted`` fixture's (judged there on the in-memory input);
    comparing the two fits asserts what holds for every seed, where a
    cosine threshold on one fit under staleness failed by chance (one run in
    about ten: cosine 0.77, a merged-topics mode)."""
    da = pytest.importorskip("dask.array")
    X, topics = corpus
    dX = da.from_array(X, chunks=(100, X.shape[1]), asarray=False)  # scipy.sparse chunks
    kw = dict(doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=20, consistency=dask_ps.BSP(),
              client=lda_client, random_state=0)
    m = LatentDirichletAllocation(5, **kw).fit(dX)
    assert len(m.metrics_) == 4  # one participant per row chunk
    assert m.n_features_in_ == X.shape[1]
    # the in-memory input cut into the same 4 row ranges (equal token counts)
    ref = LatentDirichletAllocation(5, n_partitions=4, **kw).fit(X)
    np.testing.assert_array_equal(m.components_, ref.components_)
    # (iteration, seconds, log-likelihood): all but the seconds
    assert [(h[0], h[2]) for h in m.loglik_history_] == [(h[0], h[2]) for h in ref.loglik_history_]
    dense = da.from_array(X.toarray(), chunks=(150, 100))  # numpy chunks, split columns
    theta = m.transform(dense)
    assert isinstance(theta, da.Array)
    np.testing.assert_allclose(theta.compute(), m.transform(X))


def test_array_sampler_on_cpu(lda_client, corpus):
    """The vectorized (array-API) sampler, run with numpy: the GPU path's code."""
    X, topics = corpus
    m = LatentDirichletAllocation(5, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=40, sampler="array",
                                  consistency=dask_ps.BSP(), client=lda_client, random_state=0).fit(X)
    assert matched_cosine(m.components_, topics) >= 0.9


def test_client_none_uses_current_client(lda_client):
    # lda_client is the current (default) client: no new cluster is started
    X, _ = lda_corpus(n_docs=40, doc_len=30, n_words=50, n_topics=3, seed=2)
    m = LatentDirichletAllocation(3, max_iter=5, evaluate_every=0, random_state=0).fit(X)
    assert [h[0] for h in m.loglik_history_] == [5]
    assert np.isfinite(m.loglik_history_[-1][2])


def test_verbose_logs_progress(lda_client, caplog):
    """The verbose lines go to the logger too, with the random start and
    the summary that standard output does not show (scikit-learn's lines)."""
    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=50, n_topics=3, seed=2)
    with caplog.at_level(logging.INFO, logger="dask_ps.decomposition"):
        LatentDirichletAllocation(3, max_iter=10, evaluate_every=5, verbose=1, client=lda_client,
                                  random_state=0).fit(X)
    text = caplog.text
    assert "iteration: 0 of max_iter: 10 (the random start): log-likelihood" in text
    assert "iteration: 4 of max_iter: 10\n" in text
    assert "iteration: 5 of max_iter: 10, perplexity: " in text and "tokens/s" in text
    assert "10 iterations" in text


def test_empty_documents_are_skipped(lda_client):
    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=50, n_topics=3, seed=4)
    X = sp.vstack([sp.csr_matrix((3, 50)), X, sp.csr_matrix((2, 50))]).tocsr()
    m = LatentDirichletAllocation(3, max_iter=5, client=lda_client, random_state=0).fit(X.toarray())
    assert m.n_tokens_ == X.sum()
    theta = m.transform(X[:3])
    np.testing.assert_allclose(theta, 1 / 3)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_components": 0}, "n_components"),
        ({"doc_topic_prior": 0.0}, "doc_topic_prior"),
        ({"topic_word_prior": -1.0}, "topic_word_prior"),
        ({"max_iter": -1}, "max_iter"),
        ({"sampler": "gpu"}, "sampler"),
        ({"device": "tpu"}, "device"),
        ({"consistency": 42}, "consistency"),
        ({"consistency": "sometimes"}, "consistency"),
        ({"n_partitions": 0}, "n_partitions"),
        ({"sampler": "sparse", "device": "cuda"}, "runs on the CPU"),
        ({"replication": 0}, "replication"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"checkpoint_every": 5}, "nothing to save to"),
        ({"checkpoint": 3}, "checkpoint"),
    ],
)
def test_parameter_validation(params, match):
    X, _ = lda_corpus(n_docs=10, doc_len=10, n_words=20, n_topics=2)
    with pytest.raises(ValueError, match=match):
        LatentDirichletAllocation(**params).fit(X)


def test_default_word_consistency_refreshes():
    """consistency=None: the configured default model, read fresh when cheap;
    an explicit model is used as given."""
    import dask

    assert LatentDirichletAllocation()._consistencies()[0] == dask_ps.SSP(2, refresh=True)
    with dask.config.set({"ps.consistency": "essp", "ps.staleness": 3}):
        assert LatentDirichletAllocation()._consistencies()[0] == dask_ps.ESSP(3, refresh=True)
    with dask.config.set({"ps.consistency": "bsp"}):
        assert LatentDirichletAllocation()._consistencies()[0] == dask_ps.BSP()
    assert LatentDirichletAllocation(consistency=dask_ps.SSP(2))._consistencies()[0] == dask_ps.SSP(2)


@pytest.mark.parametrize(
    "word, totals, expected",
    [
        (dask_ps.BSP(), None, dask_ps.BSP()),  # exact: the totals move with the rows
        (dask_ps.SSP(2), None, dask_ps.ASP()),  # fresh every clock, never a barrier
        (dask_ps.ESSP(1), None, dask_ps.ASP()),
        ("ssp", "bsp", dask_ps.BSP()),
    ],
)
def test_totals_consistency_default(word, totals, expected):
    m = LatentDirichletAllocation(consistency=word, totals_consistency=totals)
    assert m._consistencies()[1] == expected


def test_sklearn_conventions():
    from sklearn.base import clone

    m = LatentDirichletAllocation(7, consistency=dask_ps.SSP(3), random_state=0)
    assert m.get_params()["n_components"] == 7
    c = clone(m).set_params(max_iter=3)
    assert c.max_iter == 3 and c.consistency == dask_ps.SSP(3)
    with pytest.raises(Exception, match="not fitted"):
        m.transform(np.ones((1, 3)))


@pytest.mark.parametrize(
    "X, match",
    [
        (np.array([[1, -1, 2], [0, 1, 1]]), "Negative values"),
        # floats are rounded now (issue 13): test_lda_dropin.py::test_float_counts_are_rounded_with_a_warning
        (np.array([[np.nan, 1, 2], [0, 1, 1]]), "NaN"),
        # a corpus of empty documents is accepted now, as scikit-learn accepts it (issue 24):
        # tests/estimators/test_dropin_params.py::test_lda_empty_documents_as_scikit_learn
        (np.array([["a", "b"]]), "could not convert|numeric"),
    ],
)
def test_bad_input(lda_client, X, match):
    with pytest.raises(ValueError, match=match):
        LatentDirichletAllocation(2, max_iter=2, client=lda_client).fit(X)


def test_bad_dask_chunks_are_reported(lda_client):
    da = pytest.importorskip("dask.array")
    X = np.ones((20, 5))
    X[13, 2] = -1
    with pytest.raises(ValueError, match="Negative values"):
        LatentDirichletAllocation(2, max_iter=2, client=lda_client).fit(da.from_array(X, chunks=(10, 5)))


def test_wrong_vocabulary_size_at_transform(fitted, corpus):
    X, _ = corpus
    with pytest.raises(ValueError, match="features"):
        fitted.transform(X[:, :-1])
    with pytest.raises(ValueError, match="features"):
        fitted.score(X[:5, :-1])
    with pytest.raises(ValueError, match="Negative"):
        fitted.transform(-X[:5])
    # weights are fine for transform and (scikit-learn's meaning, issue 13) score
    assert np.isfinite(fitted.score(X[:5] * 0.5))
    assert np.isfinite(fitted.transform(X[:5] * 0.5)).all()


# --- against the lda package ------------------------------------------------------------


def _reuters_split():
    lda = pytest.importorskip("lda")
    import lda.datasets

    X = sp.csr_matrix(lda.datasets.load_reuters())
    idx = np.random.default_rng(0).permutation(X.shape[0])
    n_test = X.shape[0] // 10
    return X[idx[n_test:]], X[idx[:n_test]]


def _compare_with_lda_package(client, K, n_iter, consistency):
    import lda

    train, test = _reuters_split()
    alpha, eta = 0.1, 0.01
    ref = lda.LDA(n_topics=K, n_iter=n_iter, alpha=alpha, eta=eta, random_state=0, refresh=10**6).fit(train)
    ll_ref, n_ref = document_completion(ref.topic_word_, test, alpha)
    ours = LatentDirichletAllocation(K, doc_topic_prior=alpha, topic_word_prior=eta, max_iter=n_iter,
                                     consistency=consistency, client=client, random_state=0).fit(train)
    ll, n = document_completion(ours.components_, test, alpha)
    assert n == n_ref
    per_tok, per_tok_ref = ll / n, ll_ref / n_ref
    assert abs(per_tok - per_tok_ref) / abs(per_tok_ref) < 0.02, (per_tok, per_tok_ref)
    # and the training log-likelihood (same formula) is comparable too
    assert abs(ours.loglik_history_[-1][2] - ref.loglikelihood()) / abs(ref.loglikelihood()) < 0.02


def test_heldout_loglik_close_to_lda_package(lda_client):
    """Reuters (ships with ``lda``), K=10, 60 iterations, default SSP(2)."""
    _compare_with_lda_package(lda_client, K=10, n_iter=60, consistency=None)


@pytest.mark.slow
@pytest.mark.parametrize("model", [dask_ps.BSP(), dask_ps.SSP(2), dask_ps.ASP()], ids=["BSP", "SSP2", "ASP"])
def test_heldout_loglik_close_to_lda_package_k50(lda_client, model):
    _compare_with_lda_package(lda_client, K=50, n_iter=200, consistency=model)


# --- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_array_sampler_topic_recovery(lda_client, corpus):
    cupy = pytest.importorskip("cupy")
    X, topics = corpus
    m = LatentDirichletAllocation(5, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=40,
                                  consistency=dask_ps.BSP(), client=lda_client, random_state=0)
    m.fit(cupy.asarray(X.toarray()))
    assert m._resolved(cupy.asarray(X.toarray())) == ("cuda", "array")
    assert matched_cosine(m.components_, topics) >= 0.9


# --- fault tolerance: chunks, checkpoints, lost workers (issue 6) ---------------------------


def _bsp_fit(client, X, **kw):
    return LatentDirichletAllocation(
        4, doc_topic_prior=0.3, topic_word_prior=0.05, evaluate_every=2, consistency=dask_ps.BSP(),
        client=client, random_state=0, **{"max_iter": 7, "n_partitions": 1, **kw},
    ).fit(X)


def test_chunked_and_resumed_fits_equal_one_run(lda_client, tmp_path):
    """A fit of one participant is deterministic (with several too, since
    issue 13: test_lda_dropin.py), so a fit in
    chunks (assignments stored in replicated tables between runs, counts
    rebuilt from them) and a fit resumed from a checkpoint must give bitwise
    the same topics and log-likelihoods as one uninterrupted run."""
    X, _ = lda_corpus(n_docs=90, doc_len=40, n_words=60, n_topics=4, seed=5)
    ref = _bsp_fit(lda_client, X)
    chunked = _bsp_fit(lda_client, X, replication=2, checkpoint_every=3)
    path = str(tmp_path / "ckpt")
    first = _bsp_fit(lda_client, X, max_iter=4, checkpoint=path, checkpoint_every=2)
    meta = dask_ps.checkpoint_metadata(path)
    assert meta["iteration"] == 4 and meta["part_tokens"] == [int(m["n_tokens"]) for m in ref.metrics_]
    # n_partitions=None: the resumed fit splits the documents as the saved one did
    resumed = _bsp_fit(lda_client, X, checkpoint=path, checkpoint_every=2, n_partitions=None)
    for est in (chunked, resumed):
        np.testing.assert_array_equal(est.components_, ref.components_)
        assert [(i, ll) for i, _, ll in est.loglik_history_] == [(i, ll) for i, _, ll in ref.loglik_history_]
        assert est.n_restarts_ == 0
    assert not np.array_equal(first.components_, ref.components_)  # 4 sweeps are not 7
    # The participants' evaluation in the loop is the exact log-likelihood of
    # the state: ref evaluated iteration 4 there, `first` computed it at its end.
    assert first.loglik_history_[-1][0] == 4
    assert first.loglik_history_[-1][2] == pytest.approx(dict((i, ll) for i, _, ll in ref.loglik_history_)[4],
                                                         rel=1e-12)
    assert dask_ps.checkpoint_metadata(path)["iteration"] == 7
    assert not [t for t in dask_ps.get_parameter_server(lda_client).tables() if t.startswith("lda-")]
    # a finished checkpoint resumed with the same max_iter trains nothing and gives the same model
    again = _bsp_fit(lda_client, X, checkpoint=path)
    np.testing.assert_array_equal(again.components_, ref.components_)
    # ... and with a smaller max_iter it says how far the model really is
    fewer = _bsp_fit(lda_client, X, max_iter=3, checkpoint=path)
    np.testing.assert_array_equal(fewer.components_, ref.components_)
    assert fewer.n_iter_ == 7 and fewer.loglik_history_[-1][0] == 7


def test_checkpoint_of_another_fit_is_refused(lda_client, tmp_path):
    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=50, n_topics=3, seed=2)
    path = str(tmp_path / "ckpt")
    _bsp_fit(lda_client, X, max_iter=2, checkpoint=path)
    with pytest.raises(ValueError, match="belongs to another fit.*n_components"):
        LatentDirichletAllocation(3, max_iter=2, checkpoint=path, client=lda_client).fit(X)
    before = dask_ps.checkpoint_metadata(path)
    with pytest.raises(ValueError, match="belongs to another fit.*part_tokens"):
        _bsp_fit(lda_client, X[:40], max_iter=2, checkpoint=path)
    assert dask_ps.checkpoint_metadata(path) == before  # nothing overwritten
    ps = dask_ps.get_parameter_server(lda_client)
    ps.create_table("not-lda", shape=(3,))
    try:
        ps.save(str(tmp_path / "other"), tables=["not-lda"], metadata={"estimator": "something"})
        ps.save(str(tmp_path / "plain"), tables=["not-lda"])  # no metadata at all
    finally:
        ps.drop_table("not-lda")
    for other in ("other", "plain"):
        with pytest.raises(ValueError, match="not a LatentDirichletAllocation fit"):
            _bsp_fit(lda_client, X, checkpoint=str(tmp_path / other))
    assert dask_ps.checkpoint_metadata(str(tmp_path / "plain")) == {}  # the user's checkpoint kept


class _Delay:
    """Benchmark hook: sleep this long after every sweep (makes the fit last)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, rank, it, dt):
        return self.seconds


@pytest.mark.parametrize("how", [
    "replication",
    # The same with the lost blocks restored from the checkpoint; a second
    # 3-worker cluster, 15-35 s on the loaded 2-core machine: -m slow.
    pytest.param("checkpoint", marks=pytest.mark.slow),
])
def test_lda_fit_survives_a_worker_killed_mid_fit(tmp_path, how):
    """kill -9 of a worker (it holds a participant, a partition of the data
    and table blocks) in the middle of a 3-participant fit: the run is
    aborted, the lost partition is made again, and the chunk is redone from
    the assignments saved after the previous chunk (replicated tables, or
    the checkpoint). The fit completes with the log-likelihood of an
    undisturbed fit within 2% (the issue's bar) and recovers the topics."""
    import os
    import signal
    import threading
    import time

    from distributed import Client, LocalCluster

    X, topics = lda_corpus(n_docs=240, doc_len=60, n_words=150, n_topics=4, seed=3)
    opts = {"replication": 2} if how == "replication" else {"checkpoint": str(tmp_path / "ckpt")}
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        ps = dask_ps.get_parameter_server(c)

        def fit(path_suffix=""):
            kw = dict(opts)
            if "checkpoint" in kw:
                kw["checkpoint"] += path_suffix
            est = LatentDirichletAllocation(
                4, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=12, evaluate_every=4,
                consistency=dask_ps.BSP(), n_partitions=3, checkpoint_every=4, client=c, random_state=0, **kw)
            est._sweep_delay = _Delay(0.05)
            return est.fit(X)

        quiet = fit("-quiet")
        killed = {}

        def kill_a_participant_worker():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not [t for t in ps.tables() if "-4-word-topic" in t]:
                time.sleep(0.02)  # the second chunk (iterations 4..7) has started
            time.sleep(0.1)
            victim = sorted(c.scheduler_info(n_workers=-1)["workers"])[0]
            os.kill(c.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
            killed[victim] = time.monotonic()

        killer = threading.Thread(target=kill_a_participant_worker, daemon=True)
        killer.start()
        disturbed = fit()
        done = time.monotonic()
        killer.join(timeout=5)
        assert killed and next(iter(killed.values())) < done, "the worker was not killed during the fit"
        assert disturbed.n_restarts_ >= 1
        assert quiet.n_restarts_ == 0
        l_quiet, l_disturbed = quiet.loglik_history_[-1][2], disturbed.loglik_history_[-1][2]
        assert abs(l_disturbed - l_quiet) / abs(l_quiet) < 0.02, (l_disturbed, l_quiet)
        assert disturbed.components_.sum() == quiet.components_.sum()  # every token counted once
        assert matched_cosine(disturbed.components_, topics) >= 0.9


def test_lost_worker_without_saved_assignments_fails_clearly(monkeypatch):
    """Without replication or checkpoint a participant restarted by Dask
    cannot go on: the fit fails with LostAssignmentsError saying what to do,
    instead of counting the partition's tokens twice."""
    from dask_ps.decomposition import LostAssignmentsError
    from dask_ps.decomposition._gibbs import GibbsConfig, _gibbs_participant

    class RestartedCtx:
        current_clock = 3

    with pytest.raises(LostAssignmentsError, match="replication=2 or checkpoint"):
        _gibbs_participant(RestartedCtx(), None, GibbsConfig(
            nwk_name="w", nk_name="t", progress_name=None, n_components=2,
            alpha=0.1, beta=0.1, n_features=3, start=0, stop=3, z_in=None, z_out=None,
            evaluate_every=0, seeds=[0], holders=np.ones(3), sampler="dense", device="cpu",
            t_start=0.0, delay=None))


@pytest.mark.slow  # a 3-worker cluster and two fits, 10-20 s
def test_lda_fit_through_retire_workers_mid_chunk_loses_no_block(caplog):
    """retire_workers of a worker that runs a participant, in the middle of a
    chunk: the participant is cancelled and the chunk redone, and the
    worker's blocks (also those of the unreplicated count table) are handed
    over before it leaves -- no block is reported lost. Before the
    evacuation retried on closed connections this test failed in 3 of 7
    runs (a probabilistic regression check; the deterministic one
    is test_retire_survives_dask_dropping_connections_to_the_retiring_worker)."""
    import threading
    import time

    from distributed import Client, LocalCluster

    X, _ = lda_corpus(n_docs=240, doc_len=60, n_words=150, n_topics=4, seed=3)
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        ps = dask_ps.get_parameter_server(c)

        def fit():
            est = LatentDirichletAllocation(
                4, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=12, replication=2, checkpoint_every=4,
                consistency=dask_ps.BSP(), n_partitions=3, client=c, random_state=0)
            est._sweep_delay = _Delay(0.05)
            return est.fit(X)

        quiet = fit()
        retired = []

        def retire():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not [t for t in ps.tables() if "-4-word-topic" in t]:
                time.sleep(0.02)
            time.sleep(0.1)
            victim = sorted(c.scheduler_info(n_workers=-1)["workers"])[0]
            started.append(time.monotonic())
            c.retire_workers([victim])
            retired.append(victim)

        started = []
        retirer = threading.Thread(target=retire, daemon=True)
        with caplog.at_level(logging.ERROR, logger="dask_ps._scheduler_plugin"):
            retirer.start()
            disturbed = fit()
            done = time.monotonic()
        retirer.join(timeout=60)
        assert retired
        assert started[0] < done, "the worker was not retired during the fit"
        assert "could be read" not in caplog.text and "lost block" not in caplog.text, caplog.text
        l_quiet, l_disturbed = quiet.loglik_history_[-1][2], disturbed.loglik_history_[-1][2]
        assert abs(l_disturbed - l_quiet) / abs(l_quiet) < 0.02
        assert disturbed.components_.sum() == quiet.components_.sum()
