"""The GPU path through ``tfring.torch`` with CUDA tensors: NCCL at np=1,
host staging at np=2 on one GPU, and DistributedOptimizer against its
single-process reference on the GPU.

Marked ``gpu``: needs an NVIDIA GPU, a CUDA build of torch and a GPU build
of tfring.core (``TFRING_WITH_NCCL=1``); tests/gpu/run_on_gpu.sh runs it (its
``torch_gpu`` step, with the machine's torch interpreter). Never needed by CI."""
import json
import os
import subprocess
import sys

import pytest

from support import ROOT, missing_gpu, rank_lines, tfringrun

pytestmark = pytest.mark.gpu

WORKER = os.path.join(ROOT, "tests", "gpu", "torch_worker.py")
# The ranks' interpreter: one with a CUDA build of torch (the GPU machine's
# has no CuPy, the one running pytest may have no torch).
PYTHON = os.environ.get("TFRING_TORCH_PYTHON", sys.executable)


@pytest.fixture(scope="module", autouse=True)
def gpu_torch():
    probe = subprocess.run(
        [PYTHON, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        missing_gpu(f"needs torch in {PYTHON}: {probe.stderr[-2000:]}")
    if probe.stdout.strip() != "True":
        missing_gpu(f"no CUDA device for torch in {PYTHON}")
    # Built (or found in the cache) for the ranks' interpreter before they
    # start, each within its job's timeout.
    build = subprocess.run(
        [PYTHON, "-c", "from tfring.build import core_module; core_module.ensure_module(); "
                       "import tfring.core as c; print(c.nccl_built())"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-5000:]
    if build.stdout.strip().splitlines()[-1:] != ["True"]:
        pytest.fail("tfring.core is not a GPU build (build it with TFRING_WITH_NCCL=1)")


def run(np_, check, timeout=240):
    result = tfringrun(np_, [PYTHON, WORKER, check], timeout=timeout, controller="tcp")
    results = [json.loads(text[len("RESULT "):]) for _, text in rank_lines(result.stdout)
               if text.startswith("RESULT ")]
    assert result.returncode == 0, result.stdout[-20000:]
    assert sorted(r["rank"] for r in results) == list(range(np_)), result.stdout[-20000:]
    print(json.dumps(results))
    return results


def test_nccl_collectives_at_np1():
    (r,) = run(1, "collectives")
    assert r["nccl_built"] is True
    assert r["host_copies"] == 0, r  # every tensor stayed on the GPU


def test_host_staged_collectives_at_np2():
    for r in run(2, "collectives"):
        assert r["host_copies"] > 0, r  # NCCL cannot run two ranks on one GPU


@pytest.mark.parametrize("np_", [1, 2])
def test_distributed_optimizer_equals_single_process_on_the_gpu(np_):
    for r in run(np_, "train"):
        assert max(r["max_abs_diff"].values()) < 1e-5, r
