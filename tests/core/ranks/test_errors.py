"""Bad input through tfring.core: every rank gets the documented error,
with the core's status code and cause, and the next collective works."""
import numpy as np
import pytest

import tfring.core as hvd
from tfring.common.exceptions import Cause
from core_helpers import expect_error, rank_values

multi_rank = pytest.mark.usefixtures("needs_peers")


@pytest.fixture(autouse=True)
def check_next_collective(size):
    """After each test the job goes on: a plain allreduce over every rank."""
    yield
    total = hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum, name="after_bad_input")
    assert total[0] == size


@multi_rank
def test_mismatched_shapes(rank):
    e = expect_error(hvd.PreconditionError, lambda: hvd.allreduce(
        np.ones(2 + rank, np.float32), name="bad_shape"), "Mismatched", "shape")
    assert e.code == 2 and isinstance(e, RuntimeError)


@multi_rank
def test_mismatched_dtypes(rank):
    dtype = np.float32 if rank == 0 else np.float64
    expect_error(hvd.PreconditionError, lambda: hvd.allreduce(
        np.ones(3, dtype), name="bad_dtype"), "Mismatched data types")


@multi_rank
def test_mismatched_allgather_trailing_dims(rank):
    expect_error(hvd.PreconditionError, lambda: hvd.allgather(
        np.ones((2, 1 + rank)), name="bad_gather"), "Mismatched")


@multi_rank
def test_mismatched_root(rank):
    e = expect_error(hvd.PreconditionError, lambda: hvd.broadcast(
        np.ones(2), root_rank=rank, name="bad_root_mismatch"), "root")
    assert (e.cause, e.rank) == (Cause.MISMATCH, None)


def test_root_out_of_range(size):
    # Every rank agrees on the root, but it is not a rank: a bad argument.
    e = expect_error(hvd.PreconditionError, lambda: hvd.broadcast(
        np.ones(2), root_rank=size, name="bad_root"), "root rank")
    assert (e.cause, e.rank) == (Cause.INVALID_ARGUMENT, None)


def test_unsupported_dtype():
    e = expect_error(TypeError, lambda: hvd.allreduce(np.ones(2, np.complex64)),
                     "complex64", "supported")
    assert not isinstance(e, hvd.CoreError)


def test_alltoall_splits_not_summing_to_rows(size):
    e = expect_error(hvd.InvalidArgumentError, lambda: hvd.alltoall(
        np.ones(size + 1), splits=[1] * size, name="bad_splits"), "splits")
    assert e.code == 4 and isinstance(e, ValueError)


def test_alltoall_splits_of_the_wrong_length(size):
    expect_error(hvd.InvalidArgumentError, lambda: hvd.alltoall(
        np.ones(size + 1), splits=[1] * (size + 1), name="bad_splits_len"), "splits")


def test_unknown_process_set():
    expect_error(hvd.InvalidArgumentError, lambda: hvd.allreduce(
        np.ones(1), process_set=12345), "process set")


def test_tensors_on_different_devices():
    class OnGpu:
        def __init__(self):
            self.device = type("Device", (), {"id": 0})()
            self.__cuda_array_interface__ = {"shape": (2,), "typestr": "<f4",
                                             "data": (4096, False), "version": 3}
    expect_error(hvd.InvalidArgumentError,
                 lambda: hvd.grouped_allreduce([np.ones(2, np.float32), OnGpu()]), "one device")


class FakeCudaArray:
    """Only __cuda_array_interface__ (and CuPy's .device.id): what a GPU
    array looks like to the adapters. Its memory is never touched: a CPU
    build refuses it before anything is enqueued."""

    def __init__(self, shape=(4,), typestr="<f4", stream=None):
        self.device = type("Device", (), {"id": 0})()
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (0xdead0000, False), "version": 3,
                                         "strides": None, "stream": stream}


@pytest.mark.parametrize("call", [
    lambda x: hvd.allreduce(x), lambda x: hvd.grouped_allreduce([x, x]),
    lambda x: hvd.allgather(x), lambda x: hvd.broadcast(x, 0),
    lambda x: hvd.alltoall(x), lambda x: hvd.reducescatter(x)],
    ids=["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall",
         "reducescatter"])
def test_gpu_array_in_a_cpu_build(call):
    if hvd.gpu_built():
        pytest.skip("this core module has GPU support")
    e = expect_error(hvd.InvalidArgumentError, lambda: call(FakeCudaArray(stream=7)),
                     "no GPU support", "GPU:0")
    assert e.code == 4


def test_error_codes_and_types_are_horovods():
    assert issubclass(hvd.AbortedError, hvd.HorovodInternalError)
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert issubclass(hvd.InvalidArgumentError, ValueError)
    assert issubclass(hvd.NotInitializedError, ValueError)


def test_value_unchanged_after_failed_collective(rank):
    x = rank_values(rank)
    before = x.copy()
    with pytest.raises(TypeError):
        hvd.allreduce(x.astype(np.complex128))
    np.testing.assert_array_equal(x, before)
