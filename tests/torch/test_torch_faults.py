"""A rank of a tfring.torch training job is killed: every other rank's
step() raises HorovodInternalError naming it, and the job ends by itself."""
import os

from support import rank_lines, tfringrun

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_dead_peer_worker.py")


def test_killed_rank_is_named(controller, torch_ready):
    result = tfringrun(3, ["python", WORKER], timeout=90, controller=controller)
    assert result.returncode != 124, f"the job hung:\n{result.stdout[-5000:]}"
    reports = {r: text.split(" ", 5)[2:] for r, text in rank_lines(result.stdout)
               if text.startswith("RESULT ")}
    assert sorted(reports) == [0, 2], result.stdout[-5000:]
    for kind, internal, failed, message in reports.values():
        assert internal == "True" and failed == "1" and "rank 1" in message, (kind, message)
