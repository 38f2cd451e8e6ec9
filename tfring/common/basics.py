"""Lifecycle and topology: init(), shutdown(), rank(), size() and friends.

Every function here is shared by tfring.tensorflow and tfring.keras. Errors
from the core come back as (code, message) and are raised as the
``tf.errors`` type Horovod users expect.
"""
import atexit
import os
import sys
import threading

from tfring.common import loader

# Core status codes (tf_ops/common/status.h).
_OK, _UNKNOWN, _PRECONDITION, _ABORTED, _INVALID_ARGUMENT = 0, 1, 2, 3, 4

_atexit_registered = False
_init_lock = threading.Lock()
# Set by our excepthook: what the other ranks are told when this one dies of
# an uncaught exception.
_exit_reason = ""


def _core():
    return loader.load()[1]


def raise_for_status(code, message):
    """Raises the tf.errors exception for a core status code (no-op for OK)."""
    if code == _OK:
        return
    import tensorflow as tf
    cls = {
        _PRECONDITION: tf.errors.FailedPreconditionError,
        _ABORTED: tf.errors.AbortedError,
        _INVALID_ARGUMENT: tf.errors.InvalidArgumentError,
    }.get(code, tf.errors.UnknownError)
    raise cls(None, None, message)


def _check(result):
    raise_for_status(result[0], result[1])
    return result[2:] if len(result) > 2 else None


def _comm_handle(comm):
    """Turns init()'s `comm` argument into an MPI Fortran handle."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if comm is None:
        return world.py2f()
    if isinstance(comm, MPI.Comm):
        return comm.py2f()
    ranks = list(comm)
    if not all(isinstance(r, int) and 0 <= r < world.Get_size() for r in ranks):
        raise ValueError(
            f"init(comm=...) got ranks {ranks}; they must be integers in "
            f"[0, {world.Get_size()}).")
    # Comm.Split is collective over COMM_WORLD: every process takes part, and
    # the ones outside `ranks` get no communicator.
    member = world.Get_rank() in ranks
    sub = world.Split(0 if member else MPI.UNDEFINED, ranks.index(world.Get_rank()) if member else 0)
    if not member:
        raise ValueError(
            f"init(comm={ranks}) was called on MPI rank {world.Get_rank()}, which is not in that "
            "list; only the listed ranks can take part in the job.")
    return sub.py2f()


def init(comm=None, process_sets=None):
    """Starts tfring on this process.

    Args:
        comm: None for every process launched together (MPI_COMM_WORLD), an
            mpi4py communicator, or a list of MPI_COMM_WORLD ranks.
        process_sets: optional list of ProcessSet to register on every rank,
            or "dynamic" (accepted for Horovod compatibility; sets can always
            be added later with add_process_set()).

    Raises:
        ValueError: `comm` names ranks that do not exist or exclude this one.
        tf.errors.FailedPreconditionError: MPI cannot be used.

    Example:
        >>> import tfring.tensorflow as hvd
        >>> hvd.init()
        >>> print(hvd.rank(), hvd.size())
    """
    global _atexit_registered
    with _init_lock:
        handle = _comm_handle(comm)
        _check(_core().init(handle))
        if not _atexit_registered:
            # Registered after mpi4py's own hook, so it runs first: the
            # background thread is gone before MPI is finalised.
            atexit.register(_shutdown_at_exit)
            _install_excepthook()
            _atexit_registered = True
    if process_sets and process_sets != "dynamic":
        from tfring.common import process_sets as ps_module
        for ps in process_sets:
            ps_module.add_process_set(ps)


def shutdown():
    """Stops tfring on this process; collectives of other ranks then fail with an
    error naming this rank. Safe to call twice; init() may be called again after.

    Example:
        >>> hvd.shutdown()
    """
    if loader._loaded is None:
        return
    _check(_core().shutdown())


def _install_excepthook():
    previous = sys.excepthook

    def record_and_report(exc_type, exc, tb):
        global _exit_reason
        _exit_reason = f"died of an uncaught {exc_type.__name__}: {exc}"[:400]
        previous(exc_type, exc, tb)
    sys.excepthook = record_and_report


def _shutdown_at_exit():
    if loader._loaded is None:
        return
    core = _core()
    core.shutdown(_exit_reason or "finished its script (without calling shutdown())")
    if core.communication_broken():
        # A peer is gone: MPI_Finalize could wait for it forever. Skip it.
        # Linger a moment first: the other survivors check their peers every
        # 0.2 s, and should name the rank that died first, not this one.
        import time
        time.sleep(0.5)
        try:
            import mpi4py
            mpi4py.rc.finalize = False
            from mpi4py import MPI  # noqa: F401
        except ImportError:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def is_initialized():
    """True while collectives can run."""
    return loader._loaded is not None and _core().is_initialized()


def _require_init():
    _check(_core().check_initialized())


def _topology(fn):
    def query():
        # Topology stays valid after the job stopped, for error handlers.
        _check(_core().check_topology_known())
        return getattr(_core(), fn.__name__)()
    query.__name__ = fn.__name__
    query.__doc__ = fn.__doc__
    return query


@_topology
def rank():
    """This process's rank in the job (0..size()-1). Raises before init()."""


@_topology
def size():
    """Number of ranks in the job."""


@_topology
def local_rank():
    """This process's rank among the ranks on its host."""


@_topology
def local_size():
    """Number of ranks on this process's host."""


@_topology
def cross_rank():
    """Rank among the processes that share this process's local_rank (one per host)."""


@_topology
def cross_size():
    """Number of processes that share this process's local_rank."""


@_topology
def is_homogeneous():
    """True when every host runs the same number of ranks."""


def start_timeline(file_path, mark_cycles=False):
    """Starts recording a timeline (Chrome trace JSON; open it in Perfetto).

    Every rank may call it; rank 0 writes the file. TFRING_TIMELINE=path does
    the same from the start of the job.

    Args:
        file_path: where rank 0 writes the trace.
        mark_cycles: also mark each negotiation cycle.

    Raises:
        tf.errors.FailedPreconditionError: before init().
        tf.errors.InvalidArgumentError: the file cannot be opened.

    Example:
        >>> hvd.start_timeline("/tmp/timeline.json")
    """
    _check(_core().start_timeline(os.path.abspath(file_path), bool(mark_cycles)))


def stop_timeline():
    """Stops recording and closes the timeline file, leaving valid JSON."""
    _core().stop_timeline()


def _runtime_params():
    """The tunable values in force on this rank (fusion threshold, cycle time,
    shm cut-over) and, on rank 0 under autotune, whether the search ended."""
    _require_init()
    return dict(_core().runtime_params())


def mpi_threads_supported():
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    _require_init()
    return _core().mpi_threads_supported()


def mpi_enabled():
    """True: MPI is tfring's controller and data plane today."""
    return True


def mpi_built():
    """True: the library is always built against MPI."""
    return True


def gloo_enabled():
    """False: tfring has no Gloo controller."""
    return False


def gloo_built():
    """False: tfring has no Gloo controller."""
    return False


def nccl_built():
    """True when the library was built with NCCL (needs CUDA and NCCL headers at build time)."""
    return bool(_core().nccl_built)


def cuda_built():
    """True when the library was built with CUDA, which tfring uses only for NCCL."""
    return nccl_built()


def rocm_built():
    """False: tfring has no ROCm build."""
    return False


def ccl_built():
    """False: tfring has no oneCCL data plane."""
    return False


def ddl_built():
    """False: tfring has no IBM DDL data plane."""
    return False
