"""Helpers for the TCP wire tests: a store that is stopped and leaves no
thread behind, and raw sockets that speak (or break) the protocol by hand."""
import contextlib
import logging
import socket
import threading
import time

from tfring.runner import rendezvous, wire

HOST = "127.0.0.1"


def rendezvous_threads():
    return [t for t in threading.enumerate() if t.name.startswith("tfring-rendezvous")]


@contextlib.contextmanager
def running_store(**kwargs):
    """Yields (server, secret); stops the server and checks that none of its
    threads survived."""
    secret = wire.generate_secret()
    server = rendezvous.start_server(HOST, 0, secret, **kwargs)
    try:
        yield server, secret
    finally:
        server.stop()
        deadline = time.monotonic() + 5
        while rendezvous_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not rendezvous_threads(), f"threads left: {rendezvous_threads()}"


def raw_connect(server, timeout=10.0):
    s = socket.create_connection(tuple(server.address), timeout=timeout)
    s.settimeout(timeout)
    return s


def read_challenge(sock):
    msg_type, r = wire.read_frame(sock, wire.MAX_HANDSHAKE_FRAME, time.monotonic() + 10, 10)
    assert msg_type == wire.CHALLENGE
    assert r.raw(4) == wire.MAGIC and r.u8() == wire.VERSION
    return r.raw(wire.NONCE_BYTES)


def auth_frame(secret, server_nonce, client_nonce=b"c" * 32, context=b"rendezvous", mac=None):
    if mac is None:
        mac = wire.client_mac(secret, server_nonce, client_nonce, context)
    return wire.frame(wire.AUTH, client_nonce + wire.pack_bytes(context) + mac)


def authenticated_raw(server, secret):
    """A raw socket past the handshake, for sending hand-made frames."""
    s = raw_connect(server)
    nonce = read_challenge(s)
    s.sendall(auth_frame(secret, nonce))
    msg_type, _ = wire.read_frame(s, wire.MAX_HANDSHAKE_FRAME, time.monotonic() + 10, 10)
    assert msg_type == wire.AUTH_OK
    return s


def wait_closed(sock, timeout=10.0):
    """Reads until the server closes; returns (all bytes read, seconds it took).
    Fails if the server keeps the connection open past `timeout`."""
    start = time.monotonic()
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        except socket.timeout:
            raise AssertionError(f"the server kept the connection open for {timeout} s")
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - start


def refusals(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "tfring.rendezvous" and r.levelno >= logging.WARNING]
