"""tfring's collectives inside XLA against the same work without XLA, in the
same run, on CPU.

Run under tfringrun (np=2 for the figures in RESULTS.md)::

    tfringrun -np 2 --timeout 900 python benchmarks/xla.py

Two measurements, each alternating the two variants round by round so that
a change of machine load hits both alike:

- a Keras CNN's train step (benchmarks/training.py's model, batch 32 of
  32x32x3 per rank, SGD with momentum, ``hvd.DistributedOptimizer``),
  compiled with ``jit_compile=True`` against ``jit_compile=False``: the
  median step time of ``train_on_batch``;
- a chain of ``--chain`` allreduces, each reducing the previous result, in
  one step: ``tf.function(jit_compile=True)`` against a plain
  ``tf.function``, as time per allreduce (step time / chain length), for
  small and larger tensors.

Rank 0 prints one markdown table per measurement.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
from training import build_model  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per variant")
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--chain", type=int, default=20, help="allreduces in one chained step")
    p.add_argument("--sizes", default="4KB,1MB", help="allreduce tensor sizes for the chain")
    p.add_argument("--threads", type=int, default=1, help="TF intra/inter-op threads per rank")
    return p.parse_args(argv)


def timed_steps(step, steps):
    """Per-step wall seconds of `steps` calls of step()."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def alternate(variants, rounds, steps, hvd):
    """{name: [step seconds]}: every variant warmed up once, then `rounds`
    rounds that run each variant's `steps` steps in turn (ranks in step)."""
    for step in variants.values():
        step()
    results = {name: [] for name in variants}
    for _ in range(rounds):
        for name, step in variants.items():
            hvd.barrier()
            results[name] += timed_steps(step, steps)
    return results


def keras_cnn(tf, hvd, hvd_keras, args):
    keras = tf.keras
    rank = hvd.rank()
    images = tf.random.stateless_uniform([32, 32, 32, 3], seed=[rank, 1])
    labels = tf.random.stateless_uniform([32], seed=[rank, 2], maxval=10, dtype=tf.int32)
    steps = {}
    for jit in (False, True):
        keras.utils.set_random_seed(1)
        model = build_model(keras, 32, 128)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01, 0.9)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=jit)
        steps["XLA (jit_compile=True)" if jit else "no XLA (jit_compile=False)"] = \
            (lambda m=model: m.train_on_batch(images, labels))
        params = model.count_params()
    return params, alternate(steps, args.rounds, args.steps, hvd)


def allreduce_chain(tf, hvd, args, nbytes):
    n = max(1, nbytes // 4)
    x = tf.ones([n]) * (hvd.rank() + 1)
    scale = 1.0 / hvd.size()

    def chain(x):
        for i in range(args.chain):
            x = hvd.allreduce(x, op=hvd.Sum, name=f"chain_{i}") * scale
        return x

    plain = tf.function(chain)
    xla = tf.function(chain, jit_compile=True)
    return alternate({"plain tf.function": lambda: plain(x).numpy(),
                      "tf.function(jit_compile=True)": lambda: xla(x).numpy()},
                     args.rounds, args.steps, hvd)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    bc.configure_tf_threads(intra=args.threads, inter=args.threads)
    import tfring.keras as hvd_keras
    import tfring.tensorflow as hvd

    hvd.init()
    params, cnn = keras_cnn(tf, hvd, hvd_keras, args)
    chains = {size: allreduce_chain(tf, hvd, args, bc.parse_size(size))
              for size in args.sizes.split(",")}
    if hvd.rank() != 0:
        return
    print(f"\nKeras CNN ({params} parameters, batch 32 of 32x32x3 per rank), {hvd.size()} ranks, "
          f"{args.threads} TF thread(s) per rank, {args.rounds} x {args.steps} steps per variant")
    print("\n| variant | median step ms | mean step ms |\n|---|---:|---:|")
    for name, times in cnn.items():
        print(f"| {name} | {statistics.median(times) * 1e3:.1f} | "
              f"{statistics.mean(times) * 1e3:.1f} |")
    print(f"\nChain of {args.chain} dependent allreduces in one step, time per allreduce")
    print("\n| size | plain tf.function us/op | jit_compile=True us/op | XLA / plain |\n"
          "|---:|---:|---:|---:|")
    for size, result in chains.items():
        plain, xla = (statistics.median(result[k]) / args.chain * 1e6
                      for k in ("plain tf.function", "tf.function(jit_compile=True)"))
        print(f"| {size} | {plain:.0f} | {xla:.0f} | {xla / plain:.2f}x |")


if __name__ == "__main__":
    main()
