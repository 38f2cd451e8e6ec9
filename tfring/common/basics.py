"""Lifecycle and topology: init(), shutdown(), rank(), size() and friends.

Every function here is shared by tfring.tensorflow and tfring.keras. Errors
from the core come back as (code, message, cause, rank) and are raised as
the ``tf.errors`` type Horovod users expect, with ``.cause`` and ``.rank``
(tfring.common.tf_errors).
"""
import atexit
import os
import sys
import threading

from tfring._store import rendezvous
from tfring.common import elastic, loader
from tfring.common import process_sets as process_set_registry
# The core's handle and statuses, under the names the bindings use (basics._core,
# basics.raise_for_status, ...).
from tfring.common.status import (_PRECONDITION, CAUSE_INVALID_ARGUMENT, _check, _core,
                                  _require_init, raise_for_status)

_atexit_registered = False
_init_lock = threading.Lock()
# The controller the last successful init() started ("mpi" or "tcp").
_controller_in_use = None
# The rendezvous store this process serves (TFRING_RENDEZVOUS_SERVE=1).
_rendezvous_server = None
_CONTROLLERS = {"mpi": "mpi", "tcp": "tcp", "gloo": "tcp"}
_TRUE = ("1", "true", "yes", "on")
# Set by our excepthook: what the other ranks are told when this one dies of
# an uncaught exception.
_exit_reason = ""


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


def configured_controller(env=None):
    """The controller init() starts, from the environment.

    ``TFRING_CONTROLLER`` (alias ``HOROVOD_CONTROLLER``) names it: ``mpi``, or
    ``tcp`` (``gloo``, Horovod's name, means tcp). Unset, it is tcp when
    ``TFRING_RENDEZVOUS_ADDR`` is set (ranks started by Ray, Spark or
    Kubernetes point at a store that way), else mpi. tfringrun sets it.

    Args:
        env: the environment to read (default: os.environ).

    Returns:
        "mpi" or "tcp".

    Raises:
        ValueError: the variable names another controller.

    Example:
        >>> configured_controller({"HOROVOD_CONTROLLER": "gloo"})
        'tcp'
    """
    env = os.environ if env is None else env
    for name in ("TFRING_CONTROLLER", "HOROVOD_CONTROLLER"):
        value = env.get(name, "").strip().lower()
        if value:
            if value not in _CONTROLLERS:
                raise ValueError(f"{name}={env[name]!r} names no controller tfring has; use "
                                 "mpi or tcp (gloo means tcp).")
            return _CONTROLLERS[value]
    return "tcp" if env.get("TFRING_RENDEZVOUS_ADDR") else "mpi"


def _serve_rendezvous_if_asked(env=None):
    """Starts the job's rendezvous store in this process when
    ``TFRING_RENDEZVOUS_SERVE`` is true, at ``TFRING_RENDEZVOUS_ADDR``'s port
    ``TFRING_RENDEZVOUS_PORT`` (fixed: the other ranks already know it), with
    ``TFRING_SECRET``. It binds to ``TFRING_BIND_HOST`` when set, to loopback
    when the address is a loopback one, else to every interface, and serves
    until the process exits (a re-init finds it still there)."""
    global _rendezvous_server
    env = os.environ if env is None else env
    if env.get("TFRING_RENDEZVOUS_SERVE", "").strip().lower() not in _TRUE:
        return
    if _rendezvous_server is not None:
        return
    addr = env.get("TFRING_RENDEZVOUS_ADDR", "").strip()
    port_text = env.get("TFRING_RENDEZVOUS_PORT", "").strip()
    if not addr or not port_text:
        raise ValueError("TFRING_RENDEZVOUS_SERVE=1 needs TFRING_RENDEZVOUS_ADDR and "
                         "TFRING_RENDEZVOUS_PORT: the address the other ranks reach the "
                         "store at.")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"TFRING_RENDEZVOUS_PORT={port_text!r} is not a port (1-65535); "
                         "a served store needs the fixed port the other ranks know.")
    bind = env.get("TFRING_BIND_HOST", "").strip() or (
        "127.0.0.1" if _is_loopback(addr) else "0.0.0.0")
    try:
        _rendezvous_server = rendezvous.start_server(bind, int(port_text))
    except OSError as e:
        raise_for_status(_PRECONDITION, f"TFRING_RENDEZVOUS_SERVE=1: cannot serve the "
                                        f"rendezvous store on {bind}:{port_text}: "
                                        f"{e.strerror or e}", CAUSE_INVALID_ARGUMENT)


def _is_loopback(host):
    import ipaddress
    import socket
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


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
    global _atexit_registered, _controller_in_use
    with _init_lock:
        controller = configured_controller()
        if controller != "tcp" and os.environ.get("TFRING_ELASTIC", "").lower() in _TRUE:
            raise ValueError("elastic training (TFRING_ELASTIC=1) runs over the TCP "
                             "controller only: MPI cannot lose a rank.")
        if controller == "tcp":
            if comm is not None:
                raise ValueError(
                    "init(comm=...) needs MPI, but the controller is tcp (TFRING_CONTROLLER, "
                    "HOROVOD_CONTROLLER=gloo or TFRING_RENDEZVOUS_ADDR). Under tcp the job "
                    "is every rank that registered with the rendezvous store; use process "
                    "sets (hvd.add_process_set) for a subset of ranks.")
            core = _core()
            if not hasattr(core, "init_tcp"):
                raise_for_status(_PRECONDITION, "this tfring library has no TCP controller "
                                                "(no init_tcp): rebuild it from this source.",
                                 CAUSE_INVALID_ARGUMENT)
            _serve_rendezvous_if_asked()
            if elastic.enabled() and not core.is_initialized():
                # The driver's round decides this worker's rank, size and
                # store scope (see tfring.common.elastic).
                elastic.join_round()
            _check(core.init_tcp())
        else:
            handle = _comm_handle(comm)
            _check(_core().init(handle))
        _controller_in_use = controller
        if not _atexit_registered:
            # Registered after mpi4py's own hook (MPI), so it runs first: the
            # background thread is gone before MPI is finalised.
            atexit.register(_shutdown_at_exit)
            _install_excepthook()
            _atexit_registered = True
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
    broken = core.communication_broken()
    if _rendezvous_server is not None and not broken:
        _rendezvous_server.stop()
    if broken:
        # A peer is gone: MPI_Finalize could wait for it forever. Skip it.
        # Linger a moment first: the other survivors check their peers every
        # 0.2 s, and should name the rank that died first, not this one.
        import time
        time.sleep(0.5)
        if _controller_in_use == "mpi":
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


def _speculation_stats():
    """This rank's counters for the global set's speculation since init():
    times it entered speculative mode, responses run without negotiation,
    fallbacks (a rank diverged), failures (the data plane failed, which ends
    speculation so that a negotiation finds a lost peer), and ``inline``:
    responses run by the thread that submitted a tensor rather than the
    background thread (TFRING_SPECULATION_INLINE). For tests and benchmarks."""
    _require_init()
    return dict(_core().speculation_stats())


def mpi_threads_supported():
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    _require_init()
    return _core().mpi_threads_supported()


def _active_controller():
    return _controller_in_use if _controller_in_use is not None else configured_controller()


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


def rocm_built():
    """False: tfring has no ROCm build."""
    return False


def ccl_built():
    """False: tfring has no oneCCL data plane."""
    return False


def ddl_built():
    """False: tfring has no IBM DDL data plane."""
    return False
