"""Elastic Keras model.fit on scikit-learn's handwritten digits: workers may
die or be added while it trains.

Run:
    echo localhost:3 > /tmp/hosts.txt
    tfringrun -np 3 --min-np 2 --max-np 3 --host-discovery-script "cat /tmp/hosts.txt" \\
        python examples/keras_elastic_digits.py [--epochs 12]

then, while it trains, kill one worker (``kill -9`` on one of the
``keras_elastic_digits.py`` processes): the other two roll back to the last
commit, re-form the job at size 2 and go on; or raise the slot count in the
hosts file to add workers (up to --max-np).

The digits (1,797 8x8 images) ship with scikit-learn, so nothing is
downloaded. Each worker trains on its shard of the training split, chosen by
the *current* rank and size every time fit() starts, so the shards follow
the job's size. The state (weights, optimizer slots, epoch, batch) is
committed every 5 batches and at each epoch's end; the learning rate is set
from the current size by a reset callback. Rank 0 prints progress, the size
the job runs at and, at the end, ``val_accuracy=...`` on the held-out split.
"""
import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tfring.keras as hvd
import tfring.keras.elastic  # noqa: F401  (makes hvd.elastic available)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=16, help="batch size per worker")
parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one worker")
parser.add_argument("--batches-per-commit", type=int, default=5)
args = parser.parse_args()

hvd.init()
digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)
x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0,
                                                  stratify=y)
# Steps per epoch stay fixed whatever the size: a batch of every worker per
# step, so an epoch covers the data about once at the largest size.
STEPS = len(x_train) // (3 * args.batch_size)

tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                             tf.keras.layers.Dense(128, activation="relu"),
                             tf.keras.layers.Dense(10, activation="softmax")])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9))
model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
              jit_compile=False)  # tfring's ops have no XLA kernels

state = hvd.elastic.KerasState(model, opt, epoch=0, batch=0)


def on_reset():
    opt.learning_rate.assign(args.lr * hvd.size())  # idempotent: from the size, not scaled
    if hvd.rank() == 0:
        print(f"re-formed: size {hvd.size()}, resuming at epoch {state.epoch} batch "
              f"{state.batch}", flush=True)


state.register_reset_callbacks([on_reset])


def batches(epoch, batch):
    """This worker's batches from (epoch, batch) on: its shard of a fixed
    per-epoch shuffle, by the current rank and size."""
    rank, size = hvd.rank(), hvd.size()
    for e in range(epoch, args.epochs):
        order = np.random.RandomState(e).permutation(len(x_train))
        for b in range(batch if e == epoch else 0, STEPS):
            start = (b * size + rank) * args.batch_size % (len(order) - args.batch_size)
            rows = order[start:start + args.batch_size]
            yield x_train[rows], y_train[rows]


class Progress(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs} size {hvd.size()} "
                  f"loss {logs['loss']:.4f} accuracy {logs['accuracy']:.4f}", flush=True)


callbacks = [hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state),
             hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
             Progress()]


@hvd.elastic.run
def train(state):
    if state.batch >= STEPS:  # committed after an epoch's last batch
        state.epoch, state.batch = state.epoch + 1, 0
    if state.batch:  # finish the epoch a failure cut short
        model.fit(batches(state.epoch, state.batch), steps_per_epoch=STEPS - state.batch,
                  initial_epoch=state.epoch, epochs=state.epoch + 1, callbacks=callbacks,
                  shuffle=False, verbose=0)  # the generator shuffles
    if state.epoch < args.epochs:
        model.fit(batches(state.epoch, 0), steps_per_epoch=STEPS, initial_epoch=state.epoch,
                  epochs=args.epochs, callbacks=callbacks, shuffle=False, verbose=0)


train(state)
if hvd.rank() == 0:
    _, accuracy = model.evaluate(x_val, y_val, verbose=0)
    print(f"val_accuracy={accuracy:.4f}", flush=True)
