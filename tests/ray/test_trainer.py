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


class RankRefused(ValueError):
    pass


def _raising_loop(config):
    hvd = _join(config["out"], "raise")
    if hvd.rank() == config["bad_rank"]:
        raise RankRefused(f"rank {hvd.rank()} refuses to train")
    # The others wait for it in a collective, until the group is ended.
    hvd.allreduce(np.ones(3, np.float32), name="never_completes")


# -- the driver's side ---------------------------------------------------------

def _fit(trainer):
    """trainer.fit() with a deadline (a hang fails the test, not CI's clock)."""
    outcome = {}

    def target():
        try:
            outcome["result"] = trainer.fit()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(FIT_TIMEOUT)
    assert not thread.is_alive(), f"fit() did not end within {FIT_TIMEOUT} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


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


def test_a_rank_that_raises_ends_fit_with_its_exception(ray_cluster, tmp_path):
    size = 3
    trainer = TfringTrainer(_raising_loop, train_loop_config={"out": str(tmp_path),
                                                              "bad_rank": 2},
                            scaling_config=ScalingConfig(num_workers=size),
                            run_config=_run_config(tmp_path, "raise"))
    with pytest.raises(ray.train.WorkerGroupError) as info:
        _fit(trainer)
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
