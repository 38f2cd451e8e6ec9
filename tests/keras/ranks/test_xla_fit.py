"""Keras with XLA and a DistributedOptimizer: the train step is compiled with
XLA and reduces the gradients inside it (tfring/keras/xla.py), and trains to
the weights the uncompiled step gives. The fallback that TFRING_XLA=0 brings
back (no XLA, one notice) is tested in test_optimizer.py."""
import numpy as np
import tensorflow as tf
from support import skip_module_without_xla_kernels

import tfring.keras as hvd
import tfring.tensorflow as hvd_tf
from training_reference import (BATCH, FEATURES, LR, assert_trained_like_reference,
                                initial_weights, local_data)

keras = tf.keras

skip_module_without_xla_kernels(tf.__version__)


def cnn(rank):
    """A small CNN whose initial weights differ by rank (the broadcast
    callback must make them agree)."""
    keras.utils.set_random_seed(100 + rank)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(3),
    ])


def fit_cnn(rank, size, jit_compile):
    model = cnn(rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=jit_compile)
    rng = np.random.RandomState(7 + rank)  # different data on every rank
    xs = rng.randn(4 * BATCH, 8, 8, 1).astype(np.float32)
    ys = rng.randint(0, 3, size=4 * BATCH)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    history = model.fit(xs, ys, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                        callbacks=callbacks)
    return model, history.history


def test_jit_compiled_fit_matches_plain_fit(rank, size, legacy_keras):
    plain, plain_history = fit_cnn(rank, size, jit_compile=False)
    xla, xla_history = fit_cnn(rank, size, jit_compile=True)
    assert xla.jit_compile is True  # tfring kept XLA on
    for a, b in zip(xla.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for key in plain_history:
        np.testing.assert_allclose(xla_history[key], plain_history[key], rtol=1e-5, atol=1e-5,
                                   err_msg=key)
    # The ranks agree: the gradients were averaged inside the compiled step.
    everyone = hvd_tf.allgather_object([w.tolist() for w in xla.get_weights()])
    assert all(e == everyone[0] for e in everyone)


def linear_model(rank):
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.set_weights(list(initial_weights(rank)))
    return model


def test_default_compile_on_a_gpu_machine_keeps_xla(rank, size, gpu_like_auto, caplog):
    """Keras 3 chooses XLA for this train step (see gpu_like_auto); tfring
    keeps it, says nothing, and the model trains like the reference."""
    caplog.set_level("WARNING", logger="tfring")
    model = linear_model(rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    xs, ys = local_data(rank, size)
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert model.jit_compile is True
    assert_trained_like_reference(*model.get_weights(), size)
    assert not [r for r in caplog.records if "without XLA" in r.getMessage()]
