"""tfring for Keras: a drop-in for ``horovod.tensorflow.keras``.

Works with Keras 3 (``tf.keras`` in TF 2.16+) and with tf_keras (Keras 2,
``TF_USE_LEGACY_KERAS=1``): whichever ``tf.keras`` resolves to.

Example:
    >>> import tfring.keras as hvd
    >>> hvd.init()
    >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    >>> model.compile(optimizer=opt, loss="mse")
    >>> model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""
from tfring.common.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                  gloo_built, gloo_enabled, init, is_homogeneous, is_initialized,
                                  local_rank, local_size, mpi_built, mpi_enabled,
                                  mpi_threads_supported, nccl_built, rank, rocm_built,
                                  start_timeline, stop_timeline, shutdown, size)
from tfring.common.process_sets import (ProcessSet, add_process_set, global_process_set,
                                        remove_process_set)
from tfring.keras.values import (allgather, allreduce, broadcast, broadcast_global_variables,
                                 reducescatter)
from tfring.tensorflow.compression import Compression
from tfring.tensorflow.mpi_ops import Adasum, Average, Max, Min, Product, Sum, barrier, join
from tfring.keras import callbacks
from tfring.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer, load_model
from tfring.keras.sync_batch_norm import SyncBatchNormalization


def __getattr__(name):
    # Imported on first use, as horovod.tensorflow.keras.elastic is reached.
    if name == "elastic":
        import importlib
        return importlib.import_module("tfring.keras.elastic")
    raise AttributeError(f"module 'tfring.keras' has no attribute {name!r}")
