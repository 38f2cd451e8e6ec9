"""Installs tfring; compiles its op library now if TensorFlow is visible.

The build itself lives in tfring/build/library.py, shared with the compile
that tfring runs on first import (TFRING_WITH_MPI=0 builds without MPI there
and here). Two cases:

* TensorFlow importable here (``pip install --no-build-isolation``, or
  ``python setup.py build_ext --inplace``): the library is compiled against
  it now and installed next to the package, with tfring/_build_info.py naming
  the TF version.
* No TensorFlow (pip's default build isolation hides the environment's TF):
  nothing is compiled; the wheel carries the C++ sources as package data and
  tfring compiles them on first import into a per-TF-version cache.

Either way the C++ sources go into the wheel (tfring/_csrc/tf_ops), so a
later TensorFlow upgrade can be followed by a rebuild.
"""
import importlib.util
import os
import shutil
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_build_module():
    """tfring/build/library.py, loaded by path: importing the tfring package
    from a build environment would pick up whatever tfring is installed."""
    spec = importlib.util.spec_from_file_location(
        "_tfring_build_library", os.path.join(HERE, "tfring", "build", "library.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._tfring_version = lambda: VERSION
    return module


VERSION = "0.1.0"
library = _load_build_module()


def _tensorflow():
    """The TensorFlow module if importable here, else None."""
    if os.environ.get("TFRING_SKIP_INSTALL_BUILD") == "1":
        return None
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return tf


class BuildLibrary(build_ext):
    """Builds the op library with tfring.build.library (the same recipe as
    the on-import compile) and records the TF version next to it."""

    def build_extension(self, ext):
        import tensorflow as tf
        output = os.path.abspath(self.get_ext_fullpath(ext.name))
        package_dir = os.path.dirname(output)
        info_path = os.path.join(package_dir, "_build_info.py")
        root = HERE
        if not self.force and self._up_to_date(output, info_path, tf.__version__, root):
            print(f"tfring: {output} is up to date for TensorFlow {tf.__version__}")
            return
        os.makedirs(package_dir, exist_ok=True)
        options = library.build_options(tf, root, workdir=os.path.abspath(self.build_temp),
                                        log=lambda m: print(f"tfring: {m}", flush=True))
        print(f"tfring: compiling the op library for TensorFlow {tf.__version__} "
              f"({len(options.sources)} files, {library.build_jobs()} at a time)", flush=True)
        tmp = output + ".tmp"
        library.compile_library(tmp, options, root,
                                log=lambda m: print(f"tfring: {m}", flush=True))
        os.replace(tmp, output)
        with open(info_path, "w") as f:
            f.write('"""Written by setup.py: what the op library next to it was built for."""\n')
            f.write(f"TF_VERSION = {tf.__version__!r}\n")
            f.write(f"SOURCE_DIGEST = {library.source_digest(root)!r}\n")
            f.write(f"VARIANT = {library.build_variant(tf)!r}\n")
            f.write(f"MPI_BUILT = {library.with_mpi()!r}\n")
            nccl = any(name == "TFRING_WITH_NCCL" for name, _ in options.define_macros)
            f.write(f"NCCL_BUILT = {nccl!r}\n")

    def copy_extensions_to_source(self):
        """--inplace and editable installs: the record goes along with the library."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace_file, regular_file = self._get_inplace_equivalent(build_py, ext)
            info = os.path.join(os.path.dirname(regular_file), "_build_info.py")
            if os.path.exists(info):
                self.copy_file(info, os.path.join(os.path.dirname(inplace_file), "_build_info.py"),
                               level=self.verbose)

    @staticmethod
    def _up_to_date(output, info_path, tf_version, root):
        if not (os.path.exists(output) and os.path.exists(info_path)):
            return False
        record = {}
        with open(info_path) as f:
            exec(f.read(), record)
        import tensorflow as tf
        return (record.get("TF_VERSION") == tf_version
                and record.get("SOURCE_DIGEST") == library.source_digest(root)
                and record.get("VARIANT") == library.build_variant(tf))


class BuildPyWithSources(build_py):
    """Also copies the C++ sources into the package (tfring/_csrc/tf_ops), for
    the on-import compile of an install whose TF changes later."""

    def run(self):
        super().run()
        # A record left in the checkout by an in-place build describes that
        # build, not this one; build_ext writes a fresh one if it compiles.
        stale = os.path.join(self.build_lib, "tfring", "_build_info.py")
        if os.path.exists(stale):
            os.unlink(stale)
        if self.editable_mode:
            return  # an editable install compiles from the checkout's tf_ops/
        target_root = os.path.join(self.build_lib, "tfring", "_csrc")
        shutil.rmtree(target_root, ignore_errors=True)
        for rel in library.source_files(HERE):
            target = os.path.join(target_root, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.join(HERE, rel), target)


tf = _tensorflow()
if tf is None:
    print("tfring: TensorFlow is not importable in this build environment (pip's build "
          "isolation hides it), so the op library is not compiled now; tfring compiles it on "
          "first import (or when tfringrun starts) for the TensorFlow it finds.",
          file=sys.stderr)
    ext_modules = []
else:
    # Sources are listed for setuptools' bookkeeping only: BuildLibrary compiles.
    ext_modules = [Extension("tfring._tfring_ops",
                             sources=library.translation_units(HERE), language="c++")]

# A supported TensorFlow, so that `pip install '.[tensorflow]'` is the whole
# set-up on a machine with only Python and a C++ compiler. The range is the
# one tfringrun checks (tfring/runner/preflight.py). tensorflow-cpu (half
# the size, no CUDA kernels) where it is published, linux x86_64; the
# `tensorflow` wheel elsewhere, which is a CPU build there.
TF_RANGE = ">=2.16,<2.22"
EXTRAS = {
    "tensorflow": [
        f'tensorflow-cpu{TF_RANGE}; sys_platform == "linux" and platform_machine == "x86_64"',
        f'tensorflow{TF_RANGE}; sys_platform != "linux" or platform_machine != "x86_64"'],
    # NVIDIA GPUs: TensorFlow's CUDA build, plus the headers and libraries
    # the GPU build of the op library takes from NVIDIA's wheels (NCCL, the
    # CUDA runtime headers, ptxas, CCCL; README, "GPUs"). Linux only.
    "gpu": [f"tensorflow[and-cuda]{TF_RANGE}", "nvidia-nccl-cu12", "nvidia-cuda-runtime-cu12",
            "nvidia-cuda-nvcc-cu12", "nvidia-cuda-cccl-cu12"],
    # The cluster engines, for tfring.ray and tfring.spark only; the core
    # never imports them.
    # ray[train]: Ray Train V2 (TfringTrainer) and what it imports (pandas,
    # pyarrow, pydantic); RayExecutor alone needs only ray core.
    "ray": ["ray[train]>=2.60"],
    # pyspark[connect]: Spark Connect's client (Distributor runs under it) and
    # pyarrow + pandas, which the estimator streams Parquet through; fsspec:
    # the estimator's Store (any fsspec URL).
    "spark": ["pyspark[connect]>=3.5", "fsspec"],
    # PyTorch, for tfring.torch only (pure Python over tfring.core; nothing
    # else of tfring imports torch). An unpinned torch from PyPI is a CUDA
    # build with NVIDIA's wheels (a few GB); pin a CPU build where none is
    # needed (requirements-dev.txt does).
    "torch": ["torch>=2.1"],
    # What the examples need beyond tfring and TensorFlow: scikit-learn ships
    # the handwritten digits they train on (nothing is downloaded). The
    # README's Quick start installs it with TensorFlow.
    "examples": ["scikit-learn"],
}

setup(
    name="tfring",
    version=VERSION,
    description="Horovod-compatible data-parallel training for TensorFlow 2 and Keras 3",
    packages=find_packages(include=["tfring", "tfring.*"]),
    # --horovod-compat's `horovod` package: data of tfring.runner, never
    # installed as a top-level package (tfring/runner/horovod_compat.py).
    package_data={"tfring.runner": ["horovod_shim/horovod/__init__.py"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildLibrary, "build_py": BuildPyWithSources},
    python_requires=">=3.9",
    # pybind11: its headers are needed by the on-import compile too.
    install_requires=["mpi4py>=4.1", "mpich", "cloudpickle", "numpy", "pybind11>=2.10"],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["tfringrun = tfring.runner.launch:main"]},
    zip_safe=False,
)
