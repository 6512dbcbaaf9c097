"""The shared driver of the parameter-server SGD estimators (as
scikit-learn's ``BaseSGD``): parameters and their validation, ``fit``,
``partial_fit``'s common path, warm starts, the fitted weights, and
checking dask collections to predict on. ``SGDClassifier`` and
``SGDRegressor`` (``_stochastic_gradient``) add their targets and
predictions.
"""

from __future__ import annotations

import inspect
import warnings
from numbers import Integral

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model._base import SparseCoefMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_n_features, _check_sample_weight, check_array, column_or_1d, validate_data

from dask_ps._estimators import (
    SHARED_CONSTRAINTS,
    PSEstimatorMixin,
    arrays,
    check_dask_fit_input,
    check_dask_X,
    dask_feature_names,
    dask_meta,
    is_dask_collection,
    is_dask_dataframe,
    jsonable,
)
from dask_ps.linear_model import _training
from dask_ps.linear_model._data import _dask_parts, _Input, int32_indices, order_seed
from dask_ps.linear_model._kernels import EPSILON_LOSSES, L1, L2, LEARNING_RATE_TYPES, PENALTY_TYPES, _Hyper

# The parameters both estimators take beyond scikit-learn's own, with their
# defaults (scikit-learn's are in each estimator's ``_DEFAULTS``). ``n_jobs``
# is scikit-learn's SGDClassifier's (the number of participants here), and
# the regressor's too.
PS_DEFAULTS = {
    "n_jobs": None, "batch_size": 256, "consistency": None, "client": None, "checkpoint": None,
    "checkpoint_every": None, "replication": 1,
}


def _constraints(sk_cls) -> dict:
    """scikit-learn's constraints of ``sk_cls`` and ours."""
    c = dict(sk_cls._parameter_constraints)
    c.update(batch_size=[Interval(Integral, 1, None, closed="left")], n_jobs=[Integral, None], **SHARED_CONSTRAINTS)
    return c


def _storing_init(defaults: dict):
    """An ``__init__`` that only stores its parameters: ``defaults`` gives
    their names and defaults (the first may be passed by position, the
    others by keyword), and its signature is the one scikit-learn's
    ``get_params`` reads. Both estimators take the same parameters with some
    other defaults: this keeps one list per estimator instead of two copies
    of a 26-parameter ``__init__``."""
    kind = inspect.Parameter
    names = list(defaults)
    params = [kind("self", kind.POSITIONAL_OR_KEYWORD), kind(names[0], kind.POSITIONAL_OR_KEYWORD,
                                                              default=defaults[names[0]])]
    params += [kind(n, kind.KEYWORD_ONLY, default=defaults[n]) for n in names[1:]]
    signature = inspect.Signature(params)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        for name in names:
            setattr(self, name, bound.arguments[name])

    __init__.__signature__ = signature
    return __init__


def _numpy_dtype(t) -> np.dtype:
    """A dask DataFrame column's dtype as numpy's: pandas' nullable ones
    (``Float64``, ``Int64``) by their numpy dtype, others (strings,
    categories, objects: converted, or refused with scikit-learn's message,
    where the parts are checked) as float64."""
    if isinstance(t, np.dtype):
        return t
    inner = getattr(t, "numpy_dtype", None)
    return inner if isinstance(inner, np.dtype) and inner.kind in "biuf" else np.dtype(np.float64)


class _BaseSGDPS(PSEstimatorMixin, SparseCoefMixin, BaseEstimator):
    """Shared driver of the parameter-server SGD estimators."""

    _is_classifier: bool

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _more_validate_params(self, for_partial_fit=False):
        # As scikit-learn's BaseSGD._more_validate_params.
        if self.early_stopping and for_partial_fit:
            raise ValueError("early_stopping should be False with partial_fit")
        if self.learning_rate == "optimal" and self.alpha == 0:
            raise ValueError(
                "alpha must be > 0 since learning_rate is 'optimal'. alpha is used "
                "to compute the optimal learning rate."
            )
        if self.learning_rate in ("pa1", "pa2"):
            needed = "hinge" if self._is_classifier else "epsilon_insensitive"
            if self.loss != needed:
                raise ValueError(f"Learning rate '{self.learning_rate}' only works with loss '{needed}'.")
        if self.penalty == "elasticnet" and self.l1_ratio is None:
            raise ValueError("l1_ratio must be set when penalty is 'elasticnet'")
        if not for_partial_fit and self.checkpoint_every is not None and self.checkpoint is None:
            raise ValueError("checkpoint_every is set but checkpoint is None: pass a checkpoint path")

    # --- fitting ---------------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, coef_init=None, intercept_init=None, sample_weight=None):
        """Fit the linear model with SGD on the parameter server.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array, dask DataFrame} of shape (n_samples, n_features)
        y : array-like or dask collection of shape (n_samples,)
        coef_init : ndarray of shape (n_classes, n_features) or (n_features,), default=None
            The initial coefficients: ``(n_classes, n_features)`` for a
            multiclass classifier, ``(n_features,)`` otherwise.
        intercept_init : ndarray of shape (n_classes,) or (1,), default=None
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        self._more_validate_params()
        if hasattr(self, "classes_"):
            del self.classes_
        if self.warm_start and getattr(self, "coef_", None) is not None and self._is_classifier:
            # scikit-learn's classifier restarts from ``coef_`` (the averaged
            # model where ``average``) with fresh averages; its regressor
            # (below) from the unaveraged weights, keeping the averages.
            coef_init = self.coef_ if coef_init is None else coef_init
            intercept_init = self.intercept_ if intercept_init is None else intercept_init
            avg = (None, None)
        elif self.warm_start and getattr(self, "coef_", None) is not None:
            if coef_init is None:
                coef_init = self.coef_ if not self.average else self._standard_coef
            if intercept_init is None:
                intercept_init = self.intercept_ if not self.average else self._standard_intercept
            avg = (getattr(self, "_average_coef", None), getattr(self, "_average_intercept", None))
        else:
            self.coef_ = None
            self.intercept_ = None
            avg = (None, None)
        self.t_ = 1.0
        self._partial_fit(X, y, self.max_iter, sample_weight, coef_init, intercept_init, avg, reset=True,
                          classes="infer", checkpoint=self._checkpoint_path())
        if self.tol is not None and self.tol > -np.inf and self.n_iter_ == self.max_iter:
            warnings.warn(
                "Maximum number of iteration reached before convergence. Consider increasing "
                "max_iter to improve the fit.",
                ConvergenceWarning,
            )
        if self.power_t < 0:
            warnings.warn(
                "Negative values for `power_t` are deprecated in version 1.8 and will raise an "
                "error in 1.10. Use values in the range [0.0, inf) instead.",
                FutureWarning,
            )
        return self

    def _partial_fit(self, X, y, max_iter, sample_weight, coef_init, intercept_init, avg, reset, classes=None,
                     checkpoint=None, in_process=False):
        """``max_iter`` epochs from the current model (or the given start);
        ``in_process`` (``partial_fit``): a block small enough for one
        participant trains in this process (``_in_process``)."""
        first_call = getattr(self, "coef_", None) is None
        data = self._validate_input(X, y, sample_weight, reset=reset or first_call)
        if data.kind == "dask":
            # Concatenated and checked on the workers once: the values are
            # checked before the targets (scikit-learn's order), and the
            # classes come from the parts' label counts.
            data.parts = _dask_parts(self._parameter_server().client, data, self._is_classifier, order_seed(self),
                                     self.verbose, all_zero_weights=self._all_zero_weights_error())
        try:
            K, targets = self._targets(data, classes)
            d = data.n_features
            coef, intercept, avg_coef, avg_intercept = self._start_weights(K, d, data.dtype, coef_init,
                                                                           intercept_init, avg)
            if not hasattr(self, "t_"):
                self.t_ = 1.0
            done = _training.train(self, data, max_iter, K, coef, intercept, avg_coef, avg_intercept,
                                   checkpoint=checkpoint, in_process=in_process, **targets)
        except BaseException:
            if data.parts is not None:  # an error before train took them (it releases its own)
                data.parts[0].release()
            raise
        self.n_iter_ = done.n_iter
        self.t_ += done.n_iter * done.n_seen
        self.metrics_, self.run_ids_, self.rollbacks_ = done.metrics, done.run_ids, done.rollbacks
        self._fit_profile = done.profile  # where the call's time went (the benchmarks read it)
        self._store(done.W, K, d)
        return self

    def _targets(self, data: _Input, classes):
        """``(K outputs, keyword arguments of _training.train)`` of the data's
        targets (a classifier also sets ``classes_``)."""
        raise NotImplementedError

    def _start_weights(self, K, d, dtype, coef_init, intercept_init, avg):
        """``(coef (K, d), intercept (K,), average coef, average intercept)``
        to train from: the given start, or the current model."""
        if getattr(self, "coef_", None) is None or coef_init is not None:
            coef, intercept = _initial_params(K, d, dtype, coef_init, intercept_init)
            avg_coef = np.zeros((K, d), dtype=dtype)
            avg_intercept = np.zeros(K, dtype=dtype)
            if avg is not None and avg[0] is not None and self.average:
                avg_coef, avg_intercept = avg
            return coef, intercept, avg_coef, avg_intercept
        if d != self.coef_.shape[-1]:
            raise ValueError("Number of features %d does not match previous data %d." % (d, self.coef_.shape[-1]))
        if self.average and getattr(self, "_standard_coef", None) is not None:
            return self._standard_coef, self._standard_intercept, self._average_coef, self._average_intercept
        return self.coef_, self.intercept_, np.zeros((K, d), dtype=dtype), np.zeros(K, dtype=dtype)

    def _store(self, W, K, d):
        """Set coef_/intercept_ (and the averaging state) from the final table."""
        coef = np.ascontiguousarray(W[:d, :K].T)
        # scikit-learn's intercept_ dtype for float32 data: float64 but for
        # a classifier's averaged or multiclass fit (its buffers are X's dtype)
        floats = W.dtype if self._is_classifier and (self.average or K > 1) else np.float64
        intercept = np.array(W[d, :K], dtype=floats)
        if self.average:
            self._standard_coef = coef
            self._standard_intercept = intercept
            self._average_coef = np.ascontiguousarray(W[:d, K:].T)
            self._average_intercept = np.array(W[d, K:], dtype=floats)
            if self.average <= self.t_ - 1:
                coef, intercept = self._average_coef, self._average_intercept
        self.coef_, self.intercept_ = coef, intercept

    # --- input -----------------------------------------------------------------------------
    def _validate_input(self, X, y, sample_weight, reset) -> _Input:
        """Check X/y as scikit-learn does; dask collections are checked for
        shape and dtype here and for values on the workers."""
        if is_dask_collection(X):
            return self._validate_dask_input(X, y, sample_weight, reset)
        if arrays.is_cupy(X):  # stays on the device (scikit-learn's checks would copy it to numpy)
            return self._validate_device_input(X, y, sample_weight, reset)
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=[np.float64, np.float32], order="C", reset=reset)
        X = int32_indices(X)  # int64 indices that fit (scikit-learn's SGD refuses them)
        if self._is_classifier:
            check_classification_targets(y)
        else:
            y = y.astype(X.dtype, copy=False)
        sw = _check_sample_weight(sample_weight, X, dtype=X.dtype, allow_all_zero_weights=self.early_stopping)
        self._check_validation_weights(sample_weight, sw)
        return _Input("memory", X, y, sw, X.shape[1], X.dtype, sp.issparse(X), "cpu", self.n_jobs)

    def _all_zero_weights_error(self) -> str:
        """scikit-learn's error where every sample weight is zero (with
        early stopping: its validation set's, ``_check_validation_weights``)."""
        if self.early_stopping:
            return "The sample weights for validation set are all zero, consider using a different random state."
        return "Sample weights must contain at least one non-zero number."

    def _check_validation_weights(self, sample_weight, sw):
        """scikit-learn's error for a validation set whose weights are all
        zero, where the data tells without the split: every weight is zero.
        (The split itself is drawn by each participant.)"""
        if self.early_stopping and sample_weight is not None and not np.any(sw):
            raise ValueError(
                "The sample weights for validation set are all zero, consider using a different random state."
            )

    def _validate_device_input(self, X, y, sample_weight, reset) -> _Input:
        """A dense device (cupy) X in memory, checked on the device as
        scikit-learn checks numpy input; the weights table goes on the device
        too. y and sample_weight (one value per sample) are checked on the host."""
        X = self._device_X(X, reset)
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        y = column_or_1d(arrays.to_numpy(y), warn=True)
        if y.shape[0] != X.shape[0]:
            raise ValueError(
                f"Found input variables with inconsistent numbers of samples: [{X.shape[0]}, {y.shape[0]}]")
        if self._is_classifier:
            check_classification_targets(y)
        else:
            y = check_array(y, ensure_2d=False, dtype=X.dtype)
        sw = None if sample_weight is None else arrays.to_numpy(sample_weight)
        sw = _check_sample_weight(sw, np.empty((X.shape[0], 0), dtype=X.dtype), dtype=X.dtype,
                                  allow_all_zero_weights=self.early_stopping)
        self._check_validation_weights(sample_weight, sw)
        return _Input("memory", X, y, sw, X.shape[1], X.dtype, False, "cuda", self.n_jobs)

    def _device_X(self, X, reset=False):
        """A device X checked (``arrays.check_device_X``) and its number of
        features set (``reset``) or compared with the fitted one."""
        X = arrays.check_device_X(X, self)
        validate_data(self, X=X, skip_check_array=True, reset=reset)
        return X

    def _validate_dask_input(self, X, y, sample_weight, reset) -> _Input:
        meta = dask_meta(X)
        if getattr(X, "ndim", 2) != 2:
            raise ValueError(f"Expected 2D array, got {getattr(X, 'ndim', '?')}D array instead")
        dask_feature_names(self, X, reset)  # scikit-learn's checks, on a dask DataFrame's columns
        _check_n_features(self, X, reset=reset)
        if is_dask_dataframe(X):
            dtype = np.result_type(*[_numpy_dtype(t) for t in X.dtypes]) if len(X.dtypes) else np.float64
            sparse = False
            device = "cpu"
        else:
            dtype = X.dtype
            sparse = arrays.is_sparse(meta)
            device = "cuda" if arrays.is_cupy(meta) or arrays.is_cupy_sparse(meta) else "cpu"
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            dtype = np.dtype(np.float64)
        if X.shape[1] is not None and not (isinstance(X.shape[1], float) and np.isnan(X.shape[1])):
            n_features = int(X.shape[1])
        else:
            n_features = len(X.columns)
        if y is None:
            raise ValueError("requires y to be passed, but the target y is None")
        check_dask_fit_input(self, X, y, sample_weight, n_features)
        return _Input("dask", X, y, sample_weight, n_features, dtype, sparse, device, self.n_jobs,
                      type(self).__name__)

    def _check_dask_X(self, X):
        return check_dask_X(self, X)

    # --- what the participants and checkpoints get ----------------------------------------
    def _hyper(self, n_outputs, sparse) -> _Hyper:
        penalty = PENALTY_TYPES[str(self.penalty).lower()]
        l1_ratio = {0: 0.0, L2: 0.0, L1: 1.0}.get(penalty, self.l1_ratio)
        return _Hyper(
            loss=self.loss, epsilon=float(self.epsilon), penalty=penalty, alpha=float(self.alpha),
            l1_ratio=float(l1_ratio), learning_rate=LEARNING_RATE_TYPES[self.learning_rate],
            eta0=float(self.eta0), power_t=float(self.power_t), fit_intercept=bool(self.fit_intercept),
            average=int(self.average), n_outputs=int(n_outputs),
            tol=-np.inf if self.tol is None else float(self.tol), n_iter_no_change=int(self.n_iter_no_change),
            early_stopping=bool(self.early_stopping), validation_fraction=float(self.validation_fraction),
            shuffle=bool(self.shuffle), classifier=self._is_classifier,
        )

    def _checkpoint_kind(self) -> str:
        return f"dask_ps.linear_model.{type(self).__name__}"

    def _checkpoint_params(self, hp: _Hyper) -> dict:
        """The parameters that define the problem and the schedule (effective
        values): a checkpoint resumes only a fit with the same ones. Not
        compared: max_iter, tol, n_iter_no_change (when to stop), batch_size,
        random_state, consistency, replication, verbose, client."""
        params = {k: getattr(hp, k) for k in (
            "loss", "epsilon", "penalty", "alpha", "l1_ratio", "learning_rate", "eta0", "power_t",
            "fit_intercept", "average", "early_stopping", "validation_fraction", "shuffle")}
        params["penalty"] = str(self.penalty).lower()
        params["learning_rate"] = self.learning_rate
        if not hp.early_stopping:
            params.pop("validation_fraction")
        if hp.loss not in EPSILON_LOSSES:
            params.pop("epsilon")
        if self._is_classifier:
            params["class_weight"] = self.class_weight
        return jsonable(params)


def _initial_params(K, d, dtype, coef_init, intercept_init):
    """The given ``coef_init`` (K, d) and ``intercept_init`` (K,), checked, or zeros."""
    if coef_init is not None:
        coef_init = np.asarray(coef_init, dtype=dtype)
        if K > 1 and coef_init.shape != (K, d):
            raise ValueError("Provided ``coef_`` does not match dataset. ")
        if K == 1:
            coef_init = coef_init.ravel()
            if coef_init.shape != (d,):
                raise ValueError("Provided coef_init does not match dataset.")
        coef = coef_init.reshape(K, d)
    else:
        coef = np.zeros((K, d), dtype=dtype)
    if intercept_init is not None:
        intercept_init = np.asarray(intercept_init, dtype=dtype)
        if K > 1 and intercept_init.shape != (K,):
            raise ValueError("Provided intercept_init does not match dataset.")
        if K == 1 and intercept_init.reshape(-1).shape != (1,):
            raise ValueError("Provided intercept_init does not match dataset.")
        intercept = intercept_init.reshape(K)
    else:
        intercept = np.zeros(K, dtype=dtype)
    return coef, intercept
