"""Builds the shared-memory data plane's C++ test (tf_ops/common/tests/
shm_test.cc) under AddressSanitizer and UBSan, with no MPI and no TensorFlow,
and runs it at np=2 and np=3: forked ranks check what is particular to the
shm plane (the single-copy agreement, rank-order reduction, the barrier, a
huge message), that a killed, exited or departed rank ends the others' waits
with an error, and that nothing is left in /dev/shm. Every collective's
results are the conformance suite's (tests/common/ops/test_conformance_cpp.py)."""
import os
import subprocess

import pytest

from support import ROOT
from tfring.build.unit_tests import unit_test_sources

pytestmark = [pytest.mark.needs_tool("g++"),
              pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")]


@pytest.fixture(scope="module")
def shm_test(tmp_path_factory):
    binary = tmp_path_factory.mktemp("shm") / "shm_test"
    cmd = ["g++", "-std=c++17", "-O1", "-g", "-pthread", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=undefined", "-Wall", "-Werror", "-o", str(binary),
           *unit_test_sources("shm_test.cc", ROOT)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    return binary


@pytest.mark.parametrize("np_", [2, 3])
def test_shm_collectives_cpp(shm_test, np_):
    # The binary kills its ranks itself if a job runs too long; the outer
    # timeout is the last resort.
    run = subprocess.run([str(shm_test), "--np", str(np_), "--timeout", "400"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-10000:] + run.stderr[-10000:]
    assert "shm_test: all passed" in run.stdout
    for how in ("kill", "exit", "leave"):
        assert f"{how}: tfring" in run.stdout, run.stdout  # the survivors' error, reported
