"""The ``tf.errors`` types tfring raises, carrying why the call failed.

Each is a subclass of the TensorFlow error Horovod users catch, and of
:class:`~tfring.common.exceptions.TfringError` (``.cause`` and ``.rank``);
an ``AbortedError`` (the job as formed cannot go on) is also a
:class:`~tfring.common.exceptions.HorovodInternalError`, which elastic
training recovers from. The cause and rank travel in the exception's
``experimental_payloads``, where TensorFlow also puts them for an error it
raises itself from a tfring op (inside a tf.function, a Keras step, a TF1
session): :func:`failure_of` reads either, and :func:`typed` turns the
latter into the former.

Example:
    >>> from tfring.common.tf_errors import failure_of
    >>> try:
    ...     train_step()            # a tf.function with collectives
    ... except tf.errors.OpError as e:
    ...     cause, rank = failure_of(e)
"""
import tensorflow as tf

from tfring.common.exceptions import (FAILURE_PAYLOAD, Cause, HorovodInternalError, TfringError,
                                      encode_failure, failure_of, failure_payloads)


class _Typed(TfringError):
    # The payloads are an __init__ argument by name, so that OpError's
    # __reduce__ (which rebuilds from __init__'s argument names) pickles the
    # cause and rank too: Ray and Spark send exceptions between processes.
    def __init__(self, node_def, op, message, experimental_payloads=None):
        super().__init__(node_def, op, message, experimental_payloads or {})


class AbortedError(_Typed, tf.errors.AbortedError, HorovodInternalError):
    """The job as formed cannot go on: a peer failed or left, it was shut
    down, or a stall timed out (``.cause`` says which)."""


class FailedPreconditionError(_Typed, tf.errors.FailedPreconditionError):
    """Ranks disagree (``Cause.MISMATCH``), tfring is not running on this
    rank, or a setting stops it starting."""


class InvalidArgumentError(_Typed, tf.errors.InvalidArgumentError):
    """A bad argument on this rank."""


class UnknownError(_Typed, tf.errors.UnknownError):
    """An internal error."""


# The core's status codes (tf_ops/common/status.h StatusCode).
_BY_CORE_CODE = {2: FailedPreconditionError, 3: AbortedError, 4: InvalidArgumentError}
_BY_TF_TYPE = ((tf.errors.AbortedError, AbortedError),
               (tf.errors.FailedPreconditionError, FailedPreconditionError),
               (tf.errors.InvalidArgumentError, InvalidArgumentError),
               (tf.errors.UnknownError, UnknownError))


def from_core(code, message, cause_number, rank):
    """The exception for a failed core status (code non-zero)."""
    cls = _BY_CORE_CODE.get(code, UnknownError)
    return cls(None, None, message, {FAILURE_PAYLOAD: encode_failure(cause_number, rank)})


def typed(exc):
    """`exc`, a ``tf.errors`` exception TensorFlow raised from a tfring op,
    as the matching tfring type (with ``.cause`` and ``.rank``); any other
    exception unchanged."""
    found = failure_of(exc)
    if isinstance(exc, TfringError) or not isinstance(exc, tf.errors.OpError) or found is None:
        return exc
    for tf_type, ours in _BY_TF_TYPE:
        if isinstance(exc, tf_type):
            typed_exc = ours(exc.node_def, exc.op, exc.message, failure_payloads(*found))
            typed_exc.__traceback__ = exc.__traceback__
            return typed_exc
    return exc


__all__ = ["AbortedError", "FailedPreconditionError", "InvalidArgumentError", "UnknownError",
           "Cause", "failure_of", "typed", "from_core"]
