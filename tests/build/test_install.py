"""Installing tfring the way a user does, and the TensorFlow version matrix.

One fresh virtual environment goes through these steps in order (its
fixtures build on each other, so each step runs once):

1. The README's user set-up, ``pip install '<checkout>[tensorflow,examples]'`` (pinned
   to TensorFlow NEWEST) in a venv that has only pip: tfring's dependencies
   and TensorFlow come from that one command, and pip's default build
   isolation hides TF from the build: nothing is compiled, and
   ``tfringrun -np 2 python examples/keras_digits.py`` compiles the op
   library into the cache before starting the ranks, then trains.
2. ``python -m build`` makes an sdist and a wheel that carry the C++ sources.
3. TensorFlow is switched to OLDEST: two ranks started together by plain
   ``mpiexec`` (no tfringrun to build first) import tfring at the same time;
   exactly one compiles, the other waits on the lock and loads that build,
   and the collective works (no ABI error).
4. The np=2 rank suites run on OLDEST: ops, gradients, training and TF1
   (tests/tensorflow/ranks), and Keras fit and callbacks on Keras 3 and on
   tf_keras (tests/keras/ranks).

The full suite (every other test, np=1/2/3) runs on NEWEST in the main
environment. Slow (two TF installs from pip's cache, two compiles): marked
``install``, which the default ``pytest`` run leaves out (pyproject.toml);
``pytest -m install`` runs it.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

from support import ROOT, run_rank_suite

pytestmark = pytest.mark.install

NEWEST = ("2.21.0", "2.21.0")  # (tensorflow-cpu, tf_keras)
OLDEST = ("2.16.2", "2.16.0")
TEST_PACKAGES = ["pytest"]  # for the rank suites (the examples' scikit-learn is an extra)
COMPILING = re.compile(r"tfring: compiling the op library for TensorFlow (\S+)")


class Env:
    """A virtual environment and how to run things in it: no PYTHONPATH (the
    checkout must not shadow the installed tfring), its own build cache."""

    def __init__(self, base):
        self.base = base
        self.dir = os.path.join(base, "venv")
        self.bin = os.path.join(self.dir, "bin")
        self.python = os.path.join(self.bin, "python")
        self.cache = os.path.join(base, "cache")
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "TFRING_LIBRARY", "HOROVOD_LIBRARY",
                                 "PIP_NO_BUILD_ISOLATION", "TF_USE_LEGACY_KERAS")}
        self.env.update(PATH=self.bin + os.pathsep + os.environ["PATH"], VIRTUAL_ENV=self.dir,
                        TFRING_CACHE_DIR=self.cache, TF_CPP_MIN_LOG_LEVEL="2")

    def run(self, args, timeout, cwd=None, check=True):
        start = time.monotonic()
        proc = subprocess.run(args, cwd=cwd or self.base, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        proc.seconds = time.monotonic() - start
        if check:
            assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-8000:]}"
        return proc

    def pip(self, *args, timeout=900):
        return self.run([self.python, "-m", "pip", "install", "-q", *args], timeout)

    def install_tf(self, versions):
        tf_version, keras_version = versions
        self.pip(f"tensorflow-cpu=={tf_version}")
        self.install_tf_keras(keras_version)

    def install_tf_keras(self, keras_version):
        # tf_keras requires `tensorflow`, which would pull the full TF wheel in
        # beside tensorflow-cpu: as in the README, without its dependencies.
        self.pip("--no-deps", f"tf_keras=={keras_version}")

    def cache_entries(self):
        return sorted(glob.glob(os.path.join(self.cache, "*", "tf*", "_tfring_ops.so")))

    def site_tfring(self):
        out = self.run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                        "['purelib'])"], 60).stdout.strip().splitlines()[-1]
        return os.path.join(out, "tfring")


def _digits(env, tag):
    """keras_digits.py at np=2 through the venv's tfringrun, from outside the
    checkout; returns the output."""
    result = env.run([os.path.join(env.bin, "tfringrun"), "-np", "2", "--timeout", "900",
                      "python", os.path.join(ROOT, "examples", "keras_digits.py"), "--epochs",
                      "2", "--checkpoint-dir", os.path.join(env.base, f"ckpt-{tag}")], 1200)
    accuracy = re.findall(r"val_accuracy=(\S+)", result.stdout)
    assert accuracy and float(accuracy[-1]) > 0.8, result.stdout[-5000:]
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Step 1: a fresh venv, then `pip install '<checkout>[tensorflow,examples]'`, the
    TensorFlow extra pinned to NEWEST (so that the test knows which it gets)."""
    env = Env(str(tmp_path_factory.mktemp("install")))
    subprocess.run([sys.executable, "-m", "venv", env.dir], check=True, timeout=300)
    result = env.pip(f"{ROOT}[tensorflow,examples]", f"tensorflow-cpu=={NEWEST[0]}")
    env.install_seconds = result.seconds
    env.pip(*TEST_PACKAGES)
    env.install_tf_keras(NEWEST[1])
    return env


def test_pip_install_with_isolation_then_tfringrun_builds_and_trains(installed):
    site = installed.site_tfring()
    assert not glob.glob(os.path.join(site, "_tfring_ops*.so")), \
        "an isolated build cannot see TensorFlow, so it must not have compiled"
    assert os.path.isfile(os.path.join(site, "_csrc", "tf_ops", "python_module.cc"))

    first = _digits(installed, "first")
    assert [m for m in COMPILING.findall(first.stdout)] == [NEWEST[0]], first.stdout[-5000:]
    # tfringrun compiled before starting the ranks: no rank line comes before it.
    compile_at = first.stdout.index("tfring: compiling")
    assert not re.search(r"^\[\d+\]", first.stdout[:compile_at], re.M)
    entries = installed.cache_entries()
    assert len(entries) == 1 and f"tf{NEWEST[0]}-" in entries[0], entries

    again = _digits(installed, "again")
    assert not COMPILING.search(again.stdout), "the cached build was not reused"
    built = re.search(r"built the op library for TensorFlow \S+ in (\d+) s", first.stdout)
    print(f"\ninstall: pip install '.[tensorflow]' {installed.install_seconds:.0f} s; "
          f"cold compile {built.group(1)} s; digits run with the cached build "
          f"{again.seconds:.0f} s (first run {first.seconds:.0f} s)")

    check = installed.run([os.path.join(installed.bin, "tfringrun"), "--check-build"], 300)
    assert f"TensorFlow {NEWEST[0]}" in check.stdout and entries[0] in check.stdout, check.stdout
    assert "build cache, built for TensorFlow " + NEWEST[0] in check.stdout
    assert "[X] MPI" in check.stdout and "TCP" in check.stdout and "NCCL" in check.stdout


def test_python_m_build_makes_sdist_and_wheel_with_sources(installed):
    installed.pip("build")
    out = os.path.join(installed.base, "dist")
    installed.run([installed.python, "-m", "build", "--outdir", out, ROOT], 900)
    sdist = glob.glob(os.path.join(out, "tfring-*.tar.gz"))
    wheel = glob.glob(os.path.join(out, "tfring-*-py3-none-any.whl"))
    assert len(sdist) == 1 and len(wheel) == 1, os.listdir(out)
    with tarfile.open(sdist[0]) as tar:
        names = tar.getnames()
    assert any(n.endswith("/tf_ops/python_module.cc") for n in names)
    assert any(n.endswith("/tf_ops/common/operations.h") for n in names)
    names = zipfile.ZipFile(wheel[0]).namelist()
    assert "tfring/_csrc/tf_ops/python_module.cc" in names
    assert "tfring/build/library.py" in names
    assert not [n for n in names if n.endswith(".so")]


@pytest.fixture(scope="module")
def switched(installed):
    """Step 3: the same venv, TensorFlow switched to OLDEST."""
    installed.install_tf(OLDEST)
    return installed


_TWO_RANKS = """
import tensorflow as tf
import tfring.tensorflow as hvd
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
print("RESULT", hvd.rank(), tf.__version__, float(total.numpy()[0]), flush=True)
"""


def test_tf_switch_rebuilds_once_for_ranks_importing_together(switched):
    before = switched.cache_entries()
    result = switched.run(["timeout", "1200", os.path.join(switched.bin, "mpiexec"), "-n", "2",
                           "-launcher", "fork", switched.python, "-c", _TWO_RANKS], 1300)
    out = result.stdout
    assert sorted(re.findall(r"RESULT (\d) (\S+) (\S+)", out)) == [
        ("0", OLDEST[0], "3.0"), ("1", OLDEST[0], "3.0")], out[-5000:]
    assert COMPILING.findall(out) == [OLDEST[0]], out[-5000:]
    assert out.count("another process finished building") == 1, out[-5000:]
    assert "waiting for another process" in out, out[-5000:]
    after = switched.cache_entries()
    new = sorted(set(after) - set(before))
    assert len(new) == 1 and f"tf{OLDEST[0]}-" in new[0], (before, after)
    assert "undefined symbol" not in out and "ALREADY_EXISTS" not in out

    digits = _digits(switched, "oldest")
    assert not COMPILING.search(digits.stdout)


# Step 4: the rank suites on OLDEST. They run from the checkout (so its tests
# and tfring are used) with the venv's interpreter; its library comes from
# the cache entry step 3 built (the cache key is the sources' content).
@pytest.mark.parametrize("suite,flavour", [
    ("tests/tensorflow/ranks", "default"),
    ("tests/keras/ranks", "keras3"),
    ("tests/keras/ranks", "tf_keras"),
])
def test_rank_suites_on_oldest_tf(switched, suite, flavour):
    env = {k: v for k, v in switched.env.items() if k not in ("PATH", "VIRTUAL_ENV")}
    if flavour == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    saved = {k: os.environ.pop(k) for k in ("PYTHONPATH", "TF_USE_LEGACY_KERAS")
             if k in os.environ}
    try:
        output = run_rank_suite(2, os.path.join(ROOT, suite), timeout=1500, env=env,
                                python=switched.python)
    finally:
        os.environ.update(saved)
    assert len(re.findall(r"\d+ passed", output)) == 2, output[-3000:]
