"""Keras training on a GPU with tfring's TensorFlow kernels (marked
`tf_gpu`): DistributedOptimizer's fit equals one process on the global
batch, with jit_compile=False and with Keras 3's default "auto", which
tfring resolves to no XLA for a model it reduces gradients for. Skipped
where TensorFlow sees no GPU (the `tf_gpu` fixture)."""
import pytest
import tensorflow as tf

import tfring.keras as hvd
import tfring.tensorflow as hvd_tf
from test_optimizer import linear_model
from training_reference import BATCH, LR, STEPS, assert_trained_like_reference, local_data

pytestmark = pytest.mark.tf_gpu


@pytest.mark.parametrize("jit_compile", [False, "auto"])
def test_fit_on_gpu_matches_single_process(tf_gpu, rank, size, legacy_keras, jit_compile):
    if legacy_keras and jit_compile == "auto":
        pytest.skip("tf_keras has no jit_compile='auto'")
    with tf.device(tf_gpu):
        model = linear_model(rank)
        model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(LR)),
                      loss="mse", jit_compile=jit_compile)
        hvd_tf.broadcast_variables(model.variables, root_rank=0)
        xs, ys = local_data(rank, size, STEPS)
        model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert model.jit_compile is False  # "auto" on a GPU would pick XLA
    assert "GPU" in model.variables[0].device
    assert_trained_like_reference(*model.get_weights(), size)
