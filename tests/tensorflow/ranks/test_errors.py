"""Bad input: every rank gets a clear error naming the problem, and the next
collective works. Cross-rank mismatches raise FailedPreconditionError, with
the cause "mismatch"; a request every rank agrees on that cannot run (a root
outside the job, a scalar to gather) has the cause "invalid_argument"."""
import numpy as np
import pytest
import tensorflow as tf
from error_helpers import expect_precondition, multi_rank, needs_peers  # noqa: F401

import tfring.tensorflow as hvd
from tfring.common.exceptions import Cause


@pytest.fixture(autouse=True)
def next_collective_works(size):
    yield
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="after_error").numpy() == size


@multi_rank
def test_shape_mismatch(rank):
    expect_precondition(lambda: hvd.allreduce(tf.ones([rank + 2]), name="shapes"),
                        "Mismatched ALLREDUCE tensor shapes", "'shapes'",
                        "One rank sent a tensor of shape [2], but another rank sent a tensor "
                        "of shape [3]", "rank 0: [2]", "rank 1: [3]")


@multi_rank
def test_dtype_mismatch(rank):
    dtype = tf.float32 if rank == 0 else tf.int32
    expect_precondition(lambda: hvd.allreduce(tf.ones([2], dtype), name="dtypes"),
                        "Mismatched data types", "float32", "int32", "rank 0: float32")


@multi_rank
def test_operation_mismatch(rank):
    @tf.function
    def mixed():
        x = tf.ones([2])
        return hvd.allreduce(x, name="mixed") if rank == 0 else hvd.allgather(x, name="mixed")
    expect_precondition(mixed, "Mismatched collective operations", "ALLREDUCE", "ALLGATHER")


@multi_rank
def test_reduce_op_mismatch(rank):
    op = hvd.Sum if rank == 0 else hvd.Max
    expect_precondition(lambda: hvd.allreduce(tf.ones([2]), op=op, name="ops"),
                        "reduce ops", "Sum", "Max")


@multi_rank
def test_scale_factor_mismatch(rank):
    expect_precondition(
        lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum, prescale_factor=1.0 + rank, name="sc"),
        "prescale factors")


@multi_rank
def test_root_rank_mismatch(rank):
    expect_precondition(lambda: hvd.broadcast(tf.ones([2]), root_rank=rank, name="roots"),
                        "Mismatched BROADCAST root ranks", "rank 0: 0")


def test_root_rank_out_of_range(size):
    expect_precondition(lambda: hvd.broadcast(tf.ones([2]), root_rank=size, name="bad_root"),
                        f"Invalid BROADCAST root rank {size}", cause=Cause.INVALID_ARGUMENT)


# Alltoall's rows and splits are this rank's own arguments: like Horovod, each
# rank refuses them at once with InvalidArgumentError, before anything is sent.

@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_alltoall_splits_do_not_add_up(rank, size, in_function):
    splits = [1] * size
    splits[0] += 1  # sums to size + 1, but the tensor has size rows
    call = lambda: hvd.alltoall(tf.ones([size, 2]), splits=splits, name="splits")  # noqa: E731
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        tf.function(call)() if in_function else call()
    assert f"Invalid ALLTOALL splits for tensor 'splits' on rank {rank}" in info.value.message
    assert f"adding up to the first dimension {size}" in info.value.message


def test_alltoall_without_splits_needs_divisible_rows(rank, size):
    if size == 1:
        pytest.skip("every row count divides by 1")
    # Horovod's form (no name) and a TF1 graph as well.
    for call in (lambda: hvd.alltoall(tf.ones([size + 1]), name="uneven"),
                 lambda: hvd.alltoall(tf.ones([size + 1]))):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"divisible by the number of ranks \\({size}\\), but rank "
                                 f"{rank} sent shape \\[{size + 1}\\]"):
            call()
    with tf.Graph().as_default():
        out = hvd.alltoall(tf.ones([size + 1, 2]))
        with tf.compat.v1.Session() as sess, \
                pytest.raises(tf.errors.InvalidArgumentError, match="divisible by the number"):
            sess.run(out)


@multi_rank
def test_allgather_trailing_dims_mismatch(rank):
    expect_precondition(lambda: hvd.allgather(tf.ones([2, rank + 1]), name="gather_dims"),
                        "Mismatched ALLGATHER tensor shapes", "all dimensions but the first")


def test_allgather_of_scalar(rank):
    expect_precondition(lambda: hvd.allgather(tf.constant(1.0), name="scalar"),
                        "needs at least one dimension", cause=Cause.INVALID_ARGUMENT)


def test_unsupported_dtype_is_local_invalid_argument():
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not support dtype complex64"):
        hvd.allreduce(tf.constant([1 + 2j], tf.complex64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not support dtype string"):
        hvd.broadcast(tf.constant(["a"]), 0)


def test_invalid_arguments_raise_before_any_collective():
    with pytest.raises(NotImplementedError, match="reducescatter does not support Adasum"):
        hvd.reducescatter(tf.ones([2]), op=hvd.Adasum)
    with pytest.raises(ValueError, match="need op=Average, Sum or Adasum"):
        hvd.allreduce(tf.ones([2]), op=hvd.Max, prescale_factor=2.0)
    with pytest.raises(ValueError, match="unknown reduce op"):
        hvd.allreduce(tf.ones([2]), op=42)
    with pytest.raises(ValueError, match="not both"):
        hvd.allreduce(tf.ones([2]), op=hvd.Sum, average=True)


def test_process_set_errors(rank, size):
    with pytest.raises(tf.errors.FailedPreconditionError, match="Invalid process set"):
        hvd.add_process_set([size + 5])
    # A set this job never registered: ValueError, as in Horovod.
    ghost = hvd.ProcessSet([0])
    ghost.process_set_id = 99
    for call in (lambda: hvd.allreduce(tf.ones([1]), process_set=ghost),
                 lambda: hvd.allgather(tf.ones([1]), process_set=ghost),
                 lambda: hvd.broadcast(tf.ones([1]), 0, process_set=ghost),
                 lambda: hvd.alltoall(tf.ones([1]), process_set=ghost),
                 lambda: hvd.barrier(process_set=ghost),
                 ghost.size, ghost.rank, ghost.included):
        with pytest.raises(ValueError, match="this job has no process set with id 99"):
            call()


def test_graph_run_after_its_process_set_was_removed(size):
    ps = hvd.add_process_set(list(range(size)))
    with tf.Graph().as_default():
        out = hvd.allreduce(tf.ones([1]), op=hvd.Sum, process_set=ps)
        assert hvd.remove_process_set(ps)
        with tf.compat.v1.Session() as sess, pytest.raises(
                tf.errors.InvalidArgumentError, match="there is no process set with id"):
            sess.run(out)
