"""Finds and loads tfring's one shared object.

The same file is both a TensorFlow op library and the pybind11 module
``_tfring_ops``. It must be loaded exactly once, in this order:
``tf.load_op_library`` first (registering the ops and their Python wrappers),
then the Python import of the same path. A second copy from another path
would abort the process with "Op ... ALREADY_EXISTS".

``TFRING_LIBRARY`` (alias ``HOROVOD_LIBRARY``) points at another build of the
library, e.g. the one Bazel produced. Without it, the library comes from the
install or, when that was not built for the running TensorFlow, from the
per-TF-version build cache (:mod:`tfring.build.library`).
"""
import ctypes
import importlib.util
import os
import sys
import threading

_lock = threading.Lock()
_loaded = None  # (op_module, core_module)

REBUILD_HINT = (
    "Without TFRING_LIBRARY, tfring builds its library for the running TensorFlow by itself "
    "(into ~/.cache/tfring or $TFRING_CACHE_DIR); to rebuild the installed copy instead, run "
    "`pip install --no-build-isolation --force-reinstall --no-deps .` in the tfring source tree.")


def library_path():
    """Returns the path of the op library to load, building it first if there
    is none for the running TensorFlow.

    Order: ``TFRING_LIBRARY``; the library installed next to the package if it
    was built for this TensorFlow (or carries no record, as a Bazel build
    does); else the per-TF-version cache, compiled there on first use.

    Raises:
        ImportError: ``TFRING_LIBRARY`` names no file, or the build failed
            (a :class:`tfring.build.library.BuildError` naming the cause).
    """
    override = os.environ.get("TFRING_LIBRARY") or os.environ.get("HOROVOD_LIBRARY")
    if override:
        if not os.path.exists(override):
            raise ImportError(f"TFRING_LIBRARY points at {override}, which does not exist.")
        return override
    import tensorflow as tf

    from tfring.build import library
    packaged = library.packaged_library()
    if packaged is not None:
        built_for = library.packaged_tf_version()
        if built_for is None or built_for == tf.__version__:
            return packaged
    return library.ensure_library(tf)


def _preload_mpi():
    """Makes libmpi resolvable however the library was built (wheel, in place, Bazel)."""
    from tfring.build import library
    try:
        prefix = library.mpi_prefix()
    except library.ToolMissingError:
        return  # a library built some other way may find its MPI itself
    for name in ("libmpi.so.12", "libmpi.so"):
        path = os.path.join(prefix, "lib", name)
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return


def load():
    """Loads the library once; returns (op_module, core_module)."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        import tensorflow as tf

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
