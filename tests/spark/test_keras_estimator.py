"""tfring.spark.keras.KerasEstimator on the shared local Spark session:
Parquet in a store streamed by each rank, compared with single-process
Keras where the arithmetic is exact; a hot start (optimizer state
included) and the run's TensorBoard logs; a Parquet set five times what a
rank may hold trained within that bound to the reference loss; several
inputs, outputs, validation, callbacks and custom objects in a Pipeline
that predicts by Arrow batch, saves and loads; bad input refused before
any rank starts; a rank killed mid-fit named."""
import os
import sys

import numpy as np
import pytest

from support import import_extra

pyspark = import_extra("pyspark")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfring.spark.common.store import Store  # noqa: E402
from tfring.spark.keras import KerasEstimator, KerasModel  # noqa: E402

pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 180


def _files(root):
    return sorted(os.path.relpath(os.path.join(b, f), root)
                  for b, _, fs in os.walk(root) for f in fs)


def _epoch_summaries(logs):
    """The scalars of the TensorBoard event files under `logs`, read back
    with TensorFlow's own reader: {(train|validation, tag): [value by epoch]}."""
    found = {}
    for kind in ("train", "validation"):
        for name in sorted(os.listdir(os.path.join(logs, kind))):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(logs, kind, name)):
                for value in event.summary.value:
                    assert value.metadata.plugin_data.plugin_name == "scalars"
                    steps = found.setdefault((kind, value.tag), {})
                    steps[event.step] = float(tf.make_ndarray(value.tensor))
    return {k: [v[step] for step in sorted(v)] for k, v in found.items()}


def _linear(width, seed=0):
    tf.keras.utils.set_random_seed(seed)
    inp = tf.keras.Input((width,))
    return tf.keras.Model(inp, tf.keras.layers.Dense(1)(inp))


def _reference_epoch(model, x, y, w, np_, batch):
    """One epoch of single-process Keras over the batches the ranks take
    together: step i joins rank r's i-th batch of its contiguous share."""
    share = len(x) // np_
    order = np.concatenate([np.arange(r * share + i * batch, r * share + (i + 1) * batch)
                            for i in range(share // batch) for r in range(np_)])
    model.fit(x[order], y[order], sample_weight=w[order], batch_size=batch * np_,
              shuffle=False, epochs=1, verbose=0)


def test_fit_on_parquet_equals_keras_and_hot_starts_from_the_store(spark, tmp_path,
                                                                   no_rank_left_behind):
    rng = np.random.default_rng(1)
    n = 72
    x1 = rng.normal(size=n).astype(np.float32)
    x2 = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x1 * 0.5 + x2 @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    w = rng.uniform(0.5, 2.0, size=n).astype(np.float32)
    store = Store.create(str(tmp_path / "store"))
    table = pa.table({"x1": x1, "x2": pa.array(list(x2), pa.list_(pa.float32())), "y": y,
                      "w": w})
    train_dir = store.get_train_data_path()
    os.makedirs(train_dir)
    # Two files, several row groups: shares cut across both.
    pq.write_table(table.slice(0, 40), f"{train_dir}/part-00000.parquet", row_group_size=16)
    pq.write_table(table.slice(40), f"{train_dir}/part-00001.parquet", row_group_size=7)
    val = table.slice(0, 12)
    os.makedirs(store.get_val_data_path())
    pq.write_table(val, f"{store.get_val_data_path()}/part-00000.parquet")

    model = _linear(4)
    reference = tf.keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    # Adam: a hot start that dropped the optimizer's moments or iteration
    # count would take a different third epoch.
    reference.compile(optimizer=tf.keras.optimizers.Adam(0.02), loss="mse")

    def estimator(epochs, num_proc):
        return KerasEstimator(model=model, optimizer=tf.keras.optimizers.Adam(0.02), loss="mse",
                              metrics=["mae"], store=store, feature_cols=["x1", "x2"],
                              label_cols=["y"], sample_weight_col="w", batch_size=6,
                              val_batch_size=3, epochs=epochs, shuffle_buffer_size=0,
                              num_proc=num_proc, run_id="run1", read_rows=5, timeout=TIMEOUT)

    x = np.concatenate([x1[:, None], x2], 1)
    first = estimator(2, 2).fit_on_parquet()
    for _ in range(2):
        _reference_epoch(reference, x, y, w, 2, 6)
    for got, want in zip(first.getModel().get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert [(r["rows"], r["val_rows"], r["steps_per_epoch"]) for r in first.ranks] == \
        [(36, 6, 6)] * 2
    history = first.getHistory()
    assert len(history["loss"]) == 2 and len(history["mae"]) == 2
    # Validation: both ranks' 6 rows (2 steps of 3), weighted, averaged.
    want_val = reference.evaluate(x[:12], y[:12], sample_weight=w[:12], batch_size=12, verbose=0)
    assert history["val_loss"][-1] == pytest.approx(want_val, rel=1e-4)
    files = _files(store.get_run_path("run1"))
    assert files[:3] == ["checkpoint.json", "checkpoint.keras", "logs/history.csv"]
    assert [f.split(".")[0] for f in files[3:]] == ["logs/train/events", "logs/validation/events"]
    summaries = _epoch_summaries(store.get_logs_path("run1"))
    assert sorted(summaries) == [("train", "epoch_loss"), ("train", "epoch_mae"),
                                 ("validation", "epoch_loss"), ("validation", "epoch_mae")]
    for (kind, tag), values in summaries.items():
        name = ("val_" if kind == "validation" else "") + tag[len("epoch_"):]
        assert values == pytest.approx(history[name], rel=1e-6)

    # Hot start: the run's checkpoint, then the third epoch only, on 3 ranks.
    model.set_weights([np.zeros_like(v) for v in model.get_weights()])  # not used
    third = estimator(3, 3).fit_on_parquet()
    _reference_epoch(reference, x, y, w, 3, 6)
    for got, want in zip(third.getModel().get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert len(third.getHistory()["loss"]) == 3
    assert third.getHistory()["loss"][:2] == history["loss"]
    assert [r["rows"] for r in third.ranks] == [24, 24, 24]
    # The checkpoint's optimizer is the reference's: 2 x 6 + 4 steps, the same moments.
    saved = tf.keras.models.load_model(store.get_checkpoint_path("run1")).optimizer
    assert int(saved.iterations.numpy()) == int(reference.optimizer.iterations.numpy()) == 16
    for got, want in zip(saved.variables, reference.optimizer.variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-7)
    assert _epoch_summaries(store.get_logs_path("run1"))[("train", "epoch_loss")] == \
        pytest.approx(third.getHistory()["loss"], rel=1e-6)
    with open(os.path.join(store.get_logs_path("run1"), "history.csv")) as f:
        assert [line.split(",")[0] for line in f.read().split()[1:]] == ["0", "1", "2"]


class _HeldBytesBound(tf.keras.callbacks.Callback):
    """The memory a rank may hold for its data, enforced: from the end of
    its first step (once TensorFlow has traced the step) to the epoch's end,
    the peak of what Python allocates (numpy arrays included: tracemalloc
    traces them) plus the peak of pyarrow's memory pool over the process's
    life must stay under `limit` bytes, or the rank fails (and the fit with
    it). Rank 0 puts the figure in its epoch's logs."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def on_train_batch_end(self, batch, logs=None):
        import tracemalloc
        if not tracemalloc.is_tracing():
            tracemalloc.start()

    def on_epoch_end(self, epoch, logs=None):
        import tracemalloc
        held = tracemalloc.get_traced_memory()[1] + pa.default_memory_pool().max_memory()
        if held > self.limit:
            raise MemoryError(f"rank {os.environ.get('TFRING_RANK')} held {held} bytes for "
                              f"its data, over the {self.limit} it is allowed")
        logs["held_bytes"] = float(held)


def test_a_parquet_set_several_times_a_ranks_memory_trains_to_the_reference_loss(
        spark, tmp_path, no_rank_left_behind):
    rows, width, noise, limit = 340_000, 64, 0.3, 8 << 20
    rng = np.random.default_rng(4)
    x = rng.normal(size=(rows, width)).astype(np.float32)
    coef = rng.normal(size=width).astype(np.float32)
    y = (x @ coef + 0.5 + rng.normal(scale=noise, size=rows)).astype(np.float32)
    store = Store.create(str(tmp_path / "store"))
    train_dir = store.get_train_data_path()
    os.makedirs(train_dir)
    # As Spark writes them: a file per partition, each one row group.
    for i in range(4):
        part = slice(i * rows // 4, (i + 1) * rows // 4)
        column = pa.FixedSizeListArray.from_arrays(pa.array(x[part].ravel()), width)
        pq.write_table(pa.table({"x": pa.array(column, pa.list_(pa.float32())), "y": y[part]}),
                       f"{train_dir}/part-{i:05d}.parquet", row_group_size=rows)
    # Each rank's share is 5x what it may hold (pyarrow's page buffers
    # and a column's dictionary alone take ~4 MB).
    assert x.nbytes // 2 + y.nbytes // 2 >= 5 * limit

    model = _linear(width)
    reference = tf.keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    reference.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    whole = rows // 2048 * 2048  # full batches only, as the ranks take them
    reference.fit(x[:whole], y[:whole], batch_size=2048, epochs=1, shuffle=True, verbose=0)
    trained = KerasEstimator(
        model=model, optimizer=tf.keras.optimizers.SGD(0.1), loss="mse", store=store,
        feature_cols=["x"], label_cols=["y"], batch_size=1024, epochs=1,
        shuffle_buffer_size=1024, read_rows=512, callbacks=[_HeldBytesBound(limit)],
        num_proc=2, random_seed=5, timeout=TIMEOUT).fit_on_parquet()

    def mse(weights):
        kernel, bias = weights
        return float(np.mean((x @ kernel[:, 0] + bias[0] - y) ** 2))
    start, got, want = mse(model.get_weights()), mse(trained.getModel().get_weights()), \
        mse(reference.get_weights())
    # The noise's variance (0.09) is the floor; from ~70, both land within
    # 2% of it and of each other.
    assert start > 10 and want < 1.02 * noise ** 2, (start, want)
    assert got == pytest.approx(want, rel=0.02), (got, want)
    held = trained.getHistory()["held_bytes"][0]
    assert 512 * width * 4 < held <= limit     # a read block at least, within the bound
    assert [r["rows"] for r in trained.ranks] == [rows // 2] * 2


class _Scale(tf.keras.layers.Layer):
    """A layer of this test's own (not registered with Keras): a model that
    holds it loads only with it in custom_objects."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(), initializer="ones")

    def call(self, x):
        return x * self.scale


class _Marker(tf.keras.callbacks.Callback):
    """Puts a number in each epoch's logs: the callbacks ran on the ranks."""

    def on_epoch_end(self, epoch, logs=None):
        logs["marker"] = 10.0 + epoch


def test_two_inputs_two_outputs_validation_in_a_pipeline_that_saves_and_loads(
        spark, tmp_path, no_rank_left_behind):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.linalg import Vectors
    rng = np.random.default_rng(2)
    rows = []
    for i in range(80):
        v, a = rng.normal(size=3), rng.normal(size=2)
        # Every fifth vector sparse (a struct of another form in Arrow).
        vector = Vectors.sparse(3, dict(enumerate(v.tolist()))) if i % 5 == 0 else \
            Vectors.dense(v.tolist())
        rows.append((i, vector, a.tolist(), float(v.sum() - a[0]), int(i % 3), i % 4 == 0))
    df = spark.createDataFrame(rows, ["id", "v", "a", "y_reg", "y_cls", "is_val"])
    tf.keras.utils.set_random_seed(0)
    vin, ain = tf.keras.Input((3,), name="v"), tf.keras.Input((2,), name="a")
    hidden = tf.keras.layers.Dense(8, activation="relu")(tf.keras.layers.Concatenate()([vin,
                                                                                      ain]))
    model = tf.keras.Model([vin, ain], [_Scale(name="reg")(tf.keras.layers.Dense(1)(hidden)),
                                        tf.keras.layers.Dense(3, activation="softmax",
                                                              name="cls")(hidden)])
    store = Store.create(str(tmp_path / "store"))
    estimator = KerasEstimator(
        model=model, optimizer=tf.keras.optimizers.Adam(0.01),
        loss=["mse", "sparse_categorical_crossentropy"], loss_weights=[1.0, 0.5], store=store,
        feature_cols=["v", "a"], label_cols=["y_reg", "y_cls"], validation="is_val",
        callbacks=[_Marker()], custom_objects={"_Scale": _Scale}, batch_size=10, epochs=3,
        num_proc=2, run_id="multi",
        random_seed=3, timeout=TIMEOUT)
    fitted = Pipeline(stages=[estimator]).fit(df)
    trained = fitted.stages[0]
    assert isinstance(trained, KerasModel)
    assert [r["rows"] for r in trained.ranks] == [30, 30]      # 60 rows not marked
    assert [r["val_rows"] for r in trained.ranks] == [10, 10]  # 20 marked
    history = trained.getHistory()
    assert history["marker"] == [10.0, 11.0, 12.0]
    assert history["val_loss"] and history["loss"][-1] < history["loss"][0]
    # The store holds the run only (the intermediate Parquet is gone).
    assert [f.split(".")[0] for f in _files(store.prefix_path)] == [
        "runs/multi/checkpoint", "runs/multi/checkpoint", "runs/multi/logs/history",
        "runs/multi/logs/train/events", "runs/multi/logs/validation/events"]

    trained.setOutputCols(["p_reg", "p_cls"])
    predicted = fitted.transform(df)
    # Predicted a Spark Arrow batch at a time, not row by row.
    assert "MapInArrow" in predicted._jdf.queryExecution().executedPlan().toString()
    assert [(f.name, f.dataType.simpleString()) for f in predicted.schema.fields] == [
        ("id", "bigint"), ("v", "vector"), ("a", "array<double>"), ("y_reg", "double"),
        ("y_cls", "bigint"), ("is_val", "boolean"), ("p_reg", "double"),
        ("p_cls", "array<double>")]
    out = predicted.orderBy("id").collect()
    reg, cls = trained.getModel().predict(
        [np.array([r["v"].toArray() for r in out], np.float32),
         np.array([r["a"] for r in out], np.float32)], verbose=0)
    np.testing.assert_allclose([r["p_reg"] for r in out], reg[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r["p_cls"] for r in out], cls, rtol=1e-5, atol=1e-6)

    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    # The custom objects are saved with the model: loading and predicting
    # need nothing more (Keras cannot find _Scale without them).
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    again = loaded.transform(df).orderBy("id").collect()
    assert list(loaded.stages[0].getCustomObjects()) == ["_Scale"]
    assert loaded.stages[0].getOutputCols() == ["p_reg", "p_cls"]
    assert loaded.stages[0].getHistory() == history
    assert [(r["p_reg"], r["p_cls"]) for r in again] == [(r["p_reg"], r["p_cls"]) for r in out]


class _KillRank1(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        import signal
        if os.environ.get("TFRING_RANK") == "1" and epoch == 1:
            os.kill(os.getpid(), signal.SIGKILL)


def test_bad_input_is_refused_before_any_rank_and_a_killed_rank_is_named(
        spark, tmp_path, no_rank_left_behind):
    df = spark.createDataFrame([(float(i), [float(i), 1.0], float(i % 2), 1.0)
                                for i in range(20)], ["s", "a", "y", "w"])
    common = dict(model=_linear(3), optimizer="sgd", loss="mse", num_proc=2,
                  store=Store.create(str(tmp_path / "store")), timeout=TIMEOUT)
    with pytest.raises(ValueError, match=r"no column\(s\) \['pixels'\]"):
        KerasEstimator(feature_cols=["s", "pixels"], label_cols=["y"], **common).fit(df)
    with_null = df.union(spark.createDataFrame([(None, [1.0, 2.0], 0.0, 1.0)], df.schema))
    with pytest.raises(ValueError, match=r"nulls .*\{'s': 1\}"):
        KerasEstimator(feature_cols=["s", "a"], label_cols=["y"], **common).fit(with_null)
    with pytest.raises(ValueError, match="label column 'a' holds 2 values per row, but the "
                                         "model's output for it gives 1"):
        KerasEstimator(feature_cols=["s", "y", "w"], label_cols=["a"], **common).fit(df)
    with pytest.raises(ValueError, match="feature column"):
        KerasEstimator(feature_cols=["s"], label_cols=["y"], **common).fit(df)
    assert KerasEstimator(feature_cols=["s"], label_cols=["y"], shuffle=False,
                          shuffle_buffer_size=8, **common).shuffle_buffer_size == 0
    with pytest.raises(ValueError, match="label_cols has 2 column"):
        KerasEstimator(feature_cols=["s", "a"], label_cols=["y", "w"], **common)
    (tmp_path / "file").write_text("")
    unreachable = dict(common, store=Store.create(str(tmp_path / "file" / "store")))
    with pytest.raises(OSError, match="the store at .*file/store.* cannot be written"):
        KerasEstimator(feature_cols=["s", "a"], label_cols=["y"], **unreachable).fit(df)
    assert _files(tmp_path / "store") == []

    estimator = KerasEstimator(feature_cols=["s", "a"], label_cols=["y"], epochs=3,
                               batch_size=2, callbacks=[_KillRank1()], **common)
    with pytest.raises(RuntimeError, match=r"rank 1 \(host .*\) failed: its process was "
                                           r"killed by signal 9 \(SIGKILL\)"):
        estimator.fit(df)
    assert _files(tmp_path / "store") == []
