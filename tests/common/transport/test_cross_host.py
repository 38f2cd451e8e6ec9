"""Cross-host jobs over the TCP transport, with fake hosts that have network
stacks of their own (tests/netns_support.py: network namespaces joined by a
bridge, ranks started in them through a fake ssh). The ring really crosses
an interface, a rank can die on another host, and a host can be cut off.

Needs root and `ip netns`; skipped (with the reason) where the machine does
not allow it. Detection times are printed; run with -s to see them.
"""
import contextlib
import glob
import os
import re
import subprocess
import sys
import threading
import time

import pytest

import netns_support
from support import ROOT, rank_lines

WORKER = os.path.join(ROOT, "tests", "common", "transport", "cross_host_worker.py")
DETECTION_BOUND_S = 5.0

pytestmark = pytest.mark.skipif(not netns_support.available(),
                                reason="needs root and network namespaces (ip netns)")


@contextlib.contextmanager
def _job(hosts, names, scenario, tmp_path, extra_env=None):
    """tfringrun --tcp with one rank per fake host, as a Popen; killed on the
    way out if still running (FakeHosts' exit ends what ran inside them)."""
    proc = _start(hosts, names, scenario, tmp_path, extra_env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _start(hosts, names, scenario, tmp_path, extra_env=None):
    """Starts tfringrun --tcp with one rank per fake host; returns the Popen."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    hosts.ssh_command(str(bin_dir))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               TFRING_HEARTBEAT_SECONDS="1", **(extra_env or {}))
    cmd = [sys.executable, "-m", "tfring.runner.launch", "--tcp", "-np", str(len(names)),
           "-H", ",".join(f"{n}:1" for n in names), "--network-interfaces", hosts.interfaces(),
           "--timeout", "120", sys.executable, WORKER, scenario, str(tmp_path)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _results(output):
    return [text.split(None, 2) for _, text in rank_lines(output) if text.startswith("RESULT")]


def _running(pid):
    """True while `pid` exists and is not a zombie (an ended process whose
    new parent, init here, has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _no_rank_left(tmp_path, seconds=5.0):
    pids = [int(open(p).read()) for p in glob.glob(str(tmp_path / "pid.*"))]
    deadline = time.time() + seconds
    while any(map(_running, pids)) and time.time() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _running(p)]
    assert not left, f"rank processes {left} outlived the job"


@pytest.mark.parametrize("np_", [2, 3])
def test_ring_across_fake_hosts(np_, tmp_path):
    names = [f"h{i}" for i in range(np_)]
    with netns_support.FakeHosts(names) as hosts:
        with _job(hosts, names, "ring", tmp_path, {"TFRING_CROSS_HOST_MIN_BYTES": "0"}) as proc:
            out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-5000:]
    lines = [text for _, text in rank_lines(out) if text.startswith("RESULT")]
    assert len(lines) == np_, out[-5000:]
    for rank, text in enumerate(sorted(lines)):
        assert f"host=h{rank}" in text, text
        assert f"local_size=1 cross_size={np_} gloo=True mpi=False mpi4py_loaded=False" in text


def _detection(out, event_time):
    """[(rank, seconds from the event to the rank's error, message)]."""
    found = []
    for _, text in rank_lines(out):
        m = re.match(r"RESULT (\d+) aborted ([\d.]+) (.*)", text)
        if m:
            found.append((int(m.group(1)), float(m.group(2)) - event_time, m.group(3)))
    return found


def test_rank_killed_on_another_host_is_named_within_5s(tmp_path):
    names = ["h0", "h1", "h2"]
    with netns_support.FakeHosts(names) as hosts:
        with _job(hosts, names, "kill", tmp_path) as proc:
            out, _ = proc.communicate(timeout=180)
            _no_rank_left(tmp_path)
    assert proc.returncode != 0, out[-5000:]
    killed_at = float((tmp_path / "killed_at").read_text())
    survivors = _detection(out, killed_at)
    assert sorted(r for r, _, _ in survivors) == [0, 1], out[-5000:]
    for rank, seconds, message in survivors:
        print(f"rank {rank} learnt of rank 2's death after {seconds:.2f} s: {message[:200]}")
        assert seconds <= DETECTION_BOUND_S, (seconds, message)
        assert "rank 2" in message and "h2" in message, message


def _wait_until(condition, proc, what, timeout=120):
    """Polls `condition` while tfringrun runs; fails naming `what` after `timeout` s."""
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise AssertionError(f"{what}:\n{proc.communicate()[0][-5000:]}")
        time.sleep(0.005)


@pytest.mark.parametrize("np_", [2, 3])
def test_host_cut_in_a_64mb_allreduce_is_named_on_every_survivor_within_5s(np_, tmp_path):
    names = [f"h{i}" for i in range(np_)]
    victim = np_ - 1
    with netns_support.FakeHosts(names) as hosts:
        with _job(hosts, names, "cut", tmp_path) as proc:
            _wait_until(lambda: all((tmp_path / f"ready.{r}").exists() for r in range(np_)),
                        proc, "the ranks never got ready")
            # Cut once 16 MB more crossed the victim's link: a 64 MB allreduce
            # is under way (they run back to back), not merely about to start.
            start = hosts.traffic(names[victim])
            _wait_until(lambda: hosts.traffic(names[victim]) - start > (16 << 20), proc,
                        "no allreduce traffic crossed the link")
            cut_at = time.time()
            hosts.cut(names[victim])
            out, _ = proc.communicate(timeout=180)
            _no_rank_left(tmp_path)
    assert proc.returncode != 0, out[-5000:]
    survivors = [d for d in _detection(out, cut_at) if d[0] != victim]
    assert sorted(r for r, _, _ in survivors) == list(range(victim)), out[-5000:]
    for rank, seconds, message in survivors:
        print(f"rank {rank} learnt that host h{victim} was cut off after {seconds:.2f} s: "
              f"{message[:200]}")
        assert seconds <= DETECTION_BOUND_S, (seconds, message)
        assert f"rank {victim}" in message and f"h{victim}" in message, message
    # tfringrun fails and names the host it lost no word from.
    assert (f"ranks {victim} did not report how they ended (on h{victim}: no word from there; "
            "is it still reachable?)") in out, out[-5000:]
