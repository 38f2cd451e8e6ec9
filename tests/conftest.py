"""Shared fixtures for the whole suite.

Suites under */ranks/ run inside every rank of a tfringrun job; a plain
pytest run launches them (see tests/tensorflow/test_ranks.py) rather than
collecting them itself.
"""
import os
import shutil

import pytest

from support import CONTROLLERS, missing_tool, tfringrun

collect_ignore_glob = [] if os.environ.get("TFRING_RANK_TESTS") == "1" else ["*/ranks/*"]


def pytest_configure(config):
    # TFRING_TEST_PROFILE=<file>: where each test's time goes (tests/tools/durations.py).
    path = os.environ.get("TFRING_TEST_PROFILE")
    if path and os.environ.get("TFRING_RANK_TESTS") != "1":
        from tools import profile_plugin
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
