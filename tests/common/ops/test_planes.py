"""Every CPU data plane forced, reached whole through the core: tfring.core's
collectives rank suite (tests/core/ranks/test_collectives.py: every
collective, dtype and op, scaling, grouping, fusion, async) with one plane
forced for every message size, under each controller that has it (np=2 or
3). The plane the core picks by itself is test_plane_choice.py's. The
planes' thresholds and every size around them are the C++ conformance
suite's (test_conformance_cpp.py); this checks that a binding's calls reach
each plane whole, through negotiation, fusion and the executor. The
bindings add nothing per plane (the TF ops, Keras and torch reach the same
Enqueue: their own rank suites check what they add), so the cheapest one,
tfring.core, runs it. The timeline names the plane that ran each
collective, which proves the plane was used rather than the fallback; after
each job /dev/shm must hold no segment of ours."""
import os
import re

import pytest

from support import ROOT, check_rank_suite

SUITE = os.path.join(ROOT, "tests", "core", "ranks", "test_collectives.py")
# Every collective check of the suite; not those of the binding itself
# (topology, names, GPU and torch arrays).
CHECKS = "not topology and not interned and not gpu and not torch"
CUT_OVERS = {"TFRING_SHM_MIN_BYTES": "0", "TFRING_CROSS_HOST_MIN_BYTES": "0"}


def _hosts(np_):
    """Two fake hosts, the first with the extra rank."""
    return ",".join("a" if r < (np_ + 1) // 2 else "b" for r in range(np_))


# plane -> (the environment that forces it at np ranks, its timeline name)
FORCED = {
    "shm": (lambda np_: {"TFRING_CPU_OPERATIONS": "shm"}, "SHM"),
    "ring": (lambda np_: {"TFRING_CPU_OPERATIONS": "ring"}, "ring"),
    "hierarchical": (lambda np_: {"TFRING_HOSTNAME": _hosts(np_),
                                  "TFRING_HIERARCHICAL_ALLREDUCE": "1"}, "hierarchical"),
    # Neither shm nor ring: the transport's own plane.
    "mpi": (lambda np_: {"TFRING_CPU_OPERATIONS": "mpi"}, "MPI"),
}
# Segment names are /tfring-<pid of the creating rank (a host's first)>-<counter>-<random>.
SEGMENT = re.compile(r"^tfring-(\d+)-")


def _segments_of(pids):
    """tfring segments in /dev/shm created by any of `pids`: the job's ranks
    (not another job's, which another test worker may be running)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm")
            if (m := SEGMENT.match(name)) and int(m.group(1)) in pids}


def _run(np_, controller, env, name, tmp_path):
    timeline = tmp_path / "timeline.json"
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    check_rank_suite(np_, SUITE, controller, args=("-k", CHECKS),
                     env=dict(env, TFRING_TIMELINE=str(timeline),
                              TFRING_TEST_PIDS_DIR=str(pids_dir)))
    pids = {int((pids_dir / f"pid.{r}").read_text()) for r in range(np_)}
    assert _segments_of(pids) == set(), "shared-memory segments left in /dev/shm"
    text = timeline.read_text()
    # (Some collectives may still run elsewhere: those of process sets the
    # plane is not made for, and what every plane leaves to the fallback.)
    for collective in ("ALLREDUCE", "ALLGATHER", "BROADCAST"):
        assert f"{name}_{collective}" in text, f"no {collective} ran on the {name} plane"


# Each plane under each controller that has it, once, at np=2 or np=3 in
# turn: the plane x np x size matrix, and the ring over TCP, are the C++
# conformance suite's (it runs every plane at np=1, 2 and 3); here a
# binding's calls only have to reach each plane whole. (The TCP controller has no MPI plane:
# its own plane is the ring, run here under it.)
FORCED_CASES = [("shm", "mpi", 3), ("shm", "tcp", 2), ("ring", "mpi", 2), ("ring", "tcp", 3),
                ("hierarchical", "mpi", 2), ("hierarchical", "tcp", 3), ("mpi", "mpi", 3)]


@pytest.mark.parametrize("plane,controller,np_", FORCED_CASES,
                         ids=[f"{p}-{c}-np{n}" for p, c, n in FORCED_CASES])
def test_collectives_on_plane(plane, controller, np_, tmp_path):
    env_for, name = FORCED[plane]
    _run(np_, controller, dict(CUT_OVERS, **env_for(np_)), name, tmp_path)
