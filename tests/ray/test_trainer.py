"""tfring.ray.TfringTrainer on a real local Ray instance (tests/ray/conftest.py).

Each fit starts a Ray Train worker group whose actors import TensorFlow, so
the tests are few and each checks several things. Workers write what they saw
into files under the test's directory (the cluster is this host).
"""
import glob
import hashlib
import json
import os
import signal
import socket
import sys
import threading

import numpy as np
import pytest

from support import import_extra, live_pids

ray = import_extra("ray")
import ray.train  # noqa: E402
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402

import training_reference  # noqa: E402
from tfring.ray import TfringConfig, TfringTrainer  # noqa: E402

# The loops run in Ray's workers, which cannot import these modules.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(training_reference)

FIT_TIMEOUT = 240


# -- what runs in the workers ------------------------------------------------

def _join(out_dir, tag):
    """hvd.init() in a worker; writes what it and Ray's context say."""
    import tfring.keras as hvd
    hvd.init()
    ctx = ray.train.get_context()
    seen = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "ray": [ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()],
            "pid": os.getpid(), "port": int(os.environ["TFRING_RENDEZVOUS_PORT"]),
            "secret": hashlib.sha256(os.environ["TFRING_SECRET"].encode()).hexdigest(),
            "restored": ray.train.get_checkpoint() is not None}
    with open(os.path.join(out_dir, f"{tag}-{hvd.rank()}-{os.getpid()}.json"), "w") as f:
        json.dump(seen, f)
    return hvd


def _linear_loop(config):
    """The reference's linear model, fit() for config["epochs"] epochs with a
    report and a checkpoint per epoch; restored from the last checkpoint
    when Ray restarted the group. Rank config["kill_rank"] kills its own
    process in epoch 1 of the first attempt."""
    import keras

    from tfring.ray.keras import ReportCheckpointCallback, load_checkpoint
    hvd = _join(config["out"], "linear")
    rank, size = hvd.rank(), hvd.size()
    model, initial_epoch = load_checkpoint()
    if model is None:
        model = keras.Sequential([keras.Input((training_reference.FEATURES,)),
                                  keras.layers.Dense(1)])
        # Different on every rank: the broadcast must make them rank 0's.
        model.set_weights(training_reference.initial_weights(rank))
        model.compile(optimizer=hvd.DistributedOptimizer(
            keras.optimizers.SGD(training_reference.LR)), loss="mse")

    class KillMidEpoch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self._epoch == 1 and batch == 1 and initial_epoch == 0:
                # Let the controller collect epoch 0's reports first (a worker
                # that dies before that loses its last report).
                import time
                time.sleep(3)
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), ReportCheckpointCallback()]
    if rank == config.get("kill_rank"):
        callbacks.append(KillMidEpoch())
    x, y = training_reference.local_data(rank, size)
    try:
        history = model.fit(x, y, batch_size=training_reference.BATCH,
                            epochs=config["epochs"], initial_epoch=initial_epoch,
                            shuffle=False, verbose=0, callbacks=callbacks)
    except Exception as e:
        from tfring.common.exceptions import failure_of
        cause, failed = failure_of(e) or (None, None)
        with open(os.path.join(config["out"], f"error-{rank}-{os.getpid()}.json"), "w") as f:
            json.dump({"cause": cause and str(cause), "rank": failed}, f)
        raise
    np.savez(os.path.join(config["out"], f"final-{rank}.npz"), *model.get_weights(),
             loss=np.asarray(history.history["loss"]),
             initial_epoch=initial_epoch)


def _data_loop(config):
    """Feeds this rank's Ray Data shard to Keras fit through to_tf."""
    import keras
    hvd = _join(config["out"], "data")
    shard = ray.train.get_dataset_shard("train")
    dataset = shard.to_tf(feature_columns="x", label_columns="y", batch_size=4)
    ids = [int(v) for x, _ in dataset for v in np.asarray(x).ravel()]
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)), loss="mse")
    history = model.fit(dataset, epochs=2, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    ray.train.report({"loss": float(history.history["loss"][-1])})  # every rank must
    np.savez(os.path.join(config["out"], f"data-{hvd.rank()}.npz"), *model.get_weights(),
             ids=np.asarray(ids, dtype=np.int64))


def _resize_loop(config):
    """Steps of one allreduce each, with a report and rank 0's checkpoint
    per step, until the driver says stop; a restarted group goes on from
    the last checkpoint's step. Light on purpose (tfring.core, no
    TensorFlow): the test is about the group, not the model."""
    import tempfile
    import time

    import tfring.core as hvd
    hvd.init()
    ctx = ray.train.get_context()
    step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "step.json")) as f:
                step = json.load(f)["step"]
    seen = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "ray": [ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()],
            "pid": os.getpid(), "port": int(os.environ["TFRING_RENDEZVOUS_PORT"]),
            "secret": hashlib.sha256(os.environ["TFRING_SECRET"].encode()).hexdigest(),
            "start": step, "node": ray.get_runtime_context().get_node_id()}
    with open(os.path.join(config["out"], f"resize-{os.getpid()}.json"), "w") as f:
        json.dump(seen, f)
    stop = os.path.join(config["out"], "stop")
    while not os.path.exists(stop):
        total = hvd.allreduce(np.full(4, hvd.rank() + 1, np.float32), op=hvd.Sum, name="step")
        assert total.tolist() == [hvd.size() * (hvd.size() + 1) / 2] * 4, total
        step += 1
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if hvd.rank() == 0:
                with open(os.path.join(directory, "step.json"), "w") as f:
                    json.dump({"step": step}, f)
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            ray.train.report({"step": step, "size": hvd.size()}, checkpoint=checkpoint)
        if hvd.rank() == 0:
            with open(os.path.join(config["out"], f"reported-at-{hvd.size()}"), "w") as f:
                f.write(str(step))
        time.sleep(0.2)


def _gpu_loop(config):
    """Writes which GPU Ray gave this worker and which one tfring's
    local rank picks among those it sees."""
    import tfring.core as hvd
    hvd.init()
    visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    seen = {"rank": hvd.rank(), "local_rank": hvd.local_rank(), "visible": visible,
            "picked": visible[hvd.local_rank()], "given": [str(g) for g in ray.get_gpu_ids()]}
    with open(os.path.join(config["out"], f"gpu-{hvd.rank()}.json"), "w") as f:
        json.dump(seen, f)
    ray.train.report({"rank": hvd.rank()})


class RankRefused(ValueError):
    pass


def _raising_loop(config):
    hvd = _join(config["out"], "raise")
    # Every rank has recorded its join before the bad one raises: the
    # group's end could otherwise cut a slower rank short of its record.
    hvd.allreduce(np.ones(1, np.float32), name="joined")
    if hvd.rank() == config["bad_rank"]:
        raise RankRefused(f"rank {hvd.rank()} refuses to train")
    # The others wait for it in a collective, until the group is ended.
    hvd.allreduce(np.ones(3, np.float32), name="never_completes")


# -- the driver's side ---------------------------------------------------------

def _start_fit(trainer):
    """trainer.fit() on a thread of its own; returns the thread and the dict
    that gets its "result" or "error"."""
    outcome = {}

    def target():
        try:
            outcome["result"] = trainer.fit()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _fit(trainer):
    """trainer.fit() with a deadline (a hang fails the test, not CI's clock)."""
    thread, outcome = _start_fit(trainer)
    thread.join(FIT_TIMEOUT)
    assert not thread.is_alive(), f"fit() did not end within {FIT_TIMEOUT} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _fit_on_main_thread(trainer):
    """trainer.fit() where a user's driver calls it, on the main thread (so
    that Ray Train installs its SIGINT handler), with a deadline (SIGALRM)."""
    assert threading.current_thread() is threading.main_thread()

    def expire(signum, frame):
        raise TimeoutError(f"fit() did not end within {FIT_TIMEOUT} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(FIT_TIMEOUT)
    try:
        return trainer.fit()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _seen(out_dir, tag):
    seen = []
    for path in sorted(glob.glob(os.path.join(out_dir, f"{tag}-*.json"))):
        with open(path) as f:
            seen.append(json.load(f))
    return seen


def _check_joined(seen, size):
    """Every worker's tfring rank, size and local rank are Ray's."""
    assert sorted(s["rank"] for s in seen) == list(range(size))
    for s in seen:
        assert [s["rank"], s["size"], s["local_rank"]] == s["ray"], s
    # One job: one store, one secret.
    assert len({(s["port"], s["secret"]) for s in seen}) == 1


def _check_nothing_left(seen):
    """The workers' processes ended and their job's store is closed."""
    assert not live_pids([s["pid"] for s in seen], wait=15.0), "workers outlived fit()"
    for port in {s["port"] for s in seen}:
        with socket.socket() as sock:
            assert sock.connect_ex((ray.util.get_node_ip_address(), port)) != 0, \
                f"the rendezvous store on port {port} outlived fit()"


def _run_config(tmp_path, name, max_failures=0):
    return RunConfig(name=name, storage_path=str(tmp_path / "storage"),
                     failure_config=FailureConfig(max_failures=max_failures))


def _weights(out_dir, tag, rank):
    with np.load(os.path.join(out_dir, f"{tag}-{rank}.npz")) as saved:
        return {k: saved[k] for k in saved.files}


def test_fit_reports_averaged_metrics_and_checkpoints_like_the_reference(ray_cluster, tmp_path):
    size, epochs = 2, 2
    trainer = TfringTrainer(_linear_loop, train_loop_config={"out": str(tmp_path),
                                                             "epochs": epochs},
                            scaling_config=ScalingConfig(num_workers=size),
                            run_config=_run_config(tmp_path, "linear"))
    result = _fit(trainer)
    seen = _seen(tmp_path, "linear")
    _check_joined(seen, size)
    ref_w, ref_b = training_reference.reference(size, epochs=epochs)
    finals = [_weights(tmp_path, "final", r) for r in range(size)]
    for final in finals:
        np.testing.assert_allclose(final["arr_0"], ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(final["arr_1"], ref_b, rtol=1e-5, atol=1e-6)
    # The reported loss is the ranks' average (each rank's own is different).
    losses = [final["loss"][-1] for final in finals]
    assert losses[0] != losses[1]
    assert result.metrics["epoch"] == epochs - 1
    assert result.metrics["loss"] == pytest.approx(np.mean(losses), rel=1e-6)
    # Rank 0's checkpoint of the last epoch holds the final model.
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        with open(os.path.join(directory, "tfring_state.json")) as f:
            assert json.load(f) == {"epoch": epochs - 1}
        assert os.path.getsize(os.path.join(directory, "model.keras")) > 0
    _check_nothing_left(seen)


def test_killed_worker_group_restarts_from_the_last_checkpoint(ray_cluster, tmp_path):
    size, epochs = 2, 3
    trainer = TfringTrainer(_linear_loop,
                            train_loop_config={"out": str(tmp_path), "epochs": epochs,
                                               "kill_rank": 1},
                            scaling_config=ScalingConfig(num_workers=size),
                            run_config=_run_config(tmp_path, "restart", max_failures=1))
    result = _fit(trainer)
    seen = _seen(tmp_path, "linear")
    first = [s for s in seen if not s["restored"]]
    second = [s for s in seen if s["restored"]]
    _check_joined(first, size)
    _check_joined(second, size)
    # A new job: new processes, a new store and secret.
    assert not {s["pid"] for s in first} & {s["pid"] for s in second}
    assert first[0]["secret"] != second[0]["secret"]
    # The survivor's fit ended with tfring's error naming the lost rank
    # (it did not wait in its collective until Ray ended it).
    assert _seen(tmp_path, "error") == [{"cause": "peer_failure", "rank": 1}]
    # The second attempt went on from the checkpoint of epoch 0 and ended
    # where an uninterrupted run ends.
    ref_w, ref_b = training_reference.reference(size, epochs=epochs)
    for rank in range(size):
        final = _weights(tmp_path, "final", rank)
        assert int(final["initial_epoch"]) == 1
        np.testing.assert_allclose(final["arr_0"], ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(final["arr_1"], ref_b, rtol=1e-5, atol=1e-6)
    assert result.metrics["epoch"] == epochs - 1
    _check_nothing_left(seen)


def test_ray_data_shards_feed_keras_fit(ray_cluster, tmp_path):
    rows = 36
    dataset = ray.data.range(rows).map(lambda r: {"x": float(r["id"]), "y": 2.0 * r["id"]})
    # An elastic size: Ray picks it (3 fit in the 4 CPUs); the job forms at it.
    trainer = TfringTrainer(_data_loop, train_loop_config={"out": str(tmp_path)},
                            scaling_config=ScalingConfig(num_workers=(2, 3)),
                            run_config=_run_config(tmp_path, "data"),
                            datasets={"train": dataset})
    result = _fit(trainer)
    seen = _seen(tmp_path, "data")
    size = len(seen)
    assert size == 3, seen
    _check_joined(seen, size)
    saved = [_weights(tmp_path, "data", r) for r in range(size)]
    shards = [set(s["ids"].tolist()) for s in saved]
    assert all(shards), "a rank got no rows"
    assert sum(len(s) for s in shards) == rows, "shards overlap"
    assert set().union(*shards) == set(range(rows)), "shards do not cover the dataset"
    for s in saved[1:]:
        np.testing.assert_array_equal(s["arr_0"], saved[0]["arr_0"])
    assert result.error is None
    assert all(np.isfinite(s["arr_0"]).all() for s in saved)
    _check_nothing_left(seen)


def test_elastic_group_re_forms_when_a_node_comes_and_goes(ray_cluster, tmp_path):
    """ScalingConfig(num_workers=(2, 3)) over the head's 2 resize slots: a
    node with a third slot grows the group to 3, and removing it (its worker
    dies with it) shrinks the group to 2 again. Each group is its own tfring
    job at its size, and each goes on from the last checkpoint."""
    slot = ray_cluster.resize_slot
    trainer = TfringTrainer(
        _resize_loop, train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=(2, 3),
                                     resources_per_worker={"CPU": 0, slot: 1},
                                     elastic_resize_monitor_interval_s=1),
        run_config=_run_config(tmp_path, "resize", max_failures=2))

    def groups():
        seen = _seen(tmp_path, "resize")
        return [[s for s in seen if s["size"] == size] for size in (2, 3)]

    def wait_for(what, done, timeout=FIT_TIMEOUT / 2):
        import time
        deadline = time.monotonic() + timeout
        while not done(*groups()):
            assert "error" not in outcome, outcome["error"]
            assert time.monotonic() < deadline, f"no {what} within {timeout} s: {groups()}"
            time.sleep(0.5)

    thread, outcome = _start_fit(trainer)
    node = None
    try:
        wait_for("group of 2", lambda two, three: len(two) == 2)
        node = ray_cluster.add_node(num_cpus=1, resources={slot: 1})
        # Grown, and has checkpointed at 3 (the group after goes on from there).
        wait_for("report of a group of 3", lambda two, three: len(three) == 3
                 and os.path.exists(tmp_path / "reported-at-3"))
        ray_cluster.remove_node(node)
        node = None
        wait_for("group of 2 after the node left", lambda two, three: len(two) == 4)
    finally:
        with open(tmp_path / "stop", "w"):
            pass
        if node is not None:
            ray_cluster.remove_node(node)
        thread.join(FIT_TIMEOUT / 2)
    assert not thread.is_alive(), "fit() did not end after the loop was told to stop"
    if "error" in outcome:
        raise outcome["error"]
    two, three = groups()
    first, last = sorted(two, key=lambda s: s["start"])[:2], sorted(two, key=lambda s: s["start"])[2:]
    for group in (first, three, last):
        _check_joined(group, len(group))
    # The third worker ran on the added node; three jobs, not one re-used.
    assert len({s["node"] for s in three}) == 2
    assert len({(s["port"], s["secret"]) for s in first + three + last}) == 3
    # Each new group went on from where the one before had checkpointed.
    assert first[0]["start"] == 0
    assert 0 < three[0]["start"] <= last[0]["start"]
    assert {s["start"] for s in three} == {three[0]["start"]}
    assert {s["start"] for s in last} == {last[0]["start"]}
    # Ray keeps the reports it collected: a group of 3 that dies soon after
    # its first report may lose it (the marker file above shows it ran).
    sizes = list(outcome["result"].metrics_dataframe["size"])
    assert sizes[0] == 2 and sizes[-1] == 2 and set(sizes) <= {2, 3}
    assert outcome["result"].metrics["step"] > last[0]["start"]
    _check_nothing_left(first + three + last)


def test_use_gpu_workers_see_their_node_gpus_in_local_rank_order(ray_cluster, tmp_path):
    """use_gpu=True on a node with 2 (logical) GPUs: each worker sees both,
    as the NCCL plane needs, and hvd.local_rank() picks the one Ray gave
    it. No CUDA here: what runs on the devices is tested in tests/gpu."""
    node = ray_cluster.add_node(num_cpus=2, num_gpus=2)
    try:
        trainer = TfringTrainer(_gpu_loop, train_loop_config={"out": str(tmp_path)},
                                scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
                                run_config=_run_config(tmp_path, "gpu"))
        _fit(trainer)
    finally:
        ray_cluster.remove_node(node)
    seen = [json.loads((tmp_path / f"gpu-{rank}.json").read_text()) for rank in range(2)]
    assert [s["local_rank"] for s in seen] == [0, 1]
    for s in seen:
        assert sorted(s["visible"]) == ["0", "1"], s
        assert [s["picked"]] == s["given"], s
    assert seen[0]["picked"] != seen[1]["picked"]


def test_a_rank_that_raises_ends_fit_with_its_exception(ray_cluster, tmp_path):
    size = 3
    trainer = TfringTrainer(_raising_loop, train_loop_config={"out": str(tmp_path),
                                                              "bad_rank": 2},
                            scaling_config=ScalingConfig(num_workers=size),
                            run_config=_run_config(tmp_path, "raise"))
    sigint = signal.getsignal(signal.SIGINT)
    before = ray_cluster.run_processes(titles="ray::TrainController")
    with pytest.raises(ray.train.WorkerGroupError) as info:
        _fit_on_main_thread(trainer)
    # Its controller ended with fit(), as a user's driver expects (Ray's
    # SIGINT handler, which holds it, is gone again).
    ours = sorted(ray_cluster.run_processes(titles="ray::TrainController") - before)
    assert not live_pids(ours, wait=10.0), f"the controller {ours} outlived fit()"
    assert signal.getsignal(signal.SIGINT) is sigint
    failures = info.value.worker_failures
    assert isinstance(failures.get(2), RankRefused), failures
    assert "rank 2 refuses to train" in str(info.value)
    seen = _seen(tmp_path, "raise")
    _check_joined(seen, size)
    _check_nothing_left(seen)


def test_bad_config_is_refused_before_any_worker_starts():
    # No Ray needed: refused when made.
    with pytest.raises(ValueError, match="TFRING_SIZE"):
        TfringConfig(env_vars={"TFRING_SIZE": "4"})
    with pytest.raises(ValueError, match="shutdown_timeout_s"):
        TfringConfig(shutdown_timeout_s=0)
    with pytest.raises(ValueError, match="env_vars"):
        TfringConfig(env_vars=["TFRING_CYCLE_TIME=1"])
    with pytest.raises(TypeError, match="TfringConfig"):
        TfringTrainer(_raising_loop, tfring_config={"env_vars": {}})
    config = TfringConfig(env_vars={"TFRING_CYCLE_TIME": 2})
    assert config.env_vars == {"TFRING_CYCLE_TIME": "2"}
