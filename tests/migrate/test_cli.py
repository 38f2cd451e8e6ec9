"""python -m tfring.migrate: diff or --write, the report, the exit status, --help."""
import subprocess
import sys

import pytest

from support import ROOT
from tfring.migrate import migrate
from tfring.migrate.cli import CHANGES, MANUAL, UNREADABLE, main

HOROVOD = ("import tensorflow as tf\nimport horovod.tensorflow.keras as hvd\n"
           "opt = tf.keras.optimizers.SGD(lr=0.1)\n")
MIGRATED = ("import tensorflow as tf\nimport tfring.keras as hvd\n"
            "opt = tf.keras.optimizers.SGD(learning_rate=0.1)\n")


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "train.py").write_text(HOROVOD)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "clean.py").write_text("import tfring.keras as hvd\n")
    (tmp_path / "pkg" / "manual.py").write_text("import tensorflow as tf\n"
                                                "tf.keras.backend.get_session()\n")
    (tmp_path / "pkg" / "notes.txt").write_text("import horovod.tensorflow as hvd\n")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "skip.py").write_text(HOROVOD)
    return tmp_path


def test_diff_by_default_writes_nothing(tree, capsys):
    assert main([str(tree / "train.py")]) == CHANGES
    out, err = capsys.readouterr()
    assert (tree / "train.py").read_text() == HOROVOD
    assert "-import horovod.tensorflow.keras as hvd\n" in out
    assert "+import tfring.keras as hvd\n" in out
    assert out.startswith(f"--- {tree / 'train.py'}\n+++ {tree / 'train.py'}\n")
    assert f"{tree / 'train.py'}:3: fixed: optimizer(lr=...)" in err


def test_write_rewrites_and_a_second_run_is_clean(tree, capsys):
    assert main(["--write", str(tree / "train.py")]) == CHANGES
    out, err = capsys.readouterr()
    assert out == "" and "rewritten" in err
    assert (tree / "train.py").read_text() == MIGRATED
    assert main([str(tree / "train.py")]) == 0
    assert capsys.readouterr() == ("", "")


def test_the_diff_is_what_write_does(tree, capsys):
    main([str(tree / "train.py")])
    diff = capsys.readouterr().out
    patched = tree / "patched"
    patched.mkdir()
    (patched / "train.py").write_text(HOROVOD)
    subprocess.run(["patch", "-s", str(patched / "train.py")], input=diff, text=True, check=True)
    main(["--write", str(tree / "train.py")])
    assert (patched / "train.py").read_text() == (tree / "train.py").read_text()


def test_directories_are_walked_and_statuses_combine(tree, capsys):
    status = main([str(tree)])
    out, err = capsys.readouterr()
    assert status == CHANGES | MANUAL
    assert "train.py" in out and "skip.py" not in out + err and "notes.txt" not in out + err
    assert f"{tree / 'pkg' / 'manual.py'}:2: manual: Keras 3 has no session. Fix: " in err
    assert main([str(tree / "pkg" / "clean.py")]) == 0


def test_unparsable_files_are_reported_and_the_rest_migrated(tree, capsys):
    (tree / "broken.py").write_text("def f(:\n")
    assert main(["--write", str(tree / "broken.py"), str(tree / "train.py")]) == \
        UNREADABLE | CHANGES
    assert "broken.py: cannot migrate" in capsys.readouterr().err
    assert (tree / "train.py").read_text() == MIGRATED
    assert main([str(tree / "missing.py")]) == UNREADABLE


def test_encoding_and_line_endings_are_kept(tmp_path):
    path = tmp_path / "latin.py"
    text = ("# -*- coding: latin-1 -*-\r\nimport horovod.tensorflow as hvd\r\n"
            "s = 'caf\xe9'; import horovod.keras as k\r\n")
    path.write_bytes(text.encode("latin-1"))
    assert migrate([str(path)], write=True) == CHANGES
    assert path.read_bytes() == text.replace("horovod.tensorflow", "tfring.tensorflow").replace(
        "horovod.keras", "tfring.keras").encode("latin-1")


def test_migrate_wants_a_list():
    with pytest.raises(TypeError, match="list"):
        migrate("train.py")


def test_command_line_help_and_exit_status(tree):
    help_ = subprocess.run([sys.executable, "-m", "tfring.migrate", "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "--write" in help_.stdout and "exit status" in help_.stdout
    run = subprocess.run([sys.executable, "-m", "tfring.migrate", str(tree)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == CHANGES | MANUAL and "+import tfring.keras as hvd" in run.stdout
    usage = subprocess.run([sys.executable, "-m", "tfring.migrate"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2


def test_runs_without_tensorflow(tree):
    # sys.modules[name] = None makes any import of it fail.
    code = ("import runpy, sys; sys.modules['tensorflow'] = sys.modules['keras'] = None; "
            "sys.argv = ['migrate', sys.argv[1]]; "
            "runpy.run_module('tfring.migrate', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", code, str(tree)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == CHANGES | MANUAL, run.stderr
