"""The data shapes of the SGD quality sweep (``sgd_quality.py``).

Each maker returns ``(X, y, X_test, y_test)`` for ``n`` training rows (the
test set a quarter of that, drawn alike and never sorted), the same for the
same arguments. ``classifier`` picks binary labels or a real target.

=============  ==============================================================
``dense``      make_classification / make_regression, 20 features (10 informative)
``dense3``     make_classification, 3 classes (one-vs-rest)
``text``       bag of words: 5,000-word Zipf vocabulary, Poisson(40) words a
               document, the classes' word frequencies apart on 300 words;
               counts (CSR)
``tfidf``      ``text`` through ``TfidfTransformer`` (rows of unit norm;
               the regression target of unit scale)
``heavy``      ``text`` with lognormal document lengths (median 15 words,
               sigma 1.0, 2 to 150) and square-root counts: squared row
               norms (the words) over two decades
``sorted``     ``text`` stored sorted by label (regression: by target)
``imbalanced`` make_classification, 20 features, 5% positives
``ctr``        click-through: 16 categorical fields (cardinalities 4 to
               200,000, Zipf-distributed values) one-hot hashed into 2^18
               columns, clicks from a logistic model (about 20% positive)
=============  ==============================================================
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

SHAPES = ("dense", "dense3", "text", "tfidf", "heavy", "sorted", "imbalanced", "ctr")
REGRESSION_SHAPES = ("dense", "text", "tfidf", "heavy", "sorted")

_CACHE: dict = {}


def make(shape: str, classifier: bool, n: int):
    """``(X, y, X_test, y_test)`` of ``shape`` (module docstring), cached."""
    key = (shape, classifier, n)
    if key not in _CACHE:
        if shape not in SHAPES:
            raise ValueError(f"unknown data shape {shape!r}; one of {SHAPES}")
        if not classifier and shape not in REGRESSION_SHAPES:
            raise ValueError(f"data shape {shape!r} has no regression target; one of {REGRESSION_SHAPES}")
        _CACHE[key] = _MAKERS[shape](classifier, n)
    return _CACHE[key]


def _split(X, y, n):
    return X[:n], y[:n], X[n:], y[n:]


def _dense(classifier, n, **kw):
    from sklearn.datasets import make_classification, make_regression

    m = n + n // 4
    if classifier:
        X, y = make_classification(m, 20, n_informative=10, random_state=0, **kw)
    else:
        X, y = make_regression(m, 20, n_informative=10, noise=10.0, random_state=0)
    return _split(X, y, n)


def _words(rng, m, lengths, V=5000, n_informative=300):
    """Counts of ``m`` documents of ``lengths`` words over a Zipf vocabulary;
    returns ``(X counts, labels, w)``: half the documents draw from a
    frequency profile tilted on ``n_informative`` words, ``w`` the weights
    of a regression target on those words."""
    base = 1.0 / (np.arange(V) + 10.0) ** 1.1
    informative = rng.choice(V, n_informative, replace=False)
    tilt = np.ones(V)
    tilt[informative] = np.exp(rng.choice([-0.8, 0.8], n_informative))
    labels = rng.rand(m) < 0.5
    rows, cols = [], []
    for cls, prof in ((False, base), (True, base * tilt)):
        docs = np.flatnonzero(labels == cls)
        p = prof / prof.sum()
        k = lengths[docs]
        words = rng.choice(V, int(k.sum()), p=p)
        rows.append(np.repeat(docs, k))
        cols.append(words)
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    X = sp.csr_matrix((np.ones(rows.shape[0]), (rows, cols)), shape=(m, V))
    X.sum_duplicates()
    w = np.zeros(V)
    w[informative] = rng.randn(n_informative)
    return X, labels.astype(np.int64), w


def _text(classifier, n, lengths=None, transform=None, seed=1, scale=10.0):
    """``text`` (or its transform): the regression target a linear function
    of the features as given (the transformed ones), of standard deviation
    ``scale`` (noise ``0.6 * scale``: R^2 at most ~0.74)."""
    rng = np.random.RandomState(seed)
    m = n + n // 4
    if lengths is None:
        lengths = rng.poisson(40, m) + 1
    X, labels, w = _words(rng, m, lengths)
    if transform is not None:
        X = transform(X, n)
    X = X.tocsr()
    if classifier:
        return _split(X, labels, n)
    target = X @ w
    target = (target / target.std() + rng.randn(m) * 0.6) * scale
    return _split(X, target, n)


def _tfidf(X, n):
    from sklearn.feature_extraction.text import TfidfTransformer

    t = TfidfTransformer().fit(X[:n])
    return t.transform(X)


def _sqrt(X, n):
    X = X.copy()
    X.data = np.sqrt(X.data)
    return X


def _heavy(classifier, n):
    rng = np.random.RandomState(2)
    lengths = np.clip(rng.lognormal(np.log(15), 1.0, n + n // 4).astype(np.int64), 2, 150)
    return _text(classifier, n, lengths=lengths, transform=_sqrt, seed=3)


def _sorted(classifier, n):
    X, y, Xt, yt = _text(classifier, n)
    order = np.argsort(y, kind="stable")
    return X[order], y[order], Xt, yt


def _ctr(classifier, n, n_cols=2 ** 18):
    rng = np.random.RandomState(4)
    m = n + n // 4
    cards = [4, 7, 12, 24, 50, 100, 300, 1000, 3000, 10000, 30000, 60000, 100000, 150000, 200000, 200000]
    rows = np.repeat(np.arange(m), len(cards))
    cols = np.empty((m, len(cards)), dtype=np.int64)
    logit = np.full(m, -1.9)
    for f, card in enumerate(cards):
        v = np.minimum(rng.zipf(1.3, m) - 1, card - 1)
        effect = rng.randn(card) * (0.9 if card < 1000 else 0.6)
        logit += effect[v]
        cols[:, f] = (v * 2654435761 + f * 40503) % n_cols  # hashed (collisions as a real hashed set has)
    y = (rng.rand(m) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    X = sp.csr_matrix((np.ones(rows.shape[0]), (rows, cols.reshape(-1))), shape=(m, n_cols))
    X.sum_duplicates()
    return _split(X, y, n)


_MAKERS = {
    "dense": _dense,
    "dense3": lambda c, n: _dense(c, n, n_classes=3, n_clusters_per_class=1),
    "text": _text,
    "tfidf": lambda c, n: _text(c, n, transform=_tfidf, scale=1.0),  # unit rows: a unit target
    "heavy": _heavy,
    "sorted": _sorted,
    "imbalanced": lambda c, n: _dense(c, n, weights=[0.95, 0.05]),
    "ctr": _ctr,
}
