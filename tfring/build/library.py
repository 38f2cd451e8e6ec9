"""Compiles tfring's op library against the running TensorFlow.

The library is a TF custom-op library, and TF's C++ ABI (compile flags,
``libtensorflow_framework``) changes between releases, so one build serves
one TensorFlow version. There are two ways in:

* ``setup.py`` calls :func:`compile_library` at install time when TensorFlow
  is importable in the build environment (``pip install --no-build-isolation``
  or ``python setup.py build_ext --inplace``); the library then sits next to
  the package, with ``tfring/_build_info.py`` naming the TF it was built for.
* :func:`ensure_library` runs on first import (and in tfringrun, before it
  starts the ranks) when there is no packaged library for the running TF: it
  compiles into a per-TF-version cache, ``~/.cache/tfring/`` or
  ``$TFRING_CACHE_DIR``, under a file lock, so N ranks starting together build
  once and the others wait for that build and load it.

The C++ sources are package data (``tfring/_csrc/tf_ops``) in a wheel or an
installed sdist, and ``tf_ops/`` beside the package in a source checkout.

``TFRING_WITH_MPI=0`` builds without MPI: ``tf_ops/common/mpi/`` and the MPI
data plane are left out, nothing links libmpi, and the library runs over the
TCP transport only (its ``mpi_built()`` says False). The default, 1, builds
both transports and needs MPICH's headers and library.
"""
import dataclasses
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

# Bump when the compile or link recipe changes in a way that makes old cached
# builds wrong: it is part of the cache key.
RECIPE_VERSION = 2

LIBRARY_NAME = "_tfring_ops.so"
BUILD_INFO_NAME = "build_info.json"

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BuildError(ImportError):
    """The op library could not be built. An ImportError, because that is what
    ``import tfring.tensorflow`` raises when it cannot load its library."""


class ToolMissingError(BuildError):
    """A compiler, header or package the build needs is not installed; the
    message names what to install."""


def _log(message):
    print(f"tfring: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Sources

def source_root():
    """The directory that holds ``tf_ops/``: the package data of an install, or
    the checkout the package is imported from.

    Raises:
        BuildError: neither exists (an install made without its sources).
    """
    for root in (os.path.join(_PACKAGE_DIR, "_csrc"), os.path.dirname(_PACKAGE_DIR)):
        if os.path.isfile(os.path.join(root, "tf_ops", "python_module.cc")):
            return root
    raise BuildError(
        f"tfring's C++ sources were not found (looked in {_PACKAGE_DIR}/_csrc/tf_ops and "
        f"{os.path.dirname(_PACKAGE_DIR)}/tf_ops), so the op library cannot be built for "
        "this TensorFlow. Reinstall tfring from its sdist or source tree "
        "(pip install --force-reinstall --no-deps <tfring>).")


def _is_library_source(relpath):
    parts = relpath.split(os.sep)
    # .cu: the GPU build's CUDA kernels (compiled by tfring/build/cuda.py).
    return "tests" not in parts and relpath.endswith((".cc", ".h", ".cu"))


def source_files(root):
    """Every C++ file of the library under ``root/tf_ops``, relative to root,
    sorted (headers included: they are part of what a build depends on)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "tf_ops")):
        dirnames.sort()
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if _is_library_source(rel):
                found.append(rel)
    return sorted(found)


# The files that only the MPI transport needs, relative to tf_ops/common.
MPI_ONLY = (os.path.join("mpi", ""), os.path.join("ops", "mpi_data_plane."))


def is_mpi_source(relpath):
    """Whether ``relpath`` (relative to the source root) is part of the MPI
    transport, which a build with ``TFRING_WITH_MPI=0`` leaves out."""
    common = os.path.join("tf_ops", "common", "")
    return relpath.startswith(common) and relpath[len(common):].startswith(MPI_ONLY)


def with_mpi():
    """Whether to build the MPI transport: ``$TFRING_WITH_MPI`` (1, the
    default, or 0; also true/false, yes/no, on/off).

    Raises:
        BuildError: any other value (named in the message).
    """
    value = os.environ.get("TFRING_WITH_MPI", "").strip().lower()
    if value in ("", "1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise BuildError(f"TFRING_WITH_MPI={os.environ['TFRING_WITH_MPI']!r} is not 0 or 1 "
                     "(1 builds the MPI transport too, 0 builds the TCP transport only)")


# The pybind11 module of the op library: its init and the lifecycle functions
# it shares with the framework-neutral module (tfring/build/core_module.py).
PYTHON_LIFECYCLE = "python_lifecycle.cc"
PYTHON_BINDING = ["python_module.cc", PYTHON_LIFECYCLE]


def core_translation_units(root, mpi=None):
    """The core's .cc files (tf_ops/common, no tests), relative to root;
    ``mpi`` (default :func:`with_mpi`) False leaves out the MPI transport's
    files. Both the op library and the framework-neutral module are built
    from these."""
    mpi = with_mpi() if mpi is None else mpi
    return [f for f in source_files(root)
            if f.startswith(os.path.join("tf_ops", "common")) and f.endswith(".cc")
            and (mpi or not is_mpi_source(f))]


def translation_units(root, mpi=None):
    """The .cc files compiled into the library, relative to root: the core,
    the TF kernels, then the pybind11 module. ``mpi`` (default
    :func:`with_mpi`) False leaves out the MPI transport's files."""
    core = core_translation_units(root, mpi)
    kernels = [f for f in source_files(root)
               if f.startswith(os.path.join("tf_ops", "tensorflow")) and f.endswith(".cc")]
    return core + kernels + [os.path.join("tf_ops", f) for f in PYTHON_BINDING]


def source_digest(root):
    """A hash of every source's path and content: a cached build is reused
    only for exactly these sources."""
    digest = hashlib.sha256()
    for rel in source_files(root):
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    return digest.hexdigest()


# ---------------------------------------------------------------------------
# Options

@dataclasses.dataclass
class BuildOptions:
    """Everything the compile and the link need. Sources are relative to the
    source root (or absolute); macros are (name, value-or-None) pairs."""
    sources: list = dataclasses.field(default_factory=list)
    include_dirs: list = dataclasses.field(default_factory=list)
    library_dirs: list = dataclasses.field(default_factory=list)
    libraries: list = dataclasses.field(default_factory=list)
    define_macros: list = dataclasses.field(default_factory=list)
    extra_compile_args: list = dataclasses.field(default_factory=list)
    extra_link_args: list = dataclasses.field(default_factory=list)

    def merged(self, extra):
        """These options plus ``extra`` (a BuildOptions, a mapping with the
        same field names, or None); lists are concatenated."""
        if extra is None:
            return self
        get = extra.get if isinstance(extra, dict) else (lambda k, d: getattr(extra, k, d))
        unknown = set(extra) - {f.name for f in dataclasses.fields(self)} \
            if isinstance(extra, dict) else set()
        if unknown:
            raise BuildError(f"unknown build option(s) {sorted(unknown)} from an extra option set")
        return BuildOptions(**{f.name: list(getattr(self, f.name)) + list(get(f.name, []) or [])
                               for f in dataclasses.fields(self)})


def mpi_prefix():
    """The prefix of the ``mpich`` wheel (``<prefix>/include/mpi.h``,
    ``<prefix>/lib/libmpi.so``): this environment's, or wherever the mpich
    distribution put its files.

    Raises:
        ToolMissingError: no mpi.h was found.
    """
    prefix = sysconfig.get_paths()["data"]
    if os.path.exists(os.path.join(prefix, "include", "mpi.h")):
        return prefix
    try:
        dist = importlib.metadata.distribution("mpich")
        for f in dist.files or ():
            if str(f).replace("\\", "/").endswith("include/mpi.h"):
                return os.path.dirname(os.path.dirname(os.path.abspath(dist.locate_file(f))))
    except importlib.metadata.PackageNotFoundError:
        pass
    raise ToolMissingError(
        f"mpi.h was not found under {prefix}/include: `pip install mpich` (the MPICH wheel ships "
        "MPI's headers and libraries) before building tfring.")


def _python_include():
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise ToolMissingError(
            f"Python's C headers (Python.h) are missing from {include}, and tfring's op library "
            f"needs them to build. Install them: `apt-get install python{version}-dev` "
            f"(Debian/Ubuntu), `dnf install python{version.replace('.', '')}-devel` or "
            "`python3-devel` (Fedora/RHEL), or use a Python from conda or python.org.")
    return include


def _pybind11_include():
    try:
        import pybind11
    except ImportError as exc:
        raise ToolMissingError(
            "pybind11 is needed to build tfring's op library: `pip install pybind11`.") from exc
    return pybind11.get_include()


def host_options(sources, compile_args=(), link_args=()):
    """A CPU build of ``sources`` into a pybind11 module, with or without MPI
    (:func:`with_mpi`): Python's and pybind11's headers, tfring's own compile
    flags after ``compile_args`` (a framework's, e.g. TensorFlow's ABI and
    C++ standard) and ``link_args``. No framework is needed here; the op
    library (:func:`base_options`) and the framework-neutral module
    (tfring/build/core_module.py) both start from it."""
    options = BuildOptions(
        sources=list(sources),
        include_dirs=[_pybind11_include(), _python_include()],
        define_macros=[("TFRING_WITH_MPI", "1" if with_mpi() else "0")],
        # -fvect-cost-model=cheap: at -O2, GCC 12 only vectorises loops that
        # need no scalar tail; the element-wise reductions need one.
        extra_compile_args=list(compile_args) + [
            "-O2", "-DNDEBUG", "-fPIC", "-fvect-cost-model=cheap", "-fvisibility=hidden",
            "-Wno-deprecated-declarations"],
        extra_link_args=list(link_args),
    )
    if not with_mpi():
        return options
    mpi = mpi_prefix()
    return options.merged(BuildOptions(
        include_dirs=[os.path.join(mpi, "include")],
        library_dirs=[os.path.join(mpi, "lib")],
        libraries=["mpi"],
        # libmpi is found through a RUNPATH: relative to an installed extension
        # (site-packages/tfring -> <prefix>/lib), and absolute for in-place and
        # cached builds. The loader also preloads libmpi before loading.
        extra_link_args=["-Wl,-rpath,$ORIGIN/../../..", "-Wl,-rpath," + os.path.join(mpi, "lib")],
    ))


# What the XLA lowering (tf_ops/tensorflow/xla/) needs beyond TF's own flags:
# the library with TF2XLA's op registry and XLA's builder and FFI API
# (tf.sysconfig.get_link_flags() names only libtensorflow_framework; the
# Python package has loaded this one before any op library), and two hash
# libraries that XLA's headers include from the wheel's external/ tree.
TF_XLA_LIBRARY = "libtensorflow_cc.so.2"
TF_XLA_HEADER_DIRS = (("external", "highwayhash"), ("external", "farmhash_archive", "src"))


def xla_options(tf):
    """The BuildOptions the XLA lowering adds for ``tf``'s wheel: whatever of
    it the wheel has. Without the library or headers the lowering compiles to
    nothing (tf_ops/tensorflow/xla/xla_support.h checks the headers)."""
    include = tf.sysconfig.get_include()
    has_library = os.path.exists(os.path.join(tf.sysconfig.get_lib(), TF_XLA_LIBRARY))
    return BuildOptions(
        include_dirs=[d for d in (os.path.join(include, *parts) for parts in TF_XLA_HEADER_DIRS)
                      if os.path.isdir(d)],
        extra_link_args=[f"-l:{TF_XLA_LIBRARY}"] if has_library else [])


def base_options(tf, root):
    """The build for a CPU library against ``tf`` (the imported module), with
    or without MPI (:func:`with_mpi`)."""
    return host_options(translation_units(root, with_mpi()), tf.sysconfig.get_compile_flags(),
                        tf.sysconfig.get_link_flags()).merged(xla_options(tf))


# ---- Extra build options: the one place they join the base build ----------
# Each provider is called as provider(tf, root, workdir, log) only when a
# build actually runs, and returns a BuildOptions, a dict with BuildOptions'
# field names, or None when it has nothing to add. It may compile objects of
# its own into `workdir` and pass them in extra_link_args. setup.py and the
# on-import compile both go through build_options(), so a provider added here
# reaches both. What a provider will decide must also be told, cheaply and
# without building, by build_variant(), which is part of the cache key, so a
# GPU and a CPU build never share a cache entry.

def _load_sibling(name):
    """tfring/build/<name>.py loaded by path (setup.py loads this file by path
    too, before the tfring package is importable)."""
    spec = importlib.util.spec_from_file_location(
        f"_tfring_build_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda_provider(tf, root, workdir, log):
    """The GPU (NCCL) build of tfring/build/cuda.py, or None for a CPU library."""
    cuda = _load_sibling("cuda")
    try:
        return cuda.cuda_build_options(list(tf.sysconfig.get_compile_flags()), root=root,
                                       build_dir=workdir, log=log,
                                       wanted_by_default=cuda.tf_built_with_cuda)
    except cuda.CudaBuildError as e:
        raise BuildError(str(e)) from e


EXTRA_OPTION_PROVIDERS = [_cuda_provider]


def _mpi_suffix():
    return "" if with_mpi() else "-nompi"


def build_variant(tf=None):
    """Which kind of build the options will make, told without building:
    "cpu" (TFRING_WITH_NCCL off, or a TensorFlow without CUDA) or "cuda"
    (asked for, or auto with a CUDA TensorFlow), with "-nompi" appended for
    TFRING_WITH_MPI=0. Without `tf` (no import wanted), None when the GPU
    choice is unknown."""
    forced = os.environ.get("TFRING_WITH_NCCL", "").strip().lower()
    if forced in ("0", "false", "no", "off"):
        return "cpu" + _mpi_suffix()
    if forced:
        return "cuda" + _mpi_suffix()
    if tf is None:
        return None
    return ("cuda" if tf.test.is_built_with_cuda() else "cpu") + _mpi_suffix()


def build_options(tf, root, workdir=None, log=None):
    """The base options merged with the extra providers'.

    Args:
        tf: the imported tensorflow module.
        root: the source root.
        workdir: where providers may put objects they compile (default: a
            build/ directory under root).
        log: progress sink.
    """
    options = base_options(tf, root)
    workdir = workdir or os.path.join(root, "build", "extra")
    for provider in EXTRA_OPTION_PROVIDERS:
        options = options.merged(provider(tf, root, workdir, log or _log))
    return options
# ---------------------------------------------------------------------------


def _compiler():
    """The C++ compiler command ($CXX, else c++ or g++), as a list.

    Raises:
        ToolMissingError: none is installed; the message says what to install.
    """
    env = os.environ.get("CXX")
    candidates = [shlex.split(env)] if env else [["c++"], ["g++"], ["clang++"]]
    for cmd in candidates:
        # "ccache g++": both words must resolve.
        if cmd and all(shutil.which(word) for word in cmd if not word.startswith("-")):
            return cmd
    looked = f"CXX={env!r}" if env else "c++, g++ and clang++ on PATH"
    raise ToolMissingError(
        f"no C++ compiler was found ({looked}), and tfring needs one to compile its op library "
        "for the installed TensorFlow (once per TensorFlow version). Install one: "
        "`apt-get install g++` (Debian/Ubuntu), `dnf install gcc-c++` (Fedora/RHEL), "
        "`conda install -c conda-forge gxx_linux-64` (conda); or set CXX to a compiler's path.")


def build_jobs():
    """Parallel compiles: $TFRING_BUILD_JOBS, else the CPU count (at most 8:
    one TU with TF's headers needs about a GB of memory)."""
    try:
        jobs = int(os.environ.get("TFRING_BUILD_JOBS", "0"))
    except ValueError:
        raise BuildError(
            f"TFRING_BUILD_JOBS={os.environ['TFRING_BUILD_JOBS']!r} is not an integer") from None
    return jobs if jobs > 0 else max(1, min(os.cpu_count() or 1, 8))


def _macro_flags(macros):
    return [f"-D{name}" if value is None else f"-D{name}={value}" for name, value in macros]


def compile_library(output, options, root, jobs=None, log=_log, workdir=None):
    """Compiles ``options.sources`` and links them into ``output``.

    Args:
        output: path of the shared object to write (its directory must exist).
        options: a BuildOptions.
        root: the source root the relative sources are under.
        jobs: parallel compiles (default :func:`build_jobs`).
        log: called with one progress line per finished file.
        workdir: where the object files go (default: a temporary directory).

    Raises:
        ToolMissingError: no compiler.
        BuildError: a compile or the link failed; the message has the command
            and the compiler's output.
    """
    cxx = _compiler()
    jobs = jobs or build_jobs()
    sources = [s if os.path.isabs(s) else os.path.join(root, s) for s in options.sources]
    flags = (_macro_flags(options.define_macros)
             + [f"-I{d}" for d in options.include_dirs] + list(options.extra_compile_args))
    own_tmp = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="tfring-build-")
    start = time.monotonic()
    try:
        def compile_one(index, source):
            if not source.endswith((".cc", ".cpp", ".cxx")):
                raise BuildError(f"no compile rule for {source}: only C++ sources are built here")
            obj = os.path.join(workdir, f"{index:03d}_{os.path.basename(source)}.o")
            cmd = cxx + ["-c", source, "-o", obj] + flags
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
            if proc.returncode != 0:
                raise BuildError(
                    f"compiling {source} failed (exit {proc.returncode}):\n  {shlex.join(cmd)}\n"
                    f"{proc.stdout[-8000:]}")
            return obj

        objects = [None] * len(sources)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(compile_one, i, s): i for i, s in enumerate(sources)}
            done = 0
            try:
                for future in as_completed(futures):
                    i = futures[future]
                    objects[i] = future.result()
                    done += 1
                    name = os.path.relpath(sources[i], root) if sources[i].startswith(root) \
                        else sources[i]
                    log(f"[{done}/{len(sources)}] compiled {name} "
                        f"({time.monotonic() - start:.0f} s)")
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        link = (cxx + ["-shared", "-o", output] + objects
                + [f"-L{d}" for d in options.library_dirs]
                + [f"-l{lib}" for lib in options.libraries] + list(options.extra_link_args))
        proc = subprocess.run(link, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise BuildError(f"linking {output} failed (exit {proc.returncode}):\n  "
                             f"{shlex.join(link)}\n{proc.stdout[-8000:]}")
        log(f"linked {output} ({time.monotonic() - start:.0f} s)")
    finally:
        if own_tmp:
            shutil.rmtree(workdir, ignore_errors=True)
    return output


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
    The hash covers the sources, the build recipe and ``variant`` (see
    :func:`build_variant`), so an edited source or a GPU build gets an entry
    of its own."""
    root = root or source_root()
    key = hashlib.sha256(
        f"{source_digest(root)}|{RECIPE_VERSION}|{variant}".encode()).hexdigest()[:16]
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
    root = source_root()
    variant = build_variant(tf)
    entry = cache_entry(tf.__version__, root, variant)
    target = os.path.join(entry, LIBRARY_NAME)
    if os.path.exists(target):
        return target

    def build(tmp_output):
        jobs = build_jobs()
        workdir = tempfile.mkdtemp(prefix="objs-", dir=entry)
        options = build_options(tf, root, workdir=workdir, log=log)
        log(f"compiling the op library for TensorFlow {tf.__version__} into {entry} "
            f"({len(options.sources)} files, {jobs} at a time; this happens once per "
            "TensorFlow version and takes a few minutes)")
        start = time.monotonic()
        try:
            compile_library(tmp_output, options, root, jobs=jobs, log=log, workdir=workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        nccl = any(name == "TFRING_WITH_NCCL" for name, _ in options.define_macros)
        info = {"tf_version": tf.__version__, "variant": variant, "nccl": nccl,
                "mpi": with_mpi(), "python": sys.version.split()[0],
                "tfring_version": _tfring_version(), "source_root": root,
                "compiler": shlex.join(_compiler()), "seconds": round(time.monotonic() - start, 1),
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


def packaged_tf_version():
    """The TF version the packaged library was built for (tfring/_build_info.py),
    or None when there is no record (e.g. a library built by Bazel)."""
    spec = importlib.util.find_spec("tfring._build_info")
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "TF_VERSION", None)


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
    if packaged_library() and packaged_tf_version() == version:
        return True
    try:
        root = source_root()
    except BuildError:
        return False
    variant = build_variant()
    variants = [variant] if variant else ["cpu" + _mpi_suffix(), "cuda" + _mpi_suffix()]
    return any(os.path.exists(os.path.join(cache_entry(version, root, v), LIBRARY_NAME))
               for v in variants)
