"""Bad input through tfring.torch: every rank gets Horovod's error type
(HorovodInternalError for ranks that disagree, as Horovod's torch binding
raises), and the next collective works."""
import pytest
import torch

import tfring.torch as hvd
from torch_helpers import expect_error

multi_rank = pytest.mark.usefixtures("needs_peers")


@pytest.fixture(autouse=True)
def check_next_collective(size):
    yield
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_bad_input")[0] == size


@multi_rank
def test_mismatched_shapes(rank):
    e = expect_error(hvd.HorovodInternalError, lambda: hvd.allreduce(
        torch.ones(2 + rank), name="bad_shape"), "Mismatched", "shape")
    assert isinstance(e, hvd.PreconditionError) and isinstance(e, RuntimeError)


@multi_rank
def test_mismatched_dtypes_async(rank):
    h = hvd.allreduce_async(torch.ones(3, dtype=torch.float32 if rank == 0 else torch.float64),
                            name="bad_dtype")
    expect_error(hvd.HorovodInternalError, lambda: hvd.synchronize(h), "Mismatched data types")


@multi_rank
def test_mismatched_root(rank):
    expect_error(hvd.HorovodInternalError, lambda: hvd.broadcast(
        torch.ones(2), root_rank=rank, name="bad_root"), "root")


def test_bad_splits_is_a_value_error(size):
    expect_error(ValueError, lambda: hvd.alltoall(torch.ones(size + 1), splits=[1] * size,
                                                  name="bad_splits"), "splits")


def test_unsupported_dtype_and_non_tensors():
    expect_error(TypeError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)),
                 "complex64")
    expect_error(TypeError, lambda: hvd.allreduce_async([1.0, 2.0]), "torch tensors")
