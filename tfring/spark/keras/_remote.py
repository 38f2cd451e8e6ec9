"""What each rank of a ``KerasEstimator`` fit runs, in its own process.

The model travels as a ``.keras`` file's bytes, the optimizer and the loss
as their Keras configs (never pickled: Horovod's pickled optimizers are
what broke on TF 2.11). Rank 0 writes the checkpoint and TensorBoard logs
to the store at every epoch's end.
"""
import json
import os
import tempfile


def model_bytes(model):
    """`model` as the bytes of a ``.keras`` file (architecture and weights)."""
    with tempfile.TemporaryDirectory(prefix="tfring-keras-") as scratch:
        path = os.path.join(scratch, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def load_model(data, custom_objects=None):
    import tensorflow as tf
    with tempfile.TemporaryDirectory(prefix="tfring-keras-") as scratch:
        path = os.path.join(scratch, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return tf.keras.models.load_model(path, custom_objects=custom_objects, compile=False)


def serialize(obj):
    """A Keras object (optimizer, loss, metric) as its config; strings and
    None stay as they are."""
    if obj is None or isinstance(obj, str):
        return obj
    import tensorflow as tf
    return ("keras", tf.keras.utils.serialize_keras_object(obj))


def deserialize(spec, custom_objects=None):
    if isinstance(spec, tuple) and spec and spec[0] == "keras":
        import tensorflow as tf
        return tf.keras.utils.deserialize_keras_object(spec[1], custom_objects=custom_objects)
    return spec


def _has_tensorboard():
    import importlib.util
    return importlib.util.find_spec("tensorboard") is not None


def _rss_mb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def train(spec):
    """One rank's fit; `spec` is the dict the estimator built. Returns, on
    every rank, its row counts and peak memory; on rank 0 also the trained
    model's bytes and the history."""
    import tensorflow as tf

    import tfring.keras as hvd
    import tfring.keras.callbacks  # noqa: F401  (hvd.callbacks)
    from tfring.spark import data as spark_data
    from tfring.spark.common.store import Store

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    store = Store.create(spec["store"], **spec["store_options"])
    custom = spec["custom_objects"]
    if spec["seed"] is not None:
        tf.keras.utils.set_random_seed(spec["seed"] + rank)
    batch, val_batch = spec["batch_size"], spec["val_batch_size"]
    train_data, counts = spark_data.dataset(
        store, spec["train_path"], rank, size, spec["layout"], batch,
        spec["shuffle_buffer_size"], None if spec["seed"] is None else spec["seed"] + rank,
        spec["read_rows"])
    empty = [r for r, n in enumerate(counts) if n == 0]
    if empty:
        raise ValueError(f"ranks {empty} have no training rows: the data set has "
                         f"{sum(counts)} rows for {size} ranks")
    # Every rank takes the same number of steps (one allreduce each).
    steps = spec["train_steps_per_epoch"] or -(-min(counts) // batch)
    val_data, val_steps, val_counts = None, None, None
    if spec["val_path"] is not None:
        val_data, val_counts = spark_data.dataset(store, spec["val_path"], rank, size,
                                                  spec["layout"], val_batch, 0, None,
                                                  spec["read_rows"])
        if min(val_counts) == 0:
            raise ValueError(f"ranks {[r for r, n in enumerate(val_counts) if n == 0]} have "
                             f"no validation rows ({sum(val_counts)} for {size} ranks)")
        val_steps = spec["validation_steps_per_epoch"] or -(-min(val_counts) // val_batch)

    model = load_model(spec["model"], custom)
    initial_epoch, history = 0, {}
    run_id = spec["run_id"]
    if run_id and store.exists(store.get_checkpoint_state_path(run_id)):
        # Horovod's hot start: the run's last checkpoint, from its next epoch.
        state = json.loads(store.read(store.get_checkpoint_state_path(run_id)))
        model.set_weights(load_model(store.read(store.get_checkpoint_path(run_id)),
                                     custom).get_weights())
        initial_epoch, history = state["epoch"], state["history"]
    opt = deserialize(spec["optimizer"], custom)
    if isinstance(opt, str):
        opt = tf.keras.optimizers.get(opt)
    opt = hvd.DistributedOptimizer(opt)
    loss = deserialize(spec["loss"], custom)
    if isinstance(loss, list):
        loss = [deserialize(x, custom) for x in loss]
    metrics = [deserialize(m, custom) for m in spec["metrics"] or []]
    model.compile(optimizer=opt, loss=loss, metrics=metrics or None,
                  loss_weights=spec["loss_weights"], jit_compile=False)
    user_callbacks = list(spec["callbacks"] or [])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()] + user_callbacks
    logs_dir = None
    if rank == 0 and run_id and store.saving_runs():
        logs_dir = tempfile.mkdtemp(prefix="tfring-logs-")
        store.download(store.get_logs_path(run_id), logs_dir)
        # The epochs' metrics as CSV always; TensorBoard's event files too
        # where the tensorboard package is installed (TensorFlow no longer
        # brings it).
        callbacks.append(tf.keras.callbacks.CSVLogger(os.path.join(logs_dir, "history.csv"),
                                                      append=bool(initial_epoch)))
        if _has_tensorboard():
            callbacks.append(tf.keras.callbacks.TensorBoard(logs_dir, write_graph=False,
                                                            profile_batch=0))
        callbacks.append(_Checkpoint(store, run_id, logs_dir, history))
    rss_before = _rss_mb()
    fit = model.fit(train_data, steps_per_epoch=steps, epochs=spec["epochs"],
                    initial_epoch=initial_epoch, validation_data=val_data, shuffle=False,
                    validation_steps=val_steps, verbose=spec["verbose"] if rank == 0 else 0,
                    callbacks=callbacks)
    if logs_dir is not None:
        import shutil
        shutil.rmtree(logs_dir, ignore_errors=True)
    merged = {k: list(history.get(k, [])) + [float(v) for v in vs]
              for k, vs in fit.history.items()}
    result = {"rank": rank, "rows": counts[rank], "steps_per_epoch": steps,
              "val_rows": None if val_counts is None else val_counts[rank],
              "peak_rss_mb": _rss_mb(), "rss_at_fit_mb": rss_before}
    if rank == 0:
        result["model"] = model_bytes(model)
        result["history"] = merged
    return result


class _Checkpoint:
    """Rank 0's per-epoch save into the store: the model, which epoch and
    the history so far (a hot start's state), and the TensorBoard logs."""

    def __new__(cls, store, run_id, logs_dir, history):
        import tensorflow as tf

        class Checkpoint(tf.keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.history = {k: list(v) for k, v in history.items()}

            def on_epoch_end(self, epoch, logs=None):
                for k, v in (logs or {}).items():
                    self.history.setdefault(k, []).append(float(v))
                store.write(store.get_checkpoint_path(run_id), model_bytes(self.model))
                state = {"epoch": epoch + 1, "history": self.history}
                store.write(store.get_checkpoint_state_path(run_id),
                            json.dumps(state).encode())
                store.upload(logs_dir, store.get_logs_path(run_id))

        return Checkpoint()


