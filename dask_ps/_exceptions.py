"""Exceptions raised by dask_ps.

Hierarchy::

    PSError                      base of everything dask_ps raises itself
    ├── TableError               a table-level problem (also a KeyError/ValueError)
    │   ├── UnknownTableError    no such table (KeyError)
    │   ├── TableExistsError     created twice with different specs (ValueError)
    │   ├── PSValueError         bad push/pull input: shape, dtype, rows, NaN (ValueError)
    │   └── DataLostError        blocks lost with a worker, no replica or checkpoint
    ├── StaleVersionError        a message carried an old table version; refresh and retry
    ├── RunAbortedError          a run was aborted because another participant failed
    └── ClockTimeoutError        waiting for the consistency bound took too long (TimeoutError)

Errors raised inside worker or scheduler handlers travel back to the caller as
the same exception type (Dask re-raises them), so the caller always sees one
of these with a message that names the table.
"""

from __future__ import annotations


class PSError(Exception):
    """Base class of all dask_ps errors."""


class TableError(PSError):
    """A problem with one table; ``table`` names it."""

    def __init__(self, message: str, table: str | None = None):
        super().__init__(message)
        self.table = table

    def __reduce__(self):
        return (type(self), (self.args[0], self.table))

    def __str__(self):  # KeyError would otherwise repr() the message
        return str(self.args[0])


class UnknownTableError(TableError, KeyError):
    """The table does not exist (or was dropped)."""


class TableExistsError(TableError, ValueError):
    """A table of that name exists with a different spec."""


class PSValueError(TableError, ValueError):
    """A push or pull had bad input; nothing was stored."""


class DataLostError(TableError):
    """Row blocks were lost with their worker and could not be recovered
    (no live replica, no checkpoint). Drop the table or ``load`` a checkpoint."""


class StaleVersionError(PSError):
    """A message used an outdated table version (placement changed). Retry."""


class RunAbortedError(PSError):
    """The run this participant belongs to was aborted."""


class ClockTimeoutError(PSError, TimeoutError):
    """A consistency wait exceeded ``ps.timeouts.clock``; names who is behind."""
