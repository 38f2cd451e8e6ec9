"""Builds and runs the NCCL data plane's GPU harness
(tf_ops/common/tests/gpu/nccl_gpu_test.cc) on a real GPU at np=1: every
collective and dtype against host arithmetic, fusion, Average and scaling on
the GPU, a real NCCL error as a Status, and a dead peer ending in an abort.

Marked `gpu`: it needs an NVIDIA GPU, nvcc and NCCL, is skipped without them,
and CI never needs it (`pytest -m gpu tests/common/test_nccl_gpu.py`)."""
import os
import shutil
import subprocess

import pytest

from support import ROOT
from tfring.build import cuda

pytestmark = pytest.mark.gpu


def _gpu_compute_capability():
    """'90' for an H100, or None without an NVIDIA GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    run = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60)
    if run.returncode != 0 or not run.stdout.strip():
        return None
    return run.stdout.split()[0].replace(".", "")


def test_nccl_plane_on_gpu(tmp_path):
    arch = _gpu_compute_capability()
    if arch is None:
        pytest.skip("needs an NVIDIA GPU (nvidia-smi found none)")
    if cuda.find_nvcc() is None or cuda.find_nccl() is None:
        pytest.skip("needs nvcc and NCCL (nvidia-nccl-cu12 or NCCL_HOME)")
    binary = tmp_path / "nccl_gpu_test"
    cmd = cuda.gpu_test_command(
        os.path.join(ROOT, "tf_ops", "common", "tests", "gpu", "nccl_gpu_test.cc"), str(binary),
        arch=arch)
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, " ".join(cmd) + "\n" + build.stderr
    try:
        run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the GPU harness hung; its output so far:\n{e.stdout}\n{e.stderr}")
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert ", 0 failed" in run.stdout
