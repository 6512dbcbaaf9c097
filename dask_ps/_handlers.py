"""The one registry of dask_ps's RPC handlers, each with its access level.

Every ``ps_*`` handler of the scheduler plugin and of the worker plugin is a
method marked with :func:`handler` and its access level, and reaches Dask's
``handlers`` dict only through :meth:`HandlerRegistry.install`, which puts
the check of that level in front of it. No handler is installed any other
way, so none can skip the check (``tests/cluster/test_handler_registry.py``
enumerates the registry and the installed handlers and calls every internal
one without the token).

Levels (``docs/security.rst``):

``INTERNAL``
    Only the cluster's scheduler and workers may call it: the message must
    carry the cluster's internal token (``PSWorkerPlugin.internal_token``),
    which the scheduler plugin's calls (``InternalRPC``), the worker
    plugin's calls and a participant's session (a task in a worker) send.
    Without it the call is refused with :class:`InternalOnlyError` before
    the handler runs.
``CLIENT``
    Any caller, a ``ParameterServer`` in a client process included; it may
    change state (create a table, push, start a run), and validates what it
    acts on.
``READ_ONLY``
    Any caller; it changes nothing (placement, metadata, values).

A handler marked ``tells_internal`` gets ``internal=True`` when the message
carried the token (``ps_push`` and ``ps_pull`` trust a session's checks,
and take some options only from internal callers); the flag is never taken
from the message itself.
"""

from __future__ import annotations

import functools
import hmac
import inspect
from dataclasses import dataclass

from distributed.core import error_message

from dask_ps._exceptions import InternalOnlyError, PSError, PSValueError

INTERNAL = "internal"
CLIENT = "client"
READ_ONLY = "read-only"
LEVELS = (INTERNAL, CLIENT, READ_ONLY)

_MARK = "__ps_handler__"


@dataclass(frozen=True)
class HandlerInfo:
    op: str  # the Dask handler name, "ps_" + the method's name
    method: str
    access: str
    tells_internal: bool = False


def handler(access: str, *, tells_internal: bool = False):
    """Mark a plugin method as the handler ``ps_<method name>`` with ``access``
    (one of :data:`LEVELS`)."""
    if access not in LEVELS:
        raise ValueError(f"access must be one of {LEVELS}, got {access!r}")

    def mark(fn):
        setattr(fn, _MARK, (access, tells_internal))
        return fn

    return mark


def is_internal(token, expected) -> bool:
    """Whether ``token`` is the cluster's internal token ``expected`` (None:
    not known yet, nothing is internal)."""
    return isinstance(token, str) and isinstance(expected, str) and hmac.compare_digest(token, expected)


def check_owner(run, owner) -> None:
    """A run-level call from a client (end, abort) must present the secret
    the run was started with (``RunState.owner``), so that a second client
    of the cluster (another notebook, a re-run cell) cannot end or abort a
    run it did not start (issue 34). A run started without one has no owner."""
    if run.owner is not None and not (isinstance(owner, str) and hmac.compare_digest(owner, run.owner)):
        raise PSValueError(f"run {run.run_id} was started by another client: only that client may end or "
                           "abort it")


class HandlerRegistry:
    """The handlers of one plugin class (``side``: "scheduler" or "worker")."""

    def __init__(self, side: str, cls):
        self.side = side
        self.handlers: dict[str, HandlerInfo] = {}
        for name, fn in inspect.getmembers(cls, callable):
            mark = getattr(fn, _MARK, None)
            if mark is not None:
                op = f"ps_{name}"
                self.handlers[op] = HandlerInfo(op, name, *mark)

    def __repr__(self):
        return f"<HandlerRegistry {self.side}: {len(self.handlers)} handlers>"

    def __iter__(self):
        return iter(self.handlers)

    def __contains__(self, op):
        return op in self.handlers

    def access(self, op: str) -> str:
        return self.handlers[op].access

    def ops(self, access: str | None = None) -> list[str]:
        """The registered handler names (of one access level)."""
        return sorted(op for op, h in self.handlers.items() if access is None or h.access == access)

    def install(self, plugin, handlers: dict, token_of, before=None) -> None:
        """Put every registered handler of ``plugin`` into Dask's ``handlers``
        dict behind the check of its level. ``token_of()``: the cluster's
        internal token now (None refuses every internal call). ``before(op,
        msg)``: a further check of each message (it may pop fields), which
        returns an error reply or None."""
        for op, info in self.handlers.items():
            fn = reply_errors(getattr(plugin, info.method))
            handlers[op] = self._guarded(info, fn, token_of, before)

    def _guarded(self, info: HandlerInfo, fn, token_of, before):
        op, side = info.op, self.side

        @functools.wraps(fn)
        def guarded(**msg):
            internal = is_internal(msg.pop("token", None), token_of())
            msg.pop("internal", None)  # never from the message itself
            msg.pop("pad", None)  # see _wire.aligned
            if before is not None:
                refused = before(op, msg)
                if refused is not None:
                    return refused
            if info.access == INTERNAL and not internal:
                return error_message(InternalOnlyError(
                    f"{op} may be called only by the cluster's scheduler and workers (the {side} "
                    "refused it: the message did not carry the cluster's internal token, which the "
                    "plugins' calls and a participant's session send; docs/security.rst)"
                ), status="uncaught-error")
            if info.tells_internal:
                msg["internal"] = internal
            return fn(**msg)  # a coroutine for async handlers: Dask awaits it

        guarded.__ps_access__ = info.access
        return guarded


class InternalRPC:
    """An rpc (to a worker, or a worker's to the scheduler) whose calls carry
    the cluster's internal token."""

    def __init__(self, rpc, token: str):
        self._rpc, self._token = rpc, token

    def __getattr__(self, op):
        if op.startswith("_"):
            raise AttributeError(op)
        call = getattr(self._rpc, op)
        return lambda **msg: call(token=self._token, **msg)


def reply_errors(handler):
    """Return dask_ps errors to the caller (who re-raises them) without
    Dask logging a traceback for what is only bad input; other exceptions
    keep Dask's default handling."""
    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def wrapper(**msg):
            try:
                return await handler(**msg)
            except PSError as e:
                return error_message(e, status="uncaught-error")
    else:

        @functools.wraps(handler)
        def wrapper(**msg):
            try:
                return handler(**msg)
            except PSError as e:
                return error_message(e, status="uncaught-error")

    return wrapper
