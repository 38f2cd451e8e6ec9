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
:mod:`~tfring.runner.mpiexec` builds hydra's command line (MPI), this
module the ranks' own processes (TCP),
:mod:`~tfring.runner.rank_wrapper` runs inside each rank, and
:mod:`~tfring.runner.supervisor` watches the job. This module parses the
command line and ties them together.
"""
import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile

from tfring._store import wire
from tfring.runner import hosts as hosts_mod
from tfring.runner import mpiexec as mpiexec_mod
from tfring.runner import rank_env, rank_wrapper, remote
from tfring.runner.processes import RankProcessesLaunch, RankSpec
from tfring.runner.supervisor import Supervisor

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
    backend.add_argument("--mpi", action="store_true",
                         help="start the ranks with mpiexec and use MPI (the default)")
    backend.add_argument("--tcp", "--gloo", dest="tcp", action="store_true",
                         help="tfring's own TCP transport: no MPI; tfringrun starts the ranks "
                              "(remote ones over ssh) and serves their rendezvous "
                              "(TFRING_CONTROLLER=tcp; --gloo is Horovod's name)")

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
        print(f"tfringrun: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126


def _fail(message, code=2):
    print(f"tfringrun: {message}", file=sys.stderr)
    return code


def _host_list(args):
    if args.hosts and args.hostfile:
        raise hosts_mod.HostSpecError("give -H or --hostfile, not both")
    if args.hosts:
        return hosts_mod.parse_hosts_arg(args.hosts)
    if args.hostfile:
        return hosts_mod.parse_hostfile(args.hostfile)
    return None


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
        return _fail("no command given; usage: tfringrun -np N [options] command [args...]")
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
            return _fail(f"{refusal} No rank was started.", 1)
    if elastic:
        return _launch_elastic(args, command, extra_env, elastic)

    try:
        hosts = _host_list(args)
    except hosts_mod.HostSpecError as e:
        return _fail(str(e))
    if args.num_proc is None and hosts is None:
        if under_mpi_launcher():
            if args.tcp:
                return _fail("--tcp starts the ranks itself; under an MPI launcher, leave it "
                             "out (the ranks then use MPI).")
            return _exec_in_place(command, extra_env)
        return _fail("-np is required (or -H/--hostfile, to use all their slots)")
    if hosts is None:
        hosts = [hosts_mod.Host("localhost", args.num_proc)]
    num_proc = args.num_proc if args.num_proc is not None else hosts_mod.total_slots(hosts)
    if num_proc < 1:
        return _fail(f"-np must be at least 1, got {num_proc}")
    if num_proc > hosts_mod.total_slots(hosts):
        return _fail(f"-np {num_proc} needs more slots than the {hosts_mod.total_slots(hosts)} "
                     f"in the host list ({','.join(str(h) for h in hosts)})")
    if args.tcp:
        if args.mpi_args:
            return _fail("--mpi-args needs MPI; --tcp starts the ranks without mpiexec.")
        code = _build_library_first()
        return code or _launch_tcp(args, hosts, num_proc, command, extra_env)
    try:
        mpiexec = mpiexec_mod.find_mpiexec()
    except mpiexec_mod.MpiexecNotFound as e:
        print(e, file=sys.stderr)
        return 1
    code = _build_library_first()
    if code:
        return code
    return _launch_mpi(args, hosts, num_proc, command, extra_env, mpiexec)


def _build_library_first():
    """Builds the op library for this environment's TensorFlow before any rank
    starts, when none exists yet: the progress then shows once, here, instead
    of every rank waiting silently on one rank's compile. Checking costs no
    TensorFlow import; only a needed build pays one. Returns an exit code, 0
    to go on. (Ranks on other hosts, or in another environment, still build
    on import, once per host, under the cache's lock.)"""
    from tfring.build import library
    import importlib.util
    if importlib.util.find_spec("tensorflow") is None or library.library_ready_fast():
        return 0
    proc = subprocess.run([sys.executable, "-m", "tfring.build"], stdout=subprocess.DEVNULL)
    if proc.returncode != 0:
        return _fail("the op library could not be built for this TensorFlow (see above); "
                     "no rank was started.", 1)
    return 0


class _Job:
    """What both launch modes share: the placement, the addresses to listen
    on, the supervisor and the rank wrapper's command line."""

    def __init__(self, args, hosts, num_proc):
        self.args = args
        self.placement = hosts_mod.assign_ranks(hosts, num_proc)
        self.remote = [name for name in self.placement if not hosts_mod.is_local(name)]
        self.local_ranks = sum(len(r) for name, r in self.placement.items()
                               if name not in self.remote)
        self.interfaces = [n.strip() for n in (args.network_interfaces or "").split(",")
                           if n.strip()]
        self.output_dir = None
        if args.output_filename:
            self.output_dir = os.path.abspath(args.output_filename)
            os.makedirs(self.output_dir, exist_ok=True)

    def addresses(self):
        """(bind, advertise): where this host's listening sockets bind, and
        the address the ranks reach them at. --network-interfaces: that
        interface's address for both; one host: loopback; else every
        interface, advertised by the address routed towards the remote
        hosts.

        Raises:
            HostSpecError, OSError: no address can be found.
        """
        if self.interfaces:
            env = {rank_wrapper.INTERFACES_ENV: ",".join(self.interfaces)}
            try:
                rank_wrapper.resolve_bind_host(env)
            except OSError as e:
                raise hosts_mod.HostSpecError(str(e)) from None
            return env[rank_wrapper.BIND_ENV], env[rank_wrapper.BIND_ENV]
        if self.remote:
            return "0.0.0.0", hosts_mod.address_seen_from(self.remote)
        return "127.0.0.1", "127.0.0.1"

    def supervisor(self, bind, advertise):
        args = self.args
        return Supervisor(
            sum(len(r) for r in self.placement.values()), bind_host=bind,
            advertise_host=advertise, start_timeout=args.start_timeout, timeout=args.timeout,
            verbose=args.verbose, show_hosts=len(self.placement) > 1,
            failure_grace=args.failure_grace_seconds)

    def wrapper_command(self, supervisor, command, env_stdin=False):
        cmd = [sys.executable, os.path.abspath(rank_wrapper.__file__)]
        cmd += supervisor.wrapper_args()
        if self.args.prefix_output:
            cmd.append("--prefix")
        if self.output_dir:
            cmd += ["--output-dir", self.output_dir]
        if env_stdin:
            cmd.append("--env-stdin")
        return cmd + ["--"] + list(command)

    def verbose_summary(self, env):
        if not self.args.verbose:
            return
        placed = "; ".join(f"{name}: ranks {min(r)}-{max(r)}"
                           for name, r in self.placement.items())
        print(f"tfringrun: {sum(map(len, self.placement.values()))} ranks on {placed}",
              file=sys.stderr)
        for name, value in env.items():
            if name != wire.SECRET_ENV:
                print(f"tfringrun: export {name}={value}", file=sys.stderr)

    def report_cleanup(self, supervisor):
        if supervisor.shm_removed and self.args.verbose:
            print(f"tfringrun: removed {len(supervisor.shm_removed)} shared-memory files "
                  "the job left", file=sys.stderr)
        if supervisor.shm_left:
            print(f"tfringrun: left {', '.join(supervisor.shm_left)}: another process "
                  "still maps it", file=sys.stderr)


def _launch_mpi(args, hosts, num_proc, command, extra_env, mpiexec):
    job = _Job(args, hosts, num_proc)
    env = {**rank_env.default_env(job.local_ranks), **extra_env, "TFRING_CONTROLLER": "mpi"}
    try:
        bind, advertise = job.addresses()
    except (hosts_mod.HostSpecError, OSError) as e:
        return _fail(str(e), 1)
    supervisor = job.supervisor(bind, advertise)
    rank_command = job.wrapper_command(supervisor, command)
    interface = job.interfaces[0] if job.interfaces else None
    with tempfile.TemporaryDirectory(prefix="tfringrun-") as scratch:
        shim = None
        if job.remote and (args.ssh_port is not None or args.ssh_identity_file):
            shim = mpiexec_mod.write_ssh_shim(scratch, args.ssh_port, args.ssh_identity_file)
        cmd = mpiexec_mod.build_command(
            mpiexec, hosts, num_proc, env, rank_command, ssh_shim=shim,
            network_interface=interface,
            mpi_args=shlex.split(args.mpi_args) if args.mpi_args else ())
        job.verbose_summary(env)
        if args.verbose:
            print(f"tfringrun: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        code = supervisor.run(cmd)
        job.report_cleanup(supervisor)
        return code


def tcp_rank_env(placement, remote, bind_host, interfaces, fake_hosts=None):
    """{rank: variables} for the ranks' place in the job: the rank tfringrun
    expects (``TFRING_RANK``), ``TFRING_HOST_ORDER`` (the host's index
    in the host list) and ``TFRING_LOCAL_SLOT`` (the rank's slot on it), and
    where it listens. Every name of this machine counts as one host, so
    ``-H localhost:2,127.0.0.1:2`` places four ranks on one host, unless
    `fake_hosts` (see :func:`tfring.runner.remote.fake_host_names`) splits it into fake hosts: then
    each local rank gets its fake name as ``TFRING_HOSTNAME``, and hosts are
    ordered by first appearance, so the ranks the core derives are tfringrun's."""
    order, slots, env = {}, {}, {}
    real_host = socket.gethostname()
    for name, ranks in placement.items():
        for rank in ranks:
            key, own_name = (name, None) if name in remote else (None, None)  # None: here
            if key is None and fake_hosts is not None:
                own_name = fake_hosts[rank] if rank < len(fake_hosts) else real_host
                key = ("fake", own_name)
            order.setdefault(key, len(order))
            slot = slots.get(key, 0)
            slots[key] = slot + 1
            env[rank] = {rank_wrapper.RANK_ENV: str(rank), "TFRING_HOST_ORDER": str(order[key]),
                         "TFRING_LOCAL_SLOT": str(slot)}
            if own_name is not None:
                env[rank]["TFRING_HOSTNAME"] = own_name
            if key is not None and interfaces:
                # Resolved by the wrapper on that host: addresses differ per host.
                env[rank][rank_wrapper.BIND_ENV] = ""
                env[rank][rank_wrapper.INTERFACES_ENV] = ",".join(interfaces)
            else:
                env[rank][rank_wrapper.BIND_ENV] = bind_host
    return env


def _launch_tcp(args, hosts, num_proc, command, extra_env):
    from tfring._store import rendezvous
    job = _Job(args, hosts, num_proc)
    if job.remote and shutil.which("ssh") is None:
        return _fail(f"ssh was not found on PATH; --tcp starts the ranks on "
                     f"{', '.join(job.remote)} with it.", 1)
    try:
        bind, advertise = job.addresses()
    except (hosts_mod.HostSpecError, OSError) as e:
        return _fail(str(e), 1)
    secret = wire.generate_secret()
    try:
        store = rendezvous.start_server(bind, 0, secret)
    except OSError as e:
        return _fail(f"cannot start the rendezvous store on {bind}: {e.strerror or e}", 1)
    try:
        env = {**rank_env.default_env(job.local_ranks), **extra_env,
               "TFRING_CONTROLLER": "tcp", "TFRING_RENDEZVOUS_ADDR": advertise,
               "TFRING_RENDEZVOUS_PORT": str(store.address[1]), "TFRING_SIZE": str(num_proc)}
        job.verbose_summary(env)
        env[wire.SECRET_ENV] = wire.encode_secret(secret)
        supervisor = job.supervisor(bind, advertise)
        per_rank = tcp_rank_env(job.placement, job.remote, bind, job.interfaces,
                                remote.fake_host_names())
        specs = []
        for name, ranks in job.placement.items():
            for rank in ranks:
                if name in job.remote:
                    argv = remote.ssh_command(name, job.wrapper_command(supervisor, command, True),
                                       args.ssh_port, args.ssh_identity_file)
                    specs.append(RankSpec(rank, argv, per_rank[rank], remote=True,
                                          what=f"ssh {name}"))
                else:
                    specs.append(RankSpec(rank, job.wrapper_command(supervisor, command),
                                          per_rank[rank]))
                if args.verbose:
                    print(f"tfringrun: rank {rank}: {shlex.join(specs[-1].argv)}",
                          file=sys.stderr, flush=True)
        code = supervisor.run(RankProcessesLaunch(specs), dict(os.environ, **env))
        job.report_cleanup(supervisor)
        return code
    finally:
        store.stop()


def _launch_elastic(args, command, extra_env, given):
    """tfringrun in elastic mode: the driver of tfring.runner.elastic."""
    from tfring.runner.elastic import driver as driver_mod
    flags = ", ".join("--" + name.replace("_", "-") for name in given)
    if args.host_discovery_script is None:
        return _fail(f"{flags} need --host-discovery-script: elastic training takes its "
                     "hosts from it (see docs/elastic.md).")
    if args.mpi:
        return _fail("elastic training runs over the TCP controller only (MPI cannot lose a "
                     "rank); leave out --mpi.")
    if args.hosts or args.hostfile:
        return _fail("elastic training takes its hosts from --host-discovery-script, not "
                     "-H/--hostfile.")
    if args.mpi_args:
        return _fail("--mpi-args needs MPI; elastic training runs over TCP.")
    np_ = args.num_proc if args.num_proc is not None else args.min_np
    if np_ is None:
        return _fail("elastic training needs -np (or --min-np): how many workers to start.")
    min_np = args.min_np if args.min_np is not None else np_
    max_np = args.max_np if args.max_np is not None else max(np_, min_np)
    if args.slots_per_host is not None and args.slots_per_host < 1:
        return _fail(f"--slots-per-host must be at least 1, got {args.slots_per_host}")
    if args.reset_limit is not None and args.reset_limit < 0:
        return _fail(f"--reset-limit must be 0 or more, got {args.reset_limit}")
    cooldown = args.blacklist_cooldown_range
    if cooldown is not None and not 0 <= cooldown[0] <= cooldown[1]:
        return _fail("--blacklist-cooldown-range needs 0 <= MIN <= MAX")
    timeout = 600.0 if args.elastic_timeout is None else args.elastic_timeout
    if timeout <= 0:
        return _fail(f"--elastic-timeout must be positive, got {timeout:g}")
    code = _build_library_first()
    if code:
        return code
    interfaces = [n.strip() for n in (args.network_interfaces or "").split(",") if n.strip()]
    try:
        first = driver_mod.parse_discovery(
            subprocess.run(args.host_discovery_script, shell=True, capture_output=True,
                           text=True, timeout=driver_mod.DISCOVERY_TIMEOUT).stdout,
            args.slots_per_host)
        remote = [name for name in first if not hosts_mod.is_local(name)]
        if interfaces:
            env = {rank_wrapper.INTERFACES_ENV: ",".join(interfaces)}
            rank_wrapper.resolve_bind_host(env)
            bind = advertise = env[rank_wrapper.BIND_ENV]
        elif remote:
            bind, advertise = "0.0.0.0", hosts_mod.address_seen_from(remote)
        else:
            bind = advertise = "127.0.0.1"
        if remote and shutil.which("ssh") is None:
            return _fail(f"ssh was not found on PATH; workers on {', '.join(remote)} are "
                         "started with it.", 1)
        output_dir = None
        if args.output_filename:
            output_dir = os.path.abspath(args.output_filename)
            os.makedirs(output_dir, exist_ok=True)
        env = {**rank_env.default_env(np_), **extra_env}
        driver = driver_mod.Driver(
            command, np=np_, min_np=min_np, max_np=max_np,
            discovery_script=args.host_discovery_script, slots_per_host=args.slots_per_host,
            elastic_timeout=timeout, reset_limit=args.reset_limit, cooldown_range=cooldown,
            env=dict(os.environ, **env), bind_host=bind, advertise_host=advertise,
            timeout=args.timeout, start_timeout=args.start_timeout,
            prefix_output=args.prefix_output, output_dir=output_dir, verbose=args.verbose,
            ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file,
            interfaces=interfaces)
    except (driver_mod.DriverError, hosts_mod.HostSpecError, OSError,
            subprocess.TimeoutExpired) as e:
        return _fail(str(e), 2)
    return driver.run()


if __name__ == "__main__":
    sys.exit(main())
