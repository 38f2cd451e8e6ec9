"""The TF ops on every CPU data plane: the collective x dtype x op checks of
ranks/test_collectives.py with each plane forced for every message size,
under each controller that has it (np=2 or 3). The plane the core picks by
itself is tests/common/ops/test_plane_choice.py's (on tfring.core). The
planes' thresholds and every size around them are the C++ conformance
suite's (tests/common/ops/test_conformance_cpp.py); this checks that the TF
ops reach each plane whole (scaling, averaging, dtypes, grouping, eager and
tf.function). The timeline names the plane that ran each collective, which
proves the plane was used rather than the fallback; after each job /dev/shm
must hold no segment of ours."""
import os
import re

import pytest

from support import check_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks", "test_collectives.py")
# The suite's collective x dtype x op checks, eagerly and in tf.function (TF1
# graph mode reaches the planes the same way and costs a third more): a
# lean subset, one launch per combination, so that the matrix stays cheap.
CHECKS = ("(allreduce_every_dtype_and_op or allreduce_bool or allreduce_scale_factors or "
          "grouped_allreduce_mixed_dtypes or allgather_every_dtype or allgather_empty_rank or "
          "broadcast_every_root_and_dtype or large_broadcast_and_allgather or "
          "alltoall_with_splits or reducescatter_uneven_rows or grouped_reducescatter) "
          "and not graph")
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
# Segment names are /tfring-<pid of rank 0>-<counter>-<random>.
SEGMENT = re.compile(r"^tfring-(\d+)-")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _stale_segments():
    """tfring segments whose creator is gone: ours would be, after the job.
    (A live creator's name is only there for the instant of set-up, and may
    belong to another job running at the same time.)"""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm")
            if (m := SEGMENT.match(name)) and not _alive(int(m.group(1)))}


def _run(np_, controller, env, name, tmp_path):
    timeline = tmp_path / "timeline.json"
    before = _stale_segments()
    check_rank_suite(np_, SUITE, controller, args=("-k", CHECKS),
                     env=dict(env, TFRING_TIMELINE=str(timeline)))
    assert _stale_segments() - before == set(), "shared-memory segments left in /dev/shm"
    text = timeline.read_text()
    # (Some collectives may still run elsewhere: those of process sets the
    # plane is not made for, and what every plane leaves to the fallback.)
    for collective in ("ALLREDUCE", "ALLGATHER", "BROADCAST"):
        assert f"{name}_{collective}" in text, f"no {collective} ran on the {name} plane"


# Each plane under each controller that has it, once, at np=2 or np=3 in
# turn: the plane x np x size matrix, and the ring over TCP, are the C++
# conformance suite's (it runs every plane at np=1, 2 and 3); here the TF ops
# only have to reach each plane whole. (The TCP controller has no MPI plane:
# its own plane is the ring, run here under it.)
FORCED_CASES = [("shm", "mpi", 3), ("shm", "tcp", 2), ("ring", "mpi", 2), ("ring", "tcp", 3),
                ("hierarchical", "mpi", 2), ("hierarchical", "tcp", 3), ("mpi", "mpi", 3)]


@pytest.mark.parametrize("plane,controller,np_", FORCED_CASES,
                         ids=[f"{p}-{c}-np{n}" for p, c, n in FORCED_CASES])
def test_collectives_on_plane(plane, controller, np_, tmp_path):
    env_for, name = FORCED[plane]
    _run(np_, controller, dict(CUT_OVERS, **env_for(np_)), name, tmp_path)
