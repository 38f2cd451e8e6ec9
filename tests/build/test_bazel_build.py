"""The Bazel build (design.md section 3) produces a working op library.

Runs .ci/bazel_build.sh (Debian's offline bazel-bootstrap in CI) and loads the
result in a fresh interpreter: tf.load_op_library must register the Horovod
ops and their Python wrappers, and the same file must import as the pybind11
module `_tfring_ops`. The load happens in a subprocess because loading a second
copy of the ops into a process that already has tfring's library aborts it
("Op ... ALREADY_EXISTS").

Slow (a cold build takes about half a minute to a few minutes), so marked
`bazel`; CI also runs the script directly.
"""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, ".ci", "bazel_build.sh")

# bazel-4 is Debian's bazel-bootstrap; plain `bazel` may be bazelisk.
BAZEL = shutil.which("bazel-4") or shutil.which("bazel")

_LOAD_CHECK = r"""
import ctypes, importlib.util, os, sys, sysconfig
path = sys.argv[1]
libmpi = os.path.join(sysconfig.get_paths()["data"], "lib", "libmpi.so.12")
if os.path.exists(libmpi):
    ctypes.CDLL(libmpi, mode=ctypes.RTLD_GLOBAL)  # as tfring's loader does
import tensorflow as tf
ops = tf.load_op_library(path)
missing = [n for n in ("horovod_allreduce", "horovod_allgather", "horovod_broadcast",
                       "horovod_size", "horovod_rank") if not hasattr(ops, n)]
assert not missing, "op wrappers missing: %s" % missing
spec = importlib.util.spec_from_file_location("tfring._tfring_ops", path)
core = importlib.util.module_from_spec(spec)
spec.loader.exec_module(core)
assert hasattr(core, "init") and hasattr(core, "rank"), dir(core)
print("BAZEL_LIBRARY_OK")
"""


@pytest.mark.bazel
@pytest.mark.skipif(BAZEL is None,
                    reason="bazel is not on PATH (apt-get install bazel-bootstrap, or bazelisk)")
def test_bazel_build_loads(tmp_path):
    out = tmp_path / "_tfring_ops.so"
    env = dict(os.environ, PYTHON_BIN_PATH=sys.executable, BAZEL=BAZEL)
    build = subprocess.run(["bash", SCRIPT, str(out)], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-6000:]
    assert out.is_file()

    load = subprocess.run([sys.executable, "-c", _LOAD_CHECK, str(out)],
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    assert load.returncode == 0 and "BAZEL_LIBRARY_OK" in load.stdout, load.stdout[-6000:]
