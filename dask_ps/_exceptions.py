"""Exceptions raised by dask_ps.

Hierarchy::

    PSError                      base of everything dask_ps raises itself
    ├── TableError               a table-level problem (also a KeyError/ValueError)
    │   ├── UnknownTableError    no such table (KeyError)
    │   ├── TableExistsError     created twice with different specs (ValueError)
    │   ├── PSValueError         bad push/pull input: shape, dtype, rows, NaN (ValueError)
    │   ├── DataLostError        blocks lost with a worker, no replica or checkpoint
    │   └── RolledBackError      blocks restored from a checkpoint: updates lost (runs; a client's next call)
    ├── StaleVersionError        a message carried an old table version; refresh and retry
    │   ├── ForwardRefusedError  a replica refused a push forwarded by a worker behind its placement
    │   └── RowListMissingError  a message named a row list by a key its server does not hold
    ├── InternalOnlyError        a handler only the cluster's scheduler and workers may call (PermissionError)
    ├── RunAbortedError          a run was aborted because another participant failed
    ├── SchedulerLostError       the Dask scheduler (and with it every table) is gone
    ├── NoWorkersError           no worker joined the scheduler in time (TimeoutError)
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


class RolledBackError(TableError):
    """Blocks of a table were lost with a worker (no replica) and restored
    from the table's latest checkpoint: every update made to them since that
    checkpoint is gone. Raised by :meth:`~dask_ps.ParameterServer.run` after
    a run during which a table it used was restored (the run's own updates
    are gone too), and once by a client's next call on a table restored
    outside a run (``push``, ``push_rows``, ``pull``, ``pull_rows``; see
    ``docs/reliability.rst``).

    Attributes
    ----------
    table : str
        The first rolled-back table (``rollbacks`` lists all of them).
    rollbacks : list of dict
        One record per restore: ``table``, ``blocks``, ``reason``,
        ``checkpoint`` (its path), ``checkpoint_time`` and ``restored_at``
        (Unix seconds), ``clocks`` (the run's participants' clocks at the
        restore) and ``run_started`` (Unix seconds).
    results : list or None
        What the run's participants returned (the run did finish).
    run_id : str or None
    """

    def __init__(self, message: str, table: str | None = None, rollbacks=None, results=None, run_id=None):
        super().__init__(message, table)
        self.rollbacks = list(rollbacks or [])
        self.results = results
        self.run_id = run_id

    def __reduce__(self):
        return (type(self), (self.args[0], self.table, self.rollbacks, self.results, self.run_id))

    @classmethod
    def from_run(cls, run_id: str, rollbacks: list[dict], results=None) -> RolledBackError:
        """The error for ``run_id`` whose tables were restored as ``rollbacks`` say."""
        parts = []
        for r in rollbacks:
            before = r["checkpoint_time"] is not None and r["checkpoint_time"] <= r["run_started"]
            age = (f"saved or loaded {r['restored_at'] - r['checkpoint_time']:.1f} s before the restore"
                   if r["checkpoint_time"] is not None else "of unknown age")
            parts.append(
                f"table {r['table']!r}: block(s) {r['blocks']} were lost ({r['reason']}) and restored from "
                f"the checkpoint at {r['checkpoint']!r} ({age}"
                f"{', before this run started' if before else ''}); every update to those blocks since then "
                f"is gone, including this run's up to its participants' clocks {r['clocks']} at the restore"
            )
        return cls(
            f"run {run_id} finished, but a table it used was rolled back: " + "; ".join(parts)
            + ". The table now mixes checkpoint and current blocks. Load the checkpoint again "
            "(ps.load(path, overwrite=True)) and redo the work since it, or use replication=2.",
            rollbacks[0]["table"] if rollbacks else None, rollbacks, results, run_id,
        )


    @classmethod
    def from_client(cls, table: str, rollbacks: list[dict]) -> RolledBackError:
        """The error a client's next call on ``table`` raises once (doing
        nothing) after ``rollbacks`` restored blocks of it outside a run."""
        parts = []
        for r in rollbacks:
            age = (f"saved or loaded {r['restored_at'] - r['checkpoint_time']:.1f} s before the restore"
                   if r.get("checkpoint_time") is not None else "of unknown age")
            parts.append(f"block(s) {r['blocks']} were lost ({r['reason']}) and restored from the checkpoint "
                         f"at {r['checkpoint']!r} ({age})")
        return cls(
            f"table {table!r} was rolled back: " + ("; ".join(parts) or "blocks were restored from a checkpoint")
            + ". Every update to those blocks since the checkpoint is gone, this client's acknowledged "
            "pushes included; the table now mixes checkpoint and current blocks. "
            + "This call did nothing; raised once: the next call on the table proceeds. Load the checkpoint again "
            "(ps.load(path, overwrite=True)) and redo the work since it, or use replication=2.",
            table, rollbacks,
        )


class StaleVersionError(PSError):
    """A message used an outdated table version (placement changed). Retry."""


class ForwardRefusedError(StaleVersionError):
    """A replica refused a push forwarded to it: the forwarding worker's
    placement of the table is older than the replica's, so it is not the
    blocks' primary any more. The forwarder's caller refreshes and retries
    at the current primary; the replica is not at fault."""


class RowListMissingError(StaleVersionError):
    """A message named a row list by a key (``dask_ps._row_lists``) that
    its server does not hold (restarted, failed over, evicted it): nothing
    of the message was applied. The sender sends it again with its rows;
    ``keys`` names the keys refused."""

    def __init__(self, message: str, keys=()):
        super().__init__(message)
        self.keys = list(keys)

    def __reduce__(self):
        return (type(self), (self.args[0], self.keys))


class InternalOnlyError(PSError, PermissionError):
    """A worker handler that only the cluster's scheduler and workers may
    call (placement changes, forwarded pushes, clock events) was called
    without the cluster's internal token. See ``docs/security.rst``: this
    guards against mistakes and stray messages, not against someone who can
    run code in the cluster."""


class RunAbortedError(PSError):
    """The run this participant belongs to was aborted."""


class RunEndedError(RunAbortedError):
    """The run has ended, or its caller aborted it: nobody waits for this
    participant's result (Ctrl-C, or another participant's error already
    raised to the caller), so it ends quietly (``_session.participant``)."""


class SchedulerLostError(PSError):
    """The client lost its Dask scheduler (killed, closed, or replaced by a
    new one). The scheduler held every table's metadata and the runs, and Dask
    workers close when their scheduler connection breaks, so the tables are
    gone: start a new scheduler and workers, then ``ps.load`` a checkpoint
    (see ``docs/reliability.rst``, "Losing the scheduler")."""


class ClockTimeoutError(PSError, TimeoutError):
    """A consistency wait exceeded ``ps.timeouts.clock``; names who is behind."""


class NoWorkersError(PSError, TimeoutError):
    """No Dask worker served the parameter server within
    ``ps.timeouts.no-workers``: nothing could run (issue 24). ``address``
    is the scheduler's; the message says what to start."""

    def __init__(self, message: str, address: str | None = None):
        super().__init__(message)
        self.address = address

    def __reduce__(self):
        return (type(self), (self.args[0], self.address))


class CopiesDisagreeError(PSError):
    """A run finished, but copies of blocks of a table it used held
    different updates at its end (a copy missed some): its participants may
    have read the wrong copy, so its result is not trusted. The copies are
    copied again (the table is right again afterwards); redo the run.
    ``copies``: ``{table: [[block, worker, updates, highest], ...]}``."""

    def __init__(self, message, copies=None, results=None):
        super().__init__(message)
        self.copies = copies or {}
        self.results = results
