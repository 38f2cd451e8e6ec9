"""SyncBatchNormalization: training-mode statistics are those of the global
batch (every rank's batch concatenated), checked against numpy and against a
single-process TensorFlow reference for gradients. Ranks hold batches of
different sizes (2 + rank rows), so a per-rank mean of means would be wrong."""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd
from support import xla_kernels_expected
from tfring.keras.sync_batch_norm import SyncBatchNormalization

# Where this TensorFlow gives tfring's collectives XLA kernels (README, XLA).
XLA = xla_kernels_expected(tf.__version__)

EPS = 1e-3
BN_MOMENTUM = 0.9


def rank_batches(size, tail, seed, loc=5.0, scale=2.0):
    """Every rank's batch (rank r has 2 + r rows), the same arrays on every rank."""
    rng = np.random.default_rng(seed)
    return [rng.normal(loc, scale, size=(2 + r, *tail)).astype(np.float32) for r in range(size)]


def make_layer(channels, axis=-1, **kwargs):
    layer = SyncBatchNormalization(axis=axis, momentum=BN_MOMENTUM, epsilon=EPS, **kwargs)
    rng = np.random.default_rng(99)
    params = [rng.uniform(0.5, 2.0, channels), rng.normal(size=channels),
              rng.normal(size=channels), rng.uniform(0.5, 2.0, channels)]
    return layer, [p.astype(np.float32) for p in params]


def build(layer, params, example):
    layer(example, training=False)
    layer.set_weights(params)


def numpy_bn(global_x, local_x, axis, params, weights=None, local_weights=None):
    """Batch norm of local_x with the statistics of global_x (float64)."""
    gamma, beta, mm, mv = [p.astype(np.float64) for p in params]
    ndim = global_x.ndim
    axis = axis % ndim
    axes = tuple(i for i in range(ndim) if i != axis)
    g = global_x.astype(np.float64)
    if weights is None:
        mean, var = g.mean(axes), g.var(axes)
    else:
        w = np.broadcast_to(weights[..., None], g.shape).astype(np.float64)
        mean = (g * w).sum(axes) / w.sum(axes)
        var = (w * (g - mean.reshape([-1 if i == axis else 1 for i in range(ndim)])) ** 2
               ).sum(axes) / w.sum(axes)
    shape = [-1 if i == axis else 1 for i in range(ndim)]
    y = ((local_x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + EPS) *
         gamma.reshape(shape) + beta.reshape(shape))
    return (y, BN_MOMENTUM * mm + (1 - BN_MOMENTUM) * mean,
            BN_MOMENTUM * mv + (1 - BN_MOMENTUM) * var)


@pytest.fixture(params=["eager", "function"])
def call_mode(request):
    return request.param


def call(layer, mode, *args, **kwargs):
    if mode == "function":
        return tf.function(lambda: layer(*args, **kwargs))()
    return layer(*args, **kwargs)


@pytest.mark.parametrize("tail,axis", [((3,), -1), ((4, 4, 3), -1), ((3, 4, 4), 1)],
                         ids=["dense", "nhwc", "nchw"])
def test_training_output_is_global_batch_norm(rank, size, tail, axis, call_mode):
    batches = rank_batches(size, tail, seed=1)
    channels = tail[axis - 1] if axis > 0 else tail[axis]
    layer, params = make_layer(channels, axis=axis)
    build(layer, params, batches[rank])
    out = call(layer, call_mode, tf.constant(batches[rank]), training=True)
    expected, moving_mean, moving_var = numpy_bn(np.concatenate(batches), batches[rank],
                                                 axis, params)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), moving_mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), moving_var, rtol=1e-5, atol=1e-5)
    # Inference mode uses the (now global, identical) moving statistics.
    inference = layer(tf.constant(batches[rank]), training=False).numpy()
    shape = [-1 if i == axis % (len(tail) + 1) else 1 for i in range(len(tail) + 1)]
    gamma, beta = params[0].reshape(shape), params[1].reshape(shape)
    np.testing.assert_allclose(
        inference, (batches[rank] - moving_mean.reshape(shape)) /
        np.sqrt(moving_var.reshape(shape) + EPS) * gamma + beta, rtol=1e-4, atol=1e-4)


def test_masked_statistics(rank, size):
    batches = rank_batches(size, (5, 3), seed=2)
    rng = np.random.default_rng(3)
    masks = [rng.random((2 + r, 5)) < 0.6 for r in range(size)]
    for m in masks:
        m[0, 0] = True
    layer, params = make_layer(3)
    build(layer, params, batches[rank])
    out = layer(tf.constant(batches[rank]), training=True, mask=tf.constant(masks[rank]))
    expected, moving_mean, moving_var = numpy_bn(np.concatenate(batches), batches[rank], -1,
                                                 params, weights=np.concatenate(masks))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), moving_mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), moving_var, rtol=1e-5, atol=1e-5)


def test_large_offset_keeps_variance_precise(rank, size):
    # Values around 1e4 with unit spread: E[x^2] - E[x]^2 in float32 would
    # lose the variance entirely.
    batches = [b - 5.0 + 1e4 for b in rank_batches(size, (2,), seed=4, scale=1.0)]
    layer, params = make_layer(2)
    build(layer, params, batches[rank])
    layer(tf.constant(batches[rank]), training=True)
    _, _, moving_var = numpy_bn(np.concatenate(batches), batches[rank], -1, params)
    np.testing.assert_allclose(layer.moving_variance.numpy(), moving_var, rtol=1e-4)


def reference_gradients(batches, cots, params, axis=-1):
    """Gradients of sum_r sum(bn(X)_r * cot_r) for the global batch X in one process."""
    x_all = tf.constant(np.concatenate(batches).astype(np.float64))
    cot_all = tf.constant(np.concatenate(cots).astype(np.float64))
    gamma = tf.constant(params[0].astype(np.float64))
    beta = tf.constant(params[1].astype(np.float64))
    with tf.GradientTape() as tape:
        tape.watch([x_all, gamma, beta])
        axes = [i for i in range(len(x_all.shape)) if i != axis % len(x_all.shape)]
        mean, var = tf.nn.moments(x_all, axes)
        y = (x_all - mean) / tf.sqrt(var + EPS) * gamma + beta
        loss = tf.reduce_sum(y * cot_all)
    return [g.numpy() for g in tape.gradient(loss, [x_all, gamma, beta])]


def test_gradients_match_global_batch_norm(rank, size, call_mode):
    batches = rank_batches(size, (3,), seed=5)
    cots = rank_batches(size, (3,), seed=6, loc=0.0, scale=1.0)
    layer, params = make_layer(3)
    build(layer, params, batches[rank])
    x = tf.constant(batches[rank])
    cot = tf.constant(cots[rank])

    def grads():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, training=True) * cot)
        return tape.gradient(loss, [x, layer.gamma, layer.beta])

    dx, dgamma, dbeta = grads() if call_mode == "eager" else tf.function(grads)()
    ref_dx, ref_dgamma, ref_dbeta = reference_gradients(batches, cots, params)
    start = sum(2 + r for r in range(rank))
    np.testing.assert_allclose(dx.numpy(), ref_dx[start:start + 2 + rank], rtol=1e-3, atol=1e-4)
    # gamma and beta get each rank's share; their sum is the global gradient.
    np.testing.assert_allclose(hvd.allreduce(dgamma, op=hvd.Sum).numpy(), ref_dgamma,
                               rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(hvd.allreduce(dbeta, op=hvd.Sum).numpy(), ref_dbeta,
                               rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("jit", ["off"] + (["auto_on_a_gpu"] if XLA else [])
                         + ["auto_on_a_gpu_tfring_xla_0"])
def test_in_model_fit_moving_statistics_agree(keras, rank, size, jit, request, monkeypatch):
    batches = rank_batches(size, (4,), seed=7)
    targets = rank_batches(size, (3,), seed=8)
    kernel = np.random.default_rng(9).normal(size=(4, 3)).astype(np.float32)
    model = keras.Sequential([
        keras.Input(shape=(4,)),
        keras.layers.Dense(3, use_bias=False,
                           kernel_initializer=keras.initializers.Constant(kernel)),
        SyncBatchNormalization(momentum=BN_MOMENTUM, epsilon=EPS),
    ])
    if jit == "off":
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=False)
    else:
        # Keras 3 chooses XLA here (a GPU machine) and the layer's allreduce
        # runs inside it; with TFRING_XLA=0 the layer says it has no XLA
        # kernel (supports_jit), so "auto" means no XLA.
        request.getfixturevalue("gpu_like_auto")
        xla = not jit.endswith("tfring_xla_0")
        if not xla:
            monkeypatch.setenv("TFRING_XLA", "0")
        model = keras.models.clone_model(model)  # the layer reads TFRING_XLA when made
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        assert model.jit_compile is xla
    # One step on this rank's whole batch.
    model.fit(batches[rank], targets[rank], batch_size=len(batches[rank]), epochs=1,
              shuffle=False, verbose=0)
    bn = model.layers[-1]
    hidden = np.concatenate(batches) @ kernel
    np.testing.assert_allclose(bn.moving_mean.numpy(),
                               (1 - BN_MOMENTUM) * hidden.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.numpy(),
                               BN_MOMENTUM + (1 - BN_MOMENTUM) * hidden.var(0), rtol=1e-4)
    stats = hvd.allgather_object([bn.moving_mean.numpy(), bn.moving_variance.numpy()])
    for theirs in stats:
        np.testing.assert_array_equal(theirs[0], stats[0][0])
        np.testing.assert_array_equal(theirs[1], stats[0][1])


def test_config_round_trip(keras):
    layer = SyncBatchNormalization(axis=1, momentum=0.8, epsilon=1e-2, center=False,
                                   gamma_initializer="zeros", name="sbn")
    config = layer.get_config()
    clone = SyncBatchNormalization.from_config(config)
    assert type(clone) is SyncBatchNormalization
    assert clone.get_config() == config
    revived = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(revived) is SyncBatchNormalization
    assert revived.get_config() == config
    with pytest.raises(ValueError, match="fused"):
        SyncBatchNormalization(fused=True)


def test_fused_false_is_accepted(rank, size):
    """Horovod's tests and Keras 2 scripts pass fused=False; Keras 3 has no
    fused batch norm, and the layer takes the argument on both flavours (from
    tfring.tensorflow too, where Horovod's tests find it) and still
    synchronizes."""
    assert hvd.SyncBatchNormalization is SyncBatchNormalization
    batches = rank_batches(size, (3,), seed=5)
    layer, params = make_layer(3, fused=False)
    build(layer, params, batches[rank])
    out = layer(tf.constant(batches[rank]), training=True)
    expected, moving_mean, _ = numpy_bn(np.concatenate(batches), batches[rank], -1, params)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), moving_mean, rtol=1e-5, atol=1e-5)
    config = layer.get_config()
    assert SyncBatchNormalization.from_config(config).get_config() == config


def test_saved_model_loads_without_custom_objects(keras, rank, size, tmp_path):
    batches = rank_batches(size, (4,), seed=10)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3),
                              SyncBatchNormalization()])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=False)
    model(tf.constant(batches[rank]), training=True)  # moving statistics move
    path = str(tmp_path / "sbn.keras")     # this rank's own file
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.layers[-1]) is SyncBatchNormalization
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    x = tf.constant(batches[rank])
    np.testing.assert_allclose(loaded(x, training=False).numpy(),
                               model(x, training=False).numpy(), rtol=1e-6)
    # The loaded layer still synchronizes.
    np.testing.assert_allclose(loaded(x, training=True).numpy(),
                               model(x, training=True).numpy(), rtol=1e-5, atol=1e-5)
