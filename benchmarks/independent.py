"""Allreduce timed the way the independent benchmark of issue 10 times it.

Run under tfringrun::

    tfringrun -np 2 --timeout 300 python benchmarks/independent.py --out results/independent.jsonl

Its method, which disagreed with collectives.py at 64 MB (0.82x MPI against
1.46x): TF's intra-op and inter-op pools at one thread; the input made by
``tf.ones``; ``tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum))``;
``.numpy()`` on every result, inside the timed call; the median of 30
iterations after 5 warm-ups; mpi4py ``Allreduce`` on numpy buffers. Here all
of it runs in one launch, interleaved iteration by iteration so that every
case sees the same machine, and next to two more cases that explain the
difference between the methods:

* ``floor``: ``tf.function(lambda x: x * 1.0)`` with ``.numpy()``: what TF
  itself costs to hand back a fresh output of the same size (allocating and
  first touching its pages, the dispatch, ``.numpy()``);
* ``tfring_no_numpy``: the tfring call without ``.numpy()``, as
  collectives.py times it.

An iteration's time is the slowest rank's. Rank 0 appends one JSON line per
size to ``--out``.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="append JSON lines here (rank 0)")
    p.add_argument("--sizes", default="4K,1M,64M")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--label", default="independent")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    bc.configure_tf_threads(intra=1, inter=1)
    from mpi4py import MPI

    import tfring.tensorflow as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    log(f"independent method: np={n} env={bc.recorded_env()}")
    for nbytes in (bc.parse_size(s) for s in args.sizes.split(",")):
        count = nbytes // 4
        x = tf.ones([count], tf.float32)
        fn = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name=f"indep_{nbytes}"))
        floor = tf.function(lambda t: t * 1.0)
        a = np.ones(count, np.float32)
        b = np.empty_like(a)
        cases = {
            "tfring": lambda: fn(x).numpy(),
            "tfring_no_numpy": lambda: fn(x),
            "mpi4py": lambda: comm.Allreduce(a, b, op=MPI.SUM),
            "floor": lambda: floor(x).numpy(),
        }
        got = fn(x).numpy()
        if got[0] != n or got[-1] != n:
            raise AssertionError(f"{nbytes} bytes: got {got[0]}, {got[-1]}, want {n}")
        del got
        times = {k: [] for k in cases}
        for i in range(args.warmup + args.iters):
            for k, f in cases.items():
                comm.Barrier()
                start = time.perf_counter()
                out = f()
                t = time.perf_counter() - start
                del out
                if i >= args.warmup:
                    times[k].append(t)
        every = {k: comm.gather(v, root=0) for k, v in times.items()}
        if rank != 0:
            continue
        s = {k: bc.summary([max(ts) for ts in zip(*v)]) for k, v in every.items()}
        factor = bc.BUSBW_FACTOR["allreduce"](n)
        rec = {"bench": "independent", "label": args.label, "np": n, "bytes": nbytes,
               "time": bc.now_iso(), "env": bc.recorded_env(), "iters": args.iters,
               "warmup": args.warmup, **{k: v for k, v in s.items()},
               "ratio": s["mpi4py"]["median"] / s["tfring"]["median"],
               "ratio_no_numpy": s["mpi4py"]["median"] / s["tfring_no_numpy"]["median"],
               "busbw_factor": factor}
        bc.append_jsonl(args.out, [rec])
        log(f"{bc.human_size(nbytes):>6}: " + ", ".join(
            f"{k} {bc.human_time(v['median'])}" for k, v in s.items()) +
            f"; busbw ratio tfring/mpi4py {rec['ratio']:.2f}x "
            f"(without .numpy(): {rec['ratio_no_numpy']:.2f}x)")
    comm.Barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main()
