"""A local Spark session shared by the Spark tests (starting one takes ~10 s)."""
import os
import sys

import pytest

from support import import_extra, live_pids, started_here

TASK_MARKER = b"tfring.spark._task_main"


def rank_processes():
    """Pids of the live processes that run a tfring.spark rank started by
    this pytest process (through its Spark session or a job it ran): not
    another worker's, nor another run's on the same machine."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if TASK_MARKER not in f.read():
                    continue
        except OSError:
            continue
        if started_here(int(entry)):
            found.append(int(entry))
    return live_pids(found)


@pytest.fixture(scope="session")
def spark():
    """SparkSession on local[3]: three task slots, so barrier stages of two
    and three ranks; defaultParallelism stays 2 (num_proc's default). Its
    executors run this interpreter."""
    import_extra("pyspark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[3]").appName("tfring-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("FATAL")
    yield session
    session.stop()


@pytest.fixture
def no_rank_left_behind():
    """Fails the test if a rank's process outlives it."""
    yield
    left = live_pids(rank_processes(), wait=10.0)
    assert not left, f"rank processes outlived the job: {left}"
