"""tfring's collectives without a framework: numpy, CuPy, torch or any
``__cuda_array_interface__``/DLPack array in, an array of the same kind out.

``import tfring.core as hvd`` never imports TensorFlow. It drives the same
C++ core as tfring.tensorflow, built as its own module (``_tfring_core``,
compiled on first use; ``python -m tfring.build core`` builds it ahead).
Launch with ``tfringrun -np N python script.py`` (MPI) or ``--tcp``.

Example:
    >>> import numpy as np
    >>> import tfring.core as hvd
    >>> hvd.init()
    >>> total = hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum)
    >>> rows = hvd.allgather(np.arange(hvd.rank() + 1))
    >>> hvd.shutdown()
"""
from tfring.common.exceptions import HorovodInternalError  # noqa: F401
from tfring.core.errors import (AbortedError, CoreError, InvalidArgumentError,  # noqa: F401
                                NotInitializedError, PreconditionError, UnknownError)
from tfring.core.lifecycle import (cross_rank, cross_size, gpu_built,  # noqa: F401
                                   host_staging_copies, init, is_initialized, local_rank,
                                   local_size, mpi_built, nccl_built, rank, shutdown, size)
from tfring.core.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                      global_process_set, remove_process_set)
from tfring.core.handles import Handle, synchronize  # noqa: F401
from tfring.core.ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                             allgather, allgather_async, allreduce, allreduce_,
                             allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                             broadcast, broadcast_async, broadcast_async_, grouped_allgather,
                             grouped_allgather_async, grouped_allreduce, grouped_allreduce_async,
                             grouped_allreduce_async_, grouped_reducescatter,
                             grouped_reducescatter_async, join, reducescatter,
                             reducescatter_async)
