"""The docs are linked and their runnable commands run.

Convention: every fenced ``bash`` block says how it is checked, in its info
string:

- ``bash runnable``: run here, as a bash script with ``set -euo pipefail``,
  from the repository root, with this Python's bin directory first on PATH
  (so ``tfringrun``, ``python`` and ``mpiexec`` are this environment's).
  Runnable blocks must be quick: each has a time limit.
- ``bash quickstart`` (README only): the Quick start, run in a fresh
  virtual environment by tests/build/test_quickstart.py.
- ``bash ci``: run by CI's ``.ci/run``; each command must appear there.
- ``bash not-run: <why>``: needs what a test machine lacks (other hosts,
  Docker, a GPU, a cluster, the reader's own script), and says so.

A plain ``bash`` block fails the suite: nobody would know whether it works.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from support import ROOT

PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [
    "tests/README.md"]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
BLOCK_TIMEOUT = 600


def _read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def runnable_blocks():
    blocks = []
    for page in PAGES:
        for i, (info, body) in enumerate(FENCE.findall(_read(page))):
            if info.split() == ["bash", "runnable"]:
                blocks.append(pytest.param(page, body, id=f"{page}#{i}"))
    return blocks


BASH_CHECKS = ("runnable", "ci")


def bash_blocks():
    """(page, index, info, body) of every fenced bash block."""
    return [(page, i, info, body) for page in PAGES
            for i, (info, body) in enumerate(FENCE.findall(_read(page)))
            if info.split()[:1] == ["bash"]]


def test_every_bash_block_says_how_it_is_checked():
    unmarked = []
    for page, i, info, _ in bash_blocks():
        rest = info.split(None, 1)[1].strip() if len(info.split()) > 1 else ""
        if rest in BASH_CHECKS or (page == "README.md" and rest == "quickstart"):
            continue
        if rest.startswith("not-run:") and rest[len("not-run:"):].strip():
            continue
        unmarked.append(f"{page}#{i}: ```{info}")
    assert not unmarked, ("bash blocks that say neither how they are run nor why they are not "
                          "(see this file's docstring):\n" + "\n".join(unmarked))


def test_ci_blocks_are_what_ci_runs():
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = " ".join(f.read().split())
    blocks = [(page, body) for page, _, info, body in bash_blocks() if info.split()[1:] == ["ci"]]
    assert blocks, "no `bash ci` block: the README's set-up and test command are CI's"
    for page, body in blocks:
        for command in re.split(r"&&|\n", body):
            command = " ".join(command.split())
            if command:
                assert command in ci, f"{page}: `{command}` is not in .ci/run"


def test_there_are_runnable_blocks_in_every_guide():
    pages = {p.values[0] for p in runnable_blocks()}
    for guide in ("docs/running.md", "docs/performance.md", "docs/troubleshooting.md"):
        assert guide in pages, f"{guide} has no `bash runnable` block"


@pytest.mark.parametrize("page,script", runnable_blocks())
def test_runnable_block_runs(page, script):
    # A block's own temporary files (mktemp, Ray's session) land in a directory
    # of its own that the test removes. Short, and not pytest's tmp_path: Ray
    # puts its socket paths under TMPDIR, and they must fit in 107 bytes.
    tmpdir = tempfile.mkdtemp(prefix="tfdoc-", dir="/tmp")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=tmpdir)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    try:
        result = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=BLOCK_TIMEOUT)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert result.returncode == 0, (
        f"a runnable block of {page} failed (exit {result.returncode}):\n{script}\n"
        f"--- output ---\n{result.stdout[-6000:]}")


def test_every_guide_is_linked_from_the_readme():
    readme = _read("README.md")
    for page in PAGES[1:]:
        assert f"({page})" in readme, f"README.md does not link {page}"


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    base = os.path.dirname(os.path.join(ROOT, page))
    for target in LINK.findall(_read(page)):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s):, mailto: ...
        assert os.path.exists(os.path.join(base, target)), f"{page} links {target}, which is missing"
