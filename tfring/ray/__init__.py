"""tfring on a Ray cluster: :class:`RayExecutor` (Horovod's ``horovod.ray``).

Needs Ray, which tfring's core never imports: ``pip install 'tfring[ray]'``.
See docs/ray.md.
"""
try:
    import ray  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tfring.ray needs Ray, which is not installed: "
                      "pip install 'tfring[ray]' (or pip install 'ray>=2.9')") from e

from tfring.ray.executor import RayExecutor, WorkerLostError  # noqa: E402

__all__ = ["RayExecutor", "WorkerLostError"]
