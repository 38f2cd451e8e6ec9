"""``tfring.run``: Horovod's ``horovod.run``, a programmatic tfringrun.

The function is cloudpickled into a private temporary directory (mode
0700), tfringrun (:mod:`tfring.runner.launch`, the same launcher, supervisor
and elastic driver as the command line) runs
``python -m tfring.runner.run_task DIR`` on every rank, and each rank
writes its result or exception back into that directory
(:mod:`tfring.runner.run_task`). The directory lives on this host, so every
rank must see it: jobs with ranks on other hosts need ``run_dir`` on a file
system they share.
"""
import os
import sys
import warnings

# shutil, subprocess and tempfile are imported where used: ``import tfring``
# imports this module and stays light.


class RankFailedError(RuntimeError):
    """A rank of a :func:`run` job failed.

    Raised as is when the rank's own exception cannot come back (it did not
    pickle, or the rank died without one), and otherwise as the cause of the
    rank's exception, which is raised in its place.

    Attributes:
        rank: the failing rank, or None when no rank reported an exception.
        remote_traceback: the rank's traceback as text ("" when none).
        exit_code: tfringrun's exit code.
    """

    def __init__(self, message, rank=None, remote_traceback="", exit_code=None):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.exit_code = exit_code


def _deprecated(new_value, new_name, old_value, old_name):
    if old_value is None:
        return new_value
    warnings.warn(f"{old_name} is deprecated, use {new_name} instead", DeprecationWarning,
                  stacklevel=3)
    if new_value is not None and new_value != old_value:
        raise ValueError(f"give {new_name} or its deprecated alias {old_name}, not both "
                         f"({new_name}={new_value!r}, {old_name}={old_value!r})")
    return old_value


def _tfringrun_args(*, num_proc, min_num_proc, max_num_proc, slots, reset_limit,
                    cooldown_range, hosts, hostfile, host_discovery_script, start_timeout,
                    ssh_port, ssh_identity_file, disable_cache, output_filename, verbose,
                    use_gloo, use_mpi, mpi_args, network_interfaces, timeout, horovod_compat):
    """tfringrun's options for run()'s arguments (checked here, where Horovod
    checks them, so that a bad combination is a ValueError, not an exit code)."""
    if use_gloo and use_mpi:
        raise ValueError("give use_gloo or use_mpi, not both")
    elastic = host_discovery_script is not None or min_num_proc is not None
    if elastic and host_discovery_script is None:
        raise ValueError("elastic training (min_num_proc) needs host_discovery_script")
    if elastic and use_mpi:
        raise ValueError("elastic training runs over the TCP controller; leave out use_mpi")
    if elastic and (hosts or hostfile):
        raise ValueError("elastic training takes its hosts from host_discovery_script, not "
                         "hosts/hostfile")
    fixed_only = [name for name, value in (("max_num_proc", max_num_proc), ("slots", slots),
                                           ("reset_limit", reset_limit),
                                           ("cooldown_range", cooldown_range))
                  if value is not None]
    if fixed_only and not elastic:
        raise ValueError(f"{', '.join(fixed_only)} apply to elastic training only: give "
                         "host_discovery_script too")
    argv = []

    def option(flag, value):
        if value is not None:
            argv.extend([flag, str(value)])

    option("-np", num_proc)
    option("--min-np", min_num_proc)
    option("--max-np", max_num_proc)
    option("--slots-per-host", slots)
    option("--reset-limit", reset_limit)
    if cooldown_range is not None:
        low, high = cooldown_range
        argv += ["--blacklist-cooldown-range", str(low), str(high)]
    option("-H", hosts)
    option("--hostfile", hostfile)
    option("--host-discovery-script", host_discovery_script)
    option("--start-timeout", start_timeout)
    option("--timeout", timeout)
    option("-p", ssh_port)
    option("-i", ssh_identity_file)
    option("--output-filename", output_filename)
    if network_interfaces:
        argv.append("--network-interfaces=" + ",".join(network_interfaces))
    if mpi_args:
        argv.append(f"--mpi-args={mpi_args}")
    for flag, on in (("--disable-cache", disable_cache), ("--verbose", verbose),
                     ("--tcp", use_gloo or (elastic and not use_mpi)), ("--mpi", use_mpi),
                     ("--horovod-compat", horovod_compat)):
        if on:
            argv.append(flag)
    return argv


def _host_list(hosts, hostfile):
    """The parsed `hosts` or `hostfile` ([] for neither).

    Raises:
        ValueError: both given, or a malformed one.
    """
    from tfring.runner import hosts as hosts_mod
    if hosts is not None and hostfile is not None:
        raise ValueError("give hosts or hostfile, not both")
    try:
        return (hosts_mod.parse_hosts_arg(hosts) if hosts else
                hosts_mod.parse_hostfile(hostfile) if hostfile else [])
    except hosts_mod.HostSpecError as e:
        raise ValueError(str(e)) from None


def _check_hosts_see_this_host(listed):
    """Raises ValueError where ranks would run on other hosts (of the
    `listed` hosts.Host), which cannot reach this host's private temporary
    directory."""
    from tfring.runner import hosts as hosts_mod
    remote = [h.name for h in listed if not hosts_mod.is_local(h.name)]
    if remote:
        raise ValueError(f"ranks on {', '.join(remote)} cannot read this host's temporary "
                         "directory, through which tfring.run sends the function and gets "
                         "the results back: pass run_dir=<a directory on a file system every "
                         "host sees>")


def _read_results(run_dir):
    """{rank: record} of what the ranks wrote."""
    import pickle

    from tfring.runner.run_task import RESULT_PREFIX
    records = {}
    for name in os.listdir(run_dir):
        if name.startswith(RESULT_PREFIX) and name[len(RESULT_PREFIX):].isdigit():
            with open(os.path.join(run_dir, name), "rb") as f:
                records[int(name[len(RESULT_PREFIX):])] = pickle.load(f)
    return records


def _raise_failure(records, code):
    errors = sorted((record[1], rank, record) for rank, record in records.items()
                    if record[0] == "error")
    if not errors:
        raise RankFailedError(f"the tfring.run job failed (tfringrun exit code {code}) "
                              "without a rank raising an exception; see the ranks' output "
                              "above", exit_code=code)
    _, rank, (_, _, payload, type_name, message, text) = errors[0]  # the first to fail
    failure = RankFailedError(f"rank {rank} raised {type_name}: {message}\n\n"
                              f"Its traceback (on rank {rank}):\n{text}", rank=rank,
                              remote_traceback=text, exit_code=code)
    original = None
    if payload is not None:
        import pickle
        try:
            original = pickle.loads(payload)
        except Exception:  # noqa: BLE001 - then the wrapper carries the text
            original = None
    if not isinstance(original, BaseException):
        raise failure
    try:
        original.rank = rank
    except AttributeError:
        pass  # a type with __slots__ still gets the note and the cause
    if hasattr(original, "add_note"):  # Python 3.11+
        original.add_note(f"(raised on rank {rank} of the tfring.run job)")
    raise original from failure


def _results_in_rank_order(records, num_proc, elastic):
    oks = {rank: record[1] for rank, record in records.items() if record[0] == "ok"}
    if not elastic:
        missing = [r for r in range(num_proc) if r not in oks]
        if missing:
            raise RankFailedError(f"ranks {missing} ended without a result (they exited "
                                  "before their function returned)", exit_code=0)
        return [oks[r] for r in range(num_proc)]
    # Elastic: the final round's workers, ranks 0..n-1; workers that left
    # earlier returned no result.
    results = []
    while len(results) in oks:
        results.append(oks[len(results)])
    return results


def run(func, args=(), kwargs=None, num_proc=None, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        host_discovery_script=None, start_timeout=None, ssh_port=None, ssh_identity_file=None,
        disable_cache=None, output_filename=None, verbose=None, use_gloo=None, use_mpi=None,
        mpi_args=None, network_interface=None, network_interfaces=None, executable=None,
        np=None, min_np=None, max_np=None, *, env=None, timeout=None, horovod_compat=False,
        run_dir=None):
    """Runs ``func(*args, **kwargs)`` on every rank of a tfring job; returns their results.

    Horovod's ``horovod.run``: the job starts like ``tfringrun`` would start
    it (same launcher, same checks, same clean-up), fixed-size under MPI or
    TCP, or elastic when ``host_discovery_script`` is given. ``func`` is sent
    with cloudpickle, so lambdas and closures work; it typically calls
    ``hvd.init()`` and trains.

    Args:
        func: the function each rank runs.
        args, kwargs: its positional and keyword arguments.
        num_proc: ranks to run (default 1; elastic: workers to start with).
        min_num_proc, max_num_proc: elastic bounds (default: num_proc).
        slots: slots of a discovered host listed without a count.
        reset_limit: elastic re-formations allowed before the job fails.
        cooldown_range: (min, max) seconds a blacklisted host waits.
        hosts: "host1:2,host2:2" (or a list of "host:slots"); default localhost.
        hostfile: a file of "host slots=N" lines.
        host_discovery_script: makes the job elastic; prints "host:slots" lines.
        start_timeout: seconds for every rank to start (default 30).
        ssh_port, ssh_identity_file: for ranks on other hosts.
        disable_cache: turn the response cache off (tfringrun --disable-cache).
        output_filename: also write each rank's output under this directory.
        verbose: print what the launcher does.
        use_gloo: the TCP controller (tfringrun --tcp). use_mpi: MPI (the
            default for fixed-size jobs; elastic jobs always use TCP).
        mpi_args: extra mpiexec arguments, as one string.
        network_interface: deprecated, comma-separated; use network_interfaces.
        network_interfaces: interface names to talk over, e.g. ["eth0"].
        executable: the Python the ranks run (default: this one).
        np, min_np, max_np: deprecated aliases of num_proc, min_num_proc and
            max_num_proc (DeprecationWarning).
        env: more environment variables for the ranks (tfring extension).
        timeout: end the whole job after this many seconds (tfring extension).
        horovod_compat: make ``import horovod...`` resolve to tfring in the
            ranks (tfringrun --horovod-compat).
        run_dir: the directory through which the function and results travel
            (default: a fresh private temporary one, removed afterwards); jobs
            with ranks on other hosts need one that every host sees.

    Returns:
        A list of the ranks' return values, index = rank. Elastic: those of
        the final round's workers, in rank order.

    Raises:
        ValueError: conflicting arguments (hosts and hostfile, use_gloo and
            use_mpi, num_proc and a different np, ...), or a bad option that
            tfringrun refused (its message is printed above).
        Exception: the first failing rank's own exception, where it pickles,
            with ``.rank`` set, a note naming the rank, and a
            :class:`RankFailedError` carrying the rank's traceback as its cause.
        RankFailedError: a rank failed and its exception cannot come back, or
            the job failed without one (a rank killed, a timeout).
        KeyboardInterrupt: interrupted; the job is stopped first.

    Example:
        >>> import tfring
        >>> def work(scale):
        ...     import tfring.tensorflow as hvd
        ...     hvd.init()
        ...     return hvd.rank() * scale
        >>> tfring.run(work, args=(10,), num_proc=2)
        [0, 10]
    """
    import shutil
    import tempfile

    import cloudpickle

    num_proc = _deprecated(num_proc, "num_proc", np, "np")
    min_num_proc = _deprecated(min_num_proc, "min_num_proc", min_np, "min_np")
    max_num_proc = _deprecated(max_num_proc, "max_num_proc", max_np, "max_np")
    if network_interface:
        warnings.warn("network_interface is deprecated, use network_interfaces instead",
                      DeprecationWarning, stacklevel=2)
        network_interfaces = list(network_interfaces or []) + network_interface.split(",")
    if isinstance(hosts, (list, tuple)):
        hosts = ",".join(hosts)
    listed = _host_list(hosts, hostfile)
    elastic = host_discovery_script is not None
    if num_proc is None and not elastic:
        # Horovod's default: every slot of the host list, else one rank.
        num_proc = sum(h.slots for h in listed) if listed else 1
    options = _tfringrun_args(
        num_proc=num_proc, min_num_proc=min_num_proc, max_num_proc=max_num_proc, slots=slots,
        reset_limit=reset_limit, cooldown_range=cooldown_range, hosts=hosts, hostfile=hostfile,
        host_discovery_script=host_discovery_script, start_timeout=start_timeout,
        ssh_port=ssh_port, ssh_identity_file=ssh_identity_file, disable_cache=disable_cache,
        output_filename=output_filename, verbose=verbose, use_gloo=use_gloo, use_mpi=use_mpi,
        mpi_args=mpi_args, network_interfaces=network_interfaces, timeout=timeout,
        horovod_compat=horovod_compat)
    own_dir = run_dir is None
    if own_dir:
        _check_hosts_see_this_host(listed)
    run_dir = tempfile.mkdtemp(prefix="tfring-run-") if own_dir else os.path.abspath(run_dir)
    try:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        from tfring.runner.run_task import TASK_FILE
        with open(os.path.join(run_dir, TASK_FILE), "wb") as f:
            cloudpickle.dump((func, tuple(args), dict(kwargs or {})), f)
        command = [executable or sys.executable, "-m", "tfring.runner.run_task", run_dir]
        code = _launch(options + ["--"] + command, env)
        records = _read_results(run_dir)
        if code != 0 or any(record[0] == "error" for record in records.values()):
            _raise_failure(records, code)
        return _results_in_rank_order(records, num_proc or 0, elastic)
    finally:
        if own_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            from tfring.runner.run_task import RESULT_PREFIX, TASK_FILE
            for name in os.listdir(run_dir):
                if name == TASK_FILE or name.startswith(RESULT_PREFIX):
                    os.unlink(os.path.join(run_dir, name))


def _launch(argv, env):
    """Runs tfringrun in a child process (so that its signal handling works
    from any thread, a notebook's included); returns its exit code. An
    interrupt here stops the job before it propagates."""
    import signal
    import subprocess
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "tfring.runner.launch", *argv],
                            env=full_env, stdin=subprocess.DEVNULL)
    try:
        return proc.wait()
    except BaseException:
        proc.send_signal(signal.SIGTERM)  # tfringrun stops and reaps every rank
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
