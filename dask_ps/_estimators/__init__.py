"""The machinery every parameter-server estimator shares.

Written against the public ``ParameterServer``/``ctx`` API only (the
counterpart of distributed's ``ShuffleRun``): an estimator is a short
subclass plus its participant function and kernels. The one private
``dask_ps`` package that estimators import. See ``docs/architecture.rst``,
"Estimators".

Parameters (``_params``)
    ``PSEstimatorMixin`` (first base: ``__getstate__`` without the Client,
    ``__sklearn_clone__`` sharing it, ``_parameter_server()``,
    ``_checkpoint_path()``); ``SHARED_CONSTRAINTS`` (client, consistency,
    replication, checkpoint, checkpoint_every, verbose);
    ``max_participants(n_jobs, available)`` (scikit-learn's ``n_jobs`` as the
    number of participants); ``chose_a_cluster(client)`` (a client given
    or current: not the embedded cluster);
    ``setting(estimator, key)``, ``setting_bytes(estimator, key)``
    (``dask.config`` ``ps.<estimator>.<key>``, defaults in ``ps.yaml``).
Training data (``_data``)
    ``TrainingParts`` (``from_pieces``, ``from_chunks``, ``per_worker``;
    ``futures``, ``held``, ``index``, ``gather``, ``keep``,
    ``rebuild_lost``, ``release``, ``exchanged``); ``PartCopies``, ``load_part``.
Runs and checkpoints (``_runs``)
    ``CheckpointMismatchError`` (a ``ValueError``), ``checkpoint_record``,
    ``check_checkpoint``, ``find_checkpoint``, ``save_checkpoint``
    (``SAVE_RETRY_SECONDS``), ``chunk_end``, ``jsonable``;
    ``temporary_tables`` / ``TemporaryTables``; ``cluster_members``,
    ``may_be_worker_loss``, ``lost_workers``, ``MAX_RESTARTS``;
    ``wait_for_participants``, ``participant_worker`` (where a
    participant runs, None in process);
    ``RolledBackError`` (``dask_ps``'s: a run's tables were restored from
    their checkpoint, re-exported for the estimators' drivers).
Progress and metrics (``_progress``)
    ``Progress`` (verbose lines: stdout and the logger; the optional tqdm
    bar, ``ps.progress-bar``), ``PollingMonitor`` (a client thread reading
    the participants' progress while a fit runs), ``rate``,
    ``participant_metrics`` (``metrics_``), ``run_info`` (what the
    dashboard's ``/ps`` page shows of a fit's runs), ``dashboard_run`` (a
    fit trained in the calling process shown there, where a cluster exists).
Prediction on dask collections (``_predict``)
    ``is_dask_collection``, ``is_dask_dataframe``, ``is_dask_array``,
    ``dask_meta``, ``dask_feature_names``, ``check_dask_X``,
    ``map_row_blocks``; checks of dask inputs to ``fit`` with
    scikit-learn's messages: ``check_dask_fit_input``,
    ``known_n_samples``, ``raise_no_samples``; ``InvalidPart`` (a part's
    failed check, returned by the task as a value) and
    ``raise_invalid_parts`` (raised in the caller, lengths as totals).
Arrays (``arrays``, the module)
    ``is_sparse``, ``is_cupy_sparse``, ``xp_of``, ``nbytes``, ``to_host``
    and ``dask_ps._backend``'s ``namespace``, ``to_numpy``, ``all_finite``,
    ``is_cupy``, ``device_module`` (cupy, or the tests' stand-in; estimators
    do not import ``_backend`` itself).
Compiled kernels (``dask_ps._compiled``, re-exported)
    ``njit`` (``numba.njit(cache=True)`` with the cache outside the package
    directory), ``kernel_cache_dir`` (where: ``ps.kernel-cache-dir``,
    ``NUMBA_CACHE_DIR`` or the user's cache directory), ``Specializations``
    (a kernel compiled per set of constants, its unused branches pruned).
The Dask adapter (``_dask_adapter``)
    The only module that uses ``distributed`` internals (matching persisted
    futures to blocks, reading another task's data on a worker).
"""

from dask_ps._compiled import Specializations, kernel_cache_dir, njit  # in the core: the wire codec's kernels use it too
from dask_ps._estimators import _arrays as arrays
from dask_ps._estimators._data import PartCopies, TrainingParts, load_part
from dask_ps._estimators._params import (
    SHARED_CONSTRAINTS,
    PSEstimatorMixin,
    chose_a_cluster,
    max_participants,
    setting,
    setting_bytes,
)
from dask_ps._estimators._predict import (
    InvalidPart,
    check_dask_fit_input,
    check_dask_X,
    dask_feature_names,
    dask_meta,
    is_dask_array,
    is_dask_collection,
    is_dask_dataframe,
    known_n_samples,
    map_row_blocks,
    raise_invalid_parts,
    raise_no_samples,
)
from dask_ps._estimators._progress import (
    PollingMonitor,
    Progress,
    dashboard_run,
    participant_metrics,
    rate,
    run_info,
)
from dask_ps._estimators._runs import (
    MAX_RESTARTS,
    SAVE_RETRY_SECONDS,
    CheckpointMismatchError,
    RolledBackError,
    TemporaryTables,
    check_checkpoint,
    checkpoint_record,
    chunk_end,
    cluster_members,
    find_checkpoint,
    jsonable,
    lost_workers,
    may_be_worker_loss,
    participant_worker,
    run_in_chunks,
    save_checkpoint,
    temporary_tables,
    wait_for_participants,
)

__all__ = [
    "arrays",
    "PSEstimatorMixin", "SHARED_CONSTRAINTS", "max_participants", "setting", "setting_bytes", "chose_a_cluster",
    "TrainingParts", "PartCopies", "load_part",
    "CheckpointMismatchError", "checkpoint_record", "check_checkpoint", "find_checkpoint", "save_checkpoint",
    "SAVE_RETRY_SECONDS", "chunk_end", "jsonable", "temporary_tables", "TemporaryTables",
    "cluster_members", "may_be_worker_loss", "lost_workers", "MAX_RESTARTS", "RolledBackError",
    "wait_for_participants", "participant_worker", "run_in_chunks",
    "Progress", "PollingMonitor", "rate", "participant_metrics", "run_info", "dashboard_run",
    "njit", "kernel_cache_dir", "Specializations",
    "is_dask_collection", "is_dask_dataframe", "is_dask_array", "dask_meta", "dask_feature_names",
    "check_dask_X", "map_row_blocks", "check_dask_fit_input", "known_n_samples", "raise_no_samples",
    "InvalidPart", "raise_invalid_parts",
]
