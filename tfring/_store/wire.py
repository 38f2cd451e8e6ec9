"""The framing and authentication of tfring's TCP wire (rendezvous store and,
later, rank-to-rank connections). docs/wire.md is the specification; the C++
side is tf_ops/common/transport/tcp/. Nothing here imports TensorFlow.

A frame is a 4-byte big-endian payload length followed by the payload; the
payload's first byte is the message type. Lengths are checked against a hard
maximum *before* anything is allocated, so arbitrary bytes cannot make a
reader over-allocate.
"""
import binascii
import hashlib
import hmac
import os
import socket
import struct
import time

MAGIC = b"TFRG"
VERSION = 1
NONCE_BYTES = 32
MAC_BYTES = 32
MAX_FRAME = 1 << 20          # payload bytes of any frame after authentication
MAX_HANDSHAKE_FRAME = 256    # payload bytes of a frame before authentication
MAX_CONTEXT = 64
MIN_SECRET_BYTES = 16
SECRET_ENV = "TFRING_SECRET"

# Labels that make a client's proof and a server's proof differ even over the
# same nonces: a proof can never be reflected back in the other direction.
_CLIENT_LABEL = b"tfring-wire-v1 client\0"
_SERVER_LABEL = b"tfring-wire-v1 server\0"

# Message types.
CHALLENGE = 0x01
AUTH = 0x02
AUTH_OK = 0x03
SET = 0x10
GET = 0x11
ADD = 0x12
WAIT_KEYS = 0x13
WAIT_PREFIX = 0x14
DELETE_SCOPE = 0x15
PING = 0x16
OK = 0x20
VALUE = 0x21
INT = 0x22
ENTRIES = 0x23
ERROR = 0x2F

# Error codes carried by ERROR frames (and the `cause` of WireError).
E_TIMEOUT = 1
E_PROTOCOL = 2
E_AUTH = 3
E_INVALID = 4
E_SHUTTING_DOWN = 5
ERROR_NAMES = {E_TIMEOUT: "TIMEOUT", E_PROTOCOL: "PROTOCOL_ERROR", E_AUTH: "AUTH_FAILED",
               E_INVALID: "INVALID_ARGUMENT", E_SHUTTING_DOWN: "SHUTTING_DOWN"}

SET_EXCLUSIVE = 1


class WireError(RuntimeError):
    """A failure on the wire; `cause` is one of AUTH_FAILED, PROTOCOL_ERROR,
    TIMEOUT, PEER_CLOSED, INVALID_ARGUMENT, SHUTTING_DOWN, IO_ERROR."""
    cause = "IO_ERROR"


class AuthenticationError(WireError):
    cause = "AUTH_FAILED"


class ProtocolError(WireError):
    cause = "PROTOCOL_ERROR"


class WireTimeoutError(WireError, TimeoutError):
    cause = "TIMEOUT"


class PeerClosedError(WireError):
    cause = "PEER_CLOSED"
    mid_frame = False


class InvalidRequestError(WireError, ValueError):
    cause = "INVALID_ARGUMENT"


class ShuttingDownError(WireError):
    cause = "SHUTTING_DOWN"


ERROR_TYPES = {E_TIMEOUT: WireTimeoutError, E_PROTOCOL: ProtocolError,
               E_AUTH: AuthenticationError, E_INVALID: InvalidRequestError,
               E_SHUTTING_DOWN: ShuttingDownError}


# --- secrets ----------------------------------------------------------------

def generate_secret():
    """32 fresh random bytes for one job."""
    return os.urandom(32)


def encode_secret(secret):
    """The form a secret travels in through the environment: lowercase hex."""
    return binascii.hexlify(secret).decode("ascii")


def decode_secret(text, source=SECRET_ENV):
    """Decodes a hex secret; raises ValueError naming `source` if it is not
    hex or shorter than 16 bytes."""
    try:
        secret = binascii.unhexlify(text.strip())
    except (binascii.Error, ValueError):
        raise ValueError(f"{source} must be a hex string (e.g. from "
                         f"tfring.runner.wire.encode_secret), got {len(text)} characters "
                         f"that are not hex") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{source} must hold at least {MIN_SECRET_BYTES} bytes "
                         f"({2 * MIN_SECRET_BYTES} hex digits), got {len(secret)}")
    return secret


def load_secret(env=None):
    """The job's secret from ``TFRING_SECRET`` (hex). It travels in the
    environment, never on a command line, where ``ps`` would show it.

    Raises:
      ValueError: the variable is unset, not hex, or too short.
    """
    env = os.environ if env is None else env
    text = env.get(SECRET_ENV)
    if not text:
        raise ValueError(f"{SECRET_ENV} is not set: the TCP transport needs the job's "
                         f"secret (hex) in the environment")
    return decode_secret(text)


def client_mac(secret, server_nonce, client_nonce, context):
    return hmac.new(secret, _CLIENT_LABEL + server_nonce + client_nonce + context,
                    hashlib.sha256).digest()


def server_mac(secret, server_nonce, client_nonce, context):
    return hmac.new(secret, _SERVER_LABEL + server_nonce + client_nonce + context,
                    hashlib.sha256).digest()


# --- encoding ---------------------------------------------------------------

def pack_bytes(b):
    return struct.pack(">I", len(b)) + b


def frame(msg_type, body=b""):
    payload = bytes([msg_type]) + body
    return struct.pack(">I", len(payload)) + payload


class Reader:
    """Reads typed fields from a payload; every read is bounds-checked and a
    short or malformed payload raises ProtocolError."""

    def __init__(self, payload):
        self._b = payload
        self._i = 0

    def _take(self, n):
        if n < 0 or self._i + n > len(self._b):
            raise ProtocolError(f"truncated message: wanted {n} bytes at offset {self._i} "
                                f"of a {len(self._b)}-byte payload")
        out = self._b[self._i:self._i + n]
        self._i += n
        return out

    def u8(self):
        return self._take(1)[0]

    def u32(self):
        return struct.unpack(">I", self._take(4))[0]

    def i64(self):
        return struct.unpack(">q", self._take(8))[0]

    def raw(self, n):
        return self._take(n)

    def bytes(self, limit=MAX_FRAME):
        n = self.u32()
        if n > limit:
            raise ProtocolError(f"field of {n} bytes exceeds its limit of {limit}")
        return self._take(n)

    def end(self):
        if self._i != len(self._b):
            raise ProtocolError(f"{len(self._b) - self._i} unexpected trailing bytes")


# --- socket I/O -------------------------------------------------------------

def _recv_exact(sock, n, deadline, what):
    chunks = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireTimeoutError(f"timed out reading {what}")
            sock.settimeout(left)
        else:
            sock.settimeout(None)
        try:
            chunk = sock.recv(min(n, 1 << 16))
        except socket.timeout:
            raise WireTimeoutError(f"timed out reading {what}") from None
        except OSError as e:
            raise PeerClosedError(f"connection lost while reading {what}: {e}") from None
        if not chunk:
            raise PeerClosedError(f"peer closed the connection while sending {what}")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(sock, max_payload=MAX_FRAME, idle_deadline=None, frame_timeout=None):
    """Reads one frame; returns (type, Reader over the body).

    Args:
      idle_deadline: monotonic time by which the frame must *start* (None: wait).
      frame_timeout: seconds the rest of the frame may take once it started
        (a half-sent frame cannot hold the reader forever).
    """
    first = _recv_exact(sock, 1, idle_deadline, "a frame header")
    deadline = None if frame_timeout is None else time.monotonic() + frame_timeout
    if idle_deadline is not None:
        deadline = idle_deadline if deadline is None else min(deadline, idle_deadline)
    try:
        header = first + _recv_exact(sock, 3, deadline, "a frame header")
        (length,) = struct.unpack(">I", header)
        if length == 0:
            raise ProtocolError("empty frame (length 0)")
        if length > max_payload:
            raise ProtocolError(f"frame of {length} bytes exceeds the maximum of {max_payload}")
        payload = _recv_exact(sock, length, deadline, f"a {length}-byte frame")
    except PeerClosedError as e:
        e.mid_frame = True  # a truncated frame, not a clean goodbye
        raise
    return payload[0], Reader(payload[1:])


def send_all(sock, data, timeout):
    sock.settimeout(timeout)
    try:
        sock.sendall(data)
    except socket.timeout:
        raise WireTimeoutError("timed out sending") from None
    except OSError as e:
        raise PeerClosedError(f"connection lost while sending: {e}") from None


# --- handshake --------------------------------------------------------------

def server_handshake(sock, secret, context, timeout):
    """Runs the server side of the challenge; returns normally only if the
    peer proved it holds `secret` for `context`. Raises WireError otherwise
    (AuthenticationError for a wrong proof); the caller logs it, then tells
    the peer with :func:`refusal_frame`, so that the log line exists before
    the peer can see the refusal."""
    deadline = time.monotonic() + timeout
    nonce = os.urandom(NONCE_BYTES)
    send_all(sock, frame(CHALLENGE, MAGIC + bytes([VERSION]) + nonce), timeout)
    msg_type, r = read_frame(sock, MAX_HANDSHAKE_FRAME, deadline, timeout)
    if msg_type != AUTH:
        raise ProtocolError(f"expected an AUTH message first, got type 0x{msg_type:02x}")
    client_nonce = r.raw(NONCE_BYTES)
    peer_context = r.bytes(MAX_CONTEXT)
    mac = r.raw(MAC_BYTES)
    r.end()
    expected = client_mac(secret, nonce, client_nonce, context)
    # The context is compared too, but the MAC decides: compare_digest is
    # constant-time, so timing reveals nothing about the expected proof.
    good_mac = hmac.compare_digest(mac, expected)
    if not good_mac or peer_context != context:
        reason = ("wrong context " + repr(peer_context.decode("utf-8", "replace"))
                  if good_mac else "wrong HMAC proof (no secret or a different secret)")
        raise AuthenticationError(reason)
    send_all(sock, frame(AUTH_OK, server_mac(secret, nonce, client_nonce, context)), timeout)


def refusal_frame():
    """What a peer that failed the challenge gets before the connection is
    closed: no detail about why."""
    return frame(ERROR, bytes([E_AUTH]) + pack_bytes(b"authentication failed"))


def client_handshake(sock, secret, context, timeout):
    """Runs the client side: answers the challenge and checks the server's
    own proof (so a client never talks to a server without the secret)."""
    deadline = time.monotonic() + timeout
    msg_type, r = read_frame(sock, MAX_HANDSHAKE_FRAME, deadline, timeout)
    if msg_type != CHALLENGE:
        raise ProtocolError(f"expected a CHALLENGE, got type 0x{msg_type:02x}")
    if r.raw(4) != MAGIC:
        raise ProtocolError("the peer is not a tfring endpoint (bad magic)")
    version = r.u8()
    if version != VERSION:
        raise ProtocolError(f"the peer speaks wire version {version}, this side {VERSION}")
    nonce = r.raw(NONCE_BYTES)
    r.end()
    client_nonce = os.urandom(NONCE_BYTES)
    send_all(sock, frame(AUTH, client_nonce + pack_bytes(context)
                         + client_mac(secret, nonce, client_nonce, context)), timeout)
    msg_type, r = read_frame(sock, MAX_HANDSHAKE_FRAME, deadline, timeout)
    if msg_type == ERROR:
        code = r.u8()
        raise ERROR_TYPES.get(code, WireError)(
            "the server refused the connection: " + r.bytes().decode("utf-8", "replace"))
    if msg_type != AUTH_OK:
        raise ProtocolError(f"expected AUTH_OK, got type 0x{msg_type:02x}")
    mac = r.raw(MAC_BYTES)
    r.end()
    if not hmac.compare_digest(mac, server_mac(secret, nonce, client_nonce, context)):
        raise AuthenticationError("the server's proof is wrong: it does not hold this "
                                  "job's secret")
