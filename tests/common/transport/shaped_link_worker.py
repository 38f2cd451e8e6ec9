"""Rank script for test_shaped_link.py: one rank per fake host.

    tfringrun --tcp -H h0:1,h1:1 python shaped_link_worker.py MBYTES

Checks a MBYTES allreduce element by element, then times it in place (the
median of a few calls, each lined up by a tiny allreduce) and prints
RESULT <rank> <busbw in bits/s> (nccl-tests: bytes / time * 2(n-1)/n).
"""
import statistics
import sys
import time

import numpy as np

import tfring.core as hvd

CALLS = 5


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    count = int(sys.argv[1]) * (1 << 20) // 4
    # Distinct values per element and rank, exact in float32 (below 2**24).
    x = (np.arange(count) % 100000).astype(np.float32) * (rank + 1)
    hvd.allreduce_(x, op=hvd.Sum, name="check")
    expect = (np.arange(count) % 100000).astype(np.float32) * (size * (size + 1) // 2)
    assert np.array_equal(x, expect), f"wrong allreduce result at {np.flatnonzero(x != expect)[:5]}"
    one = np.ones(1, np.float32)
    times = []
    for _ in range(CALLS):
        hvd.allreduce_(one, op=hvd.Sum, name="line_up")
        t0 = time.perf_counter()
        hvd.allreduce_(x, op=hvd.Sum, name="timed")
        times.append(time.perf_counter() - t0)
    slowest = hvd.allreduce(np.array([statistics.median(times)]), op=hvd.Max, name="slowest")[0]
    busbw = count * 4 / slowest * 2 * (size - 1) / size * 8
    print(f"RESULT {rank} {busbw:.0f}", flush=True)
    hvd.shutdown()


main()
