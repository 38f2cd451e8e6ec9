"""Exceptions of elastic training, under the names Horovod users import
(``horovod.common.exceptions``).

Example:
    >>> from tfring.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
"""


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
