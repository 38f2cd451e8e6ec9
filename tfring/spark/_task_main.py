"""One rank of a ``tfring.spark.run`` job, in a process of its own.

``python -m tfring.spark._task_main IN LEADING OUT``: IN holds the pickled
(fn, args, kwargs), LEADING a pickled tuple of arguments that go first
(the rank's partition, read by the task); what fn returned, or the
exception it raised, is written to OUT. The Spark task that starts this process has already set
its environment (rank placement, rendezvous, secret). A process of its own
per run, not the task's reused Python worker: tfring's state (an ended job,
its scope counter) and TensorFlow's memory must not carry from one job to
the next.
"""
import os
import sys
import traceback

from pyspark import cloudpickle

from tfring.common.exceptions import ends_job
from tfring.spark._report import pickled, report_failure


def main(argv):
    source, first, target = argv[1], argv[2], argv[3]
    with open(source, "rb") as f:
        fn, args, kwargs = cloudpickle.load(f)
    with open(first, "rb") as f:
        leading = cloudpickle.load(f)
    try:
        outcome = ("ok", fn(*leading, *args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - handed to the driver, whatever it is
        text = traceback.format_exc()
        payload = pickled(e)
        outcome = ("error", (payload, f"{type(e).__name__}: {e}"[:2000], text[-20000:]))
        # Reported from here, while this rank is still in the job: its
        # peers fail only once it has gone, so the cause is in the store
        # before any echo of it.
        report_failure(os.environ, os.getpid(), *outcome[1], collateral=ends_job(e))
    try:
        data = cloudpickle.dumps(outcome)
    except Exception as e:  # noqa: BLE001 - a result that cannot travel
        data = cloudpickle.dumps(("error", (None, f"the result cannot be pickled: {e}",
                                            traceback.format_exc()[-20000:])))
    with open(target + ".tmp", "wb") as f:
        f.write(data)
    os.replace(target + ".tmp", target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
