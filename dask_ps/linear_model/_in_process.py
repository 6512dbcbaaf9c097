"""A lone participant trained in the calling process (``partial_fit`` of a
small block).

``ParameterServer.run`` costs tens of milliseconds per call whatever the
work: a task submitted, scheduled and gathered, the session joining and
leaving the run, the tables created and dropped (``docs/benchmarks.md``,
"partial_fit of small blocks"). A block that the parameter server would
train with one participant anyway (``_participants.participants``)
needs none of it: a lone participant keeps the whole table local, one pull
at its start and one push at its end (``_participant_loop``).
:class:`InProcessSession` is that participant's session with the tables
held here, and the same participant code runs on it in the caller's thread:
the same arithmetic (the push is the server's ``param += update``), so the
same model as the parameter server's path (tested bitwise).
"""

from __future__ import annotations

import numpy as np


class InProcessSession:
    """The ``ctx`` of a lone participant whose tables are held in this
    process: ``pull``/``push`` (sum), ``pull_rows``/``push_rows`` (sum, or
    assign for the tables created with ``assign=True``), ``flush`` (calls
    ``on_flush``), no ``clock`` (a lone participant never clocks);
    ``report_progress(ctx, ...)`` goes to its ``local_run`` if it has one."""

    rank = 0
    n_participants = 1
    current_clock = 0
    run_id = None  # no parameter-server run
    local_run = None  # shown on the /ps page instead (a _dashboard.LocalRun), where a cluster exists

    def __init__(self):
        self.tables: dict[str, np.ndarray] = {}
        self._assign: set[str] = set()
        self.on_flush = None

    def __repr__(self):
        return f"<InProcessSession tables={sorted(self.tables)}>"

    def create_table(self, name, values, assign=False) -> str:
        self.tables[name] = np.array(values, copy=True)
        if assign:
            self._assign.add(name)
        return name

    def pull(self, name):
        return self.tables[name].copy()

    def pull_rows(self, name, rows):
        return self.tables[name][np.asarray(rows)]

    def push(self, name, values) -> None:
        if name in self._assign:
            self.tables[name][...] = values
        else:
            self.tables[name] += values  # the sum rule, as the server applies it

    def push_rows(self, name, rows, values) -> None:
        rows = np.asarray(rows)
        if name in self._assign:
            self.tables[name][rows] = values  # duplicates: the last wins, as on the servers
        elif rows.size < 2 or bool(np.all(rows[1:] > rows[:-1])):
            self.tables[name][rows] += values
        else:
            np.add.at(self.tables[name], rows, values)  # duplicates summed, as a session's push_rows

    def flush(self) -> None:
        if self.on_flush is not None:
            self.on_flush()

    def clock(self) -> None:  # pragma: no cover - a lone participant never clocks
        raise RuntimeError("an in-process participant is alone and does not clock")

    def metrics(self) -> dict:
        return {"clock": 0, "clock_wait_seconds": 0.0, "tables": {}, "in_process": True}
