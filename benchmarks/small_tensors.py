"""Many small tensors and single-op latency.

Run under tfringrun, once with the response cache on (the default) and once
with it off::

    tfringrun -np 2 --timeout 300 python benchmarks/small_tensors.py --out results/small.jsonl
    TFRING_CACHE_CAPACITY=0 tfringrun -np 2 --timeout 300 python benchmarks/small_tensors.py ...

and with speculation off (``TFRING_SPECULATION=0``) to measure what it saves.

Measures, on every rank, each timed call started together by an mpi4py
``Barrier`` and taking as long as its slowest rank (medians reported):

* ``step200``: one ``tf.function`` step that allreduces 200 separate float32
  tensors of 4 KB (200 tfring ops, names ``small_0`` ... ``small_199``: the
  shape of a training step's gradient allreduces, with fusion and the
  response cache doing their work);
* ``floor200``: the same step with each allreduce replaced by a multiply:
  TensorFlow's own cost of running a 200-op, 200-output function;
* ``chain``: one ``tf.function`` of ``--chain`` (50) 4 KB allreduces, each
  consuming the previous one's output, so that nothing fuses and TF's
  dispatch of the function is amortised: per-op time = call time / 50. Next
  to it ``chain_floor`` (the same chain of multiplies: TF's own per-op cost)
  and ``chain_mpi4py`` (50 ``comm.Allreduce`` calls on numpy in a loop);
* single 4 KB latency: the tfring allreduce called eagerly
  (``eager_allreduce``) and inside a ``tf.function`` (``function_allreduce``),
  mpi4py ``comm.Allreduce`` on numpy (``mpi4py_allreduce``), and TF's
  dispatch of an identity ``tf.function`` (``function_identity``) and of an
  eager ``tf.identity`` (``eager_identity``).

The 4 KB latency target of issue 5 is
``function_allreduce <= 1.5 * (mpi4py_allreduce + function_identity)``.
Rank 0 appends one JSON line to ``--out`` and prints a summary.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

N_TENSORS = 200
TENSOR_BYTES = 4 * bc.KB


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="append a JSON line here (rank 0)")
    p.add_argument("--steps", type=int, default=200, help="timed 200-tensor steps")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--latency-iters", type=int, default=300, help="timed single-op calls")
    p.add_argument("--budget", type=float, default=40.0,
                   help="cap in seconds on each of the two phases (steps, latency)")
    p.add_argument("--tensors", type=int, default=N_TENSORS)
    p.add_argument("--chain", type=int, default=50, help="chained allreduces per function call")
    p.add_argument("--quick", action="store_true", help="few steps (smoke run)")
    p.add_argument("--label", help="name of this configuration (default: cache_on/cache_off "
                                   "from TFRING_CACHE_CAPACITY)")
    p.add_argument("--intra-op-threads", type=int, default=1,
                   help="TF intra-op threads per rank (0 = TF's default)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.steps, args.warmup_steps, args.latency_iters = 20, 5, 30
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    bc.configure_tf_threads(intra=args.intra_op_threads)
    import tfring.tensorflow as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    env = bc.recorded_env()
    cache = env.get("TFRING_CACHE_CAPACITY", env.get("HOROVOD_CACHE_CAPACITY"))
    label = args.label or ("cache_off" if cache == "0" else "cache_on")

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    def timed(fn, iters):
        """Per-call times (s), each call started on all ranks together."""
        out = []
        for _ in range(iters):
            comm.Barrier()
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
        return out

    def slowest(times):
        """Per-iteration max over ranks (on rank 0; None elsewhere)."""
        every = comm.gather(times, root=0)
        return [max(ts) for ts in zip(*every)] if rank == 0 else None

    log(f"small_tensors: np={n} label={label} env={env}")

    # --- 200 x 4 KB in one tf.function step --------------------------------
    count = TENSOR_BYTES // 4
    xs = [tf.fill([count], float(rank + 1) + i) for i in range(args.tensors)]
    scale = tf.constant(1.0)

    @tf.function
    def step200(tensors):
        return [hvd.allreduce(t, op=hvd.Sum, name=f"small_{i}") for i, t in enumerate(tensors)]

    @tf.function
    def floor200(tensors, s):
        return [t * s for t in tensors]

    outs = step200(xs)   # trace, and check once
    for i in (0, args.tensors - 1):
        want = float(n * (n + 1) // 2 + n * i)
        got = float(outs[i][0].numpy())
        if got != want:
            raise AssertionError(f"small_{i}: got {got}, want {want}")
    del outs
    floor200(xs, scale)
    def out_of_time(began, budget, done):
        """Rank 0 decides, every rank stops after the same iteration."""
        over = rank == 0 and done >= 5 and time.perf_counter() - began > budget
        return comm.bcast(over, root=0)

    step_times, floor_times = [], []
    began = time.perf_counter()
    for i in range(args.warmup_steps + args.steps):
        if i >= args.warmup_steps and out_of_time(began, args.budget, i - args.warmup_steps):
            break
        s = timed(lambda: step200(xs), 1)[0]
        f = timed(lambda: floor200(xs, scale), 1)[0]
        if i >= args.warmup_steps:
            step_times.append(s)
            floor_times.append(f)
    step_times, floor_times = slowest(step_times), slowest(floor_times)

    # --- a chain of 4 KB allreduces in one tf.function -----------------------
    x = tf.fill([count], float(rank + 1))
    one = tf.constant(1.0)

    @tf.function
    def chain(t):
        for i in range(args.chain):
            # Each consumes the last: the ops cannot fuse or overlap.
            t = hvd.allreduce(t, op=hvd.Average, name=f"chain_{i}")
        return t

    @tf.function
    def chain_floor(t, s):
        for _ in range(args.chain):
            t = t * s
        return t

    a = np.full(count, float(rank + 1), np.float32)
    b = np.empty_like(a)

    def chain_mpi():
        src, dst = a, b
        for _ in range(args.chain):
            comm.Allreduce(src, dst, op=MPI.SUM)
            src, dst = dst, src

    got = float(chain(x)[0].numpy())
    want = float(n * (n + 1) // 2) / n
    if abs(got - want) > 1e-5:
        raise AssertionError(f"chain: got {got}, want {want}")
    chain_floor(x, one)
    chains = {"chain": lambda: chain(x), "chain_floor": lambda: chain_floor(x, one),
              "chain_mpi4py": chain_mpi}
    chain_t = {k: [] for k in chains}
    began = time.perf_counter()
    for i in range(5 + args.steps):
        if i >= 5 and out_of_time(began, args.budget, i - 5):
            break
        for k, fn in chains.items():
            t = timed(fn, 1)[0]
            if i >= 5:
                chain_t[k].append(t / args.chain)
    chain_t = {k: slowest(v) for k, v in chain_t.items()}

    # --- single 4 KB latency ------------------------------------------------
    a = np.full(count, float(rank + 1), np.float32)
    b = np.empty_like(a)
    fn_allreduce = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="lat_function"))
    fn_identity = tf.function(lambda t: tf.identity(t))
    cases = {
        "eager_allreduce": lambda: hvd.allreduce(x, op=hvd.Sum, name="lat_eager"),
        "function_allreduce": lambda: fn_allreduce(x),
        "mpi4py_allreduce": lambda: comm.Allreduce(a, b, op=MPI.SUM),
        "function_identity": lambda: fn_identity(x),
        "eager_identity": lambda: tf.identity(x),
    }
    lat = {k: [] for k in cases}
    warm = max(5, args.latency_iters // 10)
    began = time.perf_counter()
    for i in range(warm + args.latency_iters):
        if i >= warm and out_of_time(began, args.budget, i - warm):
            break
        for k, fn in cases.items():   # interleaved: every case sees the same machine
            t = timed(fn, 1)[0]
            if i >= warm:
                lat[k].append(t)
    lat = {k: slowest(v) for k, v in lat.items()}

    comm.Barrier()
    # Whether the steady state ran without negotiation (TFRING_SPECULATION).
    from tfring.common.basics import _speculation_stats
    speculation = _speculation_stats()
    hvd.shutdown()
    if rank != 0:
        return
    rec = {"bench": "small_tensors", "np": n, "label": label, "env": env, "time": bc.now_iso(),
           "cache_capacity": cache if cache is not None else "default",
           "tensors": args.tensors, "tensor_bytes": TENSOR_BYTES, "steps": args.steps,
           "warmup_steps": args.warmup_steps, "latency_iters": args.latency_iters,
           "steps_done": len(step_times), "latency_iters_done": len(lat["eager_allreduce"]),
           "step200": bc.summary(step_times), "floor200": bc.summary(floor_times),
           "chain_length": args.chain,
           "chain_per_op": {k: bc.summary(v) for k, v in chain_t.items()},
           "latency": {k: bc.summary(v) for k, v in lat.items()},
           "speculation": speculation}
    m = {k: v["median"] for k, v in rec["latency"].items()}
    rec["latency_target_s"] = 1.5 * (m["mpi4py_allreduce"] + m["function_identity"])
    bc.append_jsonl(args.out, [rec])
    log(f"{args.tensors} x 4 KB allreduce step: median {bc.human_time(rec['step200']['median'])}"
        f" (TF floor, {args.tensors} multiplies: {bc.human_time(rec['floor200']['median'])})")
    for k, v in rec["chain_per_op"].items():
        log(f"  4 KB per op in a chain of {args.chain}: {k:<14} median {bc.human_time(v['median'])}")
    for k, v in m.items():
        log(f"  4 KB {k:<20} median {bc.human_time(v)}")
    log(f"  speculation (rank 0): {speculation}")
    log(f"  target for function_allreduce: <= 1.5 x (mpi4py + identity dispatch) = "
        f"{bc.human_time(rec['latency_target_s'])}")


if __name__ == "__main__":
    main()
