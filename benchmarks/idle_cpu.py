"""CPU cost of an idle tfring job, per rank.

Run under tfringrun::

    tfringrun -np 2 --timeout 120 python benchmarks/idle_cpu.py --out results/idle.jsonl

Each rank imports TensorFlow and mpi4py and first measures a *baseline*: its
process CPU time while sleeping before ``hvd.init()`` (TF and MPI loaded, no
tfring background thread). It then calls ``hvd.init()``, runs a few
collectives (so negotiation, the response cache and the data planes have all
been used), waits at an MPI barrier and sleeps ``--seconds``; the idle cost
is its own process CPU time over that sleep (utime + stime from
/proc/self/stat; getrusage for finer resolution) divided by the wall time:
CPU-seconds per second. Issue 5's target: <= 0.02 per rank (Horovod's MPI
controller: about 0.99 on rank 0). Per-thread deltas (from
/proc/self/task/*/stat) name the threads that used the CPU. A collective
after the sleep checks the job is still healthy.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="append one JSON line per rank here (rank 0 writes)")
    p.add_argument("--seconds", type=float, default=5.0, help="idle time measured")
    p.add_argument("--baseline-seconds", type=float, default=2.0,
                   help="idle time measured before hvd.init() (0 = skip)")
    p.add_argument("--quick", action="store_true", help="1 s idle, 0.5 s baseline")
    p.add_argument("--label", default="default")
    return p.parse_args(argv)


def measure(seconds):
    threads0 = bc.thread_cpu()
    wall0, proc0, ru0 = time.perf_counter(), bc.cpu_ticks_from_proc(), bc.rusage_cpu()
    time.sleep(seconds)
    wall = time.perf_counter() - wall0
    proc, ru = bc.cpu_ticks_from_proc() - proc0, bc.rusage_cpu() - ru0
    threads1 = bc.thread_cpu()
    busy = []
    for tid, (name, cpu) in threads1.items():
        delta = cpu - threads0.get(tid, (name, 0.0))[1]
        if delta > 0:
            busy.append({"tid": tid, "name": name, "cpu_s": delta})
    busy.sort(key=lambda t: -t["cpu_s"])
    return {"wall_s": wall, "proc_cpu_s": proc, "rusage_cpu_s": ru,
            "cpu_per_s": proc / wall, "rusage_cpu_per_s": ru / wall,
            "threads": len(threads1), "busy_threads": busy[:8]}


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.seconds, args.baseline_seconds = 1.0, 0.5
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from mpi4py import MPI

    import tfring.tensorflow as hvd

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    x = tf.ones([1024])  # TF's runtime up before the baseline
    baseline = None
    if args.baseline_seconds > 0:
        comm.Barrier()
        baseline = measure(args.baseline_seconds)

    hvd.init()
    # Exercise the machinery: small and large allreduces (cached after the
    # first), an allgather and a broadcast, eagerly and in a tf.function.
    step = tf.function(lambda t: [hvd.allreduce(t, name="idle_fn_a"),
                                  hvd.allreduce(t * 2, name="idle_fn_b")])
    big = tf.ones([1 << 20])
    for i in range(5):
        step(x)
        hvd.allreduce(big, name="idle_big")
        hvd.allgather(x, name="idle_gather")
        hvd.broadcast(x, root_rank=0, name="idle_bcast")
    comm.Barrier()
    idle = measure(args.seconds)
    check = hvd.allreduce(x, op=hvd.Sum, name="idle_after")
    assert float(check[0].numpy()) == float(n), "allreduce after the idle period is wrong"

    rows = comm.gather({"rank": rank, "pid": os.getpid(), "idle": idle, "baseline": baseline},
                       root=0)
    comm.Barrier()
    hvd.shutdown()
    if rank != 0:
        return
    env = bc.recorded_env()
    recs = [{"bench": "idle_cpu", "np": n, "label": args.label, "env": env,
             "time": bc.now_iso(), "seconds": args.seconds, **r} for r in rows]
    bc.append_jsonl(args.out, recs)
    print(f"idle CPU, np={n}, {args.seconds:g} s asleep after init + collectives "
          f"(target <= 0.02 CPU-s/s per rank)", flush=True)
    for r in recs:
        b = r["baseline"]
        base = f"; before init {b['cpu_per_s']:.4f}" if b else ""
        top = ", ".join(f"{t['name']}:{t['cpu_s']:.3f}s" for t in r["idle"]["busy_threads"][:3])
        print(f"  rank {r['rank']}: {r['idle']['cpu_per_s']:.4f} CPU-s/s "
              f"(getrusage {r['idle']['rusage_cpu_per_s']:.4f}){base}  busiest: {top or '-'}",
              flush=True)


if __name__ == "__main__":
    main()
