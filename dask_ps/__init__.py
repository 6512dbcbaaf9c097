"""dask_ps: a parameter server inside any Dask cluster.

>>> import dask_ps
>>> ps = dask_ps.ParameterServer()          # doctest: +SKIP
"""

from dask_ps import _config  # noqa: F401  (registers the ``ps`` dask.config defaults)
from dask_ps._checkpoint import checkpoint_metadata
from dask_ps._client import BlockPlacement, ParameterServer, get_parameter_server
from dask_ps import _dashboard
from dask_ps._dashboard import report_progress
from dask_ps._exceptions import (
    ClockTimeoutError,
    CopiesDisagreeError,
    DataLostError,
    NoWorkersError,
    PSError,
    PSValueError,
    RolledBackError,
    RunAbortedError,
    SchedulerLostError,
    StaleVersionError,
    TableError,
    TableExistsError,
    UnknownTableError,
)
from dask_ps._context import ParticipantContext
from dask_ps._flights import PullHandle, PushHandle
from dask_ps._session import Session
from dask_ps._spec import TableSpec
from dask_ps.consistency import ASP, BSP, CVAP, ESSP, SSP, VAP, Consistency
from dask_ps.rules import SGD, Adagrad, Adam, Assign, Custom, Momentum, Sum, UpdateRule

__version__ = "0.1.0"



def dask_setup(server):
    """``dask scheduler --preload dask_ps``: the scheduler serves the
    ``/ps`` page, linked from its dashboard's navigation, from its start
    (before any run; a worker preloading dask_ps gets nothing from it)."""
    _dashboard.install_page(server)


# /ps on the Dask dashboard of every scheduler of this process, before any
# run (ps.dashboard.on-import).
_dashboard.install_on_import()

__all__ = [
    "ParameterServer", "get_parameter_server", "checkpoint_metadata", "Session", "ParticipantContext",
    "PullHandle", "PushHandle", "report_progress",
    "TableSpec", "BlockPlacement",
    "Consistency", "BSP", "SSP", "ESSP", "VAP", "CVAP", "ASP",
    "UpdateRule", "Sum", "Assign", "SGD", "Momentum", "Adagrad", "Adam", "Custom",
    "PSError", "TableError", "UnknownTableError", "TableExistsError", "PSValueError",
    "StaleVersionError", "RunAbortedError", "ClockTimeoutError", "DataLostError", "RolledBackError",
    "SchedulerLostError", "NoWorkersError", "CopiesDisagreeError",
]
