"""A small Keras estimator over Spark DataFrames, in the shape of Horovod's
``horovod.spark.keras.KerasEstimator``.

``KerasEstimator(...).fit(df)`` trains a compiled-on-the-workers copy of a
Keras model with tfring on `num_proc` Spark tasks: the DataFrame is split
into `num_proc` partitions and each rank reads its own (no copy goes
through the driver), trains with ``hvd.DistributedOptimizer`` from rank 0's
initial weights, and rank 0 hands the trained model back.
``KerasModel.transform(df)`` adds one prediction column per label column.

Out of scope (unlike Horovod): Petastorm, remote stores and checkpoints
between epochs, validation splits, sample weights, several label columns.
The data of each partition must fit in its task's memory.
"""
import os
import tempfile

import numpy as np

from tfring.spark.runner import run_on_partitions


def _row_features(row, columns):
    """One row's feature vector: the columns' values (numbers, arrays or
    Spark ML vectors) flattened and concatenated, as float32."""
    parts = []
    for name in columns:
        value = row[name]
        if value is None:
            raise ValueError(f"feature column {name!r} holds a null")
        if hasattr(value, "toArray"):
            value = value.toArray()
        parts.append(np.asarray(value, dtype=np.float32).ravel())
    return np.concatenate(parts)


def _partition_arrays(feature_cols, label_col):
    """A function from a partition's rows to (features, labels) arrays."""
    def read(rows):
        x, y = [], []
        for row in rows:
            x.append(_row_features(row, feature_cols))
            label = row[label_col]
            if label is None:
                raise ValueError(f"label column {label_col!r} holds a null")
            y.append(np.asarray(label.toArray() if hasattr(label, "toArray") else label))
        if not x:
            return np.zeros((0, 0), np.float32), np.zeros((0,), np.float32)
        return np.stack(x), np.stack(y)
    return read


def _model_bytes(model):
    with tempfile.TemporaryDirectory(prefix="tfring-keras-") as scratch:
        path = os.path.join(scratch, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def _load_model(data, custom_objects=None, compile=False):
    import tensorflow as tf
    with tempfile.TemporaryDirectory(prefix="tfring-keras-") as scratch:
        path = os.path.join(scratch, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return tf.keras.models.load_model(path, custom_objects=custom_objects, compile=compile)


def _serialize(obj):
    """A Keras object (optimizer, loss) as its config; strings stay strings."""
    if obj is None or isinstance(obj, str):
        return obj
    import tensorflow as tf
    return ("keras", tf.keras.utils.serialize_keras_object(obj))


def _deserialize(spec, custom_objects=None):
    if isinstance(spec, tuple) and spec and spec[0] == "keras":
        import tensorflow as tf
        return tf.keras.utils.deserialize_keras_object(spec[1], custom_objects=custom_objects)
    return spec


def _train_rank(x, y, model_data, optimizer, loss, metrics, batch_size, epochs, shuffle, seed,
                verbose, custom_objects):
    """One rank's training (in its own process); rank 0 returns the model."""
    import tensorflow as tf

    import tfring.keras as hvd
    import tfring.keras.callbacks  # noqa: F401  (makes hvd.callbacks available)
    from tfring.tensorflow import allgather_object

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    counts = allgather_object(len(x))
    empty = [r for r, n in enumerate(counts) if n == 0]
    if empty:
        raise ValueError(f"the partitions of ranks {empty} hold no rows: the DataFrame has "
                         f"{sum(counts)} rows for {size} ranks")
    # Every rank takes the same number of steps per epoch (one allreduce
    # each): the smallest partition's batch count; larger partitions are
    # read on, across epochs, from a repeated dataset.
    steps = min((n + batch_size - 1) // batch_size for n in counts)
    if seed is not None:
        tf.keras.utils.set_random_seed(seed + rank)
    model = _load_model(model_data, custom_objects)
    opt = hvd.DistributedOptimizer(_deserialize(optimizer, custom_objects))
    model.compile(optimizer=opt, loss=_deserialize(loss, custom_objects),
                  metrics=list(metrics or []), jit_compile=False)
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        data = data.shuffle(len(x), seed=None if seed is None else seed + rank,
                            reshuffle_each_iteration=True)
    data = data.repeat().batch(batch_size)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    history = model.fit(data, steps_per_epoch=steps, epochs=epochs, verbose=verbose,
                        shuffle=False, callbacks=callbacks)
    result = {"rank": rank, "rows": int(len(x)), "steps_per_epoch": steps,
              "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}}
    if rank == 0:
        result["model"] = _model_bytes(model)
    return result


class KerasEstimator:
    """Trains a Keras model on a Spark DataFrame with tfring.

    Args:
        model: a Keras model (its weights are the starting point; it is
            compiled on the workers, not here).
        optimizer: a Keras optimizer (instance or name); its learning rate
            is used as is (scale it by `num_proc` yourself if you want
            Horovod's convention).
        loss: a loss name or Keras loss object.
        feature_cols: the columns concatenated into each row's input: numbers,
            arrays or Spark ML vectors.
        label_cols: one label column (a list of one, as Horovod takes it).
        batch_size: the batch size per rank.
        epochs: how many epochs.
        num_proc: how many ranks; default the context's ``defaultParallelism``.
        metrics: metric names, averaged over ranks each epoch.
        output_cols: the prediction column's name, in a list; default
            ``[label + "__output"]``.
        shuffle: shuffle each rank's rows every epoch.
        seed: makes the run repeatable (each rank seeds ``seed + rank``).
        verbose: Keras's ``fit`` verbosity on the workers.
        custom_objects: for models or losses of your own classes.
        start_timeout, timeout: as :func:`tfring.spark.run`.

    Raises:
        ValueError: missing model, optimizer, loss or columns; not exactly
            one label column; a bad batch size or epoch count.

    Example:
        >>> est = KerasEstimator(model=model, optimizer=tf.keras.optimizers.SGD(0.1),
        ...                      loss="sparse_categorical_crossentropy",
        ...                      feature_cols=["features"], label_cols=["label"],
        ...                      batch_size=32, epochs=5, num_proc=2)
        >>> trained = est.fit(train_df)
        >>> trained.transform(test_df).select("label", "label__output").show()
    """

    def __init__(self, model=None, optimizer=None, loss=None, feature_cols=None,
                 label_cols=None, batch_size=32, epochs=1, num_proc=None, metrics=None,
                 output_cols=None, shuffle=True, seed=None, verbose=0, custom_objects=None,
                 start_timeout=None, timeout=None):
        if model is None or optimizer is None or loss is None:
            raise ValueError("KerasEstimator needs a model, an optimizer and a loss")
        if not feature_cols:
            raise ValueError("KerasEstimator needs feature_cols (a list of column names)")
        if isinstance(feature_cols, str):
            feature_cols = [feature_cols]
        if isinstance(label_cols, str):
            label_cols = [label_cols]
        if not label_cols or len(label_cols) != 1:
            raise ValueError(f"KerasEstimator takes exactly one label column, got "
                             f"{label_cols!r}")
        if output_cols is None:
            output_cols = [label_cols[0] + "__output"]
        if isinstance(output_cols, str):
            output_cols = [output_cols]
        if len(output_cols) != 1:
            raise ValueError(f"one output column per label column, got {output_cols!r}")
        for name, value in (("batch_size", batch_size), ("epochs", epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        self.model, self.optimizer, self.loss = model, optimizer, loss
        self.feature_cols, self.label_cols = list(feature_cols), list(label_cols)
        self.output_cols = list(output_cols)
        self.batch_size, self.epochs, self.num_proc = batch_size, epochs, num_proc
        self.metrics, self.shuffle, self.seed = metrics, shuffle, seed
        self.verbose, self.custom_objects = verbose, custom_objects
        self.start_timeout, self.timeout = start_timeout, timeout

    def fit(self, df):
        """Trains on `df`; returns a :class:`KerasModel`.

        Raises:
            ValueError: a column is missing from `df`, or a rank's partition
                is empty (fewer rows than ranks).
            Exception: as :func:`tfring.spark.run`, e.g. a worker's error.
        """
        missing = [c for c in self.feature_cols + self.label_cols if c not in df.columns]
        if missing:
            raise ValueError(f"the DataFrame has no column(s) {missing}; it has {df.columns}")
        sc = df.sparkSession.sparkContext
        num_proc = self.num_proc or sc.defaultParallelism
        rdd = df.select(*self.feature_cols, *self.label_cols).repartition(num_proc).rdd
        results = run_on_partitions(
            rdd, _train_rank,
            args=(_model_bytes(self.model), _serialize(self.optimizer), _serialize(self.loss),
                  self.metrics, self.batch_size, self.epochs, self.shuffle, self.seed,
                  self.verbose, self.custom_objects),
            partition_args=_partition_arrays(self.feature_cols, self.label_cols[0]),
            start_timeout=self.start_timeout, timeout=self.timeout)
        return KerasModel(results[0]["model"], self.feature_cols, self.output_cols[0],
                          history=results[0]["history"], custom_objects=self.custom_objects,
                          ranks=[{k: r[k] for k in ("rank", "rows", "steps_per_epoch")}
                                 for r in results])


class KerasModel:
    """A trained model from :meth:`KerasEstimator.fit`.

    Attributes:
        history: the epochs' metrics (averaged over ranks), as Keras's
            ``History.history``.
        ranks: per rank, how many rows it trained on and its steps per epoch.
    """

    def __init__(self, model_data, feature_cols, output_col, history=None,
                 custom_objects=None, ranks=None):
        self._data = model_data
        self.feature_cols, self.output_col = list(feature_cols), output_col
        self.history, self.ranks = history or {}, ranks or []
        self._custom_objects = custom_objects
        self._model = None

    def keras(self):
        """The trained Keras model, loaded in this process."""
        if self._model is None:
            self._model = _load_model(self._data, self._custom_objects)
        return self._model

    getModel = keras  # Horovod's name

    def transform(self, df, batch_size=256):
        """`df` with the prediction column added: a double for a model with
        one output value per row, an array of doubles otherwise.

        Raises:
            ValueError: a feature column is missing from `df`.
        """
        from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType
        missing = [c for c in self.feature_cols if c not in df.columns]
        if missing:
            raise ValueError(f"the DataFrame has no column(s) {missing}; it has {df.columns}")
        if self.output_col in df.columns:
            raise ValueError(f"the DataFrame already has a column {self.output_col!r}")
        model = self.keras()
        width = int(np.prod([d for d in model.output_shape[1:] if d is not None]) or 1)
        scalar = width == 1
        schema = StructType(df.schema.fields + [StructField(
            self.output_col, DoubleType() if scalar else ArrayType(DoubleType()), True)])
        data, feature_cols = self._data, self.feature_cols
        custom_objects = self._custom_objects

        def predict(rows):
            rows = list(rows)
            if not rows:
                return
            keras_model = _cached_model(data, custom_objects)
            x = np.stack([_row_features(r, feature_cols) for r in rows])
            out = keras_model.predict(x, batch_size=batch_size, verbose=0).reshape(len(rows), -1)
            for row, values in zip(rows, out):
                yield tuple(row) + ((float(values[0]),) if scalar else
                                    ([float(v) for v in values],))

        return df.sparkSession.createDataFrame(df.rdd.mapPartitions(predict), schema)


_MODELS = {}


def _cached_model(data, custom_objects):
    """The model of `data`, loaded once per Spark Python worker."""
    import hashlib
    key = hashlib.sha256(data).hexdigest()
    if key not in _MODELS:
        _MODELS.clear()
        _MODELS[key] = _load_model(data, custom_objects)
    return _MODELS[key]
