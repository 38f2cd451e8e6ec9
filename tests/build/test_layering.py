"""Layering of the C++ sources: MPI lives only in tf_ops/common/mpi/ and the
MPI data plane, so that a build with TFRING_WITH_MPI=0 (which leaves exactly
those files out) compiles, and the core's start-up and planes stay
transport-neutral. (tests/common/test_core_cpp.py keeps TensorFlow out of the
core the same way.)"""
import os
import re

from support import ROOT
from tfring.build import library

TF_OPS = os.path.join(ROOT, "tf_ops")
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# Files allowed to include MPI besides the MPI transport's own: the C++ test
# of the planes over an MPICommunicator (a test program, built with mpicxx).
# The bindings reach every transport through transport/entry_points.h.
MPI_TESTS = {os.path.join("tf_ops", "common", "tests", "ring_test.cc")}


def _is_mpi_include(rel, kind, name):
    """Whether an include of `name` from the file `rel` (relative to the
    root) brings in MPI: <mpi.h> or another header of MPI's, or a file of the
    MPI transport."""
    if kind == "<":
        return os.path.basename(name).startswith(("mpi", "mpio"))
    target = os.path.normpath(os.path.join(os.path.dirname(rel), name))
    return library.is_mpi_source(target)


def violations(root):
    """(file, line number, include) for every MPI include outside the MPI
    transport under root/tf_ops."""
    found = []
    for dirpath, _, filenames in os.walk(os.path.join(root, "tf_ops")):
        for name in sorted(filenames):
            if not name.endswith((".cc", ".h", ".cu")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if library.is_mpi_source(rel) or rel in MPI_TESTS:
                continue
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = _INCLUDE.match(line)
                    if m and _is_mpi_include(rel, m.group(1), m.group(2)):
                        found.append((rel, number, line.strip()))
    return found


def test_only_the_mpi_transport_includes_mpi():
    assert violations(ROOT) == []


def test_the_mpi_transport_is_what_a_build_without_mpi_leaves_out():
    with_mpi = set(library.translation_units(ROOT, mpi=True))
    without = set(library.translation_units(ROOT, mpi=False))
    left_out = sorted(with_mpi - without)
    assert left_out and all(library.is_mpi_source(f) for f in left_out), left_out
    assert os.path.join("tf_ops", "common", "ops", "mpi_data_plane.cc") in left_out
    assert os.path.join("tf_ops", "common", "mpi", "mpi_init.cc") in left_out
    assert os.path.join("tf_ops", "common", "operations.cc") in without


def test_the_check_finds_mpi_includes(tmp_path):
    """The check itself: an MPI include anywhere else, directly or through a
    file of the MPI transport, is found, in the Python module too (even
    behind `#if TFRING_WITH_MPI`: the bindings use transport/entry_points.h)."""
    common = tmp_path / "tf_ops" / "common"
    (common / "ops").mkdir(parents=True)
    (common / "mpi").mkdir()
    (common / "mpi" / "mpi_backend.h").write_text('#include <mpi.h>\n')
    (common / "ops" / "mpi_data_plane.h").write_text('#include <mpi.h>\n')
    (common / "operations.cc").write_text('#include "mpi/mpi_backend.h"\n')
    (common / "ops" / "ring_data_plane.cc").write_text('#include "mpi_data_plane.h"\n')
    (common / "ops" / "shm_data_plane.cc").write_text('#  include <mpi.h>\n')
    (tmp_path / "tf_ops" / "python_module.cc").write_text(
        '#if TFRING_WITH_MPI\n#include "common/mpi/mpi_init.h"\n#endif\n'
        '#include "common/mpi/mpi_backend.h"\n')
    found = sorted((f, n) for f, n, _ in violations(str(tmp_path)))
    assert found == [
        (os.path.join("tf_ops", "common", "operations.cc"), 1),
        (os.path.join("tf_ops", "common", "ops", "ring_data_plane.cc"), 1),
        (os.path.join("tf_ops", "common", "ops", "shm_data_plane.cc"), 1),
        (os.path.join("tf_ops", "python_module.cc"), 2),
        (os.path.join("tf_ops", "python_module.cc"), 4),
    ], found
