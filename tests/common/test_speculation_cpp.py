"""Builds and runs the C++ unit tests of speculation
(tf_ops/common/tests/speculation_test.cc) under AddressSanitizer and UBSan:
controllers in threads that skip negotiation in the steady state and fall
back together, and the divergence flag in the fusion buffer. Needs no
TensorFlow and no MPI."""

import pytest

from support import ROOT, run_sanitized_cpp_test
from tfring.build.unit_tests import unit_test_sources


@pytest.mark.needs_tool("g++")
def test_speculation_unit_tests(tmp_path):
    run_sanitized_cpp_test(tmp_path / "speculation_test",
                           unit_test_sources("speculation_test.cc", ROOT))
