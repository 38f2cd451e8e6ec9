"""Runs the shared-memory rank suite (ranks/test_shm_collectives.py) with the
automatic choice, which must pick the shm plane; after the job /dev/shm must
hold no segment of ours. (The shm plane forced for every size is in the TF
conformance run, tests/tensorflow/test_planes.py, and its single-copy path
in the C++ conformance suite.)"""
import os
import re

import pytest

from support import run_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks",
                     "test_shm_collectives.py")
# Segment names are /tfring-<pid of rank 0>-<counter>-<random>.
SEGMENT = re.compile(r"^tfring-(\d+)-")

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")


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
    stale = set()
    for name in os.listdir("/dev/shm"):
        m = SEGMENT.match(name)
        if m and not _alive(int(m.group(1))):
            stale.add(name)
    return stale


def _passed_on_every_rank(output, np_):
    ranks = {int(m.group(1)) for m in re.finditer(r"^\[(\d+)\][^\n]*\d+ passed", output, re.M)}
    return ranks == set(range(np_))


def _run_suite(np_, env, tmp_path, controller=None):
    """Runs the suite with a timeline, which names the plane that ran each
    collective ("SHM_ALLREDUCE"); returns the timeline's text. (A fallback
    to MPI would only be logged inside pytest's capture, so the timeline is
    the proof.)"""
    timeline = tmp_path / "timeline.json"
    before = _stale_segments()
    output = run_rank_suite(np_, SUITE, env=dict(env, TFRING_TIMELINE=str(timeline)),
                            controller=controller)
    assert _passed_on_every_rank(output, np_), output[-5000:]
    assert _stale_segments() - before == set(), "shared-memory segments left in /dev/shm"
    return timeline.read_text()


def test_auto_picks_shm_without_harm(tmp_path):
    # On one host, auto builds the shared-memory plane and uses it (at least
    # for large messages), and the suite passes as it is.
    timeline = _run_suite(2, {"TFRING_CPU_OPERATIONS": "auto"}, tmp_path)
    assert "SHM_ALLREDUCE" in timeline, "auto ran no allreduce on shared memory"
