"""The core library's handle, and its statuses raised as the ``tf.errors``
types Horovod users expect. Below basics (lifecycle) and process_sets, which
both reach the core through here."""
from tfring.common import loader

# Core status codes (tf_ops/common/status.h).
_OK, _UNKNOWN, _PRECONDITION, _ABORTED, _INVALID_ARGUMENT = 0, 1, 2, 3, 4


def _core():
    return loader.load()[1]


def raise_for_status(code, message):
    """Raises the tf.errors exception for a core status code (no-op for OK)."""
    if code == _OK:
        return
    import tensorflow as tf
    cls = {
        _PRECONDITION: tf.errors.FailedPreconditionError,
        _ABORTED: tf.errors.AbortedError,
        _INVALID_ARGUMENT: tf.errors.InvalidArgumentError,
    }.get(code, tf.errors.UnknownError)
    raise cls(None, None, message)


def _check(result):
    raise_for_status(result[0], result[1])
    return result[2:] if len(result) > 2 else None


def _require_init():
    _check(_core().check_initialized())
