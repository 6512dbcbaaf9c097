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
per signature and case (:class:`Specializations`; about 0.5 s of CPU for
a case of the SGD round kernel), once per process (the embedded cluster's
workers are threads of the caller; worker processes each compile what they
need, at the same time, unless the cache holds it); later processes load
it. Other numba code in the program keeps numba's own
settings.

A compile that lasts longer than ``ps.compile-notice`` (2 s) says
so (:class:`CompileNotice`): a line on this module's logger at INFO, and
under ``verbose`` a line of every estimator fit running in the process
(``Progress.note``), naming the kernel, the types and the cache directory.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
import sys
import tempfile
import threading
import time
import weakref

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


def _types_text(args) -> str:
    """The data's types in words (the first floating-point array's dtype
    of numba's argument types, and its being read-only), e.g. ``float64 data``."""
    for a in args:
        dtype = getattr(a, "dtype", None)
        if hasattr(a, "ndim") and dtype is not None and "float" in str(dtype):
            return f"{dtype} data"
    return "its arguments' types"


class CompileNotice:
    """Says what a long compile of a dask_ps kernel is: a listener of
    numba's ``numba:compile`` events (fired for compiles only, not for
    kernels loaded from the cache) that starts a timer at the outermost
    dask_ps compile of a thread; past ``ps.compile-notice`` the
    timer logs a line (INFO) and hands it to every registered sink (the
    ``Progress.note`` of the verbose fits of the process), and the end of
    the compile logs its duration. Installed once per process by
    :func:`njit`."""

    _installed = False
    _lock = threading.Lock()
    _sinks: weakref.WeakSet = weakref.WeakSet()

    def __init__(self):
        import numba.core.event as ev

        class _Listener(ev.Listener):
            def on_start(listener, event):
                self._start(event.data)

            def on_end(listener, event):
                self._end(event.data)

        self.listener = _Listener()
        self._local = threading.local()

    @classmethod
    def install(cls) -> None:
        with cls._lock:
            if not cls._installed:
                import numba.core.event as ev

                ev.register("numba:compile", cls().listener)
                cls._installed = True

    @classmethod
    def add_sink(cls, sink) -> None:
        """``sink.note(text)`` is called with each notice while ``sink``
        lives (an estimator's ``Progress`` with ``verbose``)."""
        with cls._lock:
            cls._sinks.add(sink)

    @classmethod
    def remove_sink(cls, sink) -> None:
        with cls._lock:
            cls._sinks.discard(sink)

    def _start(self, data) -> None:
        fn = _ours(data)
        depth = getattr(self._local, "depth", 0)
        if fn is None:
            return
        self._local.depth = depth + 1
        if depth:  # a kernel compiled inside another's compile: the outer one speaks
            return
        name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
        after = _notice_seconds()
        state = {"name": name, "start": time.perf_counter(), "said": False}
        text = (f"dask_ps: compiling the kernel {name} for {_types_text(data.get('args', ()))} (numba; once per "
                f"install and set of types: later processes load it from {kernel_cache_dir()})")

        def say():
            state["said"] = True
            self.say(f"{text}; {time.perf_counter() - state['start']:.1f} s so far")

        state["timer"] = timer = threading.Timer(after, say)
        timer.daemon = True
        timer.start()
        self._local.state = state

    def _end(self, data) -> None:
        if _ours(data) is None:
            return
        self._local.depth = max(0, getattr(self._local, "depth", 1) - 1)
        state = getattr(self._local, "state", None)
        if self._local.depth or state is None:
            return
        self._local.state = None
        state["timer"].cancel()
        seconds = time.perf_counter() - state["start"]
        if state["said"]:
            self.say(f"dask_ps: compiled the kernel {state['name']} in {seconds:.1f} s")
        else:
            logger.debug("dask_ps: compiled the kernel %s in %.2f s", state["name"], seconds)

    @classmethod
    def say(cls, text: str) -> None:
        logger.info(text)
        with cls._lock:
            sinks = list(cls._sinks)
        for sink in sinks:
            try:
                sink.note(text)
            except Exception:  # noqa: BLE001 - a notice never fails a compile
                pass


def _ours(data):
    """The Python function of a compile event's dispatcher where it is one of
    dask_ps's kernels, else None. The listener hears every numba compile of
    the process: the user's too, whose functions may have no module (made by
    ``exec``: ``__module__`` None)."""
    fn = getattr(data.get("dispatcher"), "py_func", None)
    module = getattr(fn, "__module__", None)
    return fn if isinstance(module, str) and module.startswith("dask_ps") else None


def _notice_seconds() -> float:
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("ps.compile-notice", "2s")))


def njit(*, cache=True, **options):
    """``numba.njit(cache=True, **options)``, caching in
    :func:`kernel_cache_dir` instead of the package directory
    (``cache=False``: plain ``numba.njit(**options)``, e.g. for helpers
    that are only inlined).

    numba reads ``numba.config.CACHE_DIR`` when it decorates (its cache
    locator is made then), so it is set for the decoration only and put
    back: the rest of the program's numba code is left alone."""
    import numba

    CompileNotice.install()

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


class Specializations:
    """Copies of a kernel's Python function compiled with some names of its
    body bound to constants, one :func:`njit` dispatcher per set of
    constants, made at its first use.

    numba prunes the branches on a constant before type inference (module
    globals and closure variables are constants to it; arguments are not),
    so a copy compiles only the code its constants select. A kernel written
    for every case (scikit-learn's SGD rule: eight losses, four penalties,
    six learning rates, averaging, dense and sparse data) compiles about a
    third of its code for one fit (issue 35: 2.0 -> 0.5 s of CPU for the
    SGD round kernel's dense hinge/L2/optimal specialization).

    ``fn``'s body reads the constants as global names that ``fn``'s module
    does not define. ``make(**constants)`` returns the dispatcher of those
    values (the same one for the same values); ``derive(constants)``, if
    given, returns more such names whose values follow from the constants
    (flags computed from them, the compiled kernels the body calls). Each
    copy is named ``<name>__<constant>_<value>...`` (its ``__qualname__``;
    ``name``: ``fn``'s by default, its ``__name__`` in compile notices):
    numba's cache files are per qualified name, and its cache index keys a
    function by its bytecode and argument types only, not by the globals it
    reads, so the name keeps the copies' cache entries apart.
    ``**options``: :func:`njit`'s."""

    def __init__(self, fn, derive=None, name=None, **options):
        self.fn = fn
        self.name = name or fn.__name__
        self.derive = derive
        self.options = options
        self._made: dict = {}
        self._lock = threading.Lock()

    def make(self, **constants):
        key = tuple(sorted(constants.items()))
        dispatcher = self._made.get(key)
        if dispatcher is None:
            with self._lock:  # one dispatcher per key (the embedded cluster's workers are threads)
                dispatcher = self._made.get(key)
                if dispatcher is None:
                    dispatcher = self._made[key] = njit(**self.options)(self._copy(constants))
        return dispatcher

    def _copy(self, constants):
        import types

        for name, value in constants.items():
            if not isinstance(value, (bool, int)):
                raise TypeError(f"{self.fn.__name__}'s constant {name} must be an int or a bool, got {value!r}")
        fn = self.fn
        names = {**constants, **(self.derive(constants) if self.derive else {})}
        local = sorted(set(names) & set(fn.__code__.co_varnames))
        if local:  # a local (an argument, an assignment) hides the global: its branches would not be pruned
            raise TypeError(f"{fn.__name__} assigns {local}: its constants must be read-only names of its body")
        copy = types.FunctionType(fn.__code__, {**fn.__globals__, **names}, self.name, fn.__defaults__)
        copy.__qualname__ = self.name + "__" + "_".join(f"{k}_{int(v)}" for k, v in sorted(constants.items()))
        copy.__doc__ = fn.__doc__
        copy.__module__ = fn.__module__
        return copy

    def dispatchers(self) -> list:
        """The dispatchers made so far in this process."""
        return list(self._made.values())


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
