"""Helpers shared by the tfringrun tests (test_launch.py, test_launch_tcp.py):
running tfringrun, reading its prefixed output, and checking that no
process of a job outlives it."""
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT = 60

# A rank's number and the job's size, under either controller: hydra's PMI
# variables under MPI, tfringrun's under TCP.
RANK_AND_SIZE = ("rank = int(os.environ.get('PMI_RANK') or os.environ['TFRING_RANK']); "
                 "size = int(os.environ.get('PMI_SIZE') or os.environ['TFRING_SIZE'])")

# Rank script prologue: each rank records its pid and its wrapper's pid, then
# waits until every rank has, so a test's failure cannot race a slow start.
RECORD_PIDS = textwrap.dedent("""
    import os, sys, time
    """ + RANK_AND_SIZE + """
    path = os.path.join(sys.argv[1], f"pids.{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    os.rename(path + ".tmp", path)
    while not all(os.path.exists(os.path.join(sys.argv[1], f"pids.{r}")) for r in range(size)):
        time.sleep(0.02)
""")


def tfringrun(*args, timeout=LAUNCH_TIMEOUT, env=None):
    """Runs tfringrun to completion; returns (CompletedProcess, seconds taken)."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tfring.runner.launch", *args], cwd=REPO, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def rank_lines(stdout, stream="stdout"):
    """{rank: [text, ...]} from prefixed output lines."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("[") and f"]<{stream}>:" in line:
            rank, text = line[1:].split(f"]<{stream}>:", 1)
            found.setdefault(int(rank), []).append(text)
    return found


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def assert_all_gone(pid_dir, num_proc):
    """Every rank recorded its pids, and none of those processes is left."""
    pids = []
    for rank in range(num_proc):
        pids += [int(p) for p in (pid_dir / f"pids.{rank}").read_text().split()]
    deadline = time.monotonic() + 3
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "rank processes outlived the job"


def processes_with(marker):
    """Pids of live (non-zombie) processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read() and _alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def assert_no_process_with(marker, seconds=5.0):
    deadline = time.monotonic() + seconds
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = processes_with(marker)
    for pid in left:  # do not leave them running for the next tests
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes of the job outlived it: {left}"


def shell_wrapped(script, *args):
    """A rank command that runs `script` under a shell, as `tfringrun ... ./train.sh`
    would: bash stays the rank's process, and python is its child."""
    return ["bash", "-c", f"{shlex.quote(sys.executable)} -c \"$0\" \"$@\" > /dev/null; exit $?",
            script, *args]


def wait_for_files(directory, names, proc, seconds=LAUNCH_TIMEOUT):
    deadline = time.monotonic() + seconds
    while not all((directory / name).exists() for name in names):
        assert proc.poll() is None, f"tfringrun ended early:\n{proc.communicate()}"
        assert time.monotonic() < deadline, "the ranks did not get ready"
        time.sleep(0.05)


# A rank's end, alone on its line or as the failure that stops the job.
_END_LINE = (r"tfringrun: rank {} (exited with code -?\d+|was killed by signal \d+ \(\w+\))"
             r"(; stopping the job\.|; the job has ended\.)?$")


def reported_ends(stderr, num_proc):
    """{rank: how it ended} from tfringrun's lines about the ranks' ends."""
    ends = {}
    for rank in range(num_proc):
        for line in stderr.splitlines():
            m = re.match(_END_LINE.format(rank), line)
            if m:
                ends[rank] = m.group(1)
    return ends



# tfringrun's options for each controller; a test that takes the `controller`
# fixture (tests/runner/conftest.py) runs once under each.
CONTROLLER_ARGS = {"mpi": ("--mpi",), "tcp": ("--tcp",)}
