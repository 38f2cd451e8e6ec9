"""Builds and runs the C++ unit tests of the framework-agnostic core
(tf_ops/common/tests/core_test.cc) under AddressSanitizer and UBSan. They need
no TensorFlow and no MPI, which is the layering this also guards."""
import glob
import os

import pytest

from support import ROOT, run_sanitized_cpp_test
from tfring.build.unit_tests import unit_test_sources

CORE = os.path.join(ROOT, "tf_ops", "common")


@pytest.mark.needs_tool("g++")
def test_core_unit_tests(tmp_path):
    run_sanitized_cpp_test(tmp_path / "core_test", unit_test_sources("core_test.cc", ROOT))


def test_core_has_no_tensorflow_includes():
    for path in glob.glob(os.path.join(CORE, "**", "*.[ch]*"), recursive=True):
        with open(path) as f:
            assert "tensorflow/" not in f.read(), f"{path} includes TensorFlow"
