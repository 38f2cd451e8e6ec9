"""Building tfring's op library against the TensorFlow in use.

:mod:`tfring.build.library` is the one home of the build: ``setup.py`` calls it
at install time when TensorFlow is visible to the build, and
:mod:`tfring.common.loader` calls it on first import when the op library was
not built for the running TensorFlow (pip's build isolation hid TensorFlow, or
TensorFlow was upgraded later). ``python -m tfring.build`` builds (or finds)
the library for the running TensorFlow and prints its path.

Nothing here imports TensorFlow at module import time: setup.py and tfringrun
use it before TensorFlow is loaded. :mod:`tfring.build.cuda` decides
whether the library gets the GPU (NCCL) build, and how.
"""
