"""Starting a tfringrun job, once :mod:`~tfring.runner.launch` parsed the
command line and chose the mode: MPI (:func:`launch_mpi`: hydra's mpiexec
starts the ranks), TCP (:func:`launch_tcp`: tfringrun serves the rendezvous
store and starts each rank itself, remote ones over ssh) or elastic
(:func:`launch_elastic`: the driver of :mod:`tfring.runner.elastic`)."""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from tfring._store import rendezvous, wire
from tfring.runner import hosts as hosts_mod
from tfring.runner import mpiexec as mpiexec_mod
from tfring.runner import preflight, rank_env, rank_wrapper, remote
from tfring.runner.console import say
from tfring.runner.processes import RankProcessesLaunch, RankSpec
from tfring.runner.supervisor import Supervisor


def fail(message, code=2):
    say(message)
    return code


def build_library_first(command):
    """Builds the op library for this environment's TensorFlow before any rank
    starts, when none exists yet and the job may use it (not a tfring.core
    or torch script: preflight.needs_tf_library): the progress then shows
    once, here, instead of every rank waiting silently on one rank's
    compile. Checking costs no TensorFlow import; only a needed build pays
    one. Returns an exit code, 0 to go on. (Ranks on other hosts, or in
    another environment, still build on import, once per host, under the
    cache's lock.)"""
    from tfring.build import cache
    import importlib.util
    if (importlib.util.find_spec("tensorflow") is None or cache.library_ready_fast()
            or not preflight.needs_tf_library(command)):
        return 0
    proc = subprocess.run([sys.executable, "-m", "tfring.build"], stdout=subprocess.DEVNULL)
    if proc.returncode != 0:
        return fail("the op library could not be built for this TensorFlow (see above); "
                    "no rank was started.", 1)
    return 0


class Job:
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
        say(f"{sum(map(len, self.placement.values()))} ranks on {placed}")
        for name, value in env.items():
            if name != wire.SECRET_ENV:
                say(f"export {name}={value}")

    def report_cleanup(self, supervisor):
        if supervisor.shm_removed and self.args.verbose:
            say(f"removed {len(supervisor.shm_removed)} shared-memory files the job left")
        if supervisor.shm_left:
            say(f"left {', '.join(supervisor.shm_left)}: another process still maps it")


def launch_mpi(args, hosts, num_proc, command, extra_env):
    """The ranks start through hydra's mpiexec and negotiate over MPI."""
    try:
        mpiexec = mpiexec_mod.find_mpiexec()
    except mpiexec_mod.MpiexecNotFound as e:
        print(e, file=sys.stderr)
        return 1
    code = build_library_first(command)
    if code:
        return code
    job = Job(args, hosts, num_proc)
    env = {**rank_env.default_env(job.local_ranks), **extra_env, "TFRING_CONTROLLER": "mpi"}
    try:
        bind, advertise = job.addresses()
    except (hosts_mod.HostSpecError, OSError) as e:
        return fail(str(e), 1)
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
            say(shlex.join(cmd))
        code = supervisor.run(cmd)
        job.report_cleanup(supervisor)
        return code


def launch_tcp(args, hosts, num_proc, command, extra_env):
    """tfringrun serves the rendezvous store and starts every rank itself
    (remote ones over ssh); the ranks meet over TCP."""
    if args.mpi_args:
        return fail("--mpi-args needs MPI; --tcp starts the ranks without mpiexec.")
    code = build_library_first(command)
    if code:
        return code
    job = Job(args, hosts, num_proc)
    if job.remote and shutil.which("ssh") is None:
        return fail(f"ssh was not found on PATH; --tcp starts the ranks on "
                    f"{', '.join(job.remote)} with it.", 1)
    try:
        bind, advertise = job.addresses()
    except (hosts_mod.HostSpecError, OSError) as e:
        return fail(str(e), 1)
    secret = wire.generate_secret()
    try:
        store = rendezvous.start_server(bind, 0, secret)
    except OSError as e:
        return fail(f"cannot start the rendezvous store on {bind}: {e.strerror or e}", 1)
    try:
        env = {**rank_env.default_env(job.local_ranks), **extra_env,
               "TFRING_CONTROLLER": "tcp", "TFRING_RENDEZVOUS_ADDR": advertise,
               "TFRING_RENDEZVOUS_PORT": str(store.address[1]), "TFRING_SIZE": str(num_proc)}
        job.verbose_summary(env)
        env[wire.SECRET_ENV] = wire.encode_secret(secret)
        supervisor = job.supervisor(bind, advertise)
        per_rank = rank_env.tcp_rank_env(job.placement, job.remote, bind, job.interfaces,
                                         remote.fake_host_names())
        specs = []
        for name, ranks in job.placement.items():
            for rank in ranks:
                if name in job.remote:
                    argv = remote.ssh_command(
                        name, job.wrapper_command(supervisor, command, True),
                        args.ssh_port, args.ssh_identity_file)
                    specs.append(RankSpec(rank, argv, per_rank[rank], remote=True,
                                          what=f"ssh {name}"))
                else:
                    specs.append(RankSpec(rank, job.wrapper_command(supervisor, command),
                                          per_rank[rank]))
                if args.verbose:
                    say(f"rank {rank}: {shlex.join(specs[-1].argv)}")
        code = supervisor.run(RankProcessesLaunch(specs), dict(os.environ, **env))
        job.report_cleanup(supervisor)
        return code
    finally:
        store.stop()


# How a fixed-size job starts over each transport of
# tfring.common.transports, by its name: a new transport adds its function
# here (the common package cannot import the runner).
LAUNCHERS = {"mpi": launch_mpi, "tcp": launch_tcp}


def launch_elastic(args, command, extra_env, given):
    """tfringrun in elastic mode: the driver of tfring.runner.elastic."""
    from tfring.runner.elastic import driver as driver_mod
    flags = ", ".join("--" + name.replace("_", "-") for name in given)
    if args.host_discovery_script is None:
        return fail(f"{flags} need --host-discovery-script: elastic training takes its "
                    "hosts from it (see docs/elastic.md).")
    if args.mpi:
        return fail("elastic training runs over the TCP controller only (MPI cannot lose a "
                    "rank); leave out --mpi.")
    if args.hosts or args.hostfile:
        return fail("elastic training takes its hosts from --host-discovery-script, not "
                    "-H/--hostfile.")
    if args.mpi_args:
        return fail("--mpi-args needs MPI; elastic training runs over TCP.")
    np_ = args.num_proc if args.num_proc is not None else args.min_np
    if np_ is None:
        return fail("elastic training needs -np (or --min-np): how many workers to start.")
    min_np = args.min_np if args.min_np is not None else np_
    max_np = args.max_np if args.max_np is not None else max(np_, min_np)
    if args.slots_per_host is not None and args.slots_per_host < 1:
        return fail(f"--slots-per-host must be at least 1, got {args.slots_per_host}")
    if args.reset_limit is not None and args.reset_limit < 0:
        return fail(f"--reset-limit must be 0 or more, got {args.reset_limit}")
    cooldown = args.blacklist_cooldown_range
    if cooldown is not None and not 0 <= cooldown[0] <= cooldown[1]:
        return fail("--blacklist-cooldown-range needs 0 <= MIN <= MAX")
    timeout = 600.0 if args.elastic_timeout is None else args.elastic_timeout
    if timeout <= 0:
        return fail(f"--elastic-timeout must be positive, got {timeout:g}")
    code = build_library_first(command)
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
            return fail(f"ssh was not found on PATH; workers on {', '.join(remote)} are "
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
        return fail(str(e), 2)
    return driver.run()
