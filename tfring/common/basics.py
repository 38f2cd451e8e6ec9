"""Lifecycle and topology: init(), shutdown(), rank(), size() and friends.

Every function here is shared by tfring.tensorflow and tfring.keras. Errors
from the core come back as (code, message, cause, rank) and are raised as
the ``tf.errors`` type Horovod users expect, with ``.cause`` and ``.rank``
(tfring.common.tf_errors).
"""
import os

from tfring.common import loader, startup
from tfring.common import process_sets as process_set_registry
# The core's handle and statuses, under the names the bindings use (basics._core,
# basics.raise_for_status, ...).
from tfring.common.status import (_PRECONDITION, _check, _core, _require_init,  # noqa: F401
                                  raise_for_status)
# Which controller init() starts; here under the name the TF binding always had.
from tfring.common.startup import configured_controller  # noqa: F401

_lifecycle = startup.Lifecycle(_core, lambda: loader._loaded is not None, raise_for_status)


def init(comm=None, process_sets=None):
    """Starts tfring on this process.

    The controller comes from the environment (see
    :func:`configured_controller`): MPI, or tfring's TCP transport, which
    never imports mpi4py nor initialises MPI and finds the other ranks
    through the rendezvous store at ``TFRING_RENDEZVOUS_ADDR``:
    ``TFRING_RENDEZVOUS_PORT``. A process with ``TFRING_RENDEZVOUS_SERVE=1``
    starts that store itself first.

    Args:
        comm: MPI only. None for every process launched together
            (MPI_COMM_WORLD), an mpi4py communicator, or a list of
            MPI_COMM_WORLD ranks.
        process_sets: optional list of ProcessSet to register on every rank,
            or "dynamic" (accepted for Horovod compatibility; sets can always
            be added later with add_process_set()).

    Raises:
        ValueError: `comm` names ranks that do not exist or exclude this one;
            `comm` given under the TCP controller; a bad controller or
            rendezvous variable.
        tf.errors.FailedPreconditionError: MPI cannot be used; the library
            has no TCP controller; the store cannot be served.
        tf.errors.AbortedError, tf.errors.UnknownError: the TCP start-up
            failed (the message names the cause).

    Example:
        >>> import tfring.tensorflow as hvd
        >>> hvd.init()
        >>> print(hvd.rank(), hvd.size())
    """
    _lifecycle.start(comm)
    if process_sets and process_sets != "dynamic":
        for ps in process_sets:
            process_set_registry.add_process_set(ps)


def shutdown():
    """Stops tfring on this process; collectives of other ranks then fail with an
    error naming this rank. Safe to call twice; init() may be called again after.

    Example:
        >>> hvd.shutdown()
    """
    if loader._loaded is None:
        return
    _check(_core().shutdown())


def is_initialized():
    """True while collectives can run."""
    return loader._loaded is not None and _core().is_initialized()


# Topology stays valid after the job stopped, for error handlers.
_topology = _lifecycle.topology


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


def _speculation_stats():
    """This rank's counters for the global set's speculation since init():
    times it entered speculative mode, responses run without negotiation,
    fallbacks (a rank diverged), failures (the data plane failed, which ends
    speculation so that a negotiation finds a lost peer), and ``inline``:
    responses run by the thread that submitted a tensor rather than the
    background thread (TFRING_SPECULATION_INLINE). For tests and benchmarks."""
    _require_init()
    return dict(_core().speculation_stats())


def _queued_collectives():
    """How many collectives this rank has submitted that have not started
    running: they wait for the other ranks (or the next cycle). For tests,
    which wait for it to know a collective is in flight instead of sleeping
    long enough."""
    _require_init()
    return int(_core().queued_collectives())


def mpi_threads_supported():
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    _require_init()
    return _core().mpi_threads_supported()


def _active_controller():
    return _lifecycle.active_controller()


def mpi_enabled():
    """Whether MPI is this job's controller.

    Returns:
        True when init() started MPI (before init(): when it would).

    Raises:
        ValueError: TFRING_CONTROLLER names no controller.

    Example:
        >>> hvd.mpi_enabled()  # under tfringrun --tcp
        False
    """
    return _active_controller() == "mpi"


def mpi_built():
    """Whether the library was built with MPI (a ``TFRING_WITH_MPI=0`` build
    has only the TCP controller).

    Returns:
        True or False, from the library's own record.

    Raises:
        ImportError: the library cannot be loaded.

    Example:
        >>> hvd.mpi_built()
        True
    """
    return bool(_core().mpi_built())


def gloo_enabled():
    """Whether tfring's TCP transport, its counterpart of Horovod's Gloo, is
    this job's controller (``tfringrun --tcp`` or ``--gloo``).

    Returns:
        True when init() started the TCP controller (before init(): when it
        would).

    Raises:
        ValueError: TFRING_CONTROLLER names no controller.

    Example:
        >>> hvd.gloo_enabled()  # under tfringrun --gloo
        True
    """
    return _active_controller() == "tcp"


def gloo_built():
    """Whether the Gloo-style controller is built: tfring's TCP transport,
    which every build of this source has (the library's TCP entry point
    is what is checked, so an older library says False).

    Returns:
        True when the loaded library has the TCP controller.

    Raises:
        ImportError: the library cannot be loaded.

    Example:
        >>> hvd.gloo_built()
        True
    """
    return hasattr(_core(), "init_tcp")


def tcp_built():
    """Same as :func:`gloo_built`, under tfring's own name (tfringrun
    --check-build lists it)."""
    return gloo_built()


def nccl_built():
    """True when the library was built with NCCL (needs CUDA and NCCL headers at build time)."""
    return bool(_core().nccl_built)


def cuda_built():
    """True when the library was built with CUDA, which tfring uses only for NCCL."""
    return nccl_built()


def xla_built():
    """True when tfring's collectives have XLA kernels in this build, so a
    ``tf.function(jit_compile=True)`` and Keras's XLA train step can run
    them. The TensorFlow wheel's headers decide at build time (TF2XLA's op
    registry, XLA's builder and typed FFI API).

    Returns:
        True or False, from the library itself.

    Example:
        >>> hvd.xla_built()
        True
    """
    xla_kernels = getattr(_core(), "xla_kernels", None)
    return bool(xla_kernels and xla_kernels())


def xla_enabled():
    """True when tfring.keras lets XLA compile the train step of a model with
    a DistributedOptimizer: :func:`xla_built` and ``TFRING_XLA`` (alias
    ``HOROVOD_XLA``) is not 0. Read from the environment on each call, with
    the core's other settings."""
    xla_enabled_ = getattr(_core(), "xla_enabled", None)
    return bool(xla_enabled_ and xla_enabled_())


def _why_no_xla():
    """Why tfring's collectives may not run inside XLA in this process (a
    sentence), or None when they may."""
    if not xla_built():
        return ("tfring's collectives have no XLA kernels in this build (its TensorFlow "
                "lacked XLA's headers)")
    if not xla_enabled():
        return "TFRING_XLA=0 keeps tfring's collectives out of XLA"
    return None


def rocm_built():
    """False: tfring has no ROCm build."""
    return False


def ccl_built():
    """False: tfring has no oneCCL data plane."""
    return False


def ddl_built():
    """False: tfring has no IBM DDL data plane."""
    return False
