"""Builds the shared-memory data plane's C++ tests (tf_ops/common/tests/:
shm_plane_test.cc, shm_failures_test.cc) under AddressSanitizer and UBSan,
with no MPI and no TensorFlow, and runs each at np=2 and np=3: forked ranks
check what is particular to the shm plane (the single-copy agreement,
rank-order reduction, the barrier, a huge message), that a killed, exited or
departed rank ends the others' waits with an error, and that nothing is left
in /dev/shm. Every collective's results are the conformance suite's
(tests/common/ops/test_conformance_cpp.py)."""
import os
import re
import subprocess

import pytest

from support import ROOT, build_sanitized_cpp
from tfring.build.unit_tests import unit_test_sources

pytestmark = [pytest.mark.needs_tool("g++"),
              pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")]


@pytest.fixture(scope="module")
def shm_programs(tmp_path_factory):
    out = tmp_path_factory.mktemp("shm")
    return {name: build_sanitized_cpp(out / name, unit_test_sources(name + ".cc", ROOT),
                                      flags=["-pthread"], build_timeout=600)
            for name in ("shm_plane_test", "shm_failures_test")}


def run(binary, np_):
    # The binary kills its ranks itself if a job runs too long; the outer
    # timeout is the last resort.
    run = subprocess.run([binary, "--np", str(np_), "--timeout", "400"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-10000:] + run.stderr[-10000:]
    return run.stdout


@pytest.mark.parametrize("np_", [2, 3])
def test_shm_plane_cpp(shm_programs, np_):
    stdout = run(shm_programs["shm_plane_test"], np_)
    assert "shm_plane_test: all passed" in stdout
    ranks = re.findall(r"\[rank (\d+)\] \d+ checks, 0 failed", stdout)
    assert sorted(ranks) == [str(r) for r in range(np_)], stdout  # every rank reported


@pytest.mark.parametrize("np_", [2, 3])
def test_shm_failures_cpp(shm_programs, np_):
    stdout = run(shm_programs["shm_failures_test"], np_)
    assert "shm_failures_test: all passed" in stdout
    for how in ("kill", "exit", "leave", "kill-broadcast"):
        assert f"{how}: tfring" in stdout, stdout  # the survivors' error, reported
        survivors = re.findall(rf"\[rank (\d+)\] {how}: \d+ checks, 0 failed", stdout)
        assert sorted(survivors) == [str(r) for r in range(np_ - 1)], stdout
