"""What a fitted ``LatentDirichletAllocation`` computes without a
cluster: ``transform``, ``score``, ``perplexity`` and ``top_words``, with
scikit-learn's definitions (its E-step and variational bound, ``_bound``),
on in-memory arrays here or a dask array's row blocks where they are.

A mixin of the estimator (the fit is ``_lda``'s job); it reads only the
fitted attributes (``components_``, ``doc_topic_prior_``,
``topic_word_prior_``) and the fold-in parameters.
"""

from __future__ import annotations

import warnings

from numbers import Integral

import dask
import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import _check_n_features, check_array, check_is_fitted, validate_data

from dask_ps._estimators import arrays, check_dask_X, is_dask_collection, map_row_blocks
from dask_ps.decomposition._bound import document_terms, expectations, topic_term
from dask_ps.decomposition._corpus import _check_counts
from dask_ps.decomposition._scoring import components_dtype


def _terms_block(block, est, whom):
    """Per document of one row block (of a dask array: a task): its term
    of the bound and its number of words, as two columns (none for an
    empty block: a filtered dask collection has them)."""
    X = est._check_X(block, whom, ensure_min_samples=0, names=False)
    X = sp.csr_matrix(X, dtype=np.float64)
    X.sum_duplicates()
    elog_t, exp_t = expectations(est.components_)
    terms, _ = document_terms(X, elog_t, exp_t, est.doc_topic_prior_, est.max_doc_update_iter,
                              est.mean_change_tol)
    return np.column_stack([terms, np.asarray(X.sum(axis=1)).ravel()])


def _transform_block(block, est, normalize=True):
    """``est.transform`` of one row block of a dask array (a task); an
    empty block gives no rows."""
    if block.shape[0] == 0:
        return np.empty((0, est.components_.shape[0]), dtype=components_dtype(block.dtype))
    # the collection's names were checked by the caller (check_dask_X): a
    # block has none, and scikit-learn would warn that it has not
    return est._transform_checked(est._check_X(block, "LatentDirichletAllocation.transform", names=False), normalize)


class TopicInference:
    """``transform``, ``score``, ``perplexity`` and ``top_words`` of a
    fitted LDA model (``components_`` and the priors), as scikit-learn's
    ``LatentDirichletAllocation`` computes them."""

    def _check_X(self, X, whom, ensure_min_samples=1, names=True):
        """``X`` checked as scikit-learn checks it (``names=False``: a dask
        collection's block, whose collection's names were checked)."""
        X = arrays.to_host(X)
        kw = dict(accept_sparse="csr", dtype=[np.float64, np.float32], ensure_min_samples=ensure_min_samples)
        if names:
            X = validate_data(self, X, reset=False, **kw)
        else:
            X = check_array(X, **kw)
            _check_n_features(self, X, reset=False)
        _check_counts(X, whom)
        return X

    def _unnormalized_transform(self, X):
        """scikit-learn's E-step on ``X`` (checked): ``gamma``, the
        variational Dirichlet parameters of each document's topic
        proportions, float64."""
        X = sp.csr_matrix(X, dtype=np.float64)
        X.sum_duplicates()
        elog_t, exp_t = expectations(self.components_)
        return document_terms(X, elog_t, exp_t, self.doc_topic_prior_, self.max_doc_update_iter,
                              self.mean_change_tol)[1]

    def transform(self, X, *, normalize=True):
        """Doc-topic distributions of ``X`` with the topics fixed: scikit-learn's E-step.

        As scikit-learn's ``transform``: the variational parameters
        ``gamma`` of each document's topic proportions, from ``gamma = 1``,
        updated ``gamma_k <- alpha + exp(E[log theta_k]) sum_w x_w
        exp(E[log beta_kw]) / sum_j exp(E[log theta_j]) exp(E[log beta_jw])``
        at most ``max_doc_update_iter`` times per document, stopping when
        the mean absolute change falls below ``mean_change_tol``; ``E[log
        beta]`` is the Dirichlet expectation of ``components_``. On the same
        ``components_`` and priors it returns scikit-learn's values (to
        floating-point rounding; computed in float64). Runs locally (no
        cluster); a dask array is transformed chunk by chunk, lazily.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            Non-negative counts (or weights).
        normalize : bool, default=True
            As scikit-learn's: False returns ``gamma`` itself (the expected
            topic counts of the document plus ``doc_topic_prior``), whose
            rows normalized are the distributions.

        Returns
        -------
        ndarray of shape (n_samples, n_components)
            Rows sum to 1 (``normalize``); empty documents get the uniform
            distribution (unnormalized: ``doc_topic_prior`` for every
            topic). float32 for float32 ``X``, else float64.
        """
        check_is_fitted(self)
        if is_dask_collection(X):  # a dask array or DataFrame (its names checked: check_dask_X)
            X = check_dask_X(self, X)
            dtype = components_dtype(X.dtype)
            return map_row_blocks(X, _transform_block, self, normalize,
                                  n_columns=self.components_.shape[0], dtype=dtype,
                                  meta=np.empty((0, 0), dtype=dtype))
        return self._transform_checked(self._check_X(X, "LatentDirichletAllocation.transform"), normalize)

    def _transform_checked(self, X, normalize):
        dtype = components_dtype(X.dtype)
        gamma = self._unnormalized_transform(X)
        if normalize:
            gamma /= gamma.sum(axis=1, keepdims=True)
        return gamma.astype(dtype, copy=False)

    def top_words(self, feature_names=None, n=10):
        """The ``n`` most probable words of every topic, with their
        probabilities (as tomotopy's ``get_topic_words`` and gensim's
        ``show_topics(formatted=False)``).

        Parameters
        ----------
        feature_names : array-like of shape (n_features,), default None
            The word of each column, e.g. a ``CountVectorizer``'s
            ``get_feature_names_out()``. None: ``feature_names_in_`` when the
            model was fitted on a DataFrame, else the column indices.
        n : int, default 10
            Words per topic (all of them when ``n >= n_features``).

        Returns
        -------
        list of n_components lists of (word, probability)
            Per topic, the words in decreasing order of ``p(word | topic)``
            (the normalized rows of ``components_``; ties in column order).

        Examples
        --------
        >>> for k, words in enumerate(lda.top_words(vectorizer.get_feature_names_out(), n=5)):  # doctest: +SKIP
        ...     print(k, " ".join(w for w, _ in words))
        """
        check_is_fitted(self)
        V = self.components_.shape[1]
        if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
            raise ValueError(f"LatentDirichletAllocation.top_words: n must be a positive int, got {n!r}")
        if feature_names is None:
            feature_names = getattr(self, "feature_names_in_", None)
        names = np.arange(V) if feature_names is None else np.asarray(feature_names, dtype=object)
        if names.shape != (V,):
            raise ValueError(
                f"LatentDirichletAllocation.top_words: feature_names has shape {names.shape}, but the "
                f"model has {V} features"
            )
        phi = self.components_ / self.components_.sum(axis=1, keepdims=True)
        order = np.argsort(-phi, axis=1, kind="stable")[:, :n]
        return [[(names[j].item() if hasattr(names[j], "item") else names[j], float(phi[k, j])) for j in row]
                for k, row in enumerate(order)]

    def _bound_and_words(self, X, whom):
        """scikit-learn's bound of ``X`` split as ``(document terms,
        topic term, words, documents)``."""
        check_is_fitted(self)
        if is_dask_collection(X):
            X = check_dask_X(self, X)
            per_doc = map_row_blocks(X, _terms_block, self, whom, n_columns=2, dtype=np.float64,
                                     meta=np.empty((0, 0)))
            # one pass over the blocks: the sums and (rows unknown) the number of documents
            (docs, n_words), n_docs = dask.compute(per_doc.sum(axis=0), (per_doc[:, 1] >= 0).sum())
        else:
            per_doc = _terms_block(X, self, whom)
            (docs, n_words), n_docs = per_doc.sum(axis=0), per_doc.shape[0]
        return float(docs), topic_term(self.components_, self.topic_word_prior_), float(n_words), int(n_docs)

    def score(self, X, y=None):
        """scikit-learn's approximate log-likelihood of ``X``: its variational bound.

        As scikit-learn's ``LatentDirichletAllocation.score``: each
        document's ``gamma`` from the E-step (:meth:`transform`), then the
        evidence lower bound ``E_q[log p(X, theta, beta)] - E_q[log q]``
        with the topic-word Dirichlet parameters ``components_`` (its
        ``_approx_bound``): the documents' expected log-likelihood and the
        divergences of theta and of the topics from their priors. On the
        same ``components_``, priors, ``max_doc_update_iter``,
        ``mean_change_tol`` and ``X`` it is scikit-learn's number (to
        floating-point rounding), so ``GridSearchCV`` ranks models as
        scikit-learn's would. Total (nats), higher is better. The topic
        term is in every score, whatever ``X``; for a held-out measure of
        prediction, use :func:`document_completion`.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            Non-negative counts (or weights, taken as they are).
        y : ignored

        Returns
        -------
        float
        """
        docs, topics, _, _ = self._bound_and_words(X, "LatentDirichletAllocation.score")
        return docs + topics

    def perplexity(self, X, sub_sampling=False):
        """``exp(-score(X) / number of words in X)``, as scikit-learn's ``perplexity``.

        Lower is better (see :meth:`score`).

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
        sub_sampling : bool, default=False
            As scikit-learn's: the document terms and the number of words
            are scaled by ``total_samples / n_samples`` (``X`` taken as a
            sample of a corpus of ``total_samples`` documents).

        Returns
        -------
        float
        """
        docs, topics, n_words, n_docs = self._bound_and_words(X, "LatentDirichletAllocation.perplexity")
        return self._perplexity_of(docs, topics, n_words, n_docs, sub_sampling)

    def _perplexity_of(self, docs, topics, n_words, n_docs, sub_sampling):
        if n_words <= 0:  # scikit-learn's bound / 0 words: infinite, with numpy's warning
            warnings.warn("LatentDirichletAllocation.perplexity: X has no words; its perplexity is infinite "
                          "(as scikit-learn's)", RuntimeWarning, stacklevel=3)
            return float("inf")
        if sub_sampling:
            ratio = float(self.total_samples) / n_docs
            docs, n_words = docs * ratio, n_words * ratio
        return float(np.exp(-(docs + topics) / n_words))

    def _perplexity_precomp_distr(self, X, doc_topic_distr=None, sub_sampling=False):
        """The perplexity of ``X`` with the given unnormalized doc-topic
        parameters ``gamma`` (None: from the E-step, as :meth:`perplexity`).
        scikit-learn's private helper of the same name and checks."""
        if doc_topic_distr is None:
            return self.perplexity(X, sub_sampling)
        check_is_fitted(self)
        X = sp.csr_matrix(self._check_X(X, "LatentDirichletAllocation.perplexity"), dtype=np.float64)
        X.sum_duplicates()
        n_samples, n_components = np.shape(doc_topic_distr)
        if n_samples != X.shape[0]:
            raise ValueError("Number of samples in X and doc_topic_distr do not match.")
        if n_components != self.components_.shape[0]:
            raise ValueError("Number of topics does not match.")
        elog_t, exp_t = expectations(self.components_)
        docs = document_terms(X, elog_t, exp_t, self.doc_topic_prior_, 0, 0.0, gamma=doc_topic_distr)[0]
        topics = topic_term(self.components_, self.topic_word_prior_, elog_t)
        return self._perplexity_of(float(docs.sum()), topics, float(X.sum()), X.shape[0], sub_sampling)
