"""The core library's handle, and its statuses raised as the ``tf.errors``
types Horovod users expect, carrying the failure's cause and rank
(:mod:`tfring.common.tf_errors`). Below basics (lifecycle) and process_sets,
which both reach the core through here."""
from tfring.common import loader

# Core status codes (tf_ops/common/status.h StatusCode).
_OK, _UNKNOWN, _PRECONDITION, _ABORTED, _INVALID_ARGUMENT = 0, 1, 2, 3, 4
# Core failure causes used from Python (status.h FailureCause).
CAUSE_UNKNOWN, CAUSE_INVALID_ARGUMENT = 1, 5


def _core():
    return loader.load()[1]


def raise_for_status(code, message, cause=CAUSE_UNKNOWN, rank=-1):
    """Raises the tf.errors exception for a core status (no-op for OK): a
    :mod:`tfring.common.tf_errors` type with ``.cause`` and ``.rank``."""
    if code == _OK:
        return
    from tfring.common import tf_errors
    raise tf_errors.from_core(code, message, cause, rank)


def _check(result):
    """Raises for a core call's (code, message, cause, rank, values...)
    tuple; returns the values."""
    raise_for_status(*result[:4])
    return result[4:] if len(result) > 4 else None


def _require_init():
    _check(_core().check_initialized())
