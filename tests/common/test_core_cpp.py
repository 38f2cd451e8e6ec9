"""Builds and runs the C++ unit tests of the framework-agnostic core
(tf_ops/common/tests/core_test.cc) under AddressSanitizer and UBSan. They need
no TensorFlow and no MPI, which is the layering this also guards."""
import glob
import os
import shutil
import subprocess

import pytest

from support import ROOT

CORE = os.path.join(ROOT, "tf_ops", "common")
# The pieces of the core with no MPI or TF dependency.
SOURCES = ["controller.cc", "message.cc", "fusion_buffer.cc", "reduction.cc", "common.cc",
           "response_cache.cc", "timeline.cc", "tensor_queue.cc", "executor.cc",
           "in_flight.cc", "ops/data_plane_selector.cc",
           "config.cc", "logging.cc", "ops/adasum.cc"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_core_unit_tests(tmp_path):
    binary = tmp_path / "core_test"
    cmd = ["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=undefined", "-Wall", "-Werror", "-o", str(binary),
           os.path.join(CORE, "tests", "core_test.cc")] + [os.path.join(CORE, s) for s in SOURCES]
    # ~1 min of CPU, but minutes of wall time on a loaded machine.
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert ", 0 failed" in run.stdout


def test_core_has_no_tensorflow_includes():
    for path in glob.glob(os.path.join(CORE, "**", "*.[ch]*"), recursive=True):
        with open(path) as f:
            assert "tensorflow/" not in f.read(), f"{path} includes TensorFlow"
