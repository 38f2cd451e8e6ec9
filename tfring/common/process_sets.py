"""Process sets: subsets of ranks that run their own collectives.

Adding or removing a set is collective: every rank of the job must make the
same call in the same order, members or not, so that all of them agree on
the new set's id.

A set belongs to the binding whose core registered it: ``binding`` is a
module or object with ``_core()``, ``raise_for_status(code, message, cause, rank)`` and
``_require_init()``. The default is tfring.common.status (TensorFlow's);
tfring.core passes its own, so that nothing here imports TensorFlow for it.
"""
from tfring.common import status


class ProcessSet:
    """A group of ranks with its own collectives.

    Args:
        ranks_or_comm: the job-wide ranks in the set (any order), or an mpi4py
            communicator whose members form the set.

    Example:
        >>> evens = hvd.add_process_set([0, 2])
        >>> if evens.included():
        ...     hvd.allreduce(x, process_set=evens)
    """

    def __init__(self, ranks_or_comm):
        if hasattr(ranks_or_comm, "Get_group"):
            from mpi4py import MPI
            group = ranks_or_comm.Get_group()
            world = MPI.COMM_WORLD.Get_group()
            ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
        else:
            ranks = ranks_or_comm
        self.ranks = sorted(int(r) for r in ranks)
        self.process_set_id = None
        self._binding = status

    def _info(self):
        if self.process_set_id is None:
            raise ValueError(
                f"{self!r} has not been registered; call hvd.add_process_set() on every rank "
                "first (or pass it to hvd.init(process_sets=[...])).")
        self._binding._require_init()
        registered_id(self)
        code, message, cause, rank_of, rank, ranks = self._binding._core().process_set_info(
            self.process_set_id)
        self._binding.raise_for_status(code, message, cause, rank_of)
        return rank, ranks

    def size(self):
        """Number of ranks in the set."""
        return len(self._info()[1])

    def rank(self):
        """This process's rank within the set, or -1 if it is not a member."""
        return self._info()[0]

    def included(self):
        """True if this process is a member of the set."""
        return self.rank() >= 0

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0); always registered."""

    def __init__(self, binding=status):
        super().__init__([])
        self.process_set_id = 0
        self._binding = binding

    def _info(self):
        rank, ranks = super()._info()
        self.ranks = list(ranks)
        return rank, ranks


global_process_set = _GlobalProcessSet()


def registered_id(process_set):
    """The id of a set this job knows, for a collective to use.

    Raises:
        ValueError: the set was never added, was removed, or was added before
            a shutdown() (Horovod raises ValueError for an unknown set too).
    """
    ps_id = process_set.process_set_id
    if ps_id is None:
        raise ValueError(f"{process_set!r} is not registered; call hvd.add_process_set() first.")
    # The global set always exists while tfring runs; other ids are checked
    # against the core's table, so a stale id fails here and not in the kernel.
    if ps_id != 0 and ps_id not in process_set._binding._core().process_set_ids():
        raise ValueError(
            f"{process_set!r} is not registered: this job has no process set with id {ps_id} "
            "(it was removed, or never added with hvd.add_process_set() on every rank).")
    return ps_id


def add_process_set(process_set, binding=status):
    """Registers a process set on every rank (collective over the whole job).

    Args:
        process_set: a ProcessSet, a list of ranks, or an mpi4py communicator.
        binding: whose core registers it (see the module docstring).

    Returns:
        The registered ProcessSet, with its process_set_id set.

    Raises:
        tf.errors.FailedPreconditionError: ranks disagree on the set, or a rank
            is out of range.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set!r} is already registered.")
    code, message, cause, rank, new_id = binding._core().add_process_set(
        list(process_set.ranks))
    binding.raise_for_status(code, message, cause, rank)
    process_set.process_set_id = new_id
    process_set._binding = binding
    return process_set


def remove_process_set(process_set):
    """Removes a registered set on every rank (collective). Returns True if it was removed."""
    if process_set.process_set_id in (None, 0):
        return False
    code = process_set._binding._core().remove_process_set(process_set.process_set_id)[0]
    if code != 0:
        return False
    process_set.process_set_id = None
    return True
