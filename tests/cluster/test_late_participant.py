"""A participant whose run was aborted by its caller before it started.

Ctrl-C (or another participant's error) aborts a run while a participant's
task may still be waiting for a thread: on a loaded machine it starts after
the abort. It must end quietly with nothing run (nobody waits for its
result), not fail in its join, which Dask logged as "Compute Failed" in the
middle of the user's terminal (issue 35; seen at load ~20 in
``test_silence.py``'s Ctrl-C test).
"""

from __future__ import annotations

import logging
import uuid

from dask_ps._session import participant
from dask_ps._waiting import _finishing, keep_until_done


def _never(ctx, _):
    raise AssertionError("a participant of an aborted run must not run its function")


def test_a_participant_started_after_its_caller_aborted_the_run_ends_quietly(ps, client, caplog):
    run_id, owner = uuid.uuid4().hex[:12], uuid.uuid4().hex
    ps._sync(ps._scheduler.ps_run_start, run_id=run_id, n=2, name="late", info={}, owner=owner)
    ps._sync(ps._scheduler.ps_run_abort, run_id=run_id, reason="KeyboardInterrupt: ", owner=owner)
    with caplog.at_level(logging.ERROR, logger="distributed.worker"):
        late = client.submit(participant, run_id, 1, 2, _never, None, {}, owner, pure=False)
        assert late.result() is None
    assert not [r for r in caplog.records if "Compute Failed" in r.getMessage()]
    ps._sync(ps._scheduler.ps_run_end, run_id=run_id, owner=owner)


class _Future:
    def __init__(self):
        self.finished = False

    def done(self):
        return self.finished


def test_the_futures_of_an_interrupted_run_are_held_until_they_end():
    """Held while running (a released future is cancelled, and Dask prints
    its waiters' AllExit); let go at the next call once ended, with no done
    callback (Dask runs those on an executor shut down at exit)."""
    first, second = [_Future(), _Future()], [_Future()]
    keep_until_done(first)
    assert set(first) <= _finishing
    first[0].finished = True
    keep_until_done(second)
    assert first[0] not in _finishing and first[1] in _finishing and second[0] in _finishing
    for f in first + second:
        f.finished = True
    keep_until_done([])
    assert not (set(first + second) & _finishing)
