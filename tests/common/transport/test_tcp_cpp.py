"""Builds the C++ side of the TCP wire (tf_ops/common/transport/tcp/) under
AddressSanitizer and UBSan and runs it: its unit tests, a session against the
Python rendezvous store, hostile servers, and a short seeded fuzz run of the
parser. Needs no TensorFlow and no MPI, which is the layering this guards."""
import glob
import os
import random
import socket
import subprocess
import threading
import time

import pytest

from support import ROOT, build_cpp
from tfring.build.unit_tests import unit_test_sources
from tfring.runner import wire
from tfring.runner.topology import Registration, derive_topology
from wire_support import HOST, refusals, running_store

TCP = os.path.join(ROOT, "tf_ops", "common", "transport", "tcp")
# Test sources sit under tf_ops/common/tests/, which no library build
# compiles (the fuzz target in a subfolder, so Bazel makes no cc_test of it).
FLAGS = ["-std=c++17", "-O1", "-g", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=undefined", "-Wall", "-Wextra", "-Werror"]

pytestmark = pytest.mark.needs_tool("g++")


def build(out, program, defines=()):
    return build_cpp(out, unit_test_sources(program, ROOT), ["g++", *FLAGS, *defines],
                     timeout=600)


@pytest.fixture(scope="module")
def client_test(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tcp") / "tcp_client_test", "tcp_client_test.cc")


def run(binary, *args, secret=None, timeout=60):
    env = dict(os.environ)
    env.pop("TFRING_SECRET", None)
    if secret is not None:
        env["TFRING_SECRET"] = wire.encode_secret(secret)  # never on the command line
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_unit(client_test):
    result = run(client_test, "unit")
    assert result.returncode == 0, result.stdout + result.stderr
    assert ", 0 failed" in result.stdout


def test_session_against_the_python_store_and_same_topology(client_test):
    with running_store() as (server, secret):
        n = 5
        result = run(client_test, "store", HOST, server.address[1], "job/0", n, secret=secret)
        assert result.returncode == 0, result.stdout + result.stderr
    cpp = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("TOPO")]
    # The registrations the C++ side made (host-a/host-b alternating, -1 order).
    regs = [Registration("host-b" if i % 2 else "host-a", 100 + i // 2, "x:1", i // 2, -1)
            for i in range(n)]
    py = [[str(v) for v in (r.rank, r.size, r.local_rank, r.local_size, r.cross_rank,
                            r.cross_size, r.host, r.slot)] for r in derive_topology(regs)]
    assert cpp == py


def test_wrong_secret_and_no_server(client_test, caplog):
    import logging
    caplog.set_level(logging.WARNING, logger="tfring.rendezvous")
    with running_store() as (server, secret):
        port = server.address[1]
        result = run(client_test, "connect", HOST, port, 5, secret=wire.generate_secret())
        refused = f"AUTH_FAILED rendezvous {HOST}:{port}: the server refused the connection"
        assert result.stdout.startswith(refused), result.stdout
        assert len(refusals(caplog)) == 1
        result = run(client_test, "connect", HOST, port, 5, secret=secret)
        assert result.stdout.startswith("OK"), result.stdout
    result = run(client_test, "connect", HOST, port, 5, secret=secret)
    assert result.stdout.startswith("PEER_CLOSED") and "Connection refused" in result.stdout


def _hostile_server(behaviour):
    listener = socket.create_server((HOST, 0))
    stop = threading.Event()

    def serve():
        conn, _ = listener.accept()
        with conn:
            if behaviour == "garbage":
                conn.sendall(bytes(random.Random(1).randrange(256) for _ in range(200)))
            elif behaviour == "oversized":
                conn.sendall(b"\xff\xff\xff\xff")
            elif behaviour == "half_challenge":
                conn.sendall(wire.frame(wire.CHALLENGE, wire.MAGIC + b"\x01" + bytes(32))[:10])
            elif behaviour == "close":
                return
            elif behaviour == "wrong_server_proof":
                conn.sendall(wire.frame(wire.CHALLENGE, wire.MAGIC + b"\x01" + bytes(32)))
                wire.read_frame(conn, 256, time.monotonic() + 5, 5)
                conn.sendall(wire.frame(wire.AUTH_OK, bytes(32)))
            elif behaviour == "old_version":
                conn.sendall(wire.frame(wire.CHALLENGE, wire.MAGIC + b"\x09" + bytes(32)))
            stop.wait(10)  # "silent" and the stalls: say nothing more
    thread = threading.Thread(target=serve)
    thread.start()
    return listener, thread, stop


HOSTILE = [
    ("garbage", "PROTOCOL_ERROR"),
    ("oversized", "PROTOCOL_ERROR rendezvous 127.0.0.1:{port}: frame of 4294967295 bytes "
                  "exceeds the maximum of 256"),
    ("silent", "TIMEOUT"),
    ("half_challenge", "TIMEOUT"),
    ("close", "PEER_CLOSED"),
    ("wrong_server_proof", "AUTH_FAILED rendezvous 127.0.0.1:{port}: the server's proof is wrong"),
    ("old_version", "PROTOCOL_ERROR rendezvous 127.0.0.1:{port}: the peer speaks wire version 9"),
]


@pytest.mark.parametrize("behaviour,expected", HOSTILE, ids=[b for b, _ in HOSTILE])
def test_hostile_servers_give_typed_errors_not_hangs(client_test, behaviour, expected):
    listener, thread, stop = _hostile_server(behaviour)
    port = listener.getsockname()[1]
    try:
        start = time.monotonic()
        result = run(client_test, "connect", HOST, port, 1.5, secret=wire.generate_secret())
        assert time.monotonic() - start < 30
        assert result.returncode == 0, result.stderr  # sanitizers stay quiet
        assert result.stdout.startswith(expected.format(port=port)), result.stdout
    finally:
        stop.set()
        thread.join(15)
        listener.close()


def test_short_seeded_fuzz_run_of_the_parser(tmp_path):
    binary = build(tmp_path / "fuzz_wire", "fuzz/fuzz_wire.cc", defines=["-DTFRING_SEEDED_DRIVER"])
    for seed in (1, 2):
        result = run(binary, seed, 30000, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr[-5000:]
        assert result.stdout.strip() == "executions 30000 crashes 0"


def test_transport_has_no_mpi_or_tensorflow_includes():
    paths = glob.glob(os.path.join(TCP, "**", "*.[ch]*"), recursive=True)
    assert len(paths) >= 10
    for path in paths:
        with open(path) as f:
            text = f.read()
        assert "tensorflow/" not in text and "<mpi.h>" not in text, path
