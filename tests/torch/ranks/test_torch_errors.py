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


DUPLICABLE = {
    "allreduce": lambda name: hvd.allreduce_async(torch.ones(4, 3), name=name),
    "allgather": lambda name: hvd.allgather_async(torch.ones(4, 3), name=name),
    "broadcast": lambda name: hvd.broadcast_async(torch.ones(4, 3), root_rank=0, name=name),
    "reducescatter": lambda name: hvd.reducescatter_async(torch.ones(4, 3), name=name),
}


@multi_rank
@pytest.mark.parametrize("kind", list(DUPLICABLE))
def test_duplicate_name_in_flight_raises_at_once_on_that_rank(kind, rank, size):
    """A second *_async under a name still in flight raises ValueError in the
    call itself, on that rank only; the first goes on. Each side submits its
    pair while the other has not submitted the name yet, so the first is
    surely still in flight."""
    submit = DUPLICABLE[kind]
    handles = []
    for name, first in ((f"dup_{kind}_a", rank == 0), (f"dup_{kind}_b", rank != 0)):
        if first:
            handles.append(submit(name))
            expect_error(ValueError, lambda: submit(name), name, "already in flight")
        hvd.barrier()
        if not first:
            handles.append(submit(name))
    for h in handles:
        assert hvd.synchronize(h).shape[1] == 3


@multi_rank
def test_rank_raising_before_submitting_fails_its_peers(rank, size):
    """A rank that raises instead of submitting (bad splits in the core, a
    non-tensor in Python) does not leave its peers waiting: they get an
    error naming that rank and the collective."""
    splits = [5] * size if rank == 0 else None
    if rank == 0:
        expect_error(ValueError, lambda: hvd.alltoall(torch.ones(size), splits=splits,
                                                      name="a2a_raised"), "splits")
    else:
        expect_error(hvd.HorovodInternalError, lambda: hvd.alltoall(
            torch.ones(size), name="a2a_raised"), "rank 0", "ALLTOALL", "a2a_raised")
    if rank == size - 1:
        expect_error(TypeError, lambda: hvd.allreduce(None, name="sum_raised"), "NoneType")
    else:
        expect_error(hvd.HorovodInternalError, lambda: hvd.allreduce(
            torch.ones(2), name="sum_raised"), f"rank {size - 1}", "ALLREDUCE", "sum_raised")
    # A group whose first tensor is bad on one rank fails as a whole elsewhere.
    tensors = [torch.ones(2), torch.ones(3)] if rank != 0 else ["bad", torch.ones(3)]
    expected = TypeError if rank == 0 else hvd.HorovodInternalError
    expect_error(expected, lambda: hvd.grouped_allreduce(tensors, name="group_raised"))
