"""tfring on Spark: :func:`run` (Horovod's ``horovod.spark.run``), :class:`Distributor`
(pyspark's ``TorchDistributor`` shape) and, in :mod:`tfring.spark.keras`,
Horovod's ``KerasEstimator``.

Needs pyspark, which tfring's core never imports: ``pip install 'tfring[spark]'``.
See docs/spark.md.
"""
try:
    import pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tfring.spark needs pyspark, which is not installed: "
                      "pip install 'tfring[spark]' (or pip install 'pyspark>=3.4')") from e

from tfring.spark.distributor import Distributor  # noqa: E402
from tfring.spark.runner import run  # noqa: E402

__all__ = ["Distributor", "run"]
