"""tfringrun: start a tfring job, the way ``horovodrun`` starts a Horovod one.

Usage::

    tfringrun -np 4 python train.py
    tfringrun -np 8 -H server1:4,server2:4 python train.py
    tfringrun -np 8 --hostfile hosts.txt --timeout 3600 python train.py
    tfringrun --tcp -np 4 python train.py
    tfringrun --check-build

It launches ``-np`` ranks of the command, watches them, and ends the whole
job as soon as one rank fails, naming that rank and its exit code. With MPI
(the default, ``--mpi``) the ranks start through MPICH's hydra ``mpiexec``
(the one from the ``mpich`` wheel, next to this Python). With ``--tcp``
(alias ``--gloo``) tfringrun needs no MPI at all: it serves the job's
rendezvous store (:mod:`~tfring.runner.rendezvous`), makes a fresh secret
that proves every connection belongs to the job, and starts the ranks
itself, local ones as subprocesses and remote ones over ssh. Horovod's
``horovodrun`` flags work where they make sense; the tuning flags become
``TFRING_*`` variables in every rank (see :mod:`tfring.runner.rank_env`).

The pieces: :mod:`~tfring.runner.hosts` parses host lists,
:mod:`~tfring.runner.rank_env` builds the rank environment,
:mod:`~tfring.runner.mpiexec` builds hydra's command line (MPI),
:mod:`~tfring.runner.modes` starts a job in each mode (MPI, TCP,
elastic), :mod:`~tfring.runner.processes` the ranks' own processes,
:mod:`~tfring.runner.remote` those on other hosts (ssh),
:mod:`~tfring.runner.rank_wrapper` runs inside each rank, and
:mod:`~tfring.runner.supervisor` watches the job. This module parses the
command line and chooses the mode.
"""
import argparse
import os
import sys

from tfring.common import transports
from tfring.runner import hosts as hosts_mod
from tfring.runner import modes, rank_env, rank_wrapper
from tfring.runner.console import say

_DESCRIPTION = "Run a tfring (Horovod-compatible) training job on one or more hosts."

_EPILOG = """\
examples:
  tfringrun -np 4 python train.py
  tfringrun -np 8 -H host1:4,host2:4 python train.py
  tfringrun -np 2 --fusion-threshold-mb 32 --timeline-filename tl.json python train.py
  tfringrun --tcp -np 8 -H host1:4,host2:4 -p 2222 python train.py

Options must come before the command; everything from the command on is
passed to it untouched. Use --mpi-args="..." for extra mpiexec arguments.

Each output line is prefixed with [RANK]<stdout>: or [RANK]<stderr>: unless
--no-prefix-output is given. When a rank exits non-zero or is killed, the
other ranks are stopped (SIGTERM, then SIGKILL after a few seconds, to
every process of the rank's process group, so a rank command that is a
script takes its children with it) and tfringrun exits with that rank's
code (128+N for signal N). Exit code 124 means --timeout expired; 130/143
mean tfringrun was interrupted. Once the job is being stopped, tfringrun
reports how each rank ended.

Already under an MPI launcher (PMI_RANK, OMPI_COMM_WORLD_RANK or PMIX_RANK
set) and without -np/-H/--hostfile, tfringrun runs the command in place
with the TFRING_* variables for the flags given, so
`mpiexec -n 4 tfringrun --fusion-threshold-mb 8 python train.py` works.

Remote hosts are started over ssh (by hydra, or under --tcp by tfringrun)
and need this Python, with tfring installed, at the same path, and must be
able to connect back to this host. Under --tcp the job's secret reaches the
ranks only through their environment (over ssh: on ssh's stdin), never on a
command line.
"""

_ELASTIC_FLAGS = ("min_np", "max_np", "host_discovery_script", "slots_per_host",
                  "elastic_timeout", "reset_limit", "blacklist_cooldown_range")
_LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


def _default_start_timeout():
    for name in ("TFRING_START_TIMEOUT", "HOROVOD_START_TIMEOUT"):
        try:
            return float(os.environ[name])
        except (KeyError, ValueError):
            pass
    return 30.0


def build_parser():
    try:
        from tfring import __version__ as version
    except ImportError:
        version = "unknown"
    parser = argparse.ArgumentParser(
        prog="tfringrun", description=_DESCRIPTION, epilog=_EPILOG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--version", action="version", version=f"tfring {version}")

    group = parser.add_argument_group("processes and hosts")
    group.add_argument("-np", "--num-proc", dest="num_proc", type=int, metavar="N",
                       help="number of ranks to run (default: every slot of -H/--hostfile)")
    group.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                       help="hosts and their slots, e.g. host1:4,host2:4 (default: localhost:N)")
    group.add_argument("--hostfile", metavar="FILE",
                       help="file with one 'host slots=N' or 'host:N' per line")
    group.add_argument("--start-timeout", type=float, default=_default_start_timeout(),
                       metavar="SECONDS",
                       help="fail if a rank has not started after this long; also exported "
                            "as TFRING_START_TIMEOUT (default: 30, or $TFRING_START_TIMEOUT)")
    group.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="stop the whole job after this long, exit code 124 (tfring extension)")
    group.add_argument("--failure-grace-seconds", type=float, default=5.0, metavar="SECONDS",
                       help="after a rank fails, give the others this long to report it and "
                            "exit by themselves before stopping them (default 5; tfring "
                            "extension)")
    group.add_argument("--network-interfaces", "--network-interface", dest="network_interfaces",
                       metavar="NIC[,NIC...]",
                       help="network interfaces to listen on and talk over, e.g. eth0; each "
                            "host uses the first of the list it has (hydra under MPI: the "
                            "first of the list)")
    group.add_argument("-p", "--ssh-port", type=int, metavar="PORT",
                       help="ssh port on remote hosts")
    group.add_argument("-i", "--ssh-identity-file", metavar="FILE", help="ssh private key")
    group.add_argument("--output-filename", metavar="DIR",
                       help="also write each rank's output to DIR/rank.N/stdout and stderr "
                            "(on the host the rank runs on)")
    group.add_argument("--prefix-output", action=argparse.BooleanOptionalAction, default=True,
                       help="prefix output lines with [RANK]<stdout|stderr>: (default: on)")
    group.add_argument("--mpi-args", metavar="'ARGS'",
                       help="extra arguments for mpiexec, split like a shell would")
    group.add_argument("--verbose", action="store_true",
                       help="print the mpiexec command, the exported variables and rank events")
    group.add_argument("--check-build", action="store_true",
                       help="show what this tfring was built with, and exit")
    group.add_argument("--horovod-compat", action="store_true",
                       help="make `import horovod`, horovod.tensorflow, horovod.keras and "
                            "horovod.run resolve to tfring in the ranks, so a Horovod script "
                            "runs unchanged (refused where a real horovod is importable)")
    group.add_argument("--no-tf-check", action="store_true",
                       help="start a job that imports TensorFlow even when the ranks' Python "
                            "has none, or one outside the supported range (see docs/running.md)")

    group = parser.add_argument_group("controller")
    backend = group.add_mutually_exclusive_group()
    for transport in transports.TRANSPORTS:  # args.mpi, args.tcp
        backend.add_argument(*transport.flags, dest=transport.name, action="store_true",
                             help=transport.help)

    group = parser.add_argument_group("tuning (exported to every rank as TFRING_* variables)")
    group.add_argument("--fusion-threshold-mb", type=float, metavar="MB",
                       help="fusion buffer size (TFRING_FUSION_THRESHOLD, in bytes)")
    group.add_argument("--cycle-time-ms", type=float, metavar="MS",
                       help="background cycle time (TFRING_CYCLE_TIME)")
    group.add_argument("--cache-capacity", type=int, metavar="N",
                       help="response cache size; 0 turns it off (TFRING_CACHE_CAPACITY)")
    group.add_argument("--disable-cache", action="store_true", help="same as --cache-capacity 0")
    group.add_argument("--hierarchical-allreduce", action="store_true",
                       help="TFRING_HIERARCHICAL_ALLREDUCE=1")
    group.add_argument("--hierarchical-allgather", action="store_true",
                       help="TFRING_HIERARCHICAL_ALLGATHER=1")
    group.add_argument("--timeline-filename", metavar="FILE",
                       help="write a Chrome-trace timeline from rank 0 (TFRING_TIMELINE)")
    group.add_argument("--timeline-mark-cycles", action="store_true",
                       help="mark background cycles in the timeline")
    group.add_argument("--autotune", action="store_true",
                       help="tune fusion threshold and cycle time while training")
    group.add_argument("--autotune-log-file", metavar="FILE", help="TFRING_AUTOTUNE_LOG")
    group.add_argument("--autotune-warmup-samples", type=int, metavar="N")
    group.add_argument("--autotune-steps-per-sample", type=int, metavar="N")
    group.add_argument("--autotune-bayes-opt-max-samples", type=int, metavar="N")
    group.add_argument("--autotune-gaussian-process-noise", type=float, metavar="X")
    group.add_argument("--stall-check-warning-time-seconds", type=int, metavar="S",
                       help="warn about ranks that lag this long (TFRING_STALL_CHECK_TIME_SECONDS)")
    group.add_argument("--stall-check-shutdown-time-seconds", type=int, metavar="S",
                       help="shut down after a stall this long "
                            "(TFRING_STALL_SHUTDOWN_TIME_SECONDS)")
    group.add_argument("--no-stall-check", action="store_true", help="TFRING_STALL_CHECK_DISABLE=1")
    group.add_argument("--log-level", type=str.upper, choices=_LOG_LEVELS,
                       help="TFRING_LOG_LEVEL")

    group = parser.add_argument_group(
        "elastic training (TCP; workers come and go, see docs/elastic.md)")
    group.add_argument("--host-discovery-script", metavar="SCRIPT",
                       help="run elastically: a command printing the usable hosts as "
                            "'host:slots' lines, run every second")
    group.add_argument("--min-np", type=int, metavar="N",
                       help="fewest workers to train with (default: -np)")
    group.add_argument("--max-np", type=int, metavar="N",
                       help="most workers to train with (default: -np)")
    group.add_argument("--slots-per-host", type=int, metavar="N",
                       help="slots of a host the discovery script lists without a count")
    group.add_argument("--elastic-timeout", type=float, metavar="SECONDS",
                       help="how long to wait below --min-np before failing (default 600)")
    group.add_argument("--reset-limit", type=int, metavar="N",
                       help="stop the job after this many re-formations (default: none)")
    group.add_argument("--blacklist-cooldown-range", nargs=2, type=float,
                       metavar=("MIN", "MAX"),
                       help="a host blacklisted after repeated failures may run workers "
                            "again after a random time in this range (seconds)")

    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command each rank runs, with its arguments")
    return parser


def _join_option_values(parser, argv):
    """Rewrites ``--mpi-args VALUE`` as ``--mpi-args=VALUE`` before the command.

    argparse would take a value starting with '-' (``--mpi-args "-verbose"``)
    for an option of its own; the ``=`` form is unambiguous. The scan walks
    tfringrun's options by how many values each takes and stops where the
    command starts, so the command's own arguments are never touched.
    """
    argv, out, i = list(argv), [], 0
    # argparse has no public map from option string to action; this private
    # one has been stable since Python 3.2.
    actions = parser._option_string_actions
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-"):
            return out + argv[i:]  # the command starts here
        action = actions.get(token)
        if token == "--mpi-args" and i + 1 < len(argv):
            out.append(f"--mpi-args={argv[i + 1]}")
            i += 2
            continue
        # store actions take one value (nargs None); flags declare nargs=0.
        count = 0 if action is None else (1 if action.nargs is None else action.nargs)
        out.extend(argv[i:i + 1 + count])
        i += 1 + count
    return out


def under_mpi_launcher(env=os.environ):
    return rank_wrapper.rank_from_env(env) is not None


def _exec_in_place(command, extra_env):
    """Becomes the command, for a tfringrun that an MPI launcher started."""
    env = dict(os.environ, **extra_env)
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        say(f"cannot run {command[0]!r}: {e.strerror}")
        return 127 if isinstance(e, FileNotFoundError) else 126


def _host_list(args):
    if args.hosts and args.hostfile:
        raise hosts_mod.HostSpecError("give -H or --hostfile, not both")
    if args.hosts:
        return hosts_mod.parse_hosts_arg(args.hosts)
    if args.hostfile:
        return hosts_mod.parse_hostfile(args.hostfile)
    return None


def _chosen_transport(args):
    """The transport that tfringrun's flags chose; with none, the one that
    takes an MPI communicator (tfringrun's default is MPI whatever the
    environment says)."""
    chosen = [t for t in transports.TRANSPORTS if getattr(args, t.name)]
    return chosen[0] if chosen else transports.default({})


def main(argv=None):
    """Entry point of the ``tfringrun`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(_join_option_values(parser, sys.argv[1:] if argv is None else argv))
    if args.check_build:
        from tfring.runner import check_build
        return check_build.main()
    elastic = [name for name in _ELASTIC_FLAGS if getattr(args, name) is not None]
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        return modes.fail("no command given; usage: tfringrun -np N [options] command [args...]")
    extra_env = rank_env.tuning_env(args)
    if args.horovod_compat:
        from tfring.runner import horovod_compat
        extra_env.update(horovod_compat.rank_env())
    in_place = (not elastic and args.num_proc is None and not args.hosts and not args.hostfile
                and under_mpi_launcher())
    if not in_place:  # under an MPI launcher each rank would check again
        from tfring.runner import preflight
        refusal = preflight.check(command, dict(os.environ, **extra_env), args.horovod_compat,
                                  tf_check=not args.no_tf_check)
        if refusal:
            return modes.fail(f"{refusal} No rank was started.", 1)
    if elastic:
        return modes.launch_elastic(args, command, extra_env, elastic)

    try:
        hosts = _host_list(args)
    except hosts_mod.HostSpecError as e:
        return modes.fail(str(e))
    transport = _chosen_transport(args)
    if args.num_proc is None and hosts is None:
        if under_mpi_launcher():
            if not transport.takes_comm:
                return modes.fail(f"{transport.flags[0]} starts the ranks itself; under an MPI "
                                  "launcher, leave it out (the ranks then use MPI).")
            return _exec_in_place(command, extra_env)
        return modes.fail("-np is required (or -H/--hostfile, to use all their slots)")
    if hosts is None:
        hosts = [hosts_mod.Host("localhost", args.num_proc)]
    num_proc = args.num_proc if args.num_proc is not None else hosts_mod.total_slots(hosts)
    if num_proc < 1:
        return modes.fail(f"-np must be at least 1, got {num_proc}")
    if num_proc > hosts_mod.total_slots(hosts):
        return modes.fail(f"-np {num_proc} needs more slots than the "
                          f"{hosts_mod.total_slots(hosts)} in the host list "
                          f"({','.join(str(h) for h in hosts)})")
    return modes.LAUNCHERS[transport.name](args, hosts, num_proc, command, extra_env)

if __name__ == "__main__":
    sys.exit(main())
