"""GPU build of tfring: whether to build the NCCL data plane, and how.

One entry point, :func:`cuda_build_options`, returns what the op library's
build must add for GPUs (or None for a CPU-only library). The decision:

* ``TFRING_WITH_NCCL=0``: never; ``TFRING_WITH_NCCL=1``: always, and a missing
  piece is an error that names it;
* unset: only when the installed TensorFlow was built with CUDA
  (``pip install tensorflow[and-cuda]``) and NCCL, the CUDA runtime headers
  and nvcc are all found.

Headers and libraries come from NVIDIA's pip wheels (``nvidia-nccl-cu12``,
``nvidia-cuda-runtime-cu12``, ``nvidia-cuda-cccl-cu12`` and
``nvidia-cuda-nvcc-cu12``), found under every ``nvidia`` package directory on
``sys.path``; ``NCCL_HOME`` and ``CUDA_HOME`` (or ``CUDA_PATH``) name other
places. libnccl is linked as ``-l:libnccl.so.2`` because the wheel ships no
``libnccl.so`` link.

The few element-wise kernels (scaling, Average's division) are compiled
either by nvcc (``tf_ops/common/ops/cuda/gpu_kernels.cu``, into an object that
joins the link) or by NVRTC when first used (``ops/cuda/nvrtc_kernels.cc``),
which needs no nvcc at build time: see :func:`kernel_compiler`. The
``nvidia-cuda-nvcc-cu12`` wheels (12.9) hold ptxas and the NVVM library but no
``nvcc`` driver, so a build from CUDA 12 wheels takes NVRTC
(``nvidia-cuda-nvrtc-cu12``, which ``tensorflow[and-cuda]`` brings). nvcc is
looked for in the wheels, then in ``$CUDA_HOME/bin``, then on ``PATH``
(``TFRING_NVCC`` names one explicitly).

Nothing here imports TensorFlow at import time.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

# The C++ files of the GPU build. They sit in the library's source tree and
# compile to nothing unless TFRING_WITH_NCCL is defined, so the CPU build's
# source glob needs no exclusion list.
GPU_CXX_SOURCES = [
    "tf_ops/common/ops/nccl_communicators.cc",
    "tf_ops/common/ops/nccl_data_plane.cc",
    "tf_ops/common/ops/gpu_executor.cc",
    "tf_ops/common/ops/hierarchical_gpu_data_plane.cc",
    "tf_ops/common/ops/cuda/cuda_nccl_api.cc",
    "tf_ops/common/ops/cuda/gpu_setup.cc",
]
GPU_CUDA_SOURCES = ["tf_ops/common/ops/cuda/gpu_kernels.cu"]

# The core files a GPU test or benchmark program (tf_ops/common/tests/gpu)
# links besides the GPU sources: the executor's pipeline and what the GPU
# build's set-up installs into.
GPU_TEST_CORE_SOURCES = ["common.cc", "reduction.cc", "executor.cc", "fusion_buffer.cc",
                         "gpu_support.cc", "logging.cc", "config.cc"]

# Compute capabilities compiled for (TFRING_CUDA_ARCHS overrides, e.g. "90"):
# Volta to Hopper as machine code, plus PTX of the newest for later GPUs.
DEFAULT_ARCHS = "70;75;80;86;89;90"


class CudaBuildError(RuntimeError):
    """A GPU build was asked for (TFRING_WITH_NCCL=1) and cannot be made."""


def _nvidia_dirs():
    """Every ``nvidia`` namespace-package directory on sys.path."""
    dirs = []
    for entry in sys.path:
        d = os.path.join(entry or ".", "nvidia")
        if os.path.isdir(d) and d not in dirs:
            dirs.append(os.path.abspath(d))
    return dirs


def _first(patterns):
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def find_nccl():
    """(include_dir, lib_dir) holding nccl.h and libnccl.so.2, or None."""
    roots = [os.environ["NCCL_HOME"]] if os.environ.get("NCCL_HOME") else []
    roots += [os.path.join(d, "nccl") for d in _nvidia_dirs()]
    for root in roots:
        header = _first([os.path.join(root, "include", "nccl.h")])
        lib = _first([os.path.join(root, "lib", "libnccl.so.2"),
                      os.path.join(root, "lib64", "libnccl.so.2")])
        if header and lib:
            return os.path.dirname(header), os.path.dirname(lib)
    return None


def _cuda_home():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    nvcc = shutil.which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return None


def _soname(lib):
    """libcudart.so.12.4.127 -> libcudart.so.12"""
    m = re.match(r"(lib\w+\.so\.\d+)", os.path.basename(lib))
    return m.group(1) if m else os.path.basename(lib)


def _with_crt(includes):
    """`includes` plus a directory with crt/host_config.h, which
    cuda_runtime.h needs and the runtime wheels lack (the nvcc wheel or a
    toolkit has it), when none of them has it yet."""
    if any(os.path.exists(os.path.join(d, "crt", "host_config.h")) for d in includes):
        return includes
    home = _cuda_home() or "/usr/local/cuda"
    extra = os.path.join(home, "include")
    if os.path.exists(os.path.join(extra, "crt", "host_config.h")):
        return includes + [extra]
    return includes


def find_cuda_runtime():
    """(include_dirs, lib_dir, cudart_soname) for cuda_runtime.h and
    libcudart.so.N, or None. The runtime wheel's headers need the nvcc
    wheel's crt/ headers and the cccl wheel's nv/target too."""
    for d in _nvidia_dirs():
        # CUDA 12 wheels: nvidia/cuda_runtime/{include,lib}; CUDA 13: nvidia/cu13/.
        for runtime in (os.path.join(d, "cuda_runtime"), os.path.join(d, "cu13")):
            header = os.path.join(runtime, "include", "cuda_runtime.h")
            lib = _first([os.path.join(runtime, "lib", "libcudart.so.[0-9]*")])
            if not (os.path.exists(header) and lib):
                continue
            includes = [os.path.join(runtime, "include")]
            for extra in ("cuda_nvcc", "cuda_cccl"):
                inc = os.path.join(d, extra, "include")
                if os.path.isdir(inc):
                    includes.append(inc)
            if os.path.isdir(os.path.join(runtime, "include", "cccl")):
                includes.append(os.path.join(runtime, "include", "cccl"))
            return _with_crt(includes), os.path.dirname(lib), _soname(lib)
    home = _cuda_home()
    if home and os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
        lib = _first([os.path.join(home, sub, "libcudart.so.[0-9]*")
                      for sub in ("lib64", "lib", "targets/x86_64-linux/lib")])
        if lib:
            return [os.path.join(home, "include")], os.path.dirname(lib), _soname(lib)
    return None


def find_nvcc():
    """Path of an nvcc driver, or None."""
    if os.environ.get("TFRING_NVCC"):
        return os.environ["TFRING_NVCC"]
    for d in _nvidia_dirs():
        nvcc = os.path.join(d, "cuda_nvcc", "bin", "nvcc")
        if os.access(nvcc, os.X_OK):
            return nvcc
    home = _cuda_home()
    if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def nvcc_major(nvcc):
    """The CUDA major version of an nvcc (13 for 'release 13.0'), or None."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except OSError:
        return None
    m = re.search(r"release (\d+)\.", out)
    return int(m.group(1)) if m else None


def _cudart_major(soname):
    m = re.search(r"\.so\.(\d+)", soname)
    return int(m.group(1)) if m else None


def tf_built_with_cuda():
    """True when the installed TensorFlow is a CUDA build."""
    try:
        import tensorflow as tf
    except ImportError:
        return False
    return bool(tf.test.is_built_with_cuda())


def _gencode_flags():
    archs = [a.strip() for a in os.environ.get("TFRING_CUDA_ARCHS", DEFAULT_ARCHS).replace(
        ",", ";").split(";") if a.strip()]
    flags = []
    for a in archs:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    flags += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
    return flags


def nvcc_command(nvcc, source, output, include_dirs, cxx_flags=()):
    """The nvcc command line that compiles one .cu file to a PIC object."""
    abi = [f for f in cxx_flags if f.startswith("-D_GLIBCXX_USE_CXX11_ABI")]
    return [nvcc, "-std=c++17", "-O2", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
            *abi, *_gencode_flags(), *[f"-I{d}" for d in include_dirs], "-c", source, "-o", output]


def kernel_compiler(runtime):
    """How the GPU build's few element-wise kernels are compiled: ("nvcc",
    nvcc's path, None), ("nvrtc", None, None) (by NVRTC when first used, in
    ops/cuda/nvrtc_kernels.cc), or (choice, None, why not) when the choice
    cannot be made.

    ``TFRING_GPU_KERNELS`` picks: ``nvcc``, ``nvrtc``, or unset/``auto``:
    nvcc when one of the CUDA runtime's major version is found, else NVRTC
    (so a build from NVIDIA's CUDA 12 pip wheels, which have no nvcc, needs
    g++ alone).
    """
    choice = os.environ.get("TFRING_GPU_KERNELS", "auto").strip().lower() or "auto"
    if choice not in ("auto", "nvcc", "nvrtc"):
        return choice, None, (f"TFRING_GPU_KERNELS={choice!r} is not nvcc, nvrtc or auto")
    if choice == "nvrtc":
        return "nvrtc", None, None
    nvcc = find_nvcc()
    rt = _cudart_major(runtime[2]) if runtime else None
    compiler = nvcc_major(nvcc) if nvcc else None
    if nvcc and (runtime is None or compiler == rt):
        return "nvcc", nvcc, None
    if choice == "auto":
        return "nvrtc", None, None
    if nvcc is None:
        return "nvcc", None, None  # _missing says what to install
    # Objects from one nvcc and a CUDA runtime of another major version do
    # not link (or fail when loaded).
    return "nvcc", nvcc, (f"nvcc ({nvcc}) is CUDA {compiler} while the CUDA runtime found is "
                          f"{runtime[2]} in {runtime[1]}: use an nvcc of CUDA {rt} "
                          "(TFRING_NVCC=/path/to/nvcc), that runtime's wheels, or "
                          "TFRING_GPU_KERNELS=nvrtc")


def _missing(nccl, runtime, nvcc, tf_cuda):
    parts = []
    if not tf_cuda:
        parts.append("TensorFlow was not built with CUDA (pip install 'tensorflow[and-cuda]')")
    if nccl is None:
        parts.append("nccl.h and libnccl.so.2 were not found (pip install nvidia-nccl-cu12, "
                     "or set NCCL_HOME)")
    if runtime is None:
        parts.append("the CUDA runtime headers were not found (pip install "
                     "nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-cccl-cu12, or "
                     "set CUDA_HOME)")
    if nvcc is None:  # "" when NVRTC compiles the kernels
        parts.append("nvcc was not found (a CUDA toolkit's nvcc on PATH, $CUDA_HOME/bin/nvcc, or "
                     "TFRING_NVCC)")
    return parts


def cuda_build_options(cxx_flags=(), root=None, build_dir=None, log=print,
                       wanted_by_default=None):
    """What a build of the core adds for GPUs, or None for a CPU build.

    Args:
      cxx_flags: the C++ compile flags the rest of the build uses (the C++
        ABI macro among them, which nvcc must use too): TensorFlow's for the
        op library, none for the framework-neutral module.
      root: the source tree (holding ``tf_ops/``); default: the checkout this
        file is in.
      build_dir: where the CUDA objects go; default ``<root>/build/cuda``.
      log: called with one line when the choice needs explaining.
      wanted_by_default: with TFRING_WITH_NCCL unset, a callable that says
        whether a GPU build is wanted (the op library passes
        :func:`tf_built_with_cuda`); None: not wanted, so only
        TFRING_WITH_NCCL=1 makes one and nothing imports TensorFlow.

    Returns:
      None, or a dict with the build option fields ``sources``,
      ``include_dirs``, ``library_dirs``, ``libraries``, ``define_macros``,
      ``extra_compile_args`` and ``extra_link_args``. The CUDA objects, already
      compiled by nvcc, are in ``extra_link_args``; ``sources`` is empty
      because the GPU's C++ files (GPU_CXX_SOURCES) are already in the
      library's source glob and compile to nothing without the macro.

    Raises:
      CudaBuildError: TFRING_WITH_NCCL=1 and something is missing, or nvcc
        failed.

    Example:
      >>> opts = cuda_build_options(tf.sysconfig.get_compile_flags(),
      ...                           wanted_by_default=tf_built_with_cuda)
      >>> NCCL_BUILT = opts is not None
    """
    forced = os.environ.get("TFRING_WITH_NCCL", "").strip().lower()
    if forced in ("0", "false", "no", "off"):
        return None
    if forced not in ("", "1", "true", "yes", "on"):
        raise CudaBuildError(f"TFRING_WITH_NCCL={forced!r}: use 1 (build for GPUs) or 0 (do not)")
    required = forced != ""
    if not required and wanted_by_default is None:
        return None
    nccl, runtime = find_nccl(), find_cuda_runtime()
    tf_cuda = True if required else wanted_by_default()
    kernels, nvcc, why = kernel_compiler(runtime)
    missing = _missing(nccl, runtime, nvcc if kernels == "nvcc" else "", tf_cuda)
    if why:
        missing.append(why)
    if missing:
        if required:
            raise CudaBuildError("TFRING_WITH_NCCL=1, but " + "; ".join(missing) + ".")
        if tf_cuda:
            log("tfring: building without GPU support: " + "; ".join(missing) + ".")
        return None

    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build_dir = build_dir or os.path.join(root, "build", "cuda")
    os.makedirs(build_dir, exist_ok=True)
    nccl_inc, nccl_lib = nccl
    cuda_incs, cudart_dir, cudart = runtime
    includes = [nccl_inc] + cuda_incs
    objects = []
    for src in GPU_CUDA_SOURCES if kernels == "nvcc" else []:
        obj = os.path.join(build_dir, os.path.basename(src) + ".o")
        # nvcc brings its own CUDA headers; the .cu file needs no others.
        cmd = nvcc_command(nvcc, os.path.join(root, src), obj, [], cxx_flags)
        log("tfring: " + " ".join(cmd))
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise CudaBuildError(f"nvcc failed on {src}:\n{run.stderr}")
        objects.append(obj)
    # RUNPATHs: the wheels' directories beside an installed extension
    # (site-packages/tfring -> site-packages/nvidia/...), and the absolute
    # ones for in-place builds.
    rel = ["-Wl,-rpath,$ORIGIN/../nvidia/nccl/lib",
           "-Wl,-rpath,$ORIGIN/../nvidia/cuda_runtime/lib"]
    log(f"GPU build; its kernels are compiled by {kernels}"
        + (" when first used (no nvcc needed)" if kernels == "nvrtc" else ""))
    macros = [("TFRING_WITH_NCCL", "1")]
    if kernels == "nvrtc":
        macros.append(("TFRING_NVRTC_KERNELS", "1"))
    return {
        "sources": [],
        "include_dirs": includes,
        "library_dirs": [nccl_lib, cudart_dir],
        "libraries": [],
        "define_macros": macros,
        "extra_compile_args": [],
        "extra_link_args": objects + [f"-L{nccl_lib}", f"-L{cudart_dir}", "-l:libnccl.so.2",
                                      f"-l:{cudart}", "-ldl"] + rel + [
            f"-Wl,-rpath,{nccl_lib}", f"-Wl,-rpath,{cudart_dir}"],
    }


def gpu_test_command(main_source, output, root=None, arch=None):
    """The nvcc command that builds a GPU test or benchmark program
    (tf_ops/common/tests/gpu/*.cc) with the NCCL plane, for the GPU it runs on.

    Raises:
      CudaBuildError: nvcc or NCCL is missing.
    """
    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    nccl, nvcc = find_nccl(), find_nvcc()
    if nccl is None or nvcc is None:
        raise CudaBuildError("; ".join(_missing(nccl, True, nvcc, True)))
    nccl_inc, nccl_lib = nccl
    core = os.path.join(root, "tf_ops", "common")
    sources = [main_source] + [os.path.join(root, s) for s in GPU_CXX_SOURCES + GPU_CUDA_SOURCES] \
        + [os.path.join(core, s) for s in GPU_TEST_CORE_SOURCES]
    arch_flags = [f"-arch=sm_{arch}"] if arch else _gencode_flags()
    return [nvcc, "-std=c++17", "-O2", "-DTFRING_WITH_NCCL=1", *arch_flags, f"-I{nccl_inc}",
            *sources, "-o", output, f"-L{nccl_lib}", "-l:libnccl.so.2",
            f"-Xlinker=-rpath,{nccl_lib}", "-lpthread"]
