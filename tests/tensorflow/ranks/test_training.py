"""Numerical equivalence: N ranks with per-rank batch b train to the same
weights as one process with batch N*b (plain SGD), for the gradient tape
(eager, tf.function and tf.function(jit_compile=True)) and TF1 graph mode
with MonitoredTrainingSession."""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd
from tf_helpers import XLA, tf1_graph
from training_reference import (BATCH, FEATURES, LR, STEPS, assert_local_part_like_reference,
                                assert_trained_like_reference, global_data, initial_weights,
                                local_batch)

@pytest.mark.parametrize("in_function", [False, True] + (["xla"] if XLA else []),
                         ids=["eager", "function"] + (["xla"] if XLA else []))
def test_distributed_gradient_tape_matches_single_process(rank, size, in_function):
    x, y = global_data(size)
    w0, b0 = initial_weights(rank)
    w, b = tf.Variable(w0), tf.Variable(b0)
    hvd.broadcast_variables([w, b], root_rank=0)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) + b - yb))
        tape = hvd.DistributedGradientTape(tape)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(LR * gw)
        b.assign_sub(LR * gb)
    if in_function:
        step = tf.function(step, jit_compile=in_function == "xla")
    for s in range(STEPS):
        step(local_batch(x, s, rank, size), local_batch(y, s, rank, size))
    assert_trained_like_reference(w.numpy(), b.numpy(), size)


@pytest.mark.parametrize("jit_compile", [False] + ([True] if XLA else []),
                         ids=["function"] + (["xla"] if XLA else []))
@pytest.mark.parametrize("name,tol", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_distributed_gradient_tape_with_16bit_compression(rank, size, name, tol, jit_compile):
    x, y = global_data(size)
    w0, b0 = initial_weights(rank)
    w, b = tf.Variable(w0), tf.Variable(b0)
    hvd.broadcast_variables([w, b], root_rank=0)

    @tf.function(jit_compile=jit_compile)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) + b - yb))
        tape = hvd.DistributedGradientTape(tape, compression=getattr(hvd.Compression, name))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(LR * gw)
        b.assign_sub(LR * gb)
    for s in range(STEPS):
        step(local_batch(x, s, rank, size), local_batch(y, s, rank, size))
    assert_trained_like_reference(w.numpy(), b.numpy(), size, rtol=tol, atol=tol)


@pytest.mark.parametrize("in_function", [False, True] + (["xla"] if XLA else []),
                         ids=["eager", "function"] + (["xla"] if XLA else []))
def test_distributed_gradient_tape_with_powersgd(rank, size, in_function):
    """Gradients u v_r^T average to a rank-1 matrix, which rank-1 PowerSGD
    gets exactly; step 1 (before start_step) is uncompressed. Compiled with
    XLA, the switch at start_step is a conditional around the collectives."""
    u = np.arange(1.0, 9.0, dtype=np.float32)
    vs = [np.random.RandomState(r).randn(6).astype(np.float32) for r in range(size)]
    w = tf.Variable(tf.zeros([8, 6]))
    bias = tf.Variable(tf.zeros([3]))
    compression = hvd.Compression.powersgd(rank=1, start_step=1)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * np.outer(u, vs[rank])) + tf.reduce_sum(bias) * rank
        return hvd.DistributedGradientTape(tape, compression=compression).gradient(
            loss, [w, bias])
    if in_function:
        step = tf.function(step, jit_compile=in_function == "xla")
    expected = np.outer(u, np.mean(vs, 0))
    for _ in range(3):
        gw, gb = step()
        np.testing.assert_allclose(gw.numpy(), expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(gb.numpy(), np.full([3], np.mean(range(size))), rtol=1e-6)
    assert int(compression.step.numpy()) == 3
    assert compression.errors[1] is None  # rank 1: sent uncompressed


def test_partial_tape_keeps_local_gradients_local(rank, size):
    shared = tf.keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)
    local = tf.keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)
    x = tf.constant([[float(rank + 1)]])
    shared(x), local(x)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared(x)) + tf.reduce_sum(local(x))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    g_shared, g_local = tape.gradient(loss, [shared.kernel, local.kernel])
    np.testing.assert_allclose(g_shared.numpy(), [[np.mean(np.arange(1, size + 1))]])
    np.testing.assert_allclose(g_local.numpy(), [[(rank + 1.0) / size]])


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("scale_local", [True, False], ids=["scaled", "unscaled"])
def test_tape_register_local_source_matches_reference(rank, size, in_function, scale_local):
    x, y = global_data(size)
    w0, b0 = initial_weights(rank)
    w, b, u = tf.Variable(w0), tf.Variable(b0), tf.Variable(np.zeros_like(w0))
    hvd.broadcast_variables([w, b], root_rank=0)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, w + u) + b - yb))
        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale_local)
        tape.register_local_source(u)
        for var, grad in zip([w, b, u], tape.gradient(loss, [w, b, u])):
            var.assign_sub(LR * grad)
    if in_function:
        step = tf.function(step)
    for s in range(STEPS):
        step(local_batch(x, s, rank, size), local_batch(y, s, rank, size))
    assert_local_part_like_reference(w.numpy(), b.numpy(), u.numpy(), rank, size,
                                     scale_local=scale_local)


def test_get_local_and_global_gradients(rank, size):
    x, y = global_data(size)
    w0, b0 = initial_weights(0)
    w, b, u = tf.Variable(w0), tf.Variable(b0), tf.Variable(np.full_like(w0, 0.5))
    xb, yb = local_batch(x, 0, rank, size), local_batch(y, 0, rank, size)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(xb, w + u) + b - yb))
    tape = hvd.PartialDistributedGradientTape(tape)  # Horovod's form: no local_layers
    tape.register_local_source(u)
    local_vars_grads, global_vars_grads = tape.get_local_and_global_gradients(loss, [w, u, b])
    # (variable, gradient) pairs, as in Horovod, in the order of the sources.
    assert [id(var) for var, _ in local_vars_grads] == [id(u)]
    assert [id(var) for var, _ in global_vars_grads] == [id(w), id(b)]
    local = [grad for _, grad in local_vars_grads]
    shared = [grad for _, grad in global_vars_grads]

    def grads(r):
        xs = local_batch(x, 0, r, size).astype(np.float64)
        err = xs @ (w0 + 0.5) + b0 - local_batch(y, 0, r, size)
        return 2 * xs.T @ err / len(xs), 2 * err.sum(0) / len(xs)
    mine = grads(rank)
    everyone = [grads(r) for r in range(size)]
    np.testing.assert_allclose(local[0].numpy(), mine[0] / size, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(shared[0].numpy(), np.mean([g[0] for g in everyone], 0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(shared[1].numpy(), np.mean([g[1] for g in everyone], 0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("resource_variables", [True, False], ids=["resource", "ref"])
def test_tf1_monitored_training_session_matches_single_process(rank, size, resource_variables):
    # With resource variables disabled, get_variable makes TF1 reference
    # variables, which BroadcastGlobalVariablesHook must broadcast too.
    x, y = global_data(size)
    w0, b0 = initial_weights(rank)
    with tf1_graph(resource_variables):
        w = tf.compat.v1.get_variable("w", initializer=w0)
        b = tf.compat.v1.get_variable("b", initializer=b0)
        xb = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        yb = tf.compat.v1.placeholder(tf.float32, [None, 1])
        loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) + b - yb))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR))
        train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as sess:
            for s in range(STEPS):
                sess.run(train_op, feed_dict={xb: local_batch(x, s, rank, size),
                                              yb: local_batch(y, s, rank, size)})
            final_w, final_b = sess.run([w, b])
    assert_trained_like_reference(final_w, final_b, size)


def test_tf1_backward_passes_per_step(rank, size):
    x, y = global_data(size)
    w0, b0 = initial_weights(rank)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=w0)
        b = tf.compat.v1.get_variable("b", initializer=b0)
        xb = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        yb = tf.compat.v1.placeholder(tf.float32, [None, 1])
        loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) + b - yb))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR),
                                       backward_passes_per_step=2)
        step_var = tf.compat.v1.train.get_or_create_global_step()
        train_op = opt.minimize(loss, global_step=step_var)
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as sess:
            for s in range(4):
                sess.run(train_op, feed_dict={xb: local_batch(x, s, rank, size),
                                              yb: local_batch(y, s, rank, size)})
            final_w, final_b, global_step = sess.run([w, b, step_var])
    assert global_step == 4  # every backward pass counts, as in Horovod
    assert_trained_like_reference(final_w, final_b, size, steps=4, accumulate=2)


@pytest.mark.parametrize("resource_variables", [True, False], ids=["resource", "ref"])
def test_tf1_optimizer_register_local_var(rank, size, resource_variables):
    x, y = global_data(size)
    w0, b0 = initial_weights(rank)
    with tf1_graph(resource_variables):
        w = tf.compat.v1.get_variable("w", initializer=w0)
        b = tf.compat.v1.get_variable("b", initializer=b0)
        u = tf.compat.v1.get_variable("u", initializer=np.zeros_like(w0))
        xb = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        yb = tf.compat.v1.placeholder(tf.float32, [None, 1])
        loss = tf.reduce_mean(tf.square(tf.matmul(xb, w + u) + b - yb))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR))
        opt.register_local_var(u)
        train_op = opt.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(hvd.broadcast_variables([w, b], root_rank=0))
            for s in range(STEPS):
                sess.run(train_op, feed_dict={xb: local_batch(x, s, rank, size),
                                              yb: local_batch(y, s, rank, size)})
            final = sess.run([w, b, u])
    assert_local_part_like_reference(*final, rank, size)


# -- process sets: ranks outside the set keep their gradients local (Horovod) ----------

def expected_gradient(rank, ps):
    """d/dw of sum((rank + 1) * w) is rank + 1; members average it over the set."""
    return np.mean([r + 1.0 for r in ps.ranks]) if ps.included() else rank + 1.0


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_gradient_tape_outside_the_set_keeps_local_gradients(rank, size, partial_set,
                                                             in_function):
    w = tf.Variable(tf.ones([2]))
    v = tf.Variable(tf.ones([3]))

    def grads():
        with tf.GradientTape() as tape:
            loss = (rank + 1.0) * (tf.reduce_sum(w) + tf.reduce_sum(v))
        return hvd.DistributedGradientTape(tape, process_set=partial_set).gradient(loss, [w, v])
    gw, gv = tf.function(grads)() if in_function else grads()
    want = expected_gradient(rank, partial_set)
    np.testing.assert_allclose(gw.numpy(), [want] * 2)
    np.testing.assert_allclose(gv.numpy(), [want] * 3)


def test_tf1_optimizer_outside_the_set_keeps_local_gradients(rank, size, partial_set):
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([2]))
        loss = (rank + 1.0) * tf.reduce_sum(w)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                       process_set=partial_set)
        (grad, _), = opt.compute_gradients(loss, [w])
        train_op = opt.minimize(loss, var_list=[w])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            g = sess.run(grad)
            sess.run(train_op)
            final = sess.run(w)
    want = expected_gradient(rank, partial_set)
    np.testing.assert_allclose(g, [want] * 2)
    np.testing.assert_allclose(final, [1.0 - want] * 2)
