"""Starting and stopping the core, for every binding: which controller
init() starts (MPI or TCP, from the environment), the rendezvous store a
rank may serve, and what happens at interpreter exit.

No framework here: tfring.common.basics (TensorFlow) and tfring.core (no
framework) each make one :class:`Lifecycle` over their own core module and
their own error types.
"""
import atexit
import os
import sys
import threading

from tfring._store import rendezvous
from tfring.common import elastic, transports
from tfring.common.exceptions import cause_from_core

_TRUE = ("1", "true", "yes", "on")
# Core status code (tf_ops/common/status.h) of a failed precondition.
_PRECONDITION = 2
# The core's FailureCause for a bad setting (status.h).
_CAUSE_INVALID_ARGUMENT = 5
# The rendezvous store this process serves (TFRING_RENDEZVOUS_SERVE=1): one
# per process, whichever binding started it.
_rendezvous_server = None


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
        value = env.get(name, "").strip()
        if value:
            transport = transports.named(value)
            if transport is None:
                raise ValueError(f"{name}={env[name]!r} names no controller tfring has; use "
                                 f"{transports.choices()}.")
            return transport.name
    return transports.default(env).name


def _elastic_names():
    return " or ".join(t.name.upper() for t in transports.TRANSPORTS if t.elastic)


def _serve_rendezvous_if_asked(raise_for_status, env=None):
    """Starts the job's rendezvous store in this process when
    ``TFRING_RENDEZVOUS_SERVE`` is true, at ``TFRING_RENDEZVOUS_ADDR``'s port
    ``TFRING_RENDEZVOUS_PORT`` (fixed: the other ranks already know it), with
    ``TFRING_SECRET``. It binds to ``TFRING_BIND_HOST`` when set, to loopback
    when the address is a loopback one, else to every interface, and serves
    until the process exits (a re-init finds it still there). A store that
    cannot be served is reported through ``raise_for_status``."""
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
                                        f"{e.strerror or e}", _CAUSE_INVALID_ARGUMENT)


def _is_loopback(host):
    import ipaddress
    import socket
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def _start_in_a_round(init):
    """Starts the core in the driver's newest round that includes this
    worker, which decides its rank, size and store scope (see
    tfring.common.elastic). A start-up that a lost peer broke is tried again
    in the round the driver has replaced it with by then (the driver closes
    a replaced round's store scope, so its start-up fails at once); the
    result of the last try is returned."""
    while True:
        elastic.join_round()
        result = init()  # (code, message, cause, rank)
        if (result[0] == 0 or not cause_from_core(result[2]).ends_job
                or not elastic.round_replaced()):
            return result


class Lifecycle:
    """init() and the exit hook of one binding.

    Args:
        core: callable returning the loaded core module (loading it if
            needed): the functions of tf_ops/python_lifecycle.cc.
        loaded: callable saying whether the core module is loaded (the exit
            hook does nothing when it never was).
        raise_for_status: callable(code, message, cause, rank) raising the binding's
            exception for a core status code (no-op for 0).
    """

    def __init__(self, core, loaded, raise_for_status):
        self._core = core
        self._loaded = loaded
        self._raise = raise_for_status
        self._lock = threading.Lock()
        self._atexit_registered = False
        # The controller the last successful init() started ("mpi" or "tcp").
        self.controller_in_use = None
        # Set by our excepthook: what the other ranks are told when this one
        # dies of an uncaught exception.
        self.exit_reason = ""

    def _check(self, result):
        # (code, message, cause, rank[, values]): see tf_ops/python_lifecycle.h.
        self._raise(*result[:4])

    def start(self, comm=None):
        """Starts the core under :func:`configured_controller`'s controller
        (see tfring.common.basics.init for the arguments and errors)."""
        with self._lock:
            controller = configured_controller()
            transport = transports.named(controller)
            if not transport.elastic and os.environ.get("TFRING_ELASTIC", "").lower() in _TRUE:
                raise ValueError(f"elastic training (TFRING_ELASTIC=1) runs over the "
                                 f"{_elastic_names()} controller only: {controller.upper()} "
                                 "cannot lose a rank.")
            if transport.takes_comm:
                handle = _comm_handle(comm)
                self._check(getattr(self._core(), transport.core_init)(handle))
            else:
                # The job is whoever meets at the rendezvous store.
                if comm is not None:
                    raise ValueError(
                        f"init(comm=...) needs MPI, but the controller is {controller} "
                        "(TFRING_CONTROLLER, HOROVOD_CONTROLLER=gloo or TFRING_RENDEZVOUS_ADDR). "
                        f"Under {controller} the job is every rank that registered with the "
                        "rendezvous store; use process sets (hvd.add_process_set) for a subset "
                        "of ranks.")
                core = self._core()
                if not hasattr(core, transport.core_init):
                    self._raise(_PRECONDITION, f"this tfring library has no "
                                               f"{controller.upper()} controller (no "
                                               f"{transport.core_init}): rebuild it from this "
                                               "source.", _CAUSE_INVALID_ARGUMENT)
                _serve_rendezvous_if_asked(self._raise)
                if elastic.enabled() and not core.is_initialized():
                    self._check(_start_in_a_round(getattr(core, transport.core_init)))
                else:
                    self._check(getattr(core, transport.core_init)())
            self.controller_in_use = controller
            if not self._atexit_registered:
                # Registered after mpi4py's own hook (MPI), so it runs first:
                # the background thread is gone before MPI is finalised.
                atexit.register(self.shutdown_at_exit)
                self._install_excepthook()
                self._atexit_registered = True

    def topology(self, fn, not_known=None):
        """A topology query named like ``fn`` (rank, size, ...), documented
        by ``fn``'s docstring: it reads the core's function of that name,
        which stays valid after the job stopped (for error handlers), and
        before init() raises through ``not_known(code, message)`` (default:
        the binding's raise_for_status)."""
        raise_not_known = not_known or self._raise

        def query():
            core = self._core()
            code, message, cause, rank = core.check_topology_known()
            if code != 0:
                raise_not_known(code, message, cause, rank)
            return getattr(core, fn.__name__)()
        query.__name__ = fn.__name__
        query.__doc__ = fn.__doc__
        return query

    def active_controller(self):
        """The controller init() started, else the one it would start."""
        return self.controller_in_use if self.controller_in_use is not None \
            else configured_controller()

    def _install_excepthook(self):
        previous = sys.excepthook

        def record_and_report(exc_type, exc, tb):
            self.exit_reason = f"died of an uncaught {exc_type.__name__}: {exc}"[:400]
            previous(exc_type, exc, tb)
        sys.excepthook = record_and_report

    def shutdown_at_exit(self):
        """Stops the core at interpreter exit; leaves at once (skipping MPI's
        finalisation) when a peer is gone."""
        if not self._loaded():
            return
        core = self._core()
        core.shutdown(self.exit_reason or "finished its script (without calling shutdown())")
        broken = core.communication_broken()
        if _rendezvous_server is not None and not broken:
            _rendezvous_server.stop()
        if broken:
            # A peer is gone: MPI_Finalize could wait for it forever. Skip it.
            # Linger a moment first: the other survivors check their peers
            # every 0.2 s, and should name the rank that died first, not this
            # one.
            import time
            time.sleep(0.5)
            if self.controller_in_use == "mpi":
                try:
                    import mpi4py
                    mpi4py.rc.finalize = False
                    from mpi4py import MPI  # noqa: F401
                except ImportError:
                    pass
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
