"""``tfringrun --horovod-compat``: Horovod scripts run unchanged on tfring.

tfringrun puts :data:`SHIM_DIR` first on the ranks' ``PYTHONPATH``. It holds
one tiny package, ``horovod``, whose ``__init__`` calls :func:`install`:
``horovod`` then stands for ``tfring`` (``horovod.run`` is
:func:`tfring.run`), and a finder on ``sys.meta_path`` answers every
``horovod.X`` import with a stand-in module for the matching tfring module:

============================  ==========================
``horovod.tensorflow[.X]``    ``tfring.tensorflow[.X]``
``horovod.tensorflow.keras``  ``tfring.keras`` (so
``[.X]``                      ``...keras.callbacks`` too)
``horovod.keras[.X]``         ``tfring.keras[.X]``
``horovod.X`` (other)         ``tfring.X``
``horovod.torch[.X]``         ImportError: not provided yet
============================  ==========================

A stand-in is a module of its own that forwards attribute look-ups to the
tfring module (so classes and functions are tfring's own objects), rather
than the tfring module registered under a second name: the import system
sets each submodule as an attribute of its parent, which would otherwise
write ``horovod``'s names into tfring's modules.

It is never on by default, and tfringrun refuses it where a real Horovod
is importable (:func:`tfring.runner.preflight.check`): two packages named ``horovod`` would
make which one a rank gets depend on the path order.
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys
import types

SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_shim")
_PREFIXES = (("horovod.tensorflow.keras", "tfring.keras"), ("horovod.keras", "tfring.keras"),
             ("horovod", "tfring"))
_NOT_YET = ("horovod.torch", "horovod.mxnet")


def target_of(name):
    """The tfring module that ``horovod`` module `name` stands for.

    Raises:
        ImportError: a Horovod framework tfring does not provide.
    """
    for missing in _NOT_YET:
        if name == missing or name.startswith(missing + "."):
            raise ImportError(
                f"{name} is not provided by tfring (yet): tfringrun --horovod-compat maps "
                "horovod.tensorflow, horovod.keras and horovod.run to tfring, which is for "
                f"TensorFlow; a {missing.split('.')[1]} script needs Horovod itself", name=name)
    for prefix, target in _PREFIXES:
        if name == prefix or name.startswith(prefix + "."):
            return target + name[len(prefix):]
    return None


class _StandIn(types.ModuleType):
    """``horovod.X``: forwards to its tfring module."""

    def __init__(self, name, target):
        super().__init__(name, target.__doc__)
        object.__setattr__(self, "_tfring_target", target)
        if hasattr(target, "__path__"):
            self.__path__ = []  # a package: its submodules come through the finder too

    def __getattr__(self, attr):
        return getattr(self._tfring_target, attr)

    def __dir__(self):
        return sorted(set(dir(self._tfring_target)) | set(self.__dict__))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if not name.startswith("horovod."):
            return None
        real = target_of(name)
        try:
            if real is None or importlib.util.find_spec(real) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        return _StandIn(spec.name, importlib.import_module(target_of(spec.name)))

    def exec_module(self, module):
        pass


def install(horovod_module):
    """Makes `horovod_module` (the shim's ``horovod``) stand for tfring and
    puts the finder for its submodules first on ``sys.meta_path``."""
    import tfring
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    horovod_module.__getattr__ = lambda attr: getattr(tfring, attr)
    horovod_module.run = tfring.run
    horovod_module.__version__ = tfring.__version__


def rank_env(env=None):
    """``PYTHONPATH`` for the ranks, with the shim first."""
    current = (env or os.environ).get("PYTHONPATH", "")
    parts = [SHIM_DIR] + [p for p in current.split(os.pathsep) if p and p != SHIM_DIR]
    return {"PYTHONPATH": os.pathsep.join(parts)}
