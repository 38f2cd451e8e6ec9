"""The launcher's end of the rank wrappers' status connections.

Every process tfringrun starts runs under :mod:`tfring.runner.rank_wrapper`,
which connects back here, says ``hello TOKEN ID PID HOST`` once its command
has started and ``exit ID CODE`` when it has ended, and obeys ``stop`` and
``release``. The fixed-size supervisor and the elastic driver both listen
for these connections; this module is the one place that accepts them,
checks the token and parses the lines, so that the two launchers differ
only in what they do with the news.
"""
import hmac
import secrets
import selectors
import socket

from tfring.runner import rank_wrapper as wire

# What :meth:`WrapperListener.poll` reports.
HELLO = "hello"    # (HELLO, link, pid, host): an authenticated wrapper's command started
EXIT = "exit"      # (EXIT, link, code): its command ended with `code`
LOST = "lost"      # (LOST, link): its connection ended before it reported an exit


class WrapperLink:
    """One wrapper's connection.

    Attributes:
        id: the rank (or elastic worker id) the wrapper said hello as; None
            until it has.
        exited: whether it has reported its command's end.
        released: whether it has been sent ``release``.
    """

    def __init__(self, sock):
        self.sock = sock
        self.buffer = b""
        self.id = None
        self.exited = False
        self.released = False

    def send(self, word):
        """Sends one command word. A wrapper that has gone is not an error:
        its end is noticed through :data:`LOST` or its process."""
        try:
            # Blocking for a moment, so that a full socket buffer delays the
            # word rather than dropping it.
            self.sock.settimeout(1.0)
            self.sock.sendall((word + "\n").encode())
        except OSError:
            pass
        finally:
            try:
                self.sock.setblocking(False)
            except OSError:
                pass

    def stop(self):
        self.send(wire.STOP)

    def release(self):
        if not self.released:
            self.released = True
            self.send(wire.RELEASE)


class WrapperListener:
    """Accepts wrapper connections and turns their lines into events.

    A connection whose first line is not a ``hello`` with this job's token
    and a known id is closed unread: nothing that listens here acts on a
    stranger's words.

    Args:
        bind_host: the address to listen on (port chosen by the system).
        known: a predicate on ids; a hello naming any other id is refused.

    Example::

        listener = WrapperListener("127.0.0.1", known=lambda rank: rank < 4)
        env[rank_wrapper.TOKEN_ENV] = listener.token
        for kind, link, *details in listener.poll(0.1):
            ...
        listener.close()
    """

    def __init__(self, bind_host, known):
        self.token = secrets.token_hex(16)
        self.known = known
        self.sock = socket.create_server((bind_host, 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.links = []  # every open connection, authenticated or not yet

    def authenticated(self):
        return [link for link in self.links if link.id is not None]

    def poll(self, timeout):
        """Waits up to `timeout` seconds for traffic; returns the events, in
        the order their lines arrived on each connection."""
        events = []
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data, events)
        return events

    def drop(self, link):
        """Closes one connection (a wrapper that ends sees it drop)."""
        try:
            self.selector.unregister(link.sock)
        except (KeyError, ValueError):
            pass
        link.sock.close()
        if link in self.links:
            self.links.remove(link)

    def close(self):
        for link in list(self.links):
            self.drop(link)
        self.selector.close()
        self.sock.close()

    def _accept(self):
        try:
            sock, _ = self.sock.accept()
        except OSError:
            return
        sock.setblocking(False)
        link = WrapperLink(sock)
        self.links.append(link)
        self.selector.register(sock, selectors.EVENT_READ, link)

    def _read(self, link, events):
        try:
            data = link.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.drop(link)
            if link.id is not None and not link.exited:
                events.append((LOST, link))
            return
        link.buffer += data
        *lines, link.buffer = link.buffer.split(b"\n")
        for line in lines:
            if not self._parse(link, line.decode(errors="replace").split(), events):
                return

    def _parse(self, link, words, events):
        """Handles one line; False once the connection has been closed."""
        if link.id is None:
            if (len(words) != 5 or words[0] != wire.HELLO
                    or not hmac.compare_digest(words[1].encode(), self.token.encode())
                    or not words[2].isdigit() or not self.known(int(words[2]))
                    or not words[3].isdigit()):
                self.drop(link)
                return False
            link.id = int(words[2])
            events.append((HELLO, link, int(words[3]), words[4]))
        elif len(words) == 3 and words[0] == wire.EXIT and words[1] == str(link.id):
            try:
                code = int(words[2])
            except ValueError:
                return True
            link.exited = True
            events.append((EXIT, link, code))
        return True
