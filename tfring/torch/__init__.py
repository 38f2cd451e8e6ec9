"""Horovod's PyTorch API (``horovod.torch``) on tfring: change
``import horovod.torch as hvd`` to ``import tfring.torch as hvd``.

Pure Python over tfring.core (no torch extension to build): CPU and CUDA
tensors go to the same C++ core as tfring.tensorflow's. Launch with
``tfringrun -np N python train.py`` (MPI) or ``tfringrun --tcp``.

Example:
    >>> import torch, tfring.torch as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(4, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    >>> opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    >>> hvd.broadcast_optimizer_state(opt, root_rank=0)
"""
from tfring.core import (ProcessSet, add_process_set, cross_rank, cross_size,  # noqa: F401
                         global_process_set, is_initialized, local_rank, local_size, mpi_built,
                         nccl_built, rank, remove_process_set, shutdown, size)
from tfring.torch.compression import Compression  # noqa: F401
from tfring.torch.differentiable import (allgather, allreduce, alltoall, broadcast,  # noqa: F401
                                         grouped_allgather, grouped_allreduce,
                                         grouped_reducescatter, reducescatter)
from tfring.torch.errors import (HorovodInternalError, HostsUpdatedInterrupt,  # noqa: F401
                                 PreconditionError)
from tfring.torch.functions import (allgather_object, broadcast_object,  # noqa: F401
                                    broadcast_optimizer_state, broadcast_parameters)
from tfring.torch.lifecycle import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, init,  # noqa: F401
                                    is_homogeneous, mpi_enabled, mpi_threads_supported,
                                    rocm_built, start_timeline, stop_timeline)
from tfring.torch.mpi_ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                                  allgather_async, allreduce_, allreduce_async,
                                  allreduce_async_, alltoall_async, barrier, broadcast_,
                                  broadcast_async, broadcast_async_, grouped_allgather_async,
                                  grouped_allreduce_, grouped_allreduce_async,
                                  grouped_allreduce_async_, grouped_reducescatter_async, join,
                                  poll, reducescatter_async, sparse_allreduce_async,
                                  synchronize)
from tfring.torch.optimizer import DistributedOptimizer  # noqa: F401
from tfring.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from tfring.torch import elastic  # noqa: F401,E402
