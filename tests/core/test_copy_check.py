"""Issue 23: the default push's copy and its NaN/Inf check are one pass.

``_backend.copy_abs_bound`` copies a push into the buffer's array and finds
the bound of its magnitudes (the NaN/Inf check) while it reads it, where the
session used to read the caller's array twice (BLAS check, then the copy).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dask_ps import _backend
from dask_ps._exceptions import PSValueError
from dask_ps._oplog import PushBuffer
from dask_ps._spec import TableSpec, check_values


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(30_000,), (300, 100)])
def test_copy_abs_bound_copies_exactly_and_bounds_like_abs_bound(dtype, shape):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 1e3).astype(dtype)
    x.flat[7] = -0.0
    dst = np.full(shape, 5, dtype)
    b = _backend.copy_abs_bound(x, dst)
    assert x.tobytes() == dst.tobytes()  # bit for bit, -0.0 included
    assert b >= float(np.abs(x).max())
    assert b <= _backend.abs_bound(x) * (1 + 1e-5)  # as tight as the BLAS check's


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_copy_abs_bound_finds_every_nonfinite_value(dtype):
    """Not finite exactly when a NaN or an Inf is in the values; finite
    values whose squares overflow (float64) give their exact maximum."""
    x = np.random.default_rng(1).random(30_000).astype(dtype)
    dst = np.empty_like(x)
    for bad in (np.nan, np.inf, -np.inf):
        for where in (0, 12_345, 29_999):
            y = x.copy()
            y[where] = bad
            assert not math.isfinite(_backend.copy_abs_bound(y, dst)), (bad, where)
    big = x.copy()
    big[:100] = np.finfo(dtype).max
    assert _backend.copy_abs_bound(big, dst) >= float(np.finfo(dtype).max)
    assert math.isfinite(_backend.copy_abs_bound(big, dst))
    np.testing.assert_array_equal(dst, big)


def test_copy_abs_bound_leaves_what_it_cannot_do_in_one_pass():
    """None and ``dst`` untouched: small, integer, strided, other dtype."""
    cases = [
        (np.ones(100, np.float32), np.zeros(100, np.float32)),
        (np.ones(10_000, np.int64), np.zeros(10_000, np.int64)),
        (np.ones(20_000, np.float32)[::2], np.zeros(10_000, np.float32)),
        (np.ones(10_000, np.float32), np.zeros(10_000, np.float64)),
    ]
    for src, dst in cases:
        assert _backend.copy_abs_bound(src, dst) is None
        assert not dst.any()


def test_check_values_into_out_returns_the_copy_and_refuses_nan():
    spec = TableSpec.create("t", (10_000,), "float32")
    mine = np.arange(10_000, dtype=np.float32)
    out = np.empty(10_000, np.float32)
    values, bound = check_values(spec, mine, spec.shape, bound=True, out=out)
    assert values is out and bound >= 9_999
    np.testing.assert_array_equal(out, mine)
    cast = np.empty(10_000, np.float32)  # int64 values: cast into ``out``, then checked
    values, _ = check_values(spec, np.arange(10_000), spec.shape, bound=True, out=cast)
    assert values is cast and np.array_equal(cast, mine)
    mine[123] = np.nan
    with pytest.raises(PSValueError, match="'t'.*NaN or Inf"):
        check_values(spec, mine, spec.shape, bound=True, out=out)


@pytest.mark.parametrize("into", ["astype", "out"])
@pytest.mark.parametrize("check_finite", [True, False])
def test_finite_values_that_overflow_in_the_cast_are_said_so(into, check_finite):
    """1e300 into a float32 table was refused as "NaN or Inf" (the cast's
    inf; one block's check is the server's, which sees only that), with
    numpy's RuntimeWarning leaking; now the cast says it, at the caller.
    A table that allows NaN/Inf takes the inf, as numpy's cast gives it."""
    import warnings

    spec = TableSpec.create("t", (100,), "float32")
    big = np.full(100, 1e300)
    big[7] = -3e301
    out = np.empty(100, np.float32) if into == "out" else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PSValueError, match=r"'t': push values are finite but overflow the table dtype float32 "
                                               r"when cast \(largest magnitude 3e\+301"):
            check_values(spec, big, spec.shape, check_finite=check_finite, out=out)
    loose = TableSpec.create("u", (100,), "float32", allow_nonfinite=True)
    assert np.isinf(check_values(loose, big, loose.shape)).all()


def test_copy_target_is_the_spare_and_add_dense_takes_it():
    spec = TableSpec.create("t", (10, 3), "float64")
    spare = np.zeros((10, 3))
    buf = PushBuffer(spec, spare=spare)
    target = buf.copy_target()
    assert target is spare
    buf.add_dense(target, keep=True)
    assert buf.dense is spare and buf.spare is None and buf.spare_after_send is spare
    assert buf.copy_target() is None  # a second push is summed into the buffer, no copy
    fresh = PushBuffer(spec).copy_target()
    assert fresh.shape == (10, 3) and fresh.dtype == np.float64
