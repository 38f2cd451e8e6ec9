"""``tfring.tensorflow.keras`` is ``tfring.keras``: the same module object.

Horovod's Keras examples import ``horovod.tensorflow.keras as hvd``; with
tfring that path must give the one Keras module, not a copy whose classes and
state would differ from ``tfring.keras``'s. Importing this module therefore
replaces itself in ``sys.modules`` with ``tfring.keras`` (the import system
returns whatever ``sys.modules`` holds once a module has run), and registers
each ``tfring.keras.X`` submodule as ``tfring.tensorflow.keras.X`` so that
``import tfring.tensorflow.keras.callbacks`` finds it instead of loading the
file a second time.

Example:
    >>> import tfring.tensorflow.keras as hvd
    >>> import tfring.keras
    >>> assert hvd is tfring.keras
"""
import importlib
import pkgutil
import sys

import tfring.keras as _keras

for _info in pkgutil.iter_modules(_keras.__path__):
    sys.modules[f"{__name__}.{_info.name}"] = importlib.import_module(
        f"{_keras.__name__}.{_info.name}")

sys.modules[__name__] = _keras
