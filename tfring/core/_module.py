"""Loads ``_tfring_core`` without TensorFlow.

``TFRING_CORE_LIBRARY`` names a built module to load; otherwise it is built
from the sources on first use into the cache (tfring/build/core_module.py)
and loaded from there. The module is an independent copy of the core: a
process uses either it (tfring.core) or the TF op library
(tfring.tensorflow), and never both for one job.
"""
import importlib.util
import os
import sys
import threading

_lock = threading.Lock()
_module = None


def path():
    """The path of the module to load, building it first if needed.

    Raises:
        ImportError: ``TFRING_CORE_LIBRARY`` names no file, or the build
            failed (the message names the cause).
    """
    override = os.environ.get("TFRING_CORE_LIBRARY")
    if override:
        if not os.path.exists(override):
            raise ImportError(f"TFRING_CORE_LIBRARY points at {override}, which does not exist.")
        return override
    from tfring.build import core_module
    return core_module.ensure_module()


def loaded():
    """Whether the module was loaded in this process."""
    return _module is not None


def load():
    """The ``_tfring_core`` module, loaded once."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        from tfring.common import loader
        where = path()
        loader._preload_mpi(where)
        spec = importlib.util.spec_from_file_location("tfring._tfring_core", where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["tfring._tfring_core"] = module
        _module = module
        return module
