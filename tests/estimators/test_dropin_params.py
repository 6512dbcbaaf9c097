"""Every parameter of scikit-learn's SGDClassifier, SGDRegressor and
LatentDirichletAllocation is accepted (issue 24, item 1): ``n_jobs`` is the
number of participants, LDA's online variational Bayes parameters are
validated and documented, and LDA has scikit-learn's ``bound_``,
``exp_dirichlet_component_``, ``perplexity(sub_sampling=)``,
``transform(normalize=)``, empty documents and ``partial_fit``.

On 3860c22 ``SGDClassifier(n_jobs=-1)`` and every LDA parameter of online
variational Bayes raised ``TypeError``, LDA had none of those attributes or
arguments and refused a corpus of empty documents.
"""

from __future__ import annotations

import inspect
import warnings

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.linalg import block_diag
from scipy.special import digamma
from sklearn import decomposition as sk_decomposition
from sklearn import linear_model as sk_linear_model
from sklearn.utils._param_validation import InvalidParameterError

pytest.importorskip("numba")

from dask_ps.decomposition import LatentDirichletAllocation  # noqa: E402
from dask_ps.linear_model import SGDClassifier, SGDRegressor  # noqa: E402

PAIRS = [
    (SGDClassifier, sk_linear_model.SGDClassifier),
    (SGDRegressor, sk_linear_model.SGDRegressor),
    (LatentDirichletAllocation, sk_decomposition.LatentDirichletAllocation),
]


@pytest.mark.parametrize("ours, theirs", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_every_scikit_learn_parameter_is_accepted_and_validated(ours, theirs):
    params = inspect.signature(ours).parameters
    missing = [k for k in inspect.signature(theirs).parameters if k not in params]
    assert not missing
    assert set(ours._parameter_constraints) == set(params)
    documented = inspect.signature(theirs).parameters if ours is LatentDirichletAllocation else ["n_jobs"]
    entries = {n.strip() for line in ours.__doc__.splitlines() if line.startswith("    ") and " : " in line
               and not line.startswith("     ") for n in line.split(" : ")[0].split(",")}
    for name in documented:  # what it means here: a numpydoc entry
        assert name in entries, name
    ours(**{k: v.default for k, v in inspect.signature(theirs).parameters.items()})  # scikit-learn's defaults


@pytest.mark.parametrize("est", [
    LatentDirichletAllocation(learning_method="variational"),
    LatentDirichletAllocation(learning_decay=1.5),
    LatentDirichletAllocation(batch_size=0),
    LatentDirichletAllocation(total_samples=0),
    LatentDirichletAllocation(n_jobs="two"),
    SGDClassifier(n_jobs=1.5),
], ids=str)
def test_parameters_go_through_scikit_learns_validation(est):
    with pytest.raises(InvalidParameterError):
        est.fit(np.ones((4, 3)), [0, 1, 0, 1])


def test_n_jobs_is_the_number_of_participants(client):
    rng = np.random.RandomState(0)
    X = rng.randn(400, 5)
    y = (X[:, 0] > 0).astype(int)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 100}):
        for n_jobs, expected in [(None, 2), (-1, 2), (1, 1), (-2, 1), (3, 3), (8, 4)]:
            est = SGDClassifier(n_jobs=n_jobs, max_iter=3, tol=None, random_state=0, client=client).fit(X, y)
            assert len(est.metrics_) == expected, n_jobs
    with pytest.raises(ValueError, match="n_jobs == 0"):
        SGDRegressor(n_jobs=0, client=client).fit(X, X[:, 0])


def test_n_jobs_caps_a_dask_input_held_by_more_workers(client):
    """Blocks placed on two workers (scattered there, not left to Dask's
    placement): one participant per holding worker where the rows allow
    (``ps.sgd.min-samples-per-participant``), one with ``n_jobs=1`` or at
    the default row count a participant. The two-participant fit comes first: the ``n_jobs=1`` fit copies
    the other worker's blocks to its own, and Dask's active memory manager
    may then drop either copy, so what holds the blocks after it is Dask's
    choice (the order the other way round failed one run in a few)."""
    da = pytest.importorskip("dask.array")
    rng = np.random.RandomState(0)
    X = rng.randn(400, 5)
    y = X @ np.arange(5.0)
    workers = sorted(client.scheduler_info()["workers"])[:2]
    xs, ys = [], []
    for i in range(8):  # 4 blocks of 50 rows on each of 2 workers
        a, b, w = 50 * i, 50 * (i + 1), workers[i % 2]
        xs.append(da.from_delayed(client.scatter(X[a:b], workers=[w], hash=False), shape=(50, 5), dtype=X.dtype))
        ys.append(da.from_delayed(client.scatter(y[a:b], workers=[w], hash=False), shape=(50,), dtype=y.dtype))
    dX, dy = da.concatenate(xs), da.concatenate(ys)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 200}):
        both = SGDRegressor(max_iter=3, tol=None, random_state=0, client=client).fit(dX, dy)
    assert len(both.metrics_) == 2
    # at the default (10,000 rows a participant) 400 rows are one participant's, as an in-memory input's
    default = SGDRegressor(max_iter=3, tol=None, random_state=0, client=client).fit(dX, dy)
    one = SGDRegressor(n_jobs=1, max_iter=3, tol=None, random_state=0, client=client).fit(dX, dy)
    for est in (default, one):
        assert len(est.metrics_) == 1
        assert sum(m["samples"] for m in est.metrics_) == 3 * 400


def test_n_jobs_above_the_workers_runs_several_participants_on_a_worker(client):
    """A dask input's blocks on each worker are cut into several parts when
    ``n_jobs`` asks for more participants than workers hold blocks (threads
    of one worker process), as many as there are blocks, and no more than
    the rows allow."""
    da = pytest.importorskip("dask.array")
    rng = np.random.RandomState(0)
    X = rng.randn(800, 5)
    y = X @ np.arange(5.0)
    workers = sorted(client.scheduler_info()["workers"])
    xs, ys = [], []
    for i in range(8):  # 4 blocks of 100 rows on each of the 2 workers
        a, b = 100 * i, 100 * (i + 1)
        w = workers[i * len(workers) // 8]
        fx = client.scatter(X[a:b], workers=[w], hash=False)
        fy = client.scatter(y[a:b], workers=[w], hash=False)
        xs.append(da.from_delayed(fx, shape=(100, 5), dtype=X.dtype))
        ys.append(da.from_delayed(fy, shape=(100,), dtype=y.dtype))
    dX, dy = da.concatenate(xs), da.concatenate(ys)
    # rows allowing a participant per block (ps.sgd.min-samples-per-participant); under 400 rows a
    # participant, n_jobs=4 gets 2 (an in-memory input of 800 rows gets no more either)
    for n_jobs, expected, rows in [(None, len(workers), 100), (4, 4, 100), (5, 5, 100), (8, 8, 100), (12, 8, 100),
                                   (4, 2, 400)]:
        with dask.config.set({"ps.sgd.min-samples-per-participant": rows}):
            est = SGDRegressor(n_jobs=n_jobs, max_iter=3, tol=None, random_state=0, client=client).fit(dX, dy)
        assert len(est.metrics_) == expected, n_jobs
        assert sum(m["samples"] for m in est.metrics_) == 3 * 800
        assert est.score(X, y) > 0.99


def _blocks():
    """scikit-learn's test corpus: 3 topics of 3 words each, 9 documents."""
    return sp.csr_matrix(block_diag(*[np.full((3, 3), 3)] * 3))


def test_lda_online_learning_parameters_are_accepted(client):
    X = _blocks()
    lda = LatentDirichletAllocation(3, learning_method="online", learning_offset=5.0, learning_decay=0.9,
                                    batch_size=2, total_samples=100, perp_tol=1.0, n_jobs=2, max_iter=20,
                                    random_state=0, client=client).fit(X)
    for topic in lda.components_:
        assert tuple(sorted(np.argsort(topic)[-3:])) in [(0, 1, 2), (3, 4, 5), (6, 7, 8)]


def test_lda_n_jobs_caps_the_partitions(client):
    rng = np.random.RandomState(0)
    X = rng.randint(0, 5, size=(60, 20))
    with dask.config.set({"ps.lda.min-tokens-per-participant": 10}):
        for n_jobs, expected in [(None, 4), (1, 1), (-2, 3), (6, 6)]:  # 2 workers x 2 threads
            lda = LatentDirichletAllocation(3, n_jobs=n_jobs, max_iter=2, random_state=0, client=client).fit(X)
            assert len(lda.metrics_) == expected, n_jobs


@pytest.fixture(scope="module")
def fitted_lda(client):
    rng = np.random.RandomState(0)
    X = sp.csr_matrix(rng.randint(0, 4, size=(40, 30)))
    return X, LatentDirichletAllocation(4, max_iter=20, random_state=0, client=client).fit(X)


def test_lda_bound_is_the_training_perplexity(fitted_lda):
    X, lda = fitted_lda
    assert np.isclose(lda.bound_, lda.perplexity(X), rtol=1e-12)
    # scikit-learn's sub_sampling: X taken as a sample of total_samples documents (issue 35;
    # equality with scikit-learn's: tests/decomposition/test_lda_sklearn_meaning.py)
    assert lda.perplexity(X, sub_sampling=True) != lda.perplexity(X, sub_sampling=False)


def test_lda_exp_dirichlet_component(fitted_lda):
    _, lda = fitted_lda
    c = lda.components_
    np.testing.assert_allclose(lda.exp_dirichlet_component_,
                               np.exp(digamma(c) - digamma(c.sum(axis=1))[:, None]))


def test_lda_transform_unnormalized(fitted_lda):
    X, lda = fitted_lda
    theta = lda.transform(X)
    raw = lda.transform(X, normalize=False)
    np.testing.assert_allclose(raw / raw.sum(axis=1, keepdims=True), theta)
    # the posterior Dirichlet parameters: expected topic counts + alpha
    np.testing.assert_allclose(raw.sum(axis=1), np.asarray(X.sum(axis=1)).ravel() + 4 * lda.doc_topic_prior_)
    np.testing.assert_allclose(lda.transform(np.zeros((1, 30)), normalize=False), [[lda.doc_topic_prior_] * 4])


def test_lda_perplexity_with_given_distributions(fitted_lda):
    X, lda = fitted_lda
    # scikit-learn's helper takes the unnormalized distributions (its E-step's gamma)
    assert np.isclose(lda._perplexity_precomp_distr(X, lda.transform(X, normalize=False)), lda.perplexity(X))
    with pytest.raises(ValueError, match="Number of samples"):
        lda._perplexity_precomp_distr(X, np.ones((41, 4)))
    with pytest.raises(ValueError, match="Number of topics"):
        lda._perplexity_precomp_distr(X, np.ones((40, 5)))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_lda_empty_documents_as_scikit_learn(client, sparse):
    Z = np.zeros((5, 4))
    lda = LatentDirichletAllocation(max_iter=750, client=client).fit(sp.csr_matrix(Z) if sparse else Z)
    np.testing.assert_allclose(lda.components_.sum(axis=0), np.ones(4))
    assert np.isnan(lda.bound_) and lda.n_tokens_ == 0
    np.testing.assert_allclose(lda.transform(Z), np.full((5, 10), 0.1))


def test_lda_float32_input_gives_float32_topics(client):
    rng = np.random.RandomState(0)
    X64 = rng.randint(0, 3, size=(20, 10)).astype(np.float64)
    lda32 = LatentDirichletAllocation(5, random_state=0, client=client).fit(X64.astype(np.float32))
    lda64 = LatentDirichletAllocation(5, random_state=0, client=client).fit(X64)
    assert lda32.components_.dtype == lda32.exp_dirichlet_component_.dtype == np.float32
    assert lda64.components_.dtype == np.float64
    assert lda32.transform(X64.astype(np.float32)).dtype == np.float32
    np.testing.assert_allclose(lda32.components_, lda64.components_, rtol=1e-6)


@pytest.mark.parametrize("kept_tokens", [0, 200000], ids=["none-kept", "kept"])
def test_lda_partial_fit_adds_documents_to_the_fitted_counts(client, kept_tokens):
    import dask

    X = _blocks()
    with dask.config.set({"ps.lda.partial-fit-kept-tokens": kept_tokens}):
        lda = LatentDirichletAllocation(3, max_iter=30, random_state=0, client=client)
        lda.partial_fit(X)  # the first call is fit
        first = lda.components_.copy()
        words_of = {k: set(np.argsort(first[k])[-3:]) for k in range(3)}
        # documents of the first topic's words only
        new = sp.csr_matrix(np.tile(np.isin(np.arange(9), sorted(words_of[0])) * 2, (4, 1)))
        lda.partial_fit(new)
    added = lda.components_ - first
    assert lda.n_tokens_ == X.sum() + new.sum()
    if not kept_tokens:  # the fitted counts stay: no earlier document is resampled
        assert np.all(added >= -1e-9)
    np.testing.assert_allclose(added.sum(), new.sum())
    # sampled against the fitted counts: the new tokens join the topic that holds their words
    assert added[0].sum() >= 0.9 * new.sum()
    with pytest.raises(ValueError, match="features"):
        lda.partial_fit(np.ones((2, 5)))


def test_lda_partial_fit_of_a_dask_array(client):
    da = pytest.importorskip("dask.array")
    X = _blocks()
    lda = LatentDirichletAllocation(3, max_iter=20, random_state=0, client=client).fit(X)
    before = lda.components_.copy()
    lda.partial_fit(da.from_array(X.toarray(), chunks=(3, 9)))
    np.testing.assert_allclose((lda.components_ - before).sum(), X.sum())
    for topic in lda.components_:
        assert tuple(sorted(np.argsort(topic)[-3:])) in [(0, 1, 2), (3, 4, 5), (6, 7, 8)]


def test_lda_partial_fit_same_documents_as_scikit_learns_test(client):
    X = _blocks()
    lda = LatentDirichletAllocation(3, learning_offset=10.0, total_samples=100, random_state=0, client=client)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            lda.partial_fit(X)
    assert lda.n_tokens_ == 3 * X.sum()
    for topic in lda.components_:
        assert tuple(sorted(np.argsort(topic)[-3:])) in [(0, 1, 2), (3, 4, 5), (6, 7, 8)]


def test_sgd_loss_functions_table_and_zero_validation_weights():
    """scikit-learn's ``loss_functions`` table (its tests list the losses
    from it), and its error when the validation set's weights are all zero
    (here: every weight is zero, which any split gives)."""
    assert set(SGDClassifier.loss_functions) == set(sk_linear_model.SGDClassifier.loss_functions)
    assert SGDRegressor(epsilon=0.9).loss_functions["huber"][1] == 0.1
    X, y = np.random.RandomState(0).randn(40, 3), np.arange(40) % 2
    with pytest.raises(ValueError, match="The sample weights for validation set are all zero"):
        SGDClassifier(early_stopping=True, random_state=0).fit(X, y, sample_weight=np.zeros(40))
    with pytest.raises(ValueError, match="at least one non-zero"):
        SGDClassifier(random_state=0).fit(X, y, sample_weight=np.zeros(40))
