"""Builds and runs the C++ unit tests of reduction.cc (tf_ops/common/tests/
reduction_test.cc) under AddressSanitizer and UBSan: scaling and averaging
round as TF's own arithmetic does, bit for bit, and ReduceInOrder reduces in
the order of its sources whichever source is the output."""

import pytest

from support import ROOT, run_sanitized_cpp_test
from tfring.build.unit_tests import unit_test_sources


@pytest.mark.needs_tool("g++")
def test_reduction_unit_tests(tmp_path):
    run_sanitized_cpp_test(tmp_path / "reduction_test", unit_test_sources("reduction_test.cc", ROOT))
