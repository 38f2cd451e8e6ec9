"""An elastic Keras model.fit script for tests/keras/test_keras_elastic.py.

KerasState + CommitStateCallback/UpdateBatchStateCallback/
UpdateEpochStateCallback; data batch (epoch, batch) of rank r out of n is a
fixed slice, so resuming at (state.epoch, state.batch) is checkable.

Environment: ELASTIC_KILL "worker:epoch:batch" SIGKILLs that worker at the
start of that batch. The train step reports ``size_seen``: hvd.size() as
the traced train function saw it, which must follow the job's size.

Printed: BATCH epoch batch size size_seen loss (rank 0), RESET epoch batch
size (every survivor), FINAL rank json(weights) (every rank).
"""
import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

import tfring.keras as hvd

EPOCHS, STEPS, BATCH = 3, 6, 8


def batches(epoch, batch, rank, size):
    """Batches from (epoch, batch) on, for rank/size: the idempotent sharding."""
    rng = np.random.RandomState(11)
    x = rng.normal(size=(512, 6)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
    for e in range(epoch, EPOCHS):
        for b in range(batch if e == epoch else 0, STEPS):
            start = (((e * STEPS + b) * size + rank) * BATCH) % (len(x) - BATCH)
            yield x[start:start + BATCH], y[start:start + BATCH]


class SizeModel(tf.keras.Sequential):
    def train_step(self, data):
        logs = super().train_step(data)
        # Evaluated when the train function is traced.
        logs["size_seen"] = tf.constant(float(hvd.size()))
        return logs


def main():
    hvd.init()
    wid = os.environ.get("TFRING_ELASTIC_WORKER")
    tf.keras.utils.set_random_seed(5)
    model = SizeModel([tf.keras.Input((6,)), tf.keras.layers.Dense(16, "relu"),
                       tf.keras.layers.Dense(1, "sigmoid")])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01))
    model.compile(optimizer=opt, loss="binary_crossentropy")
    opt.build(model.trainable_variables)
    state = hvd.elastic.KerasState(model, opt, epoch=0, batch=0)
    state.register_reset_callbacks(
        [lambda: print("RESET", state.epoch, state.batch, hvd.size(), flush=True)])

    class Probe(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if f"{wid}:{state.epoch}:{state.batch}" in os.environ.get("ELASTIC_KILL",
                                                                      "").split(","):
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, batch, logs=None):
            if hvd.rank() == 0:
                # Runs before UpdateBatchStateCallback: state.batch is this batch.
                print("BATCH", state.epoch, state.batch, hvd.size(),
                      int(logs["size_seen"]), f"{float(logs['loss']):.5f}", flush=True)

    callbacks = [Probe(), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=1)]

    @hvd.elastic.run
    def train(state):
        if state.batch >= STEPS:  # committed after an epoch's last batch
            state.epoch, state.batch = state.epoch + 1, 0
        # A fresh generator per fit(): Keras may read one element ahead.
        if state.batch:  # finish the epoch that was cut short
            model.fit(batches(state.epoch, state.batch, hvd.rank(), hvd.size()),
                      steps_per_epoch=STEPS - state.batch, initial_epoch=state.epoch,
                      epochs=state.epoch + 1, callbacks=callbacks, verbose=0)
        if state.epoch < EPOCHS:
            model.fit(batches(state.epoch, 0, hvd.rank(), hvd.size()), steps_per_epoch=STEPS,
                      initial_epoch=state.epoch, epochs=EPOCHS, callbacks=callbacks, verbose=0)

    train(state)
    weights = [v.numpy().ravel().tolist() for v in model.trainable_variables]
    print("FINAL", hvd.rank(), json.dumps(weights), flush=True)


if __name__ == "__main__":
    sys.exit(main())
