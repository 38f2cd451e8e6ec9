"""A rank of a tfring.core job is killed, or stopped (alive but silent),
mid-job: every other rank's pending collective fails with a
HorovodInternalError naming it, later ones fail at once, and the job ends by
itself (never tfringrun's timeout)."""
import os

import pytest

from support import rank_lines, tfringrun

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dead_peer_worker.py")
JOB_TIMEOUT = 90


@pytest.mark.parametrize("np_, victim", [(2, 1), (3, 2), (3, 0)])
def test_killed_rank_is_named_and_nothing_hangs(np_, victim, controller, core_module_path,
                                                tmp_path):
    _check_lost_rank(np_, victim, "kill", controller, tmp_path)


@pytest.mark.parametrize("np_, victim", [(2, 1), (3, 0)])
def test_stopped_rank_is_named_and_nothing_hangs(np_, victim, core_module_path, tmp_path):
    # A stopped rank is alive to the peer monitor: only the TCP transport's
    # heartbeats find it (MPI has none). The survivors wait for it inside the
    # shared-memory plane (the steady state skips negotiation), which must
    # hear of it from there.
    result = _check_lost_rank(np_, victim, "stop", "tcp", tmp_path)
    speculating = {int(text.split()[1]): text.split()[2] for _, text in rank_lines(result.stdout)
                   if text.startswith("SPECULATING ")}
    assert all(speculating.get(r) == "1" for r in range(np_) if r != victim), (
        f"the survivors did not reach the steady state:\n{result.stdout[-5000:]}")


def _check_lost_rank(np_, victim, how, controller, tmp_path):
    result = tfringrun(np_, ["python", WORKER, str(victim), str(tmp_path), how],
                       timeout=JOB_TIMEOUT, controller=controller)
    assert result.returncode != 124, f"the job hung:\n{result.stdout[-5000:]}"
    reports = {}
    for _, text in rank_lines(result.stdout):
        if text.startswith("RESULT "):
            _, rank, tag, rest = text.split(" ", 3)
            reports[int(rank), tag] = rest
    for rank in (r for r in range(np_) if r != victim):
        for tag in ("pending", "later"):
            got = reports.get((rank, tag))
            assert got is not None, (
                f"rank {rank} reported nothing ({tag}):\n{result.stdout[-5000:]}")
            kind, code, internal, cause, failed, message = got.split(" ", 5)
            assert kind == "AbortedError" and code == "3" and internal == "True", got
            assert cause == "peer_failure" and failed == str(victim), got
            assert f"rank {victim}" in message, got
    assert not any(r == victim for r, _ in reports), "the victim outlived its death"
    return result
