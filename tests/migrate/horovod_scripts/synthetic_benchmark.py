"""Synthetic-data training throughput in the manner of Horovod's TF2 benchmark.

Test data for tfring.migrate: a small CNN on random images, with a
``tf.optimizers.legacy`` optimizer built with ``lr=`` and ``opt.variables()``
broadcast after the first batch, as Keras 2 scripts did. Rank 0 prints
``total_images_per_sec=...``.
"""
import argparse
import timeit

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=3)
parser.add_argument("--num-iters", type=int, default=3)
parser.add_argument("--fp16-allreduce", action="store_true")
args = parser.parse_args()

hvd.init()
model = tf.keras.Sequential([
    tf.keras.Input(shape=(32, 32, 3)),
    tf.keras.layers.Conv2D(8, 3, activation="relu"),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Conv2D(16, 3, activation="relu"),
    tf.keras.layers.GlobalAveragePooling2D(),
    tf.keras.layers.Dense(10),
])
opt = tf.optimizers.legacy.SGD(lr=0.01)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
data = tf.random.uniform([args.batch_size, 32, 32, 3])
target = tf.random.uniform([args.batch_size], minval=0, maxval=10, dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    with tf.GradientTape() as tape:
        logits = model(data, training=True)
        loss = loss_fn(target, logits)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        # Rank 0's starting point, optimizer slots included, once they all exist.
        for variables in (model.variables, opt.variables()):
            hvd.broadcast_variables(variables, root_rank=0)


benchmark_step(first_batch=True)
timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
rates = []
for _ in range(args.num_iters):
    seconds = timeit.timeit(lambda: benchmark_step(first_batch=False),
                            number=args.num_batches_per_iter)
    rates.append(args.batch_size * args.num_batches_per_iter / seconds)
if hvd.rank() == 0:
    per_rank = float(np.mean(rates))
    print(f"images_per_sec_per_rank={per_rank:.1f} "
          f"total_images_per_sec={hvd.size() * per_rank:.1f}", flush=True)
