"""Builds tfring's op library against the TensorFlow installed right now.

The TF ABI (C++ flags, libtensorflow_framework) differs between releases, so
the library is compiled here from `tf.sysconfig`, and the TF version it was
built for is recorded in tfring/_build_info.py. At import time tfring compares
that version with the running TF and explains how to rebuild on a mismatch.
"""
import glob
import importlib.util
import os
import sysconfig
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _tf_build_config():
    try:
        import tensorflow as tf
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "tfring is compiled against the installed TensorFlow, and none was found: "
            "pip install tensorflow (or tensorflow-cpu) first, then "
            "pip install --no-build-isolation .") from exc
    return tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()


def _mpi_prefix():
    """The prefix of the `mpich` wheel: <prefix>/include/mpi.h, <prefix>/lib/libmpi.so."""
    prefix = sysconfig.get_paths()["data"]
    if not os.path.exists(os.path.join(prefix, "include", "mpi.h")):
        raise SystemExit(
            f"mpi.h was not found under {prefix}/include: pip install mpich (the MPICH wheel "
            "ships MPI's headers and libraries) before building tfring.")
    return prefix


def _sources():
    files = sorted(glob.glob("tf_ops/common/**/*.cc", recursive=True))
    files = [f for f in files if "/tests/" not in f]
    return files + sorted(glob.glob("tf_ops/tensorflow/*.cc")) + ["tf_ops/python_module.cc"]


class ParallelBuildExt(build_ext):
    """Compiles the sources two at a time: one TU with TF headers takes ~11 s."""

    def build_extensions(self):
        compiler = self.compiler
        original = compiler.compile

        def parallel_compile(sources, *args, **kwargs):
            jobs = int(os.environ.get("TFRING_BUILD_JOBS", "2"))
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                objects = list(pool.map(lambda s: original([s], *args, **kwargs), sources))
            return [o for objs in objects for o in objs]

        compiler.compile = parallel_compile
        # setuptools adds -Wstrict-prototypes, meaningless for C++.
        if "-Wstrict-prototypes" in compiler.compiler_so:
            compiler.compiler_so.remove("-Wstrict-prototypes")
        super().build_extensions()


def _cuda_options(compile_flags):
    """The GPU build's additions (tfring/build/cuda.py), or None for a CPU
    library. Loaded by path: the tfring package is not importable yet."""
    spec = importlib.util.spec_from_file_location(
        "_tfring_build_cuda", os.path.join(HERE, "tfring", "build", "cuda.py"))
    cuda = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cuda)
    return cuda.cuda_build_options(compile_flags, root=HERE)


def _write_build_info(tf_version, compile_flags, nccl_built=False):
    with open(os.path.join(HERE, "tfring", "_build_info.py"), "w") as f:
        f.write('"""Written by setup.py: what the op library was built against."""\n')
        f.write(f"TF_VERSION = {tf_version!r}\n")
        f.write(f"TF_COMPILE_FLAGS = {compile_flags!r}\n")
        f.write("MPI_BUILT = True\n")
        f.write(f"NCCL_BUILT = {nccl_built!r}\n")


def _extension():
    tf_version, compile_flags, link_flags = _tf_build_config()
    import pybind11

    mpi = _mpi_prefix()
    gpu = _cuda_options(compile_flags) or {}
    _write_build_info(tf_version, compile_flags, nccl_built=bool(gpu))
    return Extension(
        "tfring._tfring_ops",
        sources=_sources(),
        include_dirs=[pybind11.get_include(), os.path.join(mpi, "include")] + gpu.get("include_dirs", []),
        library_dirs=[os.path.join(mpi, "lib")] + gpu.get("library_dirs", []),
        libraries=["mpi"],
        define_macros=gpu.get("define_macros", []),
        language="c++",
        # -fvect-cost-model=cheap: at -O2, GCC 12 only vectorises loops that
        # need no scalar tail; the element-wise reductions need one.
        extra_compile_args=compile_flags + ["-O2", "-fvect-cost-model=cheap", "-fvisibility=hidden",
                                            "-Wno-deprecated-declarations"],
        # libmpi is found through a RUNPATH relative to the installed extension
        # (site-packages/tfring -> <prefix>/lib); the absolute path covers
        # in-place builds. tfring also preloads libmpi before loading.
        extra_link_args=link_flags + [
            "-Wl,-rpath,$ORIGIN/../../..",
            "-Wl,-rpath," + os.path.join(mpi, "lib"),
        ] + gpu.get("extra_link_args", []),
    )


setup(
    name="tfring",
    version="0.1.0",
    description="Horovod-compatible data-parallel training for TensorFlow 2 and Keras 3",
    packages=find_packages(include=["tfring", "tfring.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": ParallelBuildExt},
    python_requires=">=3.9",
    install_requires=["mpi4py>=4.1", "mpich", "cloudpickle", "numpy"],
    entry_points={"console_scripts": ["tfringrun = tfring.runner.launch:main"]},
    zip_safe=False,
)
