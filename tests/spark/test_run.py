"""tfring.spark.run on a real local Spark (tests/spark/conftest.py): ranks
are the tasks of a barrier stage; the TCP controller carries the data."""
import sys
import time

import pytest

from support import import_extra, run_python

pyspark = import_extra("pyspark")
import tfring.spark  # noqa: E402

# Functions here run in the ranks' processes, which cannot import this
# test module: ship them by value.
pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])
import exit_rule_support  # noqa: E402
import torch_job  # noqa: E402

pyspark.cloudpickle.register_pickle_by_value(torch_job)
pyspark.cloudpickle.register_pickle_by_value(exit_rule_support)

TIMEOUT = 240


def _place_and_reduce(offset):
    import os

    import tensorflow as tf

    import tfring.tensorflow as hvd
    hvd.init()
    total = hvd.allreduce(tf.constant([float(hvd.rank() + offset)]), op=hvd.Sum)
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
            "host": os.environ["TFRING_HOSTNAME"], "env_rank": os.environ["TFRING_RANK"],
            "total": float(total[0]), "pid": os.getpid(),
            "secret_on_command_line": os.environ["TFRING_SECRET"].encode() in cmdline}


def test_run_returns_every_rank_result_in_rank_order(spark, monkeypatch, no_rank_left_behind):
    # Fake hosts, one per task: each rank is alone on its host, as tasks on
    # two executors' nodes would be.
    monkeypatch.setenv("TFRING_HOSTNAME", "spark-a,spark-b")
    started = time.monotonic()
    results = tfring.spark.run(_place_and_reduce, args=(10,), num_proc=2, timeout=TIMEOUT)
    print(f"tfring.spark.run at num_proc=2: {time.monotonic() - started:.1f} s")
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["env_rank"] for r in results] == ["0", "1"]
    assert all(r["size"] == 2 for r in results)
    assert [r["host"] for r in results] == ["spark-a", "spark-b"]
    assert [(r["local_rank"], r["cross_rank"], r["cross_size"]) for r in results] == \
        [(0, 0, 2), (0, 1, 2)]
    assert all(r["total"] == 21.0 for r in results)
    assert len({r["pid"] for r in results}) == 2
    assert not any(r["secret_on_command_line"] for r in results)


def _raise_on_rank_1():
    import tensorflow as tf

    import tfring.tensorflow as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("no such column on this shard")
    hvd.allreduce(tf.constant([1.0]))  # rank 0 waits for rank 1 here
    return "finished"


def test_a_failing_task_fails_the_job_with_the_workers_exception(spark, no_rank_left_behind):
    started = time.monotonic()
    with pytest.raises(KeyError, match="no such column on this shard") as info:
        tfring.spark.run(_raise_on_rank_1, num_proc=2, timeout=TIMEOUT)
    assert time.monotonic() - started < TIMEOUT / 2
    assert info.value.rank == 1
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised on rank 1 (host" in notes and "_raise_on_rank_1" in notes, notes
    # The session is still usable: the next job (on one host, without fake
    # names; num_proc from the context) runs.
    again = tfring.spark.run(_place_and_reduce, kwargs={"offset": 1}, timeout=TIMEOUT)
    assert [(r["rank"], r["local_rank"], r["total"]) for r in again] == [(0, 0, 3.0),
                                                                       (1, 1, 3.0)]


@pytest.mark.parametrize("failing", [0, 1])
def test_a_rank_exiting_non_zero_after_its_function_returned_fails_the_job(
        spark, tmp_path, no_rank_left_behind, failing):
    # The exit-code rule (docs/elastic.md), in both orders of finishing: the
    # rank that ends first exits 3 after its result, or the last one does.
    with pytest.raises(RuntimeError, match=rf"rank {failing} \(host .*\) failed: its process "
                                           "exited with code 3 after its function returned"):
        tfring.spark.run(exit_rule_support.end_in_order, args=(str(tmp_path), failing),
                         num_proc=2, timeout=TIMEOUT)


def test_a_torch_function_runs_unchanged(spark, no_rank_left_behind):
    """A Horovod user's torch function (tfring.torch, DistributedOptimizer)
    as the barrier stage's tasks: every rank ends with the single-process
    weights."""
    pytest.importorskip("torch")
    results = tfring.spark.run(torch_job.train_step, num_proc=2, timeout=TIMEOUT)
    assert [r["rank"] for r in results] == [0, 1] and all(r["total"] == 1.0 for r in results)
    want = torch_job.reference(2)
    for r in results:
        for got, ref in zip(r["weights"], want):
            assert got == pytest.approx(ref, rel=1e-5, abs=1e-6)


def test_bad_arguments_are_refused(spark):
    with pytest.raises(ValueError, match="num_proc"):
        tfring.spark.run(print, num_proc=0)


def test_core_does_not_import_pyspark_and_tfring_spark_names_the_extra():
    result = run_python("import sys, tfring, tfring.tensorflow, tfring.keras, tfring.runner; "
                        "print('pyspark' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    result = run_python("import sys; sys.modules['pyspark'] = None; import tfring.spark")
    assert result.returncode != 0
    assert "pip install 'tfring[spark]'" in result.stderr
    result = run_python("import tfring.spark as s; s.run(print)")
    assert result.returncode != 0 and "needs an active SparkContext" in result.stderr
