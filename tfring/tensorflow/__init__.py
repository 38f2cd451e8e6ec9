"""tfring for TensorFlow: a drop-in for ``horovod.tensorflow``.

Example:
    >>> import tfring.tensorflow as hvd
    >>> hvd.init()
    >>> total = hvd.allreduce(tf.constant(1.0), op=hvd.Sum)
"""
from tfring.common.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                  gloo_built, gloo_enabled, init, is_homogeneous, is_initialized,
                                  local_rank, local_size, mpi_built, mpi_enabled,
                                  mpi_threads_supported, nccl_built, rank, start_timeline,
                                  stop_timeline, rocm_built, shutdown, size)
from tfring.common.process_sets import (ProcessSet, add_process_set, global_process_set,
                                        remove_process_set)
from tfring.tensorflow.compression import Compression
from tfring.tensorflow.functions import (BroadcastGlobalVariablesHook, allgather_object,
                                         broadcast_global_variables, broadcast_object,
                                         broadcast_object_fn, broadcast_variables)
from tfring.tensorflow.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather,
                                       allreduce, alltoall, barrier, broadcast, broadcast_,
                                       grouped_allgather, grouped_allreduce, grouped_reducescatter,
                                       join, local_rank_op, local_size_op, process_set_included_op,
                                       rank_op, reducescatter, size_op)
# Registers the collectives' gradients with TensorFlow.
from tfring.tensorflow import gradients as _gradients  # noqa: F401
from tfring.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from tfring.tensorflow.optimizer import DistributedOptimizer


def __getattr__(name):
    # Imported on first use: it resolves tf.keras, which plain TF code need not load.
    if name == "SyncBatchNormalization":
        from tfring.keras.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    if name == "elastic":
        import importlib
        return importlib.import_module("tfring.tensorflow.elastic")
    if name == "keras":
        # tfring.tensorflow.keras is tfring.keras (see tfring/tensorflow/keras.py).
        import importlib
        return importlib.import_module("tfring.tensorflow.keras")
    raise AttributeError(f"module 'tfring.tensorflow' has no attribute {name!r}")
