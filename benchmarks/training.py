"""Keras training throughput with one TF thread per rank.

Run under tfringrun::

    tfringrun -np 1 --timeout 300 python benchmarks/training.py --label np1 --out results/t1.jsonl
    tfringrun -np 2 --timeout 300 python benchmarks/training.py --label np2 --out results/t2.jsonl

and, for the machine's own ceiling, two independent single-rank trainings at
the same time (no communication), which meet at a file rendezvous so that
their measured phases overlap::

    tfringrun -np 1 python benchmarks/training.py --label indep --sync-dir D --sync-count 2 --out a.jsonl &
    tfringrun -np 1 python benchmarks/training.py --label indep --sync-dir D --sync-count 2 --out b.jsonl

(``run_all.py`` does all three.) Each rank sets TF's intra-op and inter-op
thread pools to one thread before any TF op, builds a small CNN (4 conv
layers, 2 dense; about 0.6 M parameters) and trains it with Keras
``model.fit`` on one fixed synthetic batch of 32x32x3 images (batch 32 per
rank, ``jit_compile=False``), with ``hvd.DistributedOptimizer`` and
``BroadcastGlobalVariablesCallback(0)``. Phases: warm-up batches (tracing,
first broadcast), the rendezvous if asked, a short calibration that picks
how many batches fill ``--seconds`` (ranks agree on the slowest estimate),
then the measured ``fit``. A callback records the wall-clock time at the end
of every measured batch; images/sec per rank = (batches - 1) * batch /
(last end - first end). The batch end times go into the JSON record so that
the report can restrict concurrent independent runs to the window in which
both were running.
"""
import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="append one JSON line per rank here (rank 0 writes)")
    p.add_argument("--label", default="training")
    p.add_argument("--seconds", type=float, default=25.0, help="length of the measured phase")
    p.add_argument("--batch-size", type=int, default=32, help="images per batch per rank")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--dense-units", type=int, default=128)
    p.add_argument("--warmup-batches", type=int, default=10)
    p.add_argument("--calibration-batches", type=int, default=5)
    p.add_argument("--threads", type=int, default=1,
                   help="TF intra-op and inter-op threads per rank (0 = TF's default)")
    p.add_argument("--sync-dir", help="rendezvous directory for independent concurrent runs")
    p.add_argument("--sync-count", type=int, default=1, help="processes meeting in --sync-dir")
    p.add_argument("--sync-timeout", type=float, default=300.0)
    p.add_argument("--quick", action="store_true", help="3 s measured, short warm-up")
    p.add_argument("--profile", action="store_true",
                   help="record each thread's CPU seconds over the measured phase "
                        "(tfring's background thread is named tfring-bg)")
    return p.parse_args(argv)


def rendezvous(directory, count, timeout):
    """Waits until `count` processes have each created a file in `directory`."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{os.getpid()}.ready"), "w") as f:
        f.write(str(time.time()))
    deadline = time.monotonic() + timeout
    while True:
        ready = [n for n in os.listdir(directory) if n.endswith(".ready")]
        if len(ready) >= count:
            return
        if time.monotonic() > deadline:
            sys.exit(f"rendezvous in {directory}: only {len(ready)} of {count} arrived")
        time.sleep(0.02)


def build_model(keras, image_size, dense_units, num_classes=10):
    L = keras.layers
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        L.Conv2D(32, 3, padding="same", activation="relu"),
        L.Conv2D(32, 3, padding="same", activation="relu"),
        L.MaxPooling2D(),
        L.Conv2D(64, 3, padding="same", activation="relu"),
        L.Conv2D(64, 3, padding="same", activation="relu"),
        L.MaxPooling2D(),
        L.Flatten(),
        L.Dense(dense_units, activation="relu"),
        L.Dense(num_classes),
    ])


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.seconds, args.warmup_batches, args.calibration_batches = 3.0, 3, 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    # Before any TF op runs.
    bc.configure_tf_threads(intra=args.threads, inter=args.threads)
    from mpi4py import MPI

    import tfring.keras as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    rank, n = hvd.rank(), hvd.size()
    keras = tf.keras

    tf.random.set_seed(1234 + rank)
    model = build_model(keras, args.image_size, args.dense_units)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * n))
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.default_rng(rank)
    x = rng.random((args.batch_size, args.image_size, args.image_size, 3), np.float32)
    y = rng.integers(0, 10, size=(args.batch_size,)).astype(np.int64)
    data = tf.data.Dataset.from_tensors((x, y)).repeat()

    class BatchTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.time())

    def fit(steps, extra=()):
        timer = BatchTimer()
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False,
                  callbacks=[*extra, timer])
        return timer.ends

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    log(f"training: label={args.label} np={n} params={model.count_params():,} "
        f"batch={args.batch_size} threads={args.threads}")
    t0 = time.perf_counter()
    fit(args.warmup_batches, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    warmup_s = time.perf_counter() - t0
    if args.sync_dir:
        rendezvous(args.sync_dir, args.sync_count, args.sync_timeout)
    ends = fit(args.calibration_batches + 1)
    per_batch = (ends[-1] - ends[0]) / max(1, len(ends) - 1)
    per_batch = comm.allreduce(per_batch, op=MPI.MAX)
    steps = max(5, math.ceil(args.seconds / per_batch))
    log(f"  warm-up {warmup_s:.1f} s; about {per_batch * 1e3:.1f} ms per batch; "
        f"measuring {steps} batches")
    cpu0, wall0 = (bc.thread_cpu(), time.perf_counter()) if args.profile else (None, None)
    ends = fit(steps)
    profile = thread_profile(cpu0, time.perf_counter() - wall0, steps) if args.profile else None
    ips = (len(ends) - 1) * args.batch_size / (ends[-1] - ends[0])
    loss = float(model.evaluate(data, steps=1, verbose=0))
    row = {"rank": rank, "pid": os.getpid(), "images_per_sec": ips, "batch_end_times": ends,
           "loss": loss, "profile": profile}
    rows = comm.gather(row, root=0)
    comm.Barrier()
    hvd.shutdown()
    if rank != 0:
        return
    env = bc.recorded_env()
    common = {"bench": "training", "label": args.label, "np": n, "env": env,
              "time": bc.now_iso(), "batch_size": args.batch_size, "steps": steps,
              "image_size": args.image_size, "params": model.count_params(),
              "threads": args.threads, "warmup_batches": args.warmup_batches,
              "warmup_s": warmup_s, "seconds_target": args.seconds,
              "keras_version": keras.__version__ if hasattr(keras, "__version__") else None}
    bc.append_jsonl(args.out, [{**common, **r} for r in rows])
    total = sum(r["images_per_sec"] for r in rows)
    per = ", ".join(f"{r['images_per_sec']:.1f}" for r in rows)
    log(f"  images/sec per rank: {per}; total {total:.1f} ({label_np(n)})")
    for r in rows:
        if r["profile"]:
            p = r["profile"]
            log(f"  rank {r['rank']}: {p['wall_s']:.1f} s measured, CPU-s/s by thread: " +
                ", ".join(f"{k} {v:.3f}" for k, v in p["cpu_per_s"].items()) +
                "; CPU ms per step: " +
                ", ".join(f"{k} {v:.1f}" for k, v in p["cpu_ms_per_step"].items()))


def thread_profile(before, wall_s, steps):
    """CPU seconds per wall second over the measured phase, summed by thread
    name, and CPU milliseconds per step."""
    after = bc.thread_cpu()
    by_name = {}
    for tid, (name, cpu) in after.items():
        used = cpu - before.get(tid, (name, 0.0))[1]
        by_name[name] = by_name.get(name, 0.0) + used
    per_s = {k: v / wall_s for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]) if v > 0}
    per_step = {k: v * wall_s * 1e3 / steps for k, v in per_s.items()}
    return {"wall_s": wall_s, "steps": steps, "cpu_per_s": per_s,
            "total_cpu_per_s": sum(per_s.values()), "cpu_ms_per_step": per_step}


def label_np(n):
    return f"{n} rank" + ("s" if n != 1 else "")


if __name__ == "__main__":
    main()
