"""When gradient compression pays (issue 39, part 4): step time and final
accuracy of a communication-bound model with Compression.none, fp16, bf16
and powersgd, on fake hosts with shaped and unshaped links.

    python benchmarks/compression.py [--rates 1gbit,unlimited] [--hosts 3]
        [--steps 150] [--hidden 2048] [--md benchmarks/RESULTS_COMPRESSION.md]

Needs root (fake hosts are network namespaces, tests/netns_support.py; the
links are shaped with tc tbf as in benchmarks/cross_host.py). One rank per
fake host, under `tfringrun --tcp -H h0:1,h1:1,...`. The model is an MLP
64 -> hidden -> hidden -> 10 (with hidden=2048, 4.35 M parameters: 17 MB of
float32 gradients a step) trained with tfring.torch's DistributedOptimizer
(SGD, momentum 0.9) on sklearn's digits (1437 training images, 360 held
out), 32 rows per rank per step. Step time: the median over the steps after
PowerSGD's start_step; accuracy: on the held-out images after the last step.
"""
import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
START_STEP = 20   # PowerSGD's uncompressed warm-up
POWERSGD_RANK = 4
ROWS = 32         # per rank per step


# ---------------------------------------------------------------- rank side

def rank_main(args):
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import tfring.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0)
    results = {}
    for name in args.compressions.split(","):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
            torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
            torch.nn.Linear(args.hidden, 10))
        compression = (hvd.Compression.powersgd(rank=POWERSGD_RANK, start_step=START_STEP)
                       if name == "powersgd" else getattr(hvd.Compression, name))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            named_parameters=model.named_parameters(), compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        g = torch.Generator().manual_seed(1)
        times = []
        for step in range(args.steps):
            order = torch.randperm(len(xtr), generator=g)[:ROWS * hvd.size()]
            rows = order[hvd.rank() * ROWS:(hvd.rank() + 1) * ROWS]
            hvd.allreduce(torch.zeros(1), name=f"lineup.{name}.{step}")
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xtr[rows]), ytr[rows]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        with torch.no_grad():
            accuracy = (model(xte).argmax(1) == yte).float().mean().item()
        slowest = hvd.allreduce(torch.tensor(times[START_STEP + 1:]), op=hvd.Max,
                                name=f"times.{name}")
        results[name] = {"step_s": float(np.median(slowest.numpy())), "accuracy": accuracy,
                         "gradient_mb": sum(p.numel() for p in model.parameters()) * 4 / 1e6}
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)


# ---------------------------------------------------------------- driver side

def run_rate(rate, n_hosts, args):
    import cross_host
    import netns_support
    names = [f"h{i}" for i in range(n_hosts)]
    with netns_support.FakeHosts(names) as hosts, tempfile.TemporaryDirectory() as tmp:
        if rate != "unlimited":
            hosts.shape(rate)
            for n in names:
                if len(hosts.shaping(n)) != 2:
                    raise RuntimeError(f"fake host {n} is not shaped: {hosts.shaping(n)}")
        hosts.ssh_command(tmp)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PATH=tmp + os.pathsep + os.environ["PATH"])
        out = os.path.join(tmp, "out.json")
        load_before = cross_host.load()
        cmd = [sys.executable, "-m", "tfring.runner.launch", "-np", str(n_hosts), "--tcp",
               "--timeout", str(args.timeout), "-H", ",".join(f"{n}:1" for n in names),
               "--network-interfaces", hosts.interfaces(), sys.executable,
               os.path.abspath(__file__), "--rank", "--out", out, "--steps", str(args.steps),
               "--hidden", str(args.hidden), "--compressions", args.compressions]
        results = cross_host.run(cmd, env, args.timeout + 60, out)
        return {"rate": rate, "hosts": n_hosts, "results": results,
                "load": f"{load_before} -> {cross_host.load()}"}


def markdown(cells, args):
    lines = [f"Command: `python benchmarks/compression.py --rates {args.rates} --hosts "
             f"{args.hosts} --steps {args.steps} --hidden {args.hidden}` "
             f"(PowerSGD rank {POWERSGD_RANK}, start_step {START_STEP}).\n"]
    for cell in cells:
        first = next(iter(cell["results"].values()))
        lines.append(f"\n### {cell['rate']}, {cell['hosts']} fake hosts x 1 rank; "
                     f"{first['gradient_mb']:.1f} MB of float32 gradients a step; "
                     f"load {cell['load']}\n")
        lines.append("| compression | step time (median) | vs none | held-out accuracy |")
        lines.append("|---|---|---|---|")
        base = cell["results"].get("none", {}).get("step_s")
        for name, r in cell["results"].items():
            speed = f"{base / r['step_s']:.2f}x" if base else "-"
            lines.append(f"| {name} | {r['step_s'] * 1e3:.1f} ms | {speed} | "
                         f"{r['accuracy'] * 100:.1f}% |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out")
    p.add_argument("--rates", default="1gbit,unlimited")
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--compressions", default=",".join(COMPRESSIONS))
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args()
    if args.rank:
        return rank_main(args)
    import netns_support
    if not netns_support.available():
        sys.exit("compression.py needs root (network namespaces for the fake hosts)")
    cells = [run_rate(rate, args.hosts, args) for rate in args.rates.split(",")]
    text = markdown(cells, args)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cells, f, indent=1)
    if args.md:
        with open(args.md, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
