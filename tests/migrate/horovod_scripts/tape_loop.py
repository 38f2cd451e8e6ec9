"""A TF2 GradientTape loop on scikit-learn's digits, Horovod style.

Test data for tfring.migrate: it broadcasts ``opt.variables()`` after the
first step, which Keras 3 rejects (``variables`` is a list there). Rank 0
prints ``ranks_in_sync=...`` and ``final_loss=...``.
"""
import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import horovod.tensorflow as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
args = parser.parse_args()

hvd.init()
digits = load_digits()
dataset = tf.data.Dataset.from_tensor_slices(
    ((digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)))
dataset = dataset.shard(hvd.size(), hvd.rank()).repeat().shuffle(400, seed=3).batch(32)

tf.random.set_seed(11 + hvd.rank())
model = tf.keras.Sequential([tf.keras.layers.Dense(48, activation="relu"),
                             tf.keras.layers.Dense(10)])  # built on its first call
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = tf.optimizers.Adam(0.002 * hvd.size())


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    # Every variable exists only now (the model's and the optimizer's slots).
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return loss


for step, (images, labels) in enumerate(dataset.take(args.steps)):
    loss = training_step(images, labels, step == 0)
    if step % 20 == 0 and hvd.rank() == 0:
        print(f"step {step} loss {float(loss):.4f}", flush=True)

checksum = tf.reshape(tf.add_n([tf.reduce_sum(v) for v in model.variables]), [1])
everyone = hvd.allgather(checksum).numpy()
if hvd.rank() == 0:
    print(f"ranks_in_sync={bool(np.allclose(everyone, everyone[0]))} "
          f"final_loss={float(loss):.4f}", flush=True)
