"""The GPU path end to end through ``tfring.core`` with CuPy arrays (no
TensorFlow): NCCL at np=1; host staging at np=2 and 3 on one GPU (NCCL
refuses two ranks on one GPU) under ``tfringrun --tcp``; the hierarchical
allreduce over 2 and 3 fake hosts; a killed rank; a small training loop
against its single-process reference.

Marked ``gpu``: needs an NVIDIA GPU, CuPy and a GPU build of the core module
(``TFRING_WITH_NCCL=1``); ``tests/gpu/run_on_gpu.sh`` runs it. Never needed
by CI."""
import json
import os

import pytest

from support import ROOT, missing_gpu, rank_lines, tfringrun

pytestmark = pytest.mark.gpu

WORKER = os.path.join(ROOT, "tests", "gpu", "core_worker.py")


@pytest.fixture(scope="module", autouse=True)
def gpu_core():
    try:
        import cupy as cp
    except ImportError:
        missing_gpu("needs CuPy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            missing_gpu("no NVIDIA GPU")
    except cp.cuda.runtime.CUDARuntimeError:
        missing_gpu("no NVIDIA GPU")
    import tfring.core as core
    if not core.nccl_built():
        pytest.fail("tfring.core is not a GPU build (build it with TFRING_WITH_NCCL=1)")


def run(np_, check, env=None, timeout=300):
    result = tfringrun(np_, ["python", WORKER, check], timeout=timeout, env=env, controller="tcp")
    results = [json.loads(text[len("RESULT "):]) for _, text in rank_lines(result.stdout)
               if text.startswith("RESULT ")]
    return result, results


@pytest.mark.parametrize("np_", [1])
def test_nccl_collectives_at_np1(np_, tmp_path):
    timeline = tmp_path / "timeline.json"
    result, results = run(np_, "collectives", env={"TFRING_TIMELINE": str(timeline)})
    assert result.returncode == 0, result.stdout[-20000:]
    assert len(results) == np_
    print(json.dumps(results))
    for r in results:
        assert r["nccl_built"] is True
        # Nothing was staged through host memory: every tensor stayed on its GPU.
        assert r["host_copies"] == 0, r
    text = timeline.read_text()
    assert "NCCL_ALLREDUCE" in text and "NCCL_ALLGATHER" in text, text[:2000]


@pytest.mark.parametrize("np_", [2, 3])
def test_host_staged_collectives(np_, tmp_path):
    timeline = tmp_path / "timeline.json"
    result, results = run(np_, "collectives", env={"TFRING_TIMELINE": str(timeline)})
    assert result.returncode == 0, result.stdout[-20000:]
    assert sorted(r["rank"] for r in results) == list(range(np_))
    print(json.dumps(results))
    for r in results:
        assert r["host_copies"] > 0, r  # staged, as NCCL cannot run two ranks on one GPU
    text = timeline.read_text()
    assert "NCCL_" not in text and "_ALLREDUCE" in text, text[:2000]


@pytest.mark.parametrize("np_", [2, 3])
def test_hierarchical_allreduce_over_fake_hosts(np_, tmp_path):
    """One rank per fake host, so that each host's NCCL communicator has a
    GPU to itself: NCCL within the hosts, the ring across them, and no
    tensor staged through the host by the executor."""
    timeline = tmp_path / "timeline.json"
    hosts = ",".join("abc"[:np_])
    result, results = run(np_, "hierarchical", env={
        "TFRING_HOSTNAME": hosts, "TFRING_HIERARCHICAL_ALLREDUCE": "1",
        "TFRING_TIMELINE": str(timeline)})
    assert result.returncode == 0, result.stdout[-20000:]
    assert sorted(r["rank"] for r in results) == list(range(np_))
    print(json.dumps(results))
    for r in results:
        assert r["host_copies"] == 0, r
    assert "NCCL_HIERARCHICAL_ALLREDUCE" in timeline.read_text()


def test_forced_host_staging_at_np1():
    result, results = run(1, "collectives", env={"TFRING_GPU_OPERATIONS": "host"})
    assert result.returncode == 0, result.stdout[-20000:]
    assert results[0]["host_copies"] > 0


@pytest.mark.parametrize("np_", [3])
def test_killed_rank_ends_pending_gpu_collectives(np_):
    result, results = run(np_, "kill", timeout=180)
    assert result.returncode != 0  # rank 1 died
    survivors = {r["rank"]: r for r in results}
    assert sorted(survivors) == [0, 2], result.stdout[-20000:]
    for r in survivors.values():
        assert "rank 1" in r["message"], r
        assert r["seconds"] < 60, r


@pytest.mark.parametrize("np_", [1, 2])
def test_training_equals_single_process_reference(np_):
    result, results = run(np_, "train")
    assert result.returncode == 0, result.stdout[-20000:]
    assert len(results) == np_
    print(json.dumps(results))
