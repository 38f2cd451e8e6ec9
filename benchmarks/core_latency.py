"""Per-call latency of small collectives through tfring.core (numpy arrays,
no framework), for comparing two builds of the core in one run (issue 38).

Run under tfringrun; ``TFRING_CORE_LIBRARY`` picks the build::

    TFRING_CORE_LIBRARY=/path/old.so tfringrun -np 2 --timeout 120 \\
        python benchmarks/core_latency.py --label old --out /tmp/lat.jsonl

Each rank times ``--iters`` blocking allreduces (and allgathers) of each
size under one name, after ``--warmup``, in ``--rounds`` rounds; rank 0
prints the median round's microseconds per call and appends one JSON line
per size and op to ``--out``.

The op ``allreduce_raw`` is the floor under ``allreduce``: the same
collective driven by calling the module's submit and wait directly with
arguments made once (``submit_array`` + ``wait_result``, or in a build
without them ``enqueue`` + ``wait``); ``allreduce`` minus it is what
tfring.core's Python adds per call. Each row also counts the Python
functions (``py_calls``) and the calls into C functions and methods
(``c_calls``) that one call makes, from ``sys.setprofile``.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4K,1M", help="comma-separated bytes, e.g. 4K,64K,1M")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", default="allreduce,allgather",
                   help="allreduce, allgather, allreduce_raw (see above)")
    p.add_argument("--label", default="default")
    p.add_argument("--out", help="append JSON lines here (rank 0)")
    return p.parse_args(argv)


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def raw_allreduce(core, x):
    """The allreduce of ``x`` through the module alone (see the docstring)."""
    if hasattr(core, "submit_array"):
        return lambda: core.submit_array(0, x, "lat.raw", True, 0, 1, 1.0, 1.0, 0,
                                         False).wait_result()
    y = np.empty_like(x)
    spec = [core.TensorSpec(x.ctypes.data, y.ctypes.data, list(x.shape), 8)]
    return lambda: core.enqueue(0, spec, "lat.raw", reduce_op=1).wait(-1)


def count_calls(call, n=20):
    """Python function calls and C calls per ``call()``, from sys.setprofile."""
    counts = {"call": 0, "c_call": 0}

    def profile(frame, event, arg):
        if event in counts:
            counts[event] += 1
    sys.setprofile(profile)
    try:
        for _ in range(n):
            call()
    finally:
        sys.setprofile(None)
    # One "call" event is the lambda itself.
    return (counts["call"] - n) / n, counts["c_call"] / n


def main(argv=None):
    args = parse_args(argv)
    import tfring.core as hvd
    from tfring.core import _module
    hvd.init()
    rank = hvd.rank()
    rows = []
    for size_text in args.sizes.split(","):
        nbytes = parse_size(size_text)
        x = np.ones(nbytes // 4, np.float32)
        # Fewer calls for large messages: the same time budget per size.
        iters = max(50, min(args.iters, args.iters * 65536 // max(nbytes, 1)))
        for op in args.ops.split(","):
            if op == "allreduce_raw":
                call = raw_allreduce(_module.load(), x)
            else:
                call = {"allreduce": lambda: hvd.allreduce(x, op=hvd.Sum, name="lat"),
                        "allgather": lambda: hvd.allgather(x, name="lat.ag")}[op]
            for _ in range(args.warmup):
                call()
            per_round = []
            for _ in range(args.rounds):
                hvd.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    call()
                per_round.append((time.perf_counter() - start) / iters * 1e6)
            py_calls, c_calls = count_calls(call)
            rows.append({"bench": "core_latency", "label": args.label, "op": op,
                         "bytes": nbytes, "size": hvd.size(), "iters": iters,
                         "us_per_call": statistics.median(per_round), "rounds_us": per_round,
                         "py_calls": py_calls, "c_calls": c_calls,
                         "library": os.environ.get("TFRING_CORE_LIBRARY", "built from tree"),
                         "load": os.getloadavg()[0], "when": bc.now_iso()})
    hvd.shutdown()
    if rank == 0:
        for r in rows:
            print(f"{args.label:>10} np={r['size']} {r['op']:>10} {r['bytes']:>9} B "
                  f"{r['us_per_call']:9.1f} us/call  rounds {['%.1f' % v for v in r['rounds_us']]}  "
                  f"py calls {r['py_calls']:.0f} C calls {r['c_calls']:.0f}")
        if args.out:
            bc.append_jsonl(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
