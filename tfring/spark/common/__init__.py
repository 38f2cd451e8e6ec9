"""What tfring's Spark estimators share, at Horovod's import paths
(``horovod.spark.common.store`` -> :mod:`tfring.spark.common.store`)."""
