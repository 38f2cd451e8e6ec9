"""Elastic Keras model.fit on scikit-learn's digits, Horovod style.

Test data for tfring.migrate: Keras 2 idioms (``experimental_run_tf_function``,
``K.set_value(... .lr, ...)``) that Keras 3 rejects. Run it under an elastic
launcher (``--host-discovery-script``). Rank 0 prints ``final_loss=...``.
"""
import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--base-lr", type=float, default=0.02)
args = parser.parse_args()

hvd.init()
digits = load_digits()
images = (digits.data / 16.0).astype(np.float32)
labels = digits.target.astype(np.int64)
batch = 32
steps_per_epoch = len(images) // (2 * batch)

model = tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                             tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10, activation="softmax")])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(args.base_lr, momentum=0.9))
model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
              experimental_run_tf_function=False)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def scale_learning_rate():
    # The job's size may change at every reset: set the rate from it again.
    tf.keras.backend.set_value(state.model.optimizer.lr, args.base_lr * hvd.size())


state.register_reset_callbacks([scale_learning_rate])
scale_learning_rate()


def shard_batches():
    rank, size = hvd.rank(), hvd.size()
    while True:
        for start in range(rank * batch, len(images) - batch, size * batch):
            yield images[start:start + batch], labels[start:start + batch]


callbacks = [hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
             hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state)]


@hvd.elastic.run
def train(state):
    return model.fit(shard_batches(), steps_per_epoch=steps_per_epoch,
                     initial_epoch=state.epoch, epochs=args.epochs, callbacks=callbacks,
                     verbose=0)


history = train(state)
if hvd.rank() == 0:
    print(f"size={hvd.size()} final_loss={history.history['loss'][-1]:.4f}", flush=True)
