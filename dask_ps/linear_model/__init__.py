"""Linear models trained by stochastic gradient descent on the parameter server.

>>> from dask_ps.linear_model import SGDClassifier, SGDRegressor
>>> clf = SGDClassifier(loss="log_loss", batch_size=256).fit(X, y)  # doctest: +SKIP

The estimators are written against the public ``ParameterServer`` API only
(``create_table``, ``run``, and inside a participant ``pull``/``pull_rows``,
``push``/``push_rows``, ``clock``): see :mod:`dask_ps.linear_model._sgd`.
"""

from dask_ps.linear_model._sgd import SGDClassifier, SGDRegressor

__all__ = ["SGDClassifier", "SGDRegressor"]
