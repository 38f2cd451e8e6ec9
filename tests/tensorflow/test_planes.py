"""The TF-level conformance run: the collective x dtype x op checks of
ranks/test_collectives.py on every CPU data plane forced for every message
size, under each controller, at np=2 and np=3. The planes' own thresholds
and every size around them are the C++ conformance suite's
(tests/common/ops/test_conformance_cpp.py); this checks that the TF ops reach
each plane whole (scaling, averaging, dtypes, tf.function and graph mode).
The timeline names the plane that ran each collective, which proves the
plane was used rather than the fallback."""
import os

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

# plane -> (the environment that forces it at np ranks, its timeline name)
PLANES = {
    "shm": (lambda np_: {"TFRING_CPU_OPERATIONS": "shm", "TFRING_SHM_MIN_BYTES": "0"}, "SHM"),
    "ring": (lambda np_: {"TFRING_CPU_OPERATIONS": "ring", "TFRING_CROSS_HOST_MIN_BYTES": "0"},
             "ring"),
    # Two fake hosts, the first with two ranks at np=3.
    "hierarchical": (lambda np_: {"TFRING_HOSTNAME": ",".join("aab" if np_ == 3 else "ab"),
                                  "TFRING_HIERARCHICAL_ALLREDUCE": "1",
                                  "TFRING_CROSS_HOST_MIN_BYTES": "0"}, "hierarchical"),
    # Neither shm nor ring: the transport's own plane.
    "mpi": (lambda np_: {"TFRING_CPU_OPERATIONS": "mpi"}, "MPI"),
}


def _cases():
    for plane in PLANES:
        for controller in ("mpi", "tcp"):
            for np_ in (2, 3):
                marks = []
                if plane == "mpi" and controller == "tcp":
                    marks = [pytest.mark.skip(reason="the TCP controller has no MPI plane "
                                              "(its own plane is the ring, run above)")]
                    case_id = f"{plane}-{controller}-np{np_}-not-meaningful"
                else:
                    case_id = f"{plane}-{controller}-np{np_}"
                yield pytest.param(plane, controller, np_, marks=marks, id=case_id)


@pytest.mark.parametrize("plane,controller,np_", list(_cases()))
def test_collectives_on_plane(plane, controller, np_, tmp_path):
    env_for, name = PLANES[plane]
    timeline = tmp_path / "timeline.json"
    check_rank_suite(np_, SUITE, controller, args=("-k", CHECKS),
                     env=dict(env_for(np_), TFRING_TIMELINE=str(timeline)))
    text = timeline.read_text()
    # (Some collectives may still run elsewhere: those of process sets the
    # plane is not made for, and what every plane leaves to the fallback.)
    for collective in ("ALLREDUCE", "ALLGATHER", "BROADCAST"):
        assert f"{name}_{collective}" in text, f"no {collective} ran on the {plane} plane"
