"""End to end: Horovod-style TF2 scripts (tests/migrate/horovod_scripts/,
written for Horovod and Keras 2) fail on Keras 3 with only their imports
moved to tfring, and train under tfringrun once ``python -m tfring.migrate
--write`` has fixed them."""
import os
import re
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic_support import ElasticJob, leftovers  # noqa: E402
from support import ROOT, rank_lines, tfringrun  # noqa: E402

from tfring.migrate.imports import rewrite_imports  # noqa: E402
from tfring.migrate.source import Source, apply_edits  # noqa: E402

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_scripts")
TIMEOUT = 240

# What Keras 3 says to each script once only its imports are tfring's.
KERAS3_ERRORS = {
    "keras_fit.py": "Argument(s) not recognized: {'lr'",
    "tape_loop.py": "'list' object is not callable",
    "elastic_keras.py": "unexpected keyword argument 'experimental_run_tf_function'",
    "synthetic_benchmark.py": "`keras.optimizers.legacy` is not supported in Keras 3",
}

# python -c RUN_EACH SCRIPT...: runs each script in this process, printing
# "<name> FAILED <type>: <message>" or "<name> RAN" for each.
RUN_EACH = (
    "import os, runpy, sys\n"
    "for path in sys.argv[1:]:\n"
    "    sys.argv = [path]\n"
    "    try:\n"
    "        runpy.run_path(path, run_name='__main__')\n"
    "        print(os.path.basename(path), 'RAN', flush=True)\n"
    "    except Exception as e:\n"
    "        print(os.path.basename(path), 'FAILED', type(e).__name__, ' '.join(str(e).split()),"
    " flush=True)\n")


def _copy(tmp_path):
    target = tmp_path / "scripts"
    shutil.copytree(SCRIPTS, target)
    return target


def _migrate(*args):
    return subprocess.run([sys.executable, "-m", "tfring.migrate", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """A copy of the scripts after ``python -m tfring.migrate --write``."""
    target = _copy(tmp_path_factory.mktemp("migrated"))
    result = _migrate("--write", target)
    assert result.returncode == 1, result.stderr  # fixes made, nothing manual
    assert _migrate(target).returncode == 0  # and nothing left to do
    return target


def test_scripts_fail_on_keras3_with_only_their_imports_moved(tmp_path):
    target = _copy(tmp_path)
    for name in KERAS3_ERRORS:
        path = target / name
        source = Source(path.read_text())
        edits, _ = rewrite_imports(source)
        text, _ = apply_edits(source.text, edits)
        assert "import horovod" not in text and "from horovod" not in text
        path.write_text(text)
    result = subprocess.run(
        [sys.executable, "-c", RUN_EACH, *(str(target / n) for n in KERAS3_ERRORS)], cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, capture_output=True, text=True,
        timeout=TIMEOUT)
    outcomes = {line.split()[0]: line for line in result.stdout.splitlines()
                if line.split()[:1] and line.split()[0] in KERAS3_ERRORS}
    assert sorted(outcomes) == sorted(KERAS3_ERRORS), result.stdout + result.stderr[-5000:]
    for name, error in KERAS3_ERRORS.items():
        assert " FAILED " in outcomes[name] and error in outcomes[name], outcomes[name]


def _values(output):
    values = {}
    for rank, text in rank_lines(output):
        if rank == 0:
            values.update(re.findall(r"(\w+)=(\S+)", text))
    return values


@pytest.mark.parametrize("np_", [2, 3])
def test_keras_fit_with_callbacks_trains_after_migration(migrated, np_):
    result = tfringrun(np_, [sys.executable, str(migrated / "keras_fit.py"), "--epochs", "2"],
                       timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-8000:]
    values = _values(result.stdout)
    # The warm-up callback set the rate through opt.learning_rate (was opt.lr).
    assert float(values["lr"]) == pytest.approx(0.05 * np_, rel=1e-4), values
    assert int(values["size"]) == np_ and float(values["val_accuracy"]) >= 0.8, values


def test_tape_loop_and_synthetic_benchmark_train_after_migration(migrated):
    for script, args in (("tape_loop.py", ["--steps", "60"]), ("synthetic_benchmark.py", [])):
        result = tfringrun(2, [sys.executable, str(migrated / script), *args], timeout=TIMEOUT)
        assert result.returncode == 0, f"{script}:\n{result.stdout[-8000:]}"
        values = _values(result.stdout)
        if script == "tape_loop.py":
            assert values["ranks_in_sync"] == "True", values  # opt.variables broadcast
            assert float(values["final_loss"]) < 1.0, values
        else:
            per_rank, total = (float(values["images_per_sec_per_rank"]),
                               float(values["total_images_per_sec"]))
            assert per_rank > 0 and total == pytest.approx(2 * per_rank, abs=0.2), values


def test_elastic_keras_trains_after_migration(migrated, tmp_path):
    command = [sys.executable, str(migrated / "elastic_keras.py"), "--epochs", "2"]
    with ElasticJob(tmp_path, "localhost:2", command, 2, 2, 2, timeout=TIMEOUT) as job:
        code, output = job.finish()
    assert code == 0, output[-8000:]
    values = _values(output)
    assert int(values["size"]) == 2 and float(values["final_loss"]) < 1.5, output[-4000:]
    assert leftovers(job) == []
