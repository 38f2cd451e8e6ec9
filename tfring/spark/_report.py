"""How a rank of a ``tfring.spark`` job tells the driver why it failed:
its pickled exception, written to the job's rendezvous store. Used by the
rank's own process (:mod:`tfring.spark._task_main`, which must not be
imported by the package: it runs with ``python -m``) and by the Spark task.
"""
import time

from pyspark import cloudpickle

# The largest pickled exception sent back whole (the store's frames are 1 MB).
MAX_ERROR_BYTES = 512 << 10
SCOPE = "tfring-spark"
ERROR_PREFIX = "error/"


def pickled(error):
    """`error` pickled, or None when it cannot travel (or is too large)."""
    try:
        payload = cloudpickle.dumps(error)
    except Exception:  # noqa: BLE001 - an exception that cannot be pickled
        return None
    return payload if len(payload) <= MAX_ERROR_BYTES else None


def report_failure(env, pid, payload, summary, text, collateral=False):
    """Writes a rank's failure to the job's store (``error/<rank>``), where
    the driver finds it after the Spark job failed. Best effort: the task's
    own failure still fails the job. `collateral`: the failure is an echo of
    another rank's (its cause says a peer failed or left), not the cause."""
    from tfring._store import rendezvous, wire
    rank = int(env["TFRING_RANK"])
    report = {"rank": rank, "host": env.get("TFRING_HOSTNAME", "?"), "pid": pid,
              "payload": payload, "summary": summary, "traceback": text, "time": time.time(),
              "collateral": bool(collateral)}
    data = cloudpickle.dumps(report)
    if len(data) > wire.MAX_FRAME - 4096:
        report["payload"], report["traceback"] = None, text[-4000:]
        data = cloudpickle.dumps(report)
    try:
        with rendezvous.RendezvousClient(env["TFRING_RENDEZVOUS_ADDR"],
                                         int(env["TFRING_RENDEZVOUS_PORT"]),
                                         wire.decode_secret(env[wire.SECRET_ENV])) as client:
            client.set(SCOPE, f"{ERROR_PREFIX}{rank}", data)
    except (OSError, wire.WireError):
        pass
