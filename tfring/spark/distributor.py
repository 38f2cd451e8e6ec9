"""``tfring.spark.Distributor``: pyspark's ``TorchDistributor`` for tfring.

Databricks' HorovodRunner and ``spark-tensorflow-distributor`` are gone;
what Spark ships is ``pyspark.ml.torch.distributor.TorchDistributor``. This
class has its shape, so a notebook that used either moves over by changing
a name::

    Distributor(num_processes=2, local_mode=False, use_gpu=False).run(train, lr)

- ``local_mode=False``: the ranks are the tasks of one barrier stage on
  the executors (:func:`tfring.spark.runner.run_on_partitions`, the
  machinery of :func:`tfring.spark.run`; under Spark Connect, where there
  is no SparkContext, :func:`tfring.spark.runner.run_on_session`, which
  goes through ``mapInArrow(..., barrier=True)`` as ``TorchDistributor``
  does).
- ``local_mode=True``: the ranks run on the driver (the client under
  Spark Connect), started by :func:`tfring.run` (tfringrun) over TCP.

A function's ranks each call ``hvd.init()``; rank 0's result comes back.
A script (a path ending in ``.py``) runs as ``python script args...`` on
every rank, with the rank's environment, and ``run`` returns None, as
``TorchDistributor`` does.
"""
import os
import runpy
import sys

from tfring.spark import runner


def _run_script(path, argv):
    """A rank's body for a script: runs it as ``__main__`` in the rank's
    process with `argv`; a non-zero ``sys.exit`` fails the rank."""
    saved = sys.argv
    sys.argv = [path, *argv]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise RuntimeError(f"the script {path} exited with {e.code!r}") from e
    finally:
        sys.argv = saved
    return None


class Distributor:
    """Runs a tfring job on Spark, in the shape of pyspark's ``TorchDistributor``.

    Args:
        num_processes: how many ranks. With ``local_mode=False`` the cluster
            must run that many tasks at once (a barrier stage).
        local_mode: True runs the ranks as processes on the driver; False
            as the tasks of one barrier stage on the executors.
        use_gpu: True gives each rank its GPUs (on executors: the task's
            ``gpu`` resource, so ``spark.task.resource.gpu.amount`` must be
            set; on the driver: tfring's one GPU per local rank); False hides
            every GPU from the ranks (``CUDA_VISIBLE_DEVICES=""``). Unlike
            ``TorchDistributor``, the default is False: tfring runs on CPUs.
        start_timeout: seconds the ranks wait for each other in ``init()``.
        timeout: seconds after which the job is stopped; None: no limit.
        env: variables every rank gets.

    Raises:
        ValueError: `num_processes` is not a whole number >= 1.
        RuntimeError: no active SparkSession (``local_mode=False``).

    Example:
        >>> def train(lr):
        ...     import tfring.keras as hvd
        ...     hvd.init()
        ...     ...
        ...     return model.get_weights()
        >>> weights = Distributor(num_processes=2, local_mode=False,
        ...                       use_gpu=False).run(train, 0.01)
        >>> Distributor(num_processes=2).run("train.py", "--epochs", "3")
    """

    def __init__(self, num_processes=1, local_mode=True, use_gpu=False, start_timeout=None,
                 timeout=None, env=None):
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) \
                or num_processes < 1:
            raise ValueError(f"num_processes must be a whole number >= 1, got {num_processes!r}")
        self.num_processes, self.local_mode, self.use_gpu = num_processes, local_mode, use_gpu
        self.start_timeout, self.timeout = start_timeout, timeout
        self.env = dict(env or {})

    def run(self, train_object, *args, **kwargs):
        """Runs `train_object` on every rank.

        Args:
            train_object: a function (it calls ``hvd.init()``), or the path
                of a Python script.
            *args, **kwargs: the function's arguments; a script's
                command-line arguments (strings; no keyword arguments).

        Returns:
            What the function returned on rank 0; None for a script.

        Raises:
            ValueError: keyword arguments for a script; a script that does
                not exist.
            RuntimeError: no active SparkSession; a rank's process died.
            Exception: a rank's own exception (its type, ``rank`` set, a note
                naming it), as :func:`tfring.spark.run` raises it.
        """
        fn = train_object
        if isinstance(train_object, str):
            if kwargs:
                raise ValueError("a script takes command-line arguments only, not keyword "
                                 f"arguments ({sorted(kwargs)})")
            path = os.path.abspath(train_object)
            if not os.path.isfile(path):
                raise ValueError(f"no script at {train_object!r}")
            fn, args, kwargs = _run_script, (path, [str(a) for a in args]), {}
        elif not callable(train_object):
            raise ValueError(f"train_object must be a function or a script's path, got "
                             f"{type(train_object).__name__}")
        env = dict(self.env)
        if self.local_mode:
            if not self.use_gpu:
                env["CUDA_VISIBLE_DEVICES"] = ""
            from tfring.runner import run as tfring_run
            return tfring_run(fn, args=args, kwargs=kwargs, num_proc=self.num_processes,
                              use_gloo=True, start_timeout=self.start_timeout, env=env,
                              timeout=self.timeout)[0]
        from pyspark.sql import SparkSession
        from pyspark.sql.utils import is_remote
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError("Distributor(local_mode=False) needs an active SparkSession: "
                               "create one first")
        common = dict(start_timeout=self.start_timeout, env=env, timeout=self.timeout,
                      only_rank0=True, use_gpu=self.use_gpu)
        if is_remote():
            return runner.run_on_session(spark, self.num_processes, fn, args, kwargs,
                                         **common)[0]
        sc = spark.sparkContext
        rdd = sc.parallelize(range(self.num_processes), self.num_processes)
        return runner.run_on_partitions(rdd, fn, args, kwargs, **common)[0]
