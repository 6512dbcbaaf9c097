"""glibc's allocator in Dask worker processes (``ps.worker-mmap-threshold``).

Dask's nanny starts each worker process with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``), so that freed memory goes back to
the operating system. Setting any glibc malloc parameter also turns off
glibc's *dynamic* mmap threshold, which otherwise rises to the size of the
large blocks a program frees (up to 32 MiB) so that later ones come from the
heap. In a worker the threshold stays at 128 KiB: every array of more than
128 KiB is a fresh ``mmap`` whose pages fault on first use, and is unmapped
when freed. A parameter server makes such arrays all the time (the rows of a
round, the messages' frames, compacted rounds): a one-epoch click-through
fit took 48-50k page faults per worker process against 17k with the nanny's
setting removed (``docs/benchmarks.md``), where a threads-layout fit (no
nanny) reuses its heap.

:func:`raise_mmap_threshold`, called by the worker plugin's setup in a
process the nanny started, sets the mmap threshold to the setting and the
trim threshold to twice that (glibc's own dynamic rule): blocks up to the
threshold are reused from the heap, and at most twice that of free heap is
kept before it is returned to the system.

:func:`freeze_before_exit`, called by the worker plugin's teardown when a
nanny's worker closes, keeps the process's exit short (see there).

:func:`pool_in_process_memory_limits`, called by the worker plugin's setup,
makes the memory limits of workers that share one process (an in-process
``LocalCluster``) count that process against their sum (see there).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import multiprocessing
import os
import weakref

from dask.utils import parse_bytes

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
NANNY_VARIABLE = "MALLOC_TRIM_THRESHOLD_"


def raise_mmap_threshold(threshold, environ=os.environ) -> bool:
    """Set glibc's mmap threshold to ``threshold`` (bytes or a string such as
    ``"32MiB"``; None: leave it) and its trim threshold to twice that, in a
    process whose environment has the nanny's ``MALLOC_TRIM_THRESHOLD_``;
    returns whether it did. Elsewhere (the caller's own process in the
    threads layout, a worker started without the variable, not glibc) it
    changes nothing."""
    if threshold is None or NANNY_VARIABLE not in environ:
        return False
    size = parse_bytes(threshold) if isinstance(threshold, str) else int(threshold)
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if mallopt(M_MMAP_THRESHOLD, size) != 1 or mallopt(M_TRIM_THRESHOLD, 2 * size) != 1:
        logger.warning("mallopt refused an mmap threshold of %d bytes (glibc allows at most 32 MiB)", size)
        return False
    return True


def freeze_before_exit(worker) -> bool:
    """``gc.freeze()`` in a worker process that a nanny started and that is
    closing (not a plugin unregistered from a running worker, not a worker
    of the caller's own process); returns whether it did.

    Such a process exits next, through ``sys.exit``: interpreter shutdown
    runs full garbage collections over every object still alive, and with
    scikit-learn, scipy and numba imported (a fit's kernels) that took
    1.0-1.9 s at load 14-16 against 0.2 s with the objects frozen (a
    process that only imports ``dask_ps.linear_model``). Close of a
    ``LocalCluster`` of worker processes gives the nanny 4 s (0.8 of its
    5 s) before it kills the process with "Worker process still alive after
    4.0 seconds, killing": on a busy machine every close of a cluster that
    ran a fit printed it, once per worker. Frozen objects are still freed
    by reference counting; only cycles among them are left to the exit.
    """
    from distributed.core import Status

    if worker.status != Status.closing or not getattr(worker, "nanny", None) \
            or multiprocessing.parent_process() is None:
        return False
    gc.freeze()
    return True


_own_limits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # worker -> the limit it was started with


def pool_in_process_memory_limits(worker) -> int | None:
    """Give every nanny-less worker of this process with a memory limit
    the sum of their limits; returns that sum, or None where there is
    nothing to pool (a nanny's worker, no limit, alone in its process).

    Dask's memory monitor compares the memory of the *whole process* with
    each worker's own ``memory_limit``. ``LocalCluster(processes=False,
    n_workers=16)`` gives each worker its share of the machine's memory
    (``"auto"``), so all 16 paused once the process used 80% of one share,
    and a fit failed with Dask's "No valid workers found" after 30 s
    (issue 35). With the limits pooled they pause, spill and warn as one
    process with the sum of the limits the user gave (at most the machine's
    memory, as Dask caps each limit). ``memory_limit=0``
    when starting the cluster gives in-process workers no limit at all.
    """
    from distributed import Worker

    mm = getattr(worker, "memory_manager", None)
    if getattr(worker, "nanny", None) or mm is None or not mm.memory_limit:
        return None
    _own_limits.setdefault(worker, mm.memory_limit)
    sharing = [w for w in list(Worker._instances)
               if not getattr(w, "nanny", None) and w.status.name not in ("closing", "closed", "failed")
               and (w in _own_limits or getattr(w.memory_manager, "memory_limit", None))]
    if len(sharing) < 2:
        return None
    from distributed.system import MEMORY_LIMIT

    # at most the machine's (or cgroup's) memory, as Dask caps one limit
    total = min(sum(_own_limits.setdefault(w, w.memory_manager.memory_limit) for w in sharing), MEMORY_LIMIT)
    changed = [w for w in sharing if w.memory_manager.memory_limit != total]
    for w in changed:
        w.memory_manager.memory_limit = total
    if changed:
        logger.info("dask_ps: %d Dask workers share this process, and Dask compares the whole process's "
                    "memory with each one's memory_limit; their limits now count it against their sum "
                    "(%d bytes). Start them with memory_limit=0 for no limit.", len(sharing), total)
    return total
