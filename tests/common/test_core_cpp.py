"""Builds and runs the C++ unit tests of the framework-agnostic core
(tf_ops/common/tests/: negotiation, the response cache, execution, Adasum,
failures, the allreduce algorithms over TCP worlds on threads) under
AddressSanitizer and UBSan. They need no TensorFlow and no MPI, which is the
layering this also guards."""
import glob
import os

import pytest

from support import ROOT, run_sanitized_cpp_test
from tfring.build.unit_tests import unit_test_sources

CORE = os.path.join(ROOT, "tf_ops", "common")


CORE_PROGRAMS = ["negotiation_test.cc", "response_cache_test.cc", "execution_test.cc",
                 "adasum_test.cc", "failures_test.cc", "allreduce_algorithms_test.cc"]


@pytest.mark.needs_tool("g++")
@pytest.mark.parametrize("program", CORE_PROGRAMS)
def test_core_unit_tests(tmp_path, program):
    run_sanitized_cpp_test(tmp_path / program[:-len(".cc")], unit_test_sources(program, ROOT))


def test_core_has_no_tensorflow_includes():
    for path in glob.glob(os.path.join(CORE, "**", "*.[ch]*"), recursive=True):
        with open(path) as f:
            assert "tensorflow/" not in f.read(), f"{path} includes TensorFlow"
