"""Allreduce micro-benchmark: the tfring op inside tf.function, on the data
plane TFRING_CPU_OPERATIONS picks (shm, mpi, auto...), against mpi4py's
``comm.Allreduce`` on numpy arrays in the same launch.

Run one launch per plane::

    TFRING_CPU_OPERATIONS=shm tfringrun -np 2 python benchmarks/shm_vs_mpi.py
    TFRING_CPU_OPERATIONS=mpi tfringrun -np 2 python benchmarks/shm_vs_mpi.py

or let the script launch both and print one table::

    python benchmarks/shm_vs_mpi.py --np 2 [--np 3] [--sizes 4K,64K,1M,16M,64M] [--priority]
        [--plane-times]

(--priority raises the ranks' CPU share, for a machine busy with other work;
--plane-times adds the data-plane phase alone, read from a timeline, which
leaves out negotiation and the copies around the collective.)

Times are medians over iterations, each started together on every rank
(an MPI barrier before each), as measured on rank 0. Bandwidths follow
nccl-tests: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

DEFAULT_SIZES = "4K,64K,1M,16M,64M"


def parse_size(text):
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def human(nbytes):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def iterations(nbytes):
    if nbytes <= 64 << 10:
        return 300
    if nbytes <= 1 << 20:
        return 100
    if nbytes <= 16 << 20:
        return 20
    return 10


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def busbw(nbytes, seconds, n):
    return nbytes / seconds * 2 * (n - 1) / n / 1e9


def raise_priority():
    """On a machine shared with other work, gives this rank a larger CPU
    share so the timings measure tfring rather than the neighbours. With
    autogroup scheduling (Linux's default) plain nice only ranks a process
    within its own session, so the session's autogroup is raised instead.
    Needs root or CAP_SYS_NICE; silently does nothing without it."""
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("-20")
    except OSError:
        pass
    try:
        os.nice(-20)
    except OSError:
        pass


def worker(sizes):
    """Runs inside every rank; rank 0 prints one JSON line per size."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if os.environ.get("TFRING_BENCH_PRIORITY") == "1":
        raise_priority()
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    import tfring.tensorflow as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    plane = os.environ.get("TFRING_CPU_OPERATIONS", "auto")
    for nbytes in sizes:
        n = nbytes // 4
        x = tf.ones([n], tf.float32) * float(hvd.rank() + 1)

        @tf.function
        def step(t):
            return hvd.allreduce(t, op=hvd.Sum, name=f"bench_{nbytes}")

        iters = iterations(nbytes)
        tfring_times = []
        for i in range(iters + 3):
            comm.Barrier()
            start = time.perf_counter()
            out = step(x)
            out = out.numpy() if i == 0 else out  # the first result is checked below
            tfring_times.append(time.perf_counter() - start)
            if i == 0:
                want = float(sum(range(1, hvd.size() + 1)))
                assert out[0] == want and out[-1] == want, "wrong allreduce result"
        a = np.full(n, float(comm.rank + 1), np.float32)
        b = np.empty_like(a)
        mpi_times = []
        for i in range(iters + 3):
            comm.Barrier()
            start = time.perf_counter()
            comm.Allreduce(a, b)
            mpi_times.append(time.perf_counter() - start)
        if comm.rank == 0:
            print("RESULT " + json.dumps({
                "plane": plane, "np": comm.size, "bytes": nbytes,
                "tfring_s": median(tfring_times[3:]), "mpi4py_s": median(mpi_times[3:])}),
                flush=True)
    hvd.shutdown()


def plane_times(timeline_path):
    """{tensor name: median duration (s) of its data-plane phase} from a
    timeline: the collective alone, without negotiation or copies."""
    import collections
    with open(timeline_path) as f:
        text = f.read().rstrip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    events = json.loads(text)
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    durations = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("name", "").endswith("_ALLREDUCE"):
            durations[rows.get(e["pid"])].append(e["dur"] * 1e-6)
    return {name: median(d) for name, d in durations.items()}


def launch(np_, plane, sizes, library, timeout, priority, timeline=None):
    env = dict(os.environ, TFRING_CPU_OPERATIONS=plane, TF_CPP_MIN_LOG_LEVEL="2")
    if priority:
        env["TFRING_BENCH_PRIORITY"] = "1"
    if timeline:
        env["TFRING_TIMELINE"] = timeline
    if plane == "shm":
        env["TFRING_SHM_MIN_BYTES"] = "0"
    if library:
        env["TFRING_LIBRARY"] = library
    cmd = [sys.executable, "-m", "tfring.runner.launch", "-np", str(np_), "--timeout",
           str(timeout), sys.executable, os.path.abspath(__file__), "--worker", "--sizes",
           ",".join(str(s) for s in sizes)]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=timeout + 60)
    results = {}
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            r = json.loads(line.split("RESULT ", 1)[1])
            results[r["bytes"]] = r
    if out.returncode != 0 or len(results) != len(sizes):
        sys.exit(f"{plane} launch at np={np_} failed (exit {out.returncode}):\n{out.stdout[-5000:]}")
    if timeline:
        inside = plane_times(timeline)
        for nbytes, r in results.items():
            r["plane_s"] = inside.get(f"bench_{nbytes}")
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help="run as a rank (under tfringrun)")
    parser.add_argument("--np", type=int, action="append", help="launch at this many ranks")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated, e.g. 4K,1M,64M")
    parser.add_argument("--planes", default="shm,mpi", help="values of TFRING_CPU_OPERATIONS")
    parser.add_argument("--library", default=os.environ.get("TFRING_LIBRARY"),
                        help="a tfring build to use (TFRING_LIBRARY)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--priority", action="store_true",
                        help="raise the ranks' CPU share (root only), for a busy shared machine")
    parser.add_argument("--plane-times", action="store_true",
                        help="also show the data-plane phase alone (from a timeline)")
    args = parser.parse_args()
    sizes = [parse_size(s) if not s.isdigit() else int(s) for s in args.sizes.split(",")]
    if args.worker or not args.np:
        worker(sizes)
        return
    planes = args.planes.split(",")
    for np_ in args.np:
        runs = {}
        with tempfile.TemporaryDirectory() as tmp:
            for p in planes:
                timeline = os.path.join(tmp, f"{p}.json") if args.plane_times else None
                runs[p] = launch(np_, p, sizes, args.library, args.timeout, args.priority,
                                 timeline)
        print(f"\nnp={np_}, float32 allreduce, medians (busbw in GB/s)")
        header = f"{'size':>6}"
        for p in planes:
            header += f" | {'tfring/' + p:>12} {'busbw':>6}"
        header += f" | {'mpi4py':>10} {'busbw':>6}"
        if len(planes) > 1:
            header += " | " + " ".join(f"{planes[0]}/{p}" for p in planes[1:]) + " (speed-up)"
        header += f" | {planes[0]}/mpi4py"
        print(header)
        for nbytes in sizes:
            row = f"{human(nbytes):>6}"
            for p in planes:
                t = runs[p][nbytes]["tfring_s"]
                row += f" | {t * 1e3:9.3f} ms {busbw(nbytes, t, np_):6.2f}"
            # mpi4py from every launch: the best is the fairest baseline.
            m = min(runs[p][nbytes]["mpi4py_s"] for p in planes)
            row += f" | {m * 1e3:7.3f} ms {busbw(nbytes, m, np_):6.2f}"
            first = runs[planes[0]][nbytes]["tfring_s"]
            if len(planes) > 1:
                row += " | " + " ".join(f"{runs[p][nbytes]['tfring_s'] / first:5.2f}x"
                                        for p in planes[1:])
            row += f" | {m / first:5.2f}x"
            if args.plane_times:
                row += " | plane alone: " + ", ".join(
                    f"{p} {runs[p][nbytes]['plane_s'] * 1e3:.3f} ms"
                    for p in planes if runs[p][nbytes].get("plane_s"))
            print(row, flush=True)


if __name__ == "__main__":
    main()
