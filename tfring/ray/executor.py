"""RayExecutor: a tfring job whose ranks are Ray actors.

Ray places the workers and keeps them alive; tfring's TCP controller carries
the job's data. The driver (the process that holds the executor):

1. reserves one placement group, one bundle per worker (PACK by default:
   as few nodes as possible; SPREAD: as many), and starts one actor pinned
   to each bundle;
2. asks each actor for its host, node address and pid, and numbers the
   ranks host by host from that (:mod:`tfring.runner.engine_env`);
3. serves the job's rendezvous store itself, with a fresh secret, and sets
   each actor's environment (secret included) before any ``init()``.

``run(fn)`` then calls ``fn`` on every actor; ``fn`` calls ``hvd.init()``
and trains as under tfringrun.

A fixed-size run fails as a whole: a worker's exception, or an actor that
Ray lost, stops every actor (the others would wait for the lost rank in
their next collective) and the executor must be started again. With
``min_workers``/``max_workers`` the job is elastic instead
(:mod:`tfring.ray.elastic`): lost actors are replaced and the job goes on
through ``hvd.elastic.run``.
"""
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tfring._store import wire
from tfring.ray import worker
from tfring.ray.elastic import ElasticJob
from tfring.runner import engine_env, start_rendezvous
from tfring.runner.supervisor import format_ranks

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# A worker that lost its peer fails too (its error's cause says so: an echo),
# often before Ray reports the peer's death: after such an echo, how long
# .run waits for the cause (which is what it raises) before it stops the job.
FAILURE_GRACE_SECONDS = 2.0
_POLL_SECONDS = 0.1
_STOP_SECONDS = 5.0


class WorkerLostError(RuntimeError):
    """A worker's actor died (killed, out of memory, node lost) during a run.

    Attributes:
        rank: the lost worker's rank.
    """

    def __init__(self, message, rank):
        super().__init__(message)
        self.rank = rank


class _Settings:
    """What Horovod's ``RayExecutor.create_settings`` returned; tfring uses
    its ``timeout_s`` (how long start() waits for the workers)."""

    def __init__(self, timeout_s=60, **unused):
        self.timeout_s = timeout_s
        self.unused = unused


class RayExecutor:
    """Runs a function on every rank of a tfring job made of Ray actors.

    Args:
        settings: accepted for Horovod's ``RayExecutor(settings, ...)``; its
            ``timeout_s`` (see :meth:`create_settings`) sets `start_timeout`.
        num_workers: how many ranks (actors).
        cpus_per_worker: CPUs Ray reserves for each actor.
        use_gpu: reserve GPUs too (`gpus_per_worker` each, default 1); each
            actor then sees every GPU reserved on its node in local-rank
            order, so ``hvd.local_rank()`` indexes its own.
        gpus_per_worker: GPUs per actor when `use_gpu`.
        min_workers, max_workers: either one makes the job elastic (see
            docs/ray.md): it runs with between `min_workers` (default 1)
            and `max_workers` (default `num_workers`, else `min_workers`)
            workers; a lost actor is replaced when the cluster has room,
            and `fn` must use ``hvd.elastic.run``. `num_workers` is then how
            many start (default: as many as fit now, within the bounds).
        placement_strategy: "PACK" (default: as few nodes as possible),
            "SPREAD", "STRICT_PACK" or "STRICT_SPREAD". Fixed size only: an
            elastic job's actors are placed one by one, wherever they fit.
        env_vars: variables every worker gets (e.g. tuning ``TFRING_*``).
        start_timeout: seconds start() waits for the bundles and actors.
        elastic_timeout: elastic only: seconds to wait below `min_workers`
            for Ray to place new workers before the run fails (default 600).
        reset_limit: elastic only: how many times the job may re-form
            (None: no limit).
        verbose: elastic only: print every event, not only losses and new
            rounds.

    Raises:
        ValueError: a bad number, strategy or setting.
        NotImplementedError: an elastic job with `use_gpu` (not supported
            yet: each worker would see only its own GPU).

    Example:
        >>> import ray, tfring.ray
        >>> ray.init(num_cpus=2)
        >>> ex = tfring.ray.RayExecutor(num_workers=2)
        >>> ex.start()
        >>> def train():
        ...     import tfring.keras as hvd
        ...     hvd.init()
        ...     return hvd.rank()
        >>> ex.run(train)
        [0, 1]
        >>> ex.shutdown()
    """

    @staticmethod
    def create_settings(timeout_s=60, **kwargs):
        """Horovod's settings object; only `timeout_s` (start-up) is used."""
        return _Settings(timeout_s, **kwargs)

    def __init__(self, settings=None, num_workers=None, cpus_per_worker=1, use_gpu=False,
                 gpus_per_worker=None, min_workers=None, max_workers=None,
                 placement_strategy="PACK", env_vars=None, start_timeout=None,
                 elastic_timeout=600.0, reset_limit=None, verbose=False):
        elastic = min_workers is not None or max_workers is not None
        for name, value in (("num_workers", num_workers), ("min_workers", min_workers),
                            ("max_workers", max_workers)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if num_workers is None and not elastic:
            raise ValueError("RayExecutor needs num_workers (the number of ranks), or "
                             "min_workers/max_workers for an elastic job")
        if elastic:
            min_workers = 1 if min_workers is None else min_workers
            if max_workers is None:
                max_workers = max(num_workers or min_workers, min_workers)
            if min_workers > max_workers:
                raise ValueError(f"min_workers ({min_workers}) is above max_workers "
                                 f"({max_workers})")
            if num_workers is not None and not min_workers <= num_workers <= max_workers:
                raise ValueError(f"num_workers ({num_workers}) must lie between min_workers "
                                 f"({min_workers}) and max_workers ({max_workers})")
            if use_gpu:
                raise NotImplementedError(
                    "an elastic RayExecutor with use_gpu is not supported yet: give "
                    "num_workers without min_workers/max_workers for a GPU job")
            if not isinstance(elastic_timeout, (int, float)) or elastic_timeout <= 0:
                raise ValueError(f"elastic_timeout must be > 0, got {elastic_timeout!r}")
            if reset_limit is not None and (not isinstance(reset_limit, int)
                                            or reset_limit < 0):
                raise ValueError(f"reset_limit must be a whole number >= 0, got "
                                 f"{reset_limit!r}")
        if not isinstance(cpus_per_worker, (int, float)) or cpus_per_worker <= 0:
            raise ValueError(f"cpus_per_worker must be > 0, got {cpus_per_worker!r}")
        if gpus_per_worker is not None and not use_gpu:
            raise ValueError("gpus_per_worker is given but use_gpu is False")
        gpus = (1 if gpus_per_worker is None else gpus_per_worker) if use_gpu else 0
        if not isinstance(gpus, (int, float)) or gpus < 0 or (use_gpu and gpus == 0):
            raise ValueError(f"gpus_per_worker must be > 0, got {gpus_per_worker!r}")
        strategy = str(placement_strategy).upper()
        if strategy not in STRATEGIES:
            raise ValueError(f"placement_strategy {placement_strategy!r} is not one of "
                             f"{', '.join(STRATEGIES)}")
        if start_timeout is None:
            start_timeout = getattr(settings, "timeout_s", None) or 60
        self.num_workers = num_workers
        self.min_workers, self.max_workers = min_workers, max_workers
        self.elastic_timeout = float(elastic_timeout)
        self.reset_limit = reset_limit
        self.verbose = verbose
        self._elastic = None     # the ElasticJob of an elastic executor, once started
        self._elastic_events = []  # (monotonic, text) of the last elastic job that ended
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus
        self.placement_strategy = strategy
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.start_timeout = float(start_timeout)
        self._workers = []       # actors, in rank order
        self._described = []     # (host, address, pid, gpus) per actor, in rank order
        self._pg = None
        self._store = None
        self._failure = None     # why the last run stopped the job

    # -- start -------------------------------------------------------------
    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None):
        """Reserves the workers, starts the actors and the job's rendezvous
        store, and sets each actor's environment.

        Args:
            executable_cls: optional class made once per actor after its
                environment is set; :meth:`execute` hands the instance to
                its function (Horovod's ``executable_cls``).
            executable_args, executable_kwargs: its arguments.

        Raises:
            RuntimeError: already started.
            TimeoutError: the cluster could not place every bundle, or the
                actors did not start, within `start_timeout`.
        """
        if self._workers or self._elastic is not None:
            raise RuntimeError("this RayExecutor is running already; shutdown() it first")
        self._failure = None
        try:
            if self.min_workers is not None:
                self._start_elastic(executable_cls, executable_args or (),
                                    executable_kwargs or {})
                return
            self._start(executable_cls, executable_args or (), executable_kwargs or {})
        except BaseException:
            self._teardown(graceful=False)
            raise

    def _start(self, executable_cls, executable_args, executable_kwargs):
        bundle = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            bundle["GPU"] = self.gpus_per_worker
        self._pg = placement_group([dict(bundle) for _ in range(self.num_workers)],
                                   strategy=self.placement_strategy)
        ready, _ = ray.wait([self._pg.ready()], timeout=self.start_timeout)
        if not ready:
            raise TimeoutError(
                f"Ray could not place {self.num_workers} workers of {bundle} "
                f"({self.placement_strategy}) within {self.start_timeout:g} s; the cluster "
                f"has {ray.cluster_resources()} in all, {ray.available_resources()} free")
        actors = []
        for i in range(self.num_workers):
            options = {"num_cpus": self.cpus_per_worker, "max_restarts": 0,
                       "scheduling_strategy": PlacementGroupSchedulingStrategy(
                           placement_group=self._pg, placement_group_bundle_index=i)}
            if self.gpus_per_worker:
                options["num_gpus"] = self.gpus_per_worker
            actors.append(worker.start(i, **options))
        self._workers = actors  # so that a failure below still kills them
        described = self._get([a.describe.remote() for a in actors], "report their hosts")
        hosts = [d[0] for d in described]
        secret = wire.generate_secret()
        driver_address = ray.util.get_node_ip_address()
        self._store, addr, port = start_rendezvous(driver_address, 0, secret)
        ranks, envs = engine_env.worker_environments(
            hosts, addr, port, secret, bind_hosts=[d[1] for d in described],
            extra=self.env_vars,
            devices=[d[3] for d in described] if self.gpus_per_worker else None)
        order = sorted(range(len(actors)), key=lambda i: ranks[i])
        self._workers = [actors[i] for i in order]
        self._described = [described[i] for i in order]
        envs = [envs[i] for i in order]
        self._get([w.setup.remote(env, executable_cls, executable_args, executable_kwargs)
                   for w, env in zip(self._workers, envs)], "take their environment")

    def _start_elastic(self, executable_cls, executable_args, executable_kwargs):
        initial = self.num_workers
        if initial is None:
            # As many as fit now, within the bounds (a worker Ray cannot
            # place would only hold start() up for start_timeout).
            fit = int(ray.available_resources().get("CPU", 0.0) // self.cpus_per_worker)
            initial = min(self.max_workers, max(self.min_workers, fit))
        self._elastic = ElasticJob(self, num_workers=initial, min_workers=self.min_workers,
                                   max_workers=self.max_workers,
                                   elastic_timeout=self.elastic_timeout,
                                   reset_limit=self.reset_limit, verbose=self.verbose)
        self._elastic.start(executable_cls, executable_args, executable_kwargs)

    def _get(self, refs, what):
        try:
            return ray.get(refs, timeout=self.start_timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"the {len(refs)} Ray workers did not {what} within "
                               f"{self.start_timeout:g} s") from None

    # -- running -----------------------------------------------------------
    def run(self, fn, args=None, kwargs=None, timeout=None):
        """Calls ``fn(*args, **kwargs)`` on every worker, at once.

        Args:
            fn: the function each rank runs (it calls ``hvd.init()``); Ray
                pickles it, and what it returns, with cloudpickle.
            args, kwargs: its arguments, the same on every rank.
            timeout: seconds after which the job is stopped; None: no limit.

        Returns:
            A list of what ``fn`` returned, by rank.

        Raises:
            RuntimeError: the executor is not started (or a failed run
                stopped it).
            Exception: the exception that ``fn`` raised on a worker (the
                worker's own type), with a note naming its rank, host and
                traceback; its ``rank`` attribute is set when it can be.
            WorkerLostError: a worker's actor died; names its rank.
            TimeoutError: `timeout` passed.
        """
        return self._run(fn, args or (), kwargs or {}, False, timeout)

    def execute(self, fn, timeout=None):
        """Calls ``fn(executable)`` on every worker, `executable` being that
        worker's instance of start()'s `executable_cls` (None without one).
        Returns and raises as :meth:`run`."""
        return self._run(fn, (), {}, True, timeout)

    def execute_single(self, fn, timeout=None):
        """:meth:`execute` on rank 0 only; returns its result. Only for
        functions that do no collective (the other ranks are not in it).
        Fixed-size jobs only (an elastic job's rank 0 changes)."""
        self._check_running()
        if self._elastic is not None:
            raise NotImplementedError("execute_single() is for fixed-size jobs; an elastic "
                                      "job's rank 0 changes as workers come and go")
        return self._collect([self._workers[0].execute.remote(fn, (), {}, True)], timeout)[0]

    def workers(self):
        """Where each rank runs, by rank: [{"rank", "host", "address", "pid"}]
        ("host" is the name ranks are grouped by, "address" its node's
        address as Ray knows it). Empty when not running. An elastic job
        lists its live workers by worker id, each with its "worker" id and
        its rank in the current round (None before it joined one)."""
        if self._elastic is not None:
            return self._elastic.workers()
        return [{"rank": rank, "host": host, "address": address, "pid": pid}
                for rank, (host, address, pid, _) in enumerate(self._described)
                if self._workers]

    def _check_running(self):
        if not self._workers and self._elastic is None:
            why = f" (a run failed: {self._failure}; start() again)" if self._failure else \
                " (call start() first)"
            raise RuntimeError(f"this RayExecutor is not running{why}")

    def _run(self, fn, args, kwargs, with_executable, timeout):
        self._check_running()
        if self._elastic is not None:
            return self._elastic.run(fn, args, kwargs, with_executable, timeout)
        refs = [w.execute.remote(fn, args, kwargs, with_executable) for w in self._workers]
        return self._collect(refs, timeout)

    def _collect(self, refs, timeout):
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results = [None] * len(refs)
        pending = list(refs)
        failures = []          # (rank, exception to raise)
        deadline = None if timeout is None else time.monotonic() + timeout
        grace_until = None
        while pending:
            if grace_until is not None and time.monotonic() >= grace_until:
                break
            if deadline is not None and time.monotonic() >= deadline:
                late = format_ranks([rank_of[r] for r in pending])
                self._fail(f"the run passed its timeout of {timeout:g} s")
                raise TimeoutError(f"RayExecutor.run: ranks {late} had not finished after "
                                   f"{timeout:g} s; the job was stopped")
            ready, pending = ray.wait(pending, num_returns=1, timeout=_POLL_SECONDS)
            for ref in ready:
                rank = rank_of[ref]
                try:
                    status, value = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    failures.append((0, rank, lambda rank=rank, e=e: self._lost(rank, e)))
                else:
                    if status == "ok":
                        results[rank] = value
                    else:
                        # Unpickled only if chosen: a TensorFlow error would
                        # import TensorFlow here first, which takes seconds.
                        # The worker judged whether it is an echo.
                        payload, summary, text, echo = value
                        failures.append((int(echo), rank,
                                         lambda rank=rank, v=(payload, summary, text):
                                         self._raised(rank, *v)))
                if failures and grace_until is None:
                    grace_until = time.monotonic() + FAILURE_GRACE_SECONDS
            if any(echo == 0 for echo, _, _ in failures):
                # A cause (not an echo of one) is known: stop now.
                break
        if not failures:
            return results
        _, rank, make_error = min(failures, key=lambda f: (f[0], f[1]))
        self._fail(f"rank {rank}")
        raise make_error()

    def _where(self, rank):
        host, address, pid, _ = self._described[rank]
        return f"rank {rank} (host {host}, {address}, pid {pid})"

    def _lost(self, rank, error):
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return WorkerLostError(
            f"{self._where(rank)} was lost: its Ray actor died ({type(error).__name__}"
            f"{': ' + first if first else ''}); the job was stopped", rank)

    def _raised(self, rank, payload, summary, text, where=None):
        """The exception rank `rank`'s function raised, rebuilt on the driver
        (its own type when its class can be unpickled here, else a
        RuntimeError), marked with the rank and the remote traceback.
        `where` names the worker (default: by rank, as fixed-size jobs do)."""
        where = where or self._where(rank)
        error = None
        if payload is not None:
            try:
                error = ray.cloudpickle.loads(payload)
            except Exception:  # noqa: BLE001 - its class may not exist here
                error = None
        if not isinstance(error, BaseException):
            return RuntimeError(f"{where} raised {summary}\n{text}")
        return engine_env.attach_rank(error, rank,
                                      f"tfring.ray: raised on {where}; its traceback:\n{text}")

    def _fail(self, why):
        self._failure = why
        self._teardown(graceful=False)

    # -- stopping ----------------------------------------------------------
    def shutdown(self):
        """Stops tfring on every worker, ends the actors, frees the
        placement group and stops the rendezvous store. Safe to call twice."""
        self._teardown(graceful=True)

    def _teardown(self, graceful):
        elastic, self._elastic = self._elastic, None
        if elastic is not None:
            self._elastic_events = elastic.events  # what happened, kept for a post-mortem
            elastic.teardown(graceful, _STOP_SECONDS)
        workers, self._workers = self._workers, []
        if graceful and workers:
            try:
                ray.wait([w.stop_tfring.remote() for w in workers], num_returns=len(workers),
                         timeout=_STOP_SECONDS)
            except Exception:  # noqa: BLE001 - an actor already gone
                pass
        for w in workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001
                pass
            self._pg = None
        if self._store is not None:
            self._store.stop()
            self._store = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
