"""tfring.torch against torch.distributed (NCCL) on the same GPU, per call.

Issue 38's torch target: an allreduce of a CUDA tensor through
``tfring.torch`` is no slower per call than ``torch.distributed`` with NCCL
on the same GPU, from 64 KB. Both run in this one process at np=1, on the
same tensors, in alternating rounds (so a disturbance of the machine hits
both alike), each with its own NCCL communicator:

  latency    one in-place allreduce, then ``torch.cuda.synchronize()``:
             what a step that needs the result at once pays
  pipelined  ``--iters`` in-place allreduces queued back to back, then one
             synchronize: the per-call cost when calls overlap

``tfring.torch`` runs ``allreduce_`` (latency) and ``allreduce_async_`` +
``synchronize`` (pipelined), as DistributedOptimizer does.

Run under the launcher, with a CUDA build of torch and a GPU build of
tfring.core (tests/gpu/run_on_gpu.sh's ``torch_bench`` step)::

    tfringrun -np 1 --tcp python benchmarks/gpu_torch.py --out DIR

``TFRING_TORCH_WORKER_DEVICE=cpu`` dry-runs it on CPU tensors (torch.distributed
over Gloo), to check the script without a GPU; its figures mean nothing.
Writes DIR/torch_vs_nccl.json and prints a table.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import tfring.torch as hvd

DEV = os.environ.get("TFRING_TORCH_WORKER_DEVICE", "cuda")


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn, iters):
    """Median over ``iters`` calls of fn then a synchronize, in us."""
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def timed_batch(fn, iters):
    """``iters`` calls of fn back to back, then one synchronize: us per call."""
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters * 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sizes-kb", default="64,256,1024,4096,16384,65536")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    hvd.init()
    if hvd.size() != 1:
        sys.exit("gpu_torch.py compares per-call costs at np=1; run it with -np 1")
    if DEV == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    store_dir = tempfile.mkdtemp(prefix="tfring-gpu-torch-")
    store_file = os.path.join(store_dir, "store")
    dist.init_process_group("nccl" if DEV == "cuda" else "gloo",
                            store=dist.FileStore(store_file, 1), rank=0, world_size=1)
    rows = []
    try:
        for kb in (int(s) for s in args.sizes_kb.split(",")):
            x = torch.ones(kb * 1024 // 4, dtype=torch.float32, device=DEV)
            name = f"bench.{kb}"
            ways = {
                "torch.distributed": lambda: dist.all_reduce(x),
                "tfring.torch": lambda: hvd.allreduce_(x, op=hvd.Sum, name=name),
            }
            # Warm-up: communicators, caches, the core's speculation.
            for _ in range(10):
                dist.all_reduce(x)
                hvd.allreduce_(x, op=hvd.Sum, name=name)
            sync()
            got = {k: {"latency": [], "pipelined": []} for k in ways}
            for _ in range(args.rounds):
                for way, call in ways.items():
                    got[way]["latency"].append(timed(call, args.iters))
                got["torch.distributed"]["pipelined"].append(
                    timed_batch(lambda: dist.all_reduce(x), args.iters))
                t0 = time.perf_counter()
                handles = [hvd.allreduce_async_(x, op=hvd.Sum, name=f"{name}.{i}")
                           for i in range(args.iters)]
                for h in handles:
                    hvd.synchronize(h)
                sync()
                got["tfring.torch"]["pipelined"].append(
                    (time.perf_counter() - t0) / args.iters * 1e6)
            row = {"size_kb": kb}
            for way in ways:
                for mode in ("latency", "pipelined"):
                    row[f"{way} {mode} us"] = round(min(got[way][mode]), 2)
            for mode in ("latency", "pipelined"):
                row[f"{mode}: torch.distributed / tfring.torch"] = round(
                    row[f"torch.distributed {mode} us"] / row[f"tfring.torch {mode} us"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        dist.destroy_process_group()
        shutil.rmtree(store_dir, ignore_errors=True)  # the store may remove its file itself
    os.makedirs(args.out, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
            "torch": torch.__version__, "iters": args.iters, "rounds": args.rounds,
            "note": "per call, best round's median (latency) or mean (pipelined); "
                    "a ratio >= 1 means tfring.torch is no slower"}
    with open(os.path.join(args.out, "torch_vs_nccl.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print("| size | torch.distributed lat us | tfring.torch lat us | ratio | "
          "torch.distributed pipe us | tfring.torch pipe us | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size_kb']} KB | {r['torch.distributed latency us']} | "
              f"{r['tfring.torch latency us']} | {r['latency: torch.distributed / tfring.torch']} | "
              f"{r['torch.distributed pipelined us']} | {r['tfring.torch pipelined us']} | "
              f"{r['pipelined: torch.distributed / tfring.torch']} |")
    hvd.shutdown()


if __name__ == "__main__":
    main()
