"""Finds and loads tfring's one shared object.

The same file is both a TensorFlow op library and the pybind11 module
``_tfring_ops``. It must be loaded exactly once, in this order:
``tf.load_op_library`` first (registering the ops and their Python wrappers),
then the Python import of the same path. A second copy from another path
would abort the process with "Op ... ALREADY_EXISTS".

``TFRING_LIBRARY`` (alias ``HOROVOD_LIBRARY``) points at another build of the
library, e.g. the one Bazel produced.
"""
import ctypes
import glob
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import threading

_lock = threading.Lock()
_loaded = None  # (op_module, core_module)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REBUILD_HINT = (
    "Rebuild tfring against the installed TensorFlow: from the tfring source tree run "
    "`pip install --no-build-isolation --force-reinstall --no-deps .` "
    "(or `pip install --no-build-isolation -e .` for a development checkout).")


def library_path():
    """Returns the path of the op library to load."""
    override = os.environ.get("TFRING_LIBRARY") or os.environ.get("HOROVOD_LIBRARY")
    if override:
        if not os.path.exists(override):
            raise ImportError(f"TFRING_LIBRARY points at {override}, which does not exist.")
        return override
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = os.path.join(_PACKAGE_DIR, "_tfring_ops" + suffix)
        if os.path.exists(candidate):
            return candidate
    found = glob.glob(os.path.join(_PACKAGE_DIR, "_tfring_ops*.so"))
    if found:
        return found[0]
    raise ImportError(
        "tfring's op library (_tfring_ops) was not found next to the tfring package in "
        f"{_PACKAGE_DIR}. It is built at install time. " + REBUILD_HINT)


def _preload_mpi():
    """Makes libmpi resolvable however the library was built (wheel, in place, Bazel)."""
    prefix = sysconfig.get_paths()["data"]
    for name in ("libmpi.so.12", "libmpi.so"):
        path = os.path.join(prefix, "lib", name)
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return


def _check_build_info():
    import tensorflow as tf
    try:
        from tfring import _build_info
    except ImportError:
        return  # A library built outside setup.py (Bazel) carries no record.
    if os.environ.get("TFRING_LIBRARY") or os.environ.get("HOROVOD_LIBRARY"):
        return
    if _build_info.TF_VERSION != tf.__version__:
        raise ImportError(
            f"tfring was built against TensorFlow {_build_info.TF_VERSION}, but TensorFlow "
            f"{tf.__version__} is installed; the op library is not compatible across TF "
            "releases. " + REBUILD_HINT)


def load():
    """Loads the library once; returns (op_module, core_module)."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        import tensorflow as tf

        _check_build_info()
        path = library_path()
        _preload_mpi()
        try:
            ops = tf.load_op_library(path)
        except tf.errors.NotFoundError as exc:
            raise ImportError(
                f"Loading tfring's op library {path} failed: {exc}. This usually means it was "
                "built for another TensorFlow. " + REBUILD_HINT) from exc
        spec = importlib.util.spec_from_file_location("tfring._tfring_ops", path)
        core = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(core)
        sys.modules["tfring._tfring_ops"] = core
        _loaded = (ops, core)
        return _loaded
