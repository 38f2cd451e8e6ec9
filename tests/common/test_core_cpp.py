"""Builds and runs the C++ unit tests of the framework-agnostic core
(tf_ops/common/tests/core_test.cc) under AddressSanitizer and UBSan. They need
no TensorFlow and no MPI, which is the layering this also guards."""
import glob
import os
import shutil

import pytest

from support import ROOT, run_sanitized_cpp_test

CORE = os.path.join(ROOT, "tf_ops", "common")
# The pieces of the core with no MPI or TF dependency.
SOURCES = ["controller.cc", "message.cc", "fusion_buffer.cc", "reduction.cc", "common.cc",
           "response_cache.cc", "timeline.cc", "tensor_queue.cc", "executor.cc",
           "in_flight.cc", "ops/data_plane_selector.cc",
           "config.cc", "logging.cc", "ops/adasum.cc", "peer_monitor.cc"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_core_unit_tests(tmp_path):
    run_sanitized_cpp_test(tmp_path / "core_test",
                           [os.path.join(CORE, "tests", "core_test.cc")] +
                           [os.path.join(CORE, s) for s in SOURCES])


def test_core_has_no_tensorflow_includes():
    for path in glob.glob(os.path.join(CORE, "**", "*.[ch]*"), recursive=True):
        with open(path) as f:
            assert "tensorflow/" not in f.read(), f"{path} includes TensorFlow"
