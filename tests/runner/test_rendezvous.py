"""The rendezvous store (tfring.runner.rendezvous) on real sockets on
127.0.0.1: the store's requests, authentication (refused clients never touch
the store, and the job goes on), bad bytes, and a clean stop."""
import logging
import os
import socket
import struct
import threading
import time

import pytest

from tfring.runner import rendezvous, wire
from tfring.runner.rendezvous import RendezvousClient
from wire_support import (HOST, auth_frame, authenticated_raw, raw_connect, read_challenge,
                          refusals, running_store, wait_closed)


@pytest.fixture
def store():
    with running_store(handshake_timeout=2.0, frame_timeout=2.0) as s:
        yield s


@pytest.fixture(autouse=True)
def _log_level(caplog):
    caplog.set_level(logging.WARNING, logger="tfring.rendezvous")


def client(store_, secret=None, **kw):
    server, good = store_
    return RendezvousClient(*server.address, good if secret is None else secret, **kw)


def test_set_get_add_wait_and_scopes(store):
    with client(store) as c:
        c.set("job/0", "a", b"\x00bytes\xff")
        assert c.get("job/0", "a", timeout=1) == b"\x00bytes\xff"
        assert c.add("job/0", "n", 3) == 3
        assert c.add("job/0", "n", -10) == -7
        c.wait("job/0", ["a", "n"], timeout=1)
        # Scopes are apart: round 1 of the same job starts empty.
        with pytest.raises(wire.WireTimeoutError):
            c.get("job/1", "a", timeout=0.1)
        c.set("job/1", "a", b"new")
        c.delete_scope("job/0")
        # A deleted scope stays closed (a rank late for a replaced round
        # must not wait in it): nothing is read or written there again.
        for request in (lambda: c.get("job/0", "a", timeout=5), lambda: c.set("job/0", "a", b"1"),
                        lambda: c.add("job/0", "n", 1)):
            with pytest.raises(wire.ShuttingDownError, match="scope 'job/0' was deleted"):
                request()
        assert c.get("job/1", "a", timeout=1) == b"new"
        with pytest.raises(wire.InvalidRequestError,
                           match="key 'a' in scope 'job/1' is already set"):
            c.set("job/1", "a", b"x", exclusive=True)
        with pytest.raises(wire.InvalidRequestError, match="does not hold an integer"):
            c.add("job/1", "a", 1)
        c.ping()  # errors leave the connection usable


def test_get_waits_for_a_key_set_later(store):
    with client(store) as waiter, client(store) as setter:
        got = []
        t = threading.Thread(target=lambda: got.append(waiter.get("s", "late", timeout=10)))
        t.start()
        time.sleep(0.2)
        setter.set("s", "late", b"v")
        t.join(10)
        assert got == [b"v"]


def test_deleting_a_scope_ends_the_waits_in_it(store):
    # Whether the delete comes before or during the wait, the wait ends at
    # once with the scope named, long before its own timeout.
    with client(store) as waiter, client(store) as deleter:
        failed = []

        def wait():
            start = time.monotonic()
            try:
                waiter.wait_prefix("round/1", "reg/", 2, timeout=60)
            except wire.ShuttingDownError as e:
                failed.append((time.monotonic() - start, str(e)))
        t = threading.Thread(target=wait)
        t.start()
        deleter.delete_scope("round/1")
        t.join(30)
        assert len(failed) == 1 and failed[0][0] < 10, failed
        assert "scope 'round/1' was deleted" in failed[0][1]
        deleter.set("round/2", "reg/a", b"1")  # other scopes are untouched


def test_get_timeout_names_the_key(store):
    with client(store) as c:
        start = time.monotonic()
        with pytest.raises(wire.WireTimeoutError,
                           match=r"timed out after 0.3 s waiting for key 'missing' "
                                 r"in scope 'job/0'"):
            c.get("job/0", "missing", timeout=0.3)
        assert time.monotonic() - start < 5
        with pytest.raises(TimeoutError, match=r"keys \['b'\] in scope 'job/0'"):
            c.set("job/0", "a", b"1")
            c.wait("job/0", ["a", "b"], timeout=0.2)
        with pytest.raises(wire.WireTimeoutError, match=r"3 keys with prefix 'x/' .*\(have 0\)"):
            c.wait_prefix("job/0", "x/", 3, timeout=0.2)
        assert c.get("job/0", "a", timeout=1) == b"1"


def _blocked_get(store_):
    """A correct client blocked in get() across the refusals: the job must
    not notice them."""
    c = client(store_)
    result = []
    t = threading.Thread(target=lambda: result.append(c.get("job", "go", timeout=20)))
    t.start()
    return c, t, result


def _job_goes_on(store_, c, t, result):
    with client(store_) as other:
        other.set("job", "go", b"yes")
    t.join(20)
    c.close()
    assert result == [b"yes"]


def test_client_without_the_secret_is_refused(store, caplog):
    server, secret = store
    c, t, result = _blocked_get(store)
    # A client that skips the handshake and sends a request straight away.
    raw = raw_connect(server)
    read_challenge(raw)
    raw.sendall(wire.frame(wire.SET, wire.pack_bytes(b"job") + wire.pack_bytes(b"go")
                           + wire.pack_bytes(b"evil") + b"\x00"))
    data, _ = wait_closed(raw)
    raw.close()
    assert data == b""  # not even an answer to a request before authentication
    # One that answers the challenge with a proof made without the secret.
    raw = raw_connect(server)
    nonce = read_challenge(raw)
    raw.sendall(auth_frame(b"", nonce))
    msg_type, r = wire.read_frame(raw, wire.MAX_HANDSHAKE_FRAME, time.monotonic() + 5, 5)
    assert msg_type == wire.ERROR and r.u8() == wire.E_AUTH
    assert wait_closed(raw)[0] == b""
    raw.close()
    logs = refusals(caplog)
    assert len(logs) == 2, logs
    assert "expected an AUTH message first" in logs[0]
    assert "wrong HMAC proof" in logs[1]
    # Nothing the refused clients sent was acted on.
    _job_goes_on(store, c, t, result)


def test_client_with_a_wrong_secret_is_refused(store, caplog):
    server, secret = store
    c, t, result = _blocked_get(store)
    with pytest.raises(wire.AuthenticationError,
                       match="the server refused the connection: authentication failed"):
        client(store, secret=wire.generate_secret(), timeout=5)
    logs = refusals(caplog)
    assert len(logs) == 1 and "wrong HMAC proof" in logs[0] and "127.0.0.1" in logs[0], logs
    _job_goes_on(store, c, t, result)


def test_a_replayed_or_reflected_proof_is_refused(store, caplog):
    server, secret = store
    # Replay: a proof that was right for one connection's challenge is sent
    # on another connection (a sniffed AUTH frame).
    first = raw_connect(server)
    sniffed = auth_frame(secret, read_challenge(first))
    second = raw_connect(server)
    read_challenge(second)
    second.sendall(sniffed)
    data, _ = wait_closed(second)
    assert data[4] == wire.ERROR
    # Reflection: the server's own proof from a good connection, sent back as
    # a client's proof over the same nonces.
    good = raw_connect(server)
    nonce = read_challenge(good)
    good.sendall(auth_frame(secret, nonce, client_nonce=b"r" * 32))
    msg_type, r = wire.read_frame(good, 64, time.monotonic() + 5, 5)
    assert msg_type == wire.AUTH_OK
    server_proof = r.raw(32)
    reflected = raw_connect(server)
    nonce2 = read_challenge(reflected)
    reflected.sendall(auth_frame(secret, nonce2, client_nonce=b"r" * 32, mac=server_proof))
    data, _ = wait_closed(reflected)
    assert data[4] == wire.ERROR
    # A proof for another context (e.g. a rank-to-rank connection).
    other = raw_connect(server)
    nonce3 = read_challenge(other)
    other.sendall(auth_frame(secret, nonce3, context=b"peer"))
    data, _ = wait_closed(other)
    assert data[4] == wire.ERROR
    logs = refusals(caplog)
    assert len(logs) == 3 and all("wrong HMAC proof" in m for m in logs), logs
    for s in (first, second, good, reflected, other):
        s.close()
    with client(store) as c:
        c.ping()


def test_client_refuses_a_server_without_the_secret():
    """Mutual: a fake server that cannot prove the secret is not trusted."""
    listener = socket.create_server((HOST, 0))
    port = listener.getsockname()[1]

    def fake():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(wire.frame(wire.CHALLENGE, wire.MAGIC + bytes([1]) + os.urandom(32)))
            wire.read_frame(conn, 256, time.monotonic() + 5, 5)
            conn.sendall(wire.frame(wire.AUTH_OK, os.urandom(32)))
            time.sleep(0.2)
    t = threading.Thread(target=fake)
    t.start()
    try:
        with pytest.raises(wire.AuthenticationError, match="does not hold this job's secret"):
            RendezvousClient(HOST, port, wire.generate_secret(), timeout=5)
    finally:
        t.join(10)
        listener.close()


@pytest.mark.parametrize("garbage", ["random", "http", "oversized", "zero_length"])
def test_garbage_is_closed_with_a_logged_reason(store, caplog, garbage):
    server, secret = store
    payload = {"random": os.urandom(512), "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
               "oversized": b"\xff\xff\xff\xff" + b"x" * 100,
               "zero_length": b"\x00\x00\x00\x00"}[garbage]
    s = raw_connect(server)
    read_challenge(s)
    s.sendall(payload)
    _, took = wait_closed(s)
    s.close()
    assert took < 5
    logs = refusals(caplog)
    assert len(logs) == 1 and "refused connection from 127.0.0.1" in logs[0], logs
    if garbage == "oversized":
        assert "exceeds the maximum of 256" in logs[0]
    with client(store) as c:
        c.ping()


def test_garbage_after_authentication_is_closed_too(store, caplog):
    server, secret = store
    s = authenticated_raw(server, secret)
    s.sendall(struct.pack(">I", wire.MAX_FRAME + 1))
    data, _ = wait_closed(s)
    s.close()
    assert data[4] == wire.ERROR and data[5] == wire.E_PROTOCOL
    s = authenticated_raw(server, secret)
    s.sendall(wire.frame(0x7E, b"??"))
    data, _ = wait_closed(s)
    s.close()
    assert b"unknown message type 0x7e" in data
    logs = refusals(caplog)
    assert len(logs) == 2 and "exceeds the maximum" in logs[0], logs
    with client(store) as c:
        c.ping()


def test_half_sent_frames_do_not_hold_the_server(store, caplog):
    """Slowloris: a frame that never completes is dropped after the read
    timeout (2 s here), before and after authentication."""
    server, secret = store
    pre = raw_connect(server)
    read_challenge(pre)
    pre.sendall(b"\x00\x00\x00\x50" + b"x" * 10)
    post = authenticated_raw(server, secret)
    post.sendall(b"\x00\x00\x01\x00\x10")
    silent = raw_connect(server)  # never sends anything
    for s in (pre, post, silent):
        _, took = wait_closed(s, timeout=10)
        assert took < 8
        s.close()
    assert len(refusals(caplog)) == 3
    # A frame cut short by the peer closing is logged too.
    cut = authenticated_raw(server, secret)
    cut.sendall(wire.frame(wire.PING)[:3])
    cut.close()
    deadline = time.monotonic() + 5
    while len(refusals(caplog)) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "truncated frame" in refusals(caplog)[-1]
    with client(store) as c:
        c.ping()


def test_stop_fails_blocked_requests_and_ends_every_thread():
    with running_store() as (server, secret):
        c = RendezvousClient(*server.address, secret)
        errors = []

        def blocked():
            try:
                c.get("s", "never", timeout=60)
            except wire.WireError as e:
                errors.append(e)
        t = threading.Thread(target=blocked)
        t.start()
        idle = raw_connect(server)  # mid-handshake connection
        time.sleep(0.2)
        start = time.monotonic()
        server.stop()
        t.join(10)
        assert time.monotonic() - start < 5
        assert len(errors) == 1 and errors[0].cause in ("SHUTTING_DOWN", "PEER_CLOSED")
        assert server.connection_count() == 0
        idle.close()
        c.close()
        server.stop()  # idempotent
    with pytest.raises(OSError):
        RendezvousClient(*server.address, secret, timeout=2)


def test_start_server_takes_the_secret_from_the_environment(monkeypatch):
    secret = wire.generate_secret()
    monkeypatch.setenv("TFRING_SECRET", wire.encode_secret(secret))
    with rendezvous.start_server(HOST, 0) as server:
        assert server.address[0] == HOST
        with RendezvousClient(*server.address) as c:
            c.ping()
    monkeypatch.delenv("TFRING_SECRET")
    with pytest.raises(ValueError, match="TFRING_SECRET is not set"):
        rendezvous.start_server(HOST, 0)
    monkeypatch.setenv("TFRING_SECRET", "not hex")
    with pytest.raises(ValueError, match="TFRING_SECRET must be a hex string"):
        rendezvous.start_server(HOST, 0)
    monkeypatch.setenv("TFRING_SECRET", "abcd")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        rendezvous.start_server(HOST, 0)


def test_connections_beyond_the_limit_are_refused(caplog):
    with running_store(max_connections=2) as (server, secret):
        a, b = RendezvousClient(*server.address, secret), RendezvousClient(*server.address, secret)
        extra = raw_connect(server)
        data, _ = wait_closed(extra)
        assert data == b""
        assert any("already 2 connections" in m for m in refusals(caplog))
        a.ping()
        b.ping()
        a.close()
        b.close()
        extra.close()


def test_a_client_that_leaves_during_a_wait_frees_its_thread(store):
    server, secret = store
    s = authenticated_raw(server, secret)
    s.sendall(wire.frame(wire.GET, wire.pack_bytes(b"s") + wire.pack_bytes(b"never")
                         + struct.pack(">I", 3600 * 1000)))
    time.sleep(0.2)
    assert server.connection_count() == 1
    s.close()
    deadline = time.monotonic() + 10
    while server.connection_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.connection_count() == 0
