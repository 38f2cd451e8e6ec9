"""tfring.spark.keras.KerasEstimator on a real local Spark: fit on a
DataFrame of scikit-learn's digits at num_proc=2, transform adds the
prediction column."""
import numpy as np
import pytest

from support import import_extra

import_extra("pyspark")
tf = pytest.importorskip("tensorflow")
from tfring.spark.keras import KerasEstimator  # noqa: E402

TIMEOUT = 300


@pytest.fixture(scope="module")
def digits(spark):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    data = load_digits()
    x = (data.data / 16.0).astype(np.float64)
    x_train, x_val, y_train, y_val = train_test_split(x, data.target, test_size=0.2,
                                                      random_state=0, stratify=data.target)

    def frame(x, y):
        return spark.createDataFrame([(i, f.tolist(), int(t)) for i, (f, t) in
                                      enumerate(zip(x, y))], ["id", "features", "label"])
    return frame(x_train, y_train), frame(x_val, y_val)


def _model():
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                                tf.keras.layers.Dense(64, activation="relu"),
                                tf.keras.layers.Dense(10, activation="softmax")])


def test_fit_reaches_90_percent_and_transform_adds_the_column(digits, no_rank_left_behind):
    train_df, val_df = digits
    model = _model()
    initial = [w.copy() for w in model.get_weights()]
    estimator = KerasEstimator(model=model, optimizer=tf.keras.optimizers.SGD(0.06, momentum=0.9),
                               loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                               feature_cols=["features"], label_cols=["label"], batch_size=32,
                               epochs=6, num_proc=2, seed=0, timeout=TIMEOUT)
    trained = estimator.fit(train_df)
    # Each rank read its own partition: together, every training row once.
    assert [r["rank"] for r in trained.ranks] == [0, 1]
    assert sum(r["rows"] for r in trained.ranks) == train_df.count()
    assert all(r["rows"] > 0 for r in trained.ranks)
    assert len(trained.history["loss"]) == 6
    assert trained.history["loss"][-1] < trained.history["loss"][0]
    # The driver's model was only the starting point.
    for before, now in zip(initial, model.get_weights()):
        np.testing.assert_array_equal(before, now)

    out = trained.transform(val_df)
    assert out.columns == ["id", "features", "label", "label__output"]
    rows = out.select("id", "label", "label__output").collect()
    assert len(rows) == val_df.count()
    probabilities = np.array([r["label__output"] for r in rows])
    assert probabilities.shape == (len(rows), 10)
    np.testing.assert_allclose(probabilities.sum(1), 1.0, rtol=1e-4)
    accuracy = np.mean(probabilities.argmax(1) == np.array([r["label"] for r in rows]))
    assert accuracy >= 0.9, accuracy
    # transform's column is the trained model's prediction, row by row.
    by_id = {r["id"]: r["label__output"] for r in rows}
    some = val_df.orderBy("id").limit(5).collect()
    local = trained.keras().predict(np.array([r["features"] for r in some]), verbose=0)
    np.testing.assert_allclose([by_id[r["id"]] for r in some], local, rtol=1e-5, atol=1e-6)


def test_bad_settings_are_refused_before_any_job(digits):
    train_df, _ = digits
    common = dict(model=_model(), optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="exactly one label column"):
        KerasEstimator(feature_cols=["features"], label_cols=["label", "id"], **common)
    with pytest.raises(ValueError, match="feature_cols"):
        KerasEstimator(label_cols=["label"], **common)
    with pytest.raises(ValueError, match="epochs"):
        KerasEstimator(feature_cols=["features"], label_cols=["label"], epochs=0, **common)
    with pytest.raises(ValueError, match=r"no column\(s\) \['pixels'\]"):
        KerasEstimator(feature_cols=["pixels"], label_cols=["label"], **common).fit(train_df)


def test_bad_data_fails_fit_with_the_tasks_own_error(spark, digits, no_rank_left_behind):
    train_df, _ = digits
    bad = train_df.limit(40).union(spark.createDataFrame([(9999, None, 1)], train_df.schema))
    estimator = KerasEstimator(model=_model(), optimizer="sgd",
                               loss="sparse_categorical_crossentropy", feature_cols=["features"],
                               label_cols=["label"], num_proc=2, timeout=TIMEOUT)
    with pytest.raises(ValueError, match="feature column 'features' holds a null") as info:
        estimator.fit(bad)
    assert info.value.rank in (0, 1)
