"""tfringrun --tcp: what only the TCP launch mode does.

The supervision behaviour it shares with MPI (first failure named, the rest
stopped, exit codes, --timeout, signals, no orphan) is tested under both
controllers in test_launch.py. Here: the rendezvous store and the secret,
the ranks' environment, where things listen, and remote hosts over ssh.

Remote hosts are fake: a fake ``ssh`` put first on PATH checks its
arguments and runs the remote command on this machine, in a new session and
with a login-like environment of its own (so the rank's environment must
really travel through ssh's stdin), as sshd would. Rank commands are plain
Python and never import TensorFlow.
"""
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import uuid

import pytest

from launch_support import (LAUNCH_TIMEOUT, RANK_AND_SIZE, RECORD_PIDS, REPO, assert_all_gone,
                            rank_lines, tfringrun, wait_for_files)
from tfring.runner import hosts, launch, rank_env, rank_wrapper, remote, wire
from tfring.runner.rendezvous import RendezvousClient

# Prints the rank's place in the job and proves the store and the secret
# work: it authenticates to the store with TFRING_SECRET and pings it.
SHOW_PLACE = textwrap.dedent("""
    import os, sys
    from tfring.runner.rendezvous import RendezvousClient
    """ + RANK_AND_SIZE + """
    env = os.environ
    with RendezvousClient(env["TFRING_RENDEZVOUS_ADDR"], int(env["TFRING_RENDEZVOUS_PORT"])) as c:
        c.ping()
    print(rank, size, env["TFRING_CONTROLLER"], env["TFRING_HOST_ORDER"], env["TFRING_LOCAL_SLOT"],
          env["TFRING_BIND_HOST"] or "-", env["TFRING_RENDEZVOUS_ADDR"],
          len(bytes.fromhex(env["TFRING_SECRET"])), env.get("TFRING_HOSTNAME", "-"),
          "token" if "TFRING_LAUNCHER_TOKEN" in env else "no-token")
""")

FAKE_SSH = textwrap.dedent("""\
    #!{python}
    # A stand-in for ssh: checks the arguments tfringrun gives it, logs
    # them, and runs the remote command here as sshd would: in a new
    # session, with a login environment (not the caller's), the host's own
    # name in TFRING_HOSTNAME, and stdin passed on.
    import json, os, subprocess, sys
    args = sys.argv[1:]
    with open(os.environ["FAKE_SSH_LOG"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    assert args[:2] == ["-o", "BatchMode=yes"], args
    rest = args[2:]
    options = {{}}
    while rest[0] in ("-p", "-i"):
        options[rest[0]] = rest[1]
        rest = rest[2:]
    assert len(rest) == 2, f"want HOST COMMAND, got {{rest}}"
    host, command = rest
    if host not in os.environ["FAKE_SSH_HOSTS"].split(","):
        print(f"ssh: Could not resolve hostname {{host}}: Name or service not known",
              file=sys.stderr)
        sys.exit(255)
    login = {{"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"),
              "TFRING_HOSTNAME": host}}
    child = subprocess.Popen(["sh", "-c", command], env=login, start_new_session=True)
    code = child.wait()
    sys.exit(code if code >= 0 else 128 - code)
""")


@pytest.fixture
def fake_ssh(tmp_path):
    """(environment with the fake ssh first on PATH, log path): the fake
    accepts the hosts fake-a and fake-b."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH.format(python=sys.executable))
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               FAKE_SSH_LOG=str(log), FAKE_SSH_HOSTS="fake-a,fake-b")
    return env, log


def ssh_calls(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def places(stdout):
    """{rank: the fields SHOW_PLACE printed}."""
    return {rank: lines[0].split() for rank, lines in rank_lines(stdout).items()}


# -- one host ------------------------------------------------------------------

@pytest.mark.parametrize("num_proc", [2, 3])
@pytest.mark.parametrize("flag", ["--tcp", "--gloo"])
def test_single_host_job_gets_a_store_a_secret_and_loopback(num_proc, flag):
    proc, _ = tfringrun(flag, "-np", str(num_proc), sys.executable, "-c", SHOW_PLACE)
    assert proc.returncode == 0, proc.stderr
    # rank size controller host-order slot bind store-addr secret-bytes hostname token
    assert places(proc.stdout) == {
        r: [str(r), str(num_proc), "tcp", "0", str(r), "127.0.0.1", "127.0.0.1", "32", "-",
            "no-token"] for r in range(num_proc)}


def test_user_hostname_reaches_the_ranks():
    env = dict(os.environ, TFRING_HOSTNAME="mybox")
    proc, _ = tfringrun("--tcp", "-np", "2", sys.executable, "-c", SHOW_PLACE, env=env)
    assert proc.returncode == 0, proc.stderr
    assert {p[8] for p in places(proc.stdout).values()} == {"mybox"}


def test_fake_hosts_get_one_name_each_in_host_order():
    # TFRING_HOSTNAME=b,b,a fakes hosts: rank r is on the r-th; hosts are
    # ordered as they first appear, so b (ranks 0-1) comes before a.
    env = dict(os.environ, TFRING_HOSTNAME="b,b,a")
    proc, _ = tfringrun("--tcp", "-np", "4", sys.executable, "-c", SHOW_PLACE, env=env)
    assert proc.returncode == 0, proc.stderr
    got = {r: (p[3], p[4], p[8]) for r, p in places(proc.stdout).items()}
    assert got == {0: ("0", "0", "b"), 1: ("0", "1", "b"), 2: ("1", "0", "a"),
                   3: ("2", "0", socket.gethostname())}


def test_mpi_mode_names_its_controller():
    # A user's TFRING_CONTROLLER=tcp must not leak into an MPI job's ranks.
    env = dict(os.environ, TFRING_CONTROLLER="tcp")
    proc, _ = tfringrun("-np", "2", sys.executable, "-c",
                        "import os; print(os.environ['TFRING_CONTROLLER'])", env=env)
    assert proc.returncode == 0, proc.stderr
    assert rank_lines(proc.stdout) == {0: ["mpi"], 1: ["mpi"]}


def test_jobs_get_different_secrets():
    secrets_seen = set()
    for _ in range(2):
        proc, _ = tfringrun("--tcp", "-np", "1", sys.executable, "-c",
                            "import os; print(os.environ['TFRING_SECRET'])")
        assert proc.returncode == 0, proc.stderr
        secrets_seen.add(rank_lines(proc.stdout)[0][0])
    assert len(secrets_seen) == 2


def test_store_refuses_a_client_without_the_secret():
    # A rank tries the store with a wrong secret: refused; the job goes on.
    script = textwrap.dedent("""
        import os
        from tfring.runner import wire
        from tfring.runner.rendezvous import RendezvousClient
        addr, port = os.environ["TFRING_RENDEZVOUS_ADDR"], int(os.environ["TFRING_RENDEZVOUS_PORT"])
        try:
            RendezvousClient(addr, port, wire.generate_secret(), timeout=5)
        except wire.AuthenticationError:
            print("refused")
        with RendezvousClient(addr, port) as c:
            c.ping()
            print("accepted")
    """)
    proc, _ = tfringrun("--tcp", "-np", "1", sys.executable, "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert rank_lines(proc.stdout) == {0: ["refused", "accepted"]}


# -- several hosts over (fake) ssh -----------------------------------------------

def test_remote_ranks_start_over_ssh_with_the_exact_command_line(fake_ssh, tmp_path):
    env, log = fake_ssh
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    proc, _ = tfringrun("--tcp", "-H", "localhost:2,fake-a:1,fake-b:2", "-p", "2222", "-i",
                        str(key), sys.executable, "-c", SHOW_PLACE, env=env)
    assert proc.returncode == 0, proc.stderr
    got = places(proc.stdout)
    addr = got[0][6]
    # Remote ranks reach the store at the address routed towards them (fake
    # hosts resolve to none, so this host name's address).
    assert addr == hosts.address_seen_from(["fake-a", "fake-b"])
    assert got == {
        0: ["0", "5", "tcp", "0", "0", "0.0.0.0", addr, "32", "-", "no-token"],
        1: ["1", "5", "tcp", "0", "1", "0.0.0.0", addr, "32", "-", "no-token"],
        2: ["2", "5", "tcp", "1", "0", "0.0.0.0", addr, "32", "fake-a", "no-token"],
        3: ["3", "5", "tcp", "2", "0", "0.0.0.0", addr, "32", "fake-b", "no-token"],
        4: ["4", "5", "tcp", "2", "1", "0.0.0.0", addr, "32", "fake-b", "no-token"],
    }
    calls = ssh_calls(log)
    assert sorted(c[6] for c in calls) == ["fake-a", "fake-b", "fake-b"]
    for call in calls:
        assert call[:6] == ["-o", "BatchMode=yes", "-p", "2222", "-i", str(key)]
        remote = shlex.split(call[7])
        assert remote[:4] == ["cd", str(REPO), "&&", "exec"]
        wrapper = remote[4:]
        assert wrapper[:2] == [sys.executable, rank_wrapper.__file__]
        assert "--env-stdin" in wrapper
        assert wrapper[wrapper.index("--") + 1:] == [sys.executable, "-c", SHOW_PLACE]


def test_network_interfaces_are_resolved_on_each_host(fake_ssh):
    env, _ = fake_ssh
    proc, _ = tfringrun("--tcp", "--network-interfaces", "no-such-nic0,lo", "-H",
                        "localhost:1,fake-a:1", sys.executable, "-c", SHOW_PLACE, env=env)
    assert proc.returncode == 0, proc.stderr
    got = places(proc.stdout)
    # The store and every rank listen on lo's address; the remote rank's
    # wrapper resolved it there (its first listed interface is missing).
    assert [got[r][5:7] for r in (0, 1)] == [["127.0.0.1", "127.0.0.1"]] * 2


def test_unknown_network_interface_is_an_error():
    proc, _ = tfringrun("--tcp", "--network-interfaces", "no-such-nic0", "-np", "2", "true")
    assert proc.returncode == 1
    assert "none of --network-interfaces no-such-nic0 has an IPv4 address" in proc.stderr


def test_unreachable_host_fails_the_job_at_once(fake_ssh, tmp_path):
    env, _ = fake_ssh
    script = RECORD_PIDS + "time.sleep(60)\n"
    proc, took = tfringrun("--tcp", "--start-timeout", "60", "-H", "localhost:1,nowhere:1",
                           sys.executable, "-c", script, str(tmp_path), env=env)
    assert proc.returncode == 255, proc.stderr
    assert ("tfringrun: rank 1 did not start: ssh nowhere exited with code 255; "
            "stopping the job.") in proc.stderr
    assert "Could not resolve hostname nowhere" in proc.stderr
    assert took < 30  # not the start timeout
    assert_all_gone(tmp_path, 1)  # rank 0, which did start


def test_failing_remote_rank_stops_every_rank(fake_ssh, tmp_path):
    env, _ = fake_ssh
    script = RECORD_PIDS + "sys.exit(4) if rank == 2 else time.sleep(60)\n"
    proc, took = tfringrun("--tcp", "-H", "localhost:1,fake-a:1,fake-b:1",
                           "--failure-grace-seconds", "1", sys.executable,
                           "-c", script, str(tmp_path), env=env)
    assert proc.returncode == 4, proc.stderr
    assert "tfringrun: rank 2 (on " in proc.stderr and "exited with code 4; stopping the job." \
        in proc.stderr
    assert took < 30
    assert_all_gone(tmp_path, 3)


def test_killed_tfringrun_leaves_no_remote_rank(fake_ssh, tmp_path):
    # The remote wrappers are in sessions of their own, not under ssh's
    # process group: they end because their connection to tfringrun drops.
    env, _ = fake_ssh
    script = RECORD_PIDS + "time.sleep(60)\n"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.runner.launch", "--tcp", "-H", "fake-a:1,fake-b:1",
         sys.executable, "-c", script, str(tmp_path)], cwd=REPO, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_files(tmp_path, ["pids.0", "pids.1"], proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_all_gone(tmp_path, 2)


# -- the secret stays off every command line ----------------------------------------

def _environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)


def _command_lines():
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found[int(entry)] = f.read()
            except OSError:
                continue
    return found


def test_secret_and_token_are_on_no_command_line(fake_ssh, tmp_path):
    # Issue 9: `ps` shows every user every process's arguments. Rank 0 is
    # local, ranks 1-2 remote (fake ssh); all are running while /proc is read.
    env, _ = fake_ssh
    script = RECORD_PIDS + textwrap.dedent("""
        while not os.path.exists(os.path.join(sys.argv[1], "go")):
            time.sleep(0.02)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfring.runner.launch", "--tcp", "-H",
         "localhost:1,fake-a:1,fake-b:1", sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        wait_for_files(tmp_path, [f"pids.{r}" for r in range(3)], proc)
        secrets_seen, tokens = set(), set()
        for rank in range(3):
            child, wrapper = (int(p) for p in (tmp_path / f"pids.{rank}").read_text().split())
            secrets_seen.add(_environ(child)[b"TFRING_SECRET"])
            assert b"TFRING_LAUNCHER_TOKEN" not in _environ(child)
        tokens.add(_environ(int((tmp_path / "pids.0").read_text().split()[1]))
                   [rank_wrapper.TOKEN_ENV.encode()])
        (secret,), (token,) = secrets_seen, tokens
        assert len(secret) >= 32 and len(token) >= 32
        lines = _command_lines()
        # The check can fail: the rank commands' own lines are there.
        assert any(b"rank_wrapper.py" in line for line in lines.values())
        assert not [pid for pid, line in lines.items() if secret in line or token in line]
        (tmp_path / "go").touch()
        _, err = proc.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert_all_gone(tmp_path, 3)


# -- units -----------------------------------------------------------------------------

def test_tcp_under_an_mpi_launcher_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("PMI_RANK", "0")
    assert launch.main(["--tcp", "true"]) == 2
    assert "--tcp starts the ranks itself; under an MPI launcher, leave it out" in \
        capsys.readouterr().err


def test_tcp_rank_env_places_ranks_host_by_host():
    placement = {"localhost": [0, 1], "b": [2], "127.0.0.1": [3], "c": [4, 5]}
    env = rank_env.tcp_rank_env(placement, ["b", "c"], "0.0.0.0", [])
    assert {r: (e["TFRING_RANK"], e["TFRING_HOST_ORDER"], e["TFRING_LOCAL_SLOT"],
                e["TFRING_BIND_HOST"]) for r, e in env.items()} == {
        0: ("0", "0", "0", "0.0.0.0"), 1: ("1", "0", "1", "0.0.0.0"),
        2: ("2", "1", "0", "0.0.0.0"),
        3: ("3", "0", "2", "0.0.0.0"),  # another name of this machine: same host
        4: ("4", "2", "0", "0.0.0.0"), 5: ("5", "2", "1", "0.0.0.0")}
    env = rank_env.tcp_rank_env({"localhost": [0], "b": [1]}, ["b"], "10.0.0.1", ["eth1", "eth2"])
    assert env[0]["TFRING_BIND_HOST"] == "10.0.0.1" and "TFRING_NETWORK_INTERFACES" not in env[0]
    assert env[1]["TFRING_BIND_HOST"] == "" and env[1]["TFRING_NETWORK_INTERFACES"] == "eth1,eth2"


def test_ssh_command_shape(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert remote.ssh_command("h", ["python", "a b"]) == [
        "ssh", "-o", "BatchMode=yes", "h", f"cd {tmp_path} && exec python 'a b'"]
    assert remote.ssh_command("h", ["x"], 22, "~/k")[:7] == [
        "ssh", "-o", "BatchMode=yes", "-p", "22", "-i", os.path.expanduser("~/k")]


@pytest.mark.parametrize("data, message", [
    (b"[1]", "not an object of string variables"),
    (b'{"A": 1}', "not an object of string variables"),
    (b"{", "not JSON"),
    (b"\xff", "not JSON"),
])
def test_wrapper_refuses_a_bad_environment_on_stdin(data, message):
    proc = subprocess.run(
        [sys.executable, rank_wrapper.__file__, "--env-stdin", "--", "true"], input=data,
        env=dict(os.environ, TFRING_RANK="3"), capture_output=True,
        timeout=LAUNCH_TIMEOUT)
    assert proc.returncode == 1
    assert f"tfringrun: rank 3: the environment on stdin is {message}".encode() in proc.stderr


def test_wrapper_takes_its_environment_from_stdin():
    marker = uuid.uuid4().hex
    env = {"TFRING_RANK": "1", "TFRING_TEST_MARK": marker,
           rank_wrapper.TOKEN_ENV: "t" * 32, "PATH": os.environ["PATH"]}
    proc = subprocess.run(
        [sys.executable, rank_wrapper.__file__, "--prefix", "--env-stdin", "--", sys.executable,
         "-c", "import os, sys; print(os.environ['TFRING_TEST_MARK'], "
               "os.environ.get('TFRING_LAUNCHER_TOKEN'), sys.stdin.read() == '')"],
        input=json.dumps(env).encode(), env={"PATH": os.environ["PATH"]}, capture_output=True,
        timeout=LAUNCH_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == f"[1]<stdout>:{marker} None True\n"


def test_store_started_for_other_launchers():
    import tfring.runner
    secret = wire.generate_secret()
    server, addr, port = tfring.runner.start_rendezvous("127.0.0.1", 0, wire.encode_secret(secret))
    try:
        assert addr == "127.0.0.1" and port > 0
        with RendezvousClient(addr, port, secret) as c:
            c.set("s", "k", b"v")
            assert c.get("s", "k", timeout=1) == b"v"
        with pytest.raises(wire.AuthenticationError):
            RendezvousClient(addr, port, wire.generate_secret(), timeout=5)
    finally:
        server.stop()
    with pytest.raises(ValueError, match="at least 16 bytes"):
        tfring.runner.start_rendezvous("127.0.0.1", 0, "abcd")
