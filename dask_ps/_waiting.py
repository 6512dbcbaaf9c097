"""How ``ParameterServer.run``'s caller waits for the participants' futures."""

from __future__ import annotations

import threading

# Participants of runs whose caller stopped waiting (Ctrl-C), held until they
# end: see keep_until_done.
_finishing: set = set()
_lock = threading.Lock()


def gather_outside_the_pool(client, futures):
    """``client.gather(futures)``; called from inside a Dask task (a fit run
    by joblib's dask backend or a dask-ml search), the waiting thread first
    secedes from the worker's pool, whose threads the participants need,
    and rejoins it afterwards (as ``distributed.worker_client`` does)."""
    from distributed import get_worker, rejoin, secede

    try:
        get_worker()
    except ValueError:
        return client.gather(futures)
    try:
        secede()
    except KeyError:  # out of the pool already: a participant (a ps.run inside a run's fn)
        return client.gather(futures)
    try:
        return client.gather(futures)
    finally:
        rejoin()


def keep_until_done(futures) -> None:
    """Hold the futures of an interrupted run's participants until each
    has ended (they end quietly at their next call to the parameter server,
    ``RunEndedError``).

    ``Client.gather`` interrupted by Ctrl-C leaves its per-future waiters
    running on the client's event loop; a future released before its task
    ended is cancelled, and each such waiter then ends with Dask's
    ``AllExit``, printed as "Task exception was never retrieved" (issue 35:
    one traceback per participant). The ended ones are let go at the next
    call, not by a done callback: Dask runs those on an executor that is
    shut down when the process exits, and a participant ending then
    printed tornado's "cannot schedule new futures after shutdown"."""
    with _lock:
        _finishing.difference_update([f for f in _finishing if f.done()])
        _finishing.update(futures)
