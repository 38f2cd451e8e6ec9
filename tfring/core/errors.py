"""The exceptions tfring.core raises: each carries the core's status code
(``.code``, tf_ops/common/status.h) and is also the built-in type Horovod
users catch.

=====================  ====================  ===================================
core status            exception             also a
=====================  ====================  ===================================
INVALID_ARGUMENT (4)   InvalidArgumentError  ValueError: bad input on this rank
PRECONDITION (2)       PreconditionError     RuntimeError: ranks disagree (shape,
                                             dtype, root...), or the job stopped
(before init())        NotInitializedError   PreconditionError and ValueError
ABORTED (3)            AbortedError          HorovodInternalError (RuntimeError):
                                             a rank died or shut down
UNKNOWN (1)            UnknownError          HorovodInternalError
=====================  ====================  ===================================

Example:
    >>> try:
    ...     hvd.allreduce(x)
    ... except hvd.HorovodInternalError as e:  # a peer was lost
    ...     print(e.code, e)
"""
from tfring.common.exceptions import (HorovodInternalError, TfringError, cause_from_core,
                                     failure_payloads)

OK, UNKNOWN, PRECONDITION, ABORTED, INVALID_ARGUMENT = 0, 1, 2, 3, 4
# The core's FailureCause for "unknown" (status.h): what a status without one says.
_CAUSE_UNKNOWN = 1


class CoreError(TfringError, RuntimeError):
    """A failed core call. ``code`` is the core's status code and
    ``message`` its message (also ``str(e)``); ``.cause`` (a
    tfring.common.exceptions.Cause) says why, and ``.rank`` names the failing
    rank where there is one (docs/errors.md)."""

    code = UNKNOWN

    def __init__(self, message, code=None, cause=_CAUSE_UNKNOWN, rank=-1):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        # Where TfringError's .cause and .rank read them (as from TF's errors).
        self.experimental_payloads = failure_payloads(cause_from_core(cause),
                                                      None if rank < 0 else rank)


class InvalidArgumentError(CoreError, ValueError):
    """A bad argument this rank found by itself (dtype, splits, process set,
    a GPU array in a build without GPU support, ...)."""

    code = INVALID_ARGUMENT


class PreconditionError(CoreError):
    """The ranks disagree about a collective (shapes, dtypes, root rank,
    operation), or the job cannot take collectives now."""

    code = PRECONDITION


class NotInitializedError(PreconditionError, ValueError):
    """A call that needs init() came before it (a ValueError, as in Horovod)."""


class AbortedError(CoreError, HorovodInternalError):
    """The collective was ended because a rank failed or shut down; the
    message names the rank and why, where that is known."""

    code = ABORTED


class UnknownError(CoreError, HorovodInternalError):
    """Any other failure of a collective."""

    code = UNKNOWN


_BY_CODE = {INVALID_ARGUMENT: InvalidArgumentError, PRECONDITION: PreconditionError,
            ABORTED: AbortedError, UNKNOWN: UnknownError}


def raise_for_status(code, message, cause=_CAUSE_UNKNOWN, rank=-1):
    """Raises the exception of a core status (nothing for OK): the core's
    (code, message, cause, rank), as its calls return them.

    Raises:
        CoreError: the subclass for ``code`` (UnknownError for a code this
            table does not know), with ``.code``, ``.cause`` and ``.rank``.
    """
    if code == OK:
        return
    raise _BY_CODE.get(code, UnknownError)(message, code, cause, rank)
