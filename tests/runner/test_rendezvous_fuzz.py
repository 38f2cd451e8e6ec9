"""A seeded fuzz run against the rendezvous store on real sockets: random
bytes, mutated handshakes, truncated frames, oversized length prefixes and
mutated requests after authentication. The server must not crash, hang or
act on an unauthenticated byte, and must keep serving correct clients."""
import logging
import random
import socket
import struct
import threading
import time

from tfring.runner import wire
from tfring.runner.rendezvous import RendezvousClient
from wire_support import (auth_frame, authenticated_raw, raw_connect, read_challenge,
                          running_store)

SEED = 20261122


def valid_requests(rng):
    pb = wire.pack_bytes
    scope, key = b"fz", b"k%d" % rng.randrange(4)
    return [
        wire.frame(wire.SET, pb(scope) + pb(key) + pb(b"v" * rng.randrange(50)) + b"\x00"),
        wire.frame(wire.GET, pb(scope) + pb(key) + struct.pack(">I", 5)),
        wire.frame(wire.ADD, pb(scope) + pb(b"n") + struct.pack(">q", rng.randrange(-9, 9))),
        wire.frame(wire.WAIT_KEYS, pb(scope) + struct.pack(">I", 1) + pb(key)
                   + struct.pack(">I", 5)),
        wire.frame(wire.WAIT_PREFIX, pb(scope) + pb(b"k") + struct.pack(">I", 1)
                   + struct.pack(">I", 5)),
        wire.frame(wire.PING),
    ]


def mutate(data, rng):
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(5)
        if op == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op == 1 and data:
            del data[rng.randrange(len(data)):]  # truncation
        elif op == 2:
            data[rng.randrange(len(data) + 1):0] = bytes(rng.randrange(256) for _ in range(4))
        elif op == 3 and len(data) >= 4:
            at = rng.randrange(len(data) - 3)
            data[at:at + 4] = struct.pack(">I", rng.choice([0, 257, wire.MAX_FRAME + 1,
                                                           0xFFFFFFFF]))
        else:
            data = bytearray(rng.randrange(256) for _ in range(rng.randrange(64)))
    return bytes(data)


def hit(server, secret, rng):
    """One hostile connection; returns whether it sent bytes pre-auth only."""
    kind = rng.randrange(4)
    s = authenticated_raw(server, secret) if kind == 3 else raw_connect(server, timeout=5)
    try:
        if kind == 0:
            read_challenge(s)
            s.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
        elif kind == 1:
            nonce = read_challenge(s)
            good = auth_frame(secret, nonce)
            s.sendall(mutate(good, rng))  # a mutated good proof
        elif kind == 2:
            s.sendall(mutate(b"\x00\x00\x00\x10" + bytes(16), rng))  # before the challenge is read
        else:
            for _ in range(rng.randrange(1, 5)):
                s.sendall(mutate(rng.choice(valid_requests(rng)), rng))
        s.shutdown(socket.SHUT_WR)
        s.settimeout(10)
        while s.recv(65536):
            pass
    except OSError:
        pass  # the server may reset a connection it refused
    finally:
        s.close()


def test_random_and_mutated_bytes_on_real_sockets(caplog):
    caplog.set_level(logging.WARNING, logger="tfring.rendezvous")
    rng = random.Random(SEED)
    with running_store(handshake_timeout=3.0, frame_timeout=3.0) as (server, secret):
        with RendezvousClient(*server.address, secret) as watcher:
            # The store's own counter must move only by the requests that
            # passed authentication; an unauthenticated SET of it never lands.
            watcher.set("job", "sentinel", b"intact")
            start = time.monotonic()
            for round_ in range(8):
                threads = [threading.Thread(target=hit, args=(server, secret,
                                                               random.Random(rng.random())))
                           for _ in range(25)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(30)
                assert not any(t.is_alive() for t in threads), "a hostile connection hung"
                watcher.ping()
            assert time.monotonic() - start < 120
            assert watcher.get("job", "sentinel", timeout=1) == b"intact"
            deadline = time.monotonic() + 10
            while server.connection_count() > 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.connection_count() == 1  # only the watcher
    reasons = [r.getMessage() for r in caplog.records if r.name == "tfring.rendezvous"]
    assert reasons, "refusals must be logged"
    assert all("refused connection" in m or "closed connection" in m for m in reasons)


def test_pure_parser_raises_only_wire_errors():
    rng = random.Random(SEED)
    seeds = [b"\x00" * 40, wire.MAGIC + b"\x01" + bytes(32)] + [f[5:] for f in valid_requests(rng)]
    for _ in range(5000):
        body = mutate(rng.choice(seeds), rng)
        r = wire.Reader(body)
        try:
            for _ in range(6):
                r.bytes(rng.choice([16, 1024, wire.MAX_FRAME]))
                r.i64()
        except wire.ProtocolError:
            pass
