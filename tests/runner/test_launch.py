"""Tests for tfringrun (tfring.runner).

The multi-rank tests run the real launcher (``python -m tfring.runner.launch``)
over MPICH's hydra with tiny ``python -c`` rank scripts that never import
TensorFlow, so the whole file takes seconds. Every launch has a timeout, and
the failure tests check that no rank process survives the job.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from tfring.runner import check_build, hosts, launch, mpiexec, rank_env, rank_wrapper
from tfring.runner.supervisor import Supervisor, format_ranks

REPO = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT = 60

# Rank script prologue: each rank records its pid and its wrapper's pid, then
# waits until every rank has, so a test's failure cannot race a slow start.
RECORD_PIDS = textwrap.dedent("""
    import os, sys, time
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
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


# -- launching ---------------------------------------------------------------

@pytest.mark.parametrize("num_proc", [2, 3])
def test_every_rank_runs_with_prefixed_output(num_proc):
    proc, _ = tfringrun("-np", str(num_proc), sys.executable, "-c",
                        "import os, sys; print('rank', os.environ['PMI_RANK'], "
                        "os.environ['PMI_SIZE']); print('oops', file=sys.stderr)")
    assert proc.returncode == 0, proc.stderr
    out = rank_lines(proc.stdout)
    assert out == {r: [f"rank {r} {num_proc}"] for r in range(num_proc)}
    assert rank_lines(proc.stderr, "stderr") == {r: ["oops"] for r in range(num_proc)}


def test_hosts_flag_and_no_prefix_output():
    proc, _ = tfringrun("-H", "localhost:3", "--no-prefix-output", sys.executable, "-c",
                        "import os; print('rank', os.environ['PMI_RANK'])")
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


def test_output_filename_writes_per_rank_files(tmp_path):
    proc, _ = tfringrun("-np", "2", "--output-filename", str(tmp_path / "logs"), sys.executable,
                        "-c", "import os, sys; r = os.environ['PMI_RANK']; "
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

def test_failing_rank_stops_the_job(tmp_path):
    script = RECORD_PIDS + textwrap.dedent("""
        if rank == 1:
            sys.exit(3)
        time.sleep(30)
    """)
    proc, took = tfringrun("-np", "3", sys.executable, "-c", script, str(tmp_path))
    assert proc.returncode == 3
    assert "tfringrun: rank 1 exited with code 3; stopping the job." in proc.stderr
    assert took < 10
    assert_all_gone(tmp_path, 3)


def test_rank_killed_by_signal_is_reported(tmp_path):
    script = RECORD_PIDS + textwrap.dedent("""
        if rank == 1:
            os.kill(os.getpid(), 9)
        time.sleep(30)
    """)
    proc, took = tfringrun("-np", "2", sys.executable, "-c", script, str(tmp_path))
    assert proc.returncode == 128 + 9
    assert "rank 1 was killed by signal 9 (SIGKILL)" in proc.stderr
    assert took < 10
    assert_all_gone(tmp_path, 2)


def test_timeout_kills_a_hanging_job(tmp_path):
    script = RECORD_PIDS + "time.sleep(0.1 if rank == 1 else 30)\n"
    proc, took = tfringrun("-np", "3", "--timeout", "2.5", sys.executable, "-c", script,
                           str(tmp_path))
    assert proc.returncode == 124
    assert "ran past --timeout 2.5 s; ranks still running: 0, 2" in proc.stderr
    assert took < 10
    assert_all_gone(tmp_path, 3)


def test_rank_ignoring_sigterm_is_killed(tmp_path):
    script = RECORD_PIDS + textwrap.dedent("""
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(30)
    """)
    proc, took = tfringrun("-np", "2", "--timeout", "1.5", sys.executable, "-c", script,
                           str(tmp_path))
    assert proc.returncode == 124
    assert took < 15
    assert_all_gone(tmp_path, 2)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_stopping_tfringrun_ends_every_rank(tmp_path, signum):
    # SIGINT: tfringrun stops the job itself. SIGKILL: the wrappers notice
    # that tfringrun is gone and stop their commands.
    script = RECORD_PIDS + "time.sleep(30)\n"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.runner.launch", "-np", "2", sys.executable, "-c",
         script, str(tmp_path)], cwd=REPO, stdin=subprocess.DEVNULL,
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


def test_missing_command_is_reported():
    proc, _ = tfringrun("-np", "2", "no-such-command-tfring")
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
    (["-np", "2", "--gloo", "true"], "--gloo is not supported yet"),
    (["-np", "2", "--bogus", "true"], "unrecognized arguments: --bogus"),
    (["-np", "2", "--min-np", "1", "true"], "elastic training (--min-np) is not supported"),
    (["-np", "4", "-H", "localhost:2", "true"], "-np 4 needs more slots than the 2"),
    (["true"], "-np is required"),
    (["-np", "2"], "no command given"),
])
def test_usage_errors(args, message, capsys, monkeypatch):
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    if "unrecognized" in message:  # argparse's own error
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


def test_hostfile_flag_end_to_end(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("localhost slots=2\n")
    proc, _ = tfringrun("--hostfile", str(path), sys.executable, "-c",
                        "import os; print(os.environ['PMI_RANK'])")
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
