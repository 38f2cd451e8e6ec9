"""Shared fixtures for the whole suite, and how it runs in parallel.

Suites under */ranks/ run inside every rank of a tfringrun job; a plain
pytest run launches them (see tests/tensorflow/test_ranks.py) rather than
collecting them itself.

`pytest -q` runs the suite on two pytest-xdist workers (pyproject.toml's
addopts); tests/tools/parallel.py groups the tests (a file, or files that
share a session fixture, run whole on one worker) and orders the groups.
"""
import os
import shutil
import tempfile
import uuid

import pytest

from support import CONTROLLERS, SESSION_TAG_ENV, missing_tool, tfringrun

collect_ignore_glob = [] if os.environ.get("TFRING_RANK_TESTS") == "1" else ["*/ranks/*"]

# This pytest process's tag (support.started_here): set here, at import, in
# every worker (a worker inherits the controller's environment, so the tag
# is set anew, not defaulted), before any test starts a process.
if os.environ.get("TFRING_RANK_TESTS") != "1":
    os.environ[SESSION_TAG_ENV] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


# This pytest process's temporary directory, and so every process it starts:
# set here, at import, before anything asks for one, and removed when the
# process ends. TensorFlow writes a file into TMPDIR for every function that
# autograph converts, and removes it at exit; the processes that tests kill
# (faults, elastic, chaos) never exit, and left ~2,000 files in /tmp per run.
# Short: Ray's and other AF_UNIX socket paths must fit in 107 bytes.
_OWN_TMPDIR = None
if os.environ.get("TFRING_RANK_TESTS") != "1":
    _OWN_TMPDIR = tempfile.mkdtemp(prefix="tfr-t-", dir="/tmp")
    os.environ["TMPDIR"] = _OWN_TMPDIR
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def pytest_unconfigure(config):
    if _OWN_TMPDIR is not None:
        shutil.rmtree(_OWN_TMPDIR, ignore_errors=True)


def pytest_configure(config):
    if os.environ.get("TFRING_RANK_TESTS") == "1":
        return
    from tools import parallel
    config.pluginmanager.register(parallel, "tfring-parallel")
    # TFRING_TEST_PROFILE=<file>: where each test's time goes
    # (tests/tools/durations.py). Under xdist each worker records the tests
    # it runs; the controller runs none.
    path = os.environ.get("TFRING_TEST_PROFILE")
    controller = config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput")
    if path:
        from tools import profile_plugin
        profile_plugin.mark_start()
        if not controller:
            profile_plugin.register(config, path)


def pytest_runtest_setup(item):
    # @pytest.mark.needs_tool("g++"): a C++ suite's compiler (see missing_tool).
    for mark in item.iter_markers("needs_tool"):
        for name in mark.args:
            if shutil.which(name) is None:
                missing_tool(name)


@pytest.fixture(scope="session")
def run_ranks():
    """tfringrun(np, args, timeout=..., env=..., extra=...) -> CompletedProcess."""
    return tfringrun


@pytest.fixture(params=CONTROLLERS)
def controller(request):
    """Each controller (transport) in turn: "mpi", then "tcp"."""
    return request.param

