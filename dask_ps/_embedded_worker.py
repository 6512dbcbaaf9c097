"""Worker preload of the embedded cluster's worker processes
(``ps.embedded-cluster.processes: true``, :class:`dask_ps._embedded_cluster._EmbeddedNanny`).

Ctrl-C in a terminal sends SIGINT to the whole foreground process group,
the embedded cluster's worker processes included: each died with a
``KeyboardInterrupt`` traceback, the interrupted fit's participants were
lost ("Task exception was never retrieved ... AllExit" in the caller), and
the next fit waited 30 s for workers and raised ``NoWorkersError`` (issue
35). The user's Ctrl-C is meant for their program, which gets it; the
cluster it started without being asked is closed at exit.
"""

from __future__ import annotations

import signal
import threading


def dask_setup(worker) -> None:
    """Ignore SIGINT in this worker process (the main thread runs the
    worker's event loop; a worker of another kind is left alone)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
