"""tfring: Horovod-compatible data-parallel training for TensorFlow 2 and Keras 3.

Use it through ``import tfring.tensorflow as hvd`` or ``import tfring.keras as hvd``
and launch with ``tfringrun -np N python train.py``, or from Python with
``tfring.run(func, num_proc=N)``.
"""

__version__ = "0.1.0"

from tfring.runner.api import run  # noqa: E402,F401  (light: no TensorFlow)
