"""Keras 2 style model.fit on scikit-learn's digits with Horovod's callbacks.

Test data for tfring.migrate: written against Horovod and Keras 2
(``lr=``, ``opt.lr``, ``experimental_run_tf_function``), so it fails on
Keras 3 until migrated. Rank 0 prints ``lr=...`` after each epoch and
``val_accuracy=...`` at the end.
"""
import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import horovod.tensorflow.keras as hvd
from horovod.tensorflow.keras import callbacks as hvd_callbacks

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one worker")
args = parser.parse_args()

hvd.init()
digits = load_digits()
images = (digits.data / 16.0).astype(np.float32)
labels = digits.target.astype(np.int64)
train_x, train_y, val_x, val_y = images[:1500], labels[:1500], images[1500:], labels[1500:]
shard_x, shard_y = train_x[hvd.rank()::hvd.size()], train_y[hvd.rank()::hvd.size()]

tf.keras.utils.set_random_seed(7 + hvd.rank())  # different starts: the broadcast must fix them
model = tf.keras.Sequential([
    tf.keras.Input(shape=(64,)),
    tf.keras.layers.Dense(48, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
opt = tf.keras.optimizers.SGD(lr=args.lr * hvd.size(), momentum=0.9)
opt = hvd.DistributedOptimizer(opt)
model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"],
              experimental_run_tf_function=False)


class ShowLearningRate(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            print(f"epoch={epoch + 1} lr={float(tf.keras.backend.get_value(opt.lr)):.5f} "
                  f"loss={logs['loss']:.4f}", flush=True)


batch = 32
steps = int(np.ceil(len(shard_x) / batch))
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd_callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * hvd.size(), warmup_epochs=1,
                                             steps_per_epoch=steps, verbose=0),
    ShowLearningRate(),
]
model.fit(shard_x, shard_y, batch_size=batch, epochs=args.epochs, callbacks=callbacks,
          verbose=0)
if hvd.rank() == 0:
    _, accuracy = model.evaluate(val_x, val_y, verbose=0)
    print(f"size={hvd.size()} val_accuracy={accuracy:.4f}", flush=True)
