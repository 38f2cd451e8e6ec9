"""Compiles tfring's op library against the running TensorFlow.

The library is a TF custom-op library, and TF's C++ ABI (compile flags,
``libtensorflow_framework``) changes between releases, so one build serves
one TensorFlow version. There are two ways in:

* ``setup.py`` calls :func:`compile_library` at install time when TensorFlow
  is importable in the build environment (``pip install --no-build-isolation``
  or ``python setup.py build_ext --inplace``); the library then sits next to
  the package, with ``tfring/_build_info.py`` naming the TF it was built for.
* :func:`tfring.build.cache.ensure_library` runs on first import (and in tfringrun, before it
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


def compiler_identity():
    """What the cache key knows of the compiler: its command, resolved to
    files, and the first line of its ``--version``; "" when none is found.
    A library built by another compiler (a new $CXX, an upgraded g++) can
    differ in ABI or code, so it gets an entry of its own rather than being
    reused silently."""
    try:
        cmd = _compiler()
    except ToolMissingError:
        return ""
    key = (tuple(os.environ.get("PATH", "").split(os.pathsep)), tuple(cmd))
    if key not in _COMPILER_IDENTITIES:
        resolved = [os.path.realpath(shutil.which(w) or w) if not w.startswith("-") else w
                    for w in cmd]
        try:
            out = subprocess.run([*cmd, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        version = out.splitlines()[0].strip() if out.strip() else ""
        _COMPILER_IDENTITIES[key] = f"{shlex.join(resolved)} ({version})"
    return _COMPILER_IDENTITIES[key]


_COMPILER_IDENTITIES = {}


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


def compile_library(output, options, root, jobs=None, log=_log, workdir=None, shared=True):
    """Compiles ``options.sources`` and links them into ``output``: a shared
    object, or with ``shared=False`` a program (one source defines main).

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
        link = (cxx + (["-shared"] if shared else []) + ["-o", output] + objects
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
