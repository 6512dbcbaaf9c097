"""LatentDirichletAllocation as a drop-in for scikit-learn's LDA, tomotopy
and gensim (issue 13): reproducible fits, float input and ``check_estimator``,
``score``/``perplexity`` with scikit-learn's meaning, top words, a training
history comparable along the fit, and live verbose output.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("numba")

import dask_ps  # noqa: E402
from dask_ps.decomposition import LatentDirichletAllocation  # noqa: E402
from ps_fixtures import lda_corpus  # noqa: E402


@pytest.fixture(scope="module")
def reuters():
    lda = pytest.importorskip("lda")
    import lda.datasets

    return sp.csr_matrix(lda.datasets.load_reuters())


# --- 1. reproducible mode ---------------------------------------------------------------------


def test_bsp_fits_with_the_same_random_state_are_identical(lda_client):
    """BSP + the same random_state + the same partitions: the same chain,
    five fits in a row from a sparse count matrix, and two from the same
    counts as a dense array (the same chain as the sparse input's: 7 fits
    where a sparse and a dense series of five took 10).

    Before the count tables were summed per clock under BSP, a read at clock
    c also saw whatever pushes of clock c faster participants had made, so
    two such fits (4 participants on 2 workers) differed by up to 26 counts."""
    X, _ = lda_corpus()
    kw = dict(max_iter=30, evaluate_every=10, consistency=dask_ps.BSP(), n_partitions=4, client=lda_client,
              random_state=0)
    fits = [LatentDirichletAllocation(5, **kw).fit(x) for x in [X] * 5 + [X.toarray()] * 2]
    for other in fits[1:]:
        np.testing.assert_array_equal(other.components_, fits[0].components_)
        assert [(i, ll) for i, _, ll in other.loglik_history_] == [(i, ll) for i, _, ll in fits[0].loglik_history_]
    # the evaluations during the fit are now exact too: each participant's
    # view at iteration 30 would be the final tables (checked through the
    # chunked fit below), and a different seed gives a different chain
    other_seed = LatentDirichletAllocation(5, **{**kw, "random_state": 1}).fit(X)
    assert not np.array_equal(other_seed.components_, fits[0].components_)


def test_reproducible_across_chunks_with_several_participants(lda_client):
    """A fit in chunks (assignments kept in replicated tables between runs)
    samples like one run, also with several participants under BSP."""
    X, _ = lda_corpus(n_docs=120, doc_len=40, n_words=80, n_topics=4, seed=5)
    kw = dict(max_iter=9, evaluate_every=3, consistency=dask_ps.BSP(), n_partitions=3, client=lda_client,
              random_state=0)
    one = LatentDirichletAllocation(4, **kw).fit(X)
    chunked = LatentDirichletAllocation(4, replication=2, checkpoint_every=3, **kw).fit(X)
    np.testing.assert_array_equal(chunked.components_, one.components_)
    assert [(i, ll) for i, _, ll in chunked.loglik_history_] == [(i, ll) for i, _, ll in one.loglik_history_]
    # under BSP the participants' evaluations in the loop are exact
    ll_by_it = {i: ll for i, _, ll in one.loglik_history_}
    assert chunked.loglik_history_[-1][2] == pytest.approx(ll_by_it[9], rel=1e-12)


# --- 5. the training history is comparable along the fit ------------------------------------------


@pytest.mark.parametrize("model", [None, dask_ps.ASP()], ids=["default", "ASP"])
def test_history_starts_from_the_starting_state(lda_client, reuters, model):
    """``loglik_history_[0]`` is the log-likelihood of the random starting
    assignment, the worst of the fit.

    With staleness, the first sweeps used to read tables without the other
    participants' starting counts, and the first evaluation summed each
    participant's own fraction of the tokens: on Reuters with 8
    participants it came out 15-18% better than the exact value (which a
    BSP fit with the same seeds and partitions computes), and the issue saw
    it better than iteration 10."""
    kw = dict(max_iter=20, evaluate_every=10, n_partitions=8, client=lda_client, random_state=0)
    exact = LatentDirichletAllocation(20, consistency=dask_ps.BSP(), **kw).fit(reuters)
    stale = LatentDirichletAllocation(20, consistency=model, **kw).fit(reuters)
    start = exact.loglik_history_[0][2]
    hist = [ll for _, _, ll in stale.loglik_history_]
    assert [i for i, _, _ in stale.loglik_history_] == [0, 10, 20]
    assert abs(hist[0] - start) / abs(start) < 0.03, (hist[0], start)
    assert hist[0] < hist[1] < hist[2]


def test_reproducible_whatever_the_cluster(lda_client):
    """The same fit on 2 worker processes and on an in-process cluster (the
    embedded default's kind). On the in-process cluster a whole-table pull
    of the clock-summed totals used to hand the participant the server's
    own array, which its next push then changed in place: its own pushes
    counted twice and the fits differed (fixed in the core by 4544337:
    replies are read-only)."""
    from distributed import Client, LocalCluster

    X, _ = lda_corpus(n_docs=80, doc_len=40, n_words=60, n_topics=3, seed=7)
    kw = dict(max_iter=10, evaluate_every=5, consistency=dask_ps.BSP(), n_partitions=3, random_state=0)
    ref = LatentDirichletAllocation(3, client=lda_client, **kw).fit(X)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        for _ in range(2):
            threads = LatentDirichletAllocation(3, client=c, **kw).fit(X)
            np.testing.assert_array_equal(threads.components_, ref.components_)


# --- 2. float input, check_estimator --------------------------------------------------------------


def test_float_counts_are_rounded_with_a_warning(lda_client):
    """Floats are rounded to the nearest integer (numpy.rint) with a
    DataConversionWarning: the fit is the fit of the rounded counts."""
    from sklearn.exceptions import DataConversionWarning

    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=40, n_topics=3, seed=2)
    noisy = X.toarray() + np.random.default_rng(0).uniform(-0.45, 0.45, size=X.shape)
    noisy = np.maximum(noisy, 0)
    kw = dict(max_iter=5, consistency=dask_ps.BSP(), n_partitions=2, client=lda_client, random_state=0)
    ref = LatentDirichletAllocation(3, **kw).fit(np.rint(noisy).astype(np.int64))
    with pytest.warns(DataConversionWarning, match=r"rounded to the nearest integer \(numpy.rint"):
        m = LatentDirichletAllocation(3, **kw).fit(noisy)
    np.testing.assert_array_equal(m.components_, ref.components_)
    assert m.n_tokens_ == np.rint(noisy).sum()
    with pytest.warns(DataConversionWarning):
        LatentDirichletAllocation(3, **kw).fit(sp.csr_matrix(noisy))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LatentDirichletAllocation(3, **kw).fit(X.astype(np.float32))  # whole numbers: no warning
    with pytest.raises(ValueError, match="Negative values"):
        LatentDirichletAllocation(3, **kw).fit(-noisy)
    with pytest.raises(ValueError, match="no tokens"), pytest.warns(DataConversionWarning):
        LatentDirichletAllocation(3, **kw).fit(np.full((5, 4), 0.3))  # tf-idf-like: nothing left


@pytest.mark.parametrize("kind", ["dense", "csr", "dask"])
def test_a_count_too_large_for_a_token_array_is_refused_where_it_is(lda_client, kind):
    """A count of 1e20 (scikit-learn's variational LDA takes it) wrapped to a
    negative int64 and failed in ``np.repeat`` on a worker; 3e9 asked for
    12 GB of token arrays. Now a ValueError at the caller naming the count,
    where it is (in memory) and the limit."""
    X = np.random.default_rng(0).poisson(0.5, (60, 30)).astype(float)
    X[4, 7] = 1e20
    if kind == "csr":
        X = sp.csr_matrix(X)
    elif kind == "dask":
        X = pytest.importorskip("dask.array").from_array(X, chunks=(30, 30))
    where = "" if kind == "dask" else r" at \(row, column\) \(4, 7\)"
    with pytest.raises(ValueError, match=rf"count of 1e\+20{where}.*at most 2147483647"):
        LatentDirichletAllocation(3, max_iter=2, client=lda_client, random_state=0).fit(X)
    fitted = LatentDirichletAllocation(3, max_iter=2, client=lda_client, random_state=0).fit(np.ones((4, 30)))
    with pytest.raises(ValueError, match="count of 3e\\+09"):
        fitted.transform(np.full((2, 30), 3e9))


def test_partial_fit_keeps_the_fitted_dtype(lda_client):
    """scikit-learn's online update keeps ``components_``'s dtype whatever the
    batch's; a float64 model given a float32 batch became float32."""
    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=40, n_topics=3, seed=2)
    kw = dict(max_iter=2, client=lda_client, random_state=0)
    m = LatentDirichletAllocation(3, **kw).partial_fit(X.astype(np.float64))
    m.partial_fit(X.astype(np.float32))
    assert m.components_.dtype == np.float64 and m.exp_dirichlet_component_.dtype == np.float64
    m32 = LatentDirichletAllocation(3, **kw).partial_fit(X.astype(np.float32))
    m32.partial_fit(X.astype(np.float64))
    assert m32.components_.dtype == np.float32


def test_the_perplexity_of_documents_without_words_is_infinite_as_scikit_learns(lda_client):
    from sklearn.decomposition import LatentDirichletAllocation as SkLDA

    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=40, n_topics=3, seed=2)
    m = LatentDirichletAllocation(3, max_iter=2, client=lda_client, random_state=0).fit(X)
    sk = SkLDA(3, max_iter=2, random_state=0).fit(X)
    with pytest.warns(RuntimeWarning):
        theirs = sk.perplexity(np.zeros((3, 40)))
    with pytest.warns(RuntimeWarning, match="no words"):
        assert m.perplexity(np.zeros((3, 40))) == theirs == np.inf


def test_float_chunks_of_a_dask_array_warn_on_the_client(lda_client):
    da = pytest.importorskip("dask.array")
    from sklearn.exceptions import DataConversionWarning

    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=40, n_topics=3, seed=2)
    dX = da.from_array(X.toarray() * 1.1, chunks=(30, 40))
    with pytest.warns(DataConversionWarning, match="rounded"):
        m = LatentDirichletAllocation(3, max_iter=3, client=lda_client, random_state=0).fit(dX)
    assert m.n_tokens_ == np.rint(X.toarray() * 1.1).sum()


def _check_estimator_instances():
    # BSP: reproducible, so the checks that compare two fits run too.
    return [LatentDirichletAllocation(3, max_iter=5, consistency=dask_ps.BSP())]


try:
    from sklearn.utils.estimator_checks import parametrize_with_checks
except ImportError:  # pragma: no cover
    parametrize_with_checks = None


@pytest.mark.skipif(parametrize_with_checks is None, reason="scikit-learn without parametrize_with_checks")
@(parametrize_with_checks(_check_estimator_instances()) if parametrize_with_checks else (lambda f: f))
def test_sklearn_check_estimator(estimator, check):
    """scikit-learn's estimator checks, on the embedded (in-process) cluster
    (client=None): all pass, as for scikit-learn's own LatentDirichletAllocation
    (47 passed, array API skipped; before: 17 passed, 27 failed on float input).
    About 6 s in all."""
    import warnings

    from sklearn.exceptions import DataConversionWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataConversionWarning)  # the checks' random floats are rounded
        check(estimator)


def test_check_estimator_default_consistency_is_tagged_non_deterministic():
    from sklearn.utils import get_tags

    assert get_tags(LatentDirichletAllocation()).non_deterministic  # SSP(2) by default
    assert not get_tags(LatentDirichletAllocation(consistency=dask_ps.BSP())).non_deterministic
    assert get_tags(LatentDirichletAllocation(consistency=dask_ps.BSP(), totals_consistency="asp")).non_deterministic


# --- 3. score / perplexity with scikit-learn's meaning: test_lda_sklearn_meaning.py ----------------


@pytest.fixture(scope="module")
def fitted(lda_client):
    X, topics = lda_corpus()
    m = LatentDirichletAllocation(5, doc_topic_prior=0.3, topic_word_prior=0.05, max_iter=40,
                                  consistency=dask_ps.BSP(), client=lda_client, random_state=0).fit(X)
    return m, X


# --- 4. top words -------------------------------------------------------------------------------


def test_top_words(fitted):
    m, X = fitted
    names = np.array([f"w{j}" for j in range(X.shape[1])])
    top = m.top_words(names, n=4)
    assert len(top) == 5 and all(len(t) == 4 for t in top)
    phi = m.components_ / m.components_.sum(1, keepdims=True)
    for k, words in enumerate(top):
        expected = np.argsort(-phi[k], kind="stable")[:4]
        assert [w for w, _ in words] == [f"w{j}" for j in expected]
        assert [p for _, p in words] == pytest.approx(phi[k, expected].tolist())
        assert all(isinstance(w, str) and isinstance(p, float) for w, p in words)
    by_index = m.top_words(n=2)  # no names: column indices
    assert by_index[0] == [(int(j), pytest.approx(phi[0, j])) for j in np.argsort(-phi[0], kind="stable")[:2]]
    assert all(isinstance(w, int) for w, _ in by_index[0])
    assert len(m.top_words(n=10_000)[0]) == X.shape[1]
    with pytest.raises(ValueError, match="feature_names has shape"):
        m.top_words(names[:-1])
    with pytest.raises(ValueError, match="positive int"):
        m.top_words(n=0)


def test_top_words_default_to_dataframe_column_names(lda_client):
    pd = pytest.importorskip("pandas")
    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=20, n_topics=2, seed=3)
    df = pd.DataFrame(X.toarray(), columns=[f"word{j}" for j in range(20)])
    m = LatentDirichletAllocation(2, max_iter=5, client=lda_client, random_state=0).fit(df)
    assert all(w.startswith("word") for topic in m.top_words(n=3) for w, _ in topic)


# --- 6. live progress ---------------------------------------------------------------------------

_LINE_SEEN = threading.Event()


class _WaitForTheLine:
    """Delay hook (participants, after each sweep): after sweep 6 every
    participant waits until the client has printed iteration 5's line, so
    that line must appear while the fit is still sampling."""

    waited: list = []

    def __call__(self, rank, it, dt):
        if it == 6:
            _WaitForTheLine.waited.append(_LINE_SEEN.wait(30))
        return 0.0


def test_verbose_prints_while_the_fit_runs(monkeypatch):
    """verbose=1 prints to standard output without any logging set up, one
    line per iteration in scikit-learn's format, the evaluations' with the
    perplexity and dask_ps's log-likelihood, tokens/s and staleness of the
    participants' reads after it, while the participants still sample.
    (Live since the estimator refactor of issue 11; a line per iteration in
    scikit-learn's format since issue 24.)"""
    import io
    import sys

    import dask
    from distributed import Client, LocalCluster

    class Recorder(io.StringIO):
        def write(self, text):
            if "iteration: 5 of max_iter: 10" in text:
                _LINE_SEEN.set()
            return super().write(text)

    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=50, n_topics=3, seed=2)
    _LINE_SEEN.clear()
    _WaitForTheLine.waited = []
    out = Recorder()
    # in-process workers: the participants' hook sees this process's event
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c, dask.config.set({"ps.lda.progress-interval": "50ms"}):
        est = LatentDirichletAllocation(3, max_iter=10, evaluate_every=5, verbose=1, consistency=dask_ps.BSP(),
                                        n_partitions=2, client=c, random_state=0)
        est._sweep_delay = _WaitForTheLine()
        monkeypatch.setattr(sys, "stdout", out)
        est.fit(X)
        monkeypatch.undo()
    assert _WaitForTheLine.waited == [True, True], "iteration 5's line was not printed while the fit ran"
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0].split(" (")[0] for line in lines] == [
        f"iteration: {n} of max_iter: 10" for n in range(1, 11)]
    assert lines[0] == "iteration: 1 of max_iter: 10"
    assert lines[4].startswith("iteration: 5 of max_iter: 10, perplexity: ")
    assert "log-likelihood" in lines[4] and "tokens/s" in lines[4] and "staleness 0.00 (max 0)" in lines[4]  # BSP
    assert lines[-1].startswith(f"iteration: 10 of max_iter: 10, perplexity: {est.bound_:.4f} (bound_, scikit-learn's "
                                "variational bound; the lines before: the sampler's; log-likelihood ")


@pytest.mark.parametrize("evaluate_every, n_partitions, chunks", [
    (0, 1, None), (1, 1, None), (2, 1, None), (3, 2, None), (3, 2, 4), (0, 2, 4),
], ids=["eval0", "eval1", "eval2", "eval3-two-parts", "eval3-two-parts-chunks", "eval0-two-parts-chunks"])
def test_verbose_prints_scikit_learns_lines(lda_client, capsys, caplog, evaluate_every, n_partitions, chunks):
    """scikit-learn's verbose output (its test_online_lda.py::test_verbosity
    counts the lines and the "perplexity" in them): a line per iteration 1
    .. max_iter, with the perplexity on the iterations that are multiples
    of evaluate_every (the training perplexity, bound_ on the last one),
    nothing else on standard output, also over the runs of a checkpointed
    fit; the random start and the summary go to the logger."""
    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=50, n_topics=3, seed=2)
    tolerance = {} if chunks is None else dict(replication=2, checkpoint_every=chunks)
    with caplog.at_level(logging.INFO, logger="dask_ps.decomposition"):
        est = LatentDirichletAllocation(3, max_iter=10, evaluate_every=evaluate_every, verbose=True,
                                        n_partitions=n_partitions, client=lda_client, random_state=0,
                                        **tolerance).fit(X)
    lines = capsys.readouterr().out.splitlines()
    evaluated = [n for n in range(1, 11) if evaluate_every > 0 and n % evaluate_every == 0]
    assert [line.split(",")[0].split(" (")[0] for line in lines] == [
        f"iteration: {n} of max_iter: 10" for n in range(1, 11)]
    assert [n for n, line in enumerate(lines, 1) if "perplexity" in line] == evaluated
    assert all(line == f"iteration: {n} of max_iter: 10" for n, line in enumerate(lines, 1) if n not in evaluated)
    perplexities = [float(line.split("perplexity: ")[1].split()[0]) for line in lines if "perplexity" in line]
    if 10 in evaluated:
        assert perplexities[-1] == pytest.approx(est.bound_, abs=1e-4)
    # the sampler's training perplexity (the lines before the last) falls along the fit and ends
    # below bound_, scikit-learn's, of a lower bound of the likelihood (issue 35)
    sampler = perplexities[:-1] if 10 in evaluated else perplexities
    if sampler:
        assert sampler[0] >= sampler[-1] and sampler[-1] < est.bound_, (sampler, est.bound_)
    assert est.n_iter_ == 10
    if evaluate_every:
        assert "iteration: 0 of max_iter: 10 (the random start)" in caplog.text
    assert "LatentDirichletAllocation: 10 iterations" in caplog.text


@pytest.mark.parametrize("evaluate_every", [5, 0])
def test_progress_bar(lda_client, capsys, evaluate_every):
    """ps.progress-bar: a tqdm bar over the iterations, verbose or not,
    moved by the evaluations while the fit runs and to the end after it."""
    pytest.importorskip("tqdm")
    import dask

    X, _ = lda_corpus(n_docs=60, doc_len=30, n_words=50, n_topics=3, seed=2)
    with dask.config.set({"ps.progress-bar": True}):
        LatentDirichletAllocation(3, max_iter=12, evaluate_every=evaluate_every, replication=2, checkpoint_every=4,
                                  client=lda_client, random_state=0).fit(X)
    err = capsys.readouterr().err
    assert "LatentDirichletAllocation" in err and "12/12" in err and "13/12" not in err


def test_client_may_be_a_scheduler_address(lda_client):
    """As every dask_ps estimator: client="tcp://..." (LDA refused it with a TypeError)."""
    X, _ = lda_corpus(n_docs=40, doc_len=30, n_words=50, n_topics=3, seed=2)
    m = LatentDirichletAllocation(3, max_iter=3, client=lda_client.scheduler.address, random_state=0).fit(X)
    assert m.components_.shape == (3, 50)
    with pytest.raises(TypeError, match="client must be"):
        LatentDirichletAllocation(3, client=42).fit(X)


def test_the_user_guides_example_finds_the_two_topics_it_prints(lda_client):
    """docs/user-guide.rst's LDA example printed mixed topics ("cat cats
    dogs / stocks chased dog") under its comment's separated ones: six
    short documents want a small ``doc_topic_prior``. Seeded, so BSP: the
    same topics on any cluster."""
    from sklearn.feature_extraction.text import CountVectorizer

    docs = ["the cat sat on the mat with another cat", "dogs and cats are pets", "a dog chased the cat",
            "stocks fell as markets closed", "the market rallied and stocks rose", "investors sold stocks"] * 20
    vectorizer = CountVectorizer(stop_words="english")
    X = vectorizer.fit_transform(docs)
    lda = LatentDirichletAllocation(2, max_iter=50, n_partitions=2, doc_topic_prior=0.1, random_state=0,
                                    client=lda_client).fit(X)
    top = [" ".join(w for w, _ in words) for words in lda.top_words(vectorizer.get_feature_names_out(), n=3)]
    assert top == ["stocks closed fell", "cat cats chased"]


def test_a_dask_dataframes_column_names_are_read_and_checked(lda_client):
    """A dask DataFrame was computed whole on the client and its names never
    read: ``feature_names_in_`` unset, and its columns reordered transformed
    silently wrong (0.95 off). Now scikit-learn's names and errors, and
    the frame stays on the workers (transform is lazy, as for a dask array)."""
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    C = pd.DataFrame(np.random.default_rng(0).poisson(0.5, size=(400, 30)), columns=[f"w{i}" for i in range(30)])
    Cd = dd.from_pandas(C, npartitions=4)
    m = LatentDirichletAllocation(3, max_iter=5, random_state=0, client=lda_client).fit(Cd)
    assert list(m.feature_names_in_) == list(C.columns)
    theta = m.transform(Cd)
    assert hasattr(theta, "dask")
    np.testing.assert_allclose(theta.compute(), m.transform(C), rtol=1e-12)
    with pytest.raises(ValueError, match="feature names should match"):
        m.transform(Cd[list(C.columns[::-1])])
    with pytest.raises(ValueError, match="feature names should match"):
        m.score(Cd[list(C.columns[::-1])])
    with pytest.raises(ValueError, match="feature names should match"):
        m.partial_fit(Cd[list(C.columns[::-1])])
    assert m.top_words(n=1)[0][0][0].startswith("w")


def test_a_dask_array_with_empty_chunks_fits_transforms_and_scores(lda_client):
    """A filtered dask array (a boolean mask) has empty chunks: ``fit`` failed
    in ``check_non_negative`` (the minimum of nothing), ``transform`` and
    ``score`` in scikit-learn's "0 sample(s)" check of each block."""
    da = pytest.importorskip("dask.array")
    X = np.random.default_rng(0).poisson(0.5, size=(400, 30)).astype(float)
    Xd = da.from_array(X, chunks=(100, 30))
    keep = da.from_array(np.r_[np.zeros(200, bool), np.ones(200, bool)], chunks=100)
    m = LatentDirichletAllocation(3, max_iter=3, random_state=0, client=lda_client).fit(X)
    np.testing.assert_allclose(m.transform(Xd[keep]).compute(), m.transform(X[200:]), rtol=1e-12)
    assert m.score(Xd[keep]) == pytest.approx(m.score(X[200:]), rel=1e-12)
    fitted = LatentDirichletAllocation(3, max_iter=3, random_state=0, client=lda_client).fit(Xd[keep])
    assert fitted.n_tokens_ == X[200:].sum()
