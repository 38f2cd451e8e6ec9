"""Gradients follow Horovod's conventions: allreduce's follows its op;
allgather and broadcast use the mean of the upstream gradients over ranks."""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd


def grad_of(collective, x, weights, in_function):
    def compute():
        with tf.GradientTape() as tape:
            y = collective(x)
            loss = tf.reduce_sum(y * weights)
        return tape.gradient(loss, x)
    return (tf.function(compute)() if in_function else compute()).numpy()


@pytest.fixture(params=[False, True], ids=["eager", "function"])
def in_function(request):
    return request.param


def weights_for(r, shape):
    return tf.constant(np.full(shape, r + 1.0), tf.float32)


def test_allreduce_gradient_follows_op(rank, size, in_function):
    x = tf.Variable(tf.ones([3]))
    w = weights_for(rank, [3])
    mean_w = np.mean([r + 1.0 for r in range(size)])
    g = grad_of(lambda v: hvd.allreduce(v, op=hvd.Sum), x, w, in_function)
    np.testing.assert_allclose(g, [mean_w * size] * 3, rtol=1e-6)
    g = grad_of(lambda v: hvd.allreduce(v, op=hvd.Average), x, w, in_function)
    np.testing.assert_allclose(g, [mean_w] * 3, rtol=1e-6)
    g = grad_of(lambda v: hvd.grouped_allreduce([v], op=hvd.Average)[0], x, w, in_function)
    np.testing.assert_allclose(g, [mean_w] * 3, rtol=1e-6)


def test_allgather_gradient_is_own_rows_of_mean(rank, size, in_function):
    x = tf.Variable(tf.ones([rank + 1, 2]))
    total_rows = sum(r + 1 for r in range(size))
    # Upstream gradient row i is i * (rank + 1); its mean over ranks is i * mean(r + 1).
    w = tf.constant(np.arange(total_rows)[:, None] * np.ones([1, 2]) * (rank + 1), tf.float32)
    g = grad_of(hvd.allgather, x, w, in_function)
    mean_scale = np.mean([r + 1.0 for r in range(size)])
    begin = sum(r + 1 for r in range(rank))
    expected = np.arange(begin, begin + rank + 1)[:, None] * np.ones([1, 2]) * mean_scale
    np.testing.assert_allclose(g, expected, rtol=1e-6)


def test_broadcast_gradient_goes_to_root(rank, size, in_function):
    x = tf.Variable(tf.ones([2]))
    g = grad_of(lambda v: hvd.broadcast(v, 0), x, weights_for(rank, [2]), in_function)
    expected = np.mean([r + 1.0 for r in range(size)]) if rank == 0 else 0.0
    np.testing.assert_allclose(g, [expected] * 2, rtol=1e-6)


def test_alltoall_gradient_returns_to_sender(rank, size, in_function):
    x = tf.Variable(tf.ones([size, 2]))
    # The received row from rank s gets weight 10 * s + rank.
    w = tf.constant([[10.0 * s + rank] * 2 for s in range(size)])
    g = grad_of(lambda v: hvd.alltoall(v, splits=[1] * size)[0], x, w, in_function)
    np.testing.assert_allclose(g, [[10.0 * rank + j] * 2 for j in range(size)])


def test_reducescatter_gradient(rank, size, in_function):
    x = tf.Variable(tf.ones([size, 2]))
    w = weights_for(rank, [1, 2])
    g = grad_of(lambda v: hvd.reducescatter(v, op=hvd.Sum), x, w, in_function)
    np.testing.assert_allclose(g, [[r + 1.0] * 2 for r in range(size)])
    g = grad_of(lambda v: hvd.reducescatter(v, op=hvd.Average), x, w, in_function)
    np.testing.assert_allclose(g, [[(r + 1.0) / size] * 2 for r in range(size)], rtol=1e-6)


def test_min_max_have_no_gradient(rank, size):
    x = tf.Variable(tf.ones([2]))
    with pytest.raises(NotImplementedError, match="not defined"):
        grad_of(lambda v: hvd.allreduce(v, op=hvd.Max), x, tf.ones([2]), False)
