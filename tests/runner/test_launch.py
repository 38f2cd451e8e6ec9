"""Tests for tfringrun (tfring.runner).

The multi-rank tests run the real launcher (``python -m tfring.runner.launch``)
over MPICH's hydra with tiny ``python -c`` rank scripts that never import
TensorFlow, so the whole file takes seconds. Every launch has a timeout, and
the failure tests check that no rank process survives the job.
"""
import mmap
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import types
import uuid
from pathlib import Path

import pytest

from launch_support import (
    LAUNCH_TIMEOUT, RANK_AND_SIZE, RECORD_PIDS, REPO, assert_all_gone, assert_no_process_with,
    processes_with, rank_lines, reported_ends, shell_wrapped, tfringrun, wait_for_files)
from tfring.runner import (check_build, console, hosts, launch, mpiexec, rank_env, rank_wrapper,
                           shm_cleanup)
from tfring.runner.elastic.driver import Driver as ElasticDriver
from tfring.runner.supervisor import Supervisor, format_ranks

# -- launching ---------------------------------------------------------------

@pytest.mark.parametrize("num_proc", [2, 3])
def test_every_rank_runs_with_prefixed_output(num_proc, controller):
    proc, _ = tfringrun(*controller, "-np", str(num_proc), sys.executable, "-c",
                        f"import os, sys; {RANK_AND_SIZE}; print('rank', rank, size); "
                        "print('oops', file=sys.stderr)")
    assert proc.returncode == 0, proc.stderr
    out = rank_lines(proc.stdout)
    assert out == {r: [f"rank {r} {num_proc}"] for r in range(num_proc)}
    assert rank_lines(proc.stderr, "stderr") == {r: ["oops"] for r in range(num_proc)}


def test_hosts_flag_and_no_prefix_output(controller):
    proc, _ = tfringrun(*controller, "-H", "localhost:3", "--no-prefix-output", sys.executable,
                        "-c", f"import os; {RANK_AND_SIZE}; print('rank', rank)")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0", "rank 1", "rank 2"]


def test_tuning_flags_reach_every_rank():
    proc, _ = tfringrun("-np", "2", "--fusion-threshold-mb", "2", "--cycle-time-ms", "5",
                        "--timeline-mark-cycles", "--mpi-args", "-genv TFRING_TEST_EXTRA yes",
                        sys.executable, "-c",
                        "import os; print(*[os.environ.get(k) for k in ("
                        "'TFRING_FUSION_THRESHOLD', 'TFRING_CYCLE_TIME', "
                        "'TFRING_TIMELINE_MARK_CYCLES', 'TF_CPP_MIN_LOG_LEVEL', "
                        "'TFRING_START_TIMEOUT', 'TFRING_TEST_EXTRA')])")
    assert proc.returncode == 0, proc.stderr
    assert rank_lines(proc.stdout) == {r: ["2097152 5 1 2 30 yes"] for r in range(2)}


def test_mpi_works_through_the_rank_wrapper():
    # The wrapper must hand hydra's PMI descriptors on to the command.
    proc, _ = tfringrun("-np", "2", sys.executable, "-c",
                        "from mpi4py import MPI; c = MPI.COMM_WORLD; "
                        "print(c.Get_size(), c.allreduce(c.Get_rank() + 1))")
    assert proc.returncode == 0, proc.stderr
    assert rank_lines(proc.stdout) == {0: ["2 3"], 1: ["2 3"]}


def test_output_filename_writes_per_rank_files(tmp_path, controller):
    proc, _ = tfringrun(*controller, "-np", "2", "--output-filename", str(tmp_path / "logs"),
                        sys.executable, "-c", f"import os, sys; {RANK_AND_SIZE}; r = rank; "
                                              "print('out', r); print('err', r, file=sys.stderr)")
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        assert (tmp_path / "logs" / f"rank.{r}" / "stdout").read_text() == f"out {r}\n"
        assert (tmp_path / "logs" / f"rank.{r}" / "stderr").read_text() == f"err {r}\n"


def test_under_an_mpi_launcher_runs_in_place():
    env = dict(os.environ, PMI_RANK="5")
    proc, _ = tfringrun("--cache-capacity", "7", sys.executable, "-c",
                        "import os; print(os.environ['PMI_RANK'], "
                        "os.environ['TFRING_CACHE_CAPACITY'])", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "5 7\n"


# -- failures ----------------------------------------------------------------

def test_failing_rank_stops_the_job(tmp_path, controller):
    script = RECORD_PIDS + textwrap.dedent("""
        if rank == 1:
            sys.exit(3)
        time.sleep(30)
    """)
    # The survivors' grace before they are stopped, short (the product's own
    # option): the test is about the stop, not the grace's default length.
    proc, took = tfringrun(*controller, "-np", "3", "--failure-grace-seconds", "1",
                           sys.executable, "-c", script, str(tmp_path))
    assert proc.returncode == 3
    assert "tfringrun: rank 1 exited with code 3; stopping the job." in proc.stderr
    assert took < 10
    assert_all_gone(tmp_path, 3)


@pytest.mark.parametrize("failing", [0, 1])
def test_rank_exiting_non_zero_after_its_work_fails_the_job(tmp_path, controller, failing):
    # The exit-code rule (docs/elastic.md), in both orders of finishing: the
    # rank that ends first exits 3, or the last one does after the first
    # exited 0.
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import exit_rule_support; "
              "exit_rule_support.end_in_order(sys.argv[2], int(sys.argv[3]))")
    proc, _ = tfringrun(*controller, "-np", "2", sys.executable, "-c", script,
                        os.path.join(REPO, "tests"), str(tmp_path), str(failing))
    assert proc.returncode == 3, proc.stderr
    assert f"tfringrun: rank {failing} exited with code 3;" in proc.stderr, proc.stderr


def test_rank_killed_by_signal_is_reported(tmp_path, controller):
    script = RECORD_PIDS + textwrap.dedent("""
        if rank == 1:
            os.kill(os.getpid(), 9)
        time.sleep(30)
    """)
    proc, took = tfringrun(*controller, "-np", "2", "--failure-grace-seconds", "1",
                           sys.executable, "-c", script, str(tmp_path))
    assert proc.returncode == 128 + 9
    assert "rank 1 was killed by signal 9 (SIGKILL)" in proc.stderr
    assert took < 10
    assert_all_gone(tmp_path, 2)


def test_timeout_kills_a_hanging_job(tmp_path, controller):
    script = RECORD_PIDS + "time.sleep(0.1 if rank == 1 else 30)\n"
    proc, took = tfringrun(*controller, "-np", "3", "--timeout", "2.5", sys.executable, "-c",
                           script, str(tmp_path))
    assert proc.returncode == 124
    assert "ran past --timeout 2.5 s; ranks still running: 0, 2" in proc.stderr
    assert took < 10
    assert_all_gone(tmp_path, 3)


def test_rank_ignoring_sigterm_is_killed(tmp_path, controller):
    script = RECORD_PIDS + textwrap.dedent("""
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(30)
    """)
    proc, took = tfringrun(*controller, "-np", "2", "--timeout", "1.5", sys.executable, "-c",
                           script,
                           str(tmp_path))
    assert proc.returncode == 124
    assert took < 15
    assert_all_gone(tmp_path, 2)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_stopping_tfringrun_ends_every_rank(tmp_path, signum, controller):
    # SIGINT: tfringrun stops the job itself. SIGKILL: the wrappers notice
    # that tfringrun is gone and stop their commands.
    script = RECORD_PIDS + "time.sleep(30)\n"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.runner.launch", *controller, "-np", "2", sys.executable,
         "-c", script, str(tmp_path)], cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"pids.{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and proc.poll() is None, "ranks did not start"
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    if signum == signal.SIGINT:
        assert proc.returncode == 130
        assert "got SIGINT; stopping the job." in err
    assert_all_gone(tmp_path, 2)


# Under MPI each rank joins MPI (and so MPICH's shared memory), notes the
# /dev/shm files it maps, then waits: rank 0 in a collective the others never
# join, the others in a sleep. Under TCP there is no MPI: every rank sleeps.
# MODE "fail": rank 1 exits 3 once every rank is ready. MODE "ignore-term":
# every rank ignores SIGTERM.
STOPPABLE_RANK = textwrap.dedent("""
    import os, signal, sys, time
    marker, out, mode = sys.argv[1:4]
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    comm = None
    if "PMI_RANK" in os.environ:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        comm.barrier()
    """ + RANK_AND_SIZE + """
    with open("/proc/self/maps") as f:
        fields = [line.split() for line in f]
    shm = {x[5] for x in fields if len(x) == 6 and x[5].startswith("/dev/shm/")}
    with open(os.path.join(out, f"shm.{rank}"), "w") as f:
        f.write("\\n".join(sorted(shm)))
    os.rename(os.path.join(out, f"shm.{rank}"), os.path.join(out, f"ready.{rank}"))
    if mode == "fail" and rank == 1:
        while not all(os.path.exists(os.path.join(out, f"ready.{r}")) for r in range(size)):
            time.sleep(0.02)
        os._exit(3)
    if rank == 0 and comm is not None:
        comm.barrier()  # stalls: nobody else enters it
    time.sleep(120)
""")

# stop path -> (tfringrun options, rank mode, signal the test sends, exit code)
_STOP_PATHS = {
    "sigterm": ((), "wait", signal.SIGTERM, 143),
    "sigint": ((), "wait", signal.SIGINT, 130),
    # Long enough for every rank to be ready first (the test waits for that).
    "timeout": (("--timeout", "5"), "wait", None, 124),
    "failed-peer": (("--failure-grace-seconds", "1"), "fail", None, 3),
    "sigterm-ignored": ((), "ignore-term", signal.SIGTERM, 143),
}


@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("path", list(_STOP_PATHS))
def test_every_stop_path_ends_shell_wrapped_ranks_and_their_shared_memory(
        tmp_path, path, num_proc, controller):
    # Issue 8, items 14 and 10: a rank command that is a script used to
    # leave its python running (parent 1) when bash was stopped, and the
    # orphans kept MPICH's /dev/shm file alive past tfringrun's cleanup.
    options, mode, signum, code = _STOP_PATHS[path]
    marker = f"tfring-stop-test-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.runner.launch", *controller, "-np", str(num_proc),
         *options, *shell_wrapped(STOPPABLE_RANK, marker, str(tmp_path), mode)],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        wait_for_files(tmp_path, [f"ready.{r}" for r in range(num_proc)], proc)
        assert len(processes_with(marker)) >= 2 * num_proc  # bash and python per rank
        if signum is not None:
            time.sleep(0.3)  # rank 0 is in its collective
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert_no_process_with(marker)
    assert proc.returncode == code, err
    # Every rank's end is reported, without --verbose too.
    assert sorted(reported_ends(err, num_proc)) == list(range(num_proc)), err
    if path == "failed-peer":
        assert reported_ends(err, num_proc)[1] == "exited with code 3", err
    if "--tcp" in controller:
        return  # no MPI, so no MPI shared memory to check
    shm = set()
    for rank in range(num_proc):
        shm |= set((tmp_path / f"ready.{rank}").read_text().split())
    shm = {p for p in shm if shm_cleanup.is_mpi_segment(p)}
    assert shm, "the ranks mapped no MPI shared-memory file; nothing was checked"
    left = [p for p in shm if os.path.exists(p)]
    for p in left:
        os.unlink(p)  # only this job's files
    assert not left, f"left in /dev/shm: {left}\n{err}"


@pytest.mark.parametrize("num_proc", [2, 3])
def test_ctrl_c_reports_every_rank_end(tmp_path, num_proc, controller):
    # Issue 8, item 13: rank 0 takes a moment to end after SIGTERM; the
    # others die at once. hydra SIGKILLs every rank when one exits without
    # MPI_Finalize, so their wrappers exiting at once killed rank 0 before
    # it could report, and tfringrun said nothing about it.
    script = RECORD_PIDS + textwrap.dedent("""
        import signal
        if "PMI_RANK" in os.environ:
            from mpi4py import MPI
            MPI.COMM_WORLD.barrier()
        def slow_exit(*_):
            time.sleep(1.0)
            os._exit(7)
        if rank == 0:
            signal.signal(signal.SIGTERM, slow_exit)
        open(os.path.join(sys.argv[1], f"ready.{rank}"), "w").close()
        time.sleep(60)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.runner.launch", *controller, "-np", str(num_proc),
         sys.executable, "-c", script, str(tmp_path)], cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_files(tmp_path, [f"ready.{r}" for r in range(num_proc)], proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert reported_ends(err, num_proc) == {
        0: "exited with code 7",
        **{r: "was killed by signal 15 (SIGTERM)" for r in range(1, num_proc)}}, err
    assert_all_gone(tmp_path, num_proc)


@pytest.mark.parametrize("ignore_term", [False, True])
def test_rank_wrapper_ends_what_the_command_left_running(ignore_term):
    # The command ends by itself but leaves a child running in its process
    # group; the wrapper (run directly here, without hydra, which might
    # clean up after it) ends it before it exits: SIGTERM, then SIGKILL.
    marker = f"tfring-leftover-test-{uuid.uuid4().hex}"
    code = "import signal, time; "
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    code += "open(__import__('sys').argv[2], 'w').close(); time.sleep(60)"
    ready = f"/tmp/{marker}.ready"
    command = (f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {marker} {ready} & "
               f"while [ ! -e {ready} ]; do sleep 0.05; done; exit 5")
    try:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, rank_wrapper.__file__, "--grace", "1", "--", "bash", "-c", command],
            env=dict(os.environ, PMI_RANK="0"), capture_output=True, timeout=LAUNCH_TIMEOUT)
        took = time.monotonic() - start
        assert proc.returncode == 5, proc.stderr
        assert not processes_with(marker)
        assert took >= 1.0 if ignore_term else took < 5
    finally:
        assert_no_process_with(marker)
        if os.path.exists(ready):
            os.unlink(ready)


def test_job_token_is_not_on_any_command_line(tmp_path, controller):
    # Issue 9: the token was passed as --token, visible in everyone's `ps`.
    script = RECORD_PIDS + textwrap.dedent(f"""
        print("token in env:", {rank_wrapper.TOKEN_ENV!r} in os.environ, flush=True)
        while not os.path.exists(os.path.join(sys.argv[1], "go")):
            time.sleep(0.02)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.runner.launch", *controller, "-np", "2", sys.executable,
         "-c", script, str(tmp_path)], cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_files(tmp_path, ["pids.0", "pids.1"], proc)
        tokens = set()
        for rank in range(2):
            wrapper = int((tmp_path / f"pids.{rank}").read_text().split()[1])
            with open(f"/proc/{wrapper}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            tokens.add(env[rank_wrapper.TOKEN_ENV.encode()])
        (token,) = tokens
        assert len(token) == 32
        on_command_lines = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if token in f.read():
                        on_command_lines.append(entry)
            except OSError:
                continue
        assert not on_command_lines
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    # The wrapper keeps it from the command.
    assert rank_lines(out) == {0: ["token in env: False"], 1: ["token in env: False"]}


def test_shm_cleanup_removes_only_the_jobs_unmapped_files():
    # Other jobs' files, mapped or not, are never touched.
    tag = uuid.uuid4().hex
    ours, ours_mapped, theirs = (f"/dev/shm/mpich_shm_tfringtest_{tag}_{n}"
                                 for n in ("ours", "mapped", "theirs"))
    files = []
    try:
        for path in (ours, ours_mapped, theirs):
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)
        f = open(ours_mapped, "r+b")
        files.append(f)
        mapping = mmap.mmap(f.fileno(), 4096)
        assert shm_cleanup.mapped_segments([os.getpid()]) >= {ours_mapped}
        removed, left = shm_cleanup.remove_leftovers({ours, ours_mapped}, wait=0.3)
        assert removed == [ours] and left == [ours_mapped]
        assert not os.path.exists(ours)
        assert os.path.exists(ours_mapped) and os.path.exists(theirs)
        mapping.close()
        assert shm_cleanup.remove_leftovers({ours_mapped}) == ([ours_mapped], [])
    finally:
        for f in files:
            f.close()
        for path in (ours, ours_mapped, theirs):
            if os.path.exists(path):
                os.unlink(path)


def test_missing_command_is_reported(controller):
    proc, _ = tfringrun(*controller, "-np", "2", "no-such-command-tfring")
    assert proc.returncode == 127
    assert "cannot run 'no-such-command-tfring'" in proc.stderr


def test_start_timeout_names_the_missing_ranks(capsys):
    # A stand-in for mpiexec that never starts any rank.
    supervisor = Supervisor(2, start_timeout=0.5)
    start = time.monotonic()
    code = supervisor.run([sys.executable, "-c", "import time; time.sleep(30)"])
    assert code == 1
    assert time.monotonic() - start < 10
    assert "ranks 0-1 did not start within --start-timeout 0.5 s" in capsys.readouterr().err


# -- command-line errors -----------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["-np", "2", "--gloo", "--mpi-args", "-v", "true"], "--mpi-args needs MPI"),
    (["-np", "2", "--tcp", "--mpi", "true"], "not allowed with argument"),
    (["-np", "2", "--bogus", "true"], "unrecognized arguments: --bogus"),
    (["-np", "2", "--min-np", "1", "true"], "--min-np need --host-discovery-script"),
    (["-np", "4", "-H", "localhost:2", "true"], "-np 4 needs more slots than the 2"),
    (["true"], "-np is required"),
    (["-np", "2"], "no command given"),
])
def test_usage_errors(args, message, capsys, monkeypatch):
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    if "unrecognized" in message or "not allowed" in message:  # argparse's own error
        with pytest.raises(SystemExit) as exit_info:
            launch.main(args)
        assert exit_info.value.code == 2
    else:
        assert launch.main(args) == 2
    assert message in capsys.readouterr().err


def test_check_build_reports_and_tolerates_broken_probes():
    def broken():
        raise RuntimeError("library failed to load")
    basics = types.SimpleNamespace(__name__="fake.basics", mpi_built=lambda: True,
                                   gloo_built=lambda: False, nccl_built=broken)
    text, complete = check_build.report(basics, "9.9")
    assert "tfring v9.9:" in text and "    [X] MPI" in text and "    [ ] Gloo" in text
    assert "    [?] NCCL" in text and "library failed to load" in text
    assert not complete


def test_check_build_import_failure_exits_nonzero(monkeypatch, capsys):
    def fail(name):
        raise ImportError(f"no module {name}")
    monkeypatch.setattr(check_build.importlib, "import_module", fail)
    assert check_build.main() == 1
    assert "cannot import tfring.common.basics" in capsys.readouterr().err


# -- units -------------------------------------------------------------------

def test_hosts_arg():
    assert hosts.parse_hosts_arg("a:4,b:2,c") == [
        hosts.Host("a", 4), hosts.Host("b", 2), hosts.Host("c", 1)]
    assert hosts.parse_hosts_arg("a:2,a:2") == [hosts.Host("a", 4)]
    assert hosts.parse_hosts_arg("[::1]:2") == [hosts.Host("::1", 2)]
    for bad in ("a:0", "a:x", ",", ":3"):
        with pytest.raises(hosts.HostSpecError):
            hosts.parse_hosts_arg(bad)


def test_hostfile_forms(tmp_path):
    text = textwrap.dedent("""
        # cluster
        node1 slots=4
        node2:2   # trailing comment
        node3
        node4 slots=8 max_slots=16

    """)
    assert hosts.parse_hostfile_text(text) == [
        hosts.Host("node1", 4), hosts.Host("node2", 2), hosts.Host("node3", 1),
        hosts.Host("node4", 8)]
    path = tmp_path / "hosts"
    path.write_text("localhost slots=2\n")
    assert hosts.parse_hostfile(str(path)) == [hosts.Host("localhost", 2)]


@pytest.mark.parametrize("text, where", [
    ("node1 slots=x\n", "hosts:1"), ("\nnode1 4\n", "hosts:2"), ("# empty\n", "no hosts"),
])
def test_hostfile_errors_say_where(text, where):
    with pytest.raises(hosts.HostSpecError, match=where):
        hosts.parse_hostfile_text(text, "hosts")


def test_hostfile_flag_end_to_end(tmp_path, controller):
    path = tmp_path / "hosts"
    path.write_text("localhost slots=2\n")
    proc, _ = tfringrun(*controller, "--hostfile", str(path), sys.executable, "-c",
                        f"import os; {RANK_AND_SIZE}; print(rank)")
    assert proc.returncode == 0, proc.stderr
    assert rank_lines(proc.stdout) == {0: ["0"], 1: ["1"]}


def test_assign_ranks_fills_slots_in_order():
    hs = [hosts.Host("a", 2), hosts.Host("b", 2)]
    assert hosts.assign_ranks(hs, 3) == {"a": [0, 1], "b": [2]}
    assert hosts.assign_ranks(hs, 1) == {"a": [0]}


def test_is_local():
    assert hosts.is_local("localhost") and hosts.is_local("127.0.0.1")
    assert not hosts.is_local("no-such-host.invalid")


def test_tuning_env_maps_every_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = launch.build_parser().parse_args([
        "--fusion-threshold-mb", "0.5", "--cycle-time-ms", "2.5", "--cache-capacity", "0",
        "--timeline-filename", "tl.json", "--timeline-mark-cycles", "--autotune",
        "--autotune-log-file", "at.csv", "--autotune-warmup-samples", "3",
        "--stall-check-warning-time-seconds", "10", "--stall-check-shutdown-time-seconds", "20",
        "--log-level", "debug", "--start-timeout", "45", "--no-stall-check", "cmd"])
    assert rank_env.tuning_env(args) == {
        "TFRING_FUSION_THRESHOLD": str(512 * 1024),
        "TFRING_CYCLE_TIME": "2.5",
        "TFRING_CACHE_CAPACITY": "0",
        "TFRING_TIMELINE": str(tmp_path / "tl.json"),
        "TFRING_TIMELINE_MARK_CYCLES": "1",
        "TFRING_AUTOTUNE": "1",
        "TFRING_AUTOTUNE_LOG": str(tmp_path / "at.csv"),
        "TFRING_AUTOTUNE_WARMUP_SAMPLES": "3",
        "TFRING_STALL_CHECK_TIME_SECONDS": "10",
        "TFRING_STALL_SHUTDOWN_TIME_SECONDS": "20",
        "TFRING_STALL_CHECK_DISABLE": "1",
        "TFRING_LOG_LEVEL": "DEBUG",
        "TFRING_START_TIMEOUT": "45",
    }


def test_default_env_respects_user_settings(monkeypatch):
    monkeypatch.setattr(rank_env, "usable_cpus", lambda: 2)
    assert rank_env.default_env(2, {}) == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    assert rank_env.default_env(3, {}) == {"TF_CPP_MIN_LOG_LEVEL": "2",
                                           "MPIR_CVAR_POLLS_BEFORE_YIELD": "1"}
    assert rank_env.default_env(3, {"TF_CPP_MIN_LOG_LEVEL": "0",
                                    "MPIR_CVAR_POLLS_BEFORE_YIELD": "0"}) == {}


def test_mpiexec_command_for_local_and_remote_hosts(tmp_path, monkeypatch):
    monkeypatch.setattr(hosts, "is_local", lambda name: name == "localhost")
    local = mpiexec.build_command("mpiexec", [hosts.Host("localhost", 4)], 2, {"A": "1"},
                                  ["python", "x.py"], mpi_args=["-verbose"])
    assert local == ["mpiexec", "-n", "2", "-hosts", "localhost:4", "-launcher", "fork",
                     "-genv", "A", "1", "-verbose", "python", "x.py"]
    shim = mpiexec.write_ssh_shim(str(tmp_path), 2222, "/keys/id")
    assert Path(shim).read_text().endswith('exec ssh -p 2222 -i /keys/id "$@"\n')
    remote = mpiexec.build_command(
        "mpiexec", [hosts.Host("a", 2), hosts.Host("b", 2), hosts.Host("c", 2)], 3, {},
        ["cmd"], ssh_shim=shim, network_interface="eth1")
    assert remote == ["mpiexec", "-n", "3", "-hosts", "a:2,b:2", "-launcher", "ssh",
                      "-launcher-exec", shim, "-iface", "eth1", "cmd"]


def test_mpi_args_value_may_start_with_a_dash():
    parser = launch.build_parser()
    argv = launch._join_option_values(
        parser, ["-np", "2", "--mpi-args", "-verbose", "python", "--mpi-args", "x"])
    assert argv == ["-np", "2", "--mpi-args=-verbose", "python", "--mpi-args", "x"]


def test_helpers():
    assert format_ranks([5, 0, 1, 2]) == "0-2, 5"
    assert rank_wrapper.rank_from_env({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert rank_wrapper.rank_from_env({}) is None
    assert rank_wrapper.exit_status(-9) == 137


def test_rank_wrapper_writes_whole_prefixed_lines():
    # A partial line is flushed after a pause and continued without a second
    # prefix; a last line without a newline still gets one.
    script = ("import sys, time; w = sys.stdout.write; w('abc'); sys.stdout.flush(); "
              "time.sleep(0.8); w('def\\nx\\ny'); sys.stdout.flush(); time.sleep(0.1); w('z')")
    proc = subprocess.run(
        [sys.executable, rank_wrapper.__file__, "--prefix", "--", sys.executable, "-c", script],
        env=dict(os.environ, PMI_RANK="4"), capture_output=True, timeout=LAUNCH_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"[4]<stdout>:abcdef\n[4]<stdout>:x\n[4]<stdout>:yz\n"


class _Writes:
    """A stderr that keeps each write() apart."""

    def __init__(self):
        self.writes = []

    def write(self, text):
        self.writes.append(text)
        return len(text)

    def flush(self):
        pass


@pytest.mark.parametrize("say", [
    console.say, rank_wrapper._say,
    lambda m: Supervisor._say(None, m), lambda m: ElasticDriver._say(None, m),
], ids=["console", "rank_wrapper", "supervisor", "elastic_driver"])
def test_launcher_lines_are_written_whole(say, monkeypatch):
    # The ranks' lines share the stream: a line written in two pieces (as
    # print() writes it) can get a rank's line glued to its end, where a
    # reader of RESULT lines no longer finds it.
    stderr = _Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    say("rank 0 was killed by signal 9 (SIGKILL); stopping the job.")
    assert stderr.writes == ["tfringrun: rank 0 was killed by signal 9 (SIGKILL); stopping the job.\n"]
