"""Faults end to end: dead ranks, stalls, shutdown with work pending, Ctrl-C
and logging, each in a real tfringrun job running tests/common/fault_worker.py
(on tfring.core, and through tfring.tensorflow where the TF binding adds
something: its steps compiled with XLA and its kernels on shutdown).

Every job must end by itself (a hang shows up as tfringrun's --timeout exit
code 124, never as a stuck test). The jobs are independent, so they run a few
at a time in the background while the tests wait for the one they check:
each costs seconds of TensorFlow start-up, and in a row they would take
minutes. Only the jobs of the selected tests are started.

Leftovers are attributed per job rather than by comparing listings of the
whole machine (which other jobs may change meanwhile): each rank records its
pid (and its wrapper's) and the /dev/shm files it has mapped, and after the
job none of those may remain. Detection times are printed; run with -s to
see them.
"""
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from support import CONTROLLERS, ROOT, rank_lines, tfringrun

WORKER = os.path.join(ROOT, "tests", "common", "fault_worker.py")
JOB_TIMEOUT = 60          # tfringrun --timeout for each job
PARALLEL_JOBS = 3
DETECTION_BOUND_S = 5.0   # issue 4: a dead rank is named within 5 s

# Variables that change what these jobs do; blanked unless a job sets them,
# so that the caller's environment cannot change the results (tfring ignores
# empty values and then falls back to defaults).
_NEUTRAL_ENV = {f"{prefix}_{name}": "" for prefix in ("TFRING", "HOROVOD") for name in (
    "STALL_CHECK_TIME_SECONDS", "STALL_SHUTDOWN_TIME_SECONDS", "STALL_CHECK_DISABLE",
    "LOG_LEVEL", "LOG_TIMESTAMPS")}
_NEUTRAL_ENV["FAULT_NO_WAIT"] = ""
_NEUTRAL_ENV["FAULT_XLA"] = ""
_NEUTRAL_ENV["FAULT_FRAMEWORK"] = ""
# The jobs run on tfring.core (the faults are the core's and the launcher's,
# and a rank starts in a fraction of a second instead of TensorFlow's
# seconds); these run through tfring.tensorflow, for what the TF binding adds.
TF = {"FAULT_FRAMEWORK": "tf"}

# name -> (np, scenario, args, env). Dead-rank args: how the victim dies, victim.
JOBS = {
    "kill-np2": (2, "dead_rank", ["kill", "1"], {}),
    "exit-np2": (2, "dead_rank", ["exit", "1"], {}),
    "raise-np2": (2, "dead_rank", ["raise", "1"], {}),
    # np=3: the dead rank is a plain worker while the coordinator and another
    # worker wait, or it is the coordinator itself.
    "kill-np3-rank2": (3, "dead_rank", ["kill", "2"], {}),
    "kill-np3-rank0": (3, "dead_rank", ["kill", "0"], {}),
    # The survivors wait inside a step compiled with XLA (issue 24).
    "kill-np2-xla": (2, "dead_rank", ["kill", "1"], {"FAULT_XLA": "1", **TF}),
    "kill-np3-rank2-xla": (3, "dead_rank", ["kill", "2"], {"FAULT_XLA": "1", **TF}),
    # As kill-np3-rank2, but each survivor exits as soon as it has the news.
    "kill-np3-rank2-no-wait": (3, "dead_rank", ["kill", "2"], {"FAULT_NO_WAIT": "1"}),
    # Stalls: rank 0 waits on 'stalled_tensor'; rank 1 submits it after ARG s.
    "stall-warning": (2, "stall", ["3"], {"TFRING_STALL_CHECK_TIME_SECONDS": "1"}),
    "stall-shutdown": (2, "stall", ["20"], {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                                            "TFRING_STALL_SHUTDOWN_TIME_SECONDS": "2"}),
    "stall-shutdown-only": (2, "stall", ["6"], {"TFRING_STALL_SHUTDOWN_TIME_SECONDS": "2"}),
    "stall-disabled": (2, "stall", ["3"], {"TFRING_STALL_CHECK_DISABLE": "1",
                                           "TFRING_STALL_CHECK_TIME_SECONDS": "1",
                                           "TFRING_STALL_SHUTDOWN_TIME_SECONDS": "1"}),
    "shutdown-pending": (2, "shutdown_pending", [], TF),
    "log-debug": (2, "log", [], {"TFRING_LOG_LEVEL": "debug"}),
    "ctrl-c": (2, "loop", [], {}),
    # Issue 8, item 10: SIGTERM to tfringrun while rank 0 is stalled in a
    # collective that ranks 1 and 2 have not submitted; in the "-shell"
    # job every rank runs under bash, as `tfringrun ./train.sh` would.
    "sigterm-stall-np3": (3, "stall", ["60"], {}),
    "sigterm-stall-np3-shell": (3, "stall", ["60"], {}),
}
# Jobs that the test stops with a signal to tfringrun once every rank has
# written the file named, and the signal.
_STOPPED = {"ctrl-c": ("looping", signal.SIGINT),
            "sigterm-stall-np3": ("shm", signal.SIGTERM),
            "sigterm-stall-np3-shell": ("shm", signal.SIGTERM)}
# Longest first, so that the pool finishes sooner.
_START_ORDER = ["kill-np3-rank2", "kill-np3-rank0", "kill-np3-rank2-no-wait", "kill-np3-rank2-xla",
                "sigterm-stall-np3", "sigterm-stall-np3-shell",
                "stall-shutdown-only", "stall-warning",
                "stall-disabled", "stall-shutdown", "ctrl-c", "shutdown-pending", "kill-np2",
                "exit-np2", "raise-np2", "kill-np2-xla", "log-debug"]
assert sorted(_START_ORDER) == sorted(JOBS)

_RESULT = re.compile(r"^RESULT (\d+) (\w+) ?(.*)$")
_EXIT_EVENT = re.compile(r"^tfringrun: rank (\d+) (exited with code -?\d+|was killed by signal "
                         r"\d+ \(\w+\))$")


class Job:
    """What one finished job left behind."""

    def __init__(self, name, controller, directory, returncode, output, seconds):
        self.name = name
        self.controller = controller
        self.np, self.scenario, self.args, self.env = JOBS[name]
        self.dir = directory
        self.returncode = returncode
        self.output = output
        self.seconds = seconds
        self.pids = []
        for rank in range(self.np):
            path = os.path.join(directory, f"pids.{rank}")
            if os.path.exists(path):
                self.pids += [int(p) for p in open(path).read().split()]
        self.left_pids = _wait_gone(self.pids)
        # /dev/shm files the ranks had mapped that still exist; removed here
        # so that a failing run does not fill /dev/shm.
        self.shm = []
        for rank in range(self.np):
            path = os.path.join(directory, f"shm.{rank}")
            if os.path.exists(path):
                self.shm += open(path).read().split()
        self.shm = sorted(set(self.shm))
        self.leaked_shm = [p for p in self.shm if os.path.exists(p)]
        for path in self.leaked_shm:
            try:
                os.unlink(path)
            except OSError:
                pass

    def results(self):
        """{rank: {KIND: rest of the line}} from the workers' RESULT lines."""
        found = {}
        for rank, text in rank_lines(self.output):
            m = _RESULT.match(text)
            if m:
                found.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
        return found

    def stderr(self, rank):
        return [text for r, text in rank_lines(self.output, "stderr") if r == rank]

    def launcher_lines(self):
        return [line for line in self.output.splitlines() if line.startswith("tfringrun: ")]

    def exit_events(self):
        """[(rank, how)] in the order tfringrun saw the ranks end (--verbose)."""
        return [(int(m.group(1)), m.group(2)) for m in map(_EXIT_EVENT.match, self.launcher_lines())
                if m]

    def describe(self):
        return (f"job {self.name} under {self.controller} (np={self.np}, exit {self.returncode}, {self.seconds:.1f} s):\n"
                + self.output[-12000:])


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pids, seconds=5.0):
    """Pids still alive after waiting up to `seconds` for them to go."""
    deadline = time.monotonic() + seconds
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _command(name, directory):
    np_, scenario, args, _ = JOBS[name]
    cmd = [sys.executable, WORKER, scenario, str(directory), *args]
    if name.endswith("-shell"):
        # bash stays the rank's process, with python as its child.
        cmd = ["bash", "-c", '"$0" "$@"; exit $?', *cmd]
    return np_, cmd


def _env(name):
    return {**_NEUTRAL_ENV, **JOBS[name][3]}


def _run_job(name, controller, directory):
    start = time.monotonic()
    if name in _STOPPED:
        code, output = _run_and_interrupt(name, controller, directory)
    else:
        np_, cmd = _command(name, directory)
        proc = tfringrun(np_, cmd, timeout=JOB_TIMEOUT, env=_env(name), extra=("--verbose",),
                         controller=controller)
        code, output = proc.returncode, proc.stdout
    return Job(name, controller, str(directory), code, output, time.monotonic() - start)


def _run_and_interrupt(name, controller, directory):
    """Starts the job, waits until every rank has written its ready file
    (looping: it loops over collectives; shm: it has joined MPI's shared
    memory; then until rank 0's collective is in flight), then signals
    tfringrun: SIGINT as a terminal's Ctrl-C would."""
    ready, signum = _STOPPED[name]
    np_, cmd = _command(name, directory)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **_env(name))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.runner.launch", "-np", str(np_), f"--{controller}",
         "--timeout", str(JOB_TIMEOUT), "--verbose", *cmd], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        # A stalled job's rank 0 writes queued.0 once its collective is in flight.
        files = [f"{ready}.{r}" for r in range(np_)] + (["queued.0"] if ready == "shm" else [])
        while not all(os.path.exists(os.path.join(directory, f)) for f in files):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        else:
            proc.send_signal(signum)
        output, _ = proc.communicate(timeout=JOB_TIMEOUT + 30)
        return proc.returncode, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _Jobs:
    def __init__(self, keys, tmp_path_factory):
        self.pool = ThreadPoolExecutor(max_workers=PARALLEL_JOBS)
        self.futures = {}
        for name in _START_ORDER:
            for controller in CONTROLLERS:
                if (name, controller) in keys:
                    self.futures[name, controller] = self.pool.submit(
                        _run_job, name, controller,
                        tmp_path_factory.mktemp(f"{name}-{controller}"))

    def __getitem__(self, key):
        return self.futures[key].result()


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    """The jobs the selected tests of this module need, started together."""
    keys = set()
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is request.module and "job" in params:
            keys.add((params["job"], params["controller"]))
    runner = _Jobs(keys, tmp_path_factory)
    yield runner
    runner.pool.shutdown(wait=True)


def check_no_process_left(job):
    assert job.pids, f"no rank recorded its pid\n{job.describe()}"
    assert not job.left_pids, f"processes {job.left_pids} outlived the job\n{job.describe()}"


# -- a rank dies ---------------------------------------------------------------

DEAD = ["kill-np2", "exit-np2", "raise-np2", "kill-np3-rank2", "kill-np3-rank0", "kill-np2-xla",
        "kill-np3-rank2-xla"]
# How each death is reported by tfringrun, and its exit code.
_DEATH_REPORT = {"kill": ("was killed by signal 9 (SIGKILL)", 137),
                 "exit": ("exited with code 3", 3),
                 "raise": ("exited with code 1", 1)}


@pytest.mark.parametrize("job", DEAD)
def test_dead_rank_is_named_quickly_and_the_job_ends(jobs, job, controller):
    job = jobs[job, controller]
    how, victim = job.args[0], int(job.args[1])
    survivors = [r for r in range(job.np) if r != victim]
    results = job.results()
    victim_pid = int(open(os.path.join(job.dir, f"pids.{victim}")).read().split()[0])
    # Typed: a death is a peer failure naming the victim; a rank that died
    # of an exception shut the job down first (its exit hook), naming itself.
    typed = f"{'shutdown' if how == 'raise' else 'peer_failure'} {victim} aborted,internal"
    if how == "raise":
        named = f"tfring has been shut down: rank {victim} died of an uncaught ValueError: " \
                "the victim gave up."
        cause = None
    elif controller == "mpi":
        # MPI does not notice; the peer monitor does (from the victim's pid).
        named, cause = f"rank {victim} (pid {victim_pid} on ", "has exited or was killed"
    else:
        # TCP notices the victim's connection ending; the peer monitor, which
        # also runs, may see the process gone first. Either names the rank.
        named = f"rank {victim} ("
        cause = re.compile(r"(closed|reset) its connection|has exited or was killed")
    for rank in survivors:
        got = results.get(rank, {})
        assert "DETECTED" in got, f"rank {rank} reported no error\n{job.describe()}"
        seconds, message = got["DETECTED"].split(" ", 1)
        print(f"\n[detection] {job.name} ({controller}): rank {rank} got the error {float(seconds):.3f} s after "
              f"rank {victim} died ({how})")
        assert named in message, job.describe()
        if isinstance(cause, str):
            assert cause in message, job.describe()
        elif cause:
            assert cause.search(message), job.describe()
        assert float(seconds) < DETECTION_BOUND_S, job.describe()
        # Later collectives fail at once with the same news.
        later_seconds, later = got["LATER"].split(" ", 1)
        assert named in later and float(later_seconds) < 1.0, job.describe()
        assert got.get("DETECTED_CAUSE") == typed, job.describe()
        assert got.get("LATER_CAUSE") == typed, job.describe()
        assert "DONE" in got, job.describe()

    what, code = _DEATH_REPORT[how]
    assert job.returncode == code, job.describe()
    # tfringrun names the dead rank first, then the survivors end by
    # themselves: with code 1 when MPI had to be abandoned (a dead peer), 0
    # when the dying rank could say goodbye.
    reports = [line for line in job.launcher_lines() if line.endswith("stopping the job.")
               or line.endswith("the job has ended.")]
    assert reports and reports[0].startswith(f"tfringrun: rank {victim} {what}; "), job.describe()
    events = dict(job.exit_events())
    assert events.get(victim) == what, job.describe()
    survivor_code = 0 if how == "raise" else 1
    assert {r: events.get(r) for r in survivors} == \
        {r: f"exited with code {survivor_code}" for r in survivors}, job.describe()
    assert "did not stop within" not in job.output, job.describe()
    check_no_process_left(job)


@pytest.mark.parametrize("job", ["kill-np3-rank2-no-wait"])
def test_survivor_that_exits_at_once_is_not_blamed(jobs, job, controller):
    # A survivor that exits as soon as it has the news is a second dead peer;
    # the peer monitor names the lowest dead rank it finds, so survivors
    # linger a moment before they exit and the others name the first to die.
    job = jobs[job, controller]
    results = job.results()
    for rank in (0, 1):
        assert "DETECTED" in results.get(rank, {}), job.describe()
        message = results[rank]["DETECTED"].split(" ", 1)[1]
        # Under TCP either the broken connection ("rank 2 (host ...") or the
        # peer monitor ("rank 2 (pid ...") may bring the news first; both must
        # name the first rank to die, never the survivor that exited after it.
        assert "tfring stopped: rank 2 (" in message, f"rank {rank} blamed: {message}"


@pytest.mark.parametrize("job", ["kill-np2", "exit-np2", "raise-np2", "kill-np3-rank2",
                                 "kill-np3-rank0", "ctrl-c", "shutdown-pending", "stall-shutdown",
                                 "sigterm-stall-np3", "sigterm-stall-np3-shell"])
# Only MPICH leaves named segments behind: tfring's own shared-memory plane
# unlinks each segment as soon as every rank has mapped it, so under TCP no
# rank has a named /dev/shm file mapped that could be left.
@pytest.mark.parametrize("controller", ["mpi"])
def test_no_shared_memory_segment_is_left(jobs, job, controller):
    # MPICH unlinks its segments in MPI_Finalize, which ranks killed by a
    # signal, and survivors of a dead peer, never run: tfringrun removes them.
    job = jobs[job, controller]
    assert job.shm, f"the ranks mapped no /dev/shm file; nothing was checked\n{job.describe()}"
    assert not job.leaked_shm, f"left in /dev/shm: {job.leaked_shm}\n{job.describe()}"


# -- stalls --------------------------------------------------------------------

_STALL_WARNING = re.compile(r"^\[tfring WARNING rank 0\] Stall: tensor 'stalled_tensor' in process "
                            r"set 0 has waited \d+ s for ranks \[1\] to submit it\. ")


@pytest.mark.parametrize("job", ["stall-warning"])
def test_stall_warning_names_tensor_and_missing_rank(jobs, job, controller):
    job = jobs[job, controller]
    assert job.returncode == 0, job.describe()
    assert any(_STALL_WARNING.match(line) for line in job.stderr(0)), job.describe()
    assert not any("Stall" in line for line in job.stderr(1)), "only the coordinator warns"
    results = job.results()
    for rank in range(2):
        seconds, value = results[rank]["COMPLETED"].split()
        assert float(value) == 2.0, job.describe()
    assert float(results[0]["COMPLETED"].split()[0]) >= 2.5, job.describe()
    check_no_process_left(job)


@pytest.mark.parametrize("job", ["stall-warning"])
def test_default_log_level_prints_no_debug_lines(jobs, job, controller):
    job = jobs[job, controller]
    assert not re.search(r"\[tfring (TRACE|DEBUG|INFO) rank", job.output), job.describe()


@pytest.mark.parametrize("job", ["stall-shutdown"])
def test_stall_shutdown_fails_every_rank_with_the_stall(jobs, job, controller):
    # HOROVOD_STALL_CHECK_TIME_SECONDS: the Horovod name works too.
    job = jobs[job, controller]
    assert any(_STALL_WARNING.match(line) for line in job.stderr(0)), job.describe()
    results = job.results()
    for rank in range(2):
        assert "ABORTED" in results.get(rank, {}), job.describe()
        seconds, message = results[rank]["ABORTED"].split(" ", 1)
        assert re.search(r"tfring has been shut down: a stall: tensor 'stalled_tensor' in process "
                         r"set 0 has waited \d+ s for ranks \[1\] to submit it "
                         r"\(TFRING_STALL_SHUTDOWN_TIME_SECONDS=2\)", message), job.describe()
        # Rank 1 would have submitted after 20 s: the stall ended it long before.
        assert float(seconds) < 12, job.describe()
        # A timeout, naming the rank the tensor waited for.
        assert results[rank].get("ABORTED_CAUSE") == "timeout 1 aborted,internal", \
            job.describe()
    # Both ranks handled the error and MPI is intact: the job ends cleanly.
    assert job.returncode == 0, job.describe()
    check_no_process_left(job)


@pytest.mark.parametrize("job", ["stall-shutdown-only"])
def test_stall_shutdown_time_alone_stops_the_job(jobs, job, controller):
    # Only the shutdown time set: the job stops after it, although the
    # warning time (60 s by default) has not come.
    job = jobs[job, controller]
    results = job.results()
    assert job.returncode == 0, job.describe()
    for rank in range(2):
        assert "COMPLETED" not in results.get(rank, {}), job.describe()
        seconds, message = results[rank]["ABORTED"].split(" ", 1)
        assert "a stall: tensor 'stalled_tensor' in process set 0 has waited" in message
        assert float(seconds) < 5.5, job.describe()  # rank 1 would have submitted at 6 s
        assert results[rank].get("ABORTED_CAUSE") == "timeout 1 aborted,internal", \
            job.describe()
    assert "Stall: tensor" not in job.output, "no warning before the 60 s warning time"


@pytest.mark.parametrize("job", ["stall-disabled"])
def test_stall_check_disable_turns_off_warning_and_shutdown(jobs, job, controller):
    job = jobs[job, controller]
    assert job.returncode == 0, job.describe()
    assert "Stall" not in job.output and "a stall" not in job.output, job.describe()
    results = job.results()
    for rank in range(2):
        assert float(results[rank]["COMPLETED"].split()[1]) == 2.0, job.describe()
    assert float(results[0]["COMPLETED"].split()[0]) >= 2.5, job.describe()
    check_no_process_left(job)


# -- shutdown, Ctrl-C ----------------------------------------------------------

@pytest.mark.parametrize("job", ["shutdown-pending"])
def test_shutdown_fails_a_collective_pending_on_another_thread(jobs, job, controller):
    job = jobs[job, controller]
    assert job.returncode == 0, job.describe()
    results = job.results()
    assert results[0]["THREAD"].startswith("ABORTED "), job.describe()
    assert "tfring has been shut down: rank 0 called shutdown()" in results[0]["THREAD"]
    assert float(results[0]["SHUTDOWN_TOOK"]) < 5, job.describe()
    assert "has been shut down on this rank (shutdown() was called); call init()" in \
        results[0]["AFTER"], job.describe()
    assert "tfring has been shut down: rank 0 called shutdown()" in results[1]["PEER"], \
        job.describe()
    # Typed: shutdown by rank 0 on both ranks; after its own shutdown() this
    # rank is not running (no longer a job-wide failure).
    assert results[0].get("THREAD_CAUSE") == "shutdown 0 aborted,internal", job.describe()
    assert results[1].get("PEER_CAUSE") == "shutdown 0 aborted,internal", job.describe()
    assert results[0].get("AFTER_CAUSE") == "not_initialized None precondition", job.describe()
    check_no_process_left(job)


@pytest.mark.parametrize("job", ["ctrl-c"])
def test_ctrl_c_on_tfringrun_ends_every_rank(jobs, job, controller):
    job = jobs[job, controller]
    assert all(os.path.exists(os.path.join(job.dir, f"looping.{r}")) for r in range(job.np)), \
        f"the ranks never got to their loop\n{job.describe()}"
    assert job.returncode == 130, job.describe()
    assert "tfringrun: got SIGINT; stopping the job." in job.launcher_lines(), job.describe()
    assert sorted(r for r, _ in job.exit_events()) == list(range(job.np)), job.describe()
    check_no_process_left(job)


@pytest.mark.parametrize("job", ["sigterm-stall-np3", "sigterm-stall-np3-shell"])
def test_sigterm_on_tfringrun_with_a_rank_stalled_ends_every_rank(jobs, job, controller):
    job = jobs[job, controller]
    assert all(os.path.exists(os.path.join(job.dir, f"shm.{r}")) for r in range(job.np)), \
        f"the ranks never joined MPI\n{job.describe()}"
    assert job.returncode == 143, job.describe()
    assert "tfringrun: got SIGTERM; stopping the job." in job.launcher_lines(), job.describe()
    assert sorted(r for r, _ in job.exit_events()) == list(range(job.np)), job.describe()
    if job.name.endswith("-shell"):
        # The ranks really ran under bash: the pids checked below are python's and bash's.
        parents = {open(os.path.join(job.dir, f"parent.{r}")).read() for r in range(job.np)}
        assert parents == {"bash"}, job.describe()
    check_no_process_left(job)


# -- logging -------------------------------------------------------------------

@pytest.mark.parametrize("job", ["log-debug"])
def test_debug_log_lines_name_each_rank_and_timestamps_are_optional(jobs, job, controller):
    job = jobs[job, controller]
    assert job.returncode == 0, job.describe()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} "
    for rank in range(job.np):
        debug = [line for line in job.stderr(rank) if f"[tfring DEBUG rank {rank}] " in line]
        assert len(debug) >= 2, job.describe()  # at least init and the end of the thread
        # Rank 1 set TFRING_LOG_TIMESTAMPS=1 for itself; rank 0 did not.
        prefix = stamp if rank == 1 else ""
        for line in debug:
            assert re.match(prefix + rf"\[tfring DEBUG rank {rank}\] \S", line), line
    check_no_process_left(job)
