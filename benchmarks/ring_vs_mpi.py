"""Float32 allreduce through the tfring op (inside tf.function) on the ring
and hierarchical data planes against the MPI data plane, and against mpi4py's
Allreduce on numpy in the same launch.

    python benchmarks/ring_vs_mpi.py [--sizes 64K,1M,16M,64M] [--json out.json]

Launches, with tfringrun:
  np=2, one host:        MPI plane (TFRING_CPU_OPERATIONS=mpi) | ring forced (=ring)
  np=3, fake hosts a,a,b: MPI plane | flat ring (auto, cross-host cut-over 0)
                          | hierarchical (TFRING_HIERARCHICAL_ALLREDUCE=1)
and prints, per size, the median time of one allreduce (the slowest rank's
median; ranks are lined up by an MPI barrier before each call), algbw and
busbw (nccl-tests definitions: algbw = bytes / time, busbw = algbw * 2(n-1)/n).
TFRING_LIBRARY, if set, selects the op library for every rank.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = [
    ("np2", 2, "MPI", {"TFRING_CPU_OPERATIONS": "mpi"}),
    ("np2", 2, "ring", {"TFRING_CPU_OPERATIONS": "ring"}),
    ("np3 a,a,b", 3, "MPI", {"TFRING_CPU_OPERATIONS": "mpi", "TFRING_HOSTNAME": "a,a,b"}),
    ("np3 a,a,b", 3, "flat ring", {"TFRING_CPU_OPERATIONS": "auto", "TFRING_HOSTNAME": "a,a,b",
                                   "TFRING_CROSS_HOST_MIN_BYTES": "0"}),
    ("np3 a,a,b", 3, "hierarchical", {"TFRING_CPU_OPERATIONS": "auto",
                                      "TFRING_HOSTNAME": "a,a,b",
                                      "TFRING_CROSS_HOST_MIN_BYTES": "0",
                                      "TFRING_HIERARCHICAL_ALLREDUCE": "1"}),
]
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    text = text.strip().upper().rstrip("B")
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def human(nbytes):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def reps_for(nbytes):
    return 50 if nbytes <= (256 << 10) else 20 if nbytes <= (4 << 20) else 7


def rank_main(args):
    """Runs inside every rank: times the op and mpi4py, rank 0 writes JSON."""
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    import tfring.tensorflow as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    size = hvd.size()
    results = {"op": {}, "mpi4py": {}}

    @tf.function
    def step(x):
        return hvd.allreduce(x, op=hvd.Sum, name="bench")

    def timed(fn, reps, warmup=2):
        times = []
        for i in range(reps + warmup):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
        median = float(np.median(times))
        return max(comm.allgather(median))  # the slowest rank's median

    for nbytes in args.sizes:
        n = nbytes // 4
        x = tf.ones([n], tf.float32)
        out = step(x)
        assert float(out[0]) == size and float(out[-1]) == size, "wrong allreduce result"
        results["op"][nbytes] = timed(lambda: step(x), reps_for(nbytes))
        if args.mpi4py:
            buf = np.ones(n, np.float32)
            results["mpi4py"][nbytes] = timed(
                lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), reps_for(nbytes))
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    hvd.shutdown()


def launch(np_, env, sizes, mpi4py, timeout):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "tfring.runner.launch", "-np", str(np_), "--timeout",
           str(timeout), sys.executable, os.path.abspath(__file__), "--rank-mode", "--out", out,
           "--sizes", ",".join(str(s) for s in sizes)] + (["--mpi4py"] if mpi4py else [])
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout + 60)
    if proc.returncode != 0:
        sys.exit(f"benchmark launch failed ({env}):\n{proc.stdout[-5000:]}")
    if "data plane unavailable" in proc.stdout:
        print(f"warning: a data plane was unavailable in {env}; see:\n" +
              "\n".join(l for l in proc.stdout.splitlines() if "unavailable" in l))
    with open(out) as f:
        data = json.load(f)
    os.unlink(out)
    return ({int(k): v for k, v in data["op"].items()},
            {int(k): v for k, v in data["mpi4py"].items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64K,1M,16M,64M")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--mpi4py", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.rank_mode:
        args.sizes = [int(s) for s in args.sizes]
        return rank_main(args)

    rows = []
    for group, np_, label, env in CONFIGS:
        first = not any(r["group"] == group for r in rows)
        print(f"running {group}: {label} ...", file=sys.stderr, flush=True)
        op, mpi4py = launch(np_, env, args.sizes, mpi4py=first, timeout=args.timeout)
        for nbytes, t in sorted(mpi4py.items()):
            rows.append({"group": group, "np": np_, "plane": "mpi4py Allreduce", "bytes": nbytes,
                         "median_s": t})
        for nbytes, t in sorted(op.items()):
            rows.append({"group": group, "np": np_, "plane": f"tfring op, {label}",
                         "bytes": nbytes, "median_s": t})

    print(f"\n{'set':<10} {'size':>7}  {'path':<26} {'median ms':>10} {'algbw GB/s':>11} "
          f"{'busbw GB/s':>11}  {'vs MPI plane':>12}")
    for group in dict.fromkeys(r["group"] for r in rows):
        for nbytes in args.sizes:
            sel = [r for r in rows if r["group"] == group and r["bytes"] == nbytes]
            base = next((r["median_s"] for r in sel if r["plane"] == "tfring op, MPI"), None)
            for r in sel:
                t = r["median_s"]
                algbw = nbytes / t / 1e9
                busbw = algbw * 2 * (r["np"] - 1) / r["np"]
                ratio = f"{base / t:.2f}x" if base else ""
                print(f"{group:<10} {human(nbytes):>7}  {r['plane']:<26} {t * 1e3:>10.3f} "
                      f"{algbw:>11.2f} {busbw:>11.2f}  {ratio:>12}")
            print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
