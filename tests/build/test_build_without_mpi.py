"""TFRING_WITH_MPI=0: the op library builds without MPI (no mpi/ sources, no
MPI data plane), needs no libmpi, and says so through mpi_built().

Built with tfring.build.library's own API into a temporary directory (the
real library, every translation unit compiled once more), so marked
``install`` like the other slow build tests."""
import os
import shutil
import subprocess
import sys

import pytest

from support import ROOT
from tfring.build import cache, library

pytestmark = pytest.mark.install

# Loads a library in a fresh interpreter (a second copy of the ops in this
# process would abort it) and prints what its core module says.
_PROBE = r"""
import importlib.util, sys
import tensorflow as tf
path = sys.argv[1]
tf.load_op_library(path)
spec = importlib.util.spec_from_file_location("tfring._tfring_ops", path)
core = importlib.util.module_from_spec(spec)
spec.loader.exec_module(core)
print("MPI_BUILT", core.mpi_built())
if "init" in sys.argv[2:]:
    code, message, cause, rank = core.init(0)
    print("INIT", code, cause, message)
"""


def _probe(path, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    run = subprocess.run([sys.executable, "-c", _PROBE, path, *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-5000:]
    return run.stdout


@pytest.fixture(scope="module")
def library_without_mpi(tmp_path_factory):
    import tensorflow as tf
    out_dir = tmp_path_factory.mktemp("nompi")
    saved = os.environ.get("TFRING_WITH_MPI")
    os.environ["TFRING_WITH_MPI"] = "0"
    try:
        assert library.build_variant(tf).endswith("-nompi")
        options = library.build_options(tf, ROOT, workdir=str(out_dir / "extra"),
                                        log=lambda m: None)
        output = str(out_dir / library.LIBRARY_NAME)
        (out_dir / "objs").mkdir()
        library.compile_library(output, options, ROOT, log=lambda m: None,
                                workdir=str(out_dir / "objs"))
    finally:
        if saved is None:
            del os.environ["TFRING_WITH_MPI"]
        else:
            os.environ["TFRING_WITH_MPI"] = saved
    return output, options


def test_options_leave_out_mpi(library_without_mpi):
    _, options = library_without_mpi
    assert ("TFRING_WITH_MPI", "0") in options.define_macros
    assert "mpi" not in options.libraries
    assert not [s for s in options.sources if library.is_mpi_source(s)], options.sources
    assert not [d for d in options.include_dirs if os.path.exists(os.path.join(d, "mpi.h"))]


@pytest.mark.skipif(shutil.which("readelf") is None or shutil.which("ldd") is None,
                    reason="needs readelf and ldd (binutils, libc-bin)")
def test_library_needs_no_libmpi(library_without_mpi):
    path, _ = library_without_mpi
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                             check=True).stdout
    needed = [line for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed and not [n for n in needed if "libmpi" in n], needed
    # No RUNPATH into the MPI install either.
    runpath = [e for line in dynamic.splitlines() if "runpath" in line.lower()
               for e in line.split("[", 1)[1].rstrip("]").split(":")]
    try:
        assert os.path.join(library.mpi_prefix(), "lib") not in runpath, runpath
    except library.ToolMissingError:
        pass
    resolved = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    assert "libmpi" not in resolved, resolved
    symbols = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True,
                             text=True).stdout
    assert not [s for s in symbols.split() if s.startswith(("MPI_", "PMPI_"))]


def test_mpi_built_tells_the_truth(library_without_mpi):
    path, _ = library_without_mpi
    out = _probe(path, "init")
    assert "MPI_BUILT False" in out, out
    # Asking it to start over MPI is an error that names the cause.
    assert "INIT 0" not in out and "built without MPI (TFRING_WITH_MPI=0)" in out, out
    # And the default build (the in-place library, when there is one) says True.
    packaged = cache.packaged_library()
    if packaged is not None:
        assert "MPI_BUILT True" in _probe(packaged)


_TCP_JOB = r"""
import sys
import tensorflow as tf
import tfring.tensorflow as hvd
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum).numpy()[0]
maps = open("/proc/self/maps").read()
print("RESULT", hvd.rank(), hvd.size(), total, hvd.mpi_built(), "libmpi" in maps,
      "mpi4py" in sys.modules)
"""


@pytest.mark.parametrize("np_", [2, 3])
def test_tcp_job_runs_on_the_library_without_mpi(library_without_mpi, np_):
    # The point of the build: a job over the TCP controller, with no libmpi
    # anywhere in the ranks' address spaces.
    from support import rank_lines, tfringrun
    path, _ = library_without_mpi
    result = tfringrun(np_, [sys.executable, "-c", _TCP_JOB], timeout=180, controller="tcp",
                       env={"TFRING_LIBRARY": path})
    assert result.returncode == 0, result.stdout[-5000:]
    lines = sorted(text for _, text in rank_lines(result.stdout) if text.startswith("RESULT"))
    total = float(np_ * (np_ + 1) / 2)
    assert lines == [f"RESULT {r} {np_} {total} False False False" for r in range(np_)], \
        result.stdout[-5000:]
