"""Linear models trained by stochastic gradient descent on the parameter server.

>>> from dask_ps.linear_model import SGDClassifier, SGDRegressor
>>> clf = SGDClassifier(loss="log_loss", batch_size=256).fit(X, y)  # doctest: +SKIP

The estimators are written against the public ``ParameterServer`` API
(``create_table``, ``run``, and inside a participant ``pull``/``pull_rows``,
``push``/``push_rows``, ``clock``) and the shared estimator machinery
``dask_ps._estimators``. Modules: ``_stochastic_gradient`` (the estimators),
``_base`` (their shared driver), ``_training`` (one training call: tables,
runs, checkpoints), ``_data`` (the parts of the data), ``_participant`` and
``_rounds`` (what runs on the workers), ``_kernels`` and ``_sgd_numba`` (the
SGD rule). See ``docs/architecture.rst``, "Estimators: SGD".
"""

from dask_ps.linear_model._stochastic_gradient import SGDClassifier, SGDRegressor

__all__ = ["SGDClassifier", "SGDRegressor"]
