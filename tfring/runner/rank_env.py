"""Environment variables tfringrun exports to every rank.

Tuning flags become ``TFRING_*`` variables, read by the core at ``init()``
(Horovod's ``HOROVOD_*`` names are accepted there too):

==========================================  =====================================
flag                                        variable
==========================================  =====================================
``--fusion-threshold-mb MB``                ``TFRING_FUSION_THRESHOLD`` (bytes)
``--cycle-time-ms MS``                      ``TFRING_CYCLE_TIME``
``--cache-capacity N`` / ``--disable-cache``  ``TFRING_CACHE_CAPACITY``
``--timeline-filename PATH``                ``TFRING_TIMELINE`` (made absolute)
``--timeline-mark-cycles``                  ``TFRING_TIMELINE_MARK_CYCLES=1``
``--autotune``                              ``TFRING_AUTOTUNE=1``
``--autotune-log-file PATH``                ``TFRING_AUTOTUNE_LOG`` (made absolute)
``--autotune-warmup-samples N`` etc.        ``TFRING_AUTOTUNE_WARMUP_SAMPLES`` etc.
``--stall-check-warning-time-seconds S``    ``TFRING_STALL_CHECK_TIME_SECONDS``
``--stall-check-shutdown-time-seconds S``   ``TFRING_STALL_SHUTDOWN_TIME_SECONDS``
``--no-stall-check``                        ``TFRING_STALL_CHECK_DISABLE=1``
``--hierarchical-allreduce``/``-allgather``   ``TFRING_HIERARCHICAL_ALLREDUCE=1`` etc.
``--log-level LEVEL``                       ``TFRING_LOG_LEVEL``
``--start-timeout S``                       ``TFRING_START_TIMEOUT``
==========================================  =====================================

tfringrun also names the controller, ``TFRING_CONTROLLER=mpi`` or ``tcp``
(a user's own setting never reaches an MPI job's ranks), and under ``--tcp``
adds the rendezvous variables, the secret and each rank's place (see
:func:`tcp_rank_env` and docs/running.md).

Besides those, tfringrun sets two defaults that the user's own environment
overrides: ``TF_CPP_MIN_LOG_LEVEL=2`` (TensorFlow's start-up logging, times N
ranks, buries the job's output) and, when a host runs more ranks than it has
cores, ``MPIR_CVAR_POLLS_BEFORE_YIELD=1`` (MPICH busy-polls while waiting,
and oversubscribed busy-pollers starve each other: small messages then take
milliseconds instead of about 150 µs).
"""
import os
import socket

from tfring.runner import rank_wrapper

MB = 1024 * 1024


def _number(value):
    """Formats 5.0 as "5" and 0.5 as "0.5", as a C++ strtod/stoi reader expects."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def tuning_env(args):
    """The ``TFRING_*`` variables for the tuning flags the user gave."""
    env = {}

    def put(name, value):
        if value is not None and value is not False:
            env[name] = "1" if value is True else _number(value)

    if args.fusion_threshold_mb is not None:
        env["TFRING_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * MB))
    put("TFRING_CYCLE_TIME", args.cycle_time_ms)
    put("TFRING_CACHE_CAPACITY", 0 if args.disable_cache else args.cache_capacity)
    if args.timeline_filename:
        env["TFRING_TIMELINE"] = os.path.abspath(args.timeline_filename)
    put("TFRING_TIMELINE_MARK_CYCLES", args.timeline_mark_cycles)
    put("TFRING_AUTOTUNE", args.autotune)
    if args.autotune_log_file:
        env["TFRING_AUTOTUNE_LOG"] = os.path.abspath(args.autotune_log_file)
    put("TFRING_AUTOTUNE_WARMUP_SAMPLES", args.autotune_warmup_samples)
    put("TFRING_AUTOTUNE_STEPS_PER_SAMPLE", args.autotune_steps_per_sample)
    put("TFRING_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", args.autotune_bayes_opt_max_samples)
    put("TFRING_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", args.autotune_gaussian_process_noise)
    put("TFRING_STALL_CHECK_TIME_SECONDS", args.stall_check_warning_time_seconds)
    put("TFRING_STALL_SHUTDOWN_TIME_SECONDS", args.stall_check_shutdown_time_seconds)
    put("TFRING_STALL_CHECK_DISABLE", args.no_stall_check)
    put("TFRING_HIERARCHICAL_ALLREDUCE", args.hierarchical_allreduce)
    put("TFRING_HIERARCHICAL_ALLGATHER", args.hierarchical_allgather)
    if args.log_level:
        env["TFRING_LOG_LEVEL"] = args.log_level.upper()
    put("TFRING_START_TIMEOUT", args.start_timeout)
    return env


def usable_cpus():
    """Cores this process may run on: the affinity mask (taskset, cgroups
    cpusets) where the OS has one, which can be fewer than os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_env(local_ranks, base_env=os.environ):
    """tfringrun's defaults, minus any the user already set in ``base_env``.

    ``local_ranks`` is how many ranks run on this machine.
    """
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if local_ranks > usable_cpus():
        env["MPIR_CVAR_POLLS_BEFORE_YIELD"] = "1"
    return {name: value for name, value in env.items() if name not in base_env}


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
