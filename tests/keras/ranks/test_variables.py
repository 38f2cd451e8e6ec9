"""In-place broadcasts of Keras variables (Keras 3 variables have a string
dtype and wrap a resource variable; tf_keras's are tf.Variables)."""
import numpy as np
import tensorflow as tf

import tfring.tensorflow as hvd_tf


def rank_dense(rank):
    layer = tf.keras.layers.Dense(2)
    layer.build((None, 3))
    layer.set_weights([np.full([3, 2], rank, np.float32), np.full([2], rank + 0.5, np.float32)])
    return layer


def test_broadcast_inplace_of_keras_variables(rank, size):
    layer = rank_dense(rank)
    values = hvd_tf.broadcast_(layer.weights, root_rank=size - 1)
    for got in (values, layer.get_weights()):
        np.testing.assert_allclose(got[0], np.full([3, 2], size - 1))
        np.testing.assert_allclose(got[1], np.full([2], size - 0.5))
    layer = rank_dense(rank)
    assert hvd_tf.broadcast_variables(layer.weights, root_rank=0, inplace=True) is None
    np.testing.assert_allclose(layer.get_weights()[0], np.zeros([3, 2]))
