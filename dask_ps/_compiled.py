"""Compiled kernels, cached outside the package directory.

numba's ``cache=True`` writes its cache files (``*.nbi``, ``*.nbc``) next
to the source file, in ``__pycache__`` inside the installed package
(site-packages), unless ``numba.config.CACHE_DIR`` is set when the function
is decorated. :func:`njit` sets it for dask_ps's kernels only (the
estimators' and the wire codec's, ``_sparse_rows``), while
it decorates them, to :func:`kernel_cache_dir`:

1. ``dask.config`` ``ps.kernel-cache-dir`` when set (also
   ``DASK_PS__KERNEL_CACHE_DIR``);
2. else ``NUMBA_CACHE_DIR`` when set (numba's own setting);
3. else the user's cache directory: ``$XDG_CACHE_HOME`` or ``~/.cache`` on
   Linux, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows,
   then ``dask_ps/numba``;
4. and when that cannot be written, ``<tempdir>/dask_ps-numba-<user>``.

numba keys its files by the source file's path and modification time, so
installs and versions do not mix. A fresh install compiles each kernel once
per signature (about 2 s for the SGD kernels, once per process: the embedded
cluster's workers are threads of the caller); later processes load it.
Other numba code in the program keeps numba's own settings.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
import sys
import tempfile
import threading

import dask

logger = logging.getLogger(__name__)

_decorating = threading.Lock()


def _user_cache_home() -> str:
    home = os.path.expanduser("~")
    if sys.platform == "win32":
        return os.environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Caches")
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def _temp_cache_dir() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name (some containers)
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"dask_ps-numba-{user}")


def kernel_cache_dir() -> str:
    """Where the estimators' compiled kernels are cached (see the module
    docstring for the order of the settings); created if missing."""
    configured = dask.config.get("ps.kernel-cache-dir", None)
    if configured:
        path = os.path.expanduser(os.fspath(configured))
    elif os.environ.get("NUMBA_CACHE_DIR"):
        path = os.environ["NUMBA_CACHE_DIR"]
    else:
        path = os.path.join(_user_cache_home(), "dask_ps", "numba")
    if not _writable(path):
        fallback = _temp_cache_dir()
        logger.info("dask_ps: cannot write compiled kernels to %s; caching them in %s", path, fallback)
        path = fallback
        os.makedirs(path, exist_ok=True)
    return path


def njit(*, cache=True, **options):
    """``numba.njit(cache=True, **options)``, caching in
    :func:`kernel_cache_dir` instead of the package directory
    (``cache=False``: plain ``numba.njit(**options)``, e.g. for helpers
    that are only inlined).

    numba reads ``numba.config.CACHE_DIR`` when it decorates (its cache
    locator is made then), so it is set for the decoration only and put
    back: the rest of the program's numba code is left alone."""
    import numba

    def decorate(fn):
        if not cache:
            return numba.njit(**options)(fn)
        with _decorating:
            previous = numba.config.CACHE_DIR
            numba.config.CACHE_DIR = kernel_cache_dir()
            try:
                return numba.njit(cache=True, **options)(fn)
            finally:
                numba.config.CACHE_DIR = previous

    return decorate


def lazy(fn, **options):
    """``fn`` compiled by :func:`njit` (``**options``) at its first call:
    numba is imported and the kernel loaded (or compiled) then, not when
    the module that holds ``fn`` is imported (the wire codec and the push's
    copy, which a process may never use)."""
    compiled = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal compiled
        if compiled is None:
            compiled = njit(**options)(fn)
        return compiled(*args)

    return call
