"""tfring.build.core_module.build_program: C++ programs over the core. The
benchmark that drives the whole core path from C++ as the TF kernels do
(tf_ops/common/tests/gpu/core_path_bench.cc): on this machine the CPU build,
host tensors, with a memcpy as the baseline; it checks the values its
allreduces wrote and exits non-zero when one is wrong. And the count of heap
allocations per steady-state allreduce on that path
(tf_ops/common/tests/bench/alloc_count.cc, issue 38 part 4)."""
import json
import os
import subprocess
import sys

import pytest

from support import ROOT
from tfring.build import core_module

SOURCE = os.path.join("tf_ops", "common", "tests", "gpu", "core_path_bench.cc")
ALLOC_SOURCE = os.path.join("tf_ops", "common", "tests", "bench", "alloc_count.cc")
# Heap allocations per cached 4 KB allreduce (submission, speculation, the
# plane, completion), on every thread: none after the warm-up (issue 38's
# target; 17 per call before its first pass, 1.05 before the request pool).


@pytest.fixture(scope="module")
def program(tmp_path_factory, monkeypatch_module):
    # No MPI: the program runs over TCP, and this is the lighter build.
    monkeypatch_module.setenv("TFRING_WITH_MPI", "0")
    monkeypatch_module.delenv("TFRING_WITH_NCCL", raising=False)
    out = str(tmp_path_factory.mktemp("program") / "core_path_bench")
    assert core_module.build_program(SOURCE, out, log=lambda m: None) == out
    return out


@pytest.fixture(scope="module")
def alloc_program(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("TFRING_WITH_MPI", "0")
    monkeypatch_module.delenv("TFRING_WITH_NCCL", raising=False)
    out = str(tmp_path_factory.mktemp("program") / "alloc_count")
    assert core_module.build_program(ALLOC_SOURCE, out, log=lambda m: None) == out
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _launch(np_, program, *args, env=None):
    """The program on `np_` ranks under tfringrun --tcp."""
    return subprocess.run(
        [sys.executable, "-m", "tfring.runner.launch", "-np", str(np_), "--tcp", "--timeout",
         "120", program, *args],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})))


def test_core_path_program_runs_every_size_and_mode(program):
    run = _launch(1, program, "4", "65536", "50", "3")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [json.loads(line[line.index("{"):]) for line in run.stdout.splitlines() if "{" in line]
    meta, rows = lines[0], lines[1:]
    assert meta["gpu"] is False and meta["iters"] == 50
    sizes = [4 << i for i in range(15)]  # 4 bytes .. 64 KiB, doubling
    assert [(r["bytes"], r["mode"]) for r in rows] == [
        (b, m) for b in sizes for m in ("latency", "pipelined")]
    assert all(r["core_us"] > 0 and r["raw_us"] > 0 and r["ratio"] > 0 for r in rows)


def test_core_path_program_needs_one_rank(program):
    run = _launch(2, program, "4", "4", "1", "1")
    assert run.returncode != 0
    assert "run at np=1" in run.stdout + run.stderr


@pytest.mark.parametrize("np_", [2, 3])
def test_cached_allreduces_allocate_nothing(alloc_program, np_):
    # 10,000 allreduces of one name after 1,000 of warm-up: the count covers
    # every thread of the process, the core's and the transport's.
    # The TCP world's heartbeat is a frame per half period of silence on a
    # connection (the shared-memory plane carries these collectives, so the
    # connections are silent): work per second, not per collective. Under
    # load the 10,000 calls outlast a 1 s heartbeat's half period, and its
    # frames were counted; a heartbeat longer than the run leaves them out.
    run = _launch(np_, alloc_program, "10000", "1000", "4096",
                  env={"TFRING_HEARTBEAT_SECONDS": "120"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line[line.index("{"):]) for line in run.stdout.splitlines() if "{" in line]
    assert sorted(r["rank"] for r in rows) == list(range(np_))
    for r in rows:
        assert r["calls"] == 10000
        assert r["allocations"] == 0, (
            f"rank {r['rank']} of {np_}: {r['allocations']} heap allocations in 10,000 cached "
            f"allreduces; rerun with ALLOC_COUNT_TRACE=8 (benchmarks/RESULTS_HOST_PATH.md) "
            f"to see where")
