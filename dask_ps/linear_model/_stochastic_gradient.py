"""``SGDClassifier`` and ``SGDRegressor``: scikit-learn's SGD estimators
trained on the parameter server. Each is its parameters' defaults, its
targets and its predictions on top of ``_base._BaseSGDPS``; how a fit runs
is in ``docs/architecture.rst``, "Estimators: SGD".
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.base import RegressorMixin, _fit_context
from sklearn.linear_model import SGDClassifier as _SkSGDClassifier
from sklearn.linear_model import SGDRegressor as _SkSGDRegressor
from sklearn.linear_model._base import LinearClassifierMixin
from sklearn.utils import compute_class_weight
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import _check_partial_fit_first_call, check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from dask_ps._estimators import arrays, is_dask_collection, map_row_blocks, raise_no_samples
from dask_ps.linear_model._base import PS_DEFAULTS, _BaseSGDPS, _constraints, _storing_init
from dask_ps.linear_model._kernels import _expit

__all__ = ["SGDClassifier", "SGDRegressor"]

# scikit-learn's parameters both estimators take, with the defaults they share.
_SHARED_DEFAULTS = {
    "penalty": "l2", "alpha": 0.0001, "l1_ratio": 0.15, "fit_intercept": True, "max_iter": 1000, "tol": 1e-3,
    "shuffle": True, "verbose": 0, "epsilon": 0.1, "random_state": None, "eta0": 0.01, "early_stopping": False,
    "validation_fraction": 0.1, "n_iter_no_change": 5, "warm_start": False, "average": False,
}


class _DaskScore:
    """``score`` as scikit-learn's (``_metric``, a ``sklearn.metrics`` name:
    mean accuracy or R^2), where a dask input is computed on the client
    (``_dask_score``: scikit-learn's metrics call ``len`` on the lazy
    predictions, unknown for a dask DataFrame)."""

    _metric = ""

    def score(self, X, y, sample_weight=None):
        """Mean accuracy (classifier) or R^2 (regressor) on ``X`` and ``y``,
        as scikit-learn's; a dask input is computed on the client.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask collection} of shape (n_samples, n_features)
        y : array-like or dask collection of shape (n_samples,)
        sample_weight : array-like or dask collection of shape (n_samples,), default=None

        Returns
        -------
        float
        """
        if is_dask_collection(X) or is_dask_collection(y):
            import sklearn.metrics

            return _dask_score(self, X, y, sample_weight, getattr(sklearn.metrics, self._metric))
        return super().score(X, y, sample_weight=sample_weight)


class SGDClassifier(_DaskScore, LinearClassifierMixin, _BaseSGDPS):
    """Linear classifiers (SVM, logistic regression, ...) trained by SGD on the
    parameter server.

    The parameters and fitted attributes are scikit-learn's
    :class:`sklearn.linear_model.SGDClassifier` (``n_jobs`` with the meaning
    below), plus ``batch_size``, ``consistency``, ``client``,
    ``checkpoint``, ``checkpoint_every`` and ``replication``:

    Parameters
    ----------
    n_jobs : int, default=None
        The number of participants of a fit (scikit-learn: the CPUs of its
        one-vs-all loop): None or -1, one per worker; ``-2``, one per
        worker but one; ``k > 0``, ``k`` (more than the workers: several
        on a worker, in its threads). Small inputs get fewer: an
        in-memory input at most one per
        ``ps.sgd.min-epoch-seconds-per-participant`` (20 ms) of its epoch's
        estimated compute (a participant more costs sync and epochs: fits
        under ~40 ms an epoch are faster on one), a dask input the same
        from its blocks' sizes (``ps.sgd.min-samples-per-participant`` set
        to a number: one per that many samples instead). Each
        participant trains every one-vs-all problem on its part of the
        samples. A dask input trains where its blocks are, one participant
        per worker holding blocks: a lower ``n_jobs`` merges some workers'
        blocks (Dask moves them), a higher one cuts a worker's blocks into
        several participants (threads of its process; at most one a
        block). 0 is refused.
    batch_size : int, default=256
        Samples per minibatch and participant: the unit of a pull and a push.
        Each participant clocks every ``ps.sgd.clock-samples`` samples at
        most, at least ``ps.sgd.bsp-min-rounds-per-epoch`` times an epoch
        under BSP (``ps.sgd.min-rounds-per-epoch`` under the other models).
    consistency : dask_ps.Consistency, optional
        Consistency model of the weights table. None (the default):
        ``BSP()``, under which the model is the exact mean of the
        participants' models at every round, an epoch makes a sequential
        epoch's progress, and the same ``random_state`` on the same workers
        gives the same model bit for bit. ``dask_ps.SSP(s)`` lets a
        participant run ``s`` rounds ahead of the slowest (stragglers): the
        model stays the mean of the models, but reads that miss the others'
        last rounds delay progress where steps are small (docs/user-guide.rst).
    client : distributed.Client, optional
        The cluster to train on. ``None``: the current client, or a
        ``LocalCluster`` started once per process.
    checkpoint : str or path-like, default=None
        Where ``fit`` saves its state (``ParameterServer.save``: any fsspec
        URL that the client and every worker can reach, e.g. a shared
        directory or ``s3://...``). If it already holds a checkpoint of a
        compatible fit (same estimator, ``n_features``, classes and
        problem-defining parameters: loss, penalty, alpha, l1_ratio,
        learning_rate, eta0, power_t, epsilon, fit_intercept, average,
        shuffle, early_stopping, validation_fraction, class_weight), ``fit``
        resumes from it: it loads the weights and goes on from the saved
        epoch up to ``max_iter``, with the saved stopping-rule state. One
        that belongs to another fit raises ``ValueError``. ``max_iter``,
        ``tol``, ``n_iter_no_change``, ``batch_size``, ``consistency`` and
        ``replication`` may differ. A resume is exact (the same run as one
        that was never interrupted, up to the asynchrony of the participants)
        when the data is split the same way: the same data, number of workers
        and an int ``random_state``; otherwise the participants go on with
        fresh shuffling. A checkpoint at or past ``max_iter`` epochs (or
        of a fit that stopped) gives the saved model without training. A
        resumed fit ignores ``coef_init``, ``intercept_init`` and
        ``warm_start``; ``partial_fit`` ignores ``checkpoint``. Use one path
        per fit at a time.
    checkpoint_every : int, default=None
        Save every this many epochs: ``fit`` then trains in runs of
        ``checkpoint_every`` epochs (one ``ParameterServer.run`` each) and
        saves after each. ``None``: one save, at the end of ``fit``.
        Requires ``checkpoint``. The stopping rule (``tol``,
        ``early_stopping``) carries over from one run to the next.
    replication : int, default=1
        Copies of the weights on distinct workers (``create_table(...,
        replication=k)``). With 2 or more, a fit survives the loss of a
        worker: the weights have a copy elsewhere, Dask retries the
        participant that ran there, and the retried participant resumes at
        the clock it was in. An in-memory input (numpy, scipy.sparse) is then
        also kept on ``replication`` workers, so that Dask can rebuild the
        dead worker's part of the data (dask inputs are recomputed from their
        graph). With 1, a lost worker takes the only copy of some weights
        (and of scattered data) with it and the fit fails as the reliability
        docs describe; with ``checkpoint``, ``fit`` again resumes from the
        last save.

    All the scikit-learn parameters (``loss``, ``penalty``, ``alpha``,
    ``l1_ratio``, ``fit_intercept``, ``max_iter``, ``tol``, ``shuffle``,
    ``verbose``, ``epsilon``, ``random_state``, ``learning_rate``, ``eta0``,
    ``power_t``, ``early_stopping``, ``validation_fraction``,
    ``n_iter_no_change``, ``class_weight``, ``warm_start``, ``average``) mean
    what they mean there, except that ``shuffle`` shuffles per participant,
    and, for sparse numpy/scipy data trained with the compiled kernel (the
    default where numba is installed), per *round*: which samples form each
    round of ``ps.sgd.clock-samples`` samples is drawn once per fit, and each
    later epoch shuffles the order of the rounds and the order of the
    samples within each round, in blocks of 64 (scikit-learn reshuffles all
    samples each epoch; dask-ml's ``Incremental`` shuffles whole blocks).
    This lets a participant compact each round to its touched features once
    per fit instead of once per epoch (in a background thread, ahead of the
    round) and read it back mostly in order; the compacted rounds take about
    as much memory as the participant's own CSR (kept while within
    ``ps.sgd.round-cache-bytes``, default 2 GiB per participant; beyond it
    they are rebuilt each epoch, with the same result; a run of one epoch,
    such as ``partial_fit``, keeps none and reuses two or three rounds'
    memory).

    Attributes
    ----------
    coef_, intercept_, classes_, n_iter_, t_, n_features_in_, feature_names_in_
        As scikit-learn's. After ``fit`` the model holds numpy arrays only: it
        pickles and predicts without a cluster.
    metrics_ : list of dict
        Per participant of the last run (with ``checkpoint_every``, of the
        last ``checkpoint_every`` epochs): the parameter-server session's
        counters (reads, cache hits, waits, staleness histogram, bytes),
        seconds spent in its calls to the parameter server
        (``ps_seconds``, ``ps_seconds_by_call``), its thread's CPU seconds,
        the seconds it took to prepare its data (``setup_seconds``), its
        thread's seconds waiting for (or doing) the preparation of rounds
        (``round_prep_seconds``) and in the compiled kernel
        (``kernel_seconds``), the session's split of its time between its
        own work and the parameter server (``compute_seconds``,
        ``ps_blocked_seconds``), its samples, seconds and per-epoch
        ``history``, and the ``run_id`` of its run; where it ran
        (``worker``), the bytes of the fit's tables held there at the run's
        end (``table_bytes``, every copy) and that worker's
        ``worker_memory_limit`` and ``worker_process_memory``
        (``ParameterServer.memory``). A call
        trained in this process (see Notes) has one entry with
        ``in_process: True`` and no session counters.
    run_ids_ : list of str
        The parameter-server runs of the last ``fit``/``partial_fit`` call
        (one, or one per ``checkpoint_every`` chunk), in order: the keys of
        their entries in ``ParameterServer.metrics()``, e.g.
        ``dask_ps.get_parameter_server(est.client).metrics()[est.run_ids_[-1]]``
        (clocks, attempts, seconds, per-participant counters). Empty for a
        call trained in this process (a small input's ``fit`` without a
        client, or its ``partial_fit``: see Notes).
    rollbacks_ : list of dict
        The chunks of the last call trained again from the checkpoint: with
        ``checkpoint`` and ``replication=1``, a worker lost during a run has
        its blocks restored from the checkpoint (``dask_ps.RolledBackError``),
        so the fit loads its tables from the checkpoint and trains again from
        there (with a ``RuntimeWarning``; at most 3 times a fit; also when the
        run failed while the blocks were being restored, or they were
        restored between two runs). Each entry:
        ``epochs`` (the run's ``[first, end)``), ``resumed_from_epoch``,
        ``run_id``, ``tables`` and ``rollbacks`` (the error's records).
        Empty when nothing was lost.

    Notes
    -----
    ``verbose > 0`` prints scikit-learn's lines for each epoch while the
    fit runs (``-- Epoch n``; ``Norm``, ``NNZs``, ``Bias``, ``T``,
    ``Avg. loss``, ``Objective``; the training time), with the samples per
    second, the staleness of the participants' reads (in clocks) and the
    number of participants; the participants report each epoch to the
    client through a small table read every ``ps.sgd.progress-interval``.
    ``dask.config.set({"ps.progress-bar": True})`` shows a tqdm progress bar
    over the epochs instead of or with the lines (tqdm installed: the
    ``progress`` extra).

    ``partial_fit`` on an in-memory block that the parameter server would
    train with one participant (under 40 ms of estimated compute an
    epoch: about 500,000 dense samples of 10 features, 250,000 of 50,
    70,000 text-like rows of 40 words) trains it in the calling process,
    with the same participant and the same result, without a run on the
    cluster: a run costs tens of milliseconds, more than such a block's
    training (``dask_ml.wrappers.Incremental`` calls ``partial_fit`` once
    per block). ``ps.sgd.partial-fit-in-process:
    false`` sends every block to the cluster.

    ``X`` may be a numpy array, a scipy.sparse matrix (CSR), a dask array
    (numpy, scipy.sparse or cupy chunks) or a dask DataFrame (``y`` then a
    dask array or Series with the same partitions). Dask inputs are trained
    where their blocks are, by one participant per worker that holds blocks
    once they are computed; nothing is gathered to the client. A collection
    persisted with all its blocks on one worker therefore trains on one
    core: spread it first (``client.rebalance`` or ``persist`` with the
    blocks on several workers). ``predict``, ``decision_function`` and
    ``predict_proba`` return lazy dask arrays for dask inputs.
    """

    _is_classifier = True
    _metric = "accuracy_score"
    # scikit-learn's table of the losses ``loss`` names (its loss classes and
    # their default parameter); the kernels here implement the same losses.
    loss_functions = _SkSGDClassifier.loss_functions
    _parameter_constraints: dict = _constraints(_SkSGDClassifier)
    __init__ = _storing_init({"loss": "hinge", **_SHARED_DEFAULTS, "learning_rate": "optimal", "power_t": 0.5,
                              "class_weight": None, **PS_DEFAULTS})

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch of SGD over the given samples (``max_iter=1``).

        ``classes`` is required on the first call, as in scikit-learn.
        """
        first = not hasattr(self, "classes_")
        if first:
            self._more_validate_params(for_partial_fit=True)
            if self.class_weight == "balanced":
                raise ValueError(
                    "class_weight '{0}' is not supported for partial_fit. In order to use "
                    "'balanced' weights, use compute_class_weight('{0}', classes=classes, y=y). "
                    "In place of y you can use a large enough sample of the full training set "
                    "target to properly estimate the class frequency distributions. Pass the "
                    "resulting weights as the class_weight parameter.".format(self.class_weight)
                )
        return self._partial_fit(X, y, 1, sample_weight, None, None, None, reset=first, classes=classes,
                                 in_process=True)

    def _targets(self, data, classes):
        """The classes (``classes_``; "infer": those of y), the class weights
        and the K one-vs-rest problems (1 for two classes)."""
        if isinstance(classes, str) and classes == "infer":  # fit: the labels of y
            classes = np.unique(data.y) if data.kind == "memory" else self._dask_classes(data)
        _check_partial_fit_first_call(self, classes)
        n_classes = self.classes_.shape[0]
        if n_classes < 2:
            raise ValueError(
                "The number of classes has to be greater than one; got %d class" % n_classes
            )
        y_for_weights = data.y if data.kind == "memory" else None
        if y_for_weights is None and self.class_weight == "balanced":
            y_for_weights = self._dask_balanced_y(data)
        if y_for_weights is not None:
            cw = compute_class_weight(self.class_weight, classes=self.classes_, y=y_for_weights)
        elif self.class_weight is None:
            cw = np.ones(n_classes, dtype=np.float64)
        else:  # a dict; labels of y are checked on the workers
            cw = compute_class_weight(self.class_weight, classes=self.classes_, y=self.classes_)
        self._expanded_class_weight = cw
        if n_classes == 2:
            cw_pos, cw_neg = [cw[1]], [cw[0]]
        else:
            cw_pos, cw_neg = list(cw), [1.0] * n_classes
        K = 1 if n_classes == 2 else n_classes
        return K, {"classes": self.classes_, "cw_pos": cw_pos, "cw_neg": cw_neg}

    def _dask_classes(self, data):
        """Unique labels of a dask y: those the workers counted in its parts."""
        labels = data.parts[2]
        classes = np.empty(0) if labels is None else labels[0]
        if classes.shape[0] == 0:  # an empty input of unknown length (a dask DataFrame)
            raise_no_samples(self, data.n_features)
        check_classification_targets(classes)
        if type_of_target(classes) not in ("binary", "multiclass"):
            raise ValueError(f"Unknown label type: {type_of_target(classes)}")
        return classes

    @staticmethod
    def _dask_balanced_y(data):
        """A label array with the class frequencies of a dask y (for
        'balanced'), from the label counts of its parts."""
        labels = data.parts[2]
        if labels is None:
            return np.empty(0)
        return np.repeat(labels[0], labels[1].astype(int))

    # --- prediction -------------------------------------------------------------------------
    def decision_function(self, X):
        """Confidence scores; a lazy dask array for dask input."""
        if is_dask_collection(X):
            X = self._check_dask_X(X)
            K = self.coef_.shape[0]
            return map_row_blocks(X, _block_decision, _dense(self.coef_), self.intercept_,
                                  n_columns=None if K == 1 else K, dtype=self.coef_.dtype)
        if arrays.is_cupy(X):  # on the device (scikit-learn's would copy X to numpy): a device array
            check_is_fitted(self)
            return _block_decision(self._device_X(X), _dense(self.coef_), self.intercept_)
        return super().decision_function(X)

    def predict(self, X):
        """Class labels; a lazy dask array for dask input."""
        if is_dask_collection(X):
            X = self._check_dask_X(X)
            return map_row_blocks(X, _block_predict, _dense(self.coef_), self.intercept_, self.classes_,
                                  dtype=self.classes_.dtype)
        if arrays.is_cupy(X):  # labels (numpy) of device data, computed on the device
            check_is_fitted(self)
            return _block_predict(self._device_X(X), _dense(self.coef_), self.intercept_, self.classes_)
        return super().predict(X)

    def _check_proba(self):
        if self.loss not in ("log_loss", "modified_huber"):
            raise AttributeError("probability estimates are not available for loss=%r" % self.loss)
        return True

    @available_if(_check_proba)
    def predict_proba(self, X):
        """Probability estimates (``log_loss`` and ``modified_huber``), as
        scikit-learn's; a lazy dask array for dask input."""
        check_is_fitted(self)
        if is_dask_collection(X):
            X = self._check_dask_X(X)
            n = len(self.classes_)
            return map_row_blocks(X, _block_proba, _dense(self.coef_), self.intercept_, self.loss, n, n_columns=n,
                                  dtype=self.coef_.dtype)
        if arrays.is_cupy(X):  # a device array, computed on the device
            return _block_proba(self._device_X(X), _dense(self.coef_), self.intercept_, self.loss, len(self.classes_))
        if self.loss == "log_loss":
            return self._predict_proba_lr(X)
        scores = self.decision_function(X)
        return _block_proba_from_scores(scores, len(self.classes_))

    @available_if(_check_proba)
    def predict_log_proba(self, X):
        """Log of ``predict_proba``."""
        p = self.predict_proba(X)
        if is_dask_collection(p):
            import dask.array as da

            return da.log(p)
        return np.log(p)


def _block_proba_from_scores(scores, n_classes):
    """scikit-learn's modified_huber probabilities from decision values."""
    binary = scores.ndim == 1
    if binary:
        prob2 = np.ones((scores.shape[0], 2))
        prob = prob2[:, 1]
    else:
        prob = scores
    np.clip(scores, -1, 1, prob)
    prob += 1.0
    prob /= 2.0
    if binary:
        prob2[:, 0] -= prob
        return prob2
    prob_sum = prob.sum(axis=1)
    all_zero = prob_sum == 0
    if np.any(all_zero):
        prob[all_zero, :] = 1
        prob_sum[all_zero] = len(prob[0])
    prob /= prob_sum.reshape((prob.shape[0], -1))
    return prob


def _dask_score(est, X, y, sample_weight, metric):
    """scikit-learn's score of a dask input: the lazy predictions (whose
    lengths a dask DataFrame leaves unknown, which scikit-learn's metrics
    call ``len`` on) computed with the targets and weights, on the client."""
    import dask

    pred, y, sample_weight = dask.compute(est.predict(X), y, sample_weight)
    return float(metric(np.asarray(y), np.asarray(pred),
                        sample_weight=None if sample_weight is None else np.asarray(sample_weight)))


def _dense(coef):
    """``coef_`` as the blocks' tasks and the device take it: dense, also
    after ``sparsify()`` (scikit-learn's, which keeps predicting)."""
    return coef.toarray() if sp.issparse(coef) else coef


def _block_decision(X, coef, intercept):
    """Task: decision values of one block (numpy, scipy.sparse or cupy)."""
    if hasattr(X, "to_numpy"):
        X = X.to_numpy()
    xp = arrays.xp_of(X)
    scores = X @ xp.asarray(coef.T) + xp.asarray(intercept)
    scores = xp.asarray(scores)
    return scores.ravel() if scores.shape[1] == 1 else scores


def _block_predict(X, coef, intercept, classes):
    s = _block_decision(X, coef, intercept)
    xp = arrays.namespace(s)
    idx = (s > 0).astype(int) if s.ndim == 1 else xp.argmax(s, axis=1)
    return classes[arrays.to_numpy(idx)]


def _block_proba(X, coef, intercept, loss, n_classes):
    s = _block_decision(X, coef, intercept)
    xp = arrays.namespace(s)
    if loss == "log_loss":
        p = _expit(s, xp)
        if s.ndim == 1:
            return xp.stack([1 - p, p], axis=1)
        return p / xp.sum(p, axis=1, keepdims=True)
    # modified_huber, as scikit-learn's SGDClassifier.predict_proba
    if s.ndim == 1:
        p1 = (xp.clip(s, -1, 1) + 1) / 2.0
        return xp.stack([1 - p1, p1], axis=1)
    p = (xp.clip(s, -1, 1) + 1) / 2.0
    norm = xp.sum(p, axis=1, keepdims=True)
    all_zero = norm[:, 0] == 0
    p = xp.where(all_zero[:, None], 1.0 / n_classes, p / xp.where(norm == 0, 1.0, norm))
    return p


class SGDRegressor(_DaskScore, RegressorMixin, _BaseSGDPS):
    """Linear regression trained by SGD on the parameter server.

    The parameters and fitted attributes are scikit-learn's
    :class:`sklearn.linear_model.SGDRegressor`, plus ``n_jobs``,
    ``batch_size``, ``consistency``, ``client``, ``checkpoint``,
    ``checkpoint_every`` and ``replication`` (see :class:`SGDClassifier`,
    also for what ``shuffle`` does on sparse data: rounds fixed per fit,
    their order and the order of their samples reshuffled each epoch).
    ``predict`` returns a lazy dask array for dask input. Fitted attributes
    as scikit-learn's, plus ``metrics_``, ``run_ids_`` and ``rollbacks_``; ``verbose``,
    the progress bar and ``partial_fit`` of small blocks as in
    :class:`SGDClassifier`.

    Parameters
    ----------
    n_jobs : int, default=None
        The number of participants of a fit, as in :class:`SGDClassifier`
        (scikit-learn's regressor has no such parameter).
    """

    _is_classifier = False
    _metric = "r2_score"
    loss_functions = _SkSGDRegressor.loss_functions  # as SGDClassifier's
    _parameter_constraints: dict = _constraints(_SkSGDRegressor)
    __init__ = _storing_init({"loss": "squared_error", **_SHARED_DEFAULTS, "learning_rate": "invscaling",
                              "power_t": 0.25, **PS_DEFAULTS})

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, sample_weight=None):
        """One epoch of SGD over the given samples (``max_iter=1``)."""
        first = not hasattr(self, "coef_")
        if first:
            self._more_validate_params(for_partial_fit=True)
        return self._partial_fit(X, y, 1, sample_weight, None, None, None, reset=first, in_process=True)

    def _targets(self, data, classes):
        return 1, {}

    def _store(self, W, K, d):
        super()._store(W, K, d)
        self.coef_ = self.coef_.ravel()
        self.intercept_ = np.atleast_1d(self.intercept_)
        if self.average:
            self._standard_coef = self._standard_coef.ravel()
            self._average_coef = self._average_coef.ravel()

    def _decision_function(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", reset=False)
        return np.asarray(X @ self.coef_.T).ravel() + self.intercept_

    def predict(self, X):
        """Predicted targets; a lazy dask array for dask input."""
        if is_dask_collection(X):
            X = self._check_dask_X(X)
            return map_row_blocks(X, _block_decision, _dense(self.coef_).reshape(1, -1), self.intercept_,
                                  dtype=self.coef_.dtype)
        if arrays.is_cupy(X):  # a device array, computed on the device
            check_is_fitted(self)
            return _block_decision(self._device_X(X), _dense(self.coef_).reshape(1, -1), self.intercept_)
        return self._decision_function(X)
