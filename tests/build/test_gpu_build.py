"""The GPU build of tfring.core made on a machine with no GPU and no nvcc,
from NVIDIA's CUDA 12 pip wheels alone (as a TensorFlow user with
``tensorflow[and-cuda]`` has them): it compiles with g++, its kernels left to
NVRTC; it loads; ``nccl_built()`` is True; and tfring.core's rank suite passes
on it at np=2 (no GPU here, so every collective takes the host planes).
The TensorFlow kernels' GPU half compiles against TensorFlow's headers.

Needs the wheels (``nvidia-nccl-cu12``, ``nvidia-cuda-runtime-cu12``,
``nvidia-cuda-nvrtc-cu12``, ``nvidia-cuda-nvcc-cu12``,
``nvidia-cuda-cccl-cu12``; requirements-dev.txt installs them): skipped
without them, failed instead where ``TFRING_REQUIRE_GPU_BUILD=1`` (CI)."""
import os
import subprocess
import sys

import pytest

from support import ROOT, check_rank_suite
from tfring.build import cuda

SUITE = os.path.join(ROOT, "tests", "core", "ranks")


@pytest.fixture(scope="module")
def gpu_env(tmp_path_factory):
    missing = [what for what, found in (("NCCL", cuda.find_nccl()),
                                        ("the CUDA runtime", cuda.find_cuda_runtime()))
               if found is None]
    if missing:
        why = " and ".join(missing) + " not found (pip install -r requirements-dev.txt)"
        if os.environ.get("TFRING_REQUIRE_GPU_BUILD") == "1":
            pytest.fail(why)
        pytest.skip(why)
    env = dict(os.environ, TFRING_WITH_NCCL="1", TFRING_GPU_KERNELS="nvrtc",
               TFRING_CACHE_DIR=str(tmp_path_factory.mktemp("gpu-cache")))
    build = subprocess.run([sys.executable, "-m", "tfring.build", "core"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=1500)
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    assert "compiled by nvrtc" in build.stdout + build.stderr
    return env


def test_gpu_build_loads_without_a_gpu(gpu_env):
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, tfring.core as c; print(c.nccl_built(), c.gpu_built(),"
         " 'tensorflow' in sys.modules)"], cwd=ROOT, env=gpu_env, capture_output=True, text=True,
        timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["True", "True", "False"], probe.stdout


def test_core_rank_suite_on_the_gpu_build(gpu_env):
    check_rank_suite(2, SUITE, "tcp", env={k: gpu_env[k] for k in (
        "TFRING_WITH_NCCL", "TFRING_GPU_KERNELS", "TFRING_CACHE_DIR")})


@pytest.mark.needs_tool("g++")
@pytest.mark.parametrize("source", ["kernels.cc", "tf_device.cc", "xla/custom_call.cc"])
def test_tf_gpu_kernels_compile(source):
    """The TensorFlow kernels' GPU half (DEVICE_GPU registrations, TF's
    stream and device ordinal, ready events) and the XLA custom call's CUDA
    handler (XLA's stream, the ready event recorded there) compile against
    the installed TensorFlow's headers. They run only where TensorFlow sees
    a GPU (the `tf_gpu` suites); here they must at least compile."""
    tf = pytest.importorskip("tensorflow")
    from tfring.build import library
    flags = (["-std=c++17", "-w", "-DTFRING_WITH_NCCL"] + list(tf.sysconfig.get_compile_flags())
             + [f"-I{d}" for d in library.xla_options(tf).include_dirs])
    path = os.path.join(ROOT, "tf_ops", "tensorflow", source)
    result = subprocess.run(["g++", "-fsyntax-only", *flags, path], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    if source.startswith("xla/"):
        # The CUDA handler is there, not left out by the preprocessor.
        expanded = subprocess.run(["g++", "-E", *flags, path], capture_output=True, text=True,
                                  timeout=600)
        assert expanded.returncode == 0 and "CudaEntry" in expanded.stdout, expanded.stderr[-2000:]


def test_kernel_compiler_choice(monkeypatch):
    runtime = (["/inc"], "/lib", "libcudart.so.12")
    monkeypatch.setattr(cuda, "nvcc_major", lambda nvcc: {"/cu12/nvcc": 12, "/cu13/nvcc": 13}[nvcc])
    monkeypatch.setenv("TFRING_GPU_KERNELS", "nvrtc")
    assert cuda.kernel_compiler(runtime) == ("nvrtc", None, None)
    monkeypatch.setenv("TFRING_GPU_KERNELS", "cuda")
    assert "is not nvcc, nvrtc or auto" in cuda.kernel_compiler(runtime)[2]
    monkeypatch.delenv("TFRING_GPU_KERNELS")
    for nvcc, want in ((None, "nvrtc"), ("/cu12/nvcc", "nvcc"), ("/cu13/nvcc", "nvrtc")):
        monkeypatch.setattr(cuda, "find_nvcc", lambda: nvcc)
        assert cuda.kernel_compiler(runtime)[0] == want, nvcc
    # Asked for nvcc: one of another CUDA version is an error naming both.
    monkeypatch.setenv("TFRING_GPU_KERNELS", "nvcc")
    kind, _, why = cuda.kernel_compiler(runtime)
    assert kind == "nvcc" and "CUDA 13" in why and "libcudart.so.12" in why
