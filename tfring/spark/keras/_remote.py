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


def _checkpoint_model(store, run_id, custom_objects):
    """The run's checkpoint as a compiled model whose optimizer (distributed,
    its variables restored) carries on where the run stopped.

    Raises:
        ValueError: the checkpoint holds no optimizer (not written by a fit).
    """
    import tfring.keras as hvd
    path = store.get_checkpoint_path(run_id)
    with tempfile.TemporaryDirectory(prefix="tfring-keras-") as scratch:
        local = os.path.join(scratch, "model.keras")
        with open(local, "wb") as f:
            f.write(store.read(path))
        model = hvd.load_model(local, custom_objects=custom_objects)
    if getattr(model, "optimizer", None) is None or not model.optimizer.built:
        raise ValueError(f"the checkpoint of run {run_id!r} at {path!r} holds no optimizer "
                         f"state to start from; remove the run or choose another run_id")
    return model


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

    initial_epoch, history, opt = 0, {}, None
    run_id = spec["run_id"]
    if run_id and store.exists(store.get_checkpoint_state_path(run_id)):
        # Horovod's hot start: the run's last checkpoint (weights and the
        # optimizer with its state: slots, iterations), from its next epoch.
        state = json.loads(store.read(store.get_checkpoint_state_path(run_id)))
        model = _checkpoint_model(store, run_id, custom)
        opt = model.optimizer
        initial_epoch, history = state["epoch"], state["history"]
    else:
        model = load_model(spec["model"], custom)
    if opt is None:
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
        # The epochs' metrics as CSV and as TensorBoard event files.
        callbacks.append(tf.keras.callbacks.CSVLogger(os.path.join(logs_dir, "history.csv"),
                                                      append=bool(initial_epoch)))
        callbacks.append(_EpochSummaries(logs_dir))
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


class _EpochSummaries:
    """Rank 0's TensorBoard event files: each epoch's metrics as scalars,
    laid out as Keras's TensorBoard callback does (``train/`` and
    ``validation/``, tags ``epoch_<metric>``, step = epoch). Written with
    TensorFlow's own summary writer and the scalars plugin's metadata:
    Keras's callback needs the tensorboard package, which TensorFlow no
    longer installs, and fails without it."""

    def __new__(cls, logs_dir):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR)

        class EpochSummaries(tf.keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.writers = {}

            def _writer(self, kind):
                if kind not in self.writers:
                    self.writers[kind] = tf.summary.create_file_writer(
                        os.path.join(logs_dir, kind))
                return self.writers[kind]

            def on_epoch_end(self, epoch, logs=None):
                for name, value in sorted((logs or {}).items()):
                    kind = "validation" if name.startswith("val_") else "train"
                    tag = "epoch_" + (name[4:] if kind == "validation" else name)
                    with self._writer(kind).as_default(step=epoch):
                        tf.summary.write(tag, tf.constant(float(value), tf.float32),
                                         metadata=metadata)
                for writer in self.writers.values():
                    writer.flush()

            def on_train_end(self, logs=None):
                for writer in self.writers.values():
                    writer.close()

        return EpochSummaries()


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


