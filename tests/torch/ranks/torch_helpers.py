"""Rank-dependent inputs and float64 references for tests/torch/ranks/."""
import torch
from rank_fixtures import expect_error  # noqa: F401 (shared by every binding's rank suite)

# Every dtype Horovod's torch binding reduces; bool only moves (allgather,
# broadcast, alltoall).
REDUCIBLE = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
             torch.int64, torch.uint8]
MOVABLE = REDUCIBLE + [torch.bool]


def rank_values(r, shape=(3, 4), dtype=torch.float64):
    """Small positive integers that differ by rank: exact in every dtype
    (the product over 3 ranks fits in uint8); bool: alternating by rank."""
    n = 1
    for d in shape:
        n *= d
    values = 1 + (torch.arange(n).reshape(shape) + r) % 3
    if dtype == torch.bool:
        return values % 2 == 0
    return values.to(dtype)


def every_rank(size, shape=(3, 4)):
    """Every rank's rank_values, stacked, in float64."""
    return torch.stack([rank_values(r, shape) for r in range(size)])


def assert_close(actual, expected, dtype, what=""):
    assert isinstance(actual, torch.Tensor), f"{what}: got a {type(actual).__name__}"
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, not {dtype}"
    tol = {torch.float16: 1e-2, torch.bfloat16: 3e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(actual.to(torch.float64), expected.to(torch.float64),
                               rtol=tol, atol=tol, msg=f"{what} {dtype}")

