"""Collective sweep: tfring ops inside tf.function against mpi4py on numpy.

Run under tfringrun (every rank runs this script)::

    tfringrun -np 2 --timeout 900 python benchmarks/collectives.py --out results/collectives.jsonl
    TFRING_CPU_OPERATIONS=mpi tfringrun -np 2 python benchmarks/collectives.py --label mpi ...

For each collective (allreduce float32 Sum, allgather, broadcast from rank 0)
and each size (4 KB ... 256 MB in powers of 4), it times

* tfring: one tfring op per call of a ``tf.function`` (the eager call of a
  function returns only when its outputs are computed: TF's default
  synchronous execution, checked at start-up), and
* mpi4py: ``comm.Allreduce`` / ``Allgather`` / ``Bcast`` on preallocated
  numpy arrays, in the same processes,

interleaved iteration by iteration (so both see the same machine), each
iteration started on all ranks together by an mpi4py ``Barrier``. An
iteration's time is the slowest rank's; the reported time is the median over
the timed iterations, after warm-up iterations that are not counted. A size
stops early after ``--budget`` seconds (at least ``--min-iters`` timed
iterations), so a slow configuration cannot stretch the run.

Sizes follow nccl-tests: for allgather, ``bytes`` is the size of the gathered
output (each rank contributes bytes/np); for allreduce and broadcast it is
the tensor's size. algbw = bytes / time; busbw = algbw * 2(n-1)/n (allreduce),
* (n-1)/n (allgather), * 1 (broadcast). ratio = tfring busbw / mpi4py busbw.

Each iteration also times TF's own floor, a ``tf.function`` that returns
``tf.identity`` of the same input: what any TF op pays per call here (on a
2-core machine about 0.2-0.35 ms, more than mpi4py needs for a whole 1 MB
allreduce). ``--chain K`` measures per op instead: one ``tf.function`` runs K
collectives, each consuming the last one's output (allgather: the first
rank's share of it), against K mpi4py calls that do the same, so TF's call
cost is spread over K ops; times are then per op. ``--eager`` calls the
op (or the chain) eagerly instead, as a script outside any ``tf.function``
does, against an eager ``tf.identity`` as the floor.

Rank 0 prints a table and appends one JSON line per (collective, size) to
``--out``, with the TFRING_*/MPIR_CVAR_* environment it ran under (set
TFRING_CPU_OPERATIONS=mpi|shm|ring|auto to force a data plane).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

FULL_SIZES = [4 * bc.KB * 4 ** i for i in range(9)]          # 4K, 16K, ..., 256M
QUICK_SIZES = [4 * bc.KB, 64 * bc.KB, bc.MB]
COLLECTIVES = ("allreduce", "allgather", "broadcast")


def iterations(nbytes, quick):
    """(warm-up, timed) iterations for a size: about a second or two per size at most."""
    if quick:
        return 2, 10
    if nbytes <= 64 * bc.KB:
        return 10, 200
    if nbytes <= bc.MB:
        return 5, 50
    if nbytes <= 4 * bc.MB:
        return 3, 30
    if nbytes <= 16 * bc.MB:
        return 2, 15
    if nbytes <= 64 * bc.MB:
        return 2, 10
    return 1, 5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="append JSON lines here (rank 0)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help="comma-separated subset of " + ",".join(COLLECTIVES))
    p.add_argument("--sizes", help="comma-separated sizes, e.g. 4K,1M,64M (default 4K..256M)")
    p.add_argument("--max-bytes", default=None, help="skip sizes above this, e.g. 64M")
    p.add_argument("--quick", action="store_true", help="a few small sizes, few iterations")
    p.add_argument("--iters", type=int, help="timed iterations for every size")
    p.add_argument("--warmup", type=int, help="warm-up iterations for every size")
    p.add_argument("--budget", type=float, default=8.0,
                   help="stop timing a size after this many seconds (at least --min-iters "
                        "timed iterations are always run)")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--label", help="name of this configuration in the results "
                                   "(default: TFRING_CPU_OPERATIONS or 'auto')")
    p.add_argument("--chain", type=int, default=1,
                   help="collectives per call, each consuming the last one's output; "
                        "times are per op (default 1: one per call)")
    p.add_argument("--intra-op-threads", type=int, default=1,
                   help="TF intra-op threads per rank (0 = TF's default)")
    p.add_argument("--eager", action="store_true",
                   help="call the ops eagerly, not inside a tf.function")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    bc.configure_tf_threads(intra=args.intra_op_threads)
    import tfring.tensorflow as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    assert hvd.size() == n and hvd.rank() == rank, "tfring and MPI_COMM_WORLD disagree"
    if not tf.config.experimental.get_synchronous_execution():
        sys.exit("collectives.py needs TF's synchronous eager execution (the default)")

    if args.sizes:
        sizes = [bc.parse_size(s) for s in args.sizes.split(",")]
    else:
        sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.max_bytes:
        sizes = [s for s in sizes if s <= bc.parse_size(args.max_bytes)]
    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    for c in collectives:
        if c not in COLLECTIVES:
            sys.exit(f"unknown collective {c!r}; choose from {COLLECTIVES}")
    env = bc.recorded_env()
    label = args.label or env.get("TFRING_CPU_OPERATIONS", "auto")
    if args.chain < 1:
        sys.exit("--chain must be at least 1")
    if args.chain > 1 and not args.label:
        label += f"-chain{args.chain}"
    if args.eager and not args.label:
        label += "-eager"

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    log(f"collectives: np={n} label={label} chain={args.chain} env={env}")
    log(f"{'collective':<10} {'size':>6} | {'tfring':>10} {'busbw':>7} | "
        f"{'mpi4py':>10} {'busbw':>7} | ratio (GB/s; ratio = tfring/mpi4py busbw)")

    for coll in collectives:
        for nominal in sizes:
            count = nominal // 4
            if coll == "allgather":
                count = max(1, count // n)   # per-rank contribution
                nbytes = count * n * 4
            else:
                nbytes = count * 4
            name = f"bench_{coll}_{nominal}"
            x = tf.fill([count], float(rank + 1))
            a = np.full(count, float(rank + 1), np.float32)
            chain = args.chain
            if coll == "allreduce":
                def body(t, k, name=name):
                    return hvd.allreduce(t, op=hvd.Sum, name=f"{name}_{k}")
                b = np.empty_like(a)
                s_ = float(n * (n + 1) // 2)
                want_first = want_last = s_ * float(n) ** (chain - 1)

                def mpi_op(a=a, b=b):
                    src, dst = a, b
                    for _ in range(chain):
                        comm.Allreduce(src, dst, op=MPI.SUM)
                        src, dst = dst, src
            elif coll == "allgather":
                def body(t, k, name=name, count=count):
                    out = hvd.allgather(t, name=f"{name}_{k}")
                    # The next link gathers the first rank's share (all 1.0).
                    return out if k == chain - 1 else out[:count]
                b = np.empty(count * n, np.float32)
                b2 = np.empty_like(b) if chain > 1 else b
                want_first, want_last = 1.0, (float(n) if chain == 1 else 1.0)

                def mpi_op(a=a, b=b, b2=b2, count=count):
                    # MPI forbids gathering into the buffer that is sent.
                    src, dst, spare = a, b, b2
                    for _ in range(chain):
                        comm.Allgather(src, dst)
                        src, dst, spare = dst[:count], spare, dst
            else:
                def body(t, k, name=name):
                    return hvd.broadcast(t, root_rank=0, name=f"{name}_{k}")
                b = None
                want_first = want_last = 1.0

                def mpi_op(a=a):
                    for _ in range(chain):
                        comm.Bcast(a, root=0)

            def links(t, body=body):
                for k in range(chain):
                    t = body(t, k)
                return t
            fn = links if args.eager else tf.function(links)
            floor_fn = tf.identity if args.eager else tf.function(tf.identity)

            warmup, timed = iterations(nominal, args.quick)
            warmup = args.warmup if args.warmup is not None else warmup
            timed = args.iters or timed
            t_tf, t_mpi, t_floor = [], [], []
            began = time.perf_counter()
            for i in range(warmup + timed):
                if i >= warmup + args.min_iters:
                    # Time cap per size (slow planes, oversubscription): rank 0
                    # decides, so that every rank stops after the same iteration.
                    over = rank == 0 and time.perf_counter() - began > args.budget
                    if comm.bcast(over, root=0):
                        break
                comm.Barrier()
                start = time.perf_counter()
                out = fn(x)
                t = time.perf_counter() - start
                if i == 0:  # check the result once, outside what is timed
                    got = (float(out[0].numpy()), float(out[-1].numpy()))
                    if got != (want_first, want_last) or out.shape[0] != nbytes // 4:
                        raise AssertionError(f"{coll} {nominal}: got first/last {got} and "
                                             f"{out.shape[0]} elements, want "
                                             f"{(want_first, want_last)} and {nbytes // 4}")
                del out
                comm.Barrier()
                start = time.perf_counter()
                mpi_op()
                m = time.perf_counter() - start
                start = time.perf_counter()
                floor_fn(x)
                f = time.perf_counter() - start
                if i >= warmup:
                    t_tf.append(t / chain)
                    t_mpi.append(m / chain)
                    t_floor.append(f / chain)
            # An iteration takes as long as its slowest rank.
            all_tf = comm.gather(t_tf, root=0)
            all_mpi = comm.gather(t_mpi, root=0)
            del x, a, b, fn, floor_fn
            if rank != 0:
                continue
            slow_tf = [max(ts) for ts in zip(*all_tf)]
            slow_mpi = [max(ts) for ts in zip(*all_mpi)]
            s_tf, s_mpi = bc.summary(slow_tf), bc.summary(slow_mpi)
            factor = bc.BUSBW_FACTOR[coll](n)
            rec = {
                "bench": "collectives", "collective": coll, "np": n, "label": label,
                "bytes": nbytes, "nominal_bytes": nominal, "dtype": "float32",
                "warmup": warmup, "iters": len(slow_tf), "iters_planned": timed, "env": env, "time": bc.now_iso(),
                "tfring": s_tf, "mpi4py": s_mpi,
                "tfring_rank0_median": bc.summary(all_tf[0])["median"],
                "mpi4py_rank0_median": bc.summary(all_mpi[0])["median"],
                "tfring_s": s_tf["median"], "mpi4py_s": s_mpi["median"],
                "chain": args.chain, "eager": args.eager,
                # TF's own call cost (tf.identity, in a tf.function unless
                # --eager), rank 0, per op.
                "tf_floor_s": bc.summary(t_floor)["median"],
                "tfring_algbw": nbytes / s_tf["median"] / 1e9,
                "mpi4py_algbw": nbytes / s_mpi["median"] / 1e9,
                "busbw_factor": factor,
            }
            rec["tfring_busbw"] = rec["tfring_algbw"] * factor
            rec["mpi4py_busbw"] = rec["mpi4py_algbw"] * factor
            rec["ratio"] = s_mpi["median"] / s_tf["median"]
            bc.append_jsonl(args.out, [rec])
            log(f"{coll:<10} {bc.human_size(nominal):>6} | {bc.human_time(s_tf['median']):>10} "
                f"{rec['tfring_busbw']:7.3f} | {bc.human_time(s_mpi['median']):>10} "
                f"{rec['mpi4py_busbw']:7.3f} | {rec['ratio']:5.2f}x | "
                f"TF floor {bc.human_time(rec['tf_floor_s'])}")
    comm.Barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main()
