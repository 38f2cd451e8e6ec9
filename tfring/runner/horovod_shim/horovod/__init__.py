"""``horovod`` as tfring, for ``tfringrun --horovod-compat`` (see
tfring/runner/horovod_compat.py): this directory is first on the ranks'
PYTHONPATH only under that flag."""
import sys as _sys

from tfring.runner import horovod_compat as _compat

_compat.install(_sys.modules[__name__])
