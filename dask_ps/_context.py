"""What a participant may call: the ``ctx`` of ``ParameterServer.run``.

:class:`ParticipantContext` is the participant's whole interface to the
parameter server (ps-lite's ``KVWorker``: push, pull, their zero-copy and
ahead-of-time variants, and the clock). :class:`~dask_ps.Session` implements
it; the estimators (``dask_ps.linear_model``, ``dask_ps.decomposition``)
type their participants against it and call nothing else, so a reader
follows a participant's calls into the parameter server through this one
page, and a session can change inside without touching them
(``tests/test_architecture.py`` checks both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dask_ps._flights import PullHandle, PushHandle

__all__ = ["ParticipantContext"]


@runtime_checkable
class ParticipantContext(Protocol):
    """The participant API: ``pull -> compute -> push -> clock()``.

    Pushes are buffered and sent at ``flush``/``clock``; reads are as fresh
    as the table's consistency model guarantees at the participant's
    clock, with its own pending pushes included. Communication can overlap
    computation: ``prefetch``/``prefetch_rows`` start a read and return a
    handle whose ``result()`` is the read; ``flush(wait=False)`` and
    ``clock(wait=False)`` send in the background.

    A participant trained in the calling process (a ``partial_fit`` of a
    small block, ``linear_model._in_process``) gets a context that
    implements the part a lone participant uses (push, pull, flush,
    metrics; it never clocks and reads nothing ahead).

    Attributes
    ----------
    rank : int
        This participant's index in ``parts``.
    n_participants : int
        Participants in the run.
    run_id : str or None
        The run's id (the key of ``ParameterServer.metrics()``); None for a
        participant trained in the calling process.
    """

    rank: int
    n_participants: int
    run_id: str | None

    @property
    def current_clock(self) -> int:
        """Number of ``clock()`` calls completed by this participant."""

    def push(self, name: str, values, copy: bool = True) -> None:
        """Buffer an update of the whole table ``name`` (``copy=False``:
        hand ``values`` over until the push is acknowledged)."""

    def push_rows(self, name: str, rows, values, copy: bool = True) -> None:
        """Buffer an update of ``rows`` of table ``name``."""

    def flush(self, wait: bool = True) -> PushHandle | None:
        """Send every buffered push now (``wait=False``: in the background,
        returning a handle)."""

    def clock(self, wait: bool = True) -> None:
        """End of one iteration: flush, then count the clock."""

    def pull(self, name: str, with_clocks: bool = False):
        """The whole table, within its consistency bound, with own pushes
        (``with_clocks``: and per row the clock below which every
        participant's pushes are in it)."""

    def pull_rows(self, name: str, rows, with_clocks: bool = False):
        """Values of ``rows`` (any order, duplicates allowed)."""

    def prefetch(self, name: str, for_clock: int | None = None) -> PullHandle:
        """Start reading the whole table; ``result()`` is what ``pull`` would return then."""

    def prefetch_rows(self, name: str, rows, for_clock: int | None = None) -> PullHandle:
        """Start reading ``rows``; ``result()`` is what ``pull_rows`` would return then."""

    def uncache(self, name: str) -> None:
        """Forget the cached copies of table ``name``'s rows (always legal)."""

    def held_bytes(self, name: str) -> int:
        """Bytes of table ``name`` this participant's context holds."""

    def metrics(self) -> dict:
        """This participant's counters: clocks, waits, messages, per table."""
