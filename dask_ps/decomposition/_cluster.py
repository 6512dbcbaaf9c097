"""Which parameter server an estimator with ``client=None`` trains on.

``client=None`` means: the current Dask client if there is one, otherwise a
``LocalCluster`` started once per process, kept for later fits and closed at
interpreter exit. Public ``dask_ps`` API only.
"""

from __future__ import annotations

import atexit
import logging
import threading

from distributed import get_client

import dask_ps

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_auto_ps: dask_ps.ParameterServer | None = None


def parameter_server(client=None) -> dask_ps.ParameterServer:
    """A :class:`dask_ps.ParameterServer` on ``client``, on the current
    client, or on a process-wide auto-started ``LocalCluster``."""
    global _auto_ps
    if client is not None:
        return dask_ps.ParameterServer(client)
    try:
        current = get_client()
    except ValueError:
        current = None
    with _lock:
        if _auto_ps is not None and (current is None or current is _auto_ps.client):
            if _auto_ps.client.status == "running":
                return _auto_ps
            _auto_ps = None
        if current is not None:
            return dask_ps.ParameterServer(current)
        logger.info("dask_ps: no Dask client; starting a LocalCluster (closed at exit)")
        _auto_ps = dask_ps.ParameterServer()
        return _auto_ps


@atexit.register
def _close_auto() -> None:
    global _auto_ps
    ps, _auto_ps = _auto_ps, None
    if ps is not None:
        try:
            ps.close()
        except Exception:  # pragma: no cover - interpreter shutting down
            pass
