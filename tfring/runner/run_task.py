"""The rank side of :func:`tfring.run`: ``python -m tfring.runner.run_task DIR``.

``tfring.run`` writes the function, its arguments and keyword arguments
(cloudpickled) to ``DIR/task.pkl`` in a directory only its user can read,
and launches this module on every rank through tfringrun. Each rank runs
the function and writes one record, ``DIR/result.<rank>``:

* ``("ok", value)`` when it returned, or
* ``("error", time, exception or None, type name, message, traceback text)``
  when it raised; the exception itself only where it pickles. The record is
  written before the exception is raised again, so that the rank still
  fails the way a script would (tfringrun stops the job; an elastic worker
  reports the error to its driver).

The rank is the one the function last ran as (``rank()`` while tfring is
initialized, the final round's under elastic training), else the one the
launcher gave the process. Records are written to a temporary name and
renamed, so the caller never reads half of one. An elastic worker then
tells its driver it finished, so that a non-zero exit after its function
returned fails the job (docs/elastic.md).
"""
import os
import pickle
import sys
import time
import traceback

TASK_FILE = "task.pkl"
RESULT_PREFIX = "result."


def _launch_rank():
    for name in ("TFRING_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(name)
        if value is not None:
            return int(value)
    return 0


def current_rank():
    """The rank this process runs as now; importing nothing new."""
    basics = sys.modules.get("tfring.common.basics")
    if basics is not None:
        try:
            if basics.is_initialized():
                return basics.rank()
        except Exception:  # noqa: BLE001 - a core that broke still has its launch rank
            pass
    return _launch_rank()


def _write(directory, rank, record):
    import cloudpickle
    path = os.path.join(directory, f"{RESULT_PREFIX}{rank}")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        cloudpickle.dump(record, f)
    os.replace(tmp, path)


def _error_record(exc):
    import cloudpickle
    try:
        payload = cloudpickle.dumps(exc)
        pickle.loads(payload)  # one that cannot come back is sent as text only
    except Exception:  # noqa: BLE001 - any pickling failure
        payload = None
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ("error", time.time(), payload, type(exc).__name__, str(exc), text)


def main(directory):
    try:
        with open(os.path.join(directory, TASK_FILE), "rb") as f:
            func, args, kwargs = pickle.load(f)
    except Exception as exc:  # noqa: BLE001 - reported to the caller, whatever it is
        # Typically a function of a module the ranks cannot import
        # (cloudpickle sends module functions by reference).
        _write(directory, _launch_rank(), _error_record(RuntimeError(
            f"tfring.run: the ranks cannot load the function: {type(exc).__name__}: {exc}. "
            "A function of a module that the ranks cannot import must be defined in "
            "__main__ or sent by value (cloudpickle.register_pickle_by_value(module))")))
        raise
    try:
        value = func(*args, **kwargs)
    except SystemExit:
        raise  # an elastic worker leaving, or the function's own exit: no result
    except BaseException as exc:
        _write(directory, current_rank(), _error_record(exc))
        raise
    try:
        _write(directory, current_rank(), ("ok", value))
    except Exception as exc:  # noqa: BLE001 - a result that cannot be pickled fails the rank
        _write(directory, current_rank(), _error_record(
            TypeError(f"tfring.run: the function's return value cannot be pickled: {exc}")))
        raise
    _report_finished()


def _report_finished():
    """An elastic worker whose function returned has finished: a non-zero
    exit from here on (an exit handler, a crash at teardown) fails the job
    instead of counting as a worker lost mid-training (docs/elastic.md)."""
    from tfring.common import elastic  # light: no framework
    if elastic.enabled():
        elastic.report_finished()


if __name__ == "__main__":
    main(sys.argv[1])
