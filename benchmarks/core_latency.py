"""Per-call latency of small collectives through tfring.core (numpy arrays,
no framework), for comparing two builds of the core in one run (issue 38).

Run under tfringrun; ``TFRING_CORE_LIBRARY`` picks the build::

    TFRING_CORE_LIBRARY=/path/old.so tfringrun -np 2 --timeout 120 \\
        python benchmarks/core_latency.py --label old --out /tmp/lat.jsonl

Each rank times ``--iters`` blocking allreduces (and allgathers) of each
size under one name, after ``--warmup``, in ``--rounds`` rounds; rank 0
prints the median round's microseconds per call and appends one JSON line
per size and op to ``--out``.
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
    p.add_argument("--ops", default="allreduce,allgather")
    p.add_argument("--label", default="default")
    p.add_argument("--out", help="append JSON lines here (rank 0)")
    return p.parse_args(argv)


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main(argv=None):
    args = parse_args(argv)
    import tfring.core as hvd
    hvd.init()
    rank = hvd.rank()
    rows = []
    for size_text in args.sizes.split(","):
        nbytes = parse_size(size_text)
        x = np.ones(nbytes // 4, np.float32)
        # Fewer calls for large messages: the same time budget per size.
        iters = max(50, min(args.iters, args.iters * 65536 // max(nbytes, 1)))
        for op in args.ops.split(","):
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
            rows.append({"bench": "core_latency", "label": args.label, "op": op,
                         "bytes": nbytes, "size": hvd.size(), "iters": iters,
                         "us_per_call": statistics.median(per_round), "rounds_us": per_round,
                         "library": os.environ.get("TFRING_CORE_LIBRARY", "built from tree"),
                         "load": os.getloadavg()[0], "when": bc.now_iso()})
    hvd.shutdown()
    if rank == 0:
        for r in rows:
            print(f"{args.label:>10} np={r['size']} {r['op']:>10} {r['bytes']:>9} B "
                  f"{r['us_per_call']:9.1f} us/call  rounds {['%.1f' % v for v in r['rounds_us']]}")
        if args.out:
            bc.append_jsonl(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
