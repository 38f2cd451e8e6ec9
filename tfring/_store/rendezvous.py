"""The rendezvous store: a small authenticated key-value server that ranks use
to find each other (issue 9; docs/wire.md specifies the protocol).

tfringrun will serve it; when something else starts the ranks (Ray, Spark,
Kubernetes), anyone can start one with :func:`start_server` and point the
ranks at it. Keys live in *scopes* (e.g. ``"<job id>/<round>"``) so that a
re-rendezvous in elastic mode starts from a clean slate.

Example::

    secret = wire.generate_secret()
    server = start_server("127.0.0.1", 0, secret)
    with RendezvousClient(*server.address, secret) as c:
        c.set("job/0", "x", b"1")
        assert c.get("job/0", "x", timeout=5) == b"1"
    server.stop()
"""
import logging
import select
import selectors
import socket
import struct
import threading
import time

from tfring._store import wire
from tfring._store.wire import pack_bytes

LOG = logging.getLogger("tfring.rendezvous")

CONTEXT = b"rendezvous"
MAX_SCOPE = 256
MAX_KEY = 1024
MAX_WAIT_KEYS = 65536
MAX_TIMEOUT_MS = 24 * 3600 * 1000


class RendezvousServer:
    """Serves the store on one thread per connection (gets block), plus an
    accept thread. Use :func:`start_server` to create and start one."""

    def __init__(self, host, port, secret, handshake_timeout=10.0, frame_timeout=10.0,
                 max_connections=1024, max_store_bytes=256 << 20):
        if len(secret) < wire.MIN_SECRET_BYTES:
            raise ValueError(f"the secret must hold at least {wire.MIN_SECRET_BYTES} bytes")
        self._secret = bytes(secret)
        self._handshake_timeout = handshake_timeout
        self._frame_timeout = frame_timeout
        self._max_connections = max_connections
        self._max_store_bytes = max_store_bytes
        self._store = {}            # scope -> {key: value}
        # Deleted scopes stay closed: a rank still starting in one (a round
        # that a newer one replaced) fails at once instead of waiting out
        # its start-up timeout for peers that will never come.
        self._closed = set()
        self._store_bytes = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._conns = {}            # socket -> thread
        self._conns_lock = threading.Lock()
        self._local = threading.local()  # .sock: the connection this thread serves
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, sockaddr = infos[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(sockaddr)
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.address = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name="tfring-rendezvous-accept")

    def start(self):
        self._accept_thread.start()
        return self

    # --- lifecycle -----------------------------------------------------------

    def stop(self, timeout=10.0):
        """Stops accepting, fails pending waits with SHUTTING_DOWN, closes every
        connection and joins every thread. Idempotent."""
        with self._cond:
            if self._stopping:
                already = True
            else:
                already = False
                self._stopping = True
            self._cond.notify_all()
        if not already:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        if self._accept_thread.is_alive():
            self._accept_thread.join(timeout)
        with self._conns_lock:
            conns = list(self._conns.items())
        for sock, _ in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for _, thread in conns:
            thread.join(max(0.0, deadline - time.monotonic()))
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def connection_count(self):
        with self._conns_lock:
            return len(self._conns)

    # --- accepting -----------------------------------------------------------

    def _accept_loop(self):
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r or self._stopping:
                        return
                    try:
                        sock, peer = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as e:
                        LOG.warning("rendezvous: accept failed: %s", e)
                        continue
                    self._start_connection(sock, peer)
        finally:
            sel.close()

    def _start_connection(self, sock, peer):
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._conns_lock:
            if len(self._conns) >= self._max_connections:
                LOG.warning("rendezvous: refused connection from %s: already %d connections",
                            _peer(peer), len(self._conns))
                sock.close()
                return
            thread = threading.Thread(target=self._serve, args=(sock, peer), daemon=True,
                                      name=f"tfring-rendezvous-{_peer(peer)}")
            self._conns[sock] = thread
        thread.start()

    def _serve(self, sock, peer):
        self._local.sock = sock
        try:
            try:
                wire.server_handshake(sock, self._secret, CONTEXT, self._handshake_timeout)
            except wire.WireError as e:
                if not self._stopping:
                    LOG.warning("rendezvous: refused connection from %s: %s (%s)",
                                _peer(peer), e, e.cause)
                    if isinstance(e, wire.AuthenticationError):
                        try:
                            wire.send_all(sock, wire.refusal_frame(), 1.0)
                        except wire.WireError:
                            pass
                return
            while not self._stopping:
                try:
                    msg_type, r = wire.read_frame(sock, wire.MAX_FRAME, None,
                                                  self._frame_timeout)
                except wire.PeerClosedError as e:
                    if e.mid_frame and not self._stopping:
                        LOG.warning("rendezvous: closed connection from %s: truncated frame: "
                                    "%s", _peer(peer), e)
                    return
                except wire.WireError as e:
                    if not self._stopping:
                        LOG.warning("rendezvous: closed connection from %s: %s (%s)",
                                    _peer(peer), e, e.cause)
                        self._reply_error(sock, e)
                    return
                try:
                    reply = self._handle(msg_type, r)
                except wire.PeerClosedError:
                    return
                except wire.ProtocolError as e:
                    LOG.warning("rendezvous: closed connection from %s: %s (%s)",
                                _peer(peer), e, e.cause)
                    self._reply_error(sock, e)
                    return
                except wire.WireError as e:
                    # A well-formed request that cannot be served (timeout, bad
                    # argument): the client is told, the connection stays.
                    reply = _error_frame(e)
                except Exception as e:  # noqa: BLE001 - no request may end a thread unlogged
                    LOG.warning("rendezvous: closed connection from %s: bad request: %r",
                                _peer(peer), e)
                    self._reply_error(sock, wire.ProtocolError(f"bad request: {e}"))
                    return
                try:
                    wire.send_all(sock, reply, self._frame_timeout)
                except wire.WireError:
                    return
        finally:
            with self._conns_lock:
                self._conns.pop(sock, None)
            sock.close()

    def _reply_error(self, sock, err):
        try:
            wire.send_all(sock, _error_frame(err), 1.0)
        except wire.WireError:
            pass

    # --- requests ------------------------------------------------------------

    def _handle(self, msg_type, r):
        if msg_type == wire.SET:
            scope, key, value, flags = _scope(r), _key(r), r.bytes(), r.u8()
            r.end()
            self._set(scope, key, value, flags & wire.SET_EXCLUSIVE)
            return wire.frame(wire.OK)
        if msg_type == wire.GET:
            scope, key, timeout = _scope(r), _key(r), _timeout(r)
            r.end()
            return wire.frame(wire.VALUE, pack_bytes(self._get(scope, key, timeout)))
        if msg_type == wire.ADD:
            scope, key, delta = _scope(r), _key(r), r.i64()
            r.end()
            return wire.frame(wire.INT, struct.pack(">q", self._add(scope, key, delta)))
        if msg_type == wire.WAIT_KEYS:
            scope, n = _scope(r), r.u32()
            if n > MAX_WAIT_KEYS:
                raise wire.ProtocolError(f"WAIT_KEYS for {n} keys exceeds {MAX_WAIT_KEYS}")
            keys = [_key(r) for _ in range(n)]
            timeout = _timeout(r)
            r.end()
            self._wait_keys(scope, keys, timeout)
            return wire.frame(wire.OK)
        if msg_type == wire.WAIT_PREFIX:
            scope, prefix, n, timeout = _scope(r), _key(r), r.u32(), _timeout(r)
            r.end()
            entries = self._wait_prefix(scope, prefix, n, timeout)
            body = struct.pack(">I", len(entries)) + b"".join(
                pack_bytes(k.encode()) + pack_bytes(v) for k, v in entries)
            return wire.frame(wire.ENTRIES, body)
        if msg_type == wire.DELETE_SCOPE:
            scope = _scope(r)
            r.end()
            with self._cond:
                dropped = self._store.pop(scope, {})
                self._store_bytes -= sum(len(k) + len(v) for k, v in dropped.items())
                self._closed.add(scope)
                self._cond.notify_all()  # waits in it end now
            return wire.frame(wire.OK)
        if msg_type == wire.PING:
            r.end()
            return wire.frame(wire.OK)
        raise wire.ProtocolError(f"unknown message type 0x{msg_type:02x}")

    def _check_running(self, scope):
        if self._stopping:
            raise wire.ShuttingDownError("the rendezvous server is shutting down")
        if scope in self._closed:
            raise wire.ShuttingDownError(f"scope '{scope}' was deleted")

    def _set(self, scope, key, value, exclusive):
        with self._cond:
            self._check_running(scope)
            entries = self._store.setdefault(scope, {})
            old = entries.get(key)
            if old is not None and exclusive:
                raise wire.InvalidRequestError(
                    f"key '{key}' in scope '{scope}' is already set")
            grow = len(value) - (len(old) if old is not None else -len(key))
            if self._store_bytes + grow > self._max_store_bytes:
                raise wire.InvalidRequestError(
                    f"the store is full ({self._max_store_bytes} bytes); refused key '{key}'")
            entries[key] = value
            self._store_bytes += grow
            self._cond.notify_all()

    def _wait(self, scope, ready, timeout_ms, what):
        deadline = time.monotonic() + timeout_ms / 1000.0
        sock = self._local.sock
        with self._cond:
            while True:
                self._check_running(scope)
                result = ready()
                if result is not None:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    raise wire.WireTimeoutError(
                        f"timed out after {timeout_ms / 1000.0:g} s waiting for {what()}")
                # Wake now and then to notice a client that went away, so a
                # long wait of a dead client does not hold its thread.
                self._cond.wait(min(left, _PEER_CHECK_SECONDS))
                if _peer_gone(sock):
                    raise wire.PeerClosedError("the client closed the connection while waiting")

    def _get(self, scope, key, timeout_ms):
        return self._wait(scope, lambda: self._store.get(scope, {}).get(key), timeout_ms,
                          lambda: f"key '{key}' in scope '{scope}'")

    def _add(self, scope, key, delta):
        with self._cond:
            self._check_running(scope)
            entries = self._store.setdefault(scope, {})
            old = entries.get(key, b"0")
            try:
                value = int(old.decode("ascii")) + delta
            except (UnicodeDecodeError, ValueError):
                raise wire.InvalidRequestError(
                    f"key '{key}' in scope '{scope}' does not hold an integer") from None
            if not -(1 << 63) <= value < (1 << 63):
                raise wire.InvalidRequestError(f"counter '{key}' would overflow 64 bits")
            self._set_locked(entries, key, str(value).encode("ascii"))
            self._cond.notify_all()
            return value

    def _set_locked(self, entries, key, value):
        old = entries.get(key)
        self._store_bytes += len(value) - (len(old) if old is not None else -len(key))
        entries[key] = value

    def _wait_keys(self, scope, keys, timeout_ms):
        def missing():
            have = self._store.get(scope, {})
            return [k for k in keys if k not in have]
        self._wait(scope, lambda: True if not missing() else None, timeout_ms,
                   lambda: f"keys {missing()} in scope '{scope}'")

    def _wait_prefix(self, scope, prefix, n, timeout_ms):
        def matching():
            return sorted((k, v) for k, v in self._store.get(scope, {}).items()
                          if k.startswith(prefix))

        def ready():
            entries = matching()
            return entries if len(entries) >= n else None
        return self._wait(scope, ready, timeout_ms,
                          lambda: f"{n} keys with prefix '{prefix}' in scope '{scope}' "
                                  f"(have {len(matching())})")


_PEER_CHECK_SECONDS = 1.0


def _peer_gone(sock):
    """True if the client closed its side (EOF or reset) without sending
    anything more; pipelined bytes are left for the reader."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _peer(peer):
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


def _error_frame(err):
    code = {"TIMEOUT": wire.E_TIMEOUT, "PROTOCOL_ERROR": wire.E_PROTOCOL,
            "AUTH_FAILED": wire.E_AUTH, "INVALID_ARGUMENT": wire.E_INVALID,
            "SHUTTING_DOWN": wire.E_SHUTTING_DOWN}.get(err.cause, wire.E_PROTOCOL)
    return wire.frame(wire.ERROR, bytes([code]) + pack_bytes(str(err).encode()[:4096]))


def _text(r, limit, what):
    raw = r.bytes(limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise wire.ProtocolError(f"{what} is not UTF-8") from None


def _scope(r):
    return _text(r, MAX_SCOPE, "scope")


def _key(r):
    return _text(r, MAX_KEY, "key")


def _timeout(r):
    ms = r.u32()
    if ms > MAX_TIMEOUT_MS:
        raise wire.ProtocolError(f"timeout of {ms} ms exceeds {MAX_TIMEOUT_MS} ms")
    return ms


def start_server(host="127.0.0.1", port=0, secret=None, **kwargs):
    """Starts a rendezvous store on `host`:`port` and returns it running.

    Args:
      host: the interface to bind: loopback for a single-host job, the
        address of ``--network-interfaces`` otherwise.
      port: 0 picks a free port (read it from ``.address``).
      secret: the job's secret (bytes); None reads ``TFRING_SECRET``.
      **kwargs: handshake_timeout, frame_timeout (seconds), max_connections,
        max_store_bytes.

    Returns:
      A RendezvousServer with ``.address`` (host, port) and ``.stop()``.

    Raises:
      ValueError: no usable secret. OSError: the address cannot be bound.

    Example::

        server = start_server("127.0.0.1", 0, wire.generate_secret())
        ...
        server.stop()
    """
    if secret is None:
        secret = wire.load_secret()
    return RendezvousServer(host, port, secret, **kwargs).start()


class RendezvousClient:
    """A blocking client of the store; one request at a time per client.

    Args:
      host, port: the store's address.
      secret: the job's secret (bytes); None reads ``TFRING_SECRET``.
      timeout: seconds for connecting, the handshake and each reply (blocking
        requests add their own wait to it).

    Raises:
      AuthenticationError: the store refused the secret (or lacks it).
      PeerClosedError / WireTimeoutError: the store is not reachable.
    """

    def __init__(self, host, port, secret=None, timeout=10.0):
        if secret is None:
            secret = wire.load_secret()
        self._timeout = timeout
        self._sock = socket.create_connection((host, port), timeout=timeout)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire.client_handshake(self._sock, bytes(secret), CONTEXT, timeout)
        except BaseException:
            self._sock.close()
            raise

    def close(self):
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, msg_type, body, wait=0.0):
        try:
            wire.send_all(self._sock, wire.frame(msg_type, body), self._timeout)
            deadline = time.monotonic() + wait + self._timeout
            reply, r = wire.read_frame(self._sock, wire.MAX_FRAME, deadline, self._timeout)
        except wire.WireError:
            # A reply that did not arrive whole leaves the stream out of
            # step: this connection cannot carry another request.
            self._sock.close()
            raise
        if reply == wire.ERROR:
            code = r.u8()
            raise wire.ERROR_TYPES.get(code, wire.WireError)(
                r.bytes().decode("utf-8", "replace"))
        return reply, r

    def _expect(self, want, got):
        if want != got:
            raise wire.ProtocolError(f"expected reply type 0x{want:02x}, got 0x{got:02x}")

    def set(self, scope, key, value, exclusive=False):
        """Stores `value` (bytes) under `key`; with `exclusive`, fails with
        InvalidRequestError if the key exists."""
        reply, r = self._call(wire.SET, _s(scope) + _s(key) + pack_bytes(bytes(value))
                              + bytes([wire.SET_EXCLUSIVE if exclusive else 0]))
        self._expect(wire.OK, reply)

    def get(self, scope, key, timeout=30.0):
        """The value of `key`, waiting up to `timeout` seconds for it to be
        set; WireTimeoutError naming the key otherwise."""
        reply, r = self._call(wire.GET, _s(scope) + _s(key) + _ms(timeout), timeout)
        self._expect(wire.VALUE, reply)
        return r.bytes()

    def add(self, scope, key, delta=1):
        """Atomically adds `delta` to the integer counter `key` (0 if unset)
        and returns the new value."""
        reply, r = self._call(wire.ADD, _s(scope) + _s(key) + struct.pack(">q", delta))
        self._expect(wire.INT, reply)
        return r.i64()

    def wait(self, scope, keys, timeout=30.0):
        """Returns once every key in `keys` is set; WireTimeoutError naming the
        missing keys otherwise."""
        keys = list(keys)
        body = _s(scope) + struct.pack(">I", len(keys)) + b"".join(_s(k) for k in keys)
        reply, _ = self._call(wire.WAIT_KEYS, body + _ms(timeout), timeout)
        self._expect(wire.OK, reply)

    def wait_prefix(self, scope, prefix, count, timeout=30.0):
        """Waits until at least `count` keys start with `prefix`; returns them
        all as a sorted list of (key, value)."""
        reply, r = self._call(wire.WAIT_PREFIX, _s(scope) + _s(prefix)
                              + struct.pack(">I", count) + _ms(timeout), timeout)
        self._expect(wire.ENTRIES, reply)
        n = r.u32()
        return [(r.bytes().decode(), r.bytes()) for _ in range(n)]

    def delete_scope(self, scope):
        """Drops every key of `scope` and closes it: waits in it end, and
        later requests in it fail, with :class:`wire.ShuttingDownError`."""
        reply, _ = self._call(wire.DELETE_SCOPE, _s(scope))
        self._expect(wire.OK, reply)

    def ping(self):
        reply, _ = self._call(wire.PING, b"")
        self._expect(wire.OK, reply)


def _s(text):
    return pack_bytes(text.encode("utf-8"))


def _ms(seconds):
    return struct.pack(">I", max(0, min(int(seconds * 1000), MAX_TIMEOUT_MS)))
