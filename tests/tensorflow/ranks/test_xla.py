"""Collectives inside tf.function(jit_compile=True), checked against numpy,
and the errors a compiled step raises: the same type, cause and text as the
uncompiled step, on every rank, and the next step works. test_collectives.py
runs its allreduce, broadcast, alltoall and reducescatter tests in XLA mode
too; what is particular to XLA is here."""
import numpy as np
import pytest
import tensorflow as tf
from error_helpers import multi_rank, needs_peers  # noqa: F401
from tf_helpers import DTYPES, assert_close, rank_values

import tfring.tensorflow as hvd
from support import skip_module_without_xla_kernels
from tfring.common.exceptions import Cause, failure_of

skip_module_without_xla_kernels(tf.__version__)


@pytest.fixture(autouse=True)
def next_step_works(size):
    yield
    step = tf.function(lambda: hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="after_xla"),
                       jit_compile=True)
    assert step().numpy() == size


def compiled(build, *args):
    """Runs build(*args) as one XLA-compiled step; returns numpy values."""
    return tf.nest.map_structure(lambda t: t.numpy(), tf.function(build, jit_compile=True)(*args))


def test_the_step_is_compiled_with_custom_calls(rank):
    fn = tf.function(lambda x: hvd.allreduce(x, name="hlo") * 2.0, jit_compile=True)
    hlo = fn.experimental_get_compiler_ir(tf.ones([3]))(stage="hlo")
    assert "tfring_collective" in hlo and "custom-call" in hlo


def test_allreduce_between_computations(rank, size):
    # Compiled code on both sides of the collective, and the inputs computed
    # in the step: the custom call reads XLA's buffers and writes its result.
    def build(x):
        y = hvd.allreduce(tf.sin(x) * (rank + 1), op=hvd.Sum, name="mid")
        return tf.reduce_sum(y * 2.0)
    x = np.linspace(0, 1, 12).astype(np.float32)
    expected = 2.0 * (np.sin(x) * sum(r + 1 for r in range(size))).sum()
    assert np.isclose(compiled(build, tf.constant(x)), expected, rtol=1e-5)


def test_allgather(rank, size):
    value = rank_values(rank, (2, 3))

    def build():
        return {dt.name: hvd.allgather(tf.constant(value, dt)) for dt in DTYPES + [tf.bool]}
    out = compiled(build)
    expected = np.concatenate([rank_values(r, (2, 3)) for r in range(size)])
    for dt in DTYPES:
        assert_close(out[dt.name], expected, dt)
    np.testing.assert_array_equal(out["bool"], expected.astype(bool))


def test_grouped_allgather(rank, size):
    a, b = compiled(lambda: hvd.grouped_allgather([tf.fill([1, 2], rank), tf.fill([3], rank)]))
    np.testing.assert_array_equal(a, np.repeat(np.arange(size), 1)[:, None] * np.ones([1, 2]))
    np.testing.assert_array_equal(b, np.repeat(np.arange(size), 3))


def test_alltoall_equal_splits(rank, size):
    values, received = compiled(lambda: hvd.alltoall(tf.fill([2 * size, 3], rank),
                                                     splits=[2] * size))
    np.testing.assert_array_equal(values, np.repeat(np.arange(size), 2)[:, None] * np.ones([1, 3]))
    np.testing.assert_array_equal(received, [2] * size)


def test_size_and_rank_are_constants_of_the_step(rank, size):
    assert compiled(lambda: [hvd.size_op(), hvd.rank_op()]) == [size, rank]


def test_local_topology_is_constant_of_the_step():
    got = compiled(lambda: [hvd.local_size_op(), hvd.local_rank_op(),
                            hvd.process_set_included_op()])
    assert got == [hvd.local_size(), hvd.local_rank(), 1]


# --- Errors -------------------------------------------------------------------

def _error_of(fn):
    with pytest.raises(tf.errors.OpError) as info:
        fn()
    return info.value


def _core_text(error):
    """The core's message in a compiled step's error: TensorFlow appends the
    function's name ([Op:...]); an uncompiled step's error has the same text
    between TensorFlow's own lines instead."""
    return error.message.split(" [Op:")[0]


@multi_rank
def test_mismatch_raises_what_the_uncompiled_step_raises(rank):
    def step(x):
        return hvd.allreduce(x, name="mismatch")
    x = tf.ones([rank + 2])
    plain = _error_of(lambda: tf.function(step)(x))
    xla = _error_of(lambda: tf.function(step, jit_compile=True)(x))
    assert type(xla) is type(plain) is tf.errors.FailedPreconditionError
    assert failure_of(xla) == failure_of(plain) == (Cause.MISMATCH, None)
    assert _core_text(xla) in plain.message.splitlines(), (xla.message, plain.message)
    assert "Mismatched ALLREDUCE tensor shapes for tensor 'mismatch'" in xla.message


def test_bad_root_rank(size):
    error = _error_of(lambda: compiled(lambda: hvd.broadcast(tf.ones([2]), size, name="root")))
    assert isinstance(error, tf.errors.FailedPreconditionError)
    assert failure_of(error) == (Cause.INVALID_ARGUMENT, None)
    assert f"Invalid BROADCAST root rank {size} for tensor 'root'" in error.message


@multi_rank
def test_allgather_rows_must_agree(rank):
    error = _error_of(lambda: compiled(lambda: hvd.allgather(tf.ones([rank + 1, 2]), name="ag")))
    assert isinstance(error, tf.errors.FailedPreconditionError)
    assert failure_of(error) == (Cause.MISMATCH, None)
    assert "Mismatched ALLGATHER first dimensions for tensor 'ag'" in error.message
    assert "rank 0: 1" in error.message and "rank 1: 2" in error.message


_NOT_IN_XLA = {
    "barrier": ("HorovodBarrier", lambda v: hvd.barrier(name="xla_barrier")),
    "join": ("HorovodJoin", lambda v: hvd.join()),
    "variable_broadcast": ("HorovodBroadcastInplaceResource",
                           lambda v: hvd.broadcast_([v], 0, name="xla_bcast_")),
}


@pytest.mark.parametrize("what", sorted(_NOT_IN_XLA))
def test_ops_without_a_place_in_xla_say_so_at_compile_time(what):
    # Every rank fails to compile alike, so nothing is submitted and nothing
    # waits for a peer; the fixture's next step checks the job goes on.
    op, build = _NOT_IN_XLA[what]
    variable = tf.Variable([1.0, 2.0])

    def step():
        build(variable)  # stateful: kept in the step without being returned
        return tf.constant(0)
    error = _error_of(lambda: compiled(step))
    assert isinstance(error, tf.errors.InvalidArgumentError), error
    assert f"tfring: {op} " in error.message, error.message
    assert "cannot run inside an XLA-compiled step" in error.message, error.message


@multi_rank
def test_alltoall_with_uneven_splits_does_not_compile(rank, size):
    splits = [1] * size
    splits[0] = 2

    def step():
        return hvd.alltoall(tf.ones([size + 1, 2]), splits=splits, name="uneven")
    error = _error_of(lambda: compiled(step))
    assert isinstance(error, tf.errors.InvalidArgumentError)
    assert "HorovodAlltoall 'uneven' cannot run inside XLA" in error.message
    assert "uneven" in error.message and "static shapes" in error.message
