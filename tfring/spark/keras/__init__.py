"""Horovod's Spark Keras estimator on tfring: ``KerasEstimator`` (fit a
Keras model on a DataFrame or on Parquet in a store) and ``KerasModel`` (a
Spark ML Model). See docs/spark.md."""
from tfring.spark.keras.estimator import KerasEstimator  # noqa: F401
from tfring.spark.keras.model import KerasModel  # noqa: F401

__all__ = ["KerasEstimator", "KerasModel"]
