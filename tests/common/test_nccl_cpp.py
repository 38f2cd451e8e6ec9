"""Builds and runs the unit tests of the GPU pieces' logic
(tf_ops/common/tests/: the NCCL communicators, the NCCL data plane, the GPU
executors, the hierarchical GPU plane) under AddressSanitizer and UBSan,
with a fake NCCL/CUDA on host memory (fake_nccl.h): no GPU, nccl.h or CUDA
toolkit needed, so they run in CI. The same plane on a real GPU is
tests/common/test_nccl_gpu.py."""
import os

import pytest

from support import ROOT, run_sanitized_cpp_test
from tfring.build.unit_tests import NCCL_LOGIC_UNIT_TESTS, unit_test_sources

CORE = os.path.join(ROOT, "tf_ops", "common")


@pytest.mark.needs_tool("g++")
@pytest.mark.parametrize("program", NCCL_LOGIC_UNIT_TESTS)
def test_nccl_plane_unit_tests(tmp_path, program):
    # TFRING_NCCL_PLANE_LOGIC compiles the plane's logic, which the CPU
    # library leaves out, without TFRING_WITH_NCCL (which would need nccl.h).
    run_sanitized_cpp_test(tmp_path / program[:-len(".cc")], unit_test_sources(program, ROOT),
                           flags=["-DTFRING_NCCL_PLANE_LOGIC"], libs=["-lpthread"])


def test_cpu_library_leaves_the_gpu_code_out():
    """The GPU files sit in the library's source glob; without
    TFRING_WITH_NCCL they must compile to nothing (no nccl.h, no symbols)."""
    for rel in ("ops/nccl_communicators.cc", "ops/nccl_data_plane.cc", "ops/gpu_executor.cc",
                "ops/hierarchical_gpu_data_plane.cc", "ops/cuda/cuda_nccl_api.cc",
                "ops/cuda/gpu_setup.cc"):
        with open(os.path.join(CORE, rel)) as f:
            text = f.read()
        first = next(line for line in text.splitlines() if line.startswith("#"))
        assert first.startswith("#if") and "TFRING_WITH_NCCL" in first, rel
        assert text.rstrip().endswith("#endif  // GPU build"), rel
