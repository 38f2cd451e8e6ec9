"""tfringrun, tfring's launcher (Horovod's ``horovodrun`` for tfring).

Run ``tfringrun -np N python train.py``; see :mod:`tfring.runner.launch` for
the options and how the modules here fit together. Nothing in this package
imports TensorFlow, so launching stays fast.
"""
