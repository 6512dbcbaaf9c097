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


def _push_wrapping(ctx, _, name, rows, values):
    ctx.push_rows(name, rows, values)
    ctx.clock()


@pytest.mark.parametrize("dtype,rows,values", [
    ("int64", [0, 0], [2**62, 2**62]),            # 2**63 wrapped to -2**63
    ("int64", [2, 2, 2], [-2**62] * 3),           # -3 * 2**62 wrapped to +2**62
    ("uint64", [1, 1], [2**63, 2**63]),           # 2**64 wrapped to 0
    ("int8", [0, 0], [100, 100]),
])
def test_duplicate_rows_whose_sum_does_not_fit_are_refused_on_both_paths(ps, dtype, rows, values):
    """A 64-bit sum of duplicate rows wrapped around silently (numpy's
    reduceat widens smaller integers, not these), on the client's path and a
    participant's; now refused at the caller, naming the table, the summed
    range and the dtype, and nothing is stored."""
    import dask_ps

    values = np.array(values, dtype=dtype)
    for name in ("by_client", "by_participant"):
        ps.create_table(name, shape=(3,), dtype=dtype, init=1)
    with pytest.raises(dask_ps.PSValueError, match=r"by_client.*duplicate rows summed.*does not fit"):
        ps.push_rows("by_client", rows, values)
    with pytest.raises(Exception, match=r"by_participant.*out of the range"):
        ps.run(_push_wrapping, range(1), name="by_participant", rows=rows, values=values)
    for name in ("by_client", "by_participant"):
        np.testing.assert_array_equal(ps.pull(name), np.ones(3, dtype))
    fine = np.array([2**62 - 1 if dtype in ("int64", "uint64") else 60, 1], dtype=dtype)
    ps.push_rows("by_client", [0, 0], fine)  # a sum that fits is stored exactly
    assert ps.pull("by_client")[0] == 1 + int(fine.astype(object).sum())


def test_a_bool_tables_duplicate_rows_are_ored():
    """numpy's sum of bools is their OR (True + True is True); reduceat
    turned them into int64, which the bool table refused with a message
    about a dtype the caller never passed."""
    from dask_ps._routing import coalesce_rows

    rows, vals = coalesce_rows(np.array([1, 1, 0]), np.array([True, True, False]))
    assert vals.dtype == bool and rows.tolist() == [0, 1] and vals.tolist() == [False, True]


def test_a_bool_table_takes_duplicate_rows(ps):
    ps.create_table("b", shape=(3,), dtype=bool)
    ps.push_rows("b", [1, 1], np.array([True, True]))
    np.testing.assert_array_equal(ps.pull("b"), [False, True, False])
