"""``KerasEstimator``: Horovod's ``horovod.spark.keras.KerasEstimator`` on
tfring, without Petastorm.

``fit(df)`` checks the columns and the store, writes the DataFrame (and
its validation rows) to Parquet in the store, and starts `num_proc` ranks
as one barrier stage (:func:`tfring.spark.runner.run_on_partitions`). Each
rank streams its share of the Parquet into ``tf.data``
(:mod:`tfring.spark.data`), trains with ``hvd.DistributedOptimizer`` from
rank 0's weights and, with a `run_id`, rank 0 checkpoints into the store
every epoch. The intermediate Parquet is removed afterwards: the store
keeps only the run. ``fit_on_parquet()`` trains on Parquet already there.
"""
import uuid

import numpy as np
from pyspark.ml import Estimator

from tfring.spark import data as spark_data
from tfring.spark.common.store import Store
from tfring.spark.keras import _remote
from tfring.spark.keras.model import KerasModel
from tfring.spark.runner import run_on_partitions


def _whole(name, value, low=1, optional=False):
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")


def _as_list(value):
    return [value] if isinstance(value, str) else list(value or [])


class KerasEstimator(Estimator):
    """Trains a Keras model on a Spark DataFrame with tfring (Horovod's arguments).

    Args:
        model: a Keras model; its weights are the starting point. One input
            takes every feature column (concatenated); a model with as many
            inputs as feature columns takes one column each.
        optimizer: a Keras optimizer (instance or name). It travels as its
            config; its learning rate is used as given.
        loss: a loss (name or object), or a list, one per output.
        store: a :class:`Store` (or a path/URL for ``Store.create``) for the
            intermediate Parquet, checkpoints and logs. Default: a temporary
            local store, removed after the fit.
        feature_cols: the input columns (numbers, arrays, Spark ML vectors).
        label_cols: the label columns, one per model output.
        sample_weight_col: a column of per-row loss weights.
        validation: a fraction of the rows (0 < v < 1) held out at random,
            or the name of a boolean column marking validation rows.
        metrics: Keras metrics, averaged over the ranks every epoch.
        loss_weights: per-output loss weights.
        callbacks: Keras callbacks, run on every rank (pickled).
        custom_objects: for models, losses or metrics of your own classes;
            saved with the :class:`KerasModel` (cloudpickle, as Horovod).
        batch_size, val_batch_size: rows per batch and rank (val default:
            batch_size).
        epochs: how many epochs.
        train_steps_per_epoch, validation_steps_per_epoch: steps per epoch
            (default: the smallest rank share, in batches).
        shuffle_buffer_size: rows in each rank's shuffle buffer (0: read in
            order). Default: 64 batches.
        shuffle: False reads each rank's share in order, whatever
            `shuffle_buffer_size` says.
        run_id: a name for the run: checkpoints and TensorBoard logs go to
            ``store.get_checkpoint_path(run_id)`` / ``get_logs_path(run_id)``
            every epoch, and a fit whose run has a checkpoint starts from it:
            its weights and its optimizer with the optimizer's state (then
            `optimizer` is not used); the epochs already done are not run
            again.
        num_proc: how many ranks; default the context's defaultParallelism.
        verbose: Keras's fit verbosity on rank 0.
        random_seed (or seed): makes a run repeatable (rank r seeds
            ``random_seed + r``).
        output_cols: the prediction columns (default ``<label>__output``).
        read_rows: rows each rank reads from Parquet at a time.
        start_timeout, timeout: as :func:`tfring.spark.run`.

    Raises:
        ValueError: a missing or malformed argument.

    Example:
        >>> est = KerasEstimator(model=model, optimizer=tf.keras.optimizers.SGD(0.1),
        ...                      loss="sparse_categorical_crossentropy", store=Store.create("/tmp/s"),
        ...                      feature_cols=["features"], label_cols=["label"],
        ...                      validation=0.1, batch_size=32, epochs=5, num_proc=2, run_id="r1")
        >>> trained = est.fit(train_df)
        >>> trained.transform(test_df).select("label__output").show()
    """

    def __init__(self, model=None, optimizer=None, loss=None, store=None, feature_cols=None,
                 label_cols=None, sample_weight_col=None, validation=None, metrics=None,
                 loss_weights=None, callbacks=None, custom_objects=None, batch_size=32,
                 val_batch_size=None, epochs=1, train_steps_per_epoch=None,
                 validation_steps_per_epoch=None, shuffle_buffer_size=None, run_id=None,
                 num_proc=None, verbose=0, random_seed=None, output_cols=None, read_rows=4096,
                 start_timeout=None, timeout=None, seed=None, shuffle=True):
        super().__init__()
        if model is None or optimizer is None or loss is None:
            raise ValueError("KerasEstimator needs a model, an optimizer and a loss")
        feature_cols, label_cols = _as_list(feature_cols), _as_list(label_cols)
        if not feature_cols:
            raise ValueError("KerasEstimator needs feature_cols (a list of column names)")
        if not label_cols:
            raise ValueError("KerasEstimator needs label_cols (a list of column names)")
        outputs = len(model.outputs)
        if len(label_cols) != outputs:
            raise ValueError(f"label_cols has {len(label_cols)} column(s) {label_cols}, but the "
                             f"model has {outputs} output(s): one label column per output")
        inputs = len(model.inputs)
        if inputs != 1 and inputs != len(feature_cols):
            raise ValueError(f"the model has {inputs} inputs for {len(feature_cols)} "
                             f"feature_cols: give one column per input, or a one-input model")
        output_cols = _as_list(output_cols) or [c + "__output" for c in label_cols]
        if len(output_cols) != len(label_cols):
            raise ValueError(f"one output column per label column, got {output_cols!r}")
        for name, value in (("batch_size", batch_size), ("epochs", epochs),
                            ("read_rows", read_rows)):
            _whole(name, value)
        for name, value in (("val_batch_size", val_batch_size),
                            ("train_steps_per_epoch", train_steps_per_epoch),
                            ("validation_steps_per_epoch", validation_steps_per_epoch),
                            ("num_proc", num_proc)):
            _whole(name, value, optional=True)
        _whole("shuffle_buffer_size", shuffle_buffer_size, low=0, optional=True)
        if validation is not None and not isinstance(validation, str) and not (
                isinstance(validation, float) and 0 < validation < 1):
            raise ValueError(f"validation must be a fraction between 0 and 1 or a column name, "
                             f"got {validation!r}")
        if isinstance(loss, (list, tuple)) and len(loss) != outputs:
            raise ValueError(f"{len(loss)} losses for {outputs} outputs")
        self.model, self.optimizer, self.loss = model, optimizer, loss
        self.store = Store.create(store) if isinstance(store, str) else store
        self.feature_cols, self.label_cols, self.output_cols = feature_cols, label_cols, \
            output_cols
        self.sample_weight_col, self.validation = sample_weight_col, validation
        self.metrics, self.loss_weights = metrics, loss_weights
        self.callbacks, self.custom_objects = callbacks, custom_objects
        self.batch_size, self.epochs = batch_size, epochs
        self.val_batch_size = val_batch_size or batch_size
        self.train_steps_per_epoch = train_steps_per_epoch
        self.validation_steps_per_epoch = validation_steps_per_epoch
        if not shuffle:
            shuffle_buffer_size = 0
        elif shuffle_buffer_size is None:
            shuffle_buffer_size = 64 * batch_size
        self.shuffle_buffer_size = shuffle_buffer_size
        self.run_id, self.num_proc, self.verbose = run_id, num_proc, verbose
        self.random_seed = random_seed if random_seed is not None else seed
        self.read_rows, self.start_timeout, self.timeout = read_rows, start_timeout, timeout

    # -- checks before any rank starts -------------------------------------------
    def _columns(self):
        cols = list(dict.fromkeys(self.feature_cols + self.label_cols))
        return cols + ([self.sample_weight_col] if self.sample_weight_col else [])

    def _layout(self, widths):
        groups = [self.feature_cols] if len(self.model.inputs) == 1 else \
            [[c] for c in self.feature_cols]
        model = self.model
        for group, shape in zip(groups, _shapes(model.input_shape, len(model.inputs))):
            want = _width(shape)
            got = sum(max(widths[c], 1) for c in group)
            if want is not None and want != got:
                raise ValueError(f"feature column(s) {group} hold {got} values per row; the "
                                 f"model's input takes {want}")
        for label, shape in zip(self.label_cols, _shapes(model.output_shape,
                                                          len(model.outputs))):
            out, got = _width(shape), widths[label]
            if got > 1 and out is not None and got != out:
                raise ValueError(f"label column {label!r} holds {got} values per row, but the "
                                 f"model's output for it gives {out}")
        if self.sample_weight_col and widths[self.sample_weight_col]:
            raise ValueError(f"sample_weight_col {self.sample_weight_col!r} must hold one "
                             f"number per row, not arrays")
        return {"inputs": groups, "labels": list(self.label_cols),
                "weight": self.sample_weight_col, "widths": widths}

    def _check_dataframe(self, df):
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, NumericType, BooleanType
        wanted = self._columns() + ([self.validation] if isinstance(self.validation, str)
                                    else [])
        missing = [c for c in wanted if c not in df.columns]
        if missing:
            raise ValueError(f"the DataFrame has no column(s) {missing}; it has {df.columns}")
        counts = df.select([F.count(F.when(F.col(c).isNull(), 1)).alias(c)
                            for c in self._columns()] + [F.count(F.lit(1)).alias("__rows")]
                           ).first().asDict()
        nulls = {c: n for c, n in counts.items() if c != "__rows" and n}
        if nulls:
            raise ValueError(f"column(s) hold nulls (rows with a null per column): {nulls}")
        if not counts["__rows"]:
            raise ValueError("the DataFrame has no rows")
        first = df.select(self._columns()).first()
        widths = {}
        for field in df.select(self._columns()).schema.fields:
            kind, value = field.dataType, first[field.name]
            if isinstance(kind, (NumericType, BooleanType)):
                widths[field.name] = 0
            elif isinstance(kind, ArrayType) or hasattr(value, "toArray"):
                widths[field.name] = len(value.toArray() if hasattr(value, "toArray") else value)
            else:
                raise ValueError(f"column {field.name!r} is of type {kind.simpleString()}: "
                                 f"the estimator reads numbers, arrays and vectors")
        return self._layout(widths)

    def _parquet_layout(self, store, path):
        import pyarrow as pa
        import pyarrow.parquet as pq
        files = store.parquet_files(path)
        if not files:
            raise ValueError(f"no Parquet files at {path!r}")
        with store.fs.open(files[0], "rb") as f:
            reader = spark_data.parquet_file(f)
            schema = reader.schema_arrow
            missing = [c for c in self._columns() if c not in schema.names]
            if missing:
                raise ValueError(f"the Parquet at {path!r} has no column(s) {missing}; it has "
                                 f"{schema.names}")
            first = next(reader.iter_batches(batch_size=1, columns=self._columns()))
        widths = {}
        for c in self._columns():
            kind = schema.field(c).type
            if pa.types.is_list(kind) or pa.types.is_large_list(kind) or \
                    pa.types.is_fixed_size_list(kind):
                widths[c] = len(first.column(c)[0])
            else:
                widths[c] = 0
        nulls = {}
        for name in files:
            with store.fs.open(name, "rb") as f:
                meta = pq.ParquetFile(f).metadata
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                for i in range(group.num_columns):
                    column = group.column(i)
                    top = column.path_in_schema.split(".")[0]
                    stats = column.statistics
                    if top in widths and stats is not None and stats.has_null_count and \
                            stats.null_count:
                        nulls[top] = nulls.get(top, 0) + stats.null_count
        if nulls:
            raise ValueError(f"the Parquet at {path!r} holds nulls in {nulls}")
        return self._layout(widths)

    # -- fitting --------------------------------------------------------------
    def _fit(self, dataset):
        """Writes `dataset` to Parquet in the store and trains on it; returns
        a :class:`KerasModel`.

        Raises:
            ValueError: a missing column, a null, a label or feature width
                the model does not take, no rows.
            OSError: the store cannot be written.
            Exception: a rank's own exception, as :func:`tfring.spark.run`.
        """
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F
        layout = self._check_dataframe(dataset)
        store, temporary = self._store()
        idx = uuid.uuid4().hex[:12]
        train_path = store.get_train_data_path(idx)
        val_path = store.get_val_data_path(idx) if self.validation is not None else None
        try:
            columns = [vector_to_array(F.col(c)).alias(c)
                       if hasattr(dataset.select(c).first()[0], "toArray") else F.col(c)
                       for c in self._columns()]
            if isinstance(self.validation, str):
                marked = F.col(self.validation).cast("boolean")
                train_df = dataset.filter(~marked).select(columns)
                val_df = dataset.filter(marked).select(columns)
            elif self.validation is not None:
                train_df, val_df = dataset.select(columns).randomSplit(
                    [1 - self.validation, self.validation],
                    seed=self.random_seed if self.random_seed is not None else 0)
            else:
                train_df, val_df = dataset.select(columns), None
            train_df.write.mode("overwrite").parquet(train_path)
            if val_df is not None:
                val_df.write.mode("overwrite").parquet(val_path)
            return self._train(dataset.sparkSession.sparkContext, store, train_path, val_path,
                               layout)
        finally:
            store.remove(train_path)
            if val_path:
                store.remove(val_path)
            if temporary:
                store.remove(store.prefix_path)

    def fit_on_parquet(self, train_path=None, val_path=None, spark=None):
        """Trains on Parquet already in the store (Horovod's
        ``fit_on_parquet``): default ``store.get_train_data_path()`` and, if
        it exists, ``store.get_val_data_path()``. The files are left there.

        Returns and raises as :meth:`fit`.
        """
        from pyspark import SparkContext
        store = self.store
        if store is None:
            raise ValueError("fit_on_parquet needs the estimator's store")
        train_path = train_path or store.get_train_data_path()
        if val_path is None and store.is_parquet_dataset(store.get_val_data_path()):
            val_path = store.get_val_data_path()
        layout = self._parquet_layout(store, train_path)
        if val_path is not None:
            self._parquet_layout(store, val_path)
        store.check_writable()
        sc = spark.sparkContext if spark is not None else SparkContext._active_spark_context
        if sc is None:
            raise RuntimeError("fit_on_parquet needs an active SparkSession")
        return self._train(sc, store, train_path, val_path, layout)

    def _store(self):
        if self.store is not None:
            self.store.check_writable()
            return self.store, False
        import tempfile
        return Store.create(tempfile.mkdtemp(prefix="tfring-store-")), True

    def _train(self, sc, store, train_path, val_path, layout):
        num_proc = self.num_proc or sc.defaultParallelism
        spec = {"store": store.prefix_path, "store_options": {"storage_options":
                                                              store.storage_options},
                "train_path": train_path, "val_path": val_path, "layout": layout,
                "model": _remote.model_bytes(self.model),
                "optimizer": _remote.serialize(self.optimizer),
                "loss": [_remote.serialize(x) for x in self.loss]
                if isinstance(self.loss, (list, tuple)) else _remote.serialize(self.loss),
                "loss_weights": self.loss_weights,
                "metrics": [_remote.serialize(m) for m in self.metrics or []],
                "callbacks": self.callbacks, "custom_objects": self.custom_objects,
                "batch_size": self.batch_size, "val_batch_size": self.val_batch_size,
                "epochs": self.epochs, "train_steps_per_epoch": self.train_steps_per_epoch,
                "validation_steps_per_epoch": self.validation_steps_per_epoch,
                "shuffle_buffer_size": self.shuffle_buffer_size, "seed": self.random_seed,
                "run_id": self.run_id if store is self.store else None,
                "verbose": self.verbose, "read_rows": self.read_rows}
        results = run_on_partitions(sc.parallelize(range(num_proc), num_proc), _remote.train,
                                    args=(spec,), start_timeout=self.start_timeout,
                                    timeout=self.timeout)
        ranks = [{k: r[k] for k in ("rank", "rows", "val_rows", "steps_per_epoch",
                                     "peak_rss_mb", "rss_at_fit_mb")} for r in results]
        return KerasModel(results[0]["model"], self.feature_cols, self.label_cols,
                          self.output_cols, history=results[0]["history"], run_id=self.run_id,
                          custom_objects=self.custom_objects, ranks=ranks,
                          inputs=layout["inputs"])


def _shapes(shape, count):
    return list(shape) if count > 1 else [shape]


def _width(shape):
    dims = [d for d in shape[1:]]
    if any(d is None for d in dims):
        return None
    return int(np.prod(dims)) if dims else 1
