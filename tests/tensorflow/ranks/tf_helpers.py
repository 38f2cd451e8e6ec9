"""Helpers for the rank suites: running ops in each mode, rank-dependent data."""
import contextlib

import numpy as np
import tensorflow as tf
from support import xla_kernels_expected

MODES = ["eager", "function", "graph"]
# For the collectives that run inside XLA (tf.function(jit_compile=True)),
# where this TensorFlow gives them XLA kernels.
XLA = xla_kernels_expected(tf.__version__)
MODES_WITH_XLA = MODES + (["xla"] if XLA else [])


def run(mode, build):
    """Builds ops with `build()` and evaluates them eagerly, in a tf.function,
    in a tf.function(jit_compile=True) or in a TF1 graph with a Session;
    returns numpy values."""
    if mode == "eager":
        return tf.nest.map_structure(lambda t: t.numpy(), build())
    if mode in ("function", "xla"):
        return tf.nest.map_structure(lambda t: t.numpy(),
                                     tf.function(build, jit_compile=mode == "xla")())
    with tf.Graph().as_default():
        out = build()
        with tf.compat.v1.Session() as sess:
            return sess.run(out)


@contextlib.contextmanager
def tf1_graph(resource_variables=True):
    """A fresh TF1 graph to build in. With resource_variables=False,
    tf.compat.v1.Variable and get_variable make reference variables
    (RefVariable) in it, as TF1 code did; the process-wide setting is put
    back afterwards, since every test of the suite runs in this process."""
    enabled = tf.compat.v1.resource_variables_enabled()
    if not resource_variables:
        tf.compat.v1.disable_resource_variables()
    try:
        with tf.Graph().as_default() as graph:
            yield graph
    finally:
        if enabled:
            tf.compat.v1.enable_resource_variables()
        else:
            tf.compat.v1.disable_resource_variables()


DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
          tf.float32, tf.float64]


def rank_values(r, shape=(3, 4)):
    """Small positive integers that differ by rank, exact in every dtype (even
    the product over 3 ranks fits in int8)."""
    return 1 + (np.arange(int(np.prod(shape))).reshape(shape) + r) % 3


def assert_close(actual, expected, dtype, what=""):
    actual = np.asarray(actual, dtype=np.float64) if dtype != tf.bool else np.asarray(actual)
    tol = {tf.float16: 1e-2, tf.bfloat16: 3e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(actual, np.asarray(expected, dtype=actual.dtype), rtol=tol,
                               atol=tol, err_msg=f"{what} {dtype.name}")
