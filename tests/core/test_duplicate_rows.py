"""Duplicate rows in one ``push_rows``: summed before the table's rule is
applied (``np.add.at`` semantics for an update), for every rule but
``assign`` (the last occurrence wins), on both paths: the client's
``ParameterServer.push_rows`` and a participant's buffer (``PushBuffer``).
The participant's buffer used to keep only the last occurrence for every
non-additive rule (an SGD step of the last sample's gradient), while the
client summed them."""

from __future__ import annotations

import numpy as np
import pytest

from dask_ps._oplog import PushBuffer
from dask_ps._routing import TableHandle, coalesce_rows
from dask_ps._shard import ShardStore
from dask_ps._spec import TableSpec

ROWS = np.array([5, 1, 5, 7, 5])
VALUES = np.array([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0], [8.0, 80.0], [16.0, 160.0]])
RULES = [("sum", {}), ("sgd", {"lr": 0.5}), ("momentum", {"lr": 0.5, "momentum": 0.9}), ("assign", {})]


def expected(rule: str, hp: dict, init: np.ndarray) -> np.ndarray:
    """The table after one push of ROWS/VALUES, by hand."""
    out = init.copy()
    if rule == "assign":
        for r, v in zip(ROWS, VALUES):  # in order: the last occurrence wins
            out[r] = v
        return out
    update = np.zeros_like(init)
    np.add.at(update, ROWS, VALUES)
    touched = np.unique(ROWS)
    if rule == "sum":
        out[touched] += update[touched]
    else:  # sgd; momentum's first step is the same (v = grad)
        out[touched] -= hp["lr"] * update[touched]
    return out


def applied(spec: TableSpec, init: np.ndarray, messages) -> np.ndarray:
    """What a server holding every block makes of ``messages``."""
    store = ShardStore()
    t = store.create(spec, 1, list(range(spec.n_blocks)))
    for b, blk in t.blocks.items():
        lo, hi = spec.block_bounds(b)
        blk.data[...] = init[lo:hi]
    for items in messages:
        _, checked = store.validate_push(spec.name, 1, [b for b, _, _ in items], [r for _, r, _ in items],
                                         [v for _, _, v in items])
        store.commit(t, store.apply(t, checked))
    return np.concatenate([t.blocks[b].data for b in range(spec.n_blocks)])


@pytest.mark.parametrize("rule,hp", RULES)
def test_a_participants_duplicate_rows_are_summed_unless_the_rule_is_assign(rule, hp):
    spec = TableSpec.create("t", (10, 2), "float64", block_rows=4, rule=rule, **hp)
    h = TableHandle(spec, 1, tuple(("a",) for _ in range(spec.n_blocks)))
    init = np.arange(20.0).reshape(10, 2)
    buf = PushBuffer(spec)
    buf.add_rows(ROWS, VALUES.copy())
    # Summed values can overflow: the buffer says so (checked again at flush).
    assert buf.summed == (rule != "assign")
    messages = list(buf.messages(h).values())
    np.testing.assert_array_equal(applied(spec, init, messages), expected(rule, hp, init))


@pytest.mark.parametrize("rule,hp", RULES)
def test_the_client_and_a_participant_coalesce_duplicate_rows_alike(rule, hp):
    """The client's coalescing (``ParameterServer.push_rows``) and the
    participant's buffer send the same rows and values."""
    spec = TableSpec.create("t", (10, 2), "float64", block_rows=4, rule=rule, **hp)
    client_rows, client_values = coalesce_rows(ROWS, VALUES, additive=spec.rule.name != "assign")
    buf = PushBuffer(spec)
    buf.add_rows(ROWS, VALUES.copy())
    (rows, values), = buf.row_parts or buf.ops
    np.testing.assert_array_equal(rows, client_rows)
    np.testing.assert_array_equal(values, client_values)
