"""``KerasModel``: what ``KerasEstimator.fit`` returns, a Spark ML ``Model``
(so it sits in a ``Pipeline``, and saves and loads through Spark ML's
writer and reader)."""
import base64
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
        custom_objects: for a model of your own classes; saved with the
            model (pickled with cloudpickle, as Horovod does), so ``load``
            brings them back.
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

    def getCustomObjects(self):
        return self._custom_objects or {}

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
        """Adds the prediction columns. Each Spark Arrow batch is predicted
        as a whole: its feature columns become numpy arrays column by
        column (Spark ML vectors turned into arrays by Spark first), and the
        predictions go back as Arrow columns, so no Python object is made
        per row."""
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import functions as F
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
        # A vector is a struct in Arrow (dense or sparse); Spark turns each
        # vector feature into an array in a hidden column the batch carries.
        kept = len(dataset.columns)
        where, hidden = {}, []
        for c in dict.fromkeys(features):
            if isinstance(dataset.schema[c].dataType, VectorUDT):
                where[c] = kept + len(hidden)
                hidden.append(vector_to_array(F.col(c)).alias(f"__tfring_vector_{len(hidden)}"))
            else:
                where[c] = dataset.columns.index(c)
        source = dataset.select("*", *hidden) if hidden else dataset
        data, custom, groups, names = (self._data, self._custom_objects, self._input_groups(),
                                       schema.names)

        def predict(batches):
            import pyarrow as pa

            from tfring.spark.data import column_to_numpy
            for batch in batches:
                rows = batch.num_rows
                if rows:
                    x = [np.concatenate([column_to_numpy(batch.column(where[c]), c)
                                         .reshape(rows, -1) for c in group], axis=1)
                         for group in groups]
                    out = _cached_model(data, custom).predict(
                        x[0] if len(x) == 1 else x, batch_size=256, verbose=0)
                    out = [np.asarray(o, np.float64).reshape(rows, -1)
                           for o in (out if isinstance(out, (list, tuple)) else [out])]
                else:
                    out = [np.zeros((0, w)) for w in widths]
                columns = batch.columns[:kept] + [_arrow_output(o, w)
                                                  for o, w in zip(out, widths)]
                yield pa.RecordBatch.from_arrays(columns, names=names)

        return source.mapInArrow(predict, schema)

    def write(self):
        return _KerasModelWriter(self)

    @classmethod
    def read(cls):
        return _KerasModelReader(cls)


def _arrow_output(values, width):
    """Predictions of shape (rows, width) as an Arrow column: doubles for a
    width of 1, else lists of doubles (one buffer of values and offsets)."""
    import pyarrow as pa
    if width == 1:
        return pa.array(np.ascontiguousarray(values[:, 0]))
    offsets = np.arange(0, values.size + 1, width, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.ravel()))


_MODELS = {}


def _cached_model(data, custom_objects):
    """The model of `data`, loaded once per Spark Python worker."""
    import hashlib
    key = hashlib.sha256(data).hexdigest()
    if key not in _MODELS:
        _MODELS.clear()
        _MODELS[key] = _remote.load_model(data, custom_objects)
    return _MODELS[key]


def _dumps(custom_objects):
    if not custom_objects:
        return None
    from pyspark import cloudpickle
    return base64.b64encode(cloudpickle.dumps(custom_objects)).decode("ascii")


def _loads(text):
    if not text:
        return None
    import pickle
    return pickle.loads(base64.b64decode(text))


class _KerasModelWriter(MLWriter):
    """Spark ML's layout: ``metadata/`` (the class, the params, the history,
    the custom objects) and ``data/`` (one Parquet row: the ``.keras``
    file's bytes), both written by Spark, so any path Spark can write works.

    The custom objects are pickled with cloudpickle (classes and functions
    defined in a notebook or ``__main__`` by value, others by reference to
    their module, which must be importable where the model is loaded), as
    Horovod's writer does; loading a model unpickles them, so load only
    models you trust."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path):
        extra = {"history": json.dumps(self.instance.getHistory()),
                 "inputs": json.dumps(self.instance._inputs),
                 "customObjects": _dumps(self.instance._custom_objects)}
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
                         run_id=params.get("runId"), inputs=json.loads(metadata["inputs"]),
                         custom_objects=_loads(metadata.get("customObjects")))
        model._resetUid(metadata["uid"])
        return model
