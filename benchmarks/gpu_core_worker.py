"""One rank of benchmarks/gpu.py's core-path measurements (CuPy through
``tfring.core``). Run under ``tfringrun --tcp``; prints ``BENCH <json>``
lines on rank 0.

  nccl   allreduce through the whole core (enqueue, negotiation, the GPU
         executor and the NCCL plane) at np=1: latency mode (each allreduce
         waited for) and pipelined mode (`iters` submitted, then waited for)
  staged allreduce of GPU arrays through host staging against its parts done
         by hand: device-to-host copy, the CPU planes on a numpy array,
         host-to-device copy
"""
import json
import statistics
import sys
import time

import cupy as cp
import numpy as np

import tfring.core as hvd
from tfring.core import _module


def speculation():
    """The global set's speculation counters (responses run without a
    negotiation round; `inline`: run by the submitting thread)."""
    return dict(_module.load().speculation_stats())


def median_time(fn, rounds):
    times = []
    for _ in range(rounds):
        cp.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        fn()
        cp.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def emit(**fields):
    if hvd.rank() == 0:
        print("BENCH " + json.dumps(fields), flush=True)


def bench_nccl(min_mb, max_mb, iters, rounds):
    mb = min_mb
    while mb <= max_mb:
        n = (mb << 20) // 4
        xs = [cp.ones(n, dtype=cp.float32) for _ in range(min(iters, 8))]

        def latency():
            for i in range(iters):
                hvd.allreduce(xs[i % len(xs)], op=hvd.Sum, name="lat")

        def pipelined():
            handles = [hvd.allreduce_async(xs[i % len(xs)], op=hvd.Sum, name=f"pipe.{i}")
                       for i in range(iters)]
            for h in handles:
                hvd.synchronize(h)

        latency()  # warm-up: communicator, fusion buffer, events
        pipelined()
        for mode, fn in (("latency", latency), ("pipelined", pipelined)):
            before = speculation()
            t = median_time(fn, rounds) / iters
            after = speculation()
            # Per call: how many skipped negotiation, and how many the
            # submitting thread launched (issue 38's launch on submit).
            calls = iters * rounds
            emit(part="core_nccl", bytes=mb << 20, mode=mode, op="sum", us=t * 1e6,
                 algbw_gbs=(mb << 20) / t / 1e9,
                 speculated=(after["responses"] - before["responses"]) / calls,
                 inline=(after["inline"] - before["inline"]) / calls)
        mb *= 2


def bench_staged(min_mb, max_mb, rounds):
    mb = min_mb
    while mb <= max_mb:
        n = (mb << 20) // 4
        x = cp.ones(n, dtype=cp.float32)
        host = np.ones(n, dtype=np.float32)
        hvd.allreduce(x, op=hvd.Sum, name="staged")
        hvd.allreduce(host, op=hvd.Sum, name="cpu")
        staged = median_time(lambda: hvd.allreduce(x, op=hvd.Sum, name="staged"), rounds)
        d2h = median_time(lambda: cp.asnumpy(x), rounds)
        cpu = median_time(lambda: hvd.allreduce(host, op=hvd.Sum, name="cpu"), rounds)
        h2d = median_time(lambda: cp.asarray(host), rounds)
        emit(part="staged", bytes=mb << 20, size=hvd.size(), staged_us=staged * 1e6,
             d2h_us=d2h * 1e6, cpu_plane_us=cpu * 1e6, h2d_us=h2d * 1e6,
             parts_us=(d2h + cpu + h2d) * 1e6, staged_over_parts=staged / (d2h + cpu + h2d))
        mb *= 2


if __name__ == "__main__":
    what, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    iters, rounds = int(sys.argv[4]), int(sys.argv[5])
    hvd.init()
    cp.cuda.Device(hvd.local_rank() % cp.cuda.runtime.getDeviceCount()).use()
    try:
        if what == "nccl":
            bench_nccl(lo, hi, iters, rounds)
        else:
            bench_staged(lo, hi, rounds)
    finally:
        hvd.shutdown()
