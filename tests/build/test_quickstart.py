"""The README's Quick start, as a newcomer runs it, on every CI run.

The commands are read from the README itself (its ``bash quickstart``
blocks, in order), so the page and the test cannot drift apart. They run in
a fresh virtual environment that has only pip (no TensorFlow, nothing of the
developer set-up), in a copy of the checkout's files, one after the other,
as a user pastes them:

1. the install (``pip install '.[tensorflow,examples]'``): TensorFlow, MPI and
   scikit-learn for the examples' data all come from that one command; pip
   takes the wheels from this machine's package cache;
2. the digits example at np=2, which compiles the op library on first use
   (into the user's cache, ``~/.cache/tfring``, as the README says) and must
   end with rank 0's accuracy line;
3. ``tfringrun --check-build``.

A command that fails (a module the install did not bring, a rank that dies)
fails the test with its output. The heavier install checks (build isolation,
the sdist and wheel, the TensorFlow version matrix) stay in test_install.py
(``pytest -m install``).
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from support import ROOT

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
COMMAND_TIMEOUT = 1500
ACCURACY = re.compile(r"val_accuracy=(\d\.\d+)")


def quickstart_commands(readme_text):
    """The commands of the README's ``bash quickstart`` blocks, in order
    (comments and blank lines dropped; a trailing backslash joins lines)."""
    commands = []
    for info, body in FENCE.findall(readme_text):
        if info.split() != ["bash", "quickstart"]:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = " ".join(re.sub(r"\s+#.*$", "", line).split())
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def test_the_quickstart_blocks_are_the_install_the_example_and_the_check():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        commands = quickstart_commands(f.read())
    assert len(commands) == 3, commands
    assert commands[0].startswith("pip install ") and "tensorflow" in commands[0], commands
    assert commands[1].startswith("tfringrun -np 2 python examples/"), commands
    assert commands[2] == "tfringrun --check-build", commands


def _copy_checkout(dest):
    """The checkout's files as a clone has them (tracked, plus new ones git
    does not ignore): none of this tree's builds, caches or venv."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=ROOT, capture_output=True, check=True,
                             timeout=60).stdout.decode().split("\0")
    for rel in filter(None, listing):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def test_the_readme_quickstart_runs_in_a_fresh_venv(tmp_path):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        commands = quickstart_commands(f.read())
    checkout, venv = tmp_path / "tfring", tmp_path / "venv"
    _copy_checkout(str(checkout))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # The user's shell after `. venv/bin/activate`: nothing of this test
    # environment's (its PYTHONPATH, an op library it points at) leaks in.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TFRING_LIBRARY", "HOROVOD_LIBRARY", "PIP_NO_BUILD_ISOLATION",
                        "TF_USE_LEGACY_KERAS", "TFRING_TEST_PROFILE")
           and not k.startswith("PYTEST_")}
    env.update(PATH=str(venv / "bin") + os.pathsep + os.environ["PATH"], VIRTUAL_ENV=str(venv),
               TF_CPP_MIN_LOG_LEVEL="2", PIP_DISABLE_PIP_VERSION_CHECK="1")
    # Where the run compiles through ccache (CI's CXX), its paths under this
    # test's directory (the checkout's sources, the fresh venv's TensorFlow
    # headers) are hashed relative to the checkout, as CI's own builds are,
    # so a later run's first-use compile of the same sources is a cache hit
    # instead of ~70 s of compiling. The compile still runs, as a user's does.
    env["CCACHE_BASEDIR"] = str(tmp_path)
    outputs, seconds = [], []
    for command in commands:
        start = time.monotonic()
        run = subprocess.run(["bash", "-c", f"set -euo pipefail\n{command}"], cwd=checkout, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=COMMAND_TIMEOUT)
        seconds.append(time.monotonic() - start)
        assert run.returncode == 0, (f"the README's Quick start command `{command}` failed "
                                     f"(exit {run.returncode}):\n{run.stdout[-8000:]}")
        outputs.append(run.stdout)
    _, example, check = outputs
    accuracy = ACCURACY.findall(example)
    assert accuracy and float(accuracy[-1]) >= 0.9, example[-5000:]
    assert re.search(r"TensorFlow 2\.\d+", check) and "[X] MPI" in check, check
    print("\nquick start: " + "; ".join(f"`{c}` {s:.0f} s" for c, s in zip(commands, seconds)))


@pytest.mark.parametrize("text, expected", [
    ("```bash quickstart\npip install x  # a comment\n\ntfringrun \\\n  -np 2 y\n```\n"
     "```bash\nnot this\n```\n", ["pip install x", "tfringrun -np 2 y"]),
    ("```bash runnable\nnot this either\n```\n", []),
])
def test_quickstart_commands_are_read_from_their_blocks_only(text, expected):
    assert quickstart_commands(text) == expected
