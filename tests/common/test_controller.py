"""Choosing the controller in tfring.common.basics, without the C++ core.

init() is run against a stand-in core module (the real one needs a job), in
a fresh Python each time, so that "mpi4py was never imported" means
something: a finder on sys.meta_path reports any attempt to import it, even
one that an ``except ImportError`` would swallow.
"""
import textwrap

import pytest

from support import run_python
from tfring.common import basics
from tfring.runner import wire
from tfring.runner.rendezvous import RendezvousClient

# Runs before the test's code: reports any import of mpi4py on stderr, and
# loads a stand-in core whose init_tcp runs INIT_TCP (a code string).
PRELUDE = textwrap.dedent("""
    import atexit, os, sys

    class ReportMpi4py:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "mpi4py":
                sys.stderr.write("IMPORTED " + name + "\\n")
            return None

    sys.meta_path.insert(0, ReportMpi4py())
    from tfring.common import basics, loader

    class FakeCore:
        calls = []
        broken = os.environ.get("FAKE_BROKEN") == "1"

        def mpi_built(self):
            return os.environ.get("FAKE_MPI_BUILT", "1") == "1"

        def init_tcp(self):
            self.calls.append("init_tcp")
            exec(os.environ.get("INIT_TCP", ""))
            return (0, "")

        def init(self, handle):
            raise AssertionError("MPI init under tcp")

        def shutdown(self, reason=""):
            self.calls.append("shutdown")
            return (0, "")

        def communication_broken(self):
            return self.broken

    core = FakeCore()
    loader._loaded = (None, core)
""")


def run_with_fake_core(code, **env):
    full = {"TFRING_CONTROLLER": "tcp", **env}
    return run_python(PRELUDE + textwrap.dedent(code), env=full, timeout=60)


@pytest.mark.parametrize("env, want", [
    ({}, "mpi"),
    ({"TFRING_CONTROLLER": "tcp"}, "tcp"),
    ({"TFRING_CONTROLLER": "MPI"}, "mpi"),
    ({"HOROVOD_CONTROLLER": "gloo"}, "tcp"),
    ({"HOROVOD_CONTROLLER": "mpi"}, "mpi"),
    ({"TFRING_CONTROLLER": "mpi", "HOROVOD_CONTROLLER": "gloo"}, "mpi"),
    ({"TFRING_RENDEZVOUS_ADDR": "10.0.0.1"}, "tcp"),
    ({"TFRING_RENDEZVOUS_ADDR": "10.0.0.1", "TFRING_CONTROLLER": "mpi"}, "mpi"),
])
def test_configured_controller(env, want):
    assert basics.configured_controller(env) == want


def test_unknown_controller_is_named():
    with pytest.raises(ValueError, match=r"HOROVOD_CONTROLLER='nccl' names no controller"):
        basics.configured_controller({"HOROVOD_CONTROLLER": "nccl"})


def test_every_registered_transport_is_chosen_by_its_names_and_flags(monkeypatch):
    """The table in tfring/common/transports.py is where the start-up and
    tfringrun learn the transports: a transport added there (here a made-up
    one) is accepted under its name and aliases and gets its tfringrun flag,
    with no other change."""
    from tfring.common import transports
    from tfring.runner import launch
    extra = transports.Transport("carrier", ("pigeon",), "init_carrier", takes_comm=False,
                                 elastic=False, flags=("--carrier",), help="by air")
    monkeypatch.setattr(transports, "TRANSPORTS", transports.TRANSPORTS + (extra,))
    for t in transports.TRANSPORTS:
        for name in (t.name, *t.aliases):
            assert basics.configured_controller({"TFRING_CONTROLLER": name.upper()}) == t.name
        args = launch.build_parser().parse_args([t.flags[-1], "-np", "1", "true"])
        assert getattr(args, t.name) is True
    with pytest.raises(ValueError, match=r"use mpi or tcp or carrier \(gloo means tcp, "
                                         r"pigeon means carrier\)"):
        basics.configured_controller({"TFRING_CONTROLLER": "smoke"})


def test_tcp_init_never_touches_mpi():
    result = run_with_fake_core("""
        atexit.register(lambda: print("at exit:", core.calls, "mpi4py" in sys.modules))
        basics.init()
        assert core.calls == ["init_tcp"], core.calls
        print(basics.gloo_enabled(), basics.mpi_enabled(), basics.gloo_built(),
              basics.mpi_built())
    """, FAKE_MPI_BUILT="0")
    assert result.returncode == 0, result.stderr
    assert "IMPORTED" not in result.stderr
    assert result.stdout.splitlines() == ["True False True False",
                                          "at exit: ['init_tcp', 'shutdown'] False"]


def test_tcp_exit_after_a_broken_job_does_not_touch_mpi():
    result = run_with_fake_core("""
        basics.init()
        print("initialised", flush=True)
    """, FAKE_BROKEN="1")
    assert result.returncode == 1  # the broken-job exit path ran
    assert result.stdout == "initialised\n"
    assert "IMPORTED" not in result.stderr


def test_mpi_queries_before_init_follow_the_environment():
    result = run_with_fake_core("""
        print(basics.mpi_enabled(), basics.gloo_enabled(), basics.mpi_built())
    """, TFRING_CONTROLLER="mpi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "True False True\n"


def test_comm_is_refused_under_tcp():
    result = run_with_fake_core("""
        try:
            basics.init(comm=[0, 1])
        except ValueError as e:
            print(e)
        assert core.calls == []
    """)
    assert result.returncode == 0, result.stderr
    assert "init(comm=...) needs MPI, but the controller is tcp" in result.stdout
    assert "IMPORTED" not in result.stderr


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rendezvous_serve_starts_the_store_before_init_tcp():
    # init_tcp (the stand-in) authenticates to the store: it must be up.
    secret = wire.generate_secret()
    port = _free_port()
    result = run_with_fake_core("""
        basics.init()
        print("served")
    """, TFRING_RENDEZVOUS_SERVE="1", TFRING_RENDEZVOUS_ADDR="127.0.0.1",
        TFRING_RENDEZVOUS_PORT=str(port), TFRING_SECRET=wire.encode_secret(secret),
        INIT_TCP="from tfring.runner.rendezvous import RendezvousClient\n"
                 "c = RendezvousClient('127.0.0.1', int(os.environ['TFRING_RENDEZVOUS_PORT']))\n"
                 "c.ping(); c.close(); print('pinged')")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "pinged\nserved\n"
    # Gone with the process.
    with pytest.raises(OSError):
        RendezvousClient("127.0.0.1", port, secret, timeout=2)


@pytest.mark.parametrize("env, message", [
    ({"TFRING_RENDEZVOUS_ADDR": "127.0.0.1"}, "needs TFRING_RENDEZVOUS_ADDR and "
                                              "TFRING_RENDEZVOUS_PORT"),
    ({"TFRING_RENDEZVOUS_ADDR": "127.0.0.1", "TFRING_RENDEZVOUS_PORT": "0"},
     "TFRING_RENDEZVOUS_PORT='0' is not a port"),
    ({"TFRING_RENDEZVOUS_ADDR": "127.0.0.1", "TFRING_RENDEZVOUS_PORT": "29999"},
     "TFRING_SECRET is not set"),
])
def test_rendezvous_serve_errors_name_the_variable(env, message):
    result = run_with_fake_core("""
        try:
            basics.init()
        except ValueError as e:
            print(e)
        assert core.calls == []
    """, TFRING_RENDEZVOUS_SERVE="1", **env)
    assert result.returncode == 0, result.stderr
    assert message in result.stdout



def test_library_without_the_tcp_controller_says_so():
    result = run_with_fake_core("""
        del FakeCore.init_tcp
        print(basics.gloo_built())
        import tensorflow as tf
        try:
            basics.init()
        except tf.errors.FailedPreconditionError as e:
            print(e.message)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "False", "this tfring library has no TCP controller (no init_tcp): rebuild it from "
                 "this source."]
    assert "IMPORTED" not in result.stderr
