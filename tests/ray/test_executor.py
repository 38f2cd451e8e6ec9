"""tfring.ray.RayExecutor on a real local Ray instance (tests/ray/conftest.py).

Ranks are Ray actors; the TCP controller carries the data. Each test starts
its own executor (start-up is cheap; each actor's first TensorFlow import is
not, so the tests are few and each checks several things).
"""
import os
import runpy
import signal
import sys
import threading
import time

import numpy as np
import pytest

from support import ROOT, import_extra, live_pids, run_python, tfringrun

ray = import_extra("ray")
from tfring.ray import RayExecutor, WorkerLostError  # noqa: E402

# Functions here run in the actors, which cannot import this test module:
# ship them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
import torch_job  # noqa: E402

ray.cloudpickle.register_pickle_by_value(torch_job)

RUN_TIMEOUT = 180
EPOCHS = 2


def _digits_module():
    return runpy.run_path(os.path.join(ROOT, "examples", "ray_keras_digits.py"),
                          run_name="ray_keras_digits")


@pytest.fixture
def executor(ray_cluster, request, monkeypatch):
    """A started RayExecutor; the indirect parameter is (num_workers, fake
    hosts or None), default (2, None). After the test it is shut down and
    none of its actors' processes is left."""
    num_workers, fake_hosts = getattr(request, "param", (2, None))
    if fake_hosts:
        monkeypatch.setenv("TFRING_HOSTNAME", fake_hosts)
    ex = RayExecutor(num_workers=num_workers, cpus_per_worker=1)
    ex.start()
    pids = [w["pid"] for w in ex.workers()]
    yield ex
    ex.shutdown()
    assert not live_pids(pids, wait=10.0), "actor processes outlived shutdown()"


def test_keras_digits_trains_as_under_tfringrun(executor, tmp_path):
    train = _digits_module()["train"]
    started = time.monotonic()
    results = executor.run(train, kwargs={"epochs": EPOCHS}, timeout=RUN_TIMEOUT)
    ray_seconds = time.monotonic() - started
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results)
    for r in results[1:]:
        for a, b in zip(r["weights"], results[0]["weights"]):
            np.testing.assert_array_equal(a, b, err_msg="ranks ended with different weights")
    assert results[0]["val_accuracy"] >= 0.9, results[0]["val_accuracy"]

    # The same function, shards and seeds under tfringrun --tcp.
    code = ("import runpy, sys, numpy as np; "
            "m = runpy.run_path('examples/ray_keras_digits.py', run_name='d'); "
            f"r = m['train'](epochs={EPOCHS}); "
            "np.savez(sys.argv[1] + f\"/rank{r['rank']}.npz\", *r['weights'])")
    run = tfringrun(2, [sys.executable, "-c", code, str(tmp_path)], timeout=RUN_TIMEOUT,
                    controller="tcp")
    assert run.returncode == 0, run.stdout[-5000:]
    for rank in (0, 1):
        with np.load(tmp_path / f"rank{rank}.npz") as saved:
            expected = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        assert len(expected) == len(results[rank]["weights"])
        for got, want in zip(results[rank]["weights"], expected):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    print(f"RayExecutor digits run: {ray_seconds:.1f} s")


def _place_and_reduce():
    import socket

    import tensorflow as tf

    import tfring.tensorflow as hvd
    hvd.init()
    total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
            "host": os.environ["TFRING_HOSTNAME"], "real_host": socket.gethostname(),
            "pid": os.getpid(), "total": float(total[0]),
            "env_rank": os.environ["TFRING_RANK"]}


# Fake hosts: the actors report the names TFRING_HOSTNAME lists (one per
# worker, as tfringrun takes it), as actors on two nodes would report their
# nodes'. Workers 0 and 2 share host "na"; worker 1 is alone on "nb".
@pytest.mark.parametrize("executor", [(3, "na,nb,na")], indirect=True)
def test_ranks_follow_the_actors_hosts_at_np3(executor):
    results = executor.run(_place_and_reduce, timeout=RUN_TIMEOUT)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert [r["env_rank"] for r in results] == ["0", "1", "2"]
    assert [r["host"] for r in results] == ["na", "na", "nb"]
    assert [(r["local_rank"], r["local_size"]) for r in results] == [(0, 2), (1, 2), (0, 1)]
    assert [r["cross_rank"] for r in results] == [0, 0, 1]
    assert all(r["total"] == 6.0 for r in results)
    workers = executor.workers()
    assert [w["rank"] for w in workers] == [0, 1, 2]
    assert [w["pid"] for w in workers] == [r["pid"] for r in results]
    # A second run reuses the job.
    again = executor.run(_place_and_reduce, timeout=RUN_TIMEOUT)
    assert [r["pid"] for r in again] == [r["pid"] for r in results]
    # The secret travels in the actors' environment, never on a command line.
    secret = None
    with open(f"/proc/{results[0]['pid']}/environ", "rb") as f:
        for item in f.read().split(b"\0"):
            if item.startswith(b"TFRING_SECRET="):
                secret = item.split(b"=", 1)[1]
    for r in results:
        with open(f"/proc/{r['pid']}/cmdline", "rb") as f:
            cmdline = f.read()
        if secret:
            assert secret not in cmdline


def test_a_torch_function_runs_unchanged(executor):
    """A Horovod user's torch function (tfring.torch, DistributedOptimizer)
    on the actors: every rank ends with the single-process weights."""
    pytest.importorskip("torch")
    results = executor.run(torch_job.train_step, timeout=RUN_TIMEOUT)
    assert [r["rank"] for r in results] == [0, 1] and all(r["total"] == 1.0 for r in results)
    want = torch_job.reference(2)
    for r in results:
        for got, ref in zip(r["weights"], want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def _raise_on_rank_1():
    import tensorflow as tf

    import tfring.tensorflow as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("bad shard on this worker")
    hvd.allreduce(tf.constant([1.0]))  # rank 0 waits for rank 1 here, for ever
    return "rank 0 finished"


def test_a_worker_that_raises_is_reported_with_its_rank(executor):
    pids = [w["pid"] for w in executor.workers()]
    started = time.monotonic()
    with pytest.raises(ValueError, match="bad shard on this worker") as info:
        executor.run(_raise_on_rank_1, timeout=RUN_TIMEOUT)
    elapsed = time.monotonic() - started
    assert info.value.rank == 1
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised on rank 1 (host" in notes and "_raise_on_rank_1" in notes, notes
    # The job was stopped: rank 0, blocked in its allreduce, is gone too.
    assert not live_pids(pids, wait=10.0), "actors outlived the failed run"
    with pytest.raises(RuntimeError, match="not running .*a run failed: rank 1"):
        executor.run(_place_and_reduce)
    assert elapsed < 60, elapsed


def _allreduce_until_killed(marker_dir):
    import tensorflow as tf

    import tfring.tensorflow as hvd
    hvd.init()
    for step in range(100000):
        hvd.allreduce(tf.constant([1.0]), name="loop")
        if step == 5:
            open(os.path.join(marker_dir, f"ready.{hvd.rank()}"), "w").close()
        time.sleep(0.01)
    return "not killed"


def test_a_killed_actor_ends_the_run_within_10_s(executor, tmp_path):
    workers = executor.workers()
    pids = [w["pid"] for w in workers]
    outcome = {}

    def run():
        try:
            outcome["result"] = executor.run(_allreduce_until_killed, args=(str(tmp_path),),
                                             timeout=RUN_TIMEOUT)
        except BaseException as e:  # noqa: BLE001 - inspected below
            outcome["error"] = e
        outcome["ended"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + RUN_TIMEOUT
    while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)):
        assert thread.is_alive(), outcome
        assert time.monotonic() < deadline, "the workers never got going"
        time.sleep(0.05)
    os.kill(pids[1], signal.SIGKILL)
    killed = time.monotonic()
    thread.join(30)
    assert not thread.is_alive(), "run() did not end after an actor was killed"
    assert outcome["ended"] - killed < 10, outcome["ended"] - killed
    print(f"run() ended {outcome['ended'] - killed:.1f} s after the actor was killed")
    error = outcome.get("error")
    assert isinstance(error, WorkerLostError), outcome
    assert error.rank == 1
    assert f"rank 1 (host {workers[1]['host']}" in str(error) and "was lost" in str(error)
    assert not live_pids(pids, wait=10.0), "actors outlived the failed run"


def test_bad_settings_are_refused_before_anything_starts():
    # Elastic settings are checked in tests/ray/test_elastic_executor.py.
    with pytest.raises(NotImplementedError, match="elastic RayExecutor with use_gpu"):
        RayExecutor(min_workers=1, max_workers=4, use_gpu=True)
    with pytest.raises(ValueError, match="num_workers"):
        RayExecutor(num_workers=0)
    with pytest.raises(ValueError, match="placement_strategy"):
        RayExecutor(num_workers=2, placement_strategy="SCATTER")
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(num_workers=2, gpus_per_worker=1)
    with pytest.raises(RuntimeError, match="call start"):
        RayExecutor(num_workers=2).run(print)


def test_an_unplaceable_job_fails_start_with_the_resources(ray_cluster):
    ex = RayExecutor(num_workers=2, cpus_per_worker=3, start_timeout=3)
    with pytest.raises(TimeoutError, match="could not place 2 workers"):
        ex.start()
    ex.shutdown()


def test_core_does_not_import_ray_and_tfring_ray_names_the_extra():
    result = run_python("import sys, tfring, tfring.tensorflow, tfring.keras, tfring.runner; "
                        "print('ray' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    result = run_python("import sys; sys.modules['ray'] = None; import tfring.ray")
    assert result.returncode != 0
    assert "pip install 'tfring[ray]'" in result.stderr
