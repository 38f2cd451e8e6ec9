"""Resident memory of each rank over a long run of mixed collectives (issue 40).

Run under tfringrun::

    tfringrun -np 2 --timeout 900 python benchmarks/memory_flat.py --out results/memory.jsonl

Each rank runs ``--collectives`` collectives (default 100,000) through
``tfring.core`` (numpy arrays; no framework, so what grows is tfring's):
every op (allreduce with each reduce op, grouped allreduce, allgather with
rank-dependent rows, broadcast, alltoall with splits, reducescatter,
barrier, the async forms), under several names, on the global process set
and on one added for the run, with a collective that fails on every rank
(ranks that disagree on a shape, or on a broadcast's root) every
``--error-every`` collectives. Its resident set size (``/proc/self/statm``)
is read after ``--warmup`` collectives and every ``--sample-every`` after
that; the growth after warm-up must stay within 1 MB (issue 40's target).
Rank 0 prints a table of every rank's samples and appends one JSON line per
rank to ``--out``.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

TARGET_BYTES = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--collectives", type=int, default=100_000)
    p.add_argument("--warmup", type=int, default=10_000)
    p.add_argument("--sample-every", type=int, default=10_000)
    p.add_argument("--error-every", type=int, default=250)
    p.add_argument("--names", type=int, default=8, help="distinct collective names cycled")
    p.add_argument("--elements", type=int, default=1024, help="float32 elements per tensor")
    p.add_argument("--only", help="comma-separated step names to run (default: all), "
                   "to find which one grows")
    p.add_argument("--quick", action="store_true", help="5,000 collectives, 1,000 warm-up")
    p.add_argument("--out", help="append one JSON line per rank here (rank 0 writes)")
    p.add_argument("--label", default="default")
    return p.parse_args(argv)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def make_steps(core, args, ps, ps_ranks):
    """The cycle of collectives, each a function of the iteration number
    returning how many collectives it ran."""
    rank, size = core.rank(), core.size()
    n = args.elements
    x = np.arange(n, dtype=np.float32) + rank
    rows = np.ones((rank + 1, 4), dtype=np.float32)
    splits = [1] * size
    to_all = np.arange(size * 4, dtype=np.float32).reshape(size, 4)
    scatter = np.ones((size * 8, 4), dtype=np.float32)
    names = [f"memflat.{i}" for i in range(args.names)]

    def name(i):
        return names[i % len(names)]

    def allreduce(i):
        op = (core.Sum, core.Average, core.Min, core.Max, core.Product)[i % 5]
        core.allreduce(x, op=op, name=name(i))
        return 1

    def grouped(i):
        core.grouped_allreduce([x, x[: n // 2], x[: n // 4]], op=core.Sum, name=name(i) + ".g")
        return 1

    def allgather(i):
        core.allgather(rows, name=name(i) + ".ag")
        return 1

    def broadcast(i):
        core.broadcast(x, root_rank=i % size, name=name(i) + ".b")
        return 1

    def alltoall(i):
        core.alltoall(to_all, splits=splits, name=name(i) + ".a2a")
        return 1

    def reducescatter(i):
        core.reducescatter(scatter, op=core.Sum, name=name(i) + ".rs")
        return 1

    def barrier(i):
        core.barrier()
        return 1

    def on_set(i):
        if rank in ps_ranks:  # only its members call a process set's collective
            core.allreduce(x, op=core.Sum, name=name(i) + ".ps", process_set=ps)
        return 1

    def in_flight(i):
        handles = [core.allreduce_async(x, op=core.Sum, name=f"{name(i)}.async{k}")
                   for k in range(4)]
        for h in handles:
            core.synchronize(h)
        return 4

    steps = [allreduce, grouped, allgather, broadcast, alltoall, reducescatter, barrier,
             on_set, in_flight]
    if args.only:
        wanted = args.only.split(",")
        steps = [s for s in steps if s.__name__ in wanted]
    return steps


def failing(core, i):
    """A collective every rank sees fail: the ranks disagree."""
    rank = core.rank()
    try:
        if i % 2:
            core.allreduce(np.ones(4 + rank, dtype=np.float32), name="memflat.bad_shape")
        else:
            core.broadcast(np.ones(4, dtype=np.float32), root_rank=rank % core.size(),
                           name="memflat.bad_root")
    except (core.PreconditionError, core.InvalidArgumentError) as e:
        return type(e).__name__
    if core.size() > 1:
        raise AssertionError("a collective the ranks disagree on did not fail")
    return None


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.collectives, args.warmup, args.sample_every = 5_000, 1_000, 1_000
    import tfring.core as core
    core.init()
    rank, size = core.rank(), core.size()
    ps_ranks = list(range(0, size, 2)) if size > 2 else list(range(size))
    ps = core.add_process_set(ps_ranks)
    steps = make_steps(core, args, ps, ps_ranks)
    done, i, errors = 0, 0, {}
    samples = []           # (collectives done, rss bytes)
    next_sample = args.warmup
    started = time.perf_counter()
    while done < args.collectives:
        if args.error_every and i % args.error_every == args.error_every - 1:
            kind = failing(core, i)
            errors[kind] = errors.get(kind, 0) + 1
            done += 1
        else:
            done += steps[i % len(steps)](i)
        i += 1
        if done >= next_sample:
            core.barrier()
            samples.append((done, rss_bytes()))
            next_sample += args.sample_every
    seconds = time.perf_counter() - started
    base = samples[0][1]
    growth = samples[-1][1] - base
    peak = max(r for _, r in samples) - base
    record = {"bench": "memory_flat", "label": args.label, "rank": rank, "size": size,
              "collectives": done, "warmup": args.warmup, "errors": errors,
              "seconds": seconds, "rss_after_warmup": base, "rss_end": samples[-1][1],
              "growth_bytes": growth, "peak_growth_bytes": peak,
              "target_bytes": TARGET_BYTES, "met": peak <= TARGET_BYTES,
              "samples": samples, "env": bc.recorded_env(), "when": bc.now_iso()}
    # Every rank's record comes to rank 0 as JSON bytes (the core has no
    # object collectives).
    raw = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    lengths = core.allgather(np.array([raw.size], dtype=np.int64), name="memflat.len")
    data = core.allgather(raw, name="memflat.records").tobytes()
    records, at = [], 0
    for length in lengths.tolist():
        records.append(json.loads(data[at:at + length].decode()))
        at += length
    core.shutdown()
    if rank == 0:
        print(f"{done} collectives per rank ({sum(errors.values())} failing on purpose), "
              f"np={size}, {seconds:.1f} s")
        print(f"{'rank':>4} {'RSS after warm-up':>18} {'end':>10} {'growth':>10} "
              f"{'peak growth':>12}  target <= 1 MB")
        for r in records:
            print(f"{r['rank']:>4} {r['rss_after_warmup'] / 2**20:>15.1f} MB "
                  f"{r['rss_end'] / 2**20:>7.1f} MB {r['growth_bytes'] / 1024:>7.0f} KB "
                  f"{r['peak_growth_bytes'] / 1024:>9.0f} KB  {'met' if r['met'] else 'MISSED'}")
        if args.out:
            bc.append_jsonl(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
