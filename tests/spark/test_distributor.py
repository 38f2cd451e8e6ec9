"""tfring.spark.Distributor (TorchDistributor's shape) on the shared local
Spark session: a function on the executors' barrier stage (np=2, the
session's two slots) and a script on the driver (np=3); rank 0's result
comes back, a rank's own exception ends the run."""
import os
import sys
import textwrap

import pytest

from support import import_extra

pyspark = import_extra("pyspark")
from tfring.spark import Distributor  # noqa: E402

# The ranks cannot import this module: its functions travel by value, through
# pyspark's cloudpickle (executors) and cloudpickle's own (tfring.run, driver).
pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])
import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 180


def _ranks_and_sum(scale, offset=0.0):
    import os

    import tensorflow as tf

    import tfring.tensorflow as hvd
    hvd.init()
    total = hvd.allreduce(tf.constant([float(hvd.rank()) * scale + offset]), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "total": float(total[0]),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}


def _fail_on_last_rank():
    import tensorflow as tf

    import tfring.tensorflow as hvd
    hvd.init()
    if hvd.rank() == hvd.size() - 1:
        raise LookupError(f"rank {hvd.rank()} has no shard")
    hvd.allreduce(tf.constant([1.0]))
    return "finished"


def test_executor_mode_returns_rank_0s_result(spark, no_rank_left_behind):
    result = Distributor(num_processes=2, local_mode=False, use_gpu=False,
                         timeout=TIMEOUT).run(_ranks_and_sum, 10.0, offset=1.0)
    # Rank 0's dict only, with the sum over both ranks: (0 + 1) + (10 + 1).
    assert result["rank"] == 0 and result["size"] == 2
    assert result["total"] == 12.0
    assert result["gpus"] == "" and result["pid"] != os.getpid()


def test_executor_mode_raises_the_failing_ranks_exception(spark, no_rank_left_behind):
    with pytest.raises(LookupError, match="rank 1 has no shard") as info:
        Distributor(num_processes=2, local_mode=False, timeout=TIMEOUT).run(_fail_on_last_rank)
    assert info.value.rank == 1


def test_local_mode_runs_a_script_with_its_arguments_on_three_ranks(spark, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import argparse, os, sys
        import tensorflow as tf
        import tfring.tensorflow as hvd
        p = argparse.ArgumentParser()
        p.add_argument("--scale", type=float)
        p.add_argument("out")
        a = p.parse_args()
        hvd.init()
        total = hvd.allreduce(tf.constant([hvd.rank() * a.scale]), op=hvd.Sum)
        with open(os.path.join(a.out, str(hvd.rank())), "w") as f:
            f.write(f"{hvd.size()} {float(total[0])} {os.getppid()}")
    """))
    result = Distributor(num_processes=3, local_mode=True, timeout=TIMEOUT).run(
        str(script), "--scale", 2, str(out))
    assert result is None
    written = {p.name: p.read_text().split() for p in out.iterdir()}
    assert sorted(written) == ["0", "1", "2"]
    assert all(w[:2] == ["3", "6.0"] for w in written.values())


def test_local_mode_function_and_bad_arguments(spark, tmp_path):
    with pytest.raises(LookupError, match="rank 2 has no shard"):
        Distributor(num_processes=3, timeout=TIMEOUT).run(_fail_on_last_rank)
    with pytest.raises(ValueError, match="num_processes"):
        Distributor(num_processes=0)
    with pytest.raises(ValueError, match="keyword arguments"):
        Distributor().run(str(tmp_path / "x.py"), lr=1)
    with pytest.raises(ValueError, match="no script at"):
        Distributor().run(str(tmp_path / "missing.py"))


_CONNECT_JOB = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
from pyspark.sql.utils import is_remote
from tfring.spark import Distributor
spark = SparkSession.builder.remote("local[2]").getOrCreate()
try:
    def f(scale):
        import tensorflow as tf
        import tfring.tensorflow as hvd
        hvd.init()
        total = hvd.allreduce(tf.constant([float(hvd.rank()) * scale]), op=hvd.Sum)
        return hvd.rank(), hvd.size(), float(total[0])
    print("RESULT", is_remote(), Distributor(num_processes=2, local_mode=False,
                                             timeout=120).run(f, 5.0))
finally:
    spark.stop()
"""


def test_executor_mode_under_spark_connect(no_rank_left_behind):
    """pyspark's local Spark Connect server (its own process: this one holds
    the classic session): no SparkContext on the client, so the ranks start
    through mapInArrow(barrier=True)."""
    from support import extra_missing, run_python
    try:
        from pyspark.sql.connect.utils import check_dependencies
        check_dependencies()
    except ImportError as e:
        extra_missing(e)  # Spark Connect's client dependencies
    result = run_python(_CONNECT_JOB, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RESULT True (0, 2, 5.0)" in result.stdout, result.stdout
