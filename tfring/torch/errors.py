"""The errors of tfring.torch, as Horovod's PyTorch users catch them.

Horovod's torch binding raises :class:`HorovodInternalError` (a
RuntimeError) for every failed collective, ranks disagreeing included; so
does this one. A call before ``init()`` is a ValueError
(tfring.core.NotInitializedError), and bad input found on this rank alone
(a bad split, an unsupported dtype) a ValueError or TypeError, raised when
the collective is submitted.

Example:
    >>> try:
    ...     hvd.allreduce(x)
    ... except hvd.HorovodInternalError as e:
    ...     print(e.cause, e.rank)   # why, and the failed rank where known
"""
from tfring.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from tfring.core import errors as _core_errors
from tfring.core.errors import (AbortedError, CoreError, InvalidArgumentError,  # noqa: F401
                                NotInitializedError, UnknownError)


class PreconditionError(_core_errors.PreconditionError, HorovodInternalError):
    """The ranks disagree about a collective (shape, dtype, root, op): a
    HorovodInternalError, as in Horovod's torch binding. The job goes on."""


def translate(exc):
    """The exception tfring.torch raises for a tfring.core one: a
    disagreement between ranks becomes :class:`PreconditionError` (with the
    same message, ``.cause`` and ``.rank``); everything else is unchanged."""
    if (isinstance(exc, _core_errors.PreconditionError)
            and not isinstance(exc, (NotInitializedError, PreconditionError))):
        new = PreconditionError(exc.message, exc.code)
        new.experimental_payloads = exc.experimental_payloads
        return new
    return exc
