"""How `pytest -q` runs on two pytest-xdist workers (pyproject.toml's
addopts: ``-n 2 --dist loadgroup``), registered by tests/conftest.py.

The unit of work a worker takes is a group: a test file, or the files of one
SHARED group, which run whole on one worker so that what they share is set
up once (a module fixture; Ray's cluster; Spark's session; the C++ test
programs' object store). The longest groups start first (LONG_FIRST), so
that no worker is left alone with a long one at the end; the others follow
in collection order.

(xdist's own ``xdist_group`` mark does not group with pytest 9, whose test
ids xdist 3.8 can no longer tag, so the groups are named here, by path.)
"""
import os

import pytest

# Files that must run on the same worker (a directory ends with "/").
SHARED = {
    # Every Ray test uses the session's Ray cluster (tests/ray/conftest.py).
    "ray": ["tests/ray/"],
    # Every Spark test uses the session's Spark session (tests/spark/conftest.py).
    "spark": ["tests/spark/"],
    # The C++ test programs share the worker's object store (support.build_cpp):
    # each core file is compiled once per run, not once per worker.
    "cpp": ["tests/common/ops/test_conformance_cpp.py", "tests/common/test_core_cpp.py",
            "tests/common/test_nccl_cpp.py", "tests/common/test_reduction_cpp.py",
            "tests/common/test_shm_cpp.py", "tests/common/test_speculation_cpp.py",
            "tests/common/transport/test_tcp_cpp.py",
            "tests/common/transport/test_tcp_communicator.py"],
}

# Groups that start first, the longest first (tests/tools/durations.py's
# table of a full run; a group's minutes are its files' sum).
LONG_FIRST = [
    "ray",                                  # ~4.5 min, most of it waiting on Ray
    "tests/tensorflow/test_ranks.py",       # ~3 min, np=3 TF launches
    "spark",                                # ~2.5 min
    "tests/docs/test_docs.py",              # ~2 min
    "tests/build/test_quickstart.py",       # ~2 min (a venv, an install)
    "tests/tensorflow/test_elastic.py",
    "tests/runner/test_launch.py",
    "tests/chaos/test_chaos.py",
    "tests/keras/test_keras_ranks.py",
    "cpp",
]


def group_of(nodeid):
    """The group of the test `nodeid`: its SHARED group, else its file."""
    path = nodeid.split("::")[0]
    for group, members in SHARED.items():
        if any(path == m or (m.endswith("/") and path.startswith(m)) for m in members):
            return group
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # On a worker (both collect the same tests, in the same order): the
    # long groups first. A run without xdist keeps the usual order.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    first = {group: i for i, group in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: first.get(group_of(item.nodeid), len(LONG_FIRST)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: the groups above, in the workers' order."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return group_of(nodeid)

    # Keep the collection's order (LONG_FIRST), not xdist's (most tests first).
    config.option.loadscopereorder = False
    return GroupScheduling(config, log)
