"""The data planes' conformance suite (tf_ops/common/tests/conformance_test.cc):
every CPU plane (MPI's own, shared memory, ring and hierarchical over MPI,
the ring over TCP, the ring with recursive doubling or Rabenseifner forced) runs every collective, dtype, reduce op and scaling at
sizes around its thresholds, against a reference computed in the test, at
np=1, 2 and 3. One mpiexec job per np runs every plane; each plane x np is
reported as its own test."""
import functools
import os
import re
import shutil
import subprocess
import sysconfig

import pytest

from support import ROOT, build_cpp, missing_tool
from tfring.build.unit_tests import unit_test_sources

# The labels conformance_test.cc gives its planes (MakePlanes()).
PLANES = ["mpi", "shm", "shm/4k-chunks", "shm/single-copy", "ring", "ring/tiny-pieces",
          "hierarchical", "hierarchical/tiny-pieces", "ring-tcp", "ring-tcp/tiny-pieces",
          "ring/recursive-doubling", "ring-tcp/recursive-doubling", "ring/rabenseifner",
          "ring-tcp/rabenseifner"]
# Warnings are errors in the suite and in the planes it is about.
STRICT = ("conformance_test.cc", "ring_data_plane.cc", "ring_pipeline.cc",
          "hierarchical_data_plane.cc",
          "allreduce_algorithms.cc",
          "shm_data_plane.cc", "mpi_data_plane.cc", "comm_point_to_point.cc",
          "mpi_communicator.cc")


def _mpi_bin(name):
    path = os.path.join(sysconfig.get_paths()["scripts"], name)
    return path if os.path.exists(path) else shutil.which(name)


@pytest.fixture(scope="module")
def conformance_run(tmp_path_factory):
    """run(np) -> {(plane, rank): (checks, failed)} and the job's output,
    one job per np (cached)."""
    cxx = _mpi_bin("mpicxx")
    if cxx is None:
        missing_tool("mpicxx (pip install mpich)")
    binary = build_cpp(tmp_path_factory.mktemp("conformance") / "conformance_test",
                       unit_test_sources("conformance_test.cc", ROOT),
                       [cxx, "-std=c++17", "-O1", "-g", "-Wall"], libs=["-lpthread"],
                       flags_for=lambda src: ["-Werror"] if src.endswith(STRICT) else [])

    @functools.lru_cache(maxsize=None)
    def run(np_):
        env = dict(os.environ, MPIR_CVAR_POLLS_BEFORE_YIELD="1")
        job = subprocess.run([_mpi_bin("mpiexec"), "-n", str(np_), binary],
                             capture_output=True, text=True, timeout=600, env=env)
        text = job.stdout + job.stderr
        results = {(m["plane"], int(m["rank"])): (int(m["checks"]), int(m["failed"]))
                   for m in re.finditer(r"^\[(?P<rank>\d+)\] conformance (?P<plane>\S+): "
                                        r"(?P<checks>\d+) checks, (?P<failed>\d+) failed",
                                        job.stdout, re.M)}
        return results, text

    return run


@pytest.mark.parametrize("np_", [1, 2, 3])
@pytest.mark.parametrize("plane", ["set-up"] + PLANES)
def test_plane_conforms(conformance_run, plane, np_):
    results, text = conformance_run(np_)
    for rank in range(np_):
        assert (plane, rank) in results, f"no result for {plane} on rank {rank}:\n{text[-5000:]}"
        checks, failed = results[(plane, rank)]
        assert failed == 0 and checks > 0, (
            f"{plane} rank {rank}: {failed} of {checks} checks failed:\n"
            + "\n".join(line for line in text.splitlines() if plane in line)[-8000:])
