"""tfringrun's checks before it starts ranks (tfring/runner/preflight.py):
a job that imports TensorFlow needs a supported one in the ranks' Python;
other jobs are never refused for it."""
import os
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch_support import rank_lines, tfringrun  # noqa: E402
from tfring.runner import preflight  # noqa: E402

# Imports TensorFlow only in a function it never calls: the check sees the
# import line, and the job itself stays light.
TF_SCRIPT = textwrap.dedent("""
    import sys
    def train():
        import tensorflow as tf
    open(sys.argv[1], "w").close()
    print("STARTED", flush=True)
""")


@pytest.mark.parametrize("source", [
    "import tensorflow as tf",
    "import os, tensorflow",
    "from tensorflow import keras",
    "import tfring.keras as hvd",
    "from tfring import tensorflow as hvd",
    "from tfring import (keras)",
    "    import horovod.tensorflow.keras as hvd  # in a function",
    "import tf_keras",
    "from horovod.keras.callbacks import BroadcastGlobalVariablesCallback",
])
def test_imports_that_need_tensorflow(source):
    assert preflight.imports_tensorflow(source)


@pytest.mark.parametrize("source", [
    "import os", "import keras", "import tfring", "import tfring.runner",
    "import torch, numpy", "# import tensorflow", "from tfring import run",
    "x = 'import tensorflow'", "import tensorflowx",
])
def test_imports_that_do_not(source):
    assert not preflight.imports_tensorflow(source)


@pytest.mark.parametrize("code, needs", [
    ("import tfring.core as hvd", False),
    ("from tfring import torch as hvd", False),
    ("import torch\nimport horovod.torch as hvd", False),
    ("import tfring.core as hvd\nimport tensorflow as tf", True),
    ("import numpy", True),  # framework unknown: it may reach TF another way
])
def test_which_jobs_need_the_tf_op_library(tmp_path, code, needs):
    script = tmp_path / "job.py"
    script.write_text(code + "\n")
    assert preflight.needs_tf_library([sys.executable, str(script)]) is needs
    assert preflight.needs_tf_library([sys.executable, "-c", code]) is needs
    # Nothing to read: a module, or a command that is not Python.
    assert preflight.needs_tf_library([sys.executable, "-m", "job"])
    assert preflight.needs_tf_library(["bash", str(script)])


def test_a_torch_job_does_not_wait_for_a_tf_op_library_build(tmp_path, monkeypatch):
    # Where TensorFlow is installed but its op library is not built yet,
    # tfringrun builds it before starting the ranks; not for a job that
    # never loads it.
    from tfring.build import cache
    from tfring.runner import modes
    builds = []
    monkeypatch.setattr(cache, "library_ready_fast", lambda: False)
    monkeypatch.setattr(modes.subprocess, "run",
                        lambda cmd, **kw: builds.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    script = tmp_path / "job.py"
    script.write_text("import tfring.torch as hvd\n")
    assert modes.build_library_first([sys.executable, str(script)]) == 0
    assert builds == []
    script.write_text("import tfring.tensorflow as hvd\n")
    assert modes.build_library_first([sys.executable, str(script)]) == 0
    assert builds and builds[0][1:] == ["-m", "tfring.build"]


def test_job_source_finds_the_script_or_code(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import tensorflow")
    assert preflight.job_source(["python", "-u", "-X", "dev", str(script), "-c"]) == \
        "import tensorflow"
    assert preflight.job_source(["python", "-c", "print(1)", "x.py"]) == "print(1)"
    assert preflight.job_source(["python", "-m", "train"]) is None
    assert preflight.job_source(["python", str(tmp_path / "missing.py")]) is None
    assert preflight.rank_python(["bash", "-c", "python x.py"], os.environ) is None
    assert preflight.rank_python([sys.executable, "x.py"], os.environ) == sys.executable


def _run_script(tmp_path, python=sys.executable, env=None, extra=()):
    script = tmp_path / "train.py"
    script.write_text(TF_SCRIPT)
    marker = tmp_path / "started"
    proc, _ = tfringrun("-np", "2", *extra, python, str(script), str(marker), env=env)
    return proc, marker


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    """A venv with nothing but the standard library (no TensorFlow)."""
    path = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=120)
    return path / "bin" / "python"


def test_missing_tensorflow_is_named_with_what_to_install(tmp_path, bare_venv):
    proc, marker = _run_script(tmp_path, python=str(bare_venv))
    assert proc.returncode == 1
    assert f"this job imports TensorFlow, but {bare_venv} has none" in proc.stderr
    assert f"{bare_venv} -m pip install 'tensorflow>=2.16,<2.22'" in proc.stderr
    assert "'.[tensorflow]'" in proc.stderr and "No rank was started." in proc.stderr
    assert not marker.exists() and not rank_lines(proc.stdout)


def test_a_job_that_needs_no_tensorflow_runs_without_it(tmp_path, bare_venv):
    proc, _ = tfringrun("-np", "2", str(bare_venv), "-c", "print('plain python')")
    assert proc.returncode == 0, proc.stderr
    assert rank_lines(proc.stdout) == {0: ["plain python"], 1: ["plain python"]}


def test_no_tf_check_starts_the_job_anyway(tmp_path, bare_venv):
    proc, marker = _run_script(tmp_path, python=str(bare_venv), extra=["--no-tf-check"])
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()


def _fake_tensorflow_version(tmp_path, version):
    """A site dir, first on the ranks' path, whose dist-info says `version`."""
    info = tmp_path / "site" / f"tensorflow-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorflow\nVersion: {version}\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.parametrize("version, supported", [
    ("2.15.1", False), ("2.16.0", True), ("2.21.3", True), ("2.22.0", False), ("3.0.0", False),
])
def test_the_tensorflow_version_must_be_in_range(tmp_path, version, supported):
    proc, marker = _run_script(tmp_path, env=_fake_tensorflow_version(tmp_path, version))
    if supported:
        assert proc.returncode == 0, proc.stderr
        assert marker.exists()
    else:
        assert proc.returncode == 1
        assert (f"has TensorFlow {version}, outside the range tfring supports" in proc.stderr
                and "No rank was started." in proc.stderr), proc.stderr
        assert not marker.exists()
