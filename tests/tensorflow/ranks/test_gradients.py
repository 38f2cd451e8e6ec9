"""Gradients follow Horovod's conventions: allreduce's follows its op;
allgather and broadcast use the mean of the upstream gradients over ranks;
reducescatter's is size times the allgathered upstream gradient."""
import numpy as np
import pytest
import tensorflow as tf
from error_helpers import Background

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


@pytest.mark.parametrize("root", ["first", "last"])
def test_broadcast_gradient_goes_to_root(rank, size, in_function, root):
    root = 0 if root == "first" else size - 1
    x = tf.Variable(tf.ones([2]))
    g = grad_of(lambda v: hvd.broadcast(v, root), x, weights_for(rank, [2]), in_function)
    expected = np.mean([r + 1.0 for r in range(size)]) if rank == root else 0.0
    np.testing.assert_allclose(g, [expected] * 2, rtol=1e-6)


def test_broadcast_gradient_in_a_set_goes_to_the_job_wide_root(rank, size, in_function,
                                                               set_without_rank_0):
    ps = set_without_rank_0
    if not ps.included():
        return
    for root in ps.ranks:  # job-wide ranks, as in Horovod
        x = tf.Variable(tf.ones([2]))
        g = grad_of(lambda v: hvd.broadcast(v, root, process_set=ps), x,
                    weights_for(rank, [2]), in_function)
        expected = np.mean([r + 1.0 for r in ps.ranks]) if rank == root else 0.0
        np.testing.assert_allclose(g, [expected] * 2, rtol=1e-6, err_msg=f"root {root}")


def broadcast_gradient_in_tf1_graph(rank, root, process_set):
    """tf.gradients of a broadcast, run by a TF1 Session (the issue's repro):
    with a static shape, every rank must still submit the gradient's allreduce."""
    with tf.Graph().as_default():
        x = tf.ones([5]) * float(rank + 1)
        y = hvd.broadcast(x, root, process_set=process_set)
        g = tf.gradients(y, x, tf.ones([5]) * float(rank + 1))[0]
        with tf.compat.v1.Session() as sess:
            return sess.run(g)


# A hang here fails the test after HANG_GUARD_S, instead of blocking the suite
# until the launcher's --timeout: the Session runs on a daemon thread.
HANG_GUARD_S = 60


@pytest.mark.parametrize("root", ["first", "last"])
def test_broadcast_gradient_in_tf1_graph_does_not_hang(rank, size, root):
    root = 0 if root == "first" else size - 1
    g = Background(lambda: broadcast_gradient_in_tf1_graph(
        rank, root, hvd.global_process_set)).wait(HANG_GUARD_S)
    assert g.error is None, g.error
    expected = np.mean([r + 1.0 for r in range(size)]) if rank == root else 0.0
    np.testing.assert_allclose(g.value, [expected] * 5, rtol=1e-6)


def test_broadcast_gradient_in_tf1_graph_in_a_set_does_not_hang(rank, size, set_without_rank_0):
    ps = set_without_rank_0
    if not ps.included():
        return
    for root in ps.ranks:
        g = Background(lambda: broadcast_gradient_in_tf1_graph(rank, root, ps)).wait(HANG_GUARD_S)
        assert g.error is None, g.error
        expected = np.mean([r + 1.0 for r in ps.ranks]) if rank == root else 0.0
        np.testing.assert_allclose(g.value, [expected] * 5, rtol=1e-6, err_msg=f"root {root}")


def test_alltoall_gradient_returns_to_sender(rank, size, in_function):
    x = tf.Variable(tf.ones([size, 2]))
    # The received row from rank s gets weight 10 * s + rank.
    w = tf.constant([[10.0 * s + rank] * 2 for s in range(size)])
    g = grad_of(lambda v: hvd.alltoall(v, splits=[1] * size)[0], x, w, in_function)
    np.testing.assert_allclose(g, [[10.0 * rank + j] * 2 for j in range(size)])


def reducescatter_gradient_reference(size, rows, upstream, op, scale=1.0):
    """Horovod's convention, from numpy: every rank's input gradient is the
    upstream gradients of all ranks stacked in rank order (an allgather),
    times size for Sum (1 for Average) and the scale factors."""
    stacked = np.concatenate([upstream(r, rows[r]) for r in range(size)])
    return stacked * (size if op == hvd.Sum else 1.0) * scale


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["Sum", "Average"])
def test_reducescatter_gradient(rank, size, in_function, op):
    total = 2 * size + 1  # uneven: the first rank gets one extra row
    rows = [total // size + (1 if r < total % size else 0) for r in range(size)]

    def upstream(r, n):  # rank r's gradient of its own rows: differs by rank and row
        return (10.0 * (r + 1) + np.arange(n, dtype=np.float64))[:, None] * np.ones([1, 2])

    x = tf.Variable(tf.ones([total, 2]))
    w = tf.constant(upstream(rank, rows[rank]), tf.float32)
    g = grad_of(lambda v: hvd.reducescatter(v, op=op), x, w, in_function)
    np.testing.assert_allclose(g, reducescatter_gradient_reference(size, rows, upstream, op),
                               rtol=1e-6)
    g = grad_of(lambda v: hvd.reducescatter(v, op=op, prescale_factor=0.5,
                                            postscale_factor=3.0), x, w, in_function)
    np.testing.assert_allclose(
        g, reducescatter_gradient_reference(size, rows, upstream, op, scale=1.5), rtol=1e-6)
    g = grad_of(lambda v: hvd.grouped_reducescatter([v, 2.0 * v], op=op)[1], x, w, in_function)
    np.testing.assert_allclose(
        g, reducescatter_gradient_reference(size, rows, upstream, op, scale=2.0), rtol=1e-6)


def test_reducescatter_gradient_in_a_set(rank, size, in_function, set_without_rank_0):
    ps = set_without_rank_0
    if not ps.included():
        return
    n = ps.size()
    x = tf.Variable(tf.ones([n, 2]))
    w = weights_for(rank, [1, 2])
    g = grad_of(lambda v: hvd.reducescatter(v, op=hvd.Sum, process_set=ps), x, w, in_function)
    np.testing.assert_allclose(g, [[n * (r + 1.0)] * 2 for r in ps.ranks], rtol=1e-6)


def test_min_max_have_no_gradient(rank, size):
    x = tf.Variable(tf.ones([2]))
    with pytest.raises(NotImplementedError, match="not defined"):
        grad_of(lambda v: hvd.allreduce(v, op=hvd.Max), x, tf.ones([2]), False)
