"""Duplicate rows in one ``push_rows`` end the same through the client
(``ParameterServer.push_rows``) and through a participant (``ctx.push_rows``):
summed before the rule is applied, except for ``assign`` (the last
occurrence wins). tests/core/test_duplicate_rows.py checks the pieces."""

from __future__ import annotations

import numpy as np
import pytest

ROWS = [5, 1, 5, 7, 5]
VALUES = np.array([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0], [8.0, 80.0], [16.0, 160.0]])


def _push_duplicates(ctx, _, name):
    ctx.push_rows(name, ROWS, VALUES)
    ctx.clock()


@pytest.mark.parametrize("rule,hp", [("sum", {}), ("sgd", {"lr": 0.5}), ("assign", {})])
def test_duplicate_rows_end_the_same_from_the_client_and_a_participant(ps, rule, hp):
    init = np.arange(20.0).reshape(10, 2)
    want = init.copy()
    if rule == "assign":
        want[[1, 5, 7]] = VALUES[[1, 4, 3]]  # the last occurrence of each row
    else:
        update = np.zeros_like(init)
        np.add.at(update, ROWS, VALUES)
        want += update if rule == "sum" else -hp["lr"] * update
    for name in ("by_client", "by_participant"):
        ps.create_table(name, shape=(10, 2), init=init, block_rows=4, rule=rule, **hp)
    ps.push_rows("by_client", ROWS, VALUES)
    ps.run(_push_duplicates, range(1), name="by_participant")
    np.testing.assert_array_equal(ps.pull("by_client"), want)
    np.testing.assert_array_equal(ps.pull("by_participant"), want)
