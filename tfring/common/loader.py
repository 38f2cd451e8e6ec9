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
    does) from the C++ sources the package has now; else the per-TF-version
    cache, compiled there on first use.

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

    from tfring.build import cache
    packaged = cache.packaged_library()
    if packaged is not None and cache.packaged_library_is_current(tf.__version__):
        return packaged
    return cache.ensure_library(tf)


def _needed_libraries(path):
    """The DT_NEEDED names of a 64-bit little-endian ELF shared object (what
    `readelf -d` lists as NEEDED); empty when the file is not one."""
    import struct
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    needed = []
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 6 or not entsize:  # SHT_DYNAMIC
            continue
        strtab_offset = sections[link][4]
        for i in range(size // entsize):
            tag, value = struct.unpack_from("<qQ", data, offset + i * entsize)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab_offset + value)
                needed.append(data[strtab_offset + value:end].decode())
    return needed


def _preload_mpi(path):
    """Makes libmpi resolvable however the library was built (wheel, in place,
    Bazel), when the library at `path` needs it: one built with
    TFRING_WITH_MPI=0 must not pull MPI into the process."""
    if not any(name.startswith("libmpi") for name in _needed_libraries(path)):
        return
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
        _preload_mpi(path)
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
