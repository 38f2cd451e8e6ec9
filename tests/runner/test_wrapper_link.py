"""The launcher's listener for rank wrappers, over real sockets: who is let
in, what their lines become, and what reaches them."""
import socket
import time

import pytest

from tfring.runner import wrapper_link
from tfring.runner.wrapper_link import WrapperListener


@pytest.fixture
def listener():
    listener = WrapperListener("127.0.0.1", known=lambda rank: rank in (0, 1))
    yield listener
    listener.close()


def connect(listener):
    sock = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
    sock.settimeout(5)
    return sock


def events_until(listener, count, seconds=5.0):
    events, deadline = [], time.monotonic() + seconds
    while len(events) < count and time.monotonic() < deadline:
        events += listener.poll(0.05)
    return events


def closed_by_listener(listener, sock):
    """Polls the listener until it has dropped `sock`; True if it did."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        listener.poll(0.05)
        try:
            sock.setblocking(False)
            if sock.recv(1) == b"":
                return True
        except BlockingIOError:
            pass
        except ConnectionResetError:
            return True
    return False


@pytest.mark.parametrize("line", [
    "hello {wrong} 0 123 host",      # not the job's token
    "hello {token} 7 123 host",      # an id the job does not have
    "hello {token} 0 notapid host",  # a malformed pid
    "exit 0 0",                      # anything before a hello
    "\x00\xff garbage",
])
def test_a_stranger_is_dropped_and_reported_as_nothing(listener, line):
    sock = connect(listener)
    wrong = "0" * len(listener.token)
    sock.sendall((line.format(token=listener.token, wrong=wrong) + "\n").encode())
    assert closed_by_listener(listener, sock)
    assert listener.authenticated() == [] and listener.links == []
    sock.close()


def test_a_wrapper_says_hello_then_exit_and_gets_stop_and_release(listener):
    sock = connect(listener)
    # One line split over two sends, and two lines in one.
    sock.sendall(f"hello {listener.token} 1 ".encode())
    time.sleep(0.05)
    sock.sendall(b"4242 node-a\nexit 0 9\nexit 1 3\n")
    events = events_until(listener, 2)
    link = listener.authenticated()[0]
    # An exit that names another rank is not this wrapper's to report.
    assert [(kind, *details) for kind, _, *details in events] == [
        (wrapper_link.HELLO, 4242, "node-a"), (wrapper_link.EXIT, 3)]
    assert all(e[1] is link for e in events) and link.id == 1 and link.exited
    link.stop()
    link.release()
    link.release()  # said once only
    assert sock.recv(100) == b"stop\nrelease\n"
    sock.close()
    # The end of a connection that reported its exit is no news.
    assert events_until(listener, 1, seconds=0.5) == []
    assert listener.links == []


def test_a_connection_that_ends_before_its_exit_is_lost(listener):
    sock = connect(listener)
    sock.sendall(f"hello {listener.token} 0 77 node-b\n".encode())
    assert [e[0] for e in events_until(listener, 1)] == [wrapper_link.HELLO]
    sock.close()
    events = events_until(listener, 1)
    assert [(kind, link.id) for kind, link in events] == [(wrapper_link.LOST, 0)]


def test_sending_to_a_wrapper_that_has_gone_is_not_an_error(listener):
    sock = connect(listener)
    sock.sendall(f"hello {listener.token} 0 77 node-b\n".encode())
    events_until(listener, 1)
    link = listener.authenticated()[0]
    sock.close()
    for _ in range(3):
        link.stop()
