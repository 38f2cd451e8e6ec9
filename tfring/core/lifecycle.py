"""init(), shutdown() and the topology of tfring.core, over the neutral
module. The choice of controller (MPI or TCP, from the environment that
tfringrun sets) and the exit hook are tfring.common.startup's, shared with
the TensorFlow binding."""
from tfring.common import startup
from tfring.core import _module, errors, names


def _core():
    return _module.load()


_lifecycle = startup.Lifecycle(_core, _module.loaded, errors.raise_for_status)


def _require_init():
    """The core module, once collectives can be submitted.

    Raises:
        NotInitializedError: init() was never called.
        CoreError: the job has stopped (the subclass for the core's status).
    """
    core = _core()
    code, message, cause, rank = core.check_initialized()
    if code != errors.OK:
        if core.check_topology_known()[0] != errors.OK:
            raise errors.NotInitializedError(message, code, cause, rank)
        errors.raise_for_status(code, message, cause, rank)
    return core


def init(comm=None):
    """Starts tfring on this process (builds the core module first if this
    is its first use: about two minutes, once per source change).

    The controller comes from the environment, as for tfring.tensorflow:
    MPI under ``tfringrun``, the TCP transport under ``tfringrun --tcp`` (or
    with ``TFRING_CONTROLLER=tcp`` / ``TFRING_RENDEZVOUS_ADDR``). A process
    started alone is a job of one rank.

    Args:
        comm: MPI only: None (every process launched together), an mpi4py
            communicator, or a list of MPI_COMM_WORLD ranks.

    Raises:
        ValueError: a bad controller or rendezvous variable; ``comm`` under TCP.
        CoreError: the start-up failed (PreconditionError: MPI cannot be
            used; AbortedError/UnknownError: the TCP start-up failed).
        ImportError: the core module could not be built or loaded.

    Example:
        >>> import tfring.core as hvd
        >>> hvd.init()
        >>> hvd.rank(), hvd.size()
    """
    _lifecycle.start(comm)
    names.forget()


def shutdown():
    """Stops tfring on this process: other ranks' pending collectives fail
    with an error naming this rank. Safe to call twice; init() may follow.

    Example:
        >>> hvd.shutdown()
    """
    if _module.loaded():
        errors.raise_for_status(*_core().shutdown())


def is_initialized():
    """True while collectives can run (False before init() and after
    shutdown(), without building or loading anything)."""
    return _module.loaded() and _core().is_initialized()


def _not_initialized(code, message, cause, rank):
    raise errors.NotInitializedError(message, code, cause, rank)


def _topology(fn):
    return _lifecycle.topology(fn, _not_initialized)


@_topology
def rank():
    """This process's rank in the job (0..size()-1).

    Raises:
        NotInitializedError: before init() (stays valid after shutdown()).
    """


@_topology
def size():
    """Number of ranks in the job. Raises NotInitializedError before init()."""


@_topology
def local_rank():
    """This process's rank among the ranks on its host."""


@_topology
def local_size():
    """Number of ranks on this process's host."""


@_topology
def cross_rank():
    """Rank among the processes that share this process's local_rank."""


@_topology
def cross_size():
    """Number of processes that share this process's local_rank."""


def mpi_built():
    """Whether the core module has the MPI controller (TFRING_WITH_MPI=1)."""
    return bool(_core().mpi_built())


def nccl_built():
    """Whether the core module was built with NCCL (TFRING_WITH_NCCL=1)."""
    return bool(_core().nccl_built)


def host_staging_copies():
    """How many copies host staging has made between a GPU and host memory in
    this process so far: 0 while every GPU collective ran on its GPU (NCCL).

    Returns:
        int: the count (0 in a CPU build).

    Example:
        >>> before = hvd.host_staging_copies()
        >>> y = hvd.allreduce(cupy_array)
        >>> hvd.host_staging_copies() == before   # NCCL: nothing left the GPU
        True
    """
    return int(_core().host_staging_copies())


def gpu_built():
    """Whether GPU support is installed in the loaded core module: GPU arrays
    are accepted only then."""
    return bool(_core().gpu_built())
