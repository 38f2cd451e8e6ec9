"""The ring and hierarchical data planes: the rank suite ranks/test_ring_collectives.py
run on the planes (ring forced on one host; fake hosts through TFRING_HOSTNAME
for the flat ring and the hierarchical plane), and the C++ test of the planes
over an MPICommunicator (tf_ops/common/tests/ring_test.cc) against the MPI
plane, byte for byte."""
import glob
import os
import re
import shutil
import subprocess
import sysconfig

import pytest

from support import ROOT, missing_tool, rank_lines, run_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks",
                     "test_ring_collectives.py")

LAUNCHES = {
    # The ring forced on one host (no fake hosts, no shared memory).
    "np2-ring-forced": (2, {"TFRING_CPU_OPERATIONS": "ring"}, "ring data plane"),
    # Two fake hosts: auto picks the flat ring for every size.
    "np3-flat-ring-a,a,b": (3, {"TFRING_HOSTNAME": "a,a,b", "TFRING_CPU_OPERATIONS": "auto",
                                "TFRING_CROSS_HOST_MIN_BYTES": "0"}, "ring data plane"),
    # Hierarchical on uneven hosts (one lane) and on even ones (two lanes).
    "np3-hierarchical-a,a,b": (3, {"TFRING_HOSTNAME": "a,a,b",
                                   "TFRING_HIERARCHICAL_ALLREDUCE": "1",
                                   "TFRING_CROSS_HOST_MIN_BYTES": "0"},
                               "hierarchical data plane"),
    "np4-hierarchical-a,a,b,b": (4, {"TFRING_HOSTNAME": "a,a,b,b",
                                     "TFRING_HIERARCHICAL_ALLREDUCE": "1",
                                     "TFRING_CROSS_HOST_MIN_BYTES": "0"},
                                 "hierarchical data plane"),
}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_ring_rank_suite(launch, controller):
    np_, env, created = LAUNCHES[launch]
    # Debug logging shows which planes each rank created (it only adds lines
    # to stderr); --capture=sys leaves fd 2 alone, so the C++ log lines
    # written during hvd.init() reach the output.
    output = run_rank_suite(np_, SUITE, timeout=420, controller=controller,
                            env=dict(env, TFRING_LOG_LEVEL="debug", PYTEST_ADDOPTS="--capture=sys"))
    passed = {r for r, text in rank_lines(output) if re.search(r"\d+ passed", text)}
    assert sorted(passed) == list(range(np_)), output[-5000:]
    # Every rank built the plane under test for the global set (so the
    # collectives above ran on it, the cut-over being 0 bytes), not the MPI
    # fallback.
    made = {r for r, text in rank_lines(output, "stderr") if created in text}
    assert made == set(range(np_)), output[-5000:]
    assert "cross-host data plane unavailable" not in output, output[-5000:]
    if "hierarchical" not in created:
        assert "hierarchical data plane" not in output, output[-5000:]


def _mpi_bin(name):
    path = os.path.join(sysconfig.get_paths()["scripts"], name)
    return path if os.path.exists(path) else shutil.which(name)


# What ring_test.cc needs of the core; if a plane grows a dependency outside
# it, the test links everything instead.
NEEDED = ["ops/*.cc", "mpi/mpi_context.cc", "mpi/mpi_communicator.cc",
          "transport/communicator.cc", "common.cc", "reduction.cc", "peer_monitor.cc",
          "logging.cc", "config.cc"]
# Warnings are errors in the files this test is about.
STRICT = ("ring_data_plane.cc", "hierarchical_data_plane.cc", "ring_test.cc",
          "comm_point_to_point.cc", "mpi_communicator.cc")


def _compile(cxx, flags, sources, out, cache):
    """Compiles `sources` two at a time (2 cores here); returns the objects."""
    todo = [s for s in sources if s not in cache]
    for i in range(0, len(todo), 2):
        procs = []
        for src in todo[i:i + 2]:
            obj = str(out / (os.path.relpath(src, ROOT).replace(os.sep, "_") + ".o"))
            extra = ["-Werror"] if src.endswith(STRICT) else []
            procs.append((src, obj, subprocess.Popen(
                [cxx, *flags, *extra, "-c", src, "-o", obj], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)))
        for src, obj, p in procs:
            text, _ = p.communicate(timeout=300)
            assert p.returncode == 0, f"{src}:\n{text}"
            cache[src] = obj
    return [cache[s] for s in sources]


@pytest.fixture(scope="module")
def ring_test_binary(tmp_path_factory):
    """tf_ops/common/tests/ring_test.cc linked with the core's sources it
    needs (no TensorFlow)."""
    cxx = _mpi_bin("mpicxx")
    if cxx is None:
        missing_tool("mpicxx (pip install mpich)")
    out = tmp_path_factory.mktemp("ring_test")
    core = os.path.join(ROOT, "tf_ops", "common")
    flags = ["-std=c++17", "-O1", "-g", "-Wall"]
    cache = {}
    binary = str(out / "ring_test")
    main = _compile(cxx, flags, [os.path.join(core, "tests", "ring_test.cc")], out, cache)
    needed = sorted({s for pattern in NEEDED for s in glob.glob(os.path.join(core, pattern))})
    everything = [s for s in sorted(glob.glob(os.path.join(core, "**", "*.cc"), recursive=True))
                  if os.sep + "tests" + os.sep not in s]
    for sources in (needed, everything):
        objects = _compile(cxx, flags, sources, out, cache)
        build = subprocess.run([cxx, *flags, *main, *objects, "-o", binary, "-lpthread"],
                               capture_output=True, text=True, timeout=300)
        if build.returncode == 0:
            return binary
    pytest.fail(f"linking ring_test failed:\n{build.stderr[-5000:]}")


@pytest.mark.parametrize("np_,hosts", [(2, "a,b"), (3, "a,a,b")])
def test_ring_cpp(ring_test_binary, np_, hosts):
    mpiexec = _mpi_bin("mpiexec")
    env = dict(os.environ, MPIR_CVAR_POLLS_BEFORE_YIELD="1")
    run = subprocess.run([mpiexec, "-n", str(np_), ring_test_binary, "--hosts", hosts],
                         capture_output=True, text=True, timeout=300, env=env)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-10000:]
    assert len(re.findall(r"ring_test: \d+ checks, 0 failed", run.stdout)) == np_, text[-5000:]
