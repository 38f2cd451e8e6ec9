"""tfring on a Ray cluster.

- :class:`TfringTrainer` (with :class:`TfringConfig`): a Ray Train V2
  trainer whose workers form a tfring job; Ray reports, checkpoints,
  restarts and feeds Ray Data (needs ``ray[train]``).
  :mod:`tfring.ray.keras` has its Keras callback and checkpoint restore.
- :class:`RayExecutor`: Horovod's ``horovod.ray`` executor.

Needs Ray, which tfring's core never imports: ``pip install 'tfring[ray]'``.
See docs/ray.md.
"""
try:
    import ray  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tfring.ray needs Ray, which is not installed: "
                      "pip install 'tfring[ray]' (or pip install 'ray[train]>=2.9')") from e

from tfring.ray.executor import RayExecutor, WorkerLostError  # noqa: E402

__all__ = ["RayExecutor", "WorkerLostError", "TfringTrainer", "TfringConfig"]


def __getattr__(name):
    # Ray Train is imported on first use: RayExecutor needs only ray core.
    if name in ("TfringTrainer", "TfringConfig"):
        from tfring.ray import train
        return getattr(train, name)
    raise AttributeError(f"module 'tfring.ray' has no attribute {name!r}")
