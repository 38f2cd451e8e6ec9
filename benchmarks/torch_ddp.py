"""tfring.torch against PyTorch's own DistributedDataParallel (gloo), in the
same job: allreduce bus bandwidth at 4 KB, 1 MB and 64 MB, and the step time
of one small CNN trained both ways.

Run:  tfringrun -np 2 python benchmarks/torch_ddp.py [--steps 30] [--json out.json]

Each rank runs both: tfring.torch through its own controller, and a gloo
process group (torch.distributed, TCP on localhost) beside it. Every
measurement alternates the two in rounds, so load changes hit both alike;
the median round is reported. busbw = 2(n-1)/n x bytes / time (float32).
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import tfring.torch as hvd

SIZES = [("4 KB", 4 << 10), ("1 MB", 1 << 20), ("64 MB", 64 << 20)]


def _timed(fn, iters):
    fn()  # warm-up (and, for tfring, the response cache)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def allreduce_rows(rounds):
    n = hvd.size()
    rows = []
    for label, nbytes in SIZES:
        x = torch.ones(nbytes // 4)
        iters = max(3, min(200, (256 << 20) // nbytes // 4))
        ours, gloo = [], []
        for _ in range(rounds):
            ours.append(_timed(lambda: hvd.allreduce_(x, op=hvd.Sum, name=f"bench{nbytes}"),
                               iters))
            dist.barrier()
            gloo.append(_timed(lambda: dist.all_reduce(x), iters))
            hvd.barrier()
        factor = 2 * (n - 1) / n * nbytes / 1e9
        t_ours, t_gloo = statistics.median(ours), statistics.median(gloo)
        rows.append({"size": label, "tfring_busbw_GBps": factor / t_ours,
                     "gloo_busbw_GBps": factor / t_gloo,
                     "ratio": t_gloo / t_ours, "tfring_ms": t_ours * 1e3,
                     "gloo_ms": t_gloo * 1e3})
    return rows


def cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def step_rows(steps, rounds, batch):
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    ddp_model = torch.nn.parallel.DistributedDataParallel(cnn())
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)
    model = cnn()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())

    def step(m, o):
        o.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        o.step()

    ours, ddp = [], []
    for _ in range(rounds):
        ours.append(_timed(lambda: step(model, opt), steps))
        dist.barrier()
        ddp.append(_timed(lambda: step(ddp_model, ddp_opt), steps))
        hvd.barrier()
    params = sum(p.numel() for p in model.parameters())
    return {"model": f"CNN, {params} parameters, batch {batch} per rank",
            "tfring_step_ms": statistics.median(ours) * 1e3,
            "ddp_step_ms": statistics.median(ddp) * 1e3}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    rows = allreduce_rows(args.rounds)
    train = step_rows(args.steps, args.rounds, args.batch)
    if hvd.rank() == 0:
        print(f"np={hvd.size()}, load {os.getloadavg()}")
        print("| size | tfring.torch busbw (GB/s) | gloo busbw (GB/s) | tfring / gloo |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r['size']} | {r['tfring_busbw_GBps']:.3f} | {r['gloo_busbw_GBps']:.3f} "
                  f"| {r['ratio']:.2f}x |")
        print(f"\nstep time ({train['model']}): tfring.torch DistributedOptimizer "
              f"{train['tfring_step_ms']:.1f} ms, DDP(gloo) {train['ddp_step_ms']:.1f} ms")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"allreduce": rows, "step": train, "np": hvd.size()}, f, indent=1)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
