#!/usr/bin/env bash
# The GPU checks of issue 22 in one command, for a machine with an NVIDIA GPU,
# nvcc, NCCL, CuPy and pytest, and no network (TensorFlow not needed):
#
#   bash tests/gpu/run_on_gpu.sh OUTDIR
#
# Builds the GPU variant of tfring.core (TFRING_WITH_NCCL=1), then runs, each
# step with its own time limit and log in OUTDIR:
#   cpp_harness  the GPU executor and NCCL plane in C++ at np=1
#                (tests/common/test_nccl_gpu.py)
#   core_gpu     tfring.core with CuPy: NCCL at np=1, host staging at np=2/3,
#                a killed rank, a training loop (tests/gpu/test_core_gpu.py)
#   bench        benchmarks/gpu.py (raw NCCL, the whole core path, staging)
#   torch_gpu    tfring.torch on CUDA tensors, its ranks run by $TORCH_PY
#                (default /opt/torch/.venv/bin/python3): NCCL at np=1, host
#                staging at np=2, DistributedOptimizer against one process
#                (tests/gpu/test_torch_gpu.py)
#   torch_bench  tfring.torch against torch.distributed (NCCL) per call, at
#                np=1 on the same GPU (benchmarks/gpu_torch.py)
# and writes OUTDIR/results.json (every step's exit code and time, the
# tests' outcomes, the benchmark rows). STEPS="build cpp_harness" runs some.
# Exits non-zero when a step failed. Made to finish in under 8 minutes.
set -uo pipefail
OUT=${1:?usage: bash tests/gpu/run_on_gpu.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
STEPS=${STEPS:-build cpp_harness core_gpu bench torch_gpu torch_bench}
TORCH_PY=${TORCH_PY:-/opt/torch/.venv/bin/python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
if command -v nvidia-smi >/dev/null; then
  nvidia-smi > "$OUT/device.txt" 2>&1
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
  [ -n "$cap" ] && export TFRING_CUDA_ARCHS=${TFRING_CUDA_ARCHS:-$cap}
fi
export TFRING_WITH_NCCL=${TFRING_WITH_NCCL:-1}
# tfring.core takes the build a user without nvcc gets (NVRTC kernels); the
# C++ harness and the benchmark compile gpu_kernels.cu with nvcc, so both
# variants of the kernels are checked. Only TCP is used here: no MPI needed.
export TFRING_GPU_KERNELS=${TFRING_GPU_KERNELS:-nvrtc}
export TFRING_WITH_MPI=${TFRING_WITH_MPI:-0}
export TFRING_REQUIRE_GPU=1  # the GPU tests fail rather than skip here
[ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ] && export CUDA_HOME=/usr/local/cuda
# The distribution's compiler: the lent GPU machine's $CXX (/opt/gcc/bin/g++)
# is a wrapper that mixes GCC's header trees, and a module it built crashed
# inside libstdc++ (ostream << double) on the first collective.
[ -z "${TFRING_KEEP_CXX:-}" ] && [ -x /usr/bin/g++ ] && export CXX=/usr/bin/g++
# A cache of its own: the cache key does not include the compiler.
export TFRING_CACHE_DIR=${TFRING_CACHE_DIR:-$PWD/build/gpu-cache}
{
  echo "python: $(command -v "$PY") ($($PY --version 2>&1))"
  $PY -c "import cupy, numpy, pybind11; print('cupy', cupy.__version__, 'numpy', numpy.__version__)" 2>&1
  command -v nvcc && nvcc --version | tail -2
  $PY -c "from tfring.build import cuda; print('nccl', cuda.find_nccl()); print('runtime', cuda.find_cuda_runtime()); print('kernels', cuda.kernel_compiler(cuda.find_cuda_runtime()))" 2>&1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export TFRING_BUILD_JOBS=${TFRING_BUILD_JOBS:-$(nproc)}
failed=0

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2 start rc
  shift 2
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name: $*"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - start )), \"limit\": $limit}" >> "$OUT/steps.jsonl"
  tail -n 25 "$OUT/$name.log"
  echo "== $name: exit $rc after $(( $(date +%s) - start )) s"
  [ "$rc" = 0 ] || failed=1
}

rm -f "$OUT/steps.jsonl"
# -o addopts=: not pyproject.toml's default options (two xdist workers):
# the GPU tests run one at a time, and this machine's Python may lack xdist.
step build 180 $PY -m tfring.build core
step cpp_harness 150 $PY -m pytest -o addopts= -m gpu tests/common/test_nccl_gpu.py -v -s -p no:cacheprovider
step core_gpu 220 $PY -m pytest -o addopts= -m gpu tests/gpu/test_core_gpu.py -v -s -p no:cacheprovider \
  --junitxml="$OUT/core_gpu.xml"
step bench 240 $PY benchmarks/gpu.py --out "$OUT/bench" --iters 20 --rounds 3
step torch_gpu 150 env TFRING_TORCH_PYTHON="$TORCH_PY" $PY -m pytest -o addopts= -m gpu \
  tests/gpu/test_torch_gpu.py -v -s -p no:cacheprovider --junitxml="$OUT/torch_gpu.xml"
# The module for the torch interpreter first (torch_gpu builds it too, when run).
step torch_bench 150 bash -c "PYTHONPATH=$PWD '$TORCH_PY' -c 'from tfring.build import core_module; \
core_module.ensure_module()' && $PY -m tfring.runner.launch -np 1 --tcp --timeout 120 \
'$TORCH_PY' benchmarks/gpu_torch.py --out '$OUT/bench' --iters 30 --rounds 3"

$PY - "$OUT" <<'PYEOF' > "$OUT/results.json"
import json, os, sys
import xml.etree.ElementTree as ET
out = sys.argv[1]
res = {"steps": [json.loads(l) for l in open(os.path.join(out, "steps.jsonl"))]}
if os.path.exists(os.path.join(out, "device.txt")):
    res["device"] = open(os.path.join(out, "device.txt")).read()
for step in ("core_gpu", "torch_gpu"):
    xml = os.path.join(out, step + ".xml")
    if not os.path.exists(xml):
        continue
    tests = []
    for case in ET.parse(xml).iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        tests.append({"test": case.get("name"), "outcome": outcome,
                      "seconds": float(case.get("time", 0))})
    res[step + "_tests"] = tests
bench = os.path.join(out, "bench", "gpu_allreduce.json")
if os.path.exists(bench):
    res["bench"] = json.load(open(bench))
torch_bench = os.path.join(out, "bench", "torch_vs_nccl.json")
if os.path.exists(torch_bench):
    res["torch_bench"] = json.load(open(torch_bench))
print(json.dumps(res, indent=1))
PYEOF
echo "results: $OUT/results.json"
exit $failed
