"""The data plane the core chooses by itself (data_plane_selector.cc), in a
real job: shared memory on one host, the ring across hosts, hierarchical
with two ranks per host. Each job runs every collective that a plane takes
on tfring.core arrays, checks every value, and reads the timeline, which
names the plane that ran each collective (so a fallback would show). Each
plane forced, with the whole collectives suite, is test_planes.py's; every
plane's numerics are the C++ conformance suite's."""
import sys
import textwrap

import pytest

from support import rank_lines, tfringrun

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import tfring.core as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    # Large enough for the shared-memory plane's default minimum size.
    count = 1 << 20
    x = np.arange(count, dtype=np.float32) + r
    total = hvd.allreduce(x, op=hvd.Sum, name="big_sum")
    assert np.array_equal(total, n * np.arange(count, dtype=np.float32) + n * (n - 1) / 2)
    mean = hvd.allreduce(np.full(count, float(r), np.float64), op=hvd.Average, name="big_mean")
    assert np.array_equal(mean, np.full(count, (n - 1) / 2))
    gathered = hvd.allgather(np.full((r + 1, 1024), r, np.int32), name="big_gather")
    assert np.array_equal(gathered[:, 0], np.repeat(np.arange(n), np.arange(1, n + 1)))
    sent = hvd.broadcast(np.full(count, r + 7, np.int64), n - 1, name="big_bcast")
    assert np.array_equal(sent, np.full(count, n - 1 + 7))
    hvd.shutdown()
    print("CHECKED", r, flush=True)
""")

# name -> (np, environment, the plane the core must choose)
CHOSEN = {
    "auto-one-host-np2": (2, {"TFRING_CPU_OPERATIONS": "auto"}, "SHM"),
    "auto-hosts-a,a,b-np3": (3, {"TFRING_CPU_OPERATIONS": "auto", "TFRING_HOSTNAME": "a,a,b",
                                 "TFRING_CROSS_HOST_MIN_BYTES": "0"}, "ring"),
    # Two ranks per host: the hierarchical plane's two lanes, each running
    # the allreduce algorithm forced by name (the one above chooses).
    "hierarchical-a,a,b,b-np4": (4, {"TFRING_HOSTNAME": "a,a,b,b",
                                     "TFRING_HIERARCHICAL_ALLREDUCE": "1",
                                     "TFRING_ALLREDUCE_ALGORITHM": "recursive_doubling",
                                     "TFRING_CROSS_HOST_MIN_BYTES": "0"}, "hierarchical"),
}


# Each case under one controller, the two in turn.
@pytest.mark.parametrize("case,controller", [(case, ("mpi", "tcp")[i % 2])
                                             for i, case in enumerate(CHOSEN)])
def test_the_core_chooses_the_plane(case, controller, tmp_path):
    np_, env, plane = CHOSEN[case]
    timeline = tmp_path / "timeline.json"
    result = tfringrun(np_, [sys.executable, "-c", SCRIPT], timeout=180, controller=controller,
                       env=dict(env, TFRING_TIMELINE=str(timeline)))
    assert result.returncode == 0, result.stdout[-8000:]
    checked = sorted(r for r, text in rank_lines(result.stdout) if text.startswith("CHECKED"))
    assert checked == list(range(np_)), result.stdout[-8000:]
    text = timeline.read_text()
    # (Some collectives may still run elsewhere: what every plane leaves to
    # the fallback; the large ones of each kind must not.)
    for collective in ("ALLREDUCE", "ALLGATHER", "BROADCAST"):
        assert f"{plane}_{collective}" in text, f"no {collective} ran on the {plane} plane ({case})"
