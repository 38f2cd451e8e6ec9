"""Builds ``_tfring_core``, the framework-neutral module (tfring.core).

It is the core (``tf_ops/common``, with MPI unless ``TFRING_WITH_MPI=0``),
the lifecycle functions shared with the op library
(``tf_ops/python_lifecycle.cc``) and the raw-buffer binding
(``tf_ops/core_api/core_module.cc``), compiled with a C++ compiler and
pybind11 alone: no TensorFlow anywhere, in the build or at run time.
``TFRING_WITH_NCCL=1`` adds the GPU (NCCL) build from
:func:`tfring.build.cuda.cuda_build_options`; unset or 0, it is a CPU build.

Like the op library it is compiled on first use into the cache
(``~/.cache/tfring`` or ``$TFRING_CACHE_DIR``), keyed by the sources and the
variant, under a file lock so that ranks starting together build it once.
``python -m tfring.build core`` builds it (or finds it) and prints its path.

Nothing here imports TensorFlow.
"""
import json
import os
import shlex
import shutil
import sys
import tempfile
import time

from tfring.build import cache, library

MODULE_NAME = "_tfring_core"
FILE_NAME = MODULE_NAME + ".so"
BINDING = [os.path.join("tf_ops", "core_api", "core_module.cc"),
           os.path.join("tf_ops", "core_api", "array_submit.cc"),
           os.path.join("tf_ops", library.PYTHON_LIFECYCLE)]


def translation_units(root, mpi=None):
    """The .cc files of the module, relative to ``root``: the core, then the
    binding."""
    return library.core_translation_units(root, mpi) + BINDING


def variant():
    """"cpu" or "cuda" (TFRING_WITH_NCCL=1), "-nompi" appended for
    TFRING_WITH_MPI=0: part of the cache key."""
    return library.build_variant() or "cpu" + ("" if library.with_mpi() else "-nompi")


def build_options(root, workdir, log=library._log, sources=None):
    """The module's build: :func:`tfring.build.library.host_options` over
    its sources (C++17, the compiler's default ABI), plus the GPU build's
    options when TFRING_WITH_NCCL=1. ``sources`` replaces the module's own
    (:func:`translation_units`).

    Raises:
        library.ToolMissingError: pybind11, Python's headers or MPICH is
            missing.
        library.BuildError: TFRING_WITH_NCCL=1 and the GPU build cannot be
            made (the message names what is missing).
    """
    cxx_flags = ["-std=c++17"]
    options = library.host_options(sources or translation_units(root), cxx_flags)
    cuda = library._load_sibling("cuda")
    try:
        gpu = cuda.cuda_build_options(cxx_flags, root=root, build_dir=workdir, log=log)
    except cuda.CudaBuildError as e:
        raise library.BuildError(str(e)) from e
    return options.merged(gpu)


def cache_entry(root=None):
    """The cache directory of this build of the module."""
    return cache.cache_entry(None, root or library.source_root(), variant(), label="core")


def ensure_module(log=library._log):
    """The path of a ``_tfring_core`` built from these sources, compiling it
    into the cache first if there is none (under the cache lock).

    Returns:
        The absolute path of ``_tfring_core.so``.

    Raises:
        library.ToolMissingError: a compiler, Python's headers, pybind11 or
            MPICH (unless TFRING_WITH_MPI=0) is missing.
        library.BuildError: the compile failed.

    Example:
        >>> from tfring.build import core_module
        >>> core_module.ensure_module()
        '/home/me/.cache/tfring/0.1.0/core-cpython-312-linux_x86_64-.../_tfring_core.so'
    """
    root = library.source_root()
    entry = cache_entry(root)
    target = os.path.join(entry, FILE_NAME)
    if os.path.exists(target):
        return target

    def build(tmp_output):
        jobs = library.build_jobs()
        workdir = tempfile.mkdtemp(prefix="objs-", dir=entry)
        try:
            options = build_options(root, workdir, log=log)
            log(f"compiling tfring's framework-neutral core module into {entry} "
                f"({len(options.sources)} files, {jobs} at a time; once per source change)")
            start = time.monotonic()
            library.compile_library(tmp_output, options, root, jobs=jobs, log=log,
                                    workdir=workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        nccl = any(name == "TFRING_WITH_NCCL" for name, _ in options.define_macros)
        info = {"module": MODULE_NAME, "variant": variant(), "nccl": nccl,
                "mpi": library.with_mpi(), "python": sys.version.split()[0],
                "source_root": root, "compiler": shlex.join(library._compiler()),
                "seconds": round(time.monotonic() - start, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with open(os.path.join(entry, "core_" + cache.BUILD_INFO_NAME), "w") as f:
            json.dump(info, f, indent=1)

    return cache.locked_build(entry, build, log=log, name=FILE_NAME,
                                what="tfring's core module")


def build_program(main_source, output, log=library._log):
    """Builds a C++ program over the core, compiled as the module is (the GPU
    build's options included, from the same environment), with
    ``main_source`` in place of the Python binding: for benchmarks that drive
    the core from C++ as the TensorFlow kernels do, with no Python between
    collectives. Not cached.

    Args:
        main_source: the program's own .cc file (defines ``main``).
        output: where the program is written.
        log: called with progress lines.

    Returns:
        ``output``.

    Raises:
        library.ToolMissingError, library.BuildError: as :func:`ensure_module`.

    Example:
        >>> core_module.build_program("tf_ops/common/tests/gpu/core_path_bench.cc", "/tmp/bench")
        '/tmp/bench'
    """
    root = library.source_root()
    workdir = tempfile.mkdtemp(prefix="tfring-program-")
    try:
        sources = library.core_translation_units(root) + [main_source]
        options = build_options(root, workdir, log=log, sources=sources)
        library.compile_library(output, options, root, log=log, workdir=workdir, shared=False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return output
