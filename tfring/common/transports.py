"""The transports tfring runs over, registered in one place.

A transport carries the negotiation and the fallback data plane between the
ranks: MPI, or tfring's own TCP. Everything the Python side needs to know
about one is its entry here: the names ``TFRING_CONTROLLER`` accepts, the
core function that starts it, and what it can do. The start-up
(:mod:`tfring.common.startup`) and the launcher's flags
(:mod:`tfring.runner.launch`) read this table rather than naming transports
themselves. The C++ side has its own table (tf_ops/common/transport/registry.h);
docs/architecture.md lists what a new transport adds.
"""
from typing import NamedTuple


class Transport(NamedTuple):
    """One transport.

    Attributes:
        name: its ``TFRING_CONTROLLER`` value, what ``init()`` reports.
        aliases: other names for it (Horovod's).
        core_init: the core module's function that starts tfring over it.
        takes_comm: ``init(comm=...)`` names its ranks (an MPI communicator);
            otherwise the job is whoever meets at the rendezvous store.
        elastic: it can lose a rank and go on (elastic training).
        flags: tfringrun's flags choosing it (the first is its ``args`` name).
        help: tfringrun's help for them.
    """
    name: str
    aliases: tuple
    core_init: str
    takes_comm: bool
    elastic: bool
    flags: tuple
    help: str


TRANSPORTS = (
    Transport("mpi", (), "init", takes_comm=True, elastic=False, flags=("--mpi",),
              help="start the ranks with mpiexec and use MPI (the default)"),
    Transport("tcp", ("gloo",), "init_tcp", takes_comm=False, elastic=True,
              flags=("--tcp", "--gloo"),
              help="tfring's own TCP transport: no MPI; tfringrun starts the ranks (remote "
                   "ones over ssh) and serves their rendezvous (TFRING_CONTROLLER=tcp; "
                   "--gloo is Horovod's name)"),
)


def named(name):
    """The transport called `name` (or one of its aliases, any case); None
    when tfring has none of that name.

    Example:
        >>> named("gloo").name
        'tcp'
    """
    name = name.strip().lower()
    return next((t for t in TRANSPORTS if name in (t.name, *t.aliases)), None)


def default(env):
    """The transport ``init()`` starts when the environment names none: the
    one that meets at a rendezvous store when ``TFRING_RENDEZVOUS_ADDR`` is
    set (ranks started by Ray, Spark or Kubernetes), else the one that takes
    a communicator (MPI)."""
    by_store = bool(env.get("TFRING_RENDEZVOUS_ADDR"))
    return next(t for t in TRANSPORTS if t.takes_comm is not by_store)


def choices():
    """The accepted names, for an error message: "mpi or tcp (gloo means tcp)"."""
    names = " or ".join(t.name for t in TRANSPORTS)
    aliases = ", ".join(f"{a} means {t.name}" for t in TRANSPORTS for a in t.aliases)
    return f"{names} ({aliases})" if aliases else names
