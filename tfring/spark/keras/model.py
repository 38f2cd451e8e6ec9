"""``KerasModel``: what ``KerasEstimator.fit`` returns, a Spark ML ``Model``
(so it sits in a ``Pipeline``, and saves and loads through Spark ML's
writer and reader)."""
import json

import numpy as np
from pyspark.ml import Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, \
    MLWritable, MLWriter

from tfring.spark.keras import _remote


class _KerasModelParams(Params):
    featureCols = Param(Params._dummy(), "featureCols", "the model's input columns",
                        TypeConverters.toListString)
    labelCols = Param(Params._dummy(), "labelCols", "the label columns (one per output)",
                      TypeConverters.toListString)
    outputCols = Param(Params._dummy(), "outputCols", "the prediction columns transform adds",
                       TypeConverters.toListString)
    runId = Param(Params._dummy(), "runId", "the run in the store", TypeConverters.toString)


class KerasModel(Model, _KerasModelParams, MLReadable, MLWritable):
    """A Keras model trained by :class:`KerasEstimator`, as a Spark ML Model.

    ``transform(df)`` adds one prediction column per model output
    (``getOutputCols()``, by default ``<label>__output``): a double for an
    output of one value per row, an array of doubles otherwise.

    Args:
        model_data: the trained model as a ``.keras`` file's bytes.
        feature_cols, label_cols, output_cols: the columns.
        history: the epochs' metrics, averaged over the ranks.
        run_id: the run whose checkpoints are in the store.
        custom_objects: for a model of your own classes (not saved with it:
            set it again with :meth:`setCustomObjects` after ``load``).
        ranks: per rank, its rows, steps per epoch and peak memory.

    Example:
        >>> trained = estimator.fit(df)
        >>> trained.setOutputCols(["p"]).transform(test_df).select("p").show()
        >>> trained.write().overwrite().save("/models/m1")
        >>> KerasModel.load("/models/m1").getModel().summary()
    """

    def __init__(self, model_data=None, feature_cols=None, label_cols=None, output_cols=None,
                 history=None, run_id=None, custom_objects=None, ranks=None, inputs=None):
        super().__init__()
        self._data, self._history = model_data, history or {}
        self._custom_objects, self.ranks = custom_objects, ranks or []
        self._inputs = inputs
        self._model = None
        label_cols = list(label_cols or [])
        self._setDefault(outputCols=[c + "__output" for c in label_cols], runId="")
        self._set(featureCols=list(feature_cols or []), labelCols=label_cols)
        if output_cols:
            self._set(outputCols=list(output_cols))
        if run_id:
            self._set(runId=run_id)

    # -- Horovod's accessors ----------------------------------------------------
    def setOutputCols(self, value):
        if len(value) != len(self.getLabelCols()):
            raise ValueError(f"one output column per label column {self.getLabelCols()}, "
                             f"got {value!r}")
        return self._set(outputCols=list(value))

    def getOutputCols(self):
        return self.getOrDefault(self.outputCols)

    def getFeatureCols(self):
        return self.getOrDefault(self.featureCols)

    def getLabelCols(self):
        return self.getOrDefault(self.labelCols)

    def getRunId(self):
        return self.getOrDefault(self.runId) or None

    def getHistory(self):
        """The epochs' metrics (averaged over the ranks), as Keras's ``History.history``."""
        return self._history

    @property
    def history(self):
        return self._history

    def setCustomObjects(self, custom_objects):
        self._custom_objects, self._model = custom_objects, None
        return self

    def getModel(self):
        """The trained Keras model, loaded in this process."""
        if self._model is None:
            self._model = _remote.load_model(self._data, self._custom_objects)
        return self._model

    keras = getModel

    def _input_groups(self):
        features = self.getFeatureCols()
        if self._inputs is not None:
            return self._inputs
        n = len(self.getModel().inputs)
        return [features] if n == 1 else [[c] for c in features]

    # -- Spark ML -------------------------------------------------------------
    def _transform(self, dataset):
        from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType
        features, outputs = self.getFeatureCols(), self.getOutputCols()
        missing = [c for c in features if c not in dataset.columns]
        if missing:
            raise ValueError(f"the DataFrame has no column(s) {missing}; it has "
                             f"{dataset.columns}")
        taken = [c for c in outputs if c in dataset.columns]
        if taken:
            raise ValueError(f"the DataFrame already has column(s) {taken}")
        model = self.getModel()
        shapes = model.output_shape if len(model.outputs) > 1 else [model.output_shape]
        widths = [int(np.prod([d for d in s[1:] if d is not None]) or 1) for s in shapes]
        schema = StructType(dataset.schema.fields + [
            StructField(c, DoubleType() if w == 1 else ArrayType(DoubleType()), True)
            for c, w in zip(outputs, widths)])
        data, custom, groups = self._data, self._custom_objects, self._input_groups()

        def predict(rows):
            rows = list(rows)
            if not rows:
                return
            keras_model = _cached_model(data, custom)
            x = [np.stack([_row_vector(r, g) for r in rows]) for g in groups]
            out = keras_model.predict(x[0] if len(x) == 1 else x, batch_size=256, verbose=0)
            out = [o.reshape(len(rows), -1) for o in (out if isinstance(out, list) else [out])]
            for i, row in enumerate(rows):
                yield tuple(row) + tuple(float(o[i, 0]) if w == 1 else [float(v) for v in o[i]]
                                         for o, w in zip(out, widths))

        return dataset.sparkSession.createDataFrame(dataset.rdd.mapPartitions(predict), schema)

    def write(self):
        return _KerasModelWriter(self)

    @classmethod
    def read(cls):
        return _KerasModelReader(cls)


def _row_vector(row, columns):
    """A row's input: its columns' values (numbers, arrays or vectors),
    flattened and concatenated, as float32."""
    parts = []
    for name in columns:
        value = row[name]
        if value is None:
            raise ValueError(f"feature column {name!r} holds a null")
        if hasattr(value, "toArray"):
            value = value.toArray()
        parts.append(np.asarray(value, dtype=np.float32).ravel())
    return np.concatenate(parts)


_MODELS = {}


def _cached_model(data, custom_objects):
    """The model of `data`, loaded once per Spark Python worker."""
    import hashlib
    key = hashlib.sha256(data).hexdigest()
    if key not in _MODELS:
        _MODELS.clear()
        _MODELS[key] = _remote.load_model(data, custom_objects)
    return _MODELS[key]


class _KerasModelWriter(MLWriter):
    """Spark ML's layout: ``metadata/`` (the class, the params, the history)
    and ``data/`` (one Parquet row: the ``.keras`` file's bytes), both
    written by Spark, so any path Spark can write works."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path):
        extra = {"history": json.dumps(self.instance.getHistory()),
                 "inputs": json.dumps(self.instance._inputs)}
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession.sparkContext,
                                         extraMetadata=extra)
        self.sparkSession.createDataFrame([(bytearray(self.instance._data),)], "model binary") \
            .coalesce(1).write.parquet(f"{path}/data")


class _KerasModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession.sparkContext)
        data = bytes(self.sparkSession.read.parquet(f"{path}/data").first()["model"])
        params = metadata["paramMap"]
        model = self.cls(data, params.get("featureCols"), params.get("labelCols"),
                         params.get("outputCols"), history=json.loads(metadata["history"]),
                         run_id=params.get("runId"), inputs=json.loads(metadata["inputs"]))
        model._resetUid(metadata["uid"])
        return model
