"""Builds and runs the C++ unit tests of reduction.cc (tf_ops/common/tests/
reduction_test.cc) under AddressSanitizer and UBSan: scaling and averaging
round as TF's own arithmetic does, bit for bit, and ReduceInOrder reduces in
the order of its sources whichever source is the output."""
import os
import shutil

import pytest

from support import ROOT, run_sanitized_cpp_test

CORE = os.path.join(ROOT, "tf_ops", "common")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_reduction_unit_tests(tmp_path):
    run_sanitized_cpp_test(tmp_path / "reduction_test",
                           [os.path.join(CORE, "tests", "reduction_test.cc")] +
                           [os.path.join(CORE, s) for s in ("reduction.cc", "common.cc")])
