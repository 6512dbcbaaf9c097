"""The alias-table Metropolis-Hastings sweep (``_lda_mh``, ``sampler="mh"``):
the draw it converges to, counts kept exact, planted topics recovered and a
held-out log-likelihood close to SparseLDA's; one fit on the cluster."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

import dask_ps  # noqa: E402
from dask_ps.decomposition import LatentDirichletAllocation, document_completion  # noqa: E402
from dask_ps.decomposition import _lda_kernels as kernels  # noqa: E402
from dask_ps.decomposition._lda_mh import gibbs_sweep_mh  # noqa: E402

from test_lda import lda_client, lda_corpus, matched_cosine  # noqa: E402,F401


def _tokens(X):
    doc_len = np.asarray(X.sum(1)).ravel()
    doc_ptr = np.concatenate([[0], np.cumsum(doc_len)]).astype(np.int64)
    words = np.repeat(X.indices, X.data).astype(np.int32)
    return doc_len, doc_ptr, words


def _start(X, K, seed=0):
    doc_len, doc_ptr, words = _tokens(X)
    z = np.random.default_rng(seed).integers(K, size=words.size, dtype=np.int32)
    ndk = np.zeros((X.shape[0], K), np.int32)
    nwk = np.zeros((X.shape[1], K), np.int32)
    nk = np.zeros(K, np.int64)
    kernels.init_counts(doc_ptr, words, z, ndk, nwk, nk)
    return doc_len, doc_ptr, words, z, ndk, nwk, nk


def test_registered_as_a_sweep():
    assert kernels.SWEEPS["mh"] is gibbs_sweep_mh


def test_chain_converges_to_the_full_conditional():
    """A one-token document resampled with many MH steps per sweep: the
    token's chain forgets its start, so its draw follows p(z | rest) exactly
    (a clamped negative count included). With LightLDA's 2 steps the
    proposal built from the sweep's starting counts, which hold the token
    itself, leaves a small bias of order 1/(count); many steps remove it."""
    rng = np.random.default_rng(1)
    K, V, alpha, beta = 6, 5, 0.3, 0.1
    nwk = rng.integers(0, 5, size=(V, K)).astype(np.int32)
    nwk[2, 4] = -3  # transiently negative under staleness: read as 0
    nk = (nwk.sum(0) + rng.integers(0, 20, size=K)).astype(np.int64)
    w, k0 = 2, 1
    nwk[w, k0] += 1
    nk[k0] += 1
    expected = alpha * (np.maximum(np.where(np.arange(K) == k0, nwk[w] - 1, nwk[w]), 0) + beta) \
        / (np.maximum(nk - (np.arange(K) == k0), 0) + V * beta)
    expected /= expected.sum()
    n = 8000
    counts = np.zeros(K)
    doc_ptr = np.array([0, 1], dtype=np.int64)
    words = np.array([w], dtype=np.int32)
    z = np.array([k0], dtype=np.int32)
    ndk = np.zeros((1, K), dtype=np.int32)
    ndk[0, k0] = 1
    for s in range(n):
        gibbs_sweep_mh(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, V * beta, s, 40)
        counts[z[0]] += 1
    freq = counts / n
    tol = 4 * np.sqrt(expected * (1 - expected) / n) + 2e-3
    assert np.all(np.abs(freq - expected) < tol), (freq, expected)
    assert nwk[2, 4] == -3 and ndk.sum() == 1 and np.isfinite(freq).all()


def test_counts_stay_exact_and_likelihood_rises():
    X, _ = lda_corpus(alpha=0.3)
    K, alpha, beta = 5, 0.3, 0.05
    V = X.shape[1]
    doc_len, doc_ptr, words, z, ndk, nwk, nk = _start(X, K)
    ll0 = kernels.doc_loglik(ndk, doc_len, alpha) + kernels.word_loglik_rows(nwk, np.ones(V), beta) \
        + kernels.totals_loglik(nk, V * beta)
    for it in range(30):
        gibbs_sweep_mh(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, V * beta, it)
    assert (nwk >= 0).all() and (ndk >= 0).all()
    np.testing.assert_array_equal(nwk.sum(0), nk)
    np.testing.assert_array_equal(ndk.sum(1), doc_len)
    check = np.zeros_like(nwk)
    np.add.at(check, (words, z), 1)
    np.testing.assert_array_equal(check, nwk)
    ll = kernels.doc_loglik(ndk, doc_len, alpha) + kernels.word_loglik_rows(nwk, np.ones(V), beta) \
        + kernels.totals_loglik(nk, V * beta)
    assert ll > ll0 * 0.8


def test_recovers_planted_topics():
    X, topics = lda_corpus(alpha=0.3)
    K, alpha, beta = 5, 0.3, 0.05
    V = X.shape[1]
    _, doc_ptr, words, z, ndk, nwk, nk = _start(X, K)
    for it in range(80):
        gibbs_sweep_mh(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, V * beta, it)
    assert matched_cosine(nwk.T + beta, topics) >= 0.9


@pytest.mark.parametrize("K", [200])
def test_heldout_close_to_sparse_lda(K):
    """Held-out document completion at a K where the alias tables matter:
    MH after 1.5x SparseLDA's sweeps within 1% of it. MH mixes less per
    sweep (measured here: 1.4% below after the same 40 sweeps, 0.5% after
    60, 0.1% after 40 with 4 MH steps per token)."""
    X, _ = lda_corpus(n_docs=600, doc_len=100, n_words=2000, n_topics=K // 4, alpha=0.1, eta=0.01, seed=5)
    test = X[500:]
    train = X[:500]
    alpha, beta = 0.1, 0.01
    V = X.shape[1]
    out = {}
    for name, sweeps in (("sparse", 40), ("mh", 60)):
        _, doc_ptr, words, z, ndk, nwk, nk = _start(train, K)
        for it in range(sweeps):
            kernels.SWEEPS[name](doc_ptr, words, z, ndk, nwk, nk, alpha, beta, V * beta, it)
        phi = (nwk.T + beta) / (nk[:, None] + V * beta)
        ll, n = document_completion(phi, test, alpha, max_iter=50, tol=0.0, random_state=0)
        out[name] = ll / n
    assert out["mh"] == pytest.approx(out["sparse"], rel=0.01), out


def test_fit_with_mh_sampler(lda_client):
    X, topics = lda_corpus(alpha=0.3)
    m = LatentDirichletAllocation(5, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=80, evaluate_every=0,
                                  consistency=dask_ps.BSP(), sampler="mh", client=lda_client,
                                  random_state=0).fit(X)
    assert matched_cosine(m.components_, topics) >= 0.9


# --- the overlapped iteration (_gibbs_overlap, opt-in: ps.lda.overlap) --------------------------


def test_row_deltas_equal_the_rows_change():
    from dask_ps.decomposition._lda_kernels import row_deltas

    rng = np.random.default_rng(0)
    V, K, n = 30, 7, 500
    words = rng.integers(0, V, n)
    local = np.unique(words)
    position = np.full(V, -1)
    position[local] = np.arange(local.size)
    z_before = rng.integers(0, K, n).astype(np.int32)
    z_after = z_before.copy()
    moved = rng.random(n) < 0.3
    z_after[moved] = rng.integers(0, K, moved.sum())
    changed, delta = row_deltas(words, z_before, z_after, position, K, np.int32(0))
    full = np.zeros((V, K), np.int64)
    np.add.at(full, (words, z_after), 1)
    np.add.at(full, (words, z_before), -1)
    expected = np.flatnonzero(np.isin(local, words[z_before != z_after]))
    np.testing.assert_array_equal(changed, expected)
    np.testing.assert_array_equal(delta, full[local][expected])
    assert delta.dtype == np.int32


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


@pytest.mark.parametrize("model", [dask_ps.BSP(), None])
def test_fit_with_overlap(lda_client, model):
    import dask

    X, topics = lda_corpus(alpha=0.3)
    with dask.config.set({"ps.lda.overlap": True}):
        m = LatentDirichletAllocation(5, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=60, evaluate_every=20,
                                      consistency=model, n_partitions=2, client=lda_client,
                                      random_state=0).fit(X)
    # the count tables equal the assignments: every token counted once
    assert (m.components_ - 0.05).sum() == pytest.approx(X.sum())
    assert [h[0] for h in m.loglik_history_][-1] == 60
    assert matched_cosine(m.components_, topics) >= 0.9
