"""tfringrun, tfring's launcher (Horovod's ``horovodrun`` for tfring).

Run ``tfringrun -np N python train.py``; see :mod:`tfring.runner.launch` for
the options and how the modules here fit together. Nothing in this package
imports TensorFlow, so launching stays fast.

Ranks started some other way (Ray actors, Spark tasks, a Kubernetes Indexed
Job) use the TCP controller through a rendezvous store that anyone can
start with :func:`start_rendezvous`. :func:`run` (also ``tfring.run``) is
Horovod's ``horovod.run``: tfringrun for a Python function.
"""
from tfring.runner.api import RankFailedError, run  # noqa: F401


def start_rendezvous(host="127.0.0.1", port=0, secret=None):
    """Starts a rendezvous store for ranks that no tfringrun started.

    Give every rank ``TFRING_RENDEZVOUS_ADDR`` (an address of this host that
    they can reach), ``TFRING_RENDEZVOUS_PORT``, the same ``TFRING_SECRET``,
    ``TFRING_SIZE`` and a distinct ``TFRING_LOCAL_SLOT`` per host; their
    ``init()`` then uses the TCP controller and finds each other here. The
    store serves in background threads of this process until ``stop()``.

    Args:
        host: the address to bind: loopback when every rank runs on this host,
            an interface's address or "0.0.0.0" (every interface) otherwise.
        port: the port; 0 picks a free one.
        secret: the job's secret, as bytes or as hex text (at least 16 bytes);
            None reads ``TFRING_SECRET``. ``tfring.runner.wire.generate_secret()``
            makes one, ``wire.encode_secret()`` its hex form for the ranks.

    Returns:
        (server, addr, port): the running store (``server.stop()`` ends it),
        and the address and port it listens on.

    Raises:
        ValueError: no secret, or one that is not hex or shorter than 16 bytes.
        OSError: the address cannot be bound (e.g. the port is taken).

    Example:
        >>> from tfring.runner import start_rendezvous, wire
        >>> secret = wire.generate_secret()
        >>> server, addr, port = start_rendezvous("0.0.0.0", 29400, secret)
        >>> # each rank: TFRING_RENDEZVOUS_ADDR=<this host> TFRING_RENDEZVOUS_PORT=29400
        >>> #            TFRING_SECRET=wire.encode_secret(secret) TFRING_SIZE=...
        >>> server.stop()
    """
    from tfring._store import rendezvous, wire
    if isinstance(secret, str):
        secret = wire.decode_secret(secret, "the secret")
    server = rendezvous.start_server(host, port, secret)
    addr, bound_port = server.address
    return server, addr, bound_port
