"""Exceptions of elastic training, under the names Horovod users import
(``horovod.common.exceptions``), and why a collective failed: its
:class:`Cause` and the rank it names, which every error tfring raises carries
as ``.cause`` and ``.rank`` (see docs/errors.md). Free of TensorFlow: the
``tf.errors`` types that carry them are in :mod:`tfring.common.tf_errors`.

Example:
    >>> from tfring.common.exceptions import Cause, HorovodInternalError
    >>> try:
    ...     hvd.allreduce(x)
    ... except tf.errors.AbortedError as e:
    ...     if e.cause is Cause.PEER_FAILURE:
    ...         print("rank", e.rank, "is gone")
"""
import enum

# The TF status payload, and the Python exceptions' experimental_payloads
# key, holding a failure's cause and rank ("CAUSE RANK", the core's numbers:
# tf_ops/common/status.h FailureCause). tf_ops/tensorflow/kernels.cc sets it.
FAILURE_PAYLOAD = "tfring.failure"


class Cause(str, enum.Enum):
    """Why a collective (or init, shutdown, a process-set call) failed.

    A str, so ``e.cause == "peer_failure"`` works too.
    """

    UNKNOWN = "unknown"
    """An internal error (an allocation, a malformed message)."""
    SHUTDOWN = "shutdown"
    """A rank called shutdown() or its script ended; ``.rank`` names it."""
    PEER_FAILURE = "peer_failure"
    """A peer died, left, went silent or broke the protocol; ``.rank`` names
    it when known."""
    MISMATCH = "mismatch"
    """Ranks asked for different things (shape, dtype, operation, ...)."""
    INVALID_ARGUMENT = "invalid_argument"
    """A bad argument or setting on this rank."""
    TIMEOUT = "timeout"
    """A stall past TFRING_STALL_SHUTDOWN_TIME_SECONDS, or a start-up that
    did not complete in time."""
    NOT_INITIALIZED = "not_initialized"
    """tfring is not running on this rank (before init(), after shutdown())."""

    def __str__(self):
        return self.value

    @property
    def ends_job(self):
        """True when the job as formed cannot go on (a peer failed or left, or
        the job was stopped): under elastic training it re-forms."""
        return self in (Cause.SHUTDOWN, Cause.PEER_FAILURE, Cause.TIMEOUT)


# The core's FailureCause numbers, in order (0 is NONE: no failure).
_CORE_CAUSES = (None, Cause.UNKNOWN, Cause.SHUTDOWN, Cause.PEER_FAILURE, Cause.MISMATCH,
                Cause.INVALID_ARGUMENT, Cause.TIMEOUT, Cause.NOT_INITIALIZED)


def cause_from_core(number):
    """The :class:`Cause` for the core's FailureCause number (UNKNOWN for
    one this version does not know)."""
    if 0 < number < len(_CORE_CAUSES):
        return _CORE_CAUSES[number]
    return Cause.UNKNOWN


def encode_failure(cause_number, rank):
    """The payload value for a failure: what the TF kernels attach."""
    return f"{int(cause_number)} {int(rank)}".encode()


def failure_payloads(cause, rank):
    """The payloads that carry (cause, rank), as :func:`failure_of` returns them."""
    return {FAILURE_PAYLOAD: encode_failure(_CORE_CAUSES.index(cause),
                                            -1 if rank is None else rank)}


def failure_from_payloads(payloads):
    """(cause, rank) from an exception's ``experimental_payloads``; None when
    it carries no tfring failure (an error of TensorFlow's own). ``rank`` is
    None when the failure names no rank."""
    # TensorFlow hands payloads over with bytes keys; tfring's own use str.
    payloads = payloads or {}
    value = payloads.get(FAILURE_PAYLOAD, payloads.get(FAILURE_PAYLOAD.encode()))
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    try:
        number, rank = (int(part) for part in value.split())
    except ValueError:
        return Cause.UNKNOWN, None
    return cause_from_core(number), (rank if rank >= 0 else None)


def failure_of(exc):
    """(cause, rank) of a failure tfring reported, else None (an exception
    tfring did not raise, or a TensorFlow error of another op). ``rank`` is
    None when the failure names no rank. Reads the exception's
    ``experimental_payloads`` without importing TensorFlow.

    Args:
        exc: any exception.

    Returns:
        A (:class:`Cause`, int or None) pair, or None.

    Example:
        >>> failure_of(error)
        (<Cause.PEER_FAILURE: 'peer_failure'>, 2)
    """
    found = failure_from_payloads(getattr(exc, "experimental_payloads", None))
    context = getattr(exc, "__context__", None)
    if found is None and context is not None and \
            getattr(context, "error_code", None) == getattr(exc, "error_code", False):
        # A TF1 session re-raises the op's error as a new one of the same
        # type, without its payloads, while handling it: the original is
        # its context.
        found = failure_from_payloads(getattr(context, "experimental_payloads", None))
    return found


def ends_job(exc):
    """True when `exc` is a collective's failure because the job as formed
    cannot go on (a peer failed or left, the job was stopped): on most ranks
    an echo of what went wrong elsewhere, not the cause.

    Args:
        exc: any exception.

    Returns:
        bool.
    """
    found = failure_of(exc)
    return found is not None and found[0].ends_job


class TfringError(Exception):
    """What every error tfring raises for a failed collective, init or
    process-set call has besides its ``tf.errors`` type: ``.cause`` (a
    :class:`Cause`) and ``.rank`` (the failing rank, or the rank that shut
    the job down; None when there is none). The classes that use it are in
    :mod:`tfring.common.tf_errors`; an error TensorFlow raised itself from a
    tfring op carries the same in its ``experimental_payloads``
    (``tfring.common.tf_errors.failure_of`` reads either).
    """

    @property
    def cause(self):
        found = failure_of(self)
        return found[0] if found else Cause.UNKNOWN

    @property
    def rank(self):
        found = failure_of(self)
        return found[1] if found else None


class HorovodInternalError(RuntimeError):
    """Communication with a peer broke (a rank was lost): under
    ``elastic.run`` the state is restored to its last commit and the job
    re-forms without the lost ranks."""


class HostsUpdatedInterrupt(RuntimeError):
    """The elastic driver published a new membership (hosts or slots were
    added or removed): under ``elastic.run`` the job re-forms at the current
    state, without a rollback.

    Args:
        skip_sync: accepted for Horovod compatibility; tfring always
            broadcasts the state after re-forming, since new workers need it.
    """

    def __init__(self, skip_sync=False):
        super().__init__("the elastic driver published new hosts")
        self.skip_sync = skip_sync


class WorkerRemovedInterrupt(SystemExit):
    """This worker is not part of the job any more (its host or slot was
    removed by the discovery script): it leaves with exit code 0."""

    def __init__(self, message):
        super().__init__(0)
        self.message = message
