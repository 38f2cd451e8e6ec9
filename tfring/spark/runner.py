"""``tfring.spark.run``: a tfring job whose ranks are the tasks of one Spark
barrier stage.

The driver serves the job's rendezvous store, with a fresh secret, and
starts a barrier stage of `num_proc` tasks, which Spark starts together or
not at all. Each task:

1. learns its place from the barrier task context (its partition) and,
   through ``allGather``, every task's host; the ranks are numbered host by
   host from those (:mod:`tfring.runner.engine_env`, as for Ray);
2. runs ``fn`` in a Python process of its own (:mod:`tfring.spark._task_main`)
   with the rank's environment, secret included (never on a command line);
3. returns (rank, result); a failure is written to the store as the pickled
   exception, and the task fails, which fails the stage (Spark stops the
   other tasks, and their processes die with them). So does a process
   that exits non-zero, even after ``fn`` returned.

The driver returns the results by rank, or raises the failing rank's own
exception.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid

from pyspark import cloudpickle

from tfring._store import rendezvous, wire
from tfring.runner import engine_env, remote, start_rendezvous
from tfring.spark import _report

# After a failed stage, how long the driver waits for a failed rank's report,
# and then for the others' (the cause is chosen among them all).
_REPORT_SECONDS = 5.0
_MORE_REPORTS_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, env=None, timeout=None,
        spark_context=None):
    """Runs ``fn(*args, **kwargs)`` on `num_proc` Spark tasks that form one
    tfring job (``fn`` calls ``hvd.init()``), and returns what each returned.

    Args:
        fn: the function every rank runs; pickled with cloudpickle (as are
            its arguments and results).
        args, kwargs: its arguments, the same on every rank.
        num_proc: how many ranks (tasks); default: the context's
            ``defaultParallelism``. The cluster must be able to run them all
            at once (a barrier stage).
        start_timeout: seconds the ranks wait for each other in ``init()``
            (``TFRING_START_TIMEOUT``); default the core's.
        env: variables every rank gets (e.g. tuning ``TFRING_*``).
        timeout: seconds after which the Spark job is cancelled; None: no limit.
        spark_context: default: the active SparkContext.

    Returns:
        The list of ``fn``'s results, by rank.

    Raises:
        RuntimeError: no active SparkContext; the job failed without a
            rank's report (e.g. an executor was lost), or was cancelled.
        ValueError: a bad `num_proc`.
        Exception: the exception ``fn`` raised on a rank (its own type),
            with a note naming the rank and its traceback, and its ``rank``
            attribute set when it can be.

    Example:
        >>> from pyspark.sql import SparkSession
        >>> spark = SparkSession.builder.master("local[2]").getOrCreate()
        >>> def fn():
        ...     import tfring.tensorflow as hvd
        ...     hvd.init()
        ...     return hvd.rank()
        >>> tfring.spark.run(fn, num_proc=2)
        [0, 1]
    """
    from pyspark import SparkContext
    sc = spark_context or SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("tfring.spark.run needs an active SparkContext: create a "
                           "SparkSession (or SparkContext) first")
    if num_proc is None:
        num_proc = sc.defaultParallelism
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"num_proc must be a whole number >= 1, got {num_proc!r}")
    return run_on_partitions(sc.parallelize(range(num_proc), num_proc), fn, args, kwargs,
                             start_timeout=start_timeout, env=env, timeout=timeout)


def run_on_partitions(rdd, fn, args=(), kwargs=None, partition_args=None, start_timeout=None,
                      env=None, timeout=None, only_rank0=False, use_gpu=None):
    """:func:`run` with one rank per partition of `rdd`; with
    `partition_args`, rank r calls ``fn(*partition_args(rows), *args, **kwargs)``,
    `rows` being an iterator over its partition (read in the Spark task;
    what it returns is pickled to the rank's process). `only_rank0`: the
    other ranks' results are not sent back (None in their place).
    `use_gpu`: None leaves ``CUDA_VISIBLE_DEVICES`` alone; True gives each
    rank its task's GPUs (Spark's ``gpu`` resource); False hides every GPU.

    Returns and raises as :func:`run`.
    """
    sc = rdd.context
    group = f"tfring-{uuid.uuid4().hex[:12]}"

    def launch(job):
        sc.setJobGroup(group, f"tfring.spark of {getattr(fn, '__name__', 'fn')} on "
                              f"{rdd.getNumPartitions()} ranks", interruptOnCancel=True)
        try:
            return rdd.barrier().mapPartitions(job.run_task).collect()
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)

    return _run_stage(fn, args, kwargs, rdd.getNumPartitions(), sc.master,
                      sc.getConf().get("spark.driver.host"), launch,
                      lambda: sc.cancelJobGroup(group), partition_args=partition_args,
                      start_timeout=start_timeout, env=env, timeout=timeout,
                      only_rank0=only_rank0, use_gpu=use_gpu)


# A result travels back through a DataFrame in pieces of at most this many
# bytes (Spark Connect sends collected rows in Arrow batches of a few MB).
_CHUNK_BYTES = 1 << 20


def run_on_session(spark, num_proc, fn, args=(), kwargs=None, start_timeout=None, env=None,
                   timeout=None, only_rank0=False, use_gpu=None):
    """:func:`run` through the DataFrame API only (``mapInArrow`` with
    ``barrier=True``), so that it works under Spark Connect, where there is
    no SparkContext; the job is cancelled by its tag. The rendezvous store
    runs in this (the client's) process, which the executors must reach.

    Returns and raises as :func:`run`.
    """
    tag = f"tfring-{uuid.uuid4().hex[:12]}"

    def launch(job):
        def task(batches):
            import pyarrow as pa
            for rank, data in job.run_task(batches):
                pieces = [data[i:i + _CHUNK_BYTES]
                          for i in range(0, len(data), _CHUNK_BYTES)] or [b""]
                yield pa.RecordBatch.from_pydict(
                    {"rank": [rank] * len(pieces), "seq": list(range(len(pieces))),
                     "data": pieces},
                    schema=pa.schema([("rank", pa.int32()), ("seq", pa.int32()),
                                      ("data", pa.binary())]))
        spark.addTag(tag)
        try:
            rows = (spark.range(0, num_proc, 1, num_proc)
                    .mapInArrow(task, "rank int, seq int, data binary", barrier=True)
                    .collect())
        finally:
            spark.removeTag(tag)
        joined = {}
        for row in sorted(rows, key=lambda r: (r["rank"], r["seq"])):
            joined[row["rank"]] = joined.get(row["rank"], b"") + bytes(row["data"])
        return list(joined.items())

    conf = spark.conf
    return _run_stage(fn, args, kwargs, num_proc, conf.get("spark.master", "local"),
                      conf.get("spark.driver.host", None), launch,
                      lambda: spark.interruptTag(tag), start_timeout=start_timeout, env=env,
                      timeout=timeout, only_rank0=only_rank0, use_gpu=use_gpu)


def _run_stage(fn, args, kwargs, num_proc, master, driver_host, launch, cancel,
               partition_args=None, start_timeout=None, env=None, timeout=None,
               only_rank0=False, use_gpu=None):
    """Serves the job's store, runs ``launch(task_spec)`` (one barrier stage
    that returns the (rank, pickled result) pairs) and turns its failure
    into the failing rank's exception; ``cancel()`` stops the stage when
    `timeout` passes."""
    extra = {str(k): str(v) for k, v in (env or {}).items()}
    if start_timeout is not None:
        extra["TFRING_START_TIMEOUT"] = str(start_timeout)
    extra.setdefault("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    if use_gpu is False:
        extra["CUDA_VISIBLE_DEVICES"] = ""

    local = master.startswith("local")
    # A local master runs every task on this machine: keep the job on loopback.
    bind, advertise = ("127.0.0.1", "127.0.0.1") if local else (
        "0.0.0.0", driver_host or socket.gethostname())
    secret = wire.generate_secret()
    store, _, port = start_rendezvous(bind, 0, secret)
    job = _TaskSpec(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))), partition_args,
                    advertise, port, secret, "127.0.0.1" if local else "", extra,
                    remote.fake_host_names(), only_rank0=only_rank0, task_gpus=bool(use_gpu))
    timer = None
    try:
        if timeout is not None:
            timer = threading.Timer(timeout, cancel)
            timer.daemon = True
            timer.start()
        started = time.monotonic()
        try:
            rows = launch(job)
        except Exception as e:  # noqa: BLE001 - py4j's and pyspark's errors alike
            reported = _reported_failure(store, secret)
            if reported is not None:
                raise reported from None
            if timeout is not None and time.monotonic() - started >= timeout:
                raise RuntimeError(f"tfring.spark: the job ran past its timeout of "
                                   f"{timeout:g} s and was cancelled") from e
            raise RuntimeError(f"tfring.spark: the Spark job failed before any rank "
                               f"reported an error: {_first_line(e)}") from e
    finally:
        if timer is not None:
            timer.cancel()
        store.stop()
    results = [None] * num_proc
    for rank, data in rows:
        results[rank] = cloudpickle.loads(data)
    return results


def _first_line(error):
    text = str(error).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return text.splitlines()[0][:500] if text else type(error).__name__


def _reported_failure(store, secret):
    """The exception to raise for what the ranks wrote to the store, or None."""
    scope, prefix = _report.SCOPE, _report.ERROR_PREFIX
    try:
        with rendezvous.RendezvousClient(*store.address, secret, timeout=5.0) as client:
            entries = client.wait_prefix(scope, prefix, 1, timeout=_REPORT_SECONDS)
            while True:
                try:
                    entries = client.wait_prefix(scope, prefix, len(entries) + 1,
                                                 timeout=_MORE_REPORTS_SECONDS)
                except wire.WireTimeoutError:
                    break
    except wire.WireError:
        return None
    reports = []
    for _, value in entries:
        try:
            reports.append(cloudpickle.loads(value))
        except Exception:  # noqa: BLE001 - a report this side cannot read
            continue
    if not reports:
        return None
    # A rank that lost its peer fails too (collateral: its error's cause
    # says so); the cause is the other one. Then the earliest.
    report = min(reports, key=lambda r: (r["collateral"], r["time"], r["rank"]))
    error = None
    if report["payload"] is not None:
        try:
            error = cloudpickle.loads(report["payload"])
        except Exception:  # noqa: BLE001 - its class may not exist on the driver
            error = None
    where = f"rank {report['rank']} (host {report['host']}, pid {report['pid']})"
    if not isinstance(error, BaseException):
        return RuntimeError(f"tfring.spark.run: {where} failed: {report['summary']}\n"
                            f"{report['traceback']}")
    return engine_env.attach_rank(
        error, report["rank"], f"tfring.spark: raised on {where}; its traceback:\n"
                               f"{report['traceback']}")


class _TaskSpec:
    """What every task of the stage needs; pickled into the tasks."""

    def __init__(self, payload, partition_args, addr, port, secret, bind, extra, fake_hosts,
                 only_rank0=False, task_gpus=False):
        self.payload, self.partition_args = payload, partition_args
        self.addr, self.port, self.secret = addr, port, secret
        self.bind, self.extra, self.fake_hosts = bind, extra, fake_hosts
        self.only_rank0, self.task_gpus = only_rank0, task_gpus

    def _own_host(self, index):
        if self.fake_hosts and index < len(self.fake_hosts):
            return self.fake_hosts[index]
        own = os.environ.get("TFRING_HOSTNAME", "")
        return own if own and "," not in own else socket.gethostname()

    def run_task(self, partition):
        from pyspark import BarrierTaskContext
        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        hosts = [json.loads(m) for m in ctx.allGather(json.dumps(self._own_host(index)))]
        ranks, envs = engine_env.worker_environments(
            hosts, self.addr, self.port, self.secret,
            bind_hosts=[self.bind] * len(hosts), extra=self.extra)
        rank = ranks[index]
        if self.task_gpus:
            gpus = ctx.resources().get("gpu")
            if gpus is None or not gpus.addresses:
                raise RuntimeError("use_gpu=True, but Spark gave this task no GPU: set "
                                   "spark.task.resource.gpu.amount (and the executors' GPUs)")
            envs[index]["CUDA_VISIBLE_DEVICES"] = ",".join(gpus.addresses)
        try:
            leading = cloudpickle.dumps(tuple(self.partition_args(partition))
                                        if self.partition_args is not None else ())
        except Exception as e:
            # Bad data in this partition: the driver raises this, not Spark's wrapper.
            _report.report_failure(envs[index], os.getpid(), _report.pickled(e),
                                      f"{type(e).__name__}: {e}"[:2000],
                                      traceback.format_exc()[-20000:])
            raise
        status, value, pid = self._run_rank(envs[index], leading)
        if status == "ok":
            return [(rank, cloudpickle.dumps(None if self.only_rank0 and rank else value))]
        payload, summary, text = value
        if status == "died":  # a process that ended without a word reports nothing itself
            _report.report_failure(envs[index], pid, payload, summary, text)
        raise RuntimeError(f"tfring.spark: rank {rank} (host {hosts[index]}, pid {pid}) "
                           f"failed: {summary}")

    def _run_rank(self, rank_env, leading):
        """Runs fn in a child process with `rank_env`, `leading` (pickled) its
        first arguments; returns (status, value, pid)."""
        with tempfile.TemporaryDirectory(prefix="tfring-spark-") as scratch:
            source, first = os.path.join(scratch, "in"), os.path.join(scratch, "leading")
            target = os.path.join(scratch, "out")
            with open(source, "wb") as f:
                f.write(self.payload)
            with open(first, "wb") as f:
                f.write(leading)
            child = subprocess.Popen(
                [sys.executable, "-m", "tfring.spark._task_main", source, first, target],
                env=dict(os.environ, **rank_env), preexec_fn=_die_with_parent)
            try:
                code = child.wait()
            except BaseException:
                # The task is being stopped (Spark kills the stage's other
                # tasks when one fails): the rank goes with it.
                child.kill()
                child.wait()
                raise
            status = None
            if os.path.exists(target):
                with open(target, "rb") as f:
                    status, value = cloudpickle.loads(f.read())
                if code == 0 or status != "ok":
                    return status, value, child.pid
            what = (f"was killed by signal {-code} ({_signal_name(-code)})"
                    if code < 0 else f"exited with code {code}")
            # A rank that exits non-zero after its function returned failed
            # too (an exit handler, a crash at teardown), as under tfringrun
            # (docs/elastic.md, "Exit codes").
            when = "after its function returned" if status == "ok" else "before it returned"
            return "died", (None, f"its process {what} {when}", ""), child.pid

def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"


def _die_with_parent():
    """In the child before exec: SIGKILL it when the task's process dies
    (Linux; elsewhere the task kills it when it is stopped)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
