"""Records where each test's time goes, for tests/tools/durations.py.

Loaded by tests/conftest.py when ``TFRING_TEST_PROFILE=<file>`` is set; adds
one JSON line per test to that file (under xdist every worker appends its
own tests' lines):

- ``worker``: the xdist worker that ran it ("gw0", "gw1"; "main" without
  xdist), ``group``: its group (tests/tools/parallel.py), and ``start``: when it started, in
  seconds since the run began;
- ``wall``: the test's wall time (set-up, call and tear-down);
- ``self_cpu`` / ``child_cpu``: CPU seconds of the pytest process and of the
  children it reaped meanwhile (rank processes, compilers, launchers);
- ``launches`` / ``compiles`` / ``pythons``: how many tfringrun or mpiexec jobs, compiler
  or build-tool runs and other Python processes the test started.

Wall time that neither this process nor its children spent on a CPU is time
the test waited (timeouts, sleeps, peers), which is how durations.py sorts
tests into kinds without any test saying what it does.
"""
import json
import os
import resource
import subprocess
import time

import pytest

from tools import parallel

START_ENV = "TFRING_TEST_PROFILE_START"
_COMPILERS = {"g++", "gcc", "c++", "mpicxx", "nvcc", "bazel", "bazel-4", "ld", "ar"}


def _kind_of(args):
    argv = [args] if isinstance(args, (str, bytes)) else list(args or [])
    argv = [str(a) for a in argv]
    if not argv:
        return None
    text = " ".join(argv)
    if ("tfring.runner.launch" in text
            or os.path.basename(argv[0]) in ("tfringrun", "mpiexec", "mpirun")):
        return "launches"
    if os.path.basename(argv[0]) in _COMPILERS:
        return "compiles"
    if "python" in os.path.basename(argv[0]):
        return "pythons"
    return None


class _Profiler:
    def __init__(self, path):
        self.path = path
        self.counts = None
        # `start`: seconds since the run began, which the first pytest
        # process of the run (xdist's controller) notes in the environment
        # its workers inherit (mark_start).
        self.t0 = time.monotonic()
        self.offset = time.time() - float(os.environ.get(START_ENV, time.time()))
        original = subprocess.Popen.__init__
        profiler = self

        def counting_init(popen, args, *a, **kw):
            kind = _kind_of(args)
            if kind and profiler.counts is not None:
                profiler.counts[kind] += 1
            return original(popen, args, *a, **kw)

        subprocess.Popen.__init__ = counting_init

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.counts = {"launches": 0, "compiles": 0, "pythons": 0}
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
            resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        yield
        wall = time.monotonic() - start
        own2, kids2 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
            resource.RUSAGE_CHILDREN)
        record = {
            "test": item.nodeid, "group": parallel.group_of(item.nodeid), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "start": round(start - self.t0 + self.offset, 3), "wall": round(wall, 3),
            "self_cpu": round(own2.ru_utime + own2.ru_stime - own.ru_utime - own.ru_stime, 3),
            "child_cpu": round(kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime, 3),
            **self.counts}
        self.counts = None
        # One write to a file opened for appending: the workers' lines never
        # interleave (a line is far below the size a write splits at).
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def mark_start():
    """Notes the run's start for the workers (see _Profiler's `start`)."""
    os.environ.setdefault(START_ENV, str(time.time()))


def register(config, path):
    config.pluginmanager.register(_Profiler(path), "tfring-profile")
