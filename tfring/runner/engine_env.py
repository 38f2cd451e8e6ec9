"""The environment of ranks that a cluster engine starts (Ray actors, Spark
barrier tasks): where each one's rank comes from, and the TCP controller's
variables that make its ``init()`` find the others.

The engine decides where its workers run; the driver only learns each
worker's host afterwards. From those hosts this module numbers the ranks as
tfringrun does (host by host, in order of first appearance; within a host,
in worker order), and writes each worker the variables the core derives the
same numbering from (``TFRING_HOST_ORDER``, ``TFRING_LOCAL_SLOT``), so the
rank a worker's ``init()`` gets is the one the driver expects.

Everything a worker's environment holds is decided in
:func:`worker_environments`, one function, so that another way of forming
the job (elastic mode) can replace it whole. Nothing here imports Ray,
pyspark or TensorFlow.
"""
import collections

from tfring._store import elastic_protocol as protocol
from tfring._store import wire
from tfring.runner import rank_env, rank_wrapper


def place_ranks(hosts):
    """Ranks for workers on `hosts` (one host name per worker, in worker order).

    Args:
        hosts: a sequence of host names, e.g. ``["b", "a", "b"]``.

    Returns:
        (ranks, placement): ``ranks[i]`` is worker i's rank, and
        ``placement`` maps each host, in order of first appearance, to its
        ranks (``{"b": [0, 1], "a": [2]}`` for the example).

    Raises:
        ValueError: no host, or an empty host name.
    """
    if not hosts:
        raise ValueError("no worker to place: the job needs at least one")
    by_host = collections.OrderedDict()
    for worker, host in enumerate(hosts):
        if not host or not isinstance(host, str):
            raise ValueError(f"worker {worker} reported no host name ({host!r})")
        by_host.setdefault(host, []).append(worker)
    ranks, placement, next_rank = [None] * len(hosts), collections.OrderedDict(), 0
    for host, workers in by_host.items():
        placement[host] = []
        for worker in workers:
            ranks[worker] = next_rank
            placement[host].append(next_rank)
            next_rank += 1
    return ranks, placement


def worker_environments(hosts, rendezvous_addr, rendezvous_port, secret, bind_hosts=None,
                        extra=None, devices=None):
    """The variables each worker sets before it calls ``init()``.

    Args:
        hosts: one host name per worker (what each worker reported about
            itself: its node's name, or a fake one, see docs/ray.md).
        rendezvous_addr, rendezvous_port: where the job's store is, as the
            workers reach it.
        secret: the job's secret (bytes); it reaches the workers only
            through these environments, never a command line.
        bind_hosts: per worker, the address its rank listens on (its node's
            address, as the engine knows it); None or "" for every interface.
        extra: variables every worker gets besides (user settings); the
            job's own variables win over them.
        devices: per worker, the GPU ids the engine reserved for it, or
            None. Every worker on a host then sees all of that host's, in
            rank order (``CUDA_VISIBLE_DEVICES``), so that ``local_rank()``
            indexes its own (an engine shows each worker only its own, and
            every one would be device 0).

    Returns:
        (ranks, envs): ``ranks[i]`` is worker i's rank, ``envs[i]`` its
        variables as a {name: str} dict.

    Raises:
        ValueError: as :func:`place_ranks`, or `bind_hosts` of another length.

    Example:
        >>> ranks, envs = worker_environments(["n1", "n1"], "10.0.0.1", 29400, secret)
        >>> envs[1]["TFRING_LOCAL_SLOT"], envs[1]["TFRING_SIZE"]
        ('1', '2')
    """
    ranks, placement = place_ranks(hosts)
    if bind_hosts is not None and len(bind_hosts) != len(hosts):
        raise ValueError(f"{len(bind_hosts)} bind addresses for {len(hosts)} workers")
    if devices is not None and len(devices) != len(hosts):
        raise ValueError(f"{len(devices)} device lists for {len(hosts)} workers")
    host_devices = {}
    for worker in sorted(range(len(hosts)), key=lambda w: ranks[w]):
        if devices is not None:
            host_devices.setdefault(hosts[worker], []).extend(str(d) for d in devices[worker])
    # Every host counts as "remote" to tfringrun's placement rule: the driver
    # is not one of the hosts, and a host's name is all that identifies it.
    per_rank = rank_env.tcp_rank_env(placement, set(placement), "", [])
    common = {"TFRING_CONTROLLER": "tcp", "TFRING_RENDEZVOUS_ADDR": str(rendezvous_addr),
              "TFRING_RENDEZVOUS_PORT": str(rendezvous_port), "TFRING_SIZE": str(len(hosts)),
              wire.SECRET_ENV: wire.encode_secret(secret)}
    envs = []
    for worker, rank in enumerate(ranks):
        env = dict(extra or {})
        env.update(common)
        env.update(per_rank[rank])
        # The core registers under this name; it must be the one the ranks
        # were grouped by here.
        env["TFRING_HOSTNAME"] = hosts[worker]
        env[rank_wrapper.BIND_ENV] = (bind_hosts[worker] or "") if bind_hosts else ""
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(host_devices[hosts[worker]])
        envs.append({k: str(v) for k, v in env.items()})
    return ranks, envs


# Variables that a round of an elastic job decides (tfring.common.elastic
# exports them at init()); a worker must not start with stale ones.
ELASTIC_ROUND_VARIABLES = ("TFRING_SIZE", "TFRING_RANK", "TFRING_LOCAL_SLOT",
                           "TFRING_HOST_ORDER", "TFRING_RENDEZVOUS_SCOPE",
                           "TFRING_RENDEZVOUS_SERVE")


def elastic_worker_environment(worker_id, host, rendezvous_addr, rendezvous_port, secret,
                               join_timeout, bind_host=None, extra=None):
    """The variables of one worker of an elastic job an engine runs.

    Its rank, size and place are not here: its ``init()`` takes them from
    the newest round the driver published (see docs/elastic.md).

    Args:
        worker_id: the worker's id in the driver's rounds (an int, unique
            for the job's whole life: a replacement gets a new one).
        host: the name the driver groups it by (it registers under it).
        rendezvous_addr, rendezvous_port, secret: the job's store.
        join_timeout: seconds the worker waits for a round that includes it.
        bind_host: the address its rank listens on; None for every interface.
        extra: variables every worker gets besides; the job's own win.

    Returns:
        {name: str}; the names of :data:`ELASTIC_ROUND_VARIABLES` are to be
        removed from the worker's environment.

    Example:
        >>> env = elastic_worker_environment(3, "n1", "10.0.0.1", 29400, secret, 630)
        >>> env["TFRING_ELASTIC_WORKER"]
        '3'
    """
    if not host or not isinstance(host, str):
        raise ValueError(f"elastic worker {worker_id} reported no host name ({host!r})")
    env = dict(extra or {})
    env.update({"TFRING_CONTROLLER": "tcp", protocol.ELASTIC_ENV: "1",
                protocol.WORKER_ENV: str(worker_id), protocol.TIMEOUT_ENV: f"{join_timeout:g}",
                "TFRING_RENDEZVOUS_ADDR": str(rendezvous_addr),
                "TFRING_RENDEZVOUS_PORT": str(rendezvous_port),
                wire.SECRET_ENV: wire.encode_secret(secret), "TFRING_HOSTNAME": host,
                rank_wrapper.BIND_ENV: bind_host or ""})
    for name in ELASTIC_ROUND_VARIABLES:
        env.pop(name, None)
    return {k: str(v) for k, v in env.items()}


def attach_rank(error, rank, note):
    """Marks a worker's exception, re-raised on the driver, with where it
    came from: its ``rank`` attribute, when it can take one, and `note`
    (the rank, host and remote traceback), which Python prints with the
    exception's own traceback. Returns `error`."""
    try:
        error.rank = rank
    except Exception:  # noqa: BLE001 - e.g. a class with __slots__
        pass
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python < 3.11 has no add_note(); the attribute is the same
        try:
            error.__notes__ = list(getattr(error, "__notes__", [])) + [note]
        except Exception:  # noqa: BLE001
            pass
    return error
