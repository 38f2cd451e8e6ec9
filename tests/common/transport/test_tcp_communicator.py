"""The TCP communicator (tf_ops/common/transport/tcp/tcp_communicator.*) over
real sockets, built under ASan/UBSan: in-process worlds (tcp_comm_test.cc),
then one process per rank (ranks/tcp_comm_rank.cc, addresses exchanged
through files) for correctness, a SIGKILLed rank, a SIGSTOPped rank and
strangers at a rank's listener; and the pieces it rests on: the peers'
framing (peer_frame_test.cc, and a seeded fuzz run) and Communicator::Wait's
spin-or-block policy (wait_policy_test.cc). Needs neither TensorFlow nor MPI."""
import os
import queue
import random
import signal
import subprocess
import threading
import time

import pytest

from support import ROOT, build_sanitized_cpp, run_sanitized_cpp_test
from tfring.build.unit_tests import unit_test_sources
from tfring.runner import wire

pytestmark = pytest.mark.needs_tool("g++")


@pytest.fixture(scope="module")
def comm_test(tmp_path_factory):
    """Builds the in-process test program under the sanitizers and runs it
    (worlds of 1, 2 and 3 ranks on threads, worlds re-formed in one process,
    orderly close, bad arguments), then builds the rank program; yields the
    rank program and the in-process run's output."""
    out = tmp_path_factory.mktemp("tcp_comm")
    stdout = run_sanitized_cpp_test(out / "tcp_comm_test",
                                    unit_test_sources("tcp_comm_test.cc", ROOT),
                                    flags=["-Wextra", "-pthread"])
    rank = build_sanitized_cpp(out / "tcp_comm_rank",
                               unit_test_sources("ranks/tcp_comm_rank.cc", ROOT),
                               flags=["-Wextra", "-pthread"])
    return rank, stdout


def test_in_process_worlds(comm_test):
    _, stdout = comm_test
    assert stdout.strip().endswith(", 0 failed")


@pytest.mark.parametrize("program", ["peer_frame_test.cc", "wait_policy_test.cc"])
def test_unit_programs(tmp_path, program):
    run_sanitized_cpp_test(tmp_path / program[:-len(".cc")], unit_test_sources(program, ROOT),
                           flags=["-Wextra", "-pthread"])


class Job:
    """`n` rank processes of the rank program; every line they print is
    collected with the time it arrived. Kills whatever is left on exit."""

    def __init__(self, binary, n, workdir, scenario, heartbeat=1.0, secret=None, ranks=None):
        self.binary, self.n, self.dir, self.scenario = binary, n, str(workdir), scenario
        self.heartbeat = heartbeat
        self.secret = secret or wire.generate_secret()
        self.procs = [None] * n
        self.lines = queue.Queue()
        self.stderr = [""] * n
        self._threads = []
        for r in (range(n) if ranks is None else ranks):
            self.start(r)

    def start(self, rank):
        env = dict(os.environ, TFRING_SECRET=wire.encode_secret(self.secret))
        proc = subprocess.Popen(
            [self.binary, str(rank), str(self.n), self.dir, self.scenario,
             str(self.heartbeat)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        self.procs[rank] = proc

        def pump_out():
            for line in proc.stdout:
                self.lines.put((rank, time.monotonic(), line.rstrip("\n")))

        def pump_err():
            self.stderr[rank] = proc.stderr.read()
        for fn in (pump_out, pump_err):
            t = threading.Thread(target=fn, daemon=True)
            t.start()
            self._threads.append(t)

    def address(self, rank, timeout=30):
        path = os.path.join(self.dir, f"addr.{rank}")
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            assert time.monotonic() < deadline, f"rank {rank} published no address"
            time.sleep(0.02)
        host, port = open(path).read().rsplit(":", 1)
        return host, int(port)

    def wait_for(self, prefix, ranks, timeout):
        """{rank: (time, line)} for the first line starting with `prefix` from
        each of `ranks`; fails after `timeout` seconds."""
        got, deadline = {}, time.monotonic() + timeout
        while set(got) != set(ranks):
            try:
                rank, t, line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no '{prefix}' from ranks {set(ranks) - set(got)} within "
                                     f"{timeout} s; stderr: {self.stderr}")
            if line.startswith("ERROR"):
                raise AssertionError(f"rank {rank}: {line}")
            if line.startswith(prefix) and rank in ranks:
                got.setdefault(rank, (t, line))
        return got

    def finish(self, ranks, timeout=180):
        for r in ranks:
            self.procs[r].wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        return [self.procs[r].returncode for r in ranks]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)


@pytest.mark.parametrize("np_", [2, 3])
def test_exchange_between_processes(comm_test, tmp_path, np_):
    with Job(comm_test[0], np_, tmp_path, "exchange") as job:
        codes = job.finish(range(np_))
        results = job.wait_for("RESULT", range(np_), 5)
        assert codes == [0] * np_, job.stderr
        assert all(line == "RESULT ok" for _, line in results.values())
        assert not any("WARNING" in e for e in job.stderr), job.stderr


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("sig,cause", [(signal.SIGKILL, "its connection"),
                                       (signal.SIGSTOP, "sent nothing for")],
                         ids=["killed", "stopped"])
def test_failed_rank_aborts_every_survivor_within_5s(comm_test, tmp_path, np_, sig, cause):
    victim = np_ - 1
    survivors = [r for r in range(np_) if r != victim]
    with Job(comm_test[0], np_, tmp_path, "ring", heartbeat=1.0) as job:
        # Every rank has finished one exchange and started the next: the
        # victim dies with data in flight.
        job.wait_for("EXCHANGING", range(np_), 120)
        killed_at = time.monotonic()
        os.kill(job.procs[victim].pid, sig)
        got = job.wait_for("ABORTED", survivors, 30)
        if sig == signal.SIGSTOP:
            job.procs[victim].kill()
        for rank, (t, line) in got.items():
            assert t - killed_at < 5.0, (rank, t - killed_at, line)
            assert f"tfring stopped: rank {victim} (host proc-host-{victim})" in line, line
            assert cause in line, line
        assert job.finish(survivors, timeout=60) == [0] * len(survivors), job.stderr


def _read_frame(sock):
    return wire.read_frame(sock, wire.MAX_HANDSHAKE_FRAME, time.monotonic() + 10, 10)


def _closed(sock, timeout=15):
    """True once the peer has closed the connection (EOF or reset)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def _attack(address, kind, secret):
    """Connects to a rank's listener as a stranger; returns what came back
    after the challenge (a frame type, or None)."""
    import socket
    s = socket.create_connection(address, timeout=10)
    try:
        if kind == "garbage":
            s.sendall(bytes(random.Random(7).randrange(256) for _ in range(300)))
            assert _closed(s)
            return None
        if kind == "oversized":
            s.sendall(b"\xff\xff\xff\xff")
            assert _closed(s)
            return None
        msg_type, r = _read_frame(s)
        assert msg_type == wire.CHALLENGE
        assert r.raw(4) == wire.MAGIC and r.u8() == wire.VERSION
        nonce = r.raw(wire.NONCE_BYTES)
        client_nonce = os.urandom(32)
        hello = wire.frame(0x30, (9).to_bytes(4, "big") + (0).to_bytes(4, "big") +
                           (2).to_bytes(4, "big"))
        if kind == "no_secret":  # skips the proof and says HELLO at once
            s.sendall(hello)
        else:
            key = secret if kind == "authenticated_duplicate" else wire.generate_secret()
            mac = wire.client_mac(key, nonce, client_nonce, b"tfring-peer")
            s.sendall(wire.frame(wire.AUTH, client_nonce + wire.pack_bytes(b"tfring-peer") + mac))
            if kind == "authenticated_duplicate":
                msg_type, _ = _read_frame(s)
                assert msg_type == wire.AUTH_OK
                # Claims to be rank 1 of a 2-rank job, which is connected already.
                s.sendall(wire.frame(0x30, (1).to_bytes(4, "big") + (0).to_bytes(4, "big") +
                                     (2).to_bytes(4, "big")))
        msg_type, r = _read_frame(s)
        assert _closed(s)
        return msg_type, r.u8()
    finally:
        s.close()


STRANGERS = ["no_secret", "wrong_secret", "garbage", "oversized"]


def test_strangers_at_a_listener_are_refused_and_the_job_goes_on(comm_test, tmp_path):
    with Job(comm_test[0], 2, tmp_path, "serve") as job:
        address = job.address(0)
        job.address(1)
        # During start-up: rank 0 is waiting for rank 1 (held back until the
        # "go" file exists) while strangers knock.
        for kind in STRANGERS:
            reply = _attack(address, kind, job.secret)
            if kind in ("no_secret", "wrong_secret"):
                assert reply == (wire.ERROR, wire.E_AUTH), (kind, reply)
        open(os.path.join(str(tmp_path), "go"), "w").close()
        job.wait_for("READY", [0, 1], 120)
        # While the job runs, on both listeners, plus an authenticated peer
        # that claims a rank that is already connected.
        for rank in (0, 1):
            for kind in STRANGERS:
                _attack(job.address(rank), kind, job.secret)
        reply = _attack(job.address(0), "authenticated_duplicate", job.secret)
        assert reply == (wire.ERROR, wire.E_INVALID), reply
        open(os.path.join(str(tmp_path), "stop"), "w").close()
        assert job.finish([0, 1]) == [0, 0], job.stderr
        results = job.wait_for("RESULT", [0, 1], 5)
        assert all(line == "RESULT ok" for _, line in results.values())
    refusals = [[line for line in job.stderr[r].splitlines() if "refused a connection" in line]
                for r in (0, 1)]
    # Logged once per stranger, at WARNING, naming the reason.
    assert len(refusals[0]) == 2 * len(STRANGERS) + 1, job.stderr[0]
    assert len(refusals[1]) == len(STRANGERS), job.stderr[1]
    assert all("WARNING" in line for line in refusals[0] + refusals[1])
    assert any("does not hold this job's secret" in line for line in refusals[0])
    assert any("rank 1 is already connected" in line for line in refusals[0])


def _header(kind, tag=0, context=0, length=0, reserved=b"\0\0\0"):
    return (bytes([kind]) + reserved + tag.to_bytes(4, "big", signed=True) +
            context.to_bytes(8, "big") + length.to_bytes(8, "big"))


MALFORMED = [
    ("unknown_kind", _header(9), "unknown frame kind 9"),
    ("reserved_bytes", _header(1, reserved=b"\0\1\0"), "non-zero reserved bytes"),
    ("huge_length", _header(1, 5, 7, (1 << 40) + 1), "1099511627777 bytes, above the limit"),
    ("heartbeat_payload", _header(2, length=16), "carries a payload of 16 bytes"),
]


@pytest.mark.parametrize("name,frame,expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_frame_from_an_authenticated_peer_fails_the_world(comm_test, tmp_path, name,
                                                                   frame, expected):
    """This test plays rank 1 of a 2-rank job by hand (it holds the secret),
    then breaks the data stream: rank 0 must fail with ABORTED naming rank 1
    and the fault, without crashing or allocating what the header claims."""
    import socket
    with Job(comm_test[0], 2, tmp_path, "ring", ranks=[0]) as job:
        with open(os.path.join(str(tmp_path), "addr.1"), "w") as f:
            f.write("127.0.0.1:1")  # never dialled: rank 1 connects to rank 0
        s = socket.create_connection(job.address(0), timeout=10)
        with s:
            msg_type, r = _read_frame(s)
            assert msg_type == wire.CHALLENGE
            r.raw(5)
            nonce = r.raw(wire.NONCE_BYTES)
            mine = os.urandom(32)
            mac = wire.client_mac(job.secret, nonce, mine, b"tfring-peer")
            s.sendall(wire.frame(wire.AUTH, mine + wire.pack_bytes(b"tfring-peer") + mac))
            assert _read_frame(s)[0] == wire.AUTH_OK
            s.sendall(wire.frame(0x30, (1).to_bytes(4, "big") + (0).to_bytes(4, "big") +
                                 (2).to_bytes(4, "big")))
            assert _read_frame(s)[0] == 0x31  # HELLO_OK: rank 1 is in
            job.wait_for("READY", [0], 60)
            # A valid frame first (a heartbeat), then the broken one.
            s.sendall(_header(2) + frame + b"x" * 64)
            got = job.wait_for("ABORTED", [0], 30)
        line = got[0][1]
        assert "tfring stopped: rank 1 (host proc-host-1) sent a malformed frame" in line, line
        assert expected in line, line
        assert job.finish([0], timeout=60) == [0], job.stderr


@pytest.mark.parametrize("scenario", ["pingpong", "bandwidth"])
def test_small_round_trips_and_large_swaps(comm_test, tmp_path, scenario):
    """Correctness of 5000 round trips of 4 KB, and of ten simultaneous
    64 MiB swaps (checked); the speed is printed for the record (targets live
    in benchmarks/, not here)."""
    with Job(comm_test[0], 3, tmp_path, scenario) as job:
        assert job.finish(range(3)) == [0] * 3, job.stderr
        got = job.wait_for(scenario.upper(), [0], 5)
        print(got[0][1], "(ASan build)")


@pytest.mark.parametrize("np_", [2, 3])
def test_idle_world_stays_alive_on_heartbeats(comm_test, tmp_path, np_):
    """5 s without a message is 10 heartbeat intervals of 0.5 s: only the
    heartbeats keep the peers from being declared dead. The CPU an idle rank
    uses is printed for the record."""
    with Job(comm_test[0], np_, tmp_path, "idle", heartbeat=0.5) as job:
        assert job.finish(range(np_)) == [0] * np_, job.stderr
        got = job.wait_for("IDLECPU", range(np_), 5)
        assert not any("WARNING" in e for e in job.stderr), job.stderr
        print([line for _, line in got.values()], "(ASan build)")


def test_short_seeded_fuzz_run_of_the_peer_frames(tmp_path):
    binary = build_sanitized_cpp(tmp_path / "fuzz_peer_frame",
                                 unit_test_sources("fuzz/fuzz_peer_frame.cc", ROOT),
                                 flags=["-Wextra", "-DTFRING_SEEDED_DRIVER"], build_timeout=600)
    for seed in (1, 2):
        result = subprocess.run([str(binary), str(seed), "200000"], capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr[-5000:]
        assert result.stdout.strip() == "executions 200000 crashes 0"
