"""op=hvd.Adasum, checked against a numpy reference of the pairwise formula
a' = (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b applied up the binary tree
of ranks (r with r ^ 1, then pairs at distance 2, ...), tensor by tensor.
On a number of ranks that is not a power of two it is refused, as Horovod
refuses it on CPU."""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd
import tfring.keras as hvd_keras
from error_helpers import expect_error
from tf_helpers import run



@pytest.fixture
def power_of_two(size):
    """Skips a test unless the job has 1, 2, 4, ... ranks (every rank alike)."""
    if size & (size - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")


@pytest.fixture
def not_power_of_two(size):
    if not size & (size - 1):
        pytest.skip("Adasum runs on a power-of-two number of ranks")


POWER_OF_TWO = pytest.mark.usefixtures("power_of_two")


def adasum_pair(a, b):
    dot, aa, bb = np.dot(a, b), np.dot(a, a), np.dot(b, b)
    ca = 1 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def adasum_reference(per_rank):
    """The Adasum of one tensor's per-rank values (float64, flattened)."""
    level = [np.asarray(v, np.float64).ravel() for v in per_rank]
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def rank_tensor(r, slot, shape):
    """Rank r's value of tensor `slot`: random, and differently aligned per rank."""
    return np.random.default_rng([11, r, slot]).standard_normal(shape)


def check(got, per_rank, dtype, what):
    want = adasum_reference(per_rank).reshape(np.shape(got))
    tol = {tf.float16: 2e-2, tf.float32: 2e-5, tf.float64: 1e-12}[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol,
                               err_msg=f"{what} {dtype.name}")


@POWER_OF_TWO
@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64], ids=lambda d: d.name)
def test_adasum_matches_the_pairwise_formula(mode, rank, size, dtype):
    shapes = [(7,), (3, 4), (1,), (130,)]

    def build():
        single = hvd.allreduce(tf.constant(rank_tensor(rank, 0, shapes[0]), dtype), op=hvd.Adasum)
        grouped = hvd.grouped_allreduce(
            [tf.constant(rank_tensor(rank, i, s), dtype) for i, s in enumerate(shapes)],
            op=hvd.Adasum)
        return [single] + grouped
    out = run(mode, build)
    check(out[0], [rank_tensor(r, 0, shapes[0]) for r in range(size)], dtype, "allreduce")
    # Fused tensors each get their own coefficients.
    for i, s in enumerate(shapes):
        check(out[1 + i], [rank_tensor(r, i, s) for r in range(size)], dtype, f"grouped[{i}]")


@POWER_OF_TWO
def test_adasum_of_orthogonal_and_of_parallel_vectors(rank, size):
    # Orthogonal (one-hot per rank): nothing is shared, so they add up.
    onehot = np.eye(max(size, 2))[rank]
    got = hvd.allreduce(tf.constant(onehot), op=hvd.Adasum).numpy()
    np.testing.assert_allclose(got, np.eye(max(size, 2))[:size].sum(0), rtol=1e-12)
    # Parallel and equal: the same information from every rank counts once.
    same = np.array([3.0, -1.0, 2.0])
    got = hvd.allreduce(tf.constant(same), op=hvd.Adasum).numpy()
    np.testing.assert_allclose(got, same, rtol=1e-12)


@POWER_OF_TWO
def test_adasum_with_scale_factors(rank, size):
    # The coefficients are invariant under a common scale, so pre- and
    # postscaling scale the result.
    x = rank_tensor(rank, 5, (6,))
    got = hvd.allreduce(tf.constant(x), op=hvd.Adasum, prescale_factor=2.0,
                        postscale_factor=0.25).numpy()
    want = 0.5 * adasum_reference([rank_tensor(r, 5, (6,)) for r in range(size)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@POWER_OF_TWO
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_distributed_gradient_tape_with_adasum(rank, size, in_function):
    w = tf.Variable(tf.zeros([5], tf.float64))
    x = tf.constant(rank_tensor(rank, 6, (5,)))

    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * x)
        return hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [w])[0]
    got = (tf.function(grads)() if in_function else grads()).numpy()
    check(got, [rank_tensor(r, 6, (5,)) for r in range(size)], tf.float64, "tape")


@POWER_OF_TWO
def test_keras_distributed_optimizer_with_adasum(rank, size):
    keras = tf.keras
    w = tf.Variable(tf.zeros([4], tf.float32))
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), op=hvd.Adasum)
    grad = tf.constant(rank_tensor(rank, 7, (4,)), tf.float32)
    opt.apply_gradients([(grad, w)])
    want = -adasum_reference([rank_tensor(r, 7, (4,)) for r in range(size)])
    np.testing.assert_allclose(w.numpy(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.usefixtures("not_power_of_two")
def test_adasum_refused_on_a_number_of_ranks_that_is_not_a_power_of_two(rank, size):
    message = "Running Adasum with non-power of 2 ranks is not supported yet."
    expect_error(NotImplementedError, lambda: hvd.allreduce(tf.ones([3]), op=hvd.Adasum),
                 message)
    expect_error(NotImplementedError,
                 lambda: hvd.grouped_allreduce([tf.ones([3])], op=hvd.Adasum), message)
    w = tf.Variable(tf.ones([2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
    expect_error(NotImplementedError,
                 lambda: hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [w]),
                 message)
    # Nothing was submitted: the job goes on.
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="after_adasum").numpy() == size


@POWER_OF_TWO
@pytest.mark.parametrize("passes", [1, 2])
def test_tf1_distributed_optimizer_combines_deltas_with_adasum(rank, size, passes):
    """Horovod's TF1 semantics: each rank applies SGD to its own gradient and
    every `passes` steps the variable deltas are combined with Adasum."""
    x = rank_tensor(rank, 8, (3,))
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.zeros([3], tf.float64),
                                      use_resource=True)
        loss = tf.reduce_sum(w * tf.constant(x))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                       op=hvd.Adasum, backward_passes_per_step=passes)
        train = opt.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            values = []
            for _ in range(2 * passes):
                sess.run(train)
                values.append(sess.run(w))
    combined = adasum_reference([rank_tensor(r, 8, (3,)) for r in range(size)])
    if passes == 2:
        # Between communication steps each rank moves on its own.
        np.testing.assert_allclose(values[0], -x, rtol=1e-12)
    # The delta of `passes` local steps is -passes * x on each rank.
    np.testing.assert_allclose(values[passes - 1], -passes * combined, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(values[-1], -2 * passes * combined, rtol=1e-9, atol=1e-12)


def test_adasum_refused_on_a_process_set_other_than_the_global_one(rank, size):
    ps = hvd.add_process_set(list(range(size)))  # the same ranks, but not the global set
    try:
        expect_error(NotImplementedError,
                     lambda: hvd.allreduce(tf.ones([2]), op=hvd.Adasum, process_set=ps),
                     "Adasum does not support non-global process sets yet.")
    finally:
        assert hvd.remove_process_set(ps)


def test_adasum_with_average_aggregated_gradients_is_refused():
    message = "Adasum does not support average_aggregated_gradients=True."
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1.0), op=hvd.Adasum,
        backward_passes_per_step=2, average_aggregated_gradients=True), message)
    expect_error(ValueError, lambda: hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(1.0), op=hvd.Adasum, backward_passes_per_step=2,
        average_aggregated_gradients=True), message)
