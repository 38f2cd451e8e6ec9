"""The bad-input matrix (docs/errors.md), beyond what test_errors.py covers:
every rank gets the documented error, and the next collective works.

Cross-rank problems are found by the coordinator and raise
FailedPreconditionError on every rank that submitted the tensor; problems a
rank can see by itself raise InvalidArgumentError (or a Python error before
anything is submitted). Tests where one rank must differ from the others need
at least two ranks and are skipped alike on every rank of a one-rank job.
"""
import time

import numpy as np
import pytest
import tensorflow as tf
from error_helpers import (Background, check_next_collective, expect_error,
                           expect_invalid_argument, expect_precondition, multi_rank,
                           needs_peers)  # noqa: F401 - needs_peers is the fixture multi_rank uses

import tfring.tensorflow as hvd
from tfring.common.exceptions import Cause


@pytest.fixture(autouse=True)
def next_collective_works(size):
    yield
    check_next_collective(size)


def ones(shape, dtype=tf.float32):
    return tf.ones(shape, dtype)


# -- mismatches between ranks -------------------------------------------------------

@multi_rank
def test_postscale_factor_mismatch(rank):
    expect_precondition(
        lambda: hvd.allreduce(ones([2]), op=hvd.Sum, postscale_factor=1.0 + rank, name="post"),
        "Mismatched ALLREDUCE postscale factors for tensor 'post'", "rank 0: 1", "rank 1: 2")


@multi_rank
def test_reducescatter_reduce_op_mismatch(rank):
    op = hvd.Sum if rank == 0 else hvd.Min
    expect_precondition(lambda: hvd.reducescatter(ones([4]), op=op, name="rs_ops"),
                        "Mismatched REDUCESCATTER reduce ops for tensor 'rs_ops'",
                        "One rank requested Sum, but another rank requested Min", "rank 0: Sum")


@multi_rank
def test_broadcast_shape_mismatch(rank):
    expect_precondition(lambda: hvd.broadcast(ones([rank + 1]), root_rank=0, name="b_shapes"),
                        "Mismatched BROADCAST tensor shapes for tensor 'b_shapes'", "rank 0: [1]",
                        "rank 1: [2]")


@pytest.mark.parametrize("case", ["shapes", "roots", "negative_root"])
def test_broadcast_errors_in_a_set_name_job_wide_ranks(rank, size, set_without_rank_0, case):
    """The Horovod-style form of the broadcast errors above: a set that does
    not start at rank 0, whose roots and ranks are all job-wide."""
    ps = set_without_rank_0
    members = ", ".join(map(str, ps.ranks))
    if case != "negative_root" and ps.size() < 2:
        pytest.skip("needs two members that can disagree")  # alike on every rank
    root = {"shapes": ps.ranks[-1], "roots": rank, "negative_root": -1}[case]
    shape = [rank + 1] if case == "shapes" else [2]
    call = lambda: hvd.broadcast(ones(shape), root_rank=root, process_set=ps,  # noqa: E731
                                 name=f"set_{case}")
    if not ps.included():
        expect_invalid_argument(call, f"tfring: rank {rank} is not a member of process set")
    elif case == "shapes":
        expect_precondition(call, "Mismatched BROADCAST tensor shapes for tensor 'set_shapes'",
                            "rank 1: [2]", "rank 2: [3]")
    elif case == "roots":
        expect_precondition(call, "Mismatched BROADCAST root ranks for tensor 'set_roots'",
                            "One rank specified root rank 1, but another rank specified root "
                            "rank 2", "rank 1: 1", "rank 2: 2")
    else:
        expect_precondition(call, "Invalid BROADCAST root rank -1 for tensor 'set_negative_root'",
                            f"process set's ranks [{members}]", cause=Cause.INVALID_ARGUMENT)


@multi_rank
def test_grouped_allreduce_member_shape_mismatch(rank):
    # Members are negotiated one by one: the error names the member that differs.
    expect_precondition(
        lambda: hvd.grouped_allreduce([ones([2]), ones([rank + 1])], op=hvd.Sum, name="grp"),
        "Mismatched ALLREDUCE tensor shapes for tensor 'grp_1'")


@multi_rank
def test_alltoall_splits_wrong_on_one_rank_name_that_rank(rank, size):
    # Only rank 1's splits are wrong: it refuses them by itself, at once, and
    # tells the coordinator so, so the others' same alltoall fails naming
    # rank 1 and the collective instead of waiting for it.
    if rank == 1:
        splits = [2] + [1] * (size - 1)  # adds up to size + 1 rows
        expect_invalid_argument(
            lambda: hvd.alltoall(ones([size, 2]), splits=splits, name="a2a_one"),
            "Invalid ALLTOALL splits for tensor 'a2a_one' on rank 1",
            f"adding up to the first dimension {size}")
    else:
        expect_precondition(
            lambda: hvd.alltoall(ones([size, 2]), splits=[1] * size, name="a2a_one"),
            "ALLTOALL of tensor 'a2a_one' failed because rank 1 raised before submitting it")
    # The same name then runs, with good splits, on every rank.
    out, received = hvd.alltoall(ones([size, 2]), splits=[1] * size, name="a2a_one")
    assert out.shape == (size, 2) and list(received.numpy()) == [1] * size


@multi_rank
def test_grouped_allreduce_with_different_tensor_counts(rank):
    # Every member fails on every rank, also the ones only some ranks sent.
    count = 2 if rank == 0 else 3
    call = Background(
        lambda: hvd.grouped_allreduce([ones([2])] * count, op=hvd.Sum, name="count_mismatch"))
    if rank == 0:
        call.wait()
        if call.error is None:
            # A regression: rank 0 succeeded and the others' third member is
            # still in flight; complete it so the assertion below reports the
            # failure instead of every other rank hanging.
            hvd.allreduce(ones([2]), op=hvd.Sum, name="count_mismatch_2")
    call.wait()
    assert isinstance(call.error, tf.errors.FailedPreconditionError), \
        f"rank {rank} got {call.error or 'no error'}"
    assert "Mismatched groups for tensor 'count_mismatch_" in call.error.message
    assert "group 'count_mismatch' of 2" in call.error.message
    assert "group 'count_mismatch' of 3" in call.error.message


@multi_rank
def test_allgather_trailing_dims_message_shows_the_dims(rank):
    expect_precondition(lambda: hvd.allgather(ones([2, 3, rank + 1]), name="gather_dims_text"),
                        "one rank sent [?, 3, 1] and another [?, 3, 2]")


# -- bad values a single rank can send -------------------------------------------

def test_broadcast_negative_root():
    expect_precondition(lambda: hvd.broadcast(ones([2]), root_rank=-1, name="neg_root"),
                        "Invalid BROADCAST root rank -1 for tensor 'neg_root'",
                        cause=Cause.INVALID_ARGUMENT)


@pytest.mark.parametrize("splits", ["wrong_length", "negative"])
def test_alltoall_splits_malformed(rank, size, splits):
    bad = {"wrong_length": [size] + [0] * size,  # one entry too many
           "negative": [size + 1] + [0] * (size - 2) + [-1] if size > 1 else [-1]}[splits]
    expect_invalid_argument(
        lambda: hvd.alltoall(ones([size, 2]), splits=bad, name=f"a2a_{splits}"),
        f"Invalid ALLTOALL splits for tensor 'a2a_{splits}' on rank {rank}",
        f"one non-negative entry per rank ({size})")


@multi_rank
def test_alltoall_splits_in_a_process_set_count_its_ranks(rank, size):
    # The set [1, ..] does not start at rank 0: its splits have one entry per member.
    members = list(range(1, size))
    ps = hvd.add_process_set(members)
    try:
        if ps.included():
            n = len(members)
            expect_invalid_argument(
                lambda: hvd.alltoall(ones([n, 2]), splits=[1] * size, name="a2a_set",
                                     process_set=ps),
                f"Invalid ALLTOALL splits for tensor 'a2a_set' on rank {rank}",
                f"one non-negative entry per rank ({n})")
            out, received = hvd.alltoall(ones([n, 2]), splits=[1] * n, name="a2a_set",
                                         process_set=ps)
            assert list(received.numpy()) == [1] * n
    finally:
        assert hvd.remove_process_set(ps)


def test_alltoall_of_scalar_is_refused_locally():
    expect_invalid_argument(lambda: hvd.alltoall(tf.constant(1.0), name="a2a_scalar"),
                            "tfring: alltoall needs a tensor with at least one dimension")


def test_reducescatter_of_scalar():
    expect_precondition(lambda: hvd.reducescatter(tf.constant(1.0), name="rs_scalar"),
                        "REDUCESCATTER of tensor 'rs_scalar' needs at least one dimension",
                        cause=Cause.INVALID_ARGUMENT)


@pytest.mark.parametrize("collective", ["allgather", "alltoall", "reducescatter",
                                        "grouped_allreduce", "broadcast_"])
def test_unsupported_dtype_for_each_collective(collective):
    bad = tf.constant([1 + 1j, 2 + 2j], tf.complex128)
    call = {
        "allgather": lambda: hvd.allgather(bad),
        "alltoall": lambda: hvd.alltoall(bad),
        "reducescatter": lambda: hvd.reducescatter(bad),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([ones([1]), bad]),
        "broadcast_": lambda: hvd.broadcast_([tf.Variable(bad)], 0),
    }[collective]
    expect_invalid_argument(call, f"tfring {collective} does not support dtype complex128",
                            "supported: uint8")


# -- names ---------------------------------------------------------------------------

def test_name_reused_with_another_shape_on_later_steps_works(rank, size):
    # A name is free again once its collective has completed: later steps may
    # use it with another shape, dtype, op or collective.
    a = hvd.allreduce(ones([2]), op=hvd.Sum, name="reused")
    b = hvd.allreduce(ones([3, 5]) * (rank + 1), op=hvd.Sum, name="reused")
    c = hvd.allreduce(ones([7], tf.int32) * rank, op=hvd.Max, name="reused")
    d = hvd.allgather(ones([rank + 1, 2]), name="reused")
    np.testing.assert_array_equal(a.numpy(), np.full([2], size, np.float32))
    np.testing.assert_array_equal(b.numpy(), np.full([3, 5], size * (size + 1) / 2, np.float32))
    np.testing.assert_array_equal(c.numpy(), np.full([7], size - 1, np.int32))
    assert d.shape == (size * (size + 1) // 2, 2)


@multi_rank
def test_same_name_twice_in_flight_is_invalid_argument(rank, size):
    # Each rank in turn submits 'in_flight' twice at once (from two threads)
    # while the others hold back: one call is rejected at once, the other
    # completes once the others submit theirs.
    for holder in range(size):
        if rank == holder:
            def submit():
                return hvd.allreduce(ones([2]), op=hvd.Sum, name="in_flight")
            calls = [Background(submit), Background(submit)]
            deadline = time.monotonic() + 30
            while not any(c.done() for c in calls):
                assert time.monotonic() < deadline, "neither call came back"
                time.sleep(0.01)
            rejected = next(c for c in calls if c.done())
            pending = next(c for c in calls if c is not rejected)
            assert isinstance(rejected.error, tf.errors.InvalidArgumentError), rejected.error
            assert "a collective named 'in_flight' is already in flight on this rank; give " \
                   "concurrent collectives distinct names" in rejected.error.message
            hvd.allreduce(ones([1]), name=f"in_flight_go_{holder}")
            out = pending.wait().value
        else:
            hvd.allreduce(ones([1]), name=f"in_flight_go_{holder}")
            out = hvd.allreduce(ones([2]), op=hvd.Sum, name="in_flight")
        np.testing.assert_array_equal(out.numpy(), [size, size])


# -- join ------------------------------------------------------------------------

@multi_rank
def test_join_with_a_non_allreduce_collective(rank, size):
    # Each rank in turn stays out of join() while the others wait in it: its
    # allgather and broadcast fail, its allreduce works (the joined ranks count
    # as zeros), and its own join() then releases everyone.
    for late in range(size):
        if rank == late:
            others = [r for r in range(size) if r != late]
            who = ("rank " if len(others) == 1 else "ranks ") + ", ".join(map(str, others))
            expect_precondition(lambda: hvd.allgather(ones([1]), name=f"jg_{late}"),
                                f"ALLGATHER of tensor 'jg_{late}' cannot run while {who} "
                                f"{'has' if len(others) == 1 else 'have'} called join(); "
                                "only allreduce can.")
            expect_precondition(lambda: hvd.broadcast(ones([1]), 0, name=f"jb_{late}"),
                                f"BROADCAST of tensor 'jb_{late}' cannot run while")
            total = hvd.allreduce(ones([2]) * 3, op=hvd.Sum, name=f"jr_{late}")
            np.testing.assert_array_equal(total.numpy(), [3, 3])
        last = hvd.join()
        assert last == late, f"join() returned {last}, expected the last rank to join ({late})"


# -- process sets --------------------------------------------------------------------

@multi_rank
def test_collective_on_a_set_without_this_rank(rank, size):
    # Each rank in turn is left out of a set; it gets InvalidArgumentError at
    # once, the members run the collective among themselves.
    for outsider in range(size):
        members = [r for r in range(size) if r != outsider]
        ps = hvd.add_process_set(members)
        try:
            if rank == outsider:
                expect_invalid_argument(
                    lambda: hvd.allreduce(ones([1]), op=hvd.Sum, process_set=ps, name="outside"),
                    f"tfring: rank {rank} is not a member of process set {ps.process_set_id} "
                    f"(ranks [{', '.join(map(str, members))}])")
                assert not ps.included() and ps.rank() == -1
            else:
                out = hvd.allreduce(ones([1]), op=hvd.Sum, process_set=ps, name="outside")
                assert out.numpy()[0] == size - 1
        finally:
            assert hvd.remove_process_set(ps)


@pytest.mark.parametrize("how", ["broadcast", "broadcast_variables", "inplace", "object"])
def test_broadcast_root_outside_the_set(rank, size, set_without_rank_0, how):
    """root_rank is job-wide (Horovod): rank 0 is outside the set [1, ...], so
    every member gets FailedPreconditionError naming the set's ranks."""
    ps = set_without_rank_0
    members = ", ".join(map(str, ps.ranks))
    var = tf.Variable(tf.ones([2]))
    call = {"broadcast": lambda: hvd.broadcast(ones([2]), 0, process_set=ps, name="outroot"),
            "broadcast_variables": lambda: hvd.broadcast_variables([var], 0, process_set=ps),
            "inplace": lambda: hvd.broadcast_([var], 0, process_set=ps, name="outroot"),
            "object": lambda: hvd.broadcast_object("x", 0, process_set=ps, name="outroot")}[how]
    if ps.included():
        expect_precondition(call, "Invalid BROADCAST root rank 0 for tensor",
                            f"root_rank is a job-wide rank and must be one of the process "
                            f"set's ranks [{members}]", cause=Cause.INVALID_ARGUMENT)
    else:
        expect_invalid_argument(call, f"tfring: rank {rank} is not a member of process set "
                                      f"{ps.process_set_id} (ranks [{members}])")


@pytest.mark.parametrize("case", ["duplicate", "empty", "negative", "mismatched"])
def test_add_process_set_with_bad_ranks(rank, size, case):
    if case == "mismatched" and size < 2:
        pytest.skip("needs ranks that can disagree")
    ranks, fragment = {
        "duplicate": ([0, 0], "Invalid process set [0, 0]: ranks must be distinct and in "
                              f"[0, {size})."),
        "empty": ([], "Invalid process set []: it has no ranks."),
        "negative": ([-1], f"Invalid process set [-1]: ranks must be distinct and in [0, {size})."),
        "mismatched": ([rank], "Mismatched process set definitions: every rank must add the "
                               "same ranks in the same order (rank 0: [0]; rank 1: [1]"),
    }[case]
    expect_precondition(lambda: hvd.add_process_set(ranks), fragment,
                        cause=Cause.MISMATCH if case == "mismatched" else Cause.INVALID_ARGUMENT)
    # Nothing was registered: the next set added still works everywhere.
    ps = hvd.add_process_set(list(range(size)))
    out = hvd.allreduce(ones([1]), op=hvd.Sum, process_set=ps, name="after_bad_set")
    assert out.numpy()[0] == size
    assert hvd.remove_process_set(ps)


def test_unregistered_or_removed_process_set():
    never_added = hvd.ProcessSet([0])
    expect_error(ValueError, lambda: hvd.allreduce(ones([1]), process_set=never_added),
                 "ProcessSet(process_set_id=None, ranks=[0]) is not registered; call "
                 "hvd.add_process_set() first.")
    ps = hvd.add_process_set([0])
    assert hvd.remove_process_set(ps)
    assert not hvd.remove_process_set(ps)  # a second removal is a no-op
    assert not hvd.remove_process_set(hvd.global_process_set)
    expect_error(ValueError, lambda: hvd.allgather(ones([1]), process_set=ps), "is not registered")


# -- arguments refused before anything is submitted -----------------------------------

def _slices():
    return tf.IndexedSlices(ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))


@pytest.mark.parametrize("case", [
    "indexed_slices_max", "indexed_slices_min", "indexed_slices_scale", "adasum_sparse",
    "adasum_grouped_sparse", "adasum_reducescatter", "adasum_integer", "scale_with_min", "scale_with_product", "reducescatter_scale_with_max",
    "reducescatter_unknown_op"])
def test_arguments_refused_locally(case):
    error, call, fragment = {
        "indexed_slices_max": (NotImplementedError, lambda: hvd.allreduce(_slices(), op=hvd.Max),
                               "allreduce of IndexedSlices supports op=Average or Sum only."),
        "indexed_slices_min": (NotImplementedError, lambda: hvd.allreduce(_slices(), op=hvd.Min),
                               "allreduce of IndexedSlices supports op=Average or Sum only."),
        "indexed_slices_scale": (NotImplementedError,
                                 lambda: hvd.allreduce(_slices(), op=hvd.Sum, postscale_factor=2.0),
                                 "allreduce of IndexedSlices does not support scale factors."),
        "adasum_sparse": (NotImplementedError, lambda: hvd.allreduce(_slices(), op=hvd.Adasum),
                          "Adasum does not support sparse tensors (tf.IndexedSlices); pass "
                          "sparse_as_dense=True"),
        "adasum_grouped_sparse": (NotImplementedError,
                                  lambda: hvd.grouped_allreduce([ones([2]), _slices()],
                                                                op=hvd.Adasum),
                                  "Adasum does not support sparse tensors"),
        "adasum_reducescatter": (NotImplementedError,
                                 lambda: hvd.reducescatter(ones([2]), op=hvd.Adasum),
                                 "reducescatter does not support Adasum"),
        "adasum_integer": (tf.errors.InvalidArgumentError,
                           lambda: hvd.allreduce(tf.ones([2], tf.int32), op=hvd.Adasum),
                           "tfring Adasum supports float16, float32 and float64 tensors, not "
                           "int32."),
        "scale_with_min": (ValueError,
                           lambda: hvd.allreduce(ones([2]), op=hvd.Min, postscale_factor=0.5),
                           "allreduce: prescale/postscale factors need op=Average, Sum or "
                           "Adasum, not Min."),
        "scale_with_product": (ValueError,
                               lambda: hvd.allreduce(ones([2]), op=hvd.Product,
                                                     prescale_factor=2.0),
                               "need op=Average, Sum or Adasum, not Product."),
        "reducescatter_scale_with_max": (ValueError,
                                         lambda: hvd.reducescatter(ones([2]), op=hvd.Max,
                                                                   prescale_factor=2.0),
                                         "reducescatter: prescale/postscale factors need "
                                         "op=Average, Sum or Adasum, not Max."),
        "reducescatter_unknown_op": (ValueError, lambda: hvd.reducescatter(ones([2]), op=17),
                                     "reducescatter: unknown reduce op 17"),
    }[case]
    expect_error(error, call, fragment)


# -- after shutdown (last: it restarts tfring) ---------------------------------------

def test_collectives_after_shutdown_then_init_again(rank, size):
    hvd.shutdown()
    assert not hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (rank, size)  # topology stays readable
    stopped = "tfring has been shut down on this rank (shutdown() was called); call init() to " \
              "start it again."
    for call in (lambda: hvd.allreduce(ones([1])), lambda: hvd.allgather(ones([1])),
                 lambda: hvd.broadcast(ones([1]), 0), hvd.join, hvd.barrier,
                 lambda: hvd.add_process_set([0])):
        expect_precondition(call, stopped, cause=Cause.NOT_INITIALIZED)
    hvd.init()
    assert hvd.is_initialized()


@pytest.mark.parametrize("bad", ["fp16", 16], ids=["string", "int"])
def test_bad_compression_is_refused_at_construction(bad):
    """Before any collective, on every rank, naming the argument."""
    match = "compression must be a Compressor"
    with pytest.raises(TypeError, match=match):
        hvd.DistributedGradientTape(tf.GradientTape(), compression=bad)
    with pytest.raises(TypeError, match=match):
        hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=bad)
    with pytest.raises(TypeError, match=match):
        hvd.allreduce(tf.ones([2]), compression=bad)
