"""Keras on Spark through a store: KerasEstimator writes a DataFrame to
Parquet in a store, each rank streams its share into tf.data, rank 0
checkpoints every epoch, and a second fit with the same run_id starts from
the checkpoint (Horovod's hot start). The trained KerasModel goes through a
Pipeline, is saved and loaded with Spark ML, and predicts.

Run:  python examples/spark_keras_parquet.py [--num-proc 2] [--epochs 4] [--rows 4000]
"""
import argparse
import os
import sys
import tempfile


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4000)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import numpy as np
    import tensorflow as tf
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.sql import SparkSession

    from tfring.spark.common.store import Store
    from tfring.spark.keras import KerasEstimator

    spark = (SparkSession.builder.master(f"local[{args.num_proc}]")
             .appName("tfring-spark-keras-parquet").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="tfring-example-")
    try:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(args.rows, 8))
        y = (x @ rng.normal(size=8) > 0).astype(float)
        df = spark.createDataFrame([(r.tolist(), float(t), float(i % 10 == 0))
                                    for i, (r, t) in enumerate(zip(x, y))],
                                   ["features", "label", "weight"])
        model = tf.keras.Sequential([tf.keras.Input((8,)),
                                     tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(1, activation="sigmoid")])
        store = Store.create(os.path.join(work, "store"))

        def estimator(epochs):
            return KerasEstimator(
                model=model, optimizer=tf.keras.optimizers.Adam(0.01),
                loss="binary_crossentropy", metrics=["accuracy"], store=store,
                feature_cols=["features"], label_cols=["label"], validation=0.2,
                batch_size=128, epochs=epochs, num_proc=args.num_proc, run_id="example",
                random_seed=0)

        first = estimator(args.epochs // 2).fit(df)
        print(f"first fit: epochs={len(first.getHistory()['loss'])} "
              f"val_accuracy={first.getHistory()['val_accuracy'][-1]:.4f}")
        pipeline = Pipeline(stages=[estimator(args.epochs)]).fit(df)   # hot start
        history = pipeline.stages[0].getHistory()
        print(f"hot start: epochs={len(history['loss'])} "
              f"val_accuracy={history['val_accuracy'][-1]:.4f}")
        print("store:", sorted(os.path.relpath(os.path.join(b, f), store.prefix_path)
                               for b, _, fs in os.walk(store.prefix_path) for f in fs))
        pipeline.write().overwrite().save(os.path.join(work, "pipeline"))
        loaded = PipelineModel.load(os.path.join(work, "pipeline"))
        rows = loaded.transform(df.limit(1000)).select("label", "label__output").collect()
        accuracy = np.mean([(r["label__output"] > 0.5) == (r["label"] > 0.5) for r in rows])
        print(f"loaded pipeline accuracy={accuracy:.4f}", flush=True)
    finally:
        spark.stop()
        import shutil
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
