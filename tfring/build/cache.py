"""The per-TensorFlow-version cache of built op libraries, and which library
the running TensorFlow gets: the one installed next to the package when it
was built for this TensorFlow, else one from the cache, compiled there first
(by :mod:`tfring.build.library`) when it is missing.

The cache is ``~/.cache/tfring/`` or ``$TFRING_CACHE_DIR``; an entry's name
covers everything that makes two builds differ (:func:`cache_entry`), and a
file lock makes N ranks that start together build once.
"""
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
import time

from tfring.build import library
from tfring.build.library import LIBRARY_NAME, BuildError, _log

BUILD_INFO_NAME = "build_info.json"
_PACKAGE_DIR = library._PACKAGE_DIR


# ---------------------------------------------------------------------------
# The per-TF-version cache

def cache_dir():
    """$TFRING_CACHE_DIR, else $XDG_CACHE_HOME/tfring, else ~/.cache/tfring."""
    explicit = os.environ.get("TFRING_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tfring")


def _tfring_version():
    from tfring import __version__
    return __version__


def cache_entry(tf_version, root=None, variant="", label=None):
    """The cache directory for a build against ``tf_version`` of the sources
    under ``root``: ``<cache>/<tfring version>/tf<ver>-<python>-<arch>-<hash>``
    (``label`` replaces ``tf<ver>`` for a build that is not TensorFlow's).
    The hash covers the sources, the build recipe, ``variant`` (see
    :func:`build_variant`) and the compiler (:func:`compiler_identity`), so
    an edited source, a GPU build or another compiler gets an entry of its
    own."""
    root = root or library.source_root()
    key = hashlib.sha256(f"{library.source_digest(root)}|{library.RECIPE_VERSION}|{variant}|"
                         f"{library.compiler_identity()}".encode()).hexdigest()[:16]
    arch = sysconfig.get_platform().replace("-", "_")
    name = f"{label or 'tf' + str(tf_version)}-{sys.implementation.cache_tag}-{arch}-{key}"
    return os.path.join(cache_dir(), _tfring_version(), name)


def _lock(path, on_wait):
    """An exclusive flock on ``path`` (created if needed); returns (the open
    file, which holds the lock until closed; whether it had to wait). Calls
    ``on_wait()`` once before blocking. The kernel drops the lock when its
    holder dies, so a killed build never leaves the others waiting."""
    import fcntl
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return f, False
    except BlockingIOError:
        on_wait()
    fcntl.flock(f, fcntl.LOCK_EX)
    return f, True


def locked_build(entry, build, log=_log, what="the op library", name=LIBRARY_NAME):
    """Returns ``entry/name`` (default :data:`LIBRARY_NAME`), calling ``build(tmp_output)`` first if it
    does not exist yet. The build runs under an exclusive lock on
    ``entry.lock``: of N processes arriving together one builds and the others
    wait, then find the finished file. The output is moved into place only when
    complete, so a crash never leaves a half-written library to load.

    Args:
        entry: the cache directory (created if needed).
        build: callable(path) that writes the library to ``path``.
        log: progress sink.
        what: how the log names the thing being built.
    """
    target = os.path.join(entry, name)
    if os.path.exists(target):
        return target
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    lock_file, waited = _lock(
        entry + ".lock", lambda: log(f"waiting for another process that is building {what} "
                                     f"(lock {entry}.lock)"))
    try:
        if os.path.exists(target):
            if waited:
                log(f"another process finished building {what}: {target}")
            return target
        os.makedirs(entry, exist_ok=True)
        tmp = os.path.join(entry, f".{name}.{os.getpid()}.tmp")
        try:
            build(tmp)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target
    finally:
        lock_file.close()


def read_build_info(entry):
    """The build_info.json of a cache entry, or None."""
    try:
        with open(os.path.join(entry, BUILD_INFO_NAME)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ensure_library(tf=None, log=_log):
    """The path of an op library built for the running TensorFlow, from the
    cache; compiles it there first if needed (under the cache lock).

    Args:
        tf: the imported tensorflow module (imported here if None).
        log: progress sink (stderr by default).

    Returns:
        The absolute path of ``_tfring_ops.so``.

    Raises:
        ToolMissingError: a compiler, Python's headers, pybind11 or MPICH
            (unless TFRING_WITH_MPI=0) is missing; the message names what to
            install.
        BuildError: the compile failed.
    """
    if tf is None:
        import tensorflow as tf
    root = library.source_root()
    variant = library.build_variant(tf)
    entry = cache_entry(tf.__version__, root, variant)
    target = os.path.join(entry, LIBRARY_NAME)
    if os.path.exists(target):
        return target

    def build(tmp_output):
        jobs = library.build_jobs()
        workdir = tempfile.mkdtemp(prefix="objs-", dir=entry)
        options = library.build_options(tf, root, workdir=workdir, log=log)
        log(f"compiling the op library for TensorFlow {tf.__version__} into {entry} "
            f"({len(options.sources)} files, {jobs} at a time; this happens once per "
            "TensorFlow version and takes a few minutes)")
        start = time.monotonic()
        try:
            library.compile_library(tmp_output, options, root, jobs=jobs, log=log,
                                    workdir=workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        nccl = any(name == "TFRING_WITH_NCCL" for name, _ in options.define_macros)
        info = {"tf_version": tf.__version__, "variant": variant, "nccl": nccl,
                "mpi": library.with_mpi(), "python": sys.version.split()[0],
                "tfring_version": _tfring_version(), "source_root": root,
                "compiler": shlex.join(library._compiler()),
                "seconds": round(time.monotonic() - start, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid()}
        with open(os.path.join(entry, BUILD_INFO_NAME), "w") as f:
            json.dump(info, f, indent=1)
        log(f"built the op library for TensorFlow {tf.__version__} in {info['seconds']:.0f} s")

    return locked_build(entry, build, log=log,
                        what=f"the op library for TensorFlow {tf.__version__}")


# ---------------------------------------------------------------------------
# Which library the running TensorFlow gets

def packaged_library():
    """The library installed next to the package (setup.py's build), or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = os.path.join(_PACKAGE_DIR, "_tfring_ops" + suffix)
        if os.path.exists(candidate):
            return candidate
    return None


def _packaged_build_info():
    """tfring/_build_info.py's values ({} when there is none, e.g. a library
    built by Bazel)."""
    spec = importlib.util.find_spec("tfring._build_info")
    if spec is None:
        return {}
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {k: v for k, v in vars(module).items() if k.isupper()}


def packaged_tf_version():
    """The TF version the packaged library was built for (tfring/_build_info.py),
    or None when there is no record (e.g. a library built by Bazel)."""
    return _packaged_build_info().get("TF_VERSION")


def packaged_library_is_current(tf_version):
    """True when the packaged library may be loaded under TensorFlow
    `tf_version`: it was built for that TF (or has no record, as a Bazel build),
    and from the C++ sources the package has now. An editable install
    (``pip install -e``) builds it once, in the source tree; after a C++ change
    it would be stale, so the build cache compiles the current sources
    instead (a stale library runs yesterday's core without a word)."""
    info = _packaged_build_info()
    if info.get("TF_VERSION") not in (None, tf_version):
        return False
    digest = info.get("SOURCE_DIGEST")
    if digest is None:
        return True
    try:
        root = library.source_root()
    except BuildError:
        return True     # an install without its sources cannot have changed
    return library.source_digest(root) == digest


# Distributions that install the `tensorflow` package itself (normalised names).
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow_cpu", "tensorflow_gpu", "tensorflow_intel",
                     "tensorflow_macos", "tensorflow_aarch64", "tf_nightly", "tf_nightly_cpu")


def installed_tf_version():
    """TensorFlow's version read from its .dist-info directory name, without
    importing it (which takes seconds), or None if that cannot be told.
    tfringrun uses it to decide quickly whether a build is needed; the
    import-time check compares with ``tf.__version__`` itself."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    site = os.path.dirname(os.path.realpath(list(spec.submodule_search_locations)[0]))
    versions = set()
    try:
        names = os.listdir(site)
    except OSError:
        return None
    for name in names:
        if name.endswith(".dist-info"):
            dist, _, version = name[:-len(".dist-info")].partition("-")
            if dist.lower().replace("-", "_").replace(".", "_") in _TF_DISTRIBUTIONS:
                versions.add(version)
    return versions.pop() if len(versions) == 1 else None


def library_ready_fast():
    """True when a library for the installed TensorFlow is known to exist,
    judged without importing TensorFlow; False when unsure."""
    if os.environ.get("TFRING_LIBRARY") or os.environ.get("HOROVOD_LIBRARY"):
        return True
    version = installed_tf_version()
    if version is None:
        return False
    if packaged_library() and packaged_library_is_current(version):
        return True
    try:
        root = library.source_root()
    except BuildError:
        return False
    variant = library.build_variant()
    suffix = library._mpi_suffix()
    variants = [variant] if variant else ["cpu" + suffix, "cuda" + suffix]
    return any(os.path.exists(os.path.join(cache_entry(version, root, v), LIBRARY_NAME))
               for v in variants)
