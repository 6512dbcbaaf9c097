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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import multiprocessing
import os

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
