"""The parameters every parameter-server estimator shares, and its settings.

:class:`PSEstimatorMixin` goes first in an estimator's bases (before
``BaseEstimator``). It brings the constraints of the shared parameters
(``client``, ``consistency``, ``replication``, ``checkpoint``,
``checkpoint_every``, ``verbose``), pickling without the live ``Client``,
cloning that shares the ``Client``, and the ``ParameterServer`` of
``client``. :func:`max_participants` reads scikit-learn's ``n_jobs`` as the
number of participants. :func:`setting` reads an estimator's tunables from
``dask.config`` (``ps.<estimator>.<key>``, defaults in ``dask_ps/ps.yaml``).
"""

from __future__ import annotations

import logging
import os
from numbers import Integral

import dask
from dask.utils import parse_bytes
from sklearn.base import clone
from sklearn.utils._param_validation import Interval

from dask_ps import Consistency, ParameterServer, get_parameter_server

# The constraints of the shared parameters (scikit-learn's
# ``_parameter_constraints`` entries); an estimator extends or overrides them.
SHARED_CONSTRAINTS: dict = {
    "client": "no_validation",
    "consistency": [Consistency, None],
    "replication": [Interval(Integral, 1, None, closed="left")],
    "checkpoint": [str, os.PathLike, None],
    "checkpoint_every": [Interval(Integral, 1, None, closed="left"), None],
    "verbose": ["verbose"],
}


def max_participants(n_jobs, available: int) -> int:
    """The participants a fit with ``n_jobs`` may have when one per
    ``available`` (workers or worker threads) is the default: ``n_jobs``
    read as joblib reads it (None or ``-1``: ``available``; ``-2``: all but
    one; ``k > 0``: ``k``, also more than ``available``: several
    participants per worker), at least 1. ``n_jobs`` is scikit-learn's
    parameter, here the number of participants; small inputs may get fewer
    (the estimators' minimum share of a participant)."""
    available = max(1, int(available))
    if n_jobs is None:
        return available
    n_jobs = int(n_jobs)
    if n_jobs == 0:
        raise ValueError("n_jobs == 0 has no meaning: pass None, a positive number of participants, or -1")
    return max(1, n_jobs if n_jobs > 0 else available + 1 + n_jobs)


def setting(estimator: str, key: str):
    """``dask.config`` value ``ps.<estimator>.<key>`` (read at each call, so
    ``dask.config.set`` applies at once)."""
    return dask.config.get(f"ps.{estimator}.{key}")


def setting_bytes(estimator: str, key: str) -> int:
    """A :func:`setting` that is a size: an int or a string such as ``"2GiB"``."""
    return int(parse_bytes(setting(estimator, key)))


def chose_a_cluster(client) -> bool:
    """Whether a fit with this ``client`` parameter runs on a cluster the
    user chose: a ``Client`` or scheduler address given, or a current Dask
    client other than the embedded cluster's. False for ``client=None``
    without one, where the estimators start (or reuse) the embedded
    cluster themselves (:func:`dask_ps.get_parameter_server`)."""
    if client is not None:
        return True
    from distributed import get_client

    try:
        current = get_client()
    except ValueError:
        return False
    from dask_ps import _client

    embedded = _client._auto_ps
    return embedded is None or current is not embedded.client


class PSEstimatorMixin:
    """Shared plumbing of the parameter-server estimators (see the module docstring)."""

    def _parameter_server(self) -> ParameterServer:
        """The ``ParameterServer`` of ``client`` (None: the current client,
        else a ``LocalCluster`` started once per process: with ``verbose``,
        a line says where its dashboard is), once a worker serves it: a
        scheduler without workers raises ``NoWorkersError`` after
        ``ps.timeouts.no-workers`` (it waited forever)."""
        ps = get_parameter_server(self.client, on_start=self._announce_cluster)
        ps.wait_for_servers()
        return ps

    def _announce_cluster(self, ps: ParameterServer) -> None:
        """Verbose: the embedded cluster this fit started, and its dashboard
        (on standard error)."""
        from dask_ps._client import describe_embedded_cluster
        from dask_ps._estimators._progress import Progress

        # standard error: standard output holds scikit-learn's lines alone (its tests count them)
        Progress(getattr(self, "verbose", 0), logging.getLogger(type(self).__module__)).note(
            describe_embedded_cluster(ps))

    def _checkpoint_path(self) -> str | None:
        return None if self.checkpoint is None else os.fspath(self.checkpoint)

    def __getstate__(self):
        state = super().__getstate__()
        client = state.get("client")
        if client is not None and not isinstance(client, (str, bytes)):
            # A distributed.Client cannot be pickled: a fitted model is a plain
            # object that predicts without a cluster. (client=None on load.)
            state = dict(state, client=None)
        return state

    def __sklearn_clone__(self):
        # clone() deep-copies parameters; a Client must be shared, not copied.
        params = self.get_params(deep=False)
        client = params.pop("client")
        new = type(self)(**{k: clone(v, safe=False) for k, v in params.items()})
        new.client = client
        return new
