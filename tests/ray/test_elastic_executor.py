"""The elastic RayExecutor (min_workers/max_workers) on a real local Ray
instance (tests/ray/conftest.py): a killed actor is replaced and the job
goes on through hvd.elastic.run.

The training is tests/tensorflow/elastic_worker.py's deterministic schedule
(at step s with n ranks, rank r trains on batch(s, n, r)), so the sizes each
committed step ran at can be replayed in one process for a reference.
"""
import os
import re
import sys
import time

import numpy as np
import pytest

from support import ROOT, import_extra, live_pids

ray = import_extra("ray")
from tfring.ray import RayExecutor  # noqa: E402

# Functions here run in the actors, which cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORKER_SCRIPT = os.path.join(ROOT, "tests", "tensorflow", "elastic_worker.py")
RUN_TIMEOUT = 400


def _train(script, steps, kill_worker, kill_step, full_size, wait_step, step_sleep,
           raise_worker=None, raise_step=None, kill_signal="SIGKILL"):
    """Runs in each actor. Worker `kill_worker` sends `kill_signal` to its
    own process at `kill_step` (SIGSTOP: alive to Ray, silent to its peers); at `wait_step` every rank waits (checking for new hosts)
    until the job has `full_size` ranks again, so the replacement surely
    joins before the end. Worker `raise_worker` raises ValueError at
    `raise_step`. Returns this rank's view of the end."""
    import runpy
    import signal
    import time

    import tensorflow as tf

    import tfring.tensorflow as hvd

    w = runpy.run_path(script, run_name="elastic_worker")
    hvd.init()
    wid = int(os.environ["TFRING_ELASTIC_WORKER"])
    model, opt = w["build"]()
    x, y = w["data"]()
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0, sizes=[], resets=0)
    state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])

    @tf.function
    def train_step(xb, yb):
        grads = [hvd.allreduce(g, op=hvd.Average) for g in w["gradients"](model, xb, yb)]
        opt.apply_gradients(zip(grads, model.trainable_variables))

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            s, n, r = state.step, hvd.size(), hvd.rank()
            if wid == kill_worker and s == kill_step:
                os.kill(os.getpid(), getattr(signal, kill_signal))
            if wid == raise_worker and s == raise_step:
                raise ValueError(f"bad batch at step {s}")
            if s == wait_step:
                while hvd.size() < full_size:
                    time.sleep(0.2)
                    state.check_host_updates()
            idx = w["batch_index"](s, n, r, len(x))
            train_step(tf.constant(x[idx]), tf.constant(y[idx]))
            time.sleep(step_sleep)
            state.sizes = state.sizes + [n]
            state.step += 1
            state.commit()

    train(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "worker": wid, "pid": os.getpid(),
            "sizes": list(state.sizes), "resets": state.resets,
            "weights": [v.numpy() for v in model.trainable_variables]}


@pytest.mark.parametrize("kill_signal", ["SIGKILL", "SIGSTOP"])
def test_killed_actor_is_replaced_and_the_job_finishes(ray_cluster, kill_signal):
    # SIGSTOP: Ray still has the actor; only its peers' reports in the store
    # (after 3 missed 1-s heartbeats) tell the executor it is gone.
    steps, kill_step, wait_step = 24, 4, 12
    ex = RayExecutor(min_workers=2, max_workers=3, num_workers=3, cpus_per_worker=1,
                     elastic_timeout=120, start_timeout=120,
                     env_vars={"TFRING_HEARTBEAT_SECONDS": "1"})
    ex.start()
    started = [w["pid"] for w in ex.workers()]
    assert [w["worker"] for w in ex.workers()] == [0, 1, 2]
    try:
        # Worker 0 (rank 0) dies: the oldest survivor, worker 1, becomes rank 0.
        results = ex.run(_train, args=(WORKER_SCRIPT, steps, 0, kill_step, 3, wait_step, 0.2),
                         kwargs={"kill_signal": kill_signal}, timeout=RUN_TIMEOUT)
        events = [text for _, text in ex_events(ex)]
        pids = [w["pid"] for w in ex.workers()]
    finally:
        ex.shutdown()
    assert not live_pids(started + pids, wait=10.0), "actor processes outlived shutdown()"
    assert any("worker 0" in e and "was lost" in e for e in events), events
    if kill_signal == "SIGSTOP":
        assert any("worker 0" in e and "gone for its peers" in e for e in events), events

    # The replacement (worker 3) joined; ranks follow the workers' age.
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert [r["worker"] for r in results] == [1, 2, 3], [r["worker"] for r in results]
    assert all(r["size"] == 3 for r in results)
    sizes = results[0]["sizes"]
    assert all(r["sizes"] == sizes for r in results)
    assert len(sizes) == steps
    # Size 3 until the kill, then 2 until the replacement joined (how many
    # steps that is depends on how fast it starts), 3 from the wait on.
    assert sizes[:kill_step] == [3] * kill_step, sizes
    assert set(sizes[kill_step:wait_step]) <= {2, 3}, sizes
    assert sizes[wait_step:] == [3] * (steps - wait_step), sizes
    assert all(r["resets"] >= 1 for r in results[:2]), [r["resets"] for r in results]

    for r in results[1:]:
        for a, b in zip(r["weights"], results[0]["weights"]):
            np.testing.assert_array_equal(a, b, err_msg="ranks ended with different weights")
    # The same steps at the same sizes, replayed in one process.
    import runpy
    reference = runpy.run_path(WORKER_SCRIPT, run_name="elastic_worker")["replay"](sizes)
    for got, want in zip(results[0]["weights"], reference):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def _stopped(ex, pids):
    """The executor was stopped by the failed run: it has no worker, and
    none of the actors' processes outlives it."""
    assert ex.workers() == []
    with pytest.raises(RuntimeError, match="not running"):
        ex.run(print)
    assert not live_pids(pids, wait=10.0), "actor processes outlived the failed run"


def test_exception_ends_the_run_naming_the_worker(ray_cluster):
    ex = RayExecutor(min_workers=1, max_workers=2, num_workers=2, elastic_timeout=60,
                     start_timeout=120)
    ex.start()
    pids = [w["pid"] for w in ex.workers()]
    try:
        with pytest.raises(ValueError, match="bad batch at step 2") as info:
            ex.run(_train, args=(WORKER_SCRIPT, 6, None, None, 2, -1, 0.0),
                   kwargs={"raise_worker": 1, "raise_step": 2}, timeout=RUN_TIMEOUT)
        assert info.value.rank == 1
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "raised on worker 1" in notes and "rank 1" in notes, notes
        # No rollback loop: the run ended at the first exception.
        assert not any("round 2" in text for _, text in ex_events(ex)), ex_events(ex)
        _stopped(ex, pids)
    finally:
        ex.shutdown()


def ex_events(ex):
    """What the executor's elastic job did (kept after a failed run)."""
    return ex._elastic.events if ex._elastic is not None else ex._elastic_events


def test_reset_limit_stops_the_run(ray_cluster):
    ex = RayExecutor(min_workers=2, max_workers=3, num_workers=3, elastic_timeout=60,
                     start_timeout=120, reset_limit=0)
    ex.start()
    pids = [w["pid"] for w in ex.workers()]
    try:
        with pytest.raises(RuntimeError, match=re.escape(
                "the job reached reset_limit 0 (0 resets) and needs another one")):
            ex.run(_train, args=(WORKER_SCRIPT, 40, 1, 2, 3, -1, 0.1), timeout=RUN_TIMEOUT)
        _stopped(ex, pids)
    finally:
        ex.shutdown()


class _Hold:
    """An actor that only holds the CPUs it was placed with."""

    def ping(self):
        return 1


def _on_event(ex, prefix, action, delay=0.0):
    """Starts a thread that, once the executor's elastic job records an event
    starting with `prefix`, waits `delay` seconds and calls `action` with the
    events' texts then. Returns the thread (a daemon: it gives up with the
    job)."""
    import threading

    def watch():
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline and ex._elastic is not None:
            if any(t.startswith(prefix) for _, t in ex_events(ex)):
                time.sleep(delay)
                action([t for _, t in ex_events(ex)])
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_below_min_workers_fails_after_elastic_timeout_naming_the_shortfall(ray_cluster):
    ex = RayExecutor(min_workers=2, max_workers=2, num_workers=2, cpus_per_worker=2,
                     elastic_timeout=5, start_timeout=120)
    ex.start()
    pids = [w["pid"] for w in ex.workers()]
    # Queued now (the two workers hold the cluster's 4 CPUs), Ray places it
    # as soon as the lost worker's CPUs are free: no room for a replacement.
    hold = ray.remote(num_cpus=2)(_Hold).remote()
    try:
        with pytest.raises(RuntimeError, match=re.escape(
                "gave up after elastic_timeout 5 s waiting for 1 more worker(s): min_workers "
                "is 2 and 1 worker(s) are running")):
            ex.run(_train, args=(WORKER_SCRIPT, 40, 1, 2, 2, -1, 0.1), timeout=RUN_TIMEOUT)
        texts = [text for _, text in ex_events(ex)]
        assert any(t.startswith("waiting for 1 more worker(s)") for t in texts), texts
        assert ray.get(hold.ping.remote(), timeout=30) == 1
        _stopped(ex, pids)
    finally:
        ex.shutdown()
        ray.kill(hold)


def test_below_min_workers_waits_and_recovers_when_ray_has_room_again(ray_cluster):
    ex = RayExecutor(min_workers=2, max_workers=2, num_workers=2, cpus_per_worker=2,
                     elastic_timeout=120, start_timeout=120)
    ex.start()
    hold = ray.remote(num_cpus=2)(_Hold).remote()
    released = []

    def release(texts):
        released.append(texts)
        ray.kill(hold)

    # It keeps waiting while Ray has no room: the events a second later show it.
    watcher = _on_event(ex, "waiting for 1 more worker(s)", release, delay=1.0)
    try:
        results = ex.run(_train, args=(WORKER_SCRIPT, 12, 1, 2, 2, 6, 0.1),
                         timeout=RUN_TIMEOUT)
    finally:
        ex.shutdown()
        ray.kill(hold)
        watcher.join(10)
    assert released, "the job never waited below min_workers"
    assert not any("round 2" in t for t in released[0]), released[0]
    # Worker 1 was lost at step 2; its replacement (worker 2) joined once the
    # held CPUs were free, and the job finished at size 2.
    assert [r["worker"] for r in results] == [0, 2]
    sizes = results[0]["sizes"]
    assert sizes == [2] * 12 and results[1]["sizes"] == sizes, sizes
    for a, b in zip(results[0]["weights"], results[1]["weights"]):
        np.testing.assert_array_equal(a, b)
    import runpy
    reference = runpy.run_path(WORKER_SCRIPT, run_name="elastic_worker")["replay"](sizes)
    for got, want in zip(results[0]["weights"], reference):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"min_workers": 3, "max_workers": 2}, "min_workers (3) is above max_workers (2)"),
    ({"min_workers": 2, "max_workers": 3, "num_workers": 4}, "num_workers (4) must lie"),
    ({"min_workers": 0}, "min_workers must be a whole number"),
    ({"min_workers": 1, "elastic_timeout": 0}, "elastic_timeout must be > 0"),
    ({"min_workers": 1, "reset_limit": -1}, "reset_limit must be a whole number"),
])
def test_elastic_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RayExecutor(**kwargs)


def test_grows_to_max_workers_when_ray_has_room_and_runs_again(ray_cluster):
    # Two of the cluster's 4 CPUs are held, so the job starts with the 2
    # workers asked for; once the first round runs they are freed, the job
    # grows to max_workers (3) while training, and a second run() reuses
    # the grown job.
    hold = ray.remote(num_cpus=2)(_Hold).remote()
    assert ray.get(hold.ping.remote(), timeout=60) == 1
    ex = RayExecutor(min_workers=2, max_workers=3, num_workers=2, cpus_per_worker=1,
                     elastic_timeout=120, start_timeout=120)
    ex.start()
    steps, wait_step = 12, 6
    watcher = _on_event(ex, "round 1:", lambda _: ray.kill(hold))
    try:
        assert [w["worker"] for w in ex.workers()] == [0, 1]
        first = ex.run(_train, args=(WORKER_SCRIPT, steps, None, None, 3, wait_step, 0.1),
                       timeout=RUN_TIMEOUT)
        second = ex.run(_train, args=(WORKER_SCRIPT, 4, None, None, 3, -1, 0.0),
                        timeout=RUN_TIMEOUT)
        events = [text for _, text in ex_events(ex)]
        pids = [w["pid"] for w in ex.workers()]
    finally:
        ex.shutdown()
        ray.kill(hold)
        watcher.join(10)
    assert not live_pids(pids, wait=10.0), "actor processes outlived shutdown()"
    assert any(t.startswith("started worker 2") for t in events), events
    assert not any("worker 3" in t for t in events), "grew past max_workers: " + repr(events)
    assert [r["worker"] for r in first] == [0, 1, 2], first
    sizes = first[0]["sizes"]
    # Size 2 until the new worker joined (at a commit, by the wait at the latest).
    grew = sizes.index(3)
    assert 0 < grew <= wait_step and sizes == [2] * grew + [3] * (steps - grew), sizes
    import runpy
    reference = runpy.run_path(WORKER_SCRIPT, run_name="elastic_worker")["replay"]
    for results, schedule in ((first, sizes), (second, [3] * 4)):
        for r in results[1:]:
            for a, b in zip(r["weights"], results[0]["weights"]):
                np.testing.assert_array_equal(a, b)
        for got, want in zip(results[0]["weights"], reference(schedule)):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert [r["worker"] for r in second] == [0, 1, 2] and second[0]["sizes"] == [3] * 4
