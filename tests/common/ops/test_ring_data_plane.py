"""The ring and hierarchical data planes chosen by the core: the rank suite
ranks/test_ring_collectives.py run on the planes (ring forced on one host;
fake hosts through TFRING_HOSTNAME for the flat ring and the hierarchical
plane). The planes' collectives themselves are checked by the conformance
suite (test_conformance_cpp.py)."""
import os
import re

import pytest

from support import rank_lines, run_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks",
                     "test_ring_collectives.py")

# The ring forced on one host and hierarchical on two fake hosts at np=2, 3
# are in the TF conformance run (tests/tensorflow/test_planes.py); these are
# the choices it does not make.
LAUNCHES = {
    # Two fake hosts: auto picks the flat ring for every size.
    "np3-flat-ring-a,a,b": (3, {"TFRING_HOSTNAME": "a,a,b", "TFRING_CPU_OPERATIONS": "auto",
                                "TFRING_CROSS_HOST_MIN_BYTES": "0"}, "ring data plane"),
    # Hierarchical on even hosts (two lanes).
    "np4-hierarchical-a,a,b,b": (4, {"TFRING_HOSTNAME": "a,a,b,b",
                                     "TFRING_HIERARCHICAL_ALLREDUCE": "1",
                                     "TFRING_CROSS_HOST_MIN_BYTES": "0"},
                                 "hierarchical data plane"),
}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_ring_rank_suite(launch, controller):
    np_, env, created = LAUNCHES[launch]
    # Debug logging shows which planes each rank created (it only adds lines
    # to stderr); --capture=sys leaves fd 2 alone, so the C++ log lines
    # written during hvd.init() reach the output.
    output = run_rank_suite(np_, SUITE, timeout=420, controller=controller,
                            env=dict(env, TFRING_LOG_LEVEL="debug", PYTEST_ADDOPTS="--capture=sys"))
    passed = {r for r, text in rank_lines(output) if re.search(r"\d+ passed", text)}
    assert sorted(passed) == list(range(np_)), output[-5000:]
    # Every rank built the plane under test for the global set (so the
    # collectives above ran on it, the cut-over being 0 bytes), not the MPI
    # fallback.
    made = {r for r, text in rank_lines(output, "stderr") if created in text}
    assert made == set(range(np_)), output[-5000:]
    assert "cross-host data plane unavailable" not in output, output[-5000:]
    if "hierarchical" not in created:
        assert "hierarchical data plane" not in output, output[-5000:]

