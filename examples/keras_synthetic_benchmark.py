"""Synthetic-data throughput benchmark, after Horovod's tensorflow2_synthetic_benchmark.py.

Run:  tfringrun -np 2 python examples/keras_synthetic_benchmark.py [--model-size small]

A small ResNet-style CNN (sized for a few CPU cores, not ResNet-50) trains on
one fixed batch of random 32x32 images. The train step is a tf.function with
``hvd.DistributedGradientTape``; rank 0's variables are broadcast after the
first batch. After warm-up, each of ``--num-iters`` iterations times
``--num-batches-per-iter`` steps. Rank 0 prints images/sec per rank
(mean +- 1.96 std over iterations) and the total over all ranks, ending with a
parseable line ``total_images_per_sec=...`` (rank 0's mean times the number
of ranks, as Horovod computes it). On an idle 2-core VM at np=2 the defaults
(--model-size small, batch 32) take about 15 s and give about 250 images/sec
in total.
"""
import argparse
import timeit

import numpy as np
import tensorflow as tf

import tfring.tensorflow as hvd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--batch-size", type=int, default=32, help="images per batch per rank")
parser.add_argument("--num-warmup-batches", type=int, default=5, help="untimed batches first")
parser.add_argument("--num-batches-per-iter", type=int, default=5, help="batches per timed iter")
parser.add_argument("--num-iters", type=int, default=5, help="timed iterations")
parser.add_argument("--model-size", choices=["tiny", "small", "medium"], default="small",
                    help="CNN width/depth: tiny (16 ch, 1 block/stage), small (32, 1), "
                         "medium (32, 2)")
parser.add_argument("--image-size", type=int, default=32, help="height and width of images")
parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16")
args = parser.parse_args()

hvd.init()
rank, size = hvd.rank(), hvd.size()
WIDTH, BLOCKS = {"tiny": (16, 1), "small": (32, 1), "medium": (32, 2)}[args.model_size]


def resnet_ish(width, blocks_per_stage, num_classes=100):
    """Three stages of residual blocks (width, 2x, 4x channels), then pool and classify."""
    layers = tf.keras.layers
    inputs = tf.keras.Input((args.image_size, args.image_size, 3))
    x = layers.Conv2D(width, 3, padding="same", activation="relu")(inputs)
    for stage in range(3):
        channels = width * 2 ** stage
        for block in range(blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            if stride != 1 or x.shape[-1] != channels:
                shortcut = layers.Conv2D(channels, 1, strides=stride)(x)
            x = layers.Conv2D(channels, 3, strides=stride, padding="same")(x)
            x = layers.ReLU()(layers.BatchNormalization()(x))
            x = layers.BatchNormalization()(layers.Conv2D(channels, 3, padding="same")(x))
            x = layers.ReLU()(layers.Add()([x, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, layers.Dense(num_classes)(x))


model = resnet_ish(WIDTH, BLOCKS)
opt = tf.keras.optimizers.SGD(0.01)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size], minval=0, maxval=100, dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(data, training=True))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)


def log(message):
    if rank == 0:
        print(message, flush=True)


log(f"Model: resnet_ish ({args.model_size}, {model.count_params():,} parameters), "
    f"batch size {args.batch_size}, {args.image_size}x{args.image_size} images, {size} ranks")
log("Running warmup...")
benchmark_step(first_batch=True)
timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for i in range(args.num_iters):
    seconds = timeit.timeit(lambda: benchmark_step(first_batch=False),
                            number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / seconds
    log(f"Iter #{i}: {img_sec:.1f} img/sec per rank")
    img_secs.append(img_sec)

mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {size} rank(s): {size * mean:.1f} +-{size * conf:.1f}")
log(f"images_per_sec_per_rank={mean:.1f} total_images_per_sec={size * mean:.1f}")
hvd.shutdown()
