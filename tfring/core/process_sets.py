"""Process sets for tfring.core: tfring.common.process_sets over this
binding's core (no TensorFlow).

Example:
    >>> evens = hvd.add_process_set([0, 2])
    >>> if evens.included():
    ...     hvd.allreduce(x, process_set=evens)
    >>> hvd.remove_process_set(evens)
"""
import numbers
import types

from tfring.common import process_sets as _sets
from tfring.core import errors, lifecycle, names

_BINDING = types.SimpleNamespace(_core=lifecycle._core, raise_for_status=errors.raise_for_status,
                                 _require_init=lifecycle._require_init)

ProcessSet = _sets.ProcessSet
# Every rank of the job (id 0).
global_process_set = _sets._GlobalProcessSet(_BINDING)


def add_process_set(process_set):
    """Registers a process set on every rank (a collective over the whole
    job: every rank makes the same call, members or not).

    Args:
        process_set: a ProcessSet, a list of job-wide ranks, or an mpi4py
            communicator.

    Returns:
        The registered ProcessSet (``.rank()``, ``.size()``, ``.included()``).

    Raises:
        PreconditionError: the ranks disagree on the set, or a rank is out of
            range.
        ValueError: the set is registered already.
    """
    process_set = _sets.add_process_set(process_set, _BINDING)
    # Its calls are counted from 0 on every rank, whatever an earlier set
    # with the same id counted.
    names.forget(process_set.process_set_id)
    return process_set


def remove_process_set(process_set):
    """Removes a registered set on every rank (collective).

    Returns:
        True if it was removed.
    """
    return _sets.remove_process_set(process_set)


def process_set_id(process_set):
    """The core's id of ``process_set``: None (every rank), an id, or a
    registered ProcessSet.

    Raises:
        ValueError: a set that is not (or no longer) registered.
    """
    if process_set is None:
        return 0
    if isinstance(process_set, ProcessSet):
        return _sets.registered_id(process_set)
    if isinstance(process_set, numbers.Integral):
        return int(process_set)
    raise ValueError(f"process_set={process_set!r}: use a ProcessSet from add_process_set(), "
                     "its id, or None for every rank")
