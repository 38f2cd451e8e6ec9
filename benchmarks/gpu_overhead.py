"""Where the whole core path's fixed cost per GPU collective goes (issue 22:
the core adds ~70-150 us to a 1 MB NCCL allreduce at np=1). One rank, under
``tfringrun -np 1 --tcp``; prints one table. Each row is the median per call
over ``--iters`` calls, in the same process:

  cupy event      record + query a CUDA event (the ready event's floor)
  cpu 4 B         tfring.core allreduce of a 4-byte numpy array (the core's
                  own round trip: enqueue, negotiation, callback, wake-up)
  cpu 1 MB        the same, 1 MB
  gpu submit      allreduce_async of a 1 MB CuPy array (Python + enqueue)
  gpu wait        then .wait() on it
  gpu 1 MB        allreduce, submit and wait together
and then the Python functions that took the most time over the GPU calls
(cProfile; the wait itself is C++ with the GIL released).

    python -m tfring.runner.launch -np 1 --tcp python benchmarks/gpu_overhead.py
"""
import argparse
import cProfile
import io
import pstats
import statistics
import time

import cupy as cp
import numpy as np

import tfring.core as hvd


def per_call(fn, iters):
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=300)
    args = p.parse_args()
    hvd.init()
    cp.cuda.Device(0).use()
    n = (1 << 20) // 4
    x = cp.ones(n, dtype=cp.float32)
    tiny, host = np.ones(1, np.float32), np.ones(n, np.float32)
    event = cp.cuda.Event(disable_timing=True)

    def record_query():
        event.record()
        while not event.done:
            pass

    rows = {}
    for _ in range(2):  # the first pass warms every path up
        rows["cupy event"] = per_call(record_query, args.iters)
        rows["cpu 4 B"] = per_call(lambda: hvd.allreduce(tiny, op=hvd.Sum, name="t"), args.iters)
        rows["cpu 1 MB"] = per_call(lambda: hvd.allreduce(host, op=hvd.Sum, name="h"), args.iters)
        submit, wait = [], []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            h = hvd.allreduce_async(x, op=hvd.Sum, name="g")
            t1 = time.perf_counter()
            h.wait()
            t2 = time.perf_counter()
            submit.append(t1 - t0)
            wait.append(t2 - t1)
        rows["gpu submit"] = statistics.median(submit) * 1e6
        rows["gpu wait"] = statistics.median(wait) * 1e6
        rows["gpu 1 MB"] = per_call(lambda: hvd.allreduce(x, op=hvd.Sum, name="g"), args.iters)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.iters):
        hvd.allreduce(x, op=hvd.Sum, name="g")
    prof.disable()
    if hvd.rank() == 0:
        print("| what | us per call |\n|---|---|")
        for k, v in rows.items():
            print(f"| {k} | {v:.1f} |")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())
    hvd.shutdown()


if __name__ == "__main__":
    main()
