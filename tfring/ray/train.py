"""TfringTrainer: Ray Train (V2) runs the workers, tfring is their backend.

Ray Train starts a group of worker actors, numbers them (``world_rank``,
grouped by node) and calls the backend's ``on_start`` before the training
loop runs; when the group ends (the loop finished, a worker failed, Ray
restarts or resizes the group) it calls ``on_shutdown``. The tfring backend
forms one tfring job per group with the same public start-up as
:class:`~tfring.ray.RayExecutor`:

1. every worker reports its node's address (what Ray groups ranks by);
2. the backend (it runs in Ray Train's controller) starts the job's
   rendezvous store with a fresh secret (:func:`tfring.runner.start_rendezvous`);
3. :func:`tfring.runner.engine_env.worker_environments` numbers the ranks
   host by host and writes each worker its TCP controller's variables,
   which the backend sets in every worker before its loop starts.

The loop's ``hvd.init()`` then joins that job; its rank, size and local rank
are Ray's world rank, world size and local rank. Nothing of a job outlives
its group: a restarted or resized group gets new processes, a new store and
a new secret.
"""
import dataclasses
import signal
import threading
from typing import Dict, Optional

import ray
from ray.train.backend import Backend, BackendConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from tfring.runner import wire
from tfring.runner import engine_env, start_rendezvous
from tfring.ray.worker import stop_tfring

# Variables the backend decides for each group; a user's env_vars may not
# set them (the job would not form, or would form wrongly).
_JOB_VARIABLES = frozenset({
    "TFRING_CONTROLLER", "TFRING_RENDEZVOUS_ADDR", "TFRING_RENDEZVOUS_PORT", "TFRING_SIZE",
    "TFRING_RANK", "TFRING_LOCAL_SLOT", "TFRING_HOST_ORDER", "TFRING_HOSTNAME",
    wire.SECRET_ENV, "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_CONTROLLER",
    "HOROVOD_HOSTNAME"})


@dataclasses.dataclass
class TfringConfig(BackendConfig):
    """How :class:`TfringTrainer` forms the tfring job of each worker group.

    Args:
        env_vars: variables every worker sets before its loop starts, e.g.
            tuning ``TFRING_*`` (fusion threshold, cycle time, timeline).
            The job's own variables (controller, rendezvous, rank, size,
            secret, host name) are set by the backend and refused here.
        setup_timeout_s: seconds the backend waits for the workers to
            report their node and take their environment.
        shutdown_timeout_s: seconds ``on_shutdown`` waits for the workers
            to stop tfring before their actors are ended anyway.

    Raises:
        ValueError: a bad value (checked when the config is made, before
            any worker starts).

    Example:
        >>> from tfring.ray import TfringConfig
        >>> config = TfringConfig(env_vars={"TFRING_FUSION_THRESHOLD": "33554432"})
    """

    env_vars: Optional[Dict[str, str]] = None
    setup_timeout_s: float = 120.0
    shutdown_timeout_s: float = 10.0

    def __post_init__(self):
        env = self.env_vars or {}
        if not isinstance(env, dict):
            raise ValueError(f"TfringConfig.env_vars must be a dict of names to values, got "
                             f"{type(env).__name__}")
        for name, value in env.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"TfringConfig.env_vars: {name!r} is not a variable name")
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError(f"TfringConfig.env_vars[{name!r}] must be text or a number, "
                                 f"got {value!r}")
        taken = sorted(set(env) & _JOB_VARIABLES)
        if taken:
            raise ValueError(f"TfringConfig.env_vars may not set {', '.join(taken)}: the "
                             "backend sets the job's controller, rendezvous, ranks and "
                             "secret for every worker group")
        self.env_vars = {name: str(value) for name, value in env.items()}
        for name in ("setup_timeout_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"TfringConfig.{name} must be a number of seconds > 0, got "
                                 f"{value!r}")

    @property
    def backend_cls(self):
        return _TfringBackend

    @property
    def framework(self):
        return "tfring"

    def to_dict(self):
        # The variables' names only: their values may be private.
        return {"env_vars": sorted(self.env_vars or {}),
                "setup_timeout_s": self.setup_timeout_s,
                "shutdown_timeout_s": self.shutdown_timeout_s}


# -- what runs in each worker (module functions: Ray pickles them by name) --

def _node_address():
    """This worker's node address: what Ray groups its ranks by."""
    return ray.util.get_node_ip_address()


def _set_environment(env):
    import os
    os.environ.update(env)
    return True


class _TfringBackend(Backend):
    """Forms a tfring job over each worker group (see the module's text).

    Ray Train makes one instance per controller process (a singleton); it
    keeps the store of the group that is running.
    """

    # Every worker on a node sees all the GPUs Ray gave that node's workers,
    # in local-rank order, so that local_rank() indexes its own (as under
    # tfringrun); the NCCL plane needs to see its peers' devices.
    share_cuda_visible_devices = True

    def __init__(self):
        self._store = None

    def on_start(self, worker_group, backend_config):
        # A group that Ray aborted never had on_shutdown: its store goes now.
        self._stop_store()
        timeout = backend_config.setup_timeout_s
        hosts = _get(worker_group.execute_async(_node_address), timeout, "report their node")
        secret = wire.generate_secret()
        store, addr, port = start_rendezvous(ray.util.get_node_ip_address(), 0, secret)
        try:
            ranks, envs = engine_env.worker_environments(
                hosts, addr, port, secret, bind_hosts=hosts, extra=backend_config.env_vars)
            if ranks != list(range(len(hosts))):
                # Ray numbers its workers node by node; tfring numbers hosts
                # in order of first appearance: the two agree unless a node's
                # workers are not contiguous, which Ray does not do.
                raise RuntimeError(
                    f"tfring would number Ray's workers {ranks} (by their nodes {hosts}), "
                    "not in Ray's world-rank order; hvd.rank() would differ from "
                    "ray.train.get_context().get_world_rank()")
            _get([worker_group.execute_single_async(i, _set_environment, env)
                  for i, env in enumerate(envs)], timeout, "take their environment")
        except BaseException:
            store.stop()
            raise
        self._store = store

    def on_shutdown(self, worker_group, backend_config):
        try:
            refs = worker_group.execute_async(stop_tfring)
            # A dead worker's ref fails; a stuck one is ended with its actor.
            ray.wait(refs, num_returns=len(refs), timeout=backend_config.shutdown_timeout_s)
        finally:
            self._stop_store()

    def _stop_store(self):
        store, self._store = self._store, None
        if store is not None:
            store.stop()


def _get(refs, timeout, what):
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"the {len(refs)} Ray Train workers did not {what} within "
                           f"{timeout:g} s") from None


class TfringTrainer(DataParallelTrainer):
    """A Ray Train trainer whose workers form a tfring job (Keras 3, TF, torch).

    Ray Train starts the workers, feeds them Ray Data shards, collects
    ``ray.train.report`` metrics and checkpoints, and restarts the group
    after a failure (``RunConfig(failure_config=FailureConfig(max_failures=N))``);
    tfring carries the gradients. Each worker group gets its own tfring job
    (see :mod:`tfring.ray.train`); the loop joins it with ``hvd.init()``.

    Args:
        train_loop_per_worker: the function every worker runs, with no
            argument or with `train_loop_config`.
        train_loop_config: the dict handed to it.
        tfring_config: a :class:`TfringConfig` (default: ``TfringConfig()``).
        scaling_config: ``ray.train.ScalingConfig`` (workers, CPUs, GPUs).
        run_config: ``ray.train.RunConfig`` (storage, checkpoints, failures).
        datasets: {name: Ray Dataset}; each worker reads its shard with
            ``ray.train.get_dataset_shard(name)``.
        dataset_config: ``ray.train.DataConfig`` (how datasets are split).
        **kwargs: other arguments of Ray Train V2's DataParallelTrainer.

    Returns:
        ``fit()`` returns Ray's ``Result`` (last metrics, last checkpoint).

    Raises:
        TypeError: `tfring_config` is not a TfringConfig.
        ray.train.WorkerGroupError: from ``fit()``: a worker's loop raised
            (its exception, by rank, in ``worker_failures``) or died, and
            no restart was left.

    Example:
        >>> from ray.train import ScalingConfig
        >>> from tfring.ray import TfringTrainer
        >>> def loop(config):
        ...     import ray.train, tfring.keras as hvd
        ...     hvd.init()
        ...     ray.train.report({"rank": hvd.rank()})
        >>> TfringTrainer(loop, scaling_config=ScalingConfig(num_workers=2)).fit()
    """

    def __init__(self, train_loop_per_worker, *, train_loop_config=None, tfring_config=None,
                 scaling_config=None, run_config=None, datasets=None, dataset_config=None,
                 **kwargs):
        if tfring_config is None:
            tfring_config = TfringConfig()
        if not isinstance(tfring_config, TfringConfig):
            raise TypeError(f"tfring_config must be a tfring.ray.TfringConfig, got "
                            f"{type(tfring_config).__name__}")
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=tfring_config, scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, **kwargs)

    def fit(self):
        """Runs the training (see the class's text).

        Returns:
            Ray's ``Result`` (last metrics, last checkpoint).

        Raises:
            ray.train.WorkerGroupError: a worker's loop raised or died, and
                no restart was left.
            ray.train.ControllerError: Ray Train's controller failed.

        Example:
            >>> result = TfringTrainer(loop, scaling_config=ScalingConfig(num_workers=2)).fit()
        """
        if threading.current_thread() is not threading.main_thread():
            return super().fit()
        # On the main thread Ray Train installs a SIGINT handler that aborts
        # the run; it holds the run's controller, so the controller's process
        # would outlive fit() (until the next fit, or the driver's end). The
        # run is over when fit() returns or raises: the handler that was
        # there before comes back, and the controller ends.
        previous = signal.getsignal(signal.SIGINT)
        try:
            return super().fit()
        finally:
            if previous is not None:  # None: a handler not set from Python
                signal.signal(signal.SIGINT, previous)
