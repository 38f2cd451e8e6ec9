"""Batch normalization whose batch statistics cover the global batch.

``SyncBatchNormalization`` subclasses ``tf.keras.layers.BatchNormalization`` of
whichever Keras ``tf.keras`` resolves to (Keras 3, or tf_keras with
``TF_USE_LEGACY_KERAS=1``) when this module is imported. It is registered as
``tfring>SyncBatchNormalization``: once this module is imported, saved models
that use it load without ``custom_objects``.

Example:
    >>> from tfring.keras.sync_batch_norm import SyncBatchNormalization
    >>> model = keras.Sequential([keras.layers.Conv2D(16, 3), SyncBatchNormalization()])
"""
import inspect
import re

import tensorflow as tf

from tfring.common import basics
from tfring.tensorflow import mpi_ops

__all__ = ["SyncBatchNormalization"]


def global_moments(x, reduction_axes, keepdims=False, mask=None, name=None):
    """Mean and variance of `x` over `reduction_axes` and over every rank's `x`.

    Each rank computes its count, sum and (two-pass) sum of squared deviations
    per channel; one grouped allreduce (Sum, in float64) of [count, sum, sum of
    squares] combines them, so ranks may hold different batch sizes. The
    allreduce's gradient is the Sum of the upstream gradients, so gradients
    are those of the global-batch statistics.

    Args:
        x: a float tensor.
        reduction_axes: the axes to reduce (all but the channel axes).
        keepdims: keep the reduced axes with length 1.
        mask: optional weights of shape `x.shape[:-1]` (a Keras mask): positions
            where it is 0 do not count.
        name: the collective's name (None: derived from the op name in graphs).

    Returns:
        (mean, variance), in the dtype of `x`.

    Raises:
        ValueError: tfring is not initialized.

    Example:
        >>> mean, var = global_moments(x, [0, 1, 2])
    """
    in_dtype = x.dtype
    work = tf.float32 if in_dtype in (tf.float16, tf.bfloat16) else in_dtype
    x = tf.cast(x, work)
    axes = list(reduction_axes)
    if mask is None:
        weights = None
        local_sum = tf.reduce_sum(x, axes, keepdims=True)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), work)
        count = tf.ones_like(local_sum) * count
    else:
        weights = tf.cast(mask, work)
        weights = tf.broadcast_to(tf.expand_dims(weights, -1), tf.shape(x))
        local_sum = tf.reduce_sum(x * weights, axes, keepdims=True)
        count = tf.reduce_sum(weights, axes, keepdims=True)
    local_mean = tf.math.divide_no_nan(local_sum, count)
    deviation = x - local_mean
    if weights is not None:
        deviation = deviation * weights
    # Corrected two-pass statistics: the residual sum of deviations repairs
    # the rounding of the working-precision mean (large offsets, small spread).
    residual = tf.reduce_sum(deviation, axes, keepdims=True)
    local_m2 = tf.reduce_sum(deviation * (x - local_mean), axes, keepdims=True)

    # Combine in float64 as [count, sum, sum of squares]: each rank's exact
    # mean m and squared deviations M2 give sum = n m and sum of squares =
    # M2 + n m^2, free of the cancellation of a float32 E[x^2] - E[x]^2.
    n = tf.cast(count, tf.float64)
    residual = tf.cast(residual, tf.float64)
    mean64 = tf.cast(local_mean, tf.float64) + tf.math.divide_no_nan(residual, n)
    m2 = tf.cast(local_m2, tf.float64) - tf.math.divide_no_nan(tf.square(residual), n)
    s1 = n * mean64
    s2 = m2 + n * tf.square(mean64)
    if basics.size() > 1:
        n, s1, s2 = mpi_ops.grouped_allreduce([n, s1, s2], op=mpi_ops.Sum, name=name)
    mean = tf.math.divide_no_nan(s1, n)
    variance = tf.maximum(tf.math.divide_no_nan(s2, n) - tf.square(mean), 0.0)
    if not keepdims:
        mean = tf.squeeze(mean, axes)
        variance = tf.squeeze(variance, axes)
    return tf.cast(mean, in_dtype), tf.cast(variance, in_dtype)


def _collective_name(layer):
    # Graphs key the collective by its (unique) op name; eager ops have none.
    if tf.executing_eagerly():
        return "SyncBatchNormalization_" + re.sub("[^a-zA-Z0-9_]", "_", layer.name)
    return None


_DOC = """Batch normalization over the global batch of all ranks.

    In training mode the mean and variance are those of the concatenation of
    every rank's batch (ranks may hold different batch sizes), and the moving
    statistics are updated with them, so they agree across ranks. Gradients
    flow through the cross-rank statistics. Inference mode uses the moving
    statistics and communicates nothing. Every rank must call the layer in
    training mode the same number of times in the same order.

    Args:
        fused: False, as Horovod's tests and Keras 2 scripts pass it; taken
            on Keras 3 too (which has no fused batch norm) and ignored there.
            A fused kernel cannot be synchronized: True or None is an error.
        **kwargs: the arguments of tf.keras.layers.BatchNormalization (axis,
            momentum, epsilon, center, scale, initializers, ...).

    Raises:
        ValueError: fused is True or None.

    Example:
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
        ...                           SyncBatchNormalization()])
    """


def _define(keras):
    base = keras.layers.BatchNormalization
    # Keras 3: _moments(inputs, mask); tf_keras: _moments(inputs, reduction_axes, keep_dims, mask)
    moments_args = inspect.signature(base._moments).parameters  # pylint: disable=protected-access
    keras3 = "reduction_axes" not in moments_args

    def check_fused(fused):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")

    if keras3:
        class SyncBatchNormalization(base):
            __doc__ = _DOC

            def __init__(self, fused=False, **kwargs):
                check_fused(fused)
                super().__init__(**kwargs)
                # Where tfring may not use XLA (TFRING_XLA=0, or no XLA
                # kernels), this makes Keras's jit_compile="auto" (and True)
                # leave the model's steps un-XLA'd.
                self.supports_jit = basics._why_no_xla() is None

            def _moments(self, inputs, mask):
                return global_moments(inputs, self._reduction_axes, keepdims=False, mask=mask,
                                      name=_collective_name(self))
    else:
        class SyncBatchNormalization(base):
            __doc__ = _DOC

            def __init__(self, fused=False, **kwargs):
                check_fused(fused)
                super().__init__(fused=False, **kwargs)

            def _moments(self, inputs, reduction_axes, keep_dims, mask=None):
                return global_moments(inputs, reduction_axes, keepdims=keep_dims, mask=mask,
                                      name=_collective_name(self))

    SyncBatchNormalization.__module__ = __name__
    SyncBatchNormalization.__qualname__ = "SyncBatchNormalization"
    return keras.utils.register_keras_serializable(package="tfring")(SyncBatchNormalization)


# Defined (and registered) when this module is imported, so that importing it
# is enough for keras.models.load_model to find the layer. `import tfring.keras`
# alone does not import it.
SyncBatchNormalization = _define(tf.keras)
