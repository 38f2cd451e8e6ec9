"""Rank-dependent inputs and numpy references for tests/core/ranks/."""
import ml_dtypes
import numpy as np
from rank_fixtures import expect_error  # noqa: F401 (shared by every binding's rank suite)

import tfring.core as hvd

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# Every dtype the core has, as numpy dtypes.
DTYPES = [np.dtype(n) for n in ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16",
                                "float32", "float64")] + [BFLOAT16]
REDUCTIONS = {
    hvd.Sum: lambda xs, n: xs.sum(0),
    hvd.Average: lambda xs, n: xs.sum(0) / n,
    hvd.Min: lambda xs, n: xs.min(0),
    hvd.Max: lambda xs, n: xs.max(0),
    hvd.Product: lambda xs, n: xs.prod(0),
}


def is_integer(dtype):
    return dtype != BFLOAT16 and np.issubdtype(dtype, np.integer)


def rank_values(r, shape=(3, 4), dtype=np.float64):
    """Small positive integers that differ by rank, exact in every dtype (the
    product over 3 ranks fits in int8)."""
    values = 1 + (np.arange(int(np.prod(shape))).reshape(shape) + r) % 3
    return values.astype(dtype)


def every_rank(size, shape=(3, 4)):
    """Every rank's rank_values, stacked, in float64."""
    return np.stack([rank_values(r, shape) for r in range(size)])


def assert_close(actual, expected, dtype, what=""):
    assert isinstance(actual, np.ndarray), f"{what}: got a {type(actual).__name__}"
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, not {dtype}"
    tol = {np.dtype(np.float16): 1e-2, BFLOAT16: 3e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(actual.astype(np.float64), np.asarray(expected, np.float64),
                               rtol=tol, atol=tol, err_msg=f"{what} {dtype}")

