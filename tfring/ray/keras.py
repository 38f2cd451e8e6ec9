"""Keras inside a :class:`~tfring.ray.TfringTrainer` loop: reports and checkpoints.

:class:`ReportCheckpointCallback` hands Ray Train each epoch's metrics,
averaged over the ranks, and rank 0's checkpoint of the model (weights and
optimizer state); :func:`load_checkpoint` restores them from
``ray.train.get_checkpoint()`` when Ray restarts the worker group, so that
``fit`` goes on from the epoch after the last checkpoint.

Example (the loop of a TfringTrainer):
    >>> import tfring.keras as hvd
    >>> from tfring.ray.keras import ReportCheckpointCallback, load_checkpoint
    >>> hvd.init()
    >>> model, initial_epoch = load_checkpoint()
    >>> if model is None:
    ...     model = build_and_compile(hvd.DistributedOptimizer(opt))
    >>> model.fit(x, y, epochs=10, initial_epoch=initial_epoch, callbacks=[
    ...     hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    ...     ReportCheckpointCallback()])
"""
import json
import os
import tempfile

import numpy as np
import ray.train
import tensorflow as tf

import tfring.keras as hvd
import tfring.tensorflow as hvd_tf

MODEL_FILE = "model.keras"
STATE_FILE = "tfring_state.json"


def _numeric(value):
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.number)):
        return True
    if tf.is_tensor(value) or isinstance(value, np.ndarray):
        return np.size(value) == 1 and (value.dtype.is_floating if tf.is_tensor(value)
                                        else value.dtype.kind == "f")
    return False


class ReportCheckpointCallback(tf.keras.callbacks.Callback):
    """Reports each epoch's metrics, averaged over the ranks, to Ray Train;
    rank 0 attaches a checkpoint of the model and its optimizer.

    Every rank calls ``ray.train.report`` once per epoch (Ray Train V2
    needs all of them); the metrics are plain Python floats (what Ray's
    controller takes) plus ``"epoch"``. The averages come from one grouped
    allreduce of the numeric scalar metrics, in sorted-name order.

    Args:
        metrics: the names of the metrics to report (default: every
            numeric scalar in the epoch's logs).
        checkpoint_every: attach a checkpoint every this many epochs (and
            at the last epoch of fit); 0: never.

    Raises:
        ValueError: a bad `checkpoint_every`; a metric named in `metrics`
            that the logs lack (at the epoch's end, on every rank).

    Example:
        >>> model.fit(x, y, epochs=5, callbacks=[ReportCheckpointCallback()])
    """

    def __init__(self, metrics=None, checkpoint_every=1):
        super().__init__()
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) \
                or checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be a whole number >= 0, got "
                             f"{checkpoint_every!r}")
        self.metrics = None if metrics is None else list(metrics)
        self.checkpoint_every = checkpoint_every
        self._last_epoch = None

    def on_train_begin(self, logs=None):
        self._last_epoch = self.params.get("epochs") if self.params else None

    def _averaged(self, logs):
        logs = logs or {}
        if self.metrics is None:
            names = sorted(k for k, v in logs.items() if _numeric(v))
        else:
            missing = [k for k in self.metrics if k not in logs]
            if missing:
                raise ValueError(f"ReportCheckpointCallback: the epoch's logs have no "
                                 f"{', '.join(missing)} (they have {', '.join(sorted(logs))})")
            names = sorted(self.metrics)
        if not names:
            return {}
        values = [tf.constant(np.asarray(logs[k], dtype=np.float64).reshape(())) for k in names]
        reduced = hvd_tf.grouped_allreduce(values, op=hvd_tf.Average,
                                           name="tfring_ray_report_metrics")
        return {k: float(v.numpy()) for k, v in zip(names, reduced)}

    def on_epoch_end(self, epoch, logs=None):
        metrics = self._averaged(logs)
        metrics["epoch"] = int(epoch)
        every = self.checkpoint_every
        due = every > 0 and ((epoch + 1) % every == 0 or epoch + 1 == self._last_epoch)
        if not due or hvd.rank() != 0:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="tfring-ckpt-") as directory:
            save_checkpoint(self.model, epoch, directory)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def save_checkpoint(model, epoch, directory):
    """Writes what :func:`load_checkpoint` reads: the model (architecture,
    weights, compiled optimizer and its state) and the finished `epoch`.

    Args:
        model: a compiled Keras model.
        epoch: the epoch just finished (0-based).
        directory: an existing directory to write into.

    Example:
        >>> save_checkpoint(model, epoch, "/tmp/ckpt")
        >>> ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory("/tmp/ckpt"))
    """
    model.save(os.path.join(directory, MODEL_FILE))
    with open(os.path.join(directory, STATE_FILE), "w") as f:
        json.dump({"epoch": int(epoch)}, f)


def load_checkpoint(checkpoint=None, custom_objects=None):
    """The model and the epoch to start from, restored from a checkpoint.

    Args:
        checkpoint: a ``ray.train.Checkpoint`` that :class:`ReportCheckpointCallback`
            (or :func:`save_checkpoint`) wrote; None: ``ray.train.get_checkpoint()``,
            the run's latest (set when Ray restarted the group, or resumed a run).
        custom_objects: passed to Keras' ``load_model`` (custom layers).

    Returns:
        (model, initial_epoch): the model with its weights and its optimizer
        (wrapped in ``hvd.DistributedOptimizer``, its state kept), and the
        epoch after the checkpoint's, for ``fit(initial_epoch=...)``; or
        (None, 0) when there is no checkpoint.

    Raises:
        ValueError: the checkpoint holds no tfring Keras model.

    Example:
        >>> model, initial_epoch = load_checkpoint()
        >>> model = model or build_and_compile()
    """
    if checkpoint is None:
        checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None, 0
    with checkpoint.as_directory() as directory:
        path, state = os.path.join(directory, MODEL_FILE), os.path.join(directory, STATE_FILE)
        if not (os.path.exists(path) and os.path.exists(state)):
            raise ValueError(f"checkpoint {checkpoint} has no {MODEL_FILE} and {STATE_FILE}: "
                             "it was not written by tfring.ray.keras")
        model = hvd.load_model(path, custom_objects=custom_objects)
        with open(state) as f:
            epoch = int(json.load(f)["epoch"])
    return model, epoch + 1
