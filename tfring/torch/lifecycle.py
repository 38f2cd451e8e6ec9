"""init() and the build queries of tfring.torch; the rest of the lifecycle
(shutdown, rank, size, ...) is tfring.core's, re-exported as it is."""
import tfring.core as _core
from tfring.common import startup
from tfring.common.basics import ccl_built, ddl_built, rocm_built  # noqa: F401


def init(comm=None, process_sets=None):
    """Starts tfring on this process (MPI under ``tfringrun``, TCP under
    ``tfringrun --tcp``; a process started alone is a job of one rank).

    Args:
        comm: MPI only: None (every process launched together), an mpi4py
            communicator, or a list of MPI_COMM_WORLD ranks.
        process_sets: ProcessSets to register on every rank, or "dynamic"
            (accepted; sets can always be added later).

    Raises:
        ValueError: a bad controller or rendezvous variable; ``comm`` under
            TCP. tfring.core.CoreError: the start-up failed.

    Example:
        >>> import tfring.torch as hvd
        >>> hvd.init()
        >>> hvd.rank(), hvd.size()
    """
    _core.init(comm)
    if process_sets and process_sets != "dynamic":
        for ps in process_sets:
            _core.add_process_set(ps)


def _controller():
    return startup.configured_controller()


def mpi_enabled():
    """True when this job runs over the MPI controller."""
    return _core.is_initialized() and _controller() == "mpi"


def gloo_enabled():
    """True when this job runs over the TCP controller (Horovod's Gloo)."""
    return _core.is_initialized() and _controller() == "tcp"


def gloo_built():
    """The TCP controller, tfring's Gloo, is always built."""
    return True


def mpi_threads_supported():
    """MPI runs on tfring's background thread only, so no multi-threaded MPI
    is needed: True whenever MPI is built."""
    return _core.mpi_built()


def cuda_built():
    """Whether the core was built with GPU support."""
    return _core.gpu_built()


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    return _core.size() == _core.local_size() * _core.cross_size()


def start_timeline(file_path, mark_cycles=False):
    """Not available at run time in tfring.torch: tfring.core's module has no
    switch for the timeline. Set ``TFRING_TIMELINE=path`` (and
    ``TFRING_TIMELINE_MARK_CYCLES=1``) before the job starts instead.

    Raises:
        NotImplementedError: always.
    """
    raise NotImplementedError("tfring.torch cannot start a timeline at run time: set "
                              f"TFRING_TIMELINE={file_path} before the job starts")


def stop_timeline():
    """Nothing to stop: see :func:`start_timeline`."""
