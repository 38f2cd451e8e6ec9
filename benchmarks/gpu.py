"""NCCL data plane allreduce against raw NCCL, on the GPU machine, at np=1.

Builds tf_ops/common/tests/gpu/nccl_gpu_bench.cc with nvcc (against the
libnccl.so.2 that tfring.build.cuda finds), runs it, and writes the results
as JSON and as a Markdown table. Both sides run in the same process, on the
same stream, over the same libnccl.so.2, in alternating rounds.

At np=1 NCCL's bus-bandwidth factor 2(n-1)/n is 0, so the table gives time
and algorithm bandwidth (bytes / time); the target is the plane at >= 90% of
raw NCCL at every size >= 1 MB.

Usage (from the repository root, on a machine with a GPU, nvcc and NCCL):
    python benchmarks/gpu.py --out DIR [--min-mb 1] [--max-mb 256] [--iters 100] [--rounds 5]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfring.build import cuda  # noqa: E402


def _smi(query):
    run = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60)
    return run.stdout.strip().splitlines()[0] if run.returncode == 0 and run.stdout else "?"


def build(out_dir):
    arch = _smi("compute_cap").replace(".", "")
    binary = os.path.join(out_dir, "nccl_gpu_bench")
    cmd = cuda.gpu_test_command(
        os.path.join(ROOT, "tf_ops", "common", "tests", "gpu", "nccl_gpu_bench.cc"), binary,
        arch=arch if arch.isdigit() else None)
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=600)
    return binary, cmd


def table(rows, header):
    lines = [header, "",
             "| size | op | mode | raw NCCL | raw + event | plane | plane algbw | plane / raw | "
             "plane / (raw + event) | enqueue raw / plane |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mb = r["bytes"] / (1 << 20)
        lines.append(
            f"| {mb:g} MB | {r['op']} | {r['mode']} | {r['raw_us']:.1f} us | "
            f"{r['raw_events_us']:.1f} us | {r['plane_us']:.1f} us | "
            f"{r['plane_algbw_gbs']:.0f} GB/s | {100 * r['ratio']:.1f}% | "
            f"{100 * r['ratio_vs_raw_events']:.1f}% | "
            f"{r['raw_enqueue_us']:.1f} / {r['plane_enqueue_us']:.1f} us |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu"))
    p.add_argument("--min-mb", type=int, default=1)
    p.add_argument("--max-mb", type=int, default=256)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if shutil.which("nvidia-smi") is None:
        sys.exit("benchmarks/gpu.py needs an NVIDIA GPU (nvidia-smi not found)")
    os.makedirs(args.out, exist_ok=True)
    binary, build_cmd = build(args.out)
    run_cmd = [binary, str(args.min_mb), str(args.max_mb), str(args.iters), str(args.rounds)]
    print("$ " + " ".join(run_cmd), flush=True)
    start = time.time()
    run = subprocess.run(run_cmd, capture_output=True, text=True, timeout=540)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        sys.exit(f"benchmark failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    meta, rows = records[0], records[1:]
    meta.update(gpu=_smi("name"), driver=_smi("driver_version"), build_command=build_cmd,
                run_command=run_cmd, seconds=round(time.time() - start, 1))
    with open(os.path.join(args.out, "gpu_allreduce.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    header = (f"NCCL plane vs raw NCCL allreduce, float32, np=1, {meta['device']} "
              f"(driver {meta['driver']}), NCCL {meta['nccl_version']}, "
              f"{meta['iters']} iterations x {meta['rounds']} rounds, median round")
    text = table(rows, header)
    with open(os.path.join(args.out, "gpu_allreduce.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    for key, what in (("ratio", "raw NCCL"), ("ratio_vs_raw_events", "raw NCCL + event")):
        for mode in ("pipelined", "latency"):
            ratios = [r[key] for r in rows if r["bytes"] >= (1 << 20) and r["mode"] == mode]
            if ratios:
                print(f"worst plane / {what}, {mode}, >= 1 MB: {100 * min(ratios):.1f}% "
                      "(target >= 90%)")


if __name__ == "__main__":
    main()
